//! `submit`: validate, dedup on the idempotency key, write the execution and its timer.

use kairos_proto::storage::v1::{
    Execution, ExecutionStatus, IdempotencyRecord, JobDefinition, RetryPolicy, TimerKind,
};

use super::error::{Error, Result, invalid};
use super::lease_checks::LeaseChecks;
use crate::limits::{EXECUTE_AT_FUTURE_MAX_MS, EXECUTE_AT_PAST_MAX_MS, INPUT_BYTES_MAX};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::claim::{ClaimSlot, Claimed, Receipt, SlotFiller};
use super::fire::{Match, Offer};
use super::records::{decode, encode, load_execution};
use super::validate::{check_batch, check_idempotency_key, check_name};
use super::{Scheduler, budget, definitions};
use crate::ids::{fingerprint, new_execution_id, shard_of};
use crate::kv::Transaction;
use crate::limits::SUBMIT_BATCH_MAX;
use crate::state::{ExecutionEvent, execution_transition};

/// A request to run one execution of a definition version at `execute_at_ms` (or after
/// `delay_ms` by the node's clock).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SubmitRequest {
    /// Namespace.
    pub namespace: String,
    /// Definition name (`registry://jobs/<name>`).
    pub definition: String,
    /// Pinned definition version (≥ 1).
    pub definition_version: u32,
    /// Inputs (a JSON object), validated against the definition's declared inputs.
    pub inputs: serde_json::Value,
    /// When to run, milliseconds since the epoch (ignored when `delay_ms` is set).
    pub execute_at_ms: i64,
    /// Run this long after the node receives the request (0 = now), by the node's clock: "due
    /// now" never depends on the client's clock. A repeat with the same idempotency key and
    /// delay is the same request (the delay, not the resolved time, is fingerprinted).
    pub delay_ms: Option<u64>,
    /// Optional idempotency key: the same key with the same request returns the same
    /// execution; with a different request it is a conflict.
    pub idempotency_key: Option<String>,
    /// W3C trace context to hand to the workers (not part of the request's identity: a retry
    /// from another trace is the same request). Kept only when valid ([`traceparent`]).
    pub traceparent: Option<String>,
}

/// A W3C `traceparent` if `v` is a valid one (version 00 form: `00-<32 hex, not all 0>-<16
/// hex, not all 0>-<2 hex>`, lowercase), else `None` (the spec says to ignore invalid ones).
pub fn traceparent(v: &str) -> Option<String> {
    let parts: Vec<&str> = v.trim().split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    match parts.as_slice() {
        [ver, trace, parent, flags]
            if hex(ver, 2)
                && *ver != "ff"
                && hex(trace, 32)
                && nonzero(trace)
                && hex(parent, 16)
                && nonzero(parent)
                && hex(flags, 2) =>
        {
            Some(parts.join("-"))
        }
        _ => None,
    }
}

/// What `submit` did.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    /// The execution (new or existing).
    pub execution: Execution,
    /// False when an earlier identical request had created it.
    pub created: bool,
}

/// A validated request with what is chosen once, outside the retry loop.
struct Prepared {
    req: SubmitRequest,
    id: String,
    shard: u32,
    print: Vec<u8>,
    /// What writing it costs at most (its inputs, keys and indexes).
    bytes: usize,
}

impl Scheduler {
    /// Checks a request's own fields and fixes its id (outside any transaction).
    fn prepare(&self, mut req: SubmitRequest, now_ms: i64) -> Result<Prepared> {
        check_name("namespace", &req.namespace)?;
        let when = match req.delay_ms {
            Some(d) => {
                if d > EXECUTE_AT_FUTURE_MAX_MS as u64 {
                    return Err(invalid("delayMs", "is more than 10 years"));
                }
                req.execute_at_ms = now_ms.saturating_add(d as i64);
                [b'd', 0, 0, 0, 0, 0, 0, 0, 0]
                    .iter()
                    .copied()
                    .chain(d.to_be_bytes())
                    .collect::<Vec<u8>>()
            }
            None => req.execute_at_ms.to_be_bytes().to_vec(),
        };
        if req.definition.is_empty() {
            return Err(invalid("definitionUri", "must name a definition"));
        }
        if req.definition_version == 0 {
            return Err(invalid("definitionVersion", "must be a positive integer"));
        }
        if let Some(key) = &req.idempotency_key {
            check_idempotency_key(key)?;
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
            &when,
        ]);
        let id = new_execution_id(self.clock.now(), &self.rng);
        let shard = shard_of(&id, self.config.shard_count);
        // (Defaults may add to the inputs: the budget is checked against what the transaction
        // holds before each request, so one request at most goes past it.)
        let key_bytes = req.idempotency_key.as_ref().map_or(0, String::len);
        let bytes = input_bytes.len() + 3 * key_bytes + crate::limits::ITEM_OVERHEAD_BYTES;
        Ok(Prepared { req, id, shard, print, bytes })
    }

    /// Submits an execution. Idempotent: a retry of the same call (same idempotency key, or
    /// the same generated id inside the retry loop) returns the same execution.
    pub async fn submit(&self, req: SubmitRequest) -> Result<Submitted> {
        let mut out = self.submit_batch(vec![Ok(req)]).await?;
        out.pop().unwrap_or_else(|| Err(Error::Corrupt("submit result missing".into())))
    }

    /// Submits up to [`SUBMIT_BATCH_MAX`] executions in one transaction (one fsync for all on
    /// the embedded backend) — or in a few, when their inputs would pass the transaction
    /// budget — its reads issued concurrently. Each item gets its own result, in
    /// order: an item the caller already refused (an `Err`: not authorized, over a quota)
    /// passes through as its error, and a request that fails validation, names an unknown
    /// definition or conflicts on its idempotency key is reported while the others are still
    /// written — so a caller's results line up with its requests without splitting the batch.
    /// Duplicates of one idempotency key inside the batch resolve to one execution.
    pub async fn submit_batch(
        &self,
        items: Vec<Result<SubmitRequest>>,
    ) -> Result<Vec<Result<Submitted>>> {
        Ok(self.submit_batch_offered(items, &Offer::new()).await?.0)
    }

    /// [`Self::submit_batch`], starting due-now executions at once for the slots of `offer`
    /// (waiting workers the caller reserved): a *sync match at submit*. Such an execution is
    /// written RUNNING for its slot's worker, with its first attempt, fencing token and lease
    /// check, in the submit's own transaction — no due timer written and cleared, no fire.
    /// Slots are filled in request order, as a fire fills them. Returns the matches with the
    /// results; a retry after an unknown commit result matches again what the committed try
    /// started (the same requests in the same order meet the same slots).
    pub async fn submit_batch_offered(
        &self,
        items: Vec<Result<SubmitRequest>>,
        offer: &Offer,
    ) -> Result<(Vec<Result<Submitted>>, Vec<Match>)> {
        check_batch("requests", items.len(), SUBMIT_BATCH_MAX)?;
        let now_ms = self.clock.now().as_millis();
        let prepared: Vec<Result<Prepared>> =
            items.into_iter().map(|r| r.and_then(|r| self.prepare(r, now_ms))).collect();
        if prepared.iter().all(Result::is_err) {
            // Nothing to write: no transaction.
            let out = prepared.into_iter().map(|p| p.map(|_| unreachable!("all failed")));
            return Ok((out.collect(), Vec::new()));
        }
        let first = first_of_keys(&prepared);
        let (prepared, first) = (&prepared, &first);
        let mut out: Vec<Result<Submitted>> = Vec::with_capacity(prepared.len());
        // Where each queue's slots stand after the parts committed so far.
        let mut filled = Starts::new(offer);
        let mut matched = Vec::new();
        while out.len() < prepared.len() {
            let (from, done) = (out.len(), &out);
            // The ids were generated for this call: only a retry of the transaction (after an
            // unknown commit result, possibly committed) can find one written — the first try
            // does not read them. A retry takes at least what a committed first try took: it
            // writes nothing for what it finds written, and its reads (≤ ~0.3 MB for 1,000
            // requests) stay far under the transaction budget — so the next part never starts
            // inside what an earlier try wrote.
            let mut tries = 0u32;
            let at = &filled;
            // The receipt of what this part starts (as a claim's or a fire's): orphan release
            // finds a dead node's undelivered starts by it.
            // (No random draw without an offer: the ids a seeded submit makes stay as they were.)
            let receipt = &match offer.is_empty() {
                true => Vec::new(),
                false => self.ks.claim_receipt(now_ms, self.rng.next_u64(), &self.holder),
            };
            let (part, starts) = self
                .db
                .run(|tx| {
                    tries += 1;
                    let retry = tries > 1;
                    let mut starts = at.clone();
                    async move {
                        let part = self
                            .submit_part(
                                &tx,
                                prepared,
                                first,
                                (from, done, retry),
                                now_ms,
                                &mut starts,
                            )
                            .await?;
                        starts.write_receipt(&tx, receipt)?;
                        self.write_lease_checks(&tx, std::mem::take(&mut starts.checks))?;
                        Ok::<_, Error>((part, starts))
                    }
                })
                .await?;
            assert!(!part.is_empty(), "a transaction takes at least one request");
            out.extend(part);
            matched.extend(starts.matched.iter().cloned());
            filled = starts.committed();
        }
        Ok((out, matched))
    }

    /// Submits the requests from `from` on that fit one transaction's budget; `done` holds the
    /// results of those before (a later request with the same idempotency key answers from its
    /// first). A result for each taken, in order.
    async fn submit_part(
        &self,
        tx: &Transaction,
        prepared: &[Result<Prepared>],
        first: &[Option<usize>],
        (from, done, retry): (usize, &[Result<Submitted>], bool),
        now_ms: i64,
        starts: &mut Starts<'_>,
    ) -> Result<Vec<Result<Submitted>>> {
        let unique: Vec<&Prepared> = prepared[from..]
            .iter()
            .zip(&first[from..])
            .filter_map(|(p, f)| p.as_ref().ok().filter(|_| f.is_none()))
            .collect();
        let mut found = self.submit_reads(tx, &unique, retry).await?.into_iter();
        let mut out: Vec<Result<Submitted>> = Vec::new();
        let mut wrote = 0;
        for (i, p) in prepared.iter().enumerate().skip(from) {
            let r = match (p, first[i]) {
                (Err(e), _) => Err(e.clone()),
                (Ok(p), Some(j)) => match &prepared[j] {
                    Ok(f) => same_key(p, f, if j < from { &done[j] } else { &out[j - from] }),
                    Err(e) => Err(e.clone()),
                },
                (Ok(p), None) => {
                    if !budget::has_room(tx, wrote, p.bytes) {
                        break; // the rest go in the next transaction
                    }
                    wrote += 1;
                    let f =
                        found.next().ok_or_else(|| Error::Corrupt("submit read missing".into()))?;
                    match self.submit_one(tx, p, f, now_ms, starts) {
                        Err(Error::Kv(e)) => return Err(Error::Kv(e)),
                        r => r,
                    }
                }
            };
            out.push(r);
        }
        Ok(out)
    }

    /// Everything the submits of a batch read, issued concurrently: the definitions and shard
    /// watermarks they need once each, and each request's idempotency key — and, on a `retry`
    /// of the transaction, its generated id.
    async fn submit_reads(
        &self,
        tx: &Transaction,
        items: &[&Prepared],
        retry: bool,
    ) -> Result<Vec<Found>> {
        let defs: BTreeSet<(&str, &str, u32)> = items
            .iter()
            .map(|p| {
                (p.req.namespace.as_str(), p.req.definition.as_str(), p.req.definition_version)
            })
            .collect();
        let def_loads = defs.iter().map(|(ns, name, v)| async move {
            let d = definitions::load(tx, &self.ks, ns, name, *v).await?;
            Ok::<_, Error>(((*ns, *name, *v), d.map(Arc::new)))
        });
        let shards: BTreeSet<u32> = items.iter().map(|p| p.shard).collect();
        let item_loads = items.iter().map(|p| async move {
            let ns = p.req.namespace.as_str();
            let idem = async {
                match &p.req.idempotency_key {
                    Some(key) => match tx.get(&self.ks.idempotency(ns, key)).await? {
                        Some(v) => {
                            let rec: IdempotencyRecord = decode("idempotency", &v)?;
                            let e = load_execution(tx, &self.ks, ns, &rec.execution_id).await?;
                            Ok::<_, Error>(Some((rec, e)))
                        }
                        None => Ok(None),
                    },
                    None => Ok(None),
                }
            };
            let own = async {
                match retry {
                    true => load_execution(tx, &self.ks, ns, &p.id).await,
                    false => Ok(None),
                }
            };
            futures_util::future::try_join(idem, own).await
        });
        let (defs, wms, per_item) = futures_util::future::try_join3(
            crate::ops::join::join_in_order(def_loads),
            self.watermarks(tx, shards),
            crate::ops::join::join_in_order(item_loads),
        )
        .await?;
        let defs: BTreeMap<(&str, &str, u32), Option<Arc<JobDefinition>>> =
            defs.into_iter().collect();
        Ok(items
            .iter()
            .zip(per_item)
            .map(|(p, (idem, own))| Found {
                idem,
                own,
                def: defs
                    .get(&(
                        p.req.namespace.as_str(),
                        p.req.definition.as_str(),
                        p.req.definition_version,
                    ))
                    .cloned()
                    .flatten(),
                wm: wms.get(&p.shard).copied().unwrap_or(i64::MIN),
            })
            .collect())
    }

    /// The writes of one submit, given what it read: dedup, validate against the definition,
    /// write the execution, its timer, indexes and idempotency record.
    fn submit_one(
        &self,
        tx: &Transaction,
        p: &Prepared,
        f: Found,
        now_ms: i64,
        starts: &mut Starts<'_>,
    ) -> Result<Submitted> {
        let (req, id, print) = (&p.req, &p.id, &p.print);
        let ns = req.namespace.as_str();
        if let (Some(key), Some((rec, existing))) = (&req.idempotency_key, f.idem) {
            if &rec.fingerprint != print {
                return Err(Error::IdempotencyConflict {
                    key: key.clone(),
                    execution_id: rec.execution_id,
                });
            }
            let existing = existing
                .ok_or_else(|| Error::Corrupt(format!("idempotency key {key:?} dangles")))?;
            if existing.id == *id {
                // Written by a committed try of this call: what it started, it started again.
                starts.rematch(&existing, now_ms);
            }
            return Ok(Submitted { execution: existing, created: false });
        }
        // A retry after an unknown commit result finds its own execution.
        if let Some(existing) = f.own {
            if &existing.request_fingerprint != print {
                // Two submitters drew the same id (80 random bits per ms): refuse rather
                // than answer with someone else's execution.
                return Err(Error::Corrupt(format!(
                    "execution id {id} collided with another request; submit again"
                )));
            }
            starts.rematch(&existing, now_ms);
            return Ok(Submitted { execution: existing, created: false });
        }
        let def = f.def.ok_or_else(|| Error::NotFound {
            what: "definition",
            id: format!(
                "registry://jobs/{} version {} in namespace {}",
                req.definition, req.definition_version, req.namespace
            ),
        })?;
        let snapshot = crate::definition::validate_inputs(&def, &req.inputs)
            .map_err(|e| invalid(e.field(), e.reason()))?;
        let mut e = new_execution(&def, req, id, p.shard, now_ms, &snapshot)?;
        e.request_fingerprint = print.clone();
        e.traceparent = req.traceparent.as_deref().and_then(traceparent).unwrap_or_default();
        self.write_new(tx, &mut e, starts, now_ms, f.wm)?;
        // (Its time index entry, holding its spec, is written by `save_execution`; listing by
        // definition filters that index by the specs its rows hold: no index of its own.)
        if let Some(key) = &req.idempotency_key {
            let rec = IdempotencyRecord { execution_id: id.clone(), fingerprint: print.clone() };
            tx.set(&self.ks.idempotency(ns, key), &encode(&rec))?;
        }
        Ok(Submitted { execution: e, created: true })
    }
}

/// The slots of a submit's offer: where each queue's filling stands, and what the transaction
/// started for them.
#[derive(Clone)]
struct Starts<'a> {
    offer: &'a Offer,
    /// Per queue of the offer, the filler's position ([`SlotFiller::position`]).
    at: BTreeMap<(String, String), (usize, usize)>,
    /// Executions started in this transaction.
    matched: Vec<Match>,
    /// Their lease checks, written with the receipt.
    checks: LeaseChecks,
}

impl<'a> Starts<'a> {
    fn new(offer: &'a Offer) -> Self {
        Starts { offer, at: BTreeMap::new(), matched: Vec::new(), checks: LeaseChecks::default() }
    }

    /// The next slot for a new execution due by `now_ms`, if its queue has one left.
    fn take(&mut self, e: &Execution, now_ms: i64) -> Option<(usize, &'a ClaimSlot)> {
        if e.execute_at_ms > now_ms || self.offer.is_empty() {
            return None;
        }
        let q = (e.namespace.clone(), e.queue.clone());
        let slots = self.offer.get(&q)?;
        let at = self.at.entry(q).or_insert((0, 0));
        let mut filler = SlotFiller::resume(slots, *at);
        let taken = filler.take();
        *at = filler.position();
        taken
    }

    /// An execution a committed try of this call wrote: if that try started it (RUNNING in its
    /// first attempt, never heard from), the same slot is taken again and it is matched again.
    fn rematch(&mut self, e: &Execution, now_ms: i64) {
        let started = e.status == ExecutionStatus::Running as i32
            && e.attempt_count == 1
            && !e.worker_confirmed;
        if !started {
            return;
        }
        if let Some((i, slot)) = self.take(e, now_ms)
            && slot.worker_id == e.worker_id
        {
            self.matched.push(Match { claim: Claimed::of(e.clone()), slot: i });
        }
    }

    /// Writes the receipt of the executions this transaction started, if any.
    fn write_receipt(&self, tx: &Transaction, receipt: &[u8]) -> Result<()> {
        if self.matched.is_empty() {
            return Ok(());
        }
        let taken: Receipt = self
            .matched
            .iter()
            .map(|m| {
                let e = &m.claim.execution;
                (e.namespace.clone(), e.id.clone(), e.fencing_token, m.slot as u32)
            })
            .collect();
        tx.set(receipt, &crate::tuple::pack(&taken))?;
        Ok(())
    }

    /// The positions reached, for the next transaction (its matches are the caller's now).
    fn committed(self) -> Starts<'a> {
        Starts { matched: Vec::new(), checks: LeaseChecks::default(), ..self }
    }
}

impl Scheduler {
    /// Writes a new execution: SCHEDULED with its due timer — or, due now with a slot of the
    /// offer left for its queue, RUNNING for that slot's worker at once (SCHEDULED → READY →
    /// RUNNING, neither stored; the lease check is its only timer).
    fn write_new(
        &self,
        tx: &Transaction,
        e: &mut Execution,
        starts: &mut Starts<'_>,
        now_ms: i64,
        wm: i64,
    ) -> Result<()> {
        match starts.take(e, now_ms) {
            Some((i, slot)) => {
                e.status = execution_transition(e.status(), ExecutionEvent::Fire)? as i32;
                self.start_attempt(tx, e, None, (slot, &mut starts.checks), now_ms, wm)?;
                starts.matched.push(Match { claim: Claimed::of(e.clone()), slot: i });
            }
            None => {
                let at = e.execute_at_ms;
                self.set_timer_with(tx, e, TimerKind::Due, at, wm)?;
                self.save_execution(tx, None, e)?;
            }
        }
        Ok(())
    }
}

/// What one submit read.
struct Found {
    /// The idempotency record of its key, and the execution it names.
    idem: Option<(IdempotencyRecord, Option<Execution>)>,
    /// An execution already stored under its generated id (a retried try that committed).
    own: Option<Execution>,
    /// Its definition version.
    def: Option<Arc<JobDefinition>>,
    /// Its shard's watermark.
    wm: i64,
}

/// For each request, the index of an earlier one with its idempotency key, if any: the first
/// request of each key is written; later ones with the same key answer from it (same request:
/// the same execution; another request: a conflict).
fn first_of_keys(prepared: &[Result<Prepared>]) -> Vec<Option<usize>> {
    let mut first_of_key: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    let mut first: Vec<Option<usize>> = Vec::with_capacity(prepared.len());
    for (i, p) in prepared.iter().enumerate() {
        let dup = match p {
            Ok(p) => p.req.idempotency_key.as_deref().and_then(|k| {
                let key = (p.req.namespace.as_str(), k);
                match first_of_key.get(&key) {
                    Some(j) => Some(*j),
                    None => {
                        first_of_key.insert(key, i);
                        None
                    }
                }
            }),
            Err(_) => None,
        };
        first.push(dup);
    }
    first
}

/// The answer to a later request of the batch with the same idempotency key as `first`.
fn same_key(p: &Prepared, first: &Prepared, first_result: &Result<Submitted>) -> Result<Submitted> {
    let key = p.req.idempotency_key.clone().unwrap_or_default();
    match first_result {
        Ok(s) if p.print == first.print => {
            Ok(Submitted { execution: s.execution.clone(), created: false })
        }
        Ok(s) => Err(Error::IdempotencyConflict { key, execution_id: s.execution.id.clone() }),
        Err(e) if p.print == first.print => Err(e.clone()),
        Err(_) => Err(invalid(
            "idempotencyKey",
            format!("{key:?} is used twice in this batch for different requests"),
        )),
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
    // An occurrence key records the cron job and occurrence it materializes.
    let (cron_job_id, cron_occurrence_ms) = req
        .idempotency_key
        .as_deref()
        .and_then(crate::cron::parse_occurrence_key)
        .unwrap_or_default();
    Ok(Execution {
        cron_job_id,
        cron_occurrence_ms,
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

#[cfg(test)]
mod tests {
    use super::traceparent;

    #[test]
    fn only_valid_trace_contexts_are_kept() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(traceparent(ok).as_deref(), Some(ok));
        assert_eq!(traceparent(&format!(" {ok} ")).as_deref(), Some(ok), "whitespace trimmed");
        for bad in [
            "",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // uppercase
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero parent id
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // version ff
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  // short
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",    // no flags
            "not a trace",
        ] {
            assert_eq!(traceparent(bad), None, "{bad:?}");
        }
    }
}
