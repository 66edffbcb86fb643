//! Worker results: `heartbeat`, `complete`, `fail` — all fenced by the attempt's token — and
//! what happens after an attempt ends unsuccessfully (retry with back-off, or FAILED).

use kairos_proto::storage::v1::{
    Attempt, AttemptStatus, Execution, ExecutionError, ExecutionStatus, TimerKind,
};

use super::Scheduler;
use super::error::{Error, Result, invalid};
use super::limits::{ERROR_MESSAGE_BYTES_MAX, OUTPUT_BYTES_MAX, OUTPUT_REFERENCE_BYTES_MAX};
use super::records::{clear_timer, decode, encode, require_execution, save_execution, set_timer};
use super::retry::retry_delay_ms;
use crate::kv::Transaction;
use crate::state::{AttemptEvent, ExecutionEvent, attempt_transition, execution_transition};

/// A successful attempt's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// Namespace.
    pub namespace: String,
    /// The execution.
    pub execution_id: String,
    /// The attempt's fencing token.
    pub token: u64,
    /// Inline output (JSON, may be empty).
    pub output_json: Vec<u8>,
    /// Where a larger output lives (may be empty).
    pub output_reference: String,
}

/// Most completions one `complete_many` takes.
pub const COMPLETE_BATCH_MAX: usize = 1_000;

fn check_completion(c: &Completion) -> Result<()> {
    if c.output_json.len() > OUTPUT_BYTES_MAX {
        return Err(invalid(
            "output",
            format!("is {} bytes, the limit is {OUTPUT_BYTES_MAX}", c.output_json.len()),
        ));
    }
    if !c.output_json.is_empty()
        && serde_json::from_slice::<serde_json::Value>(&c.output_json).is_err()
    {
        return Err(invalid("output", "must be JSON"));
    }
    if c.output_reference.len() > OUTPUT_REFERENCE_BYTES_MAX {
        return Err(invalid(
            "outputReference",
            format!("is over {OUTPUT_REFERENCE_BYTES_MAX} bytes"),
        ));
    }
    Ok(())
}

/// What a heartbeat reports back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    /// The new lease expiry.
    pub lease_expires_at_ms: i64,
    /// A client asked for the execution to stop: the handler should wind down.
    pub cancel_requested: bool,
}

/// The end of an attempt's deadline: its lease, or the attempt timeout if sooner.
pub(crate) fn attempt_deadline_ms(e: &Execution) -> i64 {
    let lease = e.lease_expires_at_ms;
    if e.attempt_timeout_ms > 0 {
        let timeout = e.started_at_ms.saturating_add(e.attempt_timeout_ms as i64);
        lease.min(timeout)
    } else {
        lease
    }
}

fn status_name(status: i32) -> &'static str {
    ExecutionStatus::try_from(status).map(|s| s.as_str_name()).unwrap_or("UNKNOWN")
}

/// Truncates an error message to the kept size, on a character boundary.
fn bounded(mut error: ExecutionError) -> ExecutionError {
    if error.message.len() > ERROR_MESSAGE_BYTES_MAX {
        let mut cut = ERROR_MESSAGE_BYTES_MAX;
        while !error.message.is_char_boundary(cut) {
            cut -= 1;
        }
        error.message.truncate(cut);
    }
    error
}

pub(crate) async fn load_attempt(
    tx: &Transaction,
    sched: &Scheduler,
    e: &Execution,
) -> Result<Attempt> {
    let key = sched.ks.attempt(&e.namespace, &e.id, e.attempt_count);
    match tx.get(&key).await? {
        Some(v) => decode("attempt", &v),
        None => {
            Err(Error::Corrupt(format!("execution {} lacks attempt {}", e.id, e.attempt_count)))
        }
    }
}

pub(crate) fn save_attempt(
    tx: &Transaction,
    sched: &Scheduler,
    a: &Attempt,
    ns: &str,
) -> Result<()> {
    tx.set(&sched.ks.attempt(ns, &a.execution_id, a.number), &encode(a))?;
    Ok(())
}

/// Fails with `FencedOut` unless `token` is the running attempt's.
fn fence(e: &Execution, token: u64) -> Result<()> {
    if e.fencing_token != token {
        return Err(Error::FencedOut {
            execution_id: e.id.clone(),
            token,
            current: e.fencing_token,
            reason: format!("a newer attempt holds token {}", e.fencing_token),
        });
    }
    if e.status != ExecutionStatus::Running as i32 {
        return Err(Error::FencedOut {
            execution_id: e.id.clone(),
            token,
            current: e.fencing_token,
            reason: format!("the attempt is over (execution is {})", status_name(e.status)),
        });
    }
    Ok(())
}

impl Scheduler {
    /// Ends the current attempt with `event` and applies the retry policy: another attempt
    /// after a full-jitter back-off if `retryable` and attempts remain, else FAILED.
    pub(crate) async fn end_attempt_unsuccessfully(
        &self,
        tx: &Transaction,
        e: &mut Execution,
        event: AttemptEvent,
        error: ExecutionError,
        now_ms: i64,
    ) -> Result<()> {
        let error = bounded(error);
        let mut a = load_attempt(tx, self, e).await?;
        a.status = attempt_transition(a.status(), event)? as i32;
        a.ended_at_ms = now_ms;
        a.error = Some(error.clone());
        save_attempt(tx, self, &a, &e.namespace)?;
        clear_timer(tx, &self.ks, e)?;
        let policy = e.retry_policy.unwrap_or_default();
        let used = e.attempt_count.saturating_sub(e.attempt_base);
        if error.retryable && used < policy.max_attempts {
            e.status = execution_transition(e.status(), ExecutionEvent::Retry)? as i32;
            let delay = retry_delay_ms(&policy, used, &self.rng);
            let at = now_ms.saturating_add(i64::try_from(delay).unwrap_or(i64::MAX));
            set_timer(tx, &self.ks, self.config.bucket_width_ms, e, TimerKind::Retry, at).await?;
        } else {
            e.status = execution_transition(e.status(), ExecutionEvent::Fail)? as i32;
            e.finished_at_ms = now_ms;
        }
        e.error = Some(error);
        e.lease_expires_at_ms = 0;
        e.updated_at_ms = now_ms;
        Ok(())
    }

    /// Extends the current attempt's lease. Fenced: a stale token changes nothing.
    pub async fn heartbeat(&self, ns: &str, id: &str, token: u64) -> Result<HeartbeatOutcome> {
        let now_ms = self.clock.now().as_millis();
        self.db
            .run(|tx| async move {
                let mut e = require_execution(&tx, &self.ks, ns, id).await?;
                fence(&e, token)?;
                let before = e.status;
                let old_expiry = e.lease_expires_at_ms;
                e.lease_expires_at_ms = now_ms.saturating_add(e.lease_ms as i64);
                e.lease_expires_at_ms = attempt_deadline_ms(&e).max(old_expiry);
                if e.lease_expires_at_ms == old_expiry {
                    // Nothing to extend (a repeat within the same millisecond, or the attempt
                    // timeout caps the lease): write nothing.
                    return Ok(HeartbeatOutcome {
                        lease_expires_at_ms: e.lease_expires_at_ms,
                        cancel_requested: e.cancel_requested,
                    });
                }
                e.updated_at_ms = now_ms;
                let mut a = load_attempt(&tx, self, &e).await?;
                a.lease_expires_at_ms = e.lease_expires_at_ms;
                save_attempt(&tx, self, &a, ns)?;
                save_execution(&tx, &self.ks, Some(before), &e)?;
                Ok(HeartbeatOutcome {
                    lease_expires_at_ms: e.lease_expires_at_ms,
                    cancel_requested: e.cancel_requested,
                })
            })
            .await
    }

    /// Completes the current attempt successfully. Fenced; idempotent for the same token.
    pub async fn complete(
        &self,
        ns: &str,
        id: &str,
        token: u64,
        output_json: Vec<u8>,
        output_reference: String,
    ) -> Result<Execution> {
        let c = Completion {
            namespace: ns.into(),
            execution_id: id.into(),
            token,
            output_json,
            output_reference,
        };
        check_completion(&c)?;
        let now_ms = self.clock.now().as_millis();
        let c = &c;
        self.db.run(|tx| async move { self.complete_in(&tx, c, now_ms).await }).await
    }

    /// Completes many attempts in one transaction (one commit for all); each gets its own
    /// result (a fenced-out one does not stop the others).
    pub async fn complete_many(&self, items: Vec<Completion>) -> Result<Vec<Result<Execution>>> {
        if items.len() > COMPLETE_BATCH_MAX {
            return Err(invalid("completions", format!("at most {COMPLETE_BATCH_MAX} per call")));
        }
        let checked: Vec<Result<Completion>> =
            items.into_iter().map(|c| check_completion(&c).map(|()| c)).collect();
        let now_ms = self.clock.now().as_millis();
        self.db
            .run(|tx| {
                let checked = &checked;
                async move {
                    let mut out = Vec::with_capacity(checked.len());
                    for c in checked {
                        out.push(match c {
                            Err(e) => Err(e.clone()),
                            Ok(c) => match self.complete_in(&tx, c, now_ms).await {
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

    async fn complete_in(
        &self,
        tx: &Transaction,
        c: &Completion,
        now_ms: i64,
    ) -> Result<Execution> {
        let (ns, id, token) = (c.namespace.as_str(), c.execution_id.as_str(), c.token);
        let mut e = require_execution(tx, &self.ks, ns, id).await?;
        if e.fencing_token == token && e.status == ExecutionStatus::Succeeded as i32 {
            return Ok(e); // this completion already committed
        }
        fence(&e, token)?;
        let before = e.status;
        let mut a = load_attempt(tx, self, &e).await?;
        a.status = attempt_transition(a.status(), AttemptEvent::Succeed)? as i32;
        a.ended_at_ms = now_ms;
        save_attempt(tx, self, &a, ns)?;
        clear_timer(tx, &self.ks, &mut e)?;
        e.status = execution_transition(e.status(), ExecutionEvent::Succeed)? as i32;
        e.output_json = c.output_json.clone();
        e.output_reference = c.output_reference.clone();
        e.error = None;
        e.finished_at_ms = now_ms;
        e.updated_at_ms = now_ms;
        e.lease_expires_at_ms = 0;
        save_execution(tx, &self.ks, Some(before), &e)?;
        Ok(e)
    }

    /// Fails the current attempt. Retryable errors lead to another attempt after a back-off
    /// while attempts remain; otherwise the execution is FAILED. Fenced; idempotent.
    pub async fn fail(
        &self,
        ns: &str,
        id: &str,
        token: u64,
        error: ExecutionError,
    ) -> Result<Execution> {
        let now_ms = self.clock.now().as_millis();
        self.db
            .run(|tx| {
                let error = error.clone();
                async move {
                    let mut e = require_execution(&tx, &self.ks, ns, id).await?;
                    if e.fencing_token == token && e.status != ExecutionStatus::Running as i32 {
                        let a = load_attempt(&tx, self, &e).await?;
                        if a.status == AttemptStatus::Failed as i32 {
                            return Ok(e); // this failure already committed
                        }
                    }
                    fence(&e, token)?;
                    let before = e.status;
                    self.end_attempt_unsuccessfully(&tx, &mut e, AttemptEvent::Fail, error, now_ms)
                        .await?;
                    save_execution(&tx, &self.ks, Some(before), &e)?;
                    Ok(e)
                }
            })
            .await
    }
}
