//! `fire_due`: a shard owner turns its due timers into effects, fenced by its lease epoch —
//! DUE and RETRY timers make executions READY; LEASE_CHECK timers time out an attempt whose
//! lease expired (then the retry policy) or move to the renewed expiry. Advances the
//! shard's watermark past drained buckets.

use kairos_proto::storage::v1::{
    Execution, ExecutionError, ExecutionStatus, ShardLease, TimerEntry, TimerKind,
};

use super::Scheduler;
use super::error::{Error, Result};
use super::limits::{FIRE_BATCH_MAX, FIRE_BUCKETS_PER_CALL_MAX};
use super::records::{
    decode, enqueue_ready, load_execution, require_execution, save_execution, set_timer, watermark,
};
use super::worker::attempt_deadline_ms;
use crate::ids::bucket_of;
use crate::kv::Transaction;
use crate::state::{AttemptEvent, ExecutionEvent, execution_transition};

/// One timer processed by `fire_due`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fired {
    /// Namespace of the execution.
    pub namespace: String,
    /// The execution.
    pub execution_id: String,
    /// What kind of timer it was.
    pub kind: TimerKind,
    /// When the timer was due.
    pub fire_at_ms: i64,
    /// The execution's `execute_at`.
    pub execute_at_ms: i64,
    /// The execution's status afterwards.
    pub status: ExecutionStatus,
    /// The queue it is ready on, if it became READY.
    pub queue: String,
    /// The execution's next timer, if processing set one (retry back-off, renewed lease).
    pub next_timer: Option<crate::keys::TimerKey>,
}

/// The result of one `fire_due` call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FireOutcome {
    /// Timers processed (stale ones are removed and not listed).
    pub fired: Vec<Fired>,
    /// The shard's watermark afterwards.
    pub watermark: i64,
    /// More timers were due than the limit allowed: call again.
    pub more: bool,
}

/// Checks the caller still owns `shard` at `epoch` (a read with a conflict, so a concurrent
/// change of owner aborts this transaction).
pub(crate) async fn check_epoch(
    tx: &Transaction,
    sched: &Scheduler,
    shard: u32,
    epoch: u64,
) -> Result<()> {
    let current = match tx.get(&sched.ks.shard_lease(shard)).await? {
        Some(v) => decode::<ShardLease>("shard lease", &v)?.epoch,
        None => 0,
    };
    if current != epoch || epoch == 0 {
        return Err(Error::OwnershipLost { shard, epoch, current });
    }
    Ok(())
}

impl Scheduler {
    /// Processes up to `limit` timers of `shard` due at `now_ms`, fenced by `epoch`: a stale
    /// owner gets `OwnershipLost` and changes nothing.
    pub async fn fire_due(
        &self,
        shard: u32,
        epoch: u64,
        now_ms: i64,
        limit: usize,
    ) -> Result<FireOutcome> {
        let limit = limit.clamp(1, FIRE_BATCH_MAX);
        self.db
            .run(|tx| async move {
                check_epoch(&tx, self, shard, epoch).await?;
                let wm = watermark(&tx, &self.ks, shard).await?;
                let now_bucket = bucket_of(now_ms, self.config.bucket_width_ms);
                let mut out = FireOutcome { watermark: wm, ..FireOutcome::default() };
                let mut bucket = wm;
                while bucket <= now_bucket {
                    if bucket - wm >= FIRE_BUCKETS_PER_CALL_MAX {
                        out.more = true;
                        break;
                    }
                    let left = limit - out.fired.len();
                    let range = self.ks.timers_due(bucket, shard, now_ms).limit(left + 1);
                    let rows = tx.get_range(&range, false).await?;
                    let full = rows.len() > left;
                    for kv in rows.iter().take(left) {
                        tx.clear(&kv.key)?;
                        let timer = self.ks.parse_timer(&kv.key)?;
                        let entry: TimerEntry = decode("timer", &kv.value)?;
                        if let Some(f) = self.fire_one(&tx, &timer, &entry, now_ms).await? {
                            out.fired.push(f);
                        }
                    }
                    if full {
                        out.more = true;
                        break;
                    }
                    // Every timer of a past bucket is due (later ones land in later buckets),
                    // so a past bucket is now empty and the watermark may pass it.
                    if bucket < now_bucket {
                        out.watermark = bucket + 1;
                    }
                    bucket += 1;
                }
                if out.watermark != wm {
                    tx.set(&self.ks.watermark(shard), &out.watermark.to_be_bytes())?;
                }
                Ok(out)
            })
            .await
    }

    async fn fire_one(
        &self,
        tx: &Transaction,
        timer: &crate::keys::TimerKey,
        entry: &TimerEntry,
        now_ms: i64,
    ) -> Result<Option<Fired>> {
        let Some(mut e) =
            load_execution(tx, &self.ks, &entry.namespace, &timer.execution_id).await?
        else {
            return Ok(None); // execution gone: a stale timer
        };
        let current = e.timer.as_ref().is_some_and(|t| {
            t.fire_at_ms == timer.fire_at_ms && t.kind == timer.kind && t.bucket == timer.bucket
        });
        if !current {
            return Ok(None); // replaced or cleared: the key was stale
        }
        e.timer = None; // its key is cleared by the caller
        let before = e.status;
        let kind = TimerKind::try_from(timer.kind).unwrap_or(TimerKind::Unspecified);
        match kind {
            TimerKind::Due | TimerKind::Retry => {
                let event = if kind == TimerKind::Due {
                    ExecutionEvent::Fire
                } else {
                    ExecutionEvent::RetryDue
                };
                e.status = execution_transition(e.status(), event)? as i32;
                enqueue_ready(tx, &self.ks, &mut e, now_ms)?;
            }
            TimerKind::LeaseCheck => self.check_lease(tx, &mut e, now_ms).await?,
            TimerKind::Unspecified => {
                return Err(Error::Corrupt(format!("timer of {} has no kind", e.id)));
            }
        }
        e.updated_at_ms = now_ms;
        save_execution(tx, &self.ks, Some(before), &e)?;
        Ok(Some(Fired {
            namespace: e.namespace.clone(),
            execution_id: e.id.clone(),
            kind,
            fire_at_ms: timer.fire_at_ms,
            execute_at_ms: e.execute_at_ms,
            status: e.status(),
            queue: e.queue.clone(),
            next_timer: super::timer_of(&e),
        }))
    }

    /// The lease check of a RUNNING execution: past its deadline the attempt TIMED_OUT (then
    /// the retry policy); otherwise the timer moves to the renewed deadline.
    async fn check_lease(&self, tx: &Transaction, e: &mut Execution, now_ms: i64) -> Result<()> {
        if e.status != ExecutionStatus::Running as i32 {
            return Ok(());
        }
        let deadline = attempt_deadline_ms(e);
        if now_ms >= deadline {
            let timed_out_by_timeout = e.attempt_timeout_ms > 0 && deadline < e.lease_expires_at_ms;
            let error = ExecutionError {
                message: if timed_out_by_timeout {
                    format!(
                        "attempt {} exceeded its timeout of {} ms",
                        e.attempt_count, e.attempt_timeout_ms
                    )
                } else {
                    format!(
                        "attempt {} lost its lease: no heartbeat before {deadline} ms",
                        e.attempt_count
                    )
                },
                retryable: true,
                code: if timed_out_by_timeout { "attempt_timeout" } else { "lease_expired" }.into(),
            };
            self.end_attempt_unsuccessfully(tx, e, AttemptEvent::TimeOut, error, now_ms).await
        } else {
            set_timer(tx, &self.ks, self.config.bucket_width_ms, e, TimerKind::LeaseCheck, deadline)
                .await
        }
    }

    /// Processes one timer of `shard` (an execution supervisor's deadline), fenced by `epoch`
    /// like `fire_due`. `None` if the timer is gone (already processed or replaced) or not due.
    pub async fn fire_timer(
        &self,
        shard: u32,
        epoch: u64,
        timer: &crate::keys::TimerKey,
        now_ms: i64,
    ) -> Result<Option<Fired>> {
        if timer.shard != shard || timer.fire_at_ms > now_ms {
            return Ok(None);
        }
        self.db
            .run(|tx| async move {
                check_epoch(&tx, self, shard, epoch).await?;
                let key = self.ks.timer(timer);
                let Some(v) = tx.get(&key).await? else { return Ok(None) };
                tx.clear(&key)?;
                let entry: TimerEntry = decode("timer", &v)?;
                self.fire_one(&tx, timer, &entry, now_ms).await
            })
            .await
    }

    /// The timers of `shard` with `after_ms < fire_at <= until_ms`, earliest first, at most
    /// `limit`; `true` if the limit cut the list short. Snapshot reads: a shard owner loads
    /// its window with this, then fires through the fenced paths.
    pub async fn load_timers(
        &self,
        shard: u32,
        after_ms: i64,
        until_ms: i64,
        limit: usize,
    ) -> Result<(Vec<crate::keys::TimerKey>, bool)> {
        let width = self.config.bucket_width_ms;
        self.db
            .run(|tx| async move {
                let wm = watermark(&tx, &self.ks, shard).await?;
                let mut out = Vec::new();
                let first = bucket_of(after_ms, width).max(wm);
                for bucket in first..=bucket_of(until_ms, width) {
                    let left = limit - out.len();
                    let range =
                        self.ks.timers_between(bucket, shard, after_ms, until_ms).limit(left + 1);
                    let rows = tx.get_range(&range, true).await?;
                    for kv in rows.iter().take(left) {
                        out.push(self.ks.parse_timer(&kv.key)?);
                    }
                    if rows.len() > left {
                        return Ok((out, true));
                    }
                }
                Ok((out, false))
            })
            .await
    }

    /// Runs the lease check of one execution now (outside a shard owner's `fire_due`, e.g. for
    /// an operator or a test). Returns the execution afterwards.
    pub async fn lease_check(&self, ns: &str, id: &str, now_ms: i64) -> Result<Execution> {
        self.db
            .run(|tx| async move {
                let mut e = require_execution(&tx, &self.ks, ns, id).await?;
                let before = e.status;
                self.check_lease(&tx, &mut e, now_ms).await?;
                save_execution(&tx, &self.ks, Some(before), &e)?;
                Ok(e)
            })
            .await
    }
}
