//! `submit`: validate, dedup on the idempotency key, write the execution and its timer.

use kairos_proto::storage::v1::{
    Execution, ExecutionStatus, IdempotencyRecord, JobDefinition, RetryPolicy, TimerKind,
};

use super::error::{Error, Result, invalid};
use super::limits::{
    EXECUTE_AT_FUTURE_MAX_MS, EXECUTE_AT_PAST_MAX_MS, IDEMPOTENCY_KEY_BYTES_MAX, INPUT_BYTES_MAX,
};
use super::records::{decode, encode, load_execution, save_execution, set_timer};
use super::{Scheduler, definitions};
use crate::ids::{fingerprint, new_execution_id, shard_of};
use crate::kv::Transaction;

/// A request to run one execution of a definition version at `execute_at_ms`.
#[derive(Debug, Clone, PartialEq)]
pub struct SubmitRequest {
    /// Namespace.
    pub namespace: String,
    /// Definition name (`registry://jobs/<name>`).
    pub definition: String,
    /// Pinned definition version (≥ 1).
    pub definition_version: u32,
    /// Inputs (a JSON object), validated against the definition's declared inputs.
    pub inputs: serde_json::Value,
    /// When to run, milliseconds since the epoch.
    pub execute_at_ms: i64,
    /// Optional idempotency key: the same key with the same request returns the same
    /// execution; with a different request it is a conflict.
    pub idempotency_key: Option<String>,
}

/// What `submit` did.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    /// The execution (new or existing).
    pub execution: Execution,
    /// False when an earlier identical request had created it.
    pub created: bool,
}

/// Checks a namespace / queue / worker id style name.
pub(crate) fn check_name(field: &str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= super::limits::NAME_BYTES_MAX
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:/@".contains(&b));
    if !ok {
        return Err(invalid(
            field,
            format!(
                "must be 1-{} characters of letters, digits and -_.:/@, got {value:?}",
                super::limits::NAME_BYTES_MAX
            ),
        ));
    }
    Ok(())
}

/// A validated request with what is chosen once, outside the retry loop.
struct Prepared {
    req: SubmitRequest,
    id: String,
    shard: u32,
    print: Vec<u8>,
}

/// Most requests one `submit_batch` call takes.
pub const SUBMIT_BATCH_MAX: usize = 1_000;

impl Scheduler {
    /// Checks a request's own fields and fixes its id (outside any transaction).
    fn prepare(&self, req: SubmitRequest, now_ms: i64) -> Result<Prepared> {
        check_name("namespace", &req.namespace)?;
        if req.definition.is_empty() {
            return Err(invalid("definitionUri", "must name a definition"));
        }
        if req.definition_version == 0 {
            return Err(invalid("definitionVersion", "must be a positive integer"));
        }
        if let Some(key) = &req.idempotency_key
            && (key.is_empty() || key.len() > IDEMPOTENCY_KEY_BYTES_MAX)
        {
            return Err(invalid(
                "idempotencyKey",
                format!("must be 1-{IDEMPOTENCY_KEY_BYTES_MAX} bytes, got {}", key.len()),
            ));
        }
        if req.execute_at_ms > now_ms.saturating_add(EXECUTE_AT_FUTURE_MAX_MS) {
            return Err(invalid("executeAt", "is more than 10 years in the future"));
        }
        if req.execute_at_ms < now_ms.saturating_sub(EXECUTE_AT_PAST_MAX_MS) {
            return Err(invalid("executeAt", "is more than 1 day in the past"));
        }
        let input_bytes = serde_json::to_vec(&req.inputs)
            .map_err(|e| invalid("inputs", format!("cannot be serialized: {e}")))?;
        if input_bytes.len() > INPUT_BYTES_MAX {
            return Err(invalid(
                "inputs",
                format!("is {} bytes, the limit is {INPUT_BYTES_MAX}", input_bytes.len()),
            ));
        }
        // serde_json objects are sorted maps, so this serialization is canonical.
        let print = fingerprint(&[
            req.definition.as_bytes(),
            &req.definition_version.to_be_bytes(),
            &input_bytes,
            &req.execute_at_ms.to_be_bytes(),
        ]);
        let id = new_execution_id(self.clock.now(), &self.rng);
        let shard = shard_of(&id, self.config.shard_count);
        Ok(Prepared { req, id, shard, print })
    }

    /// The transactional part of a submit: dedup, validate against the definition, write.
    async fn submit_in(&self, tx: &Transaction, p: &Prepared, now_ms: i64) -> Result<Submitted> {
        let (req, id, print) = (&p.req, &p.id, &p.print);
        let ns = req.namespace.as_str();
        if let Some(key) = &req.idempotency_key
            && let Some(v) = tx.get(&self.ks.idempotency(ns, key)).await?
        {
            let rec: IdempotencyRecord = decode("idempotency", &v)?;
            if &rec.fingerprint != print {
                return Err(Error::IdempotencyConflict {
                    key: key.clone(),
                    execution_id: rec.execution_id,
                });
            }
            let existing = load_execution(tx, &self.ks, ns, &rec.execution_id)
                .await?
                .ok_or_else(|| Error::Corrupt(format!("idempotency key {key:?} dangles")))?;
            return Ok(Submitted { execution: existing, created: false });
        }
        // A retry after an unknown commit result finds its own execution.
        if let Some(existing) = load_execution(tx, &self.ks, ns, id).await? {
            if &existing.request_fingerprint != print {
                // Two submitters drew the same id (80 random bits per ms): refuse rather
                // than answer with someone else's execution.
                return Err(Error::Corrupt(format!(
                    "execution id {id} collided with another request; submit again"
                )));
            }
            return Ok(Submitted { execution: existing, created: false });
        }
        let def = definitions::load(tx, &self.ks, ns, &req.definition, req.definition_version)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "definition",
                id: format!(
                    "registry://jobs/{} version {}",
                    req.definition, req.definition_version
                ),
            })?;
        let snapshot = crate::definition::validate_inputs(&def, &req.inputs)
            .map_err(|e| invalid(e.field(), e.reason()))?;
        let mut e = new_execution(&def, req, id, p.shard, now_ms, &snapshot)?;
        e.request_fingerprint = print.clone();
        let at = e.execute_at_ms;
        set_timer(tx, &self.ks, self.config.bucket_width_ms, &mut e, TimerKind::Due, at).await?;
        save_execution(tx, &self.ks, None, &e)?;
        tx.set(&self.ks.by_definition(ns, &e.definition_name, e.execute_at_ms, id), b"")?;
        tx.set(&self.ks.by_time(ns, e.execute_at_ms, id), b"")?;
        if let Some(key) = &req.idempotency_key {
            let rec = IdempotencyRecord { execution_id: id.clone(), fingerprint: print.clone() };
            tx.set(&self.ks.idempotency(ns, key), &encode(&rec))?;
        }
        Ok(Submitted { execution: e, created: true })
    }

    /// Submits an execution. Idempotent: a retry of the same call (same idempotency key, or
    /// the same generated id inside the retry loop) returns the same execution.
    pub async fn submit(&self, req: SubmitRequest) -> Result<Submitted> {
        let now_ms = self.clock.now().as_millis();
        let p = &self.prepare(req, now_ms)?;
        self.db.run(|tx| async move { self.submit_in(&tx, p, now_ms).await }).await
    }

    /// Submits up to [`SUBMIT_BATCH_MAX`] executions in one transaction (one fsync for all on
    /// the embedded backend). Each request gets its own result: a request that fails
    /// validation, names an unknown definition or conflicts on its idempotency key is
    /// reported and the others are still written. Duplicates of one idempotency key inside
    /// the batch resolve to one execution.
    pub async fn submit_batch(&self, reqs: Vec<SubmitRequest>) -> Result<Vec<Result<Submitted>>> {
        if reqs.len() > SUBMIT_BATCH_MAX {
            return Err(invalid(
                "requests",
                format!("at most {SUBMIT_BATCH_MAX} per batch, got {}", reqs.len()),
            ));
        }
        let now_ms = self.clock.now().as_millis();
        let prepared: Vec<Result<Prepared>> =
            reqs.into_iter().map(|r| self.prepare(r, now_ms)).collect();
        self.db
            .run(|tx| {
                let prepared = &prepared;
                async move {
                    let mut out = Vec::with_capacity(prepared.len());
                    for p in prepared {
                        out.push(match p {
                            Err(e) => Err(e.clone()),
                            Ok(p) => match self.submit_in(&tx, p, now_ms).await {
                                // Store errors abort the whole transaction (and are retried).
                                Err(Error::Kv(e)) => return Err(Error::Kv(e)),
                                r => r,
                            },
                        });
                    }
                    Ok(out)
                }
            })
            .await
    }
}

fn new_execution(
    def: &JobDefinition,
    req: &SubmitRequest,
    id: &str,
    shard: u32,
    now_ms: i64,
    snapshot: &serde_json::Value,
) -> Result<Execution> {
    let input_json = serde_json::to_vec(snapshot)
        .map_err(|e| invalid("inputs", format!("cannot be serialized: {e}")))?;
    if input_json.len() > INPUT_BYTES_MAX {
        return Err(invalid("inputs", format!("with defaults is over {INPUT_BYTES_MAX} bytes")));
    }
    let retry = def.retry_policy.unwrap_or(RetryPolicy {
        max_attempts: 1,
        base_delay_ms: 0,
        max_delay_ms: 0,
    });
    Ok(Execution {
        id: id.to_string(),
        namespace: req.namespace.clone(),
        definition_name: def.name.clone(),
        definition_version: def.version,
        input_json,
        execute_at_ms: req.execute_at_ms,
        idempotency_key: req.idempotency_key.clone().unwrap_or_default(),
        status: ExecutionStatus::Scheduled as i32,
        retry_policy: Some(retry),
        queue: if def.queue.is_empty() { def.name.clone() } else { def.queue.clone() },
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
        attempt_timeout_ms: def.attempt_timeout_ms,
        lease_ms: def.lease_ms,
        shard,
        ..Execution::default()
    })
}
