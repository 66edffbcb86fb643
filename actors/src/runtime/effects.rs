//! What follows a commit: the one place that turns a transaction's outcome into metrics,
//! hints to this node's actors (a new timer to its shard's owner, ready work to the
//! dispatcher, a changed job to its cron owner) and the dispatcher's messages (executions a
//! fire matched, executions that left flight). The node facade, the shard owners, the
//! execution timers and the dispatcher call these after their transactions; no other module
//! sends a hint.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use kairos_layer::env::Timestamp;
use kairos_layer::ops::claim::Claimed;
use kairos_layer::ops::fire::{FireOutcome, Fired, Match};
use kairos_layer::ops::submit::Submitted;
use kairos_layer::ops::worker::{HeartbeatOutcome, Outcome, Report};
use kairos_layer::ops::{self, Error, timer_of};
use kairos_layer::state::is_terminal;
use kairos_proto::storage::v1::{CronJob, Execution, ExecutionStatus, TimerKind};

use super::context::{Ctx, send_after};
use super::matchmaker::Reserved;
use super::messages::{DispatcherMsg, QueueKey};

/// Executions a submit created: counted, and their timers hinted to local shard owners.
pub(crate) fn submitted<'a>(ctx: &Ctx, results: impl IntoIterator<Item = &'a Submitted>) {
    for s in results.into_iter().filter(|s| s.created) {
        ctx.metrics.submitted.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = timer_of(&s.execution) {
            ctx.routes.timer_hint(t);
        }
    }
}

/// A submit started due-now executions for this node's waiting workers (sync match at submit,
/// `Scheduler::submit_batch_offered`): they go to the dispatcher for their workers, the rest
/// of the offer back to the ledger (all of it when the submit failed).
pub(crate) fn submit_matched(
    ctx: &Ctx,
    matched: Option<&[Match]>,
    offer: BTreeMap<QueueKey, Reserved>,
) {
    let Some(matched) = matched else {
        for (q, r) in offer {
            ctx.matchmaker.give_back(&q, r.grants);
        }
        return;
    };
    ctx.metrics.matched_at_submit.fetch_add(matched.len() as u64, Ordering::Relaxed);
    deliver_matched(ctx, "submit", matched, offer, false);
}

/// The metric outcome of each report, by what the worker said (read before the reports go).
pub(crate) fn report_kinds(items: &[ops::Result<Report>]) -> Vec<&'static str> {
    items
        .iter()
        .map(|r| match r.as_ref().map(|r| &r.outcome) {
            Ok(Outcome::Success { .. }) => "succeeded",
            Ok(Outcome::Failure(_)) => "failed",
            Ok(Outcome::Release) => "released",
            Err(_) => "refused",
        })
        .collect()
}

/// Workers' results were applied: outcomes counted, new timers and ready work hinted, and
/// executions leaving flight on a queue with a concurrency limit told to the dispatcher.
pub(crate) fn reported(ctx: &Ctx, kinds: &[&'static str], out: &[ops::Result<Execution>]) {
    let m = &ctx.metrics;
    let mut finished: BTreeMap<QueueKey, usize> = BTreeMap::new();
    for (r, kind) in out.iter().zip(kinds) {
        match r {
            Err(Error::FencedOut { .. }) => m.attempt("fenced_out"),
            Err(_) => {}
            Ok(e) => {
                let cancelled = e.status() == ExecutionStatus::Cancelled;
                m.attempt(if cancelled { "cancelled" } else { kind });
                if e.status() == ExecutionStatus::RetryWait {
                    m.retries.fetch_add(1, Ordering::Relaxed);
                }
                left_flight(ctx, e, &mut finished);
            }
        }
    }
    let done = out.iter().filter(|r| r.as_ref().is_ok_and(|e| is_terminal(e.status()))).count();
    m.last_hour.completed(ctx.now_ms(), done as u64);
    tell_finished(ctx, finished);
}

/// An execution's attempt ended (a result or a release): its ready work and next timer are
/// hinted, and it is counted as leaving flight if its queue is limited.
fn left_flight(ctx: &Ctx, e: &Execution, finished: &mut BTreeMap<QueueKey, usize>) {
    if e.status() == ExecutionStatus::Ready {
        ctx.routes.ready_hint(&e.namespace, &e.queue);
    }
    if let Some(t) = timer_of(e) {
        ctx.routes.timer_hint(t);
    }
    let q = (e.namespace.clone(), e.queue.clone());
    if ctx.matchmaker.is_limited(&q) {
        *finished.entry(q).or_default() += 1;
    }
}

fn tell_finished(ctx: &Ctx, finished: BTreeMap<QueueKey, usize>) {
    if finished.is_empty() {
        return;
    }
    if let Some(d) = ctx.routes.dispatcher() {
        for (q, n) in finished {
            let _ = d.send_message(DispatcherMsg::Finished(q, n));
        }
    }
}

/// Heartbeats were applied: fenced-out ones counted.
pub(crate) fn heartbeats(ctx: &Ctx, out: &[ops::Result<HeartbeatOutcome>]) {
    for r in out {
        if matches!(r, Err(Error::FencedOut { .. })) {
            ctx.metrics.attempt("fenced_out");
        }
    }
}

/// A failed execution was replayed: READY again.
pub(crate) fn replayed(ctx: &Ctx, e: &Execution) {
    ctx.routes.ready_hint(&e.namespace, &e.queue);
}

/// A restarted node released what its previous run claimed and never handed over: counted as
/// released orphans, their queues hinted as holding ready work.
pub(crate) fn orphans_released(ctx: &Ctx, released: &[Execution]) {
    ctx.metrics.orphans_released.fetch_add(released.len() as u64, Ordering::Relaxed);
    let queues: std::collections::BTreeSet<(&str, &str)> =
        released.iter().map(|e| (e.namespace.as_str(), e.queue.as_str())).collect();
    for (ns, queue) in queues {
        ctx.routes.ready_hint(ns, queue);
    }
}

/// A client changed a cron job: its local cron owner (if any) looks at it now.
pub(crate) fn cron_changed(ctx: &Ctx, job: &CronJob) {
    ctx.routes.cron_hint(job.shard, &job.namespace, &job.id);
}

/// Releases claimed executions nobody will run (READY again at once, the attempt not counted),
/// in a spawned transaction; what was released is hinted as ready work.
pub(crate) fn release(ctx: &Ctx, claimed: Vec<Claimed>) {
    if claimed.is_empty() {
        return;
    }
    ctx.metrics.orphans_released.fetch_add(claimed.len() as u64, Ordering::Relaxed);
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let reports: Vec<ops::Result<Report>> = claimed
            .iter()
            .map(|c| {
                Ok(Report {
                    namespace: c.execution.namespace.clone(),
                    execution_id: c.execution.id.clone(),
                    token: c.attempt.fencing_token,
                    outcome: Outcome::Release,
                    worker_id: None,
                    queue: None,
                })
            })
            .collect();
        match ctx.batcher.report(reports).await {
            Ok(results) => {
                let mut finished = BTreeMap::new();
                for e in results.iter().flatten() {
                    left_flight(&ctx, e, &mut finished);
                }
                tell_finished(&ctx, finished);
            }
            // Not released: their leases run out and the lease check releases or retries them.
            Err(e) => tracing::warn!(error = %e, "releasing undelivered executions failed"),
        }
    });
}

/// Claimed executions reached their workers: counted (with their start lateness), and their
/// lease checks hinted to local shard owners.
pub(crate) fn delivered(ctx: &Ctx, claimed: &[Claimed]) {
    let m = &ctx.metrics;
    m.claimed.fetch_add(claimed.len() as u64, Ordering::Relaxed);
    let now = ctx.now_ms();
    for c in claimed {
        if c.attempt.number == 1 {
            let late = u64::try_from(now - c.execution.execute_at_ms).unwrap_or(0);
            m.lateness_start.observe(Duration::from_millis(late));
            m.last_hour.started(now, late);
        }
        if let Some(t) = timer_of(&c.execution) {
            ctx.routes.timer_hint(t);
        }
    }
}

/// A shard owner's `fire_due` returned (or failed): the offer's unused grants go back at once,
/// the executions it matched go to the dispatcher for their workers, every queue that got
/// ready work is hinted once, and what fired is counted.
pub(crate) fn fired(
    ctx: &Ctx,
    shard: u32,
    out: &ops::Result<FireOutcome>,
    offer: BTreeMap<QueueKey, Reserved>,
) {
    settle(ctx, shard, out, offer, false);
}

/// What a pre-fire did (`ops::prefire`): as [`fired`], but the executions it started reach the
/// dispatcher — and their workers — at their start time (their `execute_at`), not before.
pub(crate) fn prefired(
    ctx: &Ctx,
    shard: u32,
    out: &ops::Result<FireOutcome>,
    offer: BTreeMap<QueueKey, Reserved>,
) {
    settle(ctx, shard, out, offer, true);
}

fn settle(
    ctx: &Ctx,
    shard: u32,
    out: &ops::Result<FireOutcome>,
    offer: BTreeMap<QueueKey, Reserved>,
    ahead: bool,
) {
    let Ok(out) = out else {
        for (q, r) in offer {
            ctx.matchmaker.give_back(&q, r.grants);
        }
        return;
    };
    if ahead {
        // Started, not yet due: no lateness to count.
        ctx.metrics.timers_fired.fetch_add(out.fired.len() as u64, Ordering::Relaxed);
        ctx.metrics.prefired.fetch_add(out.matched.len() as u64, Ordering::Relaxed);
    } else {
        let now = ctx.now_ms();
        for f in &out.fired {
            count_fired(ctx, f, now);
        }
        ctx.metrics.quarantined.fetch_add(out.quarantined as u64, Ordering::Relaxed);
    }
    if !out.matched.is_empty() {
        ctx.metrics.matched_at_fire.fetch_add(out.matched.len() as u64, Ordering::Relaxed);
    }
    deliver_matched(ctx, &format!("fire of shard {shard}"), &out.matched, offer, ahead);
    hint_ready(ctx, &out.fired);
}

/// Room appeared for held executions (a worker's credits, a drained dispatch buffer, or what a
/// fire left unused): the first shard owner waiting for room is told.
pub(crate) fn room(ctx: &Ctx) {
    while let Some(shard) = ctx.held.next() {
        if ctx.routes.room(shard) {
            return;
        }
    }
}

/// Settles a fire's offer: per queue, what it matched goes to the dispatcher (which marks the
/// grants used as it delivers) — at each execution's start time when `at_start` (a pre-fire's,
/// started ahead) — the rest of the offer goes back to the ledger now.
fn deliver_matched(
    ctx: &Ctx,
    origin: &str,
    matched: &[Match],
    offer: BTreeMap<QueueKey, Reserved>,
    at_start: bool,
) {
    let mut to_deliver = Vec::with_capacity(matched.len());
    for (q, r) in offer {
        let mut used = vec![0; r.slots.len()];
        for m in matched.iter().filter(|m| queue_of(&m.claim) == q) {
            used[m.slot] += 1;
            to_deliver.push((m.claim.clone(), r.ids[m.slot]));
        }
        let (_, unused) = r.split(&used);
        ctx.matchmaker.give_back(&q, unused);
    }
    debug_assert_eq!(to_deliver.len(), matched.len(), "every match is for an offered slot");
    if to_deliver.is_empty() {
        return;
    }
    let Some(d) = ctx.routes.dispatcher() else {
        // No dispatcher (draining): the leases run out and the retry policy applies.
        tracing::warn!(origin, "matched executions with no dispatcher to deliver them");
        return;
    };
    if !at_start {
        let _ = d.send_message(DispatcherMsg::Matched(to_deliver));
        return;
    }
    let mut by_start: BTreeMap<i64, Vec<_>> = BTreeMap::new();
    for m in to_deliver {
        by_start.entry(m.0.execution.started_at_ms).or_default().push(m);
    }
    // Waits measured from the clock's nanoseconds: the start time is a whole millisecond.
    let now = ctx.clock.now();
    for (at, matched) in by_start {
        let wait = Timestamp::from_millis(at).since(now);
        ctx.fire_gate.delivering_at(at);
        if wait.is_zero() {
            let _ = d.send_message(DispatcherMsg::Matched(matched));
        } else {
            send_after(&ctx.clock, wait, d.clone(), DispatcherMsg::Matched(matched));
        }
    }
}

/// One timer processed by an execution timer's `fire_timer`.
pub(crate) fn timer_fired(ctx: &Ctx, f: &Fired) {
    count_fired(ctx, f, ctx.now_ms());
    hint_ready(ctx, [f]);
}

/// Records metrics for a processed timer.
fn count_fired(ctx: &Ctx, f: &Fired, now_ms: i64) {
    let m = &ctx.metrics;
    m.timers_fired.fetch_add(1, Ordering::Relaxed);
    if f.kind == TimerKind::Due {
        let late = u64::try_from(now_ms - f.execute_at_ms).unwrap_or(0);
        m.lateness_ready.observe(Duration::from_millis(late));
    }
    if f.kind == TimerKind::LeaseCheck && f.status != ExecutionStatus::Running {
        m.lease_expiries.fetch_add(1, Ordering::Relaxed);
        m.attempt("timed_out");
    }
    if f.status == ExecutionStatus::RetryWait {
        m.retries.fetch_add(1, Ordering::Relaxed);
    }
}

/// Tells the dispatcher about every queue that got ready work, once each.
fn hint_ready<'a>(ctx: &Ctx, fired: impl IntoIterator<Item = &'a Fired>) {
    let queues: BTreeSet<(&str, &str)> = fired
        .into_iter()
        .filter(|f| f.status == ExecutionStatus::Ready)
        .map(|f| (f.namespace.as_str(), f.queue.as_str()))
        .collect();
    for (ns, queue) in queues {
        ctx.routes.ready_hint(ns, queue);
    }
}

/// The queue of a claimed execution.
pub(crate) fn queue_of(c: &Claimed) -> QueueKey {
    (c.execution.namespace.clone(), c.execution.queue.clone())
}
