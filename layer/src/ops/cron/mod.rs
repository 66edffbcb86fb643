//! The cron service's transactions. Clients create, update, pause, resume, delete, backfill
//! and read cron jobs here; the cron shard owners run rounds ([`owner`]). Every client change
//! raises the job's `generation` and sets its cron timer to now, so the owner of its cron shard
//! looks at it at once (the owner decides what to materialize; a client never submits).
//!
//! Cron timers `(bucket, shard, fire_at, job)` are clamped up to the cron shard's watermark
//! like execution timers (read with a conflict; written with the shard's first timer).

pub mod owner;
pub mod round;
pub mod spec;

use kairos_proto::storage::v1::{
    CronJob, CronPolicies, CronQueued, CronStatus, CronTimerEntry, CronTimerRef, Execution,
    IdempotencyRecord,
};
use prost::Message;
use serde_json::Value;

use super::Scheduler;
use super::error::{Error, Result, invalid};
use super::records::{decode, encode, snapshot_execution};
use crate::cron::key::job_key_prefix;
use crate::cron::policy::{OverlapPolicy, parse_named};
use crate::ids::{bucket_of, fingerprint, new_execution_id, shard_of};
use crate::keys::CronTimerKey;
use crate::kv::Transaction;
use crate::kv::limits::key_after;
use crate::limits::{CRON_LIST_PAGE_MAX, CRON_OCCURRENCES_PER_CALL_MAX, CRON_QUEUE_MAX};

/// Changes to a cron job; `None` keeps a field. Materialized executions are left alone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CronPatch {
    /// Another definition (name).
    pub definition: Option<String>,
    /// Another definition version.
    pub definition_version: Option<u32>,
    /// New inputs (with placeholders).
    pub inputs: Option<Value>,
    /// A new expression.
    pub expression: Option<String>,
    /// A new zone.
    pub timezone: Option<String>,
    /// New policies: each one given replaces the current one.
    pub dst_gap: Option<String>,
    /// See [`CronPatch::dst_gap`].
    pub dst_fold: Option<String>,
    /// See [`CronPatch::dst_gap`].
    pub missed: Option<String>,
    /// See [`CronPatch::dst_gap`].
    pub catch_up_window_ms: Option<i64>,
    /// See [`CronPatch::dst_gap`].
    pub overlap: Option<String>,
    /// See [`CronPatch::dst_gap`].
    pub pause_on_failure: Option<bool>,
    /// See [`CronPatch::dst_gap`].
    pub jitter_ms: Option<i64>,
    /// A new start (0 = none).
    pub start_at_ms: Option<i64>,
    /// A new end (0 = none).
    pub end_at_ms: Option<i64>,
    /// Runs left (0 = unlimited).
    pub remaining_runs: Option<u32>,
    /// New notes.
    pub notes: Option<String>,
}

/// A page of cron jobs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CronPage {
    /// Jobs by id.
    pub jobs: Vec<CronJob>,
    /// The id to continue after; `None` at the end.
    pub next_cursor: Option<String>,
}

/// A page of a cron job's runs (the executions of its occurrences, oldest occurrence first).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunsPage {
    /// Executions.
    pub executions: Vec<Execution>,
    /// Where to continue; `None` at the end.
    pub next_cursor: Option<Vec<u8>>,
    /// Runs whose stored record could not be decoded (execution id, or the idempotency key
    /// when that record itself is damaged): skipped, reported here.
    pub unreadable: Vec<String>,
}

/// The spec fields of a record (what a create's fingerprint covers).
fn spec_fingerprint(j: &CronJob) -> Vec<u8> {
    let spec = CronJob {
        namespace: j.namespace.clone(),
        id: j.id.clone(),
        definition_name: j.definition_name.clone(),
        definition_version: j.definition_version,
        inputs_json: j.inputs_json.clone(),
        expression: j.expression.clone(),
        timezone: j.timezone.clone(),
        policies: j.policies.clone(),
        start_at_ms: j.start_at_ms,
        end_at_ms: j.end_at_ms,
        remaining_runs: j.remaining_runs,
        notes: j.notes.clone(),
        ..CronJob::default()
    };
    fingerprint(&[&spec.encode_to_vec()])
}

pub(crate) async fn load_job(
    tx: &Transaction,
    sched: &Scheduler,
    ns: &str,
    id: &str,
) -> Result<Option<CronJob>> {
    match tx.get(&sched.ks.cron_job(ns, id)).await? {
        Some(v) => Ok(Some(decode("cron job", &v)?)),
        None => Ok(None),
    }
}

async fn require_job(tx: &Transaction, sched: &Scheduler, ns: &str, id: &str) -> Result<CronJob> {
    load_job(tx, sched, ns, id)
        .await?
        .ok_or_else(|| Error::NotFound { what: "cron job", id: id.to_string() })
}

impl Scheduler {
    /// A cron shard's watermark, if it has one (read with a conflict).
    pub(crate) async fn cron_watermark(&self, tx: &Transaction, shard: u32) -> Result<Option<i64>> {
        match tx.get(&self.ks.cron_watermark(shard)).await? {
            Some(v) if v.len() == 8 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&v);
                Ok(Some(i64::from_be_bytes(b)))
            }
            Some(_) => Err(Error::Corrupt(format!("cron watermark of shard {shard}"))),
            None => Ok(None),
        }
    }

    /// Moves the job's cron timer to `fire_at_ms` (clamped up to the watermark, which the
    /// shard's first timer creates).
    pub(crate) async fn set_cron_timer(
        &self,
        tx: &Transaction,
        job: &mut CronJob,
        fire_at_ms: i64,
    ) -> Result<()> {
        let wm = match self.cron_watermark(tx, job.shard).await? {
            Some(wm) => wm,
            None => {
                let wm = bucket_of(fire_at_ms, self.config.bucket_width_ms);
                tx.set(&self.ks.cron_watermark(job.shard), &wm.to_be_bytes())?;
                wm
            }
        };
        self.clear_cron_timer(tx, job)?;
        let bucket = bucket_of(fire_at_ms, self.config.bucket_width_ms).max(wm);
        let key =
            CronTimerKey { bucket, shard: job.shard, fire_at_ms, cron_job_id: job.id.clone() };
        let entry = CronTimerEntry { namespace: job.namespace.clone() };
        tx.set(&self.ks.cron_timer(&key), &encode(&entry))?;
        job.timer = Some(CronTimerRef { fire_at_ms, bucket });
        debug_assert!(bucket >= wm, "a cron timer below its watermark would never be seen");
        Ok(())
    }

    /// Removes the job's cron timer, if any.
    pub(crate) fn clear_cron_timer(&self, tx: &Transaction, job: &mut CronJob) -> Result<()> {
        if let Some(t) = job.timer.take() {
            let key = CronTimerKey {
                bucket: t.bucket,
                shard: job.shard,
                fire_at_ms: t.fire_at_ms,
                cron_job_id: job.id.clone(),
            };
            tx.clear(&self.ks.cron_timer(&key))?;
        }
        Ok(())
    }

    async fn definition_for(
        &self,
        tx: &Transaction,
        job: &CronJob,
    ) -> Result<kairos_proto::storage::v1::JobDefinition> {
        super::definitions::load(
            tx,
            &self.ks,
            &job.namespace,
            &job.definition_name,
            job.definition_version,
        )
        .await?
        .ok_or_else(|| Error::NotFound {
            what: "definition",
            id: format!(
                "registry://jobs/{} version {} in namespace {}",
                job.definition_name, job.definition_version, job.namespace
            ),
        })
    }

    /// Creates a cron job from `spec` (its spec fields; an empty id gets a generated one). A
    /// repeat with the same id and spec returns the job (`false`); another spec under that id is
    /// `AlreadyExists`. The first occurrence is the first at or after max(now, start).
    pub async fn create_cron_job(&self, spec: CronJob, paused: bool) -> Result<(CronJob, bool)> {
        let now_ms = self.clock.now().as_millis();
        let mut spec = spec;
        if spec.id.is_empty() {
            spec.id = new_execution_id(self.clock.now(), &self.rng);
        }
        spec.policies = Some(spec.policies.take().unwrap_or_default());
        spec::check_id(&spec.id)?;
        if spec.remaining_runs == Some(0) {
            return Err(invalid("remainingRuns", "must be positive (absent = unlimited)"));
        }
        super::validate::check_name("namespace", &spec.namespace)?;
        let print = spec_fingerprint(&spec);
        let spec = &spec;
        let print = &print;
        self.db
            .run(|tx| async move {
                if let Some(existing) = load_job(&tx, self, &spec.namespace, &spec.id).await? {
                    if &existing.request_fingerprint == print {
                        return Ok((existing, false));
                    }
                    return Err(Error::AlreadyExists { what: "cron job", id: spec.id.clone() });
                }
                let def = self.definition_for(&tx, spec).await?;
                let (schedule, policies) = spec::check_job(spec, &def, now_ms)?;
                let mut job = CronJob {
                    policies: Some(spec::stored_policies(&policies)),
                    status: if paused { CronStatus::Paused } else { CronStatus::Active } as i32,
                    shard: shard_of(&spec.id, self.config.shard_count),
                    created_at_ms: now_ms,
                    updated_at_ms: now_ms,
                    generation: 1,
                    request_fingerprint: print.clone(),
                    paused_at_ms: if paused { now_ms } else { 0 },
                    ..spec.clone()
                };
                job.next_run_at_ms =
                    spec::next_occurrence(&job, &schedule, now_ms - 1).unwrap_or_default();
                if job.next_run_at_ms == 0 {
                    job.status = CronStatus::Completed as i32;
                } else if !paused {
                    self.set_cron_timer(&tx, &mut job, now_ms).await?;
                }
                tx.set(&self.ks.cron_job(&job.namespace, &job.id), &encode(&job))?;
                Ok((job, true))
            })
            .await
    }

    /// A cron job.
    pub async fn get_cron_job(&self, ns: &str, id: &str) -> Result<CronJob> {
        let found = self
            .db
            .run(|tx| async move {
                match tx.snapshot_get(&self.ks.cron_job(ns, id)).await? {
                    Some(v) => Ok::<_, Error>(Some(decode::<CronJob>("cron job", &v)?)),
                    None => Ok(None),
                }
            })
            .await?;
        found.ok_or_else(|| Error::NotFound { what: "cron job", id: id.to_string() })
    }

    /// A page of the namespace's cron jobs by id, after `cursor` (an id).
    pub async fn list_cron_jobs(
        &self,
        ns: &str,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<CronPage> {
        let limit = match limit {
            0 => 100,
            n => n.min(CRON_LIST_PAGE_MAX),
        };
        let mut range = self.ks.cron_jobs(ns);
        if let Some(c) = cursor {
            range.begin = key_after(&self.ks.cron_job(ns, c));
        }
        let range = &range;
        let rows = self
            .db
            .run(|tx| async move {
                Ok::<_, Error>(tx.get_range(&range.clone().limit(limit + 1), true).await?)
            })
            .await?;
        let mut jobs = rows
            .iter()
            .map(|kv| decode::<CronJob>("cron job", &kv.value))
            .collect::<Result<Vec<_>>>()?;
        let next_cursor = (jobs.len() > limit).then(|| {
            jobs.truncate(limit);
            jobs.last().map(|j| j.id.clone()).unwrap_or_default()
        });
        Ok(CronPage { jobs, next_cursor })
    }

    /// Applies `patch` to a job: the spec is checked again, the next occurrence recomputed
    /// (the first after max(now, the last materialized one) under the new schedule); pending,
    /// buffered and materialized occurrences are left alone.
    pub async fn update_cron_job(&self, ns: &str, id: &str, patch: CronPatch) -> Result<CronJob> {
        let now_ms = self.clock.now().as_millis();
        let inputs_json = match &patch.inputs {
            Some(v) => Some(
                serde_json::to_vec(v)
                    .map_err(|e| invalid("inputs", format!("cannot be serialized: {e}")))?,
            ),
            None => None,
        };
        let (patch, inputs_json) = (&patch, &inputs_json);
        self.db
            .run(|tx| async move {
                let old = require_job(&tx, self, ns, id).await?;
                let mut job = old.clone();
                apply_patch(&mut job, patch, inputs_json.clone());
                let def = self.definition_for(&tx, &job).await?;
                let (schedule, policies) = spec::check_job(&job, &def, now_ms)?;
                job.policies = Some(spec::stored_policies(&policies));
                let after = (now_ms - 1).max(job.last_occurrence_ms);
                job.next_run_at_ms =
                    spec::next_occurrence(&job, &schedule, after).unwrap_or_default();
                job.generation += 1;
                job.updated_at_ms = now_ms;
                if job.status == CronStatus::Completed as i32 && job.next_run_at_ms != 0 {
                    job.status = CronStatus::Active as i32;
                }
                if job.status == CronStatus::Active as i32 {
                    self.set_cron_timer(&tx, &mut job, now_ms).await?;
                }
                tx.set(&self.ks.cron_job(ns, id), &encode(&job))?;
                Ok(job)
            })
            .await
    }

    /// Pauses a job: nothing more is materialized until it is resumed. Idempotent.
    pub async fn pause_cron_job(&self, ns: &str, id: &str) -> Result<CronJob> {
        let now_ms = self.clock.now().as_millis();
        self.db
            .run(|tx| async move {
                let mut job = require_job(&tx, self, ns, id).await?;
                if job.status != CronStatus::Active as i32 {
                    return Ok(job);
                }
                job.status = CronStatus::Paused as i32;
                job.paused_at_ms = now_ms;
                job.pause_reason = "paused by a client".into();
                job.generation += 1;
                job.updated_at_ms = now_ms;
                if job.pending.is_empty() {
                    self.clear_cron_timer(&tx, &mut job)?;
                }
                tx.set(&self.ks.cron_job(ns, id), &encode(&job))?;
                Ok(job)
            })
            .await
    }

    /// Resumes a paused job. With `catch_up`, the occurrences that passed while it was paused
    /// are missed occurrences, handled by its missed-run policy (catch-up window, `latest` or
    /// `all`); without, they are dropped and the next occurrence is the first from now on.
    /// Idempotent.
    pub async fn resume_cron_job(&self, ns: &str, id: &str, catch_up: bool) -> Result<CronJob> {
        let now_ms = self.clock.now().as_millis();
        self.db
            .run(|tx| async move {
                let mut job = require_job(&tx, self, ns, id).await?;
                if job.status != CronStatus::Paused as i32 {
                    return Ok(job);
                }
                if !catch_up {
                    let schedule = spec::schedule_of(&job)?;
                    job.next_run_at_ms =
                        spec::next_occurrence(&job, &schedule, now_ms - 1).unwrap_or_default();
                }
                job.status = CronStatus::Active as i32;
                job.paused_at_ms = 0;
                job.pause_reason.clear();
                job.generation += 1;
                job.updated_at_ms = now_ms;
                self.set_cron_timer(&tx, &mut job, now_ms).await?;
                tx.set(&self.ks.cron_job(ns, id), &encode(&job))?;
                Ok(job)
            })
            .await
    }

    /// Deletes a job (its materialized executions stay).
    pub async fn delete_cron_job(&self, ns: &str, id: &str) -> Result<()> {
        self.db
            .run(|tx| async move {
                let mut job = require_job(&tx, self, ns, id).await?;
                self.clear_cron_timer(&tx, &mut job)?;
                tx.clear(&self.ks.cron_job(ns, id))?;
                Ok(())
            })
            .await
    }

    /// Queues the job's occurrences in `[from_ms, until_ms)` to be materialized under the
    /// overlap policy `overlap` (default: the job's), at most
    /// [`CRON_OCCURRENCES_PER_CALL_MAX`]. An occurrence that already has an execution keeps
    /// it (same idempotency key). Returns the job and the occurrences queued.
    pub async fn backfill_cron_job(
        &self,
        ns: &str,
        id: &str,
        from_ms: i64,
        until_ms: i64,
        overlap: Option<&str>,
    ) -> Result<(CronJob, Vec<i64>)> {
        let now_ms = self.clock.now().as_millis();
        if until_ms <= from_ms {
            return Err(invalid("until", "must be after from"));
        }
        if until_ms > now_ms {
            return Err(invalid(
                "until",
                "must not be in the future: backfill is for past occurrences",
            ));
        }
        if let Some(o) = overlap {
            parse_named(&OverlapPolicy::ALL, o).map_err(|e| invalid("overlap", e))?;
        }
        self.db
            .run(|tx| async move {
                let mut job = require_job(&tx, self, ns, id).await?;
                let schedule = spec::schedule_of(&job)?;
                let occurrences: Vec<i64> = schedule
                    .between(from_ms - 1, until_ms - 1, CRON_OCCURRENCES_PER_CALL_MAX + 1);
                if occurrences.len() > CRON_OCCURRENCES_PER_CALL_MAX {
                    return Err(invalid(
                        "until",
                        format!(
                            "the range holds more than {CRON_OCCURRENCES_PER_CALL_MAX} occurrences: \
                             backfill it in parts"
                        ),
                    ));
                }
                if job.queue.len() + occurrences.len() > CRON_QUEUE_MAX {
                    return Err(Error::FailedPrecondition(format!(
                        "cron job {id} has {} occurrences waiting; at most {CRON_QUEUE_MAX} may",
                        job.queue.len()
                    )));
                }
                let policy = match overlap {
                    Some(o) if !o.is_empty() => o.to_string(),
                    _ => job.policies.clone().unwrap_or_default().overlap,
                };
                job.queue.extend(occurrences.iter().map(|o| CronQueued {
                    occurrence_ms: *o,
                    overlap: policy.clone(),
                    backfill: true,
                }));
                job.generation += 1;
                job.updated_at_ms = now_ms;
                if job.status == CronStatus::Active as i32 {
                    self.set_cron_timer(&tx, &mut job, now_ms).await?;
                }
                tx.set(&self.ks.cron_job(ns, id), &encode(&job))?;
                Ok((job, occurrences.clone()))
            })
            .await
    }

    /// Runs the job now, outside its schedule ("trigger now", as `kubectl create job
    /// --from=cronjob/…`): queues one occurrence at this instant, admitted under the overlap
    /// policy `overlap` (default: the job's) like a backfill's. Its execution has the job's
    /// definition and inputs (placeholders filled for this instant), and the idempotency key
    /// of that occurrence; the schedule's own occurrences are unchanged. Only an ACTIVE job.
    /// Returns the job and the occurrence.
    pub async fn trigger_cron_job(
        &self,
        ns: &str,
        id: &str,
        overlap: Option<&str>,
    ) -> Result<(CronJob, i64)> {
        let now_ms = self.clock.now().as_millis();
        if let Some(o) = overlap.filter(|o| !o.is_empty()) {
            parse_named(&OverlapPolicy::ALL, o).map_err(|e| invalid("overlap", e))?;
        }
        self.db
            .run(|tx| async move {
                let mut job = require_job(&tx, self, ns, id).await?;
                if job.status != CronStatus::Active as i32 {
                    return Err(Error::FailedPrecondition(format!(
                        "cron job {id} is {}: only an ACTIVE schedule can be triggered (resume it first)",
                        CronStatus::try_from(job.status)
                            .unwrap_or_default()
                            .as_str_name()
                            .trim_start_matches("CRON_STATUS_")
                    )));
                }
                if job.queue.len() >= CRON_QUEUE_MAX {
                    return Err(Error::FailedPrecondition(format!(
                        "cron job {id} has {} occurrences waiting; at most {CRON_QUEUE_MAX} may",
                        job.queue.len()
                    )));
                }
                let policy = match overlap {
                    Some(o) if !o.is_empty() => o.to_string(),
                    _ => job.policies.clone().unwrap_or_default().overlap,
                };
                job.queue.push(CronQueued { occurrence_ms: now_ms, overlap: policy, backfill: true });
                job.generation += 1;
                job.updated_at_ms = now_ms;
                self.set_cron_timer(&tx, &mut job, now_ms).await?;
                tx.set(&self.ks.cron_job(ns, id), &encode(&job))?;
                Ok((job, now_ms))
            })
            .await
    }

    /// The executions of a job's occurrences, by occurrence (found by their idempotency keys),
    /// whether or not the job still exists.
    pub async fn cron_runs(
        &self,
        ns: &str,
        id: &str,
        limit: usize,
        cursor: Option<Vec<u8>>,
    ) -> Result<RunsPage> {
        spec::check_id(id)?;
        let limit = match limit {
            0 => 100,
            n => n.min(CRON_LIST_PAGE_MAX),
        };
        let mut range = self.ks.idempotency_prefix(ns, &job_key_prefix(id));
        let query_range = range.clone();
        if let Some(c) = cursor {
            let position = super::cursor::open(&self.config.cursor_secret, &query_range, &c)?;
            range.begin = key_after(&position);
        }
        let range = &range;
        let (executions, last) = self
            .db
            .run(|tx| async move {
                let rows = tx.get_range(&range.clone().limit(limit + 1), true).await?;
                let more = rows.len() > limit;
                let rows = &rows[..rows.len().min(limit)];
                // A record that does not decode (a damaged store) is reported, not fatal to
                // the page: Ok(Err(what)) names it.
                let loads = rows.iter().map(|kv| {
                    let tx = &tx;
                    async move {
                        let Ok(rec) = decode::<IdempotencyRecord>("idempotency", &kv.value) else {
                            let key = self.ks.parse_idempotency(&kv.key).map(|(_, k)| k);
                            return Ok(Some(Err(key.unwrap_or_else(|_| "?".into()))));
                        };
                        let id = rec.execution_id;
                        match snapshot_execution(tx, &self.ks, ns, &id).await {
                            Ok(found) => Ok(found.map(Ok)),
                            Err(Error::Kv(e)) => Err(Error::Kv(e)),
                            Err(_) => Ok(Some(Err(id))),
                        }
                    }
                });
                let found = crate::ops::join::join_in_order(loads).await?;
                let last = more.then(|| rows.last().map(|kv| kv.key.to_vec()).unwrap_or_default());
                Ok::<_, Error>((found.into_iter().flatten().collect::<Vec<_>>(), last))
            })
            .await?;
        let (mut runs, mut unreadable) = (Vec::new(), Vec::new());
        for r in executions {
            match r {
                Ok(e) => runs.push(e),
                Err(id) => unreadable.push(id),
            }
        }
        let next_cursor =
            last.map(|p| super::cursor::seal(&self.config.cursor_secret, &query_range, &p));
        Ok(RunsPage { executions: runs, next_cursor, unreadable })
    }
}

fn apply_patch(job: &mut CronJob, p: &CronPatch, inputs_json: Option<Vec<u8>>) {
    if let Some(d) = &p.definition {
        job.definition_name = d.clone();
    }
    if let Some(v) = p.definition_version {
        job.definition_version = v;
    }
    if let Some(i) = inputs_json {
        job.inputs_json = i;
    }
    if let Some(e) = &p.expression {
        job.expression = e.clone();
    }
    if let Some(z) = &p.timezone {
        job.timezone = z.clone();
    }
    let pol = job.policies.get_or_insert_with(CronPolicies::default);
    let set = |dst: &mut String, v: &Option<String>| {
        if let Some(v) = v {
            *dst = v.clone();
        }
    };
    set(&mut pol.dst_gap, &p.dst_gap);
    set(&mut pol.dst_fold, &p.dst_fold);
    set(&mut pol.missed, &p.missed);
    set(&mut pol.overlap, &p.overlap);
    if let Some(w) = p.catch_up_window_ms {
        pol.catch_up_window_ms = w;
    }
    if let Some(b) = p.pause_on_failure {
        pol.pause_on_failure = b;
    }
    if let Some(j) = p.jitter_ms {
        pol.jitter_ms = j;
    }
    if let Some(s) = p.start_at_ms {
        job.start_at_ms = s;
    }
    if let Some(e) = p.end_at_ms {
        job.end_at_ms = e;
    }
    if let Some(r) = p.remaining_runs {
        job.remaining_runs = (r != 0).then_some(r);
    }
    if let Some(n) = &p.notes {
        job.notes = n.clone();
    }
}

/// Occurrences of an expression in a zone (no stored job): `(after, until]`, at most `max`
/// (bounded by [`CRON_OCCURRENCES_PER_CALL_MAX`]).
pub fn preview(
    expression: &str,
    zone: &str,
    gap: &str,
    fold: &str,
    after_ms: i64,
    until_ms: i64,
    max: usize,
) -> Result<(crate::cron::Schedule, Vec<i64>)> {
    let schedule = spec::schedule_from(expression, zone, gap, fold)?;
    if until_ms <= after_ms {
        return Err(invalid("until", "must be after from"));
    }
    let max = if max == 0 {
        CRON_OCCURRENCES_PER_CALL_MAX
    } else {
        max.min(CRON_OCCURRENCES_PER_CALL_MAX)
    };
    let out = schedule.between(after_ms, until_ms, max);
    Ok((schedule, out))
}
