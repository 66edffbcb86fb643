//! The cron shard owner's transactions, each fenced by the cron shard's lease epoch:
//!
//! 1. [`cron_scan`](Scheduler::cron_scan): the shard's cron timers up to a time, advancing the
//!    cron watermark past drained buckets.
//! 2. [`cron_apply`](Scheduler::cron_apply): a round's decision, if the job is still as the
//!    round saw it (same `generation` and `round`). The occurrences to materialize and the
//!    executions to cancel are written as the job's `pending` outbox, and its timer set to a
//!    recovery time: a crash before step 3 submits them again, with the same idempotency keys.
//! 3. [`cron_settle`](Scheduler::cron_settle): once submitted (through the API, like any
//!    client), the outbox becomes the outstanding executions and the timer moves to the next
//!    round.

use kairos_proto::storage::v1::{CronJob, CronOutstanding, CronPending, CronQueued, CronStatus};

use super::load_job;
use crate::cron::plan::{Decision, Source};
use crate::cron::policy::{OverlapPolicy, name_of};
use crate::ids::bucket_of;
use crate::keys::Space;
use crate::limits::{CRON_OUTSTANDING_MAX, CRON_TIMERS_PER_SCAN_MAX, FIRE_BUCKETS_PER_CALL_MAX};
use crate::ops::Scheduler;
use crate::ops::error::{Error, Result};
use crate::ops::leases::check_epoch;
use crate::ops::records::{decode, encode};

/// A cron timer found by a scan.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct CronDue {
    /// When the owner should look at the job.
    pub fire_at_ms: i64,
    /// The job's namespace.
    pub namespace: String,
    /// The job.
    pub cron_job_id: String,
}

impl Scheduler {
    /// The cron timers of `shard` firing at or before `until_ms`, from the cron watermark on
    /// (at most [`FIRE_BUCKETS_PER_CALL_MAX`] buckets); the watermark moves past buckets before
    /// `now_ms`'s that hold no timer. Buckets before now are read with conflicts, so a timer
    /// written into one concurrently aborts one of the two.
    pub async fn cron_scan(
        &self,
        shard: u32,
        epoch: u64,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Vec<CronDue>> {
        let width = self.config.bucket_width_ms;
        self.db
            .run(|tx| async move {
                let tx = &tx;
                check_epoch(tx, self, Space::Cron, shard, epoch).await?;
                let Some(wm) = self.cron_watermark(tx, shard).await? else {
                    return Ok(Vec::new()); // no cron timer was ever written to this shard
                };
                let current = bucket_of(now_ms, width);
                let last = bucket_of(until_ms, width).min(wm + FIRE_BUCKETS_PER_CALL_MAX);
                let reads = (wm..=last.max(wm)).map(|b| async move {
                    let range = self
                        .ks
                        .cron_timers_until(b, shard, until_ms)
                        .limit(CRON_TIMERS_PER_SCAN_MAX);
                    let rows = tx.get_range(&range, b >= current).await?;
                    Ok::<_, Error>((b, rows))
                });
                let found = crate::ops::join::join_in_order(reads).await?;
                let mut out = Vec::new();
                let mut new_wm = None;
                for (b, rows) in &found {
                    if !rows.is_empty() && new_wm.is_none() {
                        new_wm = Some(*b);
                    }
                    for kv in rows {
                        let k = self.ks.parse_cron_timer(&kv.key)?;
                        let entry: kairos_proto::storage::v1::CronTimerEntry =
                            decode("cron timer", &kv.value)?;
                        out.push(CronDue {
                            fire_at_ms: k.fire_at_ms,
                            namespace: entry.namespace,
                            cron_job_id: k.cron_job_id,
                        });
                    }
                    if out.len() >= CRON_TIMERS_PER_SCAN_MAX {
                        break;
                    }
                }
                let walked_to = found.last().map_or(wm, |(b, _)| *b);
                let new_wm = new_wm.unwrap_or(walked_to + 1).min(current).max(wm);
                if new_wm > wm {
                    tx.set(&self.ks.cron_watermark(shard), &new_wm.to_be_bytes())?;
                }
                out.sort();
                Ok(out)
            })
            .await
    }

    /// A cron job as its owner reads it (snapshot: no conflict with clients' changes, which
    /// `cron_apply` detects by generation).
    pub async fn cron_job_snapshot(&self, ns: &str, id: &str) -> Result<Option<CronJob>> {
        self.db
            .run(|tx| async move {
                match tx.snapshot_get(&self.ks.cron_job(ns, id)).await? {
                    Some(v) => Ok::<_, Error>(Some(decode::<CronJob>("cron job", &v)?)),
                    None => Ok(None),
                }
            })
            .await
    }

    /// Applies a round's decision to the job if it is still as the round saw it (`generation`,
    /// `round`, ACTIVE, no outbox); `None` otherwise (the owner plans again). The occurrences
    /// to materialize become the job's outbox and its timer is set to `recover_at_ms`.
    #[allow(clippy::too_many_arguments)]
    pub async fn cron_apply(
        &self,
        shard: u32,
        epoch: u64,
        ns: &str,
        id: &str,
        seen: (u64, u64),
        d: &Decision,
        now_ms: i64,
        recover_at_ms: i64,
    ) -> Result<Option<CronJob>> {
        self.db
            .run(|tx| async move {
                check_epoch(&tx, self, Space::Cron, shard, epoch).await?;
                let Some(mut job) = load_job(&tx, self, ns, id).await? else { return Ok(None) };
                if (job.generation, job.round) != seen
                    || job.status != CronStatus::Active as i32
                    || !job.pending.is_empty()
                {
                    return Ok(None);
                }
                debug_assert_eq!(job.shard, shard, "a job is run by its own cron shard");
                record_round(&mut job, d, now_ms);
                if let Some(reason) = &d.pause {
                    job.status = CronStatus::Paused as i32;
                    job.paused_at_ms = now_ms;
                    job.pause_reason = reason.clone();
                    self.clear_cron_timer(&tx, &mut job)?;
                    tx.set(&self.ks.cron_job(ns, id), &encode(&job))?;
                    return Ok(Some(job));
                }
                let outbox = take_outbox(&mut job, d);
                match (outbox, d.wake_ms) {
                    (true, _) => self.set_cron_timer(&tx, &mut job, recover_at_ms).await?,
                    (false, Some(w)) if !d.completed => {
                        self.set_cron_timer(&tx, &mut job, w).await?
                    }
                    (false, _) => self.clear_cron_timer(&tx, &mut job)?,
                }
                tx.set(&self.ks.cron_job(ns, id), &encode(&job))?;
                Ok(Some(job))
            })
            .await
    }

    /// Records the outbox of round `round` as submitted: `materialized` are `(occurrence,
    /// execution id)` of those that have an execution; an occurrence in `waiting` stays in the
    /// outbox for the next try (its namespace had no room for it yet), any other missing from
    /// `materialized` could not be submitted for good and is dropped. The timer moves to
    /// `wake_ms` (to now if a client changed the job since `generation`). Idempotent: a job whose round moved on, or whose
    /// outbox is empty, is left alone.
    #[allow(clippy::too_many_arguments)]
    pub async fn cron_settle(
        &self,
        shard: u32,
        epoch: u64,
        ns: &str,
        id: &str,
        round: u64,
        generation: u64,
        materialized: &[(i64, String)],
        waiting: &[i64],
        wake_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<Option<CronJob>> {
        self.db
            .run(|tx| async move {
                check_epoch(&tx, self, Space::Cron, shard, epoch).await?;
                let Some(mut job) = load_job(&tx, self, ns, id).await? else { return Ok(None) };
                if job.round != round || (job.pending.is_empty() && job.pending_cancel.is_empty()) {
                    return Ok(None);
                }
                for p in std::mem::take(&mut job.pending) {
                    let Some((_, exec)) = materialized.iter().find(|(o, _)| *o == p.occurrence_ms)
                    else {
                        if waiting.contains(&p.occurrence_ms) {
                            job.pending.push(p);
                        }
                        continue;
                    };
                    job.outstanding.push(CronOutstanding {
                        occurrence_ms: p.occurrence_ms,
                        execution_id: exec.clone(),
                        since_ms: now_ms,
                    });
                    job.materialized_count += 1;
                    if p.occurrence_ms >= job.last_occurrence_ms {
                        job.last_occurrence_ms = p.occurrence_ms;
                        job.last_execution_id = exec.clone();
                    }
                }
                job.pending_cancel.clear();
                if job.outstanding.len() > CRON_OUTSTANDING_MAX {
                    let excess = job.outstanding.len() - CRON_OUTSTANDING_MAX;
                    job.outstanding.drain(..excess);
                }
                job.updated_at_ms = now_ms;
                let wake = if job.generation != generation { Some(now_ms) } else { wake_ms };
                match wake {
                    Some(w) if job.status == CronStatus::Active as i32 => {
                        self.set_cron_timer(&tx, &mut job, w).await?
                    }
                    _ => self.clear_cron_timer(&tx, &mut job)?,
                }
                tx.set(&self.ks.cron_job(ns, id), &encode(&job))?;
                Ok(Some(job))
            })
            .await
    }

    /// Moves a job's timer to `at_ms` (an owner that could not finish a round retries it
    /// later), or removes it (`None`: a job that is not active).
    pub async fn cron_retry_at(
        &self,
        shard: u32,
        epoch: u64,
        ns: &str,
        id: &str,
        at_ms: Option<i64>,
    ) -> Result<()> {
        self.db
            .run(|tx| async move {
                check_epoch(&tx, self, Space::Cron, shard, epoch).await?;
                let Some(mut job) = load_job(&tx, self, ns, id).await? else { return Ok(()) };
                if job.timer.as_ref().map(|t| t.fire_at_ms) == at_ms {
                    return Ok(());
                }
                match at_ms {
                    Some(at) => self.set_cron_timer(&tx, &mut job, at).await?,
                    None => self.clear_cron_timer(&tx, &mut job)?,
                }
                tx.set(&self.ks.cron_job(ns, id), &encode(&job))?;
                Ok(())
            })
            .await
    }
}

/// What a round decided that the job keeps whatever follows: its count, the skipped and missed
/// occurrences, the executions it still waits on.
fn record_round(job: &mut CronJob, d: &Decision, now_ms: i64) {
    let round = job.round;
    job.round += 1;
    job.updated_at_ms = now_ms;
    job.skipped_overlap_count += d.skipped_overlap.len() as u64;
    job.missed_count += d.missed.len() as u64 + d.expired;
    job.outstanding = d
        .outstanding
        .iter()
        .map(|o| CronOutstanding {
            occurrence_ms: o.occurrence_ms,
            execution_id: o.execution_id.clone(),
            since_ms: o.since_ms,
        })
        .collect();
    assert_eq!(job.round, round + 1, "a decision is applied once per round");
}

/// A round's plan on the job: its next run, its queue, and the outbox of occurrences to
/// materialize and executions to cancel (`true` if the outbox is not empty).
fn take_outbox(job: &mut CronJob, d: &Decision) -> bool {
    job.next_run_at_ms = d.next_ms.unwrap_or(0);
    job.remaining_runs = d.remaining_runs;
    job.queue = d
        .queue
        .iter()
        .map(|q| CronQueued {
            occurrence_ms: q.occurrence_ms,
            overlap: name_of(&OverlapPolicy::ALL, q.overlap).into(),
            backfill: q.source == Source::Backfill,
        })
        .collect();
    job.pending = d
        .materialize
        .iter()
        .map(|m| CronPending { occurrence_ms: m.occurrence_ms, due_ms: m.due_ms })
        .collect();
    job.pending_cancel = d.cancel.clone();
    if d.completed {
        job.status = CronStatus::Completed as i32;
    }
    !job.pending.is_empty() || !job.pending_cancel.is_empty()
}
