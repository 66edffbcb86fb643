//! Client control of an execution: `cancel` (not started only), `request_cancel` (asks a
//! running attempt's worker to stop), `replay` (FAILED → READY as the next attempt).

use kairos_proto::storage::v1::{Execution, ExecutionStatus};

use super::Scheduler;
use super::error::{Error, Result};
use super::records::{
    clear_timer, dequeue_ready, enqueue_ready, require_execution, save_execution,
};
use crate::state::{ExecutionEvent, execution_transition};

fn status_name(e: &Execution) -> &'static str {
    e.status().as_str_name().trim_start_matches("EXECUTION_STATUS_")
}

impl Scheduler {
    /// Cancels an execution that has not started (SCHEDULED, READY or RETRY_WAIT): removes its
    /// timer or ready entry. A RUNNING (or finished) execution is refused with
    /// `FailedPrecondition`. Cancelling a cancelled execution returns it unchanged.
    pub async fn cancel(&self, ns: &str, id: &str) -> Result<Execution> {
        let now_ms = self.clock.now().as_millis();
        self.db
            .run(|tx| async move {
                let mut e = require_execution(&tx, &self.ks, ns, id).await?;
                if e.status == ExecutionStatus::Cancelled as i32 {
                    return Ok(e);
                }
                let before = e.status;
                let next = execution_transition(e.status(), ExecutionEvent::Cancel).map_err(|_| {
                    Error::FailedPrecondition(format!(
                        "execution {id} is {}: only SCHEDULED, READY or RETRY_WAIT executions can be cancelled",
                        status_name(&e)
                    ))
                })?;
                clear_timer(&tx, &self.ks, &mut e)?;
                if e.status == ExecutionStatus::Ready as i32 {
                    dequeue_ready(&tx, &self.ks, &e)?;
                }
                e.status = next as i32;
                e.finished_at_ms = now_ms;
                e.updated_at_ms = now_ms;
                save_execution(&tx, &self.ks, Some(before), &e)?;
                Ok(e)
            })
            .await
    }

    /// Asks for an execution to stop: cancels it if it has not started, otherwise flags the
    /// running attempt (its worker learns it from the next heartbeat).
    pub async fn request_cancel(&self, ns: &str, id: &str) -> Result<Execution> {
        let now_ms = self.clock.now().as_millis();
        let flagged = self
            .db
            .run(|tx| async move {
                let mut e = require_execution(&tx, &self.ks, ns, id).await?;
                if e.status != ExecutionStatus::Running as i32 {
                    return Ok::<_, Error>(None);
                }
                if !e.cancel_requested {
                    e.cancel_requested = true;
                    e.updated_at_ms = now_ms;
                    save_execution(&tx, &self.ks, Some(e.status), &e)?;
                }
                Ok::<_, Error>(Some(e))
            })
            .await?;
        match flagged {
            Some(e) => Ok(e),
            None => self.cancel(ns, id).await,
        }
    }

    /// Replays a FAILED execution: READY again, as the next attempt of the same execution,
    /// with a fresh retry budget. Idempotent.
    pub async fn replay(&self, ns: &str, id: &str) -> Result<Execution> {
        let now_ms = self.clock.now().as_millis();
        self.db
            .run(|tx| async move {
                let mut e = require_execution(&tx, &self.ks, ns, id).await?;
                let just_replayed = e.status == ExecutionStatus::Ready as i32
                    && e.attempt_count > 0
                    && e.attempt_base == e.attempt_count;
                if just_replayed {
                    return Ok(e);
                }
                let before = e.status;
                e.status =
                    execution_transition(e.status(), ExecutionEvent::Replay).map_err(|_| {
                        Error::FailedPrecondition(format!(
                            "execution {id} is {}: only FAILED executions can be replayed",
                            status_name(&e)
                        ))
                    })? as i32;
                e.attempt_base = e.attempt_count;
                e.error = None;
                e.finished_at_ms = 0;
                e.updated_at_ms = now_ms;
                enqueue_ready(&tx, &self.ks, &mut e, now_ms)?;
                save_execution(&tx, &self.ks, Some(before), &e)?;
                Ok(e)
            })
            .await
    }
}
