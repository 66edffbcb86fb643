//! One round of one cron job, as its cron shard's owner runs it: read the job, submit an outbox
//! left by a crash, learn the state of its unfinished executions, decide ([`plan`]), write the
//! decision with its outbox ([`cron_apply`](Scheduler::cron_apply)), submit through
//! [`Executions`] (the node uses the public API through the SDK client: the cron service is a
//! client like any other), and settle. Every submit carries the occurrence's idempotency key, so
//! running a round again after any crash makes no second execution.

use std::collections::BTreeMap;
use std::future::Future;

use kairos_proto::storage::v1::{CronJob, CronStatus, ExecutionStatus};
use serde_json::Value;

use super::spec;
use crate::cron::plan::{self, Decision, ExecState, MissedOutcome, Source, plan};
use crate::cron::{Schedule, occurrence_key};
use crate::limits::{CRON_RECOVER_AFTER_MS, EXECUTE_AT_PAST_MAX_MS};
use crate::ops::Scheduler;
use crate::ops::error::Result;

/// One occurrence to submit.
#[derive(Debug, Clone, PartialEq)]
pub struct Materialization {
    /// Namespace.
    pub namespace: String,
    /// `cron:{cron_job_id}:{occurrence}`.
    pub idempotency_key: String,
    /// Definition name.
    pub definition: String,
    /// Definition version.
    pub definition_version: u32,
    /// Inputs, placeholders replaced.
    pub inputs: Value,
    /// When it is due; `None` = now by the node's clock (too late for an absolute time).
    pub execute_at_ms: Option<i64>,
}

/// Why something could not be done through the API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecutionsError {
    /// Try again later (unreachable, timed out, store busy): the outcome is unknown.
    #[error("transient: {0}")]
    Transient(String),
    /// The idempotency key holds another request (the job changed since the first submit).
    #[error("idempotency conflict: {0}")]
    Conflict(String),
    /// Refused for good (invalid inputs, unknown definition, wrong state).
    #[error("{0}")]
    Permanent(String),
}

/// What the executions API made of one materialization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Materialized {
    /// The execution.
    pub execution_id: String,
    /// False when the key had it already.
    pub created: bool,
}

/// The executions API as the cron service uses it.
pub trait Executions: Send + Sync {
    /// Submits a batch; one result per item, in order.
    fn submit(
        &self,
        batch: Vec<Materialization>,
    ) -> impl Future<Output = Result<Vec<Result<Materialized, ExecutionsError>>, ExecutionsError>> + Send;
    /// An execution's status (`None`: no such execution).
    fn status(
        &self,
        ns: &str,
        id: &str,
    ) -> impl Future<Output = Result<Option<ExecutionStatus>, ExecutionsError>> + Send;
    /// The execution submitted with `key`, if any.
    fn by_key(
        &self,
        ns: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<String>, ExecutionsError>> + Send;
    /// Cancels an execution (a running one is asked to stop); a finished one is fine.
    fn cancel(
        &self,
        ns: &str,
        id: &str,
    ) -> impl Future<Output = Result<(), ExecutionsError>> + Send;
}

/// What a round did (for metrics and the owner's next wake-up).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoundReport {
    /// Executions created.
    pub created: u64,
    /// Occurrences whose execution existed already (a retried round).
    pub existing: u64,
    /// Occurrences that could not be submitted for good.
    pub failed: u64,
    /// Executions cancelled (overlap `cancel-previous`).
    pub cancelled: u64,
    /// Occurrences skipped for overlap.
    pub skipped_overlap: u64,
    /// Missed occurrences by outcome.
    pub missed: BTreeMap<&'static str, u64>,
    /// How late each occurrence of the running timeline was materialized, relative to
    /// `due - lookahead` (ms). Backfilled and caught-up (missed) occurrences are late by
    /// design and left out: a backfill is not a scheduling delay.
    pub lateness_ms: Vec<i64>,
    /// The job was paused (pause-on-failure).
    pub paused: bool,
    /// The job completed.
    pub completed: bool,
    /// The round was discarded (the job changed meanwhile): run again.
    pub stale: bool,
    /// When the job wants its next round (`None`: when a client changes it).
    pub wake_ms: Option<i64>,
    /// What went wrong with single occurrences or cancels (for the owner's log).
    pub errors: Vec<String>,
}

/// The due time an occurrence is submitted with: absolute while the API accepts it (up to a
/// day in the past), else "now" by the node's clock.
fn execute_at(due_ms: i64, now_ms: i64) -> Option<i64> {
    (due_ms >= now_ms - (EXECUTE_AT_PAST_MAX_MS - 3_600_000)).then_some(due_ms)
}

impl Scheduler {
    /// Submits a job's outbox (cancels first). A transient failure of the whole call aborts
    /// (the outbox stays for a retry); occurrences refused one by one for a transient reason
    /// (their namespace over its quota) are returned as waiting, the others as submitted.
    async fn flush<E: Executions>(
        &self,
        exec: &E,
        job: &CronJob,
        schedule: &Schedule,
        now_ms: i64,
        report: &mut RoundReport,
    ) -> Result<Flushed, ExecutionsError> {
        let ns = job.namespace.as_str();
        flush_cancels(exec, job, report).await?;
        let mut batch = Vec::new();
        let mut occurrences = Vec::new();
        for p in &job.pending {
            let key = occurrence_key(&job.id, p.occurrence_ms);
            match spec::occurrence_inputs(job, schedule, p.occurrence_ms) {
                Ok(inputs) => {
                    batch.push(Materialization {
                        namespace: job.namespace.clone(),
                        idempotency_key: key,
                        definition: job.definition_name.clone(),
                        definition_version: job.definition_version,
                        inputs,
                        execute_at_ms: execute_at(p.due_ms, now_ms),
                    });
                    occurrences.push(p.occurrence_ms);
                }
                Err(e) => {
                    report.failed += 1;
                    report.errors.push(format!("occurrence {key}: {e}"));
                }
            }
        }
        let mut out = Flushed::default();
        if batch.is_empty() {
            return Ok(out);
        }
        let keys: Vec<String> = batch.iter().map(|m| m.idempotency_key.clone()).collect();
        let results = exec.submit(batch).await?;
        for ((o, key), r) in occurrences.into_iter().zip(keys).zip(results) {
            match r {
                Ok(s) => {
                    if s.created {
                        report.created += 1
                    } else {
                        report.existing += 1
                    }
                    out.done.push((o, s.execution_id));
                }
                Err(ExecutionsError::Conflict(_)) => match exec.by_key(ns, &key).await? {
                    Some(id) => {
                        report.existing += 1;
                        out.done.push((o, id));
                    }
                    None => report.failed += 1,
                },
                Err(ExecutionsError::Transient(e)) => {
                    out.waiting.push(o);
                    out.why_waiting = Some(e);
                }
                Err(ExecutionsError::Permanent(e)) => {
                    report.failed += 1;
                    report.errors.push(format!("occurrence {key}: {e}"));
                }
            }
        }
        Ok(out)
    }

    /// Runs one round of a job at the clock's now. `Err` only for store failures (ownership
    /// lost included); a transient API failure leaves the job's timer at a retry time.
    pub async fn cron_round<E: Executions>(
        &self,
        exec: &E,
        shard: u32,
        epoch: u64,
        ns: &str,
        id: &str,
        lookahead_ms: i64,
    ) -> Result<RoundReport> {
        let now_ms = self.clock.now().as_millis();
        let r = Round { shard, epoch, ns, id, now_ms, retry_at: now_ms + CRON_RECOVER_AFTER_MS };
        let mut report = RoundReport::default();
        let Some(job) = self.cron_job_snapshot(ns, id).await? else { return Ok(report) };
        let schedule = spec::schedule_of(&job)?;
        if !job.pending.is_empty() || !job.pending_cancel.is_empty() {
            // An outbox left by an earlier round (a crash, or a transient failure): submit it
            // again under the same keys, then plan afresh.
            report.wake_ms = Some(now_ms);
            self.flush_and_settle(exec, &r, &job, &schedule, &mut report, true).await?;
            return Ok(report);
        }
        if job.status != CronStatus::Active as i32 {
            self.cron_retry_at(shard, epoch, ns, id, None).await?;
            return Ok(report);
        }
        let lookups = job.outstanding.iter().map(|o| exec.status(ns, &o.execution_id));
        let Ok(found) = crate::ops::join::join_in_order(lookups).await else {
            self.cron_retry_at(shard, epoch, ns, id, Some(r.retry_at)).await?;
            report.wake_ms = Some(r.retry_at);
            return Ok(report);
        };
        let states = job
            .outstanding
            .iter()
            .zip(found)
            .map(|(o, st)| (o.execution_id.clone(), st.map_or(ExecState::Done, spec::exec_state)))
            .collect();
        let round = spec::round_of(&job, now_ms, lookahead_ms, &states)?;
        // Up to 100,000 occurrences scanned for a catch-up: off the runtime's other tasks.
        let d: Decision =
            crate::env::in_place(|| plan(&round, |t| spec::next_occurrence(&job, &schedule, t)));
        report.count(&d, &round, now_ms, lookahead_ms);
        let seen = (job.generation, job.round);
        let Some(applied) =
            self.cron_apply(shard, epoch, ns, id, seen, &d, now_ms, r.retry_at).await?
        else {
            return Ok(RoundReport {
                stale: true,
                wake_ms: Some(now_ms),
                ..RoundReport::default()
            });
        };
        report.wake_ms = if d.completed { None } else { d.wake_ms };
        if !applied.pending.is_empty() || !applied.pending_cancel.is_empty() {
            self.flush_and_settle(exec, &r, &applied, &schedule, &mut report, false).await?;
        }
        Ok(report)
    }

    /// Submits a job's outbox and records it as done, the timer then at `report.wake_ms`; if
    /// the API is unavailable, the outbox waits for the retry timer (moved there for an outbox
    /// `left_over` from an earlier round; the round that just applied one set it already).
    async fn flush_and_settle<E: Executions>(
        &self,
        exec: &E,
        r: &Round<'_>,
        job: &CronJob,
        schedule: &Schedule,
        report: &mut RoundReport,
        left_over: bool,
    ) -> Result<()> {
        let flushed = self.flush(exec, job, schedule, r.now_ms, report).await;
        let flushed = match flushed {
            Ok(f) if f.done.is_empty() && !f.waiting.is_empty() => {
                Err(ExecutionsError::Transient(f.why_waiting.unwrap_or_default()))
            }
            other => other,
        };
        match flushed {
            Ok(f) => {
                if let Some(why) = &f.why_waiting {
                    // Part of the round went through; the rest waits in the outbox for room.
                    report.errors.push(format!(
                        "{} of the round's occurrences wait for room ({why}); retried at {} ms",
                        f.waiting.len(),
                        r.retry_at
                    ));
                    report.wake_ms = Some(report.wake_ms.map_or(r.retry_at, |w| w.min(r.retry_at)));
                }
                let (round, generation) = (job.round, job.generation);
                let (wake, now) = (report.wake_ms, r.now_ms);
                let (done, waiting) = (&f.done, &f.waiting);
                self.cron_settle(
                    r.shard, r.epoch, r.ns, r.id, round, generation, done, waiting, wake, now,
                )
                .await?;
            }
            Err(e) => {
                // Visible: the owner logs the round's errors (a namespace over its quota, the
                // API unavailable), and the job waits for its retry timer.
                report.errors.push(format!(
                    "the round's submits did not go through ({e}); retried at {} ms",
                    r.retry_at
                ));
                if left_over {
                    self.cron_retry_at(r.shard, r.epoch, r.ns, r.id, Some(r.retry_at)).await?;
                }
                report.wake_ms = Some(r.retry_at);
            }
        }
        Ok(())
    }
}

/// Cancels what a job's outbox lists; a transient failure aborts.
async fn flush_cancels<E: Executions>(
    exec: &E,
    job: &CronJob,
    report: &mut RoundReport,
) -> Result<(), ExecutionsError> {
    for id in &job.pending_cancel {
        match exec.cancel(&job.namespace, id).await {
            Ok(()) => report.cancelled += 1,
            Err(ExecutionsError::Transient(e)) => return Err(ExecutionsError::Transient(e)),
            Err(e) => report.errors.push(format!("cancelling {id}: {e}")),
        }
    }
    Ok(())
}

/// What submitting an outbox did.
#[derive(Debug, Default)]
struct Flushed {
    /// `(occurrence, execution id)` of those that have an execution.
    done: Vec<(i64, String)>,
    /// Occurrences refused for now (their namespace over its quota): they stay in the outbox.
    waiting: Vec<i64>,
    /// Why the waiting ones were refused (the last reason).
    why_waiting: Option<String>,
}

/// One round's coordinates.
struct Round<'a> {
    shard: u32,
    epoch: u64,
    ns: &'a str,
    id: &'a str,
    now_ms: i64,
    /// When a round whose submits did not go through is tried again.
    retry_at: i64,
}

impl RoundReport {
    /// What a decision says, for the metrics.
    fn count(&mut self, d: &Decision, round: &plan::Round, now_ms: i64, lookahead_ms: i64) {
        self.skipped_overlap = d.skipped_overlap.len() as u64;
        for (_, outcome) in &d.missed {
            *self.missed.entry(outcome.name()).or_default() += 1;
        }
        if d.expired > 0 {
            *self.missed.entry(MissedOutcome::Expired.name()).or_default() += d.expired;
        }
        let late_by_design = |o: i64| {
            round.queue.iter().any(|q| q.occurrence_ms == o && q.source == Source::Backfill)
                || d.missed.iter().any(|(m, _)| *m == o)
        };
        self.lateness_ms = d
            .materialize
            .iter()
            .filter(|m| !late_by_design(m.occurrence_ms))
            .map(|m| (now_ms - (m.due_ms - lookahead_ms)).max(0))
            .collect();
        self.paused = d.pause.is_some();
        self.completed = d.completed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cron::plan::Queued;
    use crate::cron::{OverlapPolicy, Policies};

    /// A backfill of last week and the next regular occurrence in one round: only the regular
    /// one counts as lateness (a backfill made the lateness alert fire every time).
    #[test]
    fn backfilled_occurrences_are_not_lateness() {
        const HOUR: i64 = 3_600_000;
        let now = 1_790_000_000_000 / HOUR * HOUR;
        let round = plan::Round {
            now_ms: now,
            lookahead_ms: 5_000,
            policies: Policies { overlap: OverlapPolicy::Allow, ..Policies::default() },
            jitter_offset_ms: 0,
            next_ms: Some(now + 5_000), // due exactly one lookahead from now: on time
            end_ms: None,
            remaining_runs: None,
            queue: (1..=3)
                .map(|d| Queued {
                    occurrence_ms: now - d * 24 * HOUR,
                    overlap: OverlapPolicy::Allow,
                    source: Source::Backfill,
                })
                .collect(),
            outstanding: Vec::new(),
        };
        let d = plan(&round, |t| Some(t + HOUR));
        assert_eq!(d.materialize.len(), 4, "{d:?}");
        let mut report = RoundReport::default();
        report.count(&d, &round, now, 5_000);
        assert_eq!(report.lateness_ms, [0], "the regular occurrence only, on time");
    }
}
