//! Client control of an execution: `cancel` (a pending execution at once; a running one by
//! asking its worker to stop, after which it ends CANCELLED and is never retried) and `replay`
//! (FAILED → READY as the next attempt).

use kairos_proto::storage::v1::{Execution, ExecutionStatus};

use super::Scheduler;
use super::access::Audit;
use super::error::{Error, Result};
use super::records::require_execution;
use crate::state::{ExecutionEvent, execution_transition, status_name};

/// What `cancel` did.
#[derive(Debug, Clone, PartialEq)]
pub struct Cancelled {
    /// The execution afterwards.
    pub execution: Execution,
    /// `true` if it is CANCELLED now; `false` if it was RUNNING and its worker was asked to
    /// stop (it ends CANCELLED when the attempt ends, unless the handler completes first).
    pub done: bool,
}

impl Scheduler {
    /// Cancels an execution. One that has not started (SCHEDULED, READY or RETRY_WAIT) is
    /// CANCELLED at once (its timer or ready entry removed); a RUNNING one is flagged, its
    /// worker learns it from its next heartbeat, and it ends CANCELLED when the attempt ends
    /// (a failure, a time-out or a release), never retried — or SUCCEEDED if the handler
    /// completes anyway. A finished execution is refused with `FailedPrecondition`.
    /// Idempotent. Recorded in the audit log as asked by `who` (when it changed something).
    pub async fn cancel(&self, ns: &str, id: &str, who: &str) -> Result<Cancelled> {
        super::validate::check_ref(ns, id)?;
        let now_ms = self.clock.now().as_millis();
        let audit_id = self.audit_id();
        let audit = |tx: &crate::kv::Transaction, detail: &str| {
            let a = Audit {
                who,
                action: "execution.cancel",
                target: id.to_string(),
                detail: detail.to_string(),
            };
            self.write_audit(tx, ns, now_ms, &audit_id, &a)
        };
        let audit = &audit;
        self.db
            .run(|tx| async move {
                let mut e = require_execution(&tx, &self.ks, ns, id).await?;
                let before = e.status;
                match e.status() {
                    ExecutionStatus::Cancelled => {
                        return Ok(Cancelled { execution: e, done: true });
                    }
                    ExecutionStatus::Running => {
                        if !e.cancel_requested {
                            e.cancel_requested = true;
                            e.updated_at_ms = now_ms;
                            self.save_execution(&tx, Some(before), &e)?;
                            audit(&tx, "RUNNING: cancel requested")?;
                        }
                        return Ok(Cancelled { execution: e, done: false });
                    }
                    _ => {}
                }
                let next =
                    execution_transition(e.status(), ExecutionEvent::Cancel).map_err(|_| {
                        Error::FailedPrecondition(format!(
                            "execution {id} is {}: it has finished and can no longer be cancelled",
                            status_name(e.status)
                        ))
                    })?;
                self.clear_timer(&tx, &mut e)?;
                if e.status == ExecutionStatus::Ready as i32 {
                    self.dequeue_ready(&tx, &e)?;
                }
                assert_eq!(
                    next,
                    ExecutionStatus::Cancelled,
                    "a cancel of a pending execution ends it"
                );
                e.status = next as i32;
                e.cancel_requested = true;
                e.finished_at_ms = now_ms;
                e.updated_at_ms = now_ms;
                self.save_execution(&tx, Some(before), &e)?;
                audit(&tx, &format!("{} → CANCELLED", status_name(before)))?;
                Ok(Cancelled { execution: e, done: true })
            })
            .await
    }

    /// Replays a FAILED execution: READY again, as the next attempt of the same execution,
    /// with a fresh retry budget. Idempotent.
    ///
    /// A commit that comes back unknown-result is retried; if it did apply, the execution may
    /// have moved on before the retry reads it (claimed again, even finished or FAILED again).
    /// The retry recognizes its own replay — the execution has left the FAILED state it read,
    /// with `attempt_base` at that state's attempt count — and answers it, rather than refusing
    /// with `FailedPrecondition` (or replaying a second time) a replay that took effect.
    /// Recorded in the audit log as asked by `who`.
    pub async fn replay(&self, ns: &str, id: &str, who: &str) -> Result<Execution> {
        super::validate::check_ref(ns, id)?;
        let now_ms = self.clock.now().as_millis();
        let audit_id = self.audit_id();
        let audit_id = &audit_id;
        // The attempt count of the FAILED state this call's last commit replayed (none yet).
        let tried = std::sync::atomic::AtomicU64::new(u64::MAX);
        let tried = &tried;
        self.db
            .run(|tx| async move {
                let mut e = require_execution(&tx, &self.ks, ns, id).await?;
                let just_replayed = e.status == ExecutionStatus::Ready as i32
                    && e.attempt_count > 0
                    && e.attempt_base == e.attempt_count;
                if just_replayed {
                    return Ok(e);
                }
                let ours = tried.load(std::sync::atomic::Ordering::Relaxed);
                let still_failed_there = e.status == ExecutionStatus::Failed as i32
                    && u64::from(e.attempt_count) == ours;
                if ours != u64::MAX && u64::from(e.attempt_base) == ours && !still_failed_there {
                    return Ok(e); // replayed by this call's earlier, maybe-committed, commit
                }
                let before = e.status;
                e.status =
                    execution_transition(e.status(), ExecutionEvent::Replay).map_err(|_| {
                        Error::FailedPrecondition(format!(
                            "execution {id} is {}: only FAILED executions can be replayed",
                            status_name(e.status)
                        ))
                    })? as i32;
                e.attempt_base = e.attempt_count;
                e.attempts_released = 0;
                e.error = None;
                e.finished_at_ms = 0;
                e.updated_at_ms = now_ms;
                self.enqueue_ready(&tx, &mut e, now_ms)?;
                self.save_execution(&tx, Some(before), &e)?;
                let a = Audit {
                    who,
                    action: "execution.replay",
                    target: id.to_string(),
                    detail: format!("after {} attempts", e.attempt_count),
                };
                self.write_audit(&tx, ns, now_ms, audit_id, &a)?;
                tried.store(u64::from(e.attempt_count), std::sync::atomic::Ordering::Relaxed);
                Ok(e)
            })
            .await
    }
}
