//! Attempts: how one starts (a claim, or a fire matched to a waiting worker), and the worker's
//! side — heartbeats and results (success, failure, release), all fenced by the attempt's
//! token, one at a time or many in one transaction — and what follows an attempt that ended
//! unsuccessfully (retry with back-off, FAILED, or CANCELLED when a client asked for it).
//!
//! The running attempt lives on the execution record (`worker_id`, `started_at_ms`, lease,
//! token); its attempt record is written once, when it ends.

use std::collections::{BTreeMap, BTreeSet};

use kairos_proto::storage::v1::{
    Attempt, AttemptStatus, Execution, ExecutionError, ExecutionStatus, TimerKind,
};

use super::Scheduler;
use super::budget;
use super::claim::ClaimSlot;
use super::error::{Error, Result, invalid};
use super::lease_checks::LeaseChecks;
use super::records::{decode, load_state, running_attempt, watermark};
use super::retry::retry_delay_ms;
use super::validate::{check_batch, check_name, check_ref};
use crate::kv::Transaction;
use crate::limits::{
    ERROR_CODE_BYTES_MAX, ERROR_MESSAGE_BYTES_MAX, LEASE_MS_MAX, LEASE_MS_MIN, OUTPUT_BYTES_MAX,
    OUTPUT_REFERENCE_BYTES_MAX,
};
use crate::limits::{HEARTBEAT_BATCH_MAX, RELEASES_UNCOUNTED_MAX, REPORT_BATCH_MAX};
use crate::state::{AttemptEvent, ExecutionEvent, attempt_transition, execution_transition};

/// How an attempt ended, as its worker reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It succeeded.
    Success {
        /// Inline output (JSON, may be empty).
        output_json: Vec<u8>,
        /// Where a larger output lives (may be empty).
        output_reference: String,
    },
    /// It failed; `retryable` decides whether another attempt follows.
    Failure(ExecutionError),
    /// The worker gives it back without having started it (shutting down, or it never reached
    /// a handler): READY again at once, not counted against the retry budget.
    Release,
}

/// A worker's result for one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Namespace.
    pub namespace: String,
    /// The execution.
    pub execution_id: String,
    /// The attempt's fencing token.
    pub token: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// The reporting worker (names the attempt's worker if a node's dispatch buffer claimed it
    /// unassigned); `None` keeps what the attempt has. An attempt held by another worker is
    /// fenced out.
    pub worker_id: Option<String>,
    /// The queue the reporting worker serves (a worker stream's): an attempt of another queue
    /// is fenced out. `None`: not checked (a unary call names no queue).
    pub queue: Option<String>,
}

/// Checks a result's own fields, naming the field: ids, the worker, the output and its reference,
/// the error's code (its message is truncated to [`ERROR_MESSAGE_BYTES_MAX`], not refused). The
/// node checks each result with this before merging it with other callers' results, so one
/// caller's bad result never fails another's.
pub fn check_report(r: &Report) -> Result<()> {
    check_ref(&r.namespace, &r.execution_id)?;
    if let Some(w) = &r.worker_id {
        check_name("workerId", w)?;
    }
    if let Outcome::Failure(e) = &r.outcome
        && e.code.len() > ERROR_CODE_BYTES_MAX
    {
        return Err(invalid(
            "error.code",
            format!("is {} bytes, the limit is {ERROR_CODE_BYTES_MAX}", e.code.len()),
        ));
    }
    if let Outcome::Success { output_json, output_reference } = &r.outcome {
        if output_json.len() > OUTPUT_BYTES_MAX {
            return Err(invalid(
                "output",
                format!("is {} bytes, the limit is {OUTPUT_BYTES_MAX}", output_json.len()),
            ));
        }
        if !output_json.is_empty()
            && serde_json::from_slice::<serde_json::Value>(output_json).is_err()
        {
            return Err(invalid("output", "must be JSON"));
        }
        if output_reference.len() > OUTPUT_REFERENCE_BYTES_MAX {
            return Err(invalid(
                "outputReference",
                format!("is over {OUTPUT_REFERENCE_BYTES_MAX} bytes"),
            ));
        }
    }
    Ok(())
}

/// What a result adds to its execution's record at most (its output or error).
fn report_bytes(r: &Report) -> usize {
    match &r.outcome {
        Outcome::Success { output_json, output_reference } => {
            output_json.len() + output_reference.len()
        }
        Outcome::Failure(e) => 2 * (e.message.len().min(ERROR_MESSAGE_BYTES_MAX) + e.code.len()),
        Outcome::Release => 0,
    }
}

/// What a heartbeat reports back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    /// The new lease expiry.
    pub lease_expires_at_ms: i64,
    /// A client asked for the execution to stop: the handler should wind down.
    pub cancel_requested: bool,
}

/// One heartbeat of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beat {
    /// Namespace.
    pub namespace: String,
    /// The execution.
    pub execution_id: String,
    /// The attempt's fencing token.
    pub token: u64,
    /// The beating worker (names the attempt's worker if it was claimed unassigned).
    pub worker_id: Option<String>,
    /// The queue the beating worker serves, as in [`Report::queue`].
    pub queue: Option<String>,
}

/// The end of an attempt's deadline: its lease, or the attempt timeout if sooner.
pub(crate) fn attempt_deadline_ms(e: &Execution) -> i64 {
    let lease = e.lease_expires_at_ms;
    match attempt_timeout_at_ms(e) {
        Some(timeout) => lease.min(timeout),
        None => lease,
    }
}

/// When the running attempt's own timeout (`attempt_timeout_ms`) runs out, if it has one.
pub(crate) fn attempt_timeout_at_ms(e: &Execution) -> Option<i64> {
    (e.attempt_timeout_ms > 0).then(|| {
        e.started_at_ms.saturating_add(i64::try_from(e.attempt_timeout_ms).unwrap_or(i64::MAX))
    })
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

/// Reads an ended attempt's record.
pub(crate) async fn load_attempt(
    tx: &Transaction,
    sched: &Scheduler,
    ns: &str,
    id: &str,
    number: u32,
) -> Result<Option<Attempt>> {
    match tx.get(&sched.ks.attempt(ns, id, number)).await? {
        Some(v) => Ok(Some(decode("attempt", &v)?)),
        None => Ok(None),
    }
}

/// The fencing token of attempt `number` of execution `ns`/`id`: the first 64 bits of an
/// HMAC-SHA-256 under this node's secret key (decision 0010). Nobody without the key can
/// compute it, so only the worker the attempt was handed to knows it; a transaction retried
/// after a conflict or an unknown commit result computes the same one. Never 0 (no attempt) and
/// never `previous` (the attempt before it).
pub(crate) fn fencing_token(key: &[u8; 32], ns: &str, id: &str, number: u32, previous: u64) -> u64 {
    use hmac::{Hmac, Mac};
    let mut m = Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    for part in [ns.as_bytes(), id.as_bytes()] {
        m.update(&(part.len() as u64).to_be_bytes());
        m.update(part);
    }
    m.update(&number.to_be_bytes());
    let full = m.finalize().into_bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&full[..8]);
    let token = u64::from_be_bytes(first);
    match token {
        0 => 1 + u64::from(previous == 1),
        t if t == previous => t ^ 1,
        t => t,
    }
}

fn fenced(e: &Execution, reason: impl Into<String>) -> Error {
    Error::FencedOut { execution_id: e.id.clone(), reason: reason.into() }
}

/// Fails with `FencedOut` unless `token` is the running attempt's. The error names neither
/// token: the caller learns only that its token does not hold the attempt.
fn fence(e: &Execution, token: u64) -> Result<()> {
    if e.fencing_token != token {
        return Err(fenced(
            e,
            "this token holds no running attempt of it (a newer attempt started, or the token is wrong)",
        ));
    }
    if e.status != ExecutionStatus::Running as i32 {
        return Err(fenced(
            e,
            format!("the attempt is over (execution is {})", crate::state::status_name(e.status)),
        ));
    }
    Ok(())
}

/// Fails with `FencedOut` when the attempt (whose token the caller holds) is another worker's
/// or of another queue than the caller serves: a result or heartbeat binds to the worker that
/// holds the attempt and to its queue, not only to the token.
fn bound(e: &Execution, worker_id: Option<&String>, queue: Option<&String>) -> Result<()> {
    if let Some(q) = queue.filter(|q| **q != e.queue) {
        return Err(fenced(
            e,
            format!("the attempt is of queue {}, not of {}", e.queue, super::error::shown(q)),
        ));
    }
    if let Some(w) = worker_id.filter(|w| !w.is_empty() && !e.worker_id.is_empty())
        && *w != e.worker_id
    {
        return Err(fenced(
            e,
            format!(
                "the attempt is held by worker {}, not by {}",
                e.worker_id,
                super::error::shown(w)
            ),
        ));
    }
    Ok(())
}

impl Scheduler {
    /// Reads the watermarks of `shards` concurrently (each with a conflict).
    pub(crate) async fn watermarks(
        &self,
        tx: &Transaction,
        shards: BTreeSet<u32>,
    ) -> Result<BTreeMap<u32, i64>> {
        let reads = shards
            .into_iter()
            .map(|s| async move { Ok::<_, Error>((s, watermark(tx, &self.ks, s).await?)) });
        Ok(crate::ops::join::join_in_order(reads).await?.into_iter().collect())
    }

    /// READY → RUNNING: a new attempt with the next fencing token, a lease, and a place in the
    /// transaction's shared lease check of its shard and deadline (`checks`: the caller writes
    /// them before it commits, `ops::lease_checks`; `wm` is the execution's shard watermark,
    /// read in this transaction). `stored` is
    /// the status the store holds, which the status index moves from: READY for a claim, the
    /// state before firing for a fire matched to a waiting worker (READY is then never stored),
    /// none for a submit of due-now work matched to a waiting worker (a new execution).
    pub(crate) fn start_attempt(
        &self,
        tx: &Transaction,
        e: &mut Execution,
        stored: Option<i32>,
        (slot, checks): (&ClaimSlot, &mut LeaseChecks),
        now_ms: i64,
        wm: i64,
    ) -> Result<()> {
        let previous = e.fencing_token;
        e.status = execution_transition(e.status(), ExecutionEvent::Claim)? as i32;
        e.attempt_count += 1;
        e.fencing_token =
            fencing_token(&self.token_key, &e.namespace, &e.id, e.attempt_count, previous);
        e.worker_id = slot.worker_id.clone();
        e.worker_confirmed = false; // until the worker is heard from
        e.started_at_ms = now_ms;
        e.updated_at_ms = now_ms;
        let lease = slot.lease_ms.unwrap_or(e.lease_ms).clamp(LEASE_MS_MIN, LEASE_MS_MAX);
        e.lease_ms = lease;
        e.lease_expires_at_ms = now_ms.saturating_add(lease as i64);
        e.lease_expires_at_ms = attempt_deadline_ms(e);
        let deadline = e.lease_expires_at_ms;
        self.clear_timer(tx, e)?;
        self.join_lease_checks(checks, e, deadline, wm);
        self.save_execution(tx, stored, e)?;
        assert!(e.status == ExecutionStatus::Running as i32 && e.timer.is_some());
        assert!(e.fencing_token != previous, "a new attempt has a new fencing token");
        Ok(())
    }

    /// Ends the running attempt with `event` (writing its record) and moves the execution on:
    /// CANCELLED if a client asked for that; otherwise another attempt after a full-jitter
    /// back-off if the error is retryable and attempts remain, else FAILED. `wm` is the
    /// execution's shard watermark, read in this transaction.
    pub(crate) fn end_attempt_unsuccessfully(
        &self,
        tx: &Transaction,
        e: &mut Execution,
        event: AttemptEvent,
        error: ExecutionError,
        now_ms: i64,
        wm: i64,
    ) -> Result<()> {
        let error = bounded(error);
        let event = if e.cancel_requested && event == AttemptEvent::Fail {
            AttemptEvent::Cancel
        } else {
            event
        };
        self.end_attempt(tx, e, event, Some(error.clone()), now_ms)?;
        let policy = e.retry_policy.unwrap_or_default();
        let used =
            e.attempt_count.saturating_sub(e.attempt_base).saturating_sub(e.attempts_released);
        if e.cancel_requested {
            e.status = execution_transition(e.status(), ExecutionEvent::Cancel)? as i32;
            e.finished_at_ms = now_ms;
        } else if error.retryable && used < policy.max_attempts {
            e.status = execution_transition(e.status(), ExecutionEvent::Retry)? as i32;
            let delay = retry_delay_ms(&policy, used, &self.rng);
            let at = now_ms.saturating_add(i64::try_from(delay).unwrap_or(i64::MAX));
            self.set_timer_with(tx, e, TimerKind::Retry, at, wm)?;
        } else {
            e.status = execution_transition(e.status(), ExecutionEvent::Fail)? as i32;
            e.finished_at_ms = now_ms;
        }
        e.error = Some(error);
        e.lease_expires_at_ms = 0;
        e.updated_at_ms = now_ms;
        assert!(
            matches!(
                e.status(),
                ExecutionStatus::RetryWait | ExecutionStatus::Failed | ExecutionStatus::Cancelled
            ),
            "an attempt that ended unsuccessfully leaves its execution retrying, failed or cancelled"
        );
        Ok(())
    }

    /// Writes the record of the running attempt as ended by `event` (a successful one is not
    /// written: the execution holds it) and clears its lease check.
    fn end_attempt(
        &self,
        tx: &Transaction,
        e: &mut Execution,
        event: AttemptEvent,
        error: Option<ExecutionError>,
        now_ms: i64,
    ) -> Result<()> {
        let mut a = running_attempt(e);
        a.status = attempt_transition(a.status(), event)? as i32;
        a.ended_at_ms = now_ms;
        a.error = error;
        if event != AttemptEvent::Succeed {
            self.save_attempt(tx, &e.namespace, &a)?;
        }
        self.clear_timer(tx, e)?;
        Ok(())
    }

    /// Gives the running attempt back unstarted (its worker released it, or it was claimed
    /// unassigned and its lease ran out): READY again, not counted — or CANCELLED if asked.
    pub(crate) fn release_attempt(
        &self,
        tx: &Transaction,
        e: &mut Execution,
        now_ms: i64,
    ) -> Result<()> {
        self.end_attempt(tx, e, AttemptEvent::Abandon, None, now_ms)?;
        if e.cancel_requested {
            e.status = execution_transition(e.status(), ExecutionEvent::Cancel)? as i32;
            e.finished_at_ms = now_ms;
        } else {
            e.status = execution_transition(e.status(), ExecutionEvent::Release)? as i32;
            e.attempts_released += 1;
            self.enqueue_ready(tx, e, now_ms)?;
        }
        e.lease_expires_at_ms = 0;
        assert!(matches!(e.status(), ExecutionStatus::Ready | ExecutionStatus::Cancelled));
        Ok(())
    }

    /// Extends many attempts' leases, in as few transactions as their budget allows (one for
    /// most batches); each gets its own result.
    pub async fn heartbeat(&self, beats: Vec<Beat>) -> Result<Vec<Result<HeartbeatOutcome>>> {
        check_batch("heartbeats", beats.len(), HEARTBEAT_BATCH_MAX)?;
        let now_ms = self.clock.now().as_millis();
        let mut out = Vec::with_capacity(beats.len());
        while out.len() < beats.len() {
            let rest = &beats[out.len()..];
            let part =
                self.db.run(|tx| async move { self.beats_in(&tx, rest, now_ms).await }).await?;
            assert!(!part.is_empty(), "a transaction takes at least one heartbeat");
            out.extend(part);
        }
        Ok(out)
    }

    /// Applies the first of `beats` that fit one transaction; a result for each, in order.
    async fn beats_in(
        &self,
        tx: &Transaction,
        beats: &[Beat],
        now_ms: i64,
    ) -> Result<Vec<Result<HeartbeatOutcome>>> {
        // A beat naming what cannot exist fails alone, not its batch.
        let checks: Vec<Result<()>> =
            beats.iter().map(|b| check_ref(&b.namespace, &b.execution_id)).collect();
        let loads = beats.iter().zip(&checks).map(|(b, c)| async move {
            match c {
                // A heartbeat needs the state only (its lease, token, worker).
                Ok(()) => load_state(tx, &self.ks, &b.namespace, &b.execution_id).await,
                Err(_) => Ok(None),
            }
        });
        let found = crate::ops::join::join_in_order(loads).await?;
        let mut out = Vec::with_capacity(beats.len());
        let mut wrote = 0;
        for ((b, e), c) in beats.iter().zip(found).zip(checks) {
            out.push(match (c, e) {
                (Err(invalid), _) => Err(invalid),
                (Ok(()), None) => {
                    Err(Error::NotFound { what: "execution", id: b.execution_id.clone() })
                }
                (Ok(()), Some(mut e)) => {
                    if !budget::has_room(tx, wrote, budget::execution_bytes(&e)) {
                        break; // the rest go in the next transaction
                    }
                    wrote += 1;
                    self.beat(tx, &mut e, b, now_ms)
                }
            });
        }
        Ok(out)
    }

    fn beat(
        &self,
        tx: &Transaction,
        e: &mut Execution,
        b: &Beat,
        now_ms: i64,
    ) -> Result<HeartbeatOutcome> {
        fence(e, b.token)?;
        bound(e, b.worker_id.as_ref(), b.queue.as_ref())?;
        let old_expiry = e.lease_expires_at_ms;
        e.lease_expires_at_ms = now_ms.saturating_add(e.lease_ms as i64);
        e.lease_expires_at_ms = attempt_deadline_ms(e).max(old_expiry);
        let assign = e.worker_id.is_empty() && b.worker_id.as_ref().is_some_and(|w| !w.is_empty());
        if assign {
            // The worker now running an attempt a dispatch buffer claimed unassigned.
            e.worker_id = b.worker_id.clone().unwrap_or_default();
        }
        // The attempt reached a worker: from now on a lost lease counts against the budget.
        let assign = assign || !e.worker_confirmed;
        e.worker_confirmed = true;
        if e.lease_expires_at_ms != old_expiry || assign {
            // Otherwise nothing to extend (a repeat within the same millisecond, or the attempt
            // timeout caps the lease): write nothing.
            e.updated_at_ms = now_ms;
            self.save_execution(tx, Some(e.status), e)?;
        }
        Ok(HeartbeatOutcome {
            lease_expires_at_ms: e.lease_expires_at_ms,
            cancel_requested: e.cancel_requested,
        })
    }

    /// Applies many attempts' results in as few transactions as their budget allows (one for
    /// most batches: reads issued concurrently, one commit for all); each gets its own result:
    /// a fenced-out one does not stop the others. An item the caller refused already (an
    /// `Err`) passes through as its error. An applied one returns the execution's state after
    /// it: its spec (definition, input, idempotency key, cron and trace ids, created at) is
    /// not read, so those fields are empty unless the record is of format 2; `get` reads all.
    pub async fn report(&self, items: Vec<Result<Report>>) -> Result<Vec<Result<Execution>>> {
        check_batch("results", items.len(), REPORT_BATCH_MAX)?;
        let checked: Vec<Result<Report>> =
            items.into_iter().map(|r| r.and_then(|r| check_report(&r).map(|()| r))).collect();
        let now_ms = self.clock.now().as_millis();
        let mut out: Vec<Result<Execution>> = Vec::with_capacity(checked.len());
        while out.len() < checked.len() {
            let rest = &checked[out.len()..];
            if rest.iter().all(Result::is_err) {
                // Nothing to write: no transaction.
                out.extend(rest.iter().map(|r| Err(r.clone().expect_err("all failed"))));
                break;
            }
            let part = self.reports_isolated(rest, now_ms).await?;
            assert!(!part.is_empty(), "a transaction takes at least one result");
            out.extend(part);
        }
        Ok(out)
    }

    /// Applies the first of `rest` that fit one transaction. When the store refuses that
    /// transaction for its size (one result it could not hold, whatever the checks let
    /// through), the first half is applied without the second, and so on down to the one
    /// result at fault: it alone fails, naming it, and the others go through.
    async fn reports_isolated(
        &self,
        rest: &[Result<Report>],
        now_ms: i64,
    ) -> Result<Vec<Result<Execution>>> {
        match self.db.run(|tx| async move { self.reports_in(&tx, rest, now_ms).await }).await {
            Err(Error::Kv(k)) if is_size_error(&k) => {
                if rest.len() == 1 {
                    let reason = format!("is too large to store: {k}");
                    return Ok(vec![Err(invalid("result", reason))]);
                }
                Box::pin(self.reports_isolated(&rest[..rest.len() / 2], now_ms)).await
            }
            r => r,
        }
    }

    /// Applies the first of `checked` that fit one transaction; a result for each, in order.
    async fn reports_in(
        &self,
        tx: &Transaction,
        checked: &[Result<Report>],
        now_ms: i64,
    ) -> Result<Vec<Result<Execution>>> {
        let loads = checked.iter().map(|r| async move {
            match r {
                // A result needs the state only (token, worker, retry policy).
                Ok(r) => load_state(tx, &self.ks, &r.namespace, &r.execution_id).await,
                Err(_) => Ok(None),
            }
        });
        let found = crate::ops::join::join_in_order(loads).await?;
        // Watermarks only for the shards whose executions get a new timer or go back on a
        // ready queue (failures), not for plain completions.
        let shards: BTreeSet<u32> = checked
            .iter()
            .zip(&found)
            .filter(|(r, _)| r.as_ref().is_ok_and(|r| matches!(r.outcome, Outcome::Failure(_))))
            .filter_map(|(_, e)| e.as_ref().map(|e| e.shard))
            .collect();
        let wms = self.watermarks(tx, shards).await?;
        let mut out = Vec::with_capacity(checked.len());
        let mut wrote = 0;
        for (r, e) in checked.iter().zip(found) {
            let (r, mut e) = match (r, e) {
                (Err(err), _) => {
                    out.push(Err(err.clone()));
                    continue;
                }
                (Ok(r), None) => {
                    let id = r.execution_id.clone();
                    out.push(Err(Error::NotFound { what: "execution", id }));
                    continue;
                }
                (Ok(r), Some(e)) => (r, e),
            };
            if !budget::has_room(tx, wrote, budget::execution_bytes(&e) + report_bytes(r)) {
                break; // the rest go in the next transaction
            }
            wrote += 1;
            let wm = wms.get(&e.shard).copied();
            out.push(match self.apply_report(tx, &mut e, r, now_ms, wm).await {
                Err(Error::Kv(k)) => return Err(Error::Kv(k)),
                Ok(()) => Ok(e),
                Err(err) => Err(err),
            });
        }
        Ok(out)
    }

    /// Whether `r` repeats a result that already committed (a retry after an unknown commit
    /// result, or the worker sending it twice): it then answers as the first did. A result
    /// with other content for an attempt that already ended is refused as such (`FencedOut`),
    /// never answered as if it had been applied.
    async fn already_applied(&self, tx: &Transaction, e: &Execution, r: &Report) -> Result<bool> {
        if e.fencing_token != r.token || e.status == ExecutionStatus::Running as i32 {
            return Ok(false);
        }
        let same = match &r.outcome {
            Outcome::Success { output_json, output_reference } => {
                e.status == ExecutionStatus::Succeeded as i32
                    && e.output_json == *output_json
                    && e.output_reference == *output_reference
            }
            outcome => {
                let ended = load_attempt(tx, self, &e.namespace, &e.id, e.attempt_count).await?;
                match (outcome, ended) {
                    (Outcome::Failure(error), Some(a)) => {
                        matches!(a.status(), AttemptStatus::Failed | AttemptStatus::Cancelled)
                            && a.error == Some(bounded(error.clone()))
                    }
                    (Outcome::Release, Some(a)) => {
                        matches!(a.status(), AttemptStatus::Abandoned | AttemptStatus::Failed)
                    }
                    _ => false,
                }
            }
        };
        if !same {
            return Err(fenced(
                e,
                format!(
                    "attempt {} already ended (execution is {}) with another result; this one \
                     was not applied",
                    e.attempt_count,
                    crate::state::status_name(e.status)
                ),
            ));
        }
        bound(e, r.worker_id.as_ref(), r.queue.as_ref())?;
        Ok(true)
    }

    async fn apply_report(
        &self,
        tx: &Transaction,
        e: &mut Execution,
        r: &Report,
        now_ms: i64,
        wm: Option<i64>,
    ) -> Result<()> {
        if self.already_applied(tx, e, r).await? {
            return Ok(());
        }
        fence(e, r.token)?;
        bound(e, r.worker_id.as_ref(), r.queue.as_ref())?;
        let before = e.status;
        if let Some(w) = r.worker_id.as_ref().filter(|w| !w.is_empty())
            && e.worker_id.is_empty()
        {
            e.worker_id = w.clone(); // the worker that ran an unassigned attempt
        }
        match &r.outcome {
            Outcome::Success { output_json, output_reference } => {
                self.end_attempt(tx, e, AttemptEvent::Succeed, None, now_ms)?;
                e.status = execution_transition(e.status(), ExecutionEvent::Succeed)? as i32;
                e.output_json = output_json.clone();
                e.output_reference = output_reference.clone();
                e.error = None;
                e.finished_at_ms = now_ms;
                e.lease_expires_at_ms = 0;
                assert_eq!(e.status(), ExecutionStatus::Succeeded, "a success ends the execution");
            }
            Outcome::Failure(error) => {
                let wm = match wm {
                    Some(w) => w,
                    None => watermark(tx, &self.ks, e.shard).await?,
                };
                self.end_attempt_unsuccessfully(
                    tx,
                    e,
                    AttemptEvent::Fail,
                    error.clone(),
                    now_ms,
                    wm,
                )?;
            }
            Outcome::Release => self.worker_release(tx, e, now_ms, wm).await?,
        }
        e.updated_at_ms = now_ms;
        self.save_execution(tx, Some(before), e)?;
        debug_assert!(
            e.status != ExecutionStatus::Running as i32,
            "an ended attempt leaves RUNNING"
        );
        Ok(())
    }
}

impl Scheduler {
    /// A release by the worker: uncounted for the first [`RELEASES_UNCOUNTED_MAX`], then
    /// counted as an attempt (a retryable failure), so an execution cannot cycle READY →
    /// RUNNING → READY forever.
    async fn worker_release(
        &self,
        tx: &Transaction,
        e: &mut Execution,
        now_ms: i64,
        wm: Option<i64>,
    ) -> Result<()> {
        if e.attempts_released < RELEASES_UNCOUNTED_MAX || e.cancel_requested {
            return self.release_attempt(tx, e, now_ms);
        }
        let wm = match wm {
            Some(w) => w,
            None => watermark(tx, &self.ks, e.shard).await?,
        };
        let error = ExecutionError {
            message: format!(
                "released by its worker more than {RELEASES_UNCOUNTED_MAX} times: this release \
                 counts as an attempt"
            ),
            retryable: true,
            code: "released".into(),
        };
        self.end_attempt_unsuccessfully(tx, e, AttemptEvent::Fail, error, now_ms, wm)
    }
}

/// Whether the store refused a transaction for its size or one of its keys' or values'.
fn is_size_error(e: &crate::kv::Error) -> bool {
    use crate::kv::Error as E;
    matches!(e, E::TransactionTooLarge { .. } | E::KeyTooLarge { .. } | E::ValueTooLarge { .. })
}
