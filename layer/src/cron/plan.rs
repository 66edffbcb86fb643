//! The pure core of a cron round: given a schedule's state, the states of the executions it
//! materialized and not yet saw finish, and the time, decide which occurrences to materialize,
//! which executions to cancel, what is skipped or missed, and when to look again. No I/O: the
//! cron shard owner persists the decision, then performs it.
//!
//! An occurrence `o` is **due** at `o + jitter`. It is considered from `due - lookahead` on
//! (materialized ahead, so precision comes from the core scheduler). It is **missed** when it
//! is reached only after `due + CRON_MISSED_AFTER_MS`; missed occurrences older than the
//! catch-up window are dropped, the others follow the missed-run policy. The overlap policy
//! applies while an earlier materialized execution is unfinished; such an occurrence is decided
//! only once due (before that the earlier one may still finish), so it is not materialized
//! ahead.

use super::policy::{MissedPolicy, OverlapPolicy, Policies};
use crate::limits::{
    CRON_CHECK_INTERVAL_MAX_MS, CRON_CHECK_INTERVAL_MIN_MS, CRON_MATERIALIZE_PER_ROUND_MAX,
    CRON_MISSED_AFTER_MS, CRON_OUTSTANDING_MAX, CRON_QUEUE_MAX, CRON_SCAN_PER_ROUND_MAX,
};

/// Where a waiting occurrence came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The regular timeline (buffered behind an unfinished execution).
    Schedule,
    /// A backfill request.
    Backfill,
}

/// An occurrence waiting to be materialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    /// The occurrence.
    pub occurrence_ms: i64,
    /// The overlap policy it is admitted under.
    pub overlap: OverlapPolicy,
    /// Where it came from.
    pub source: Source,
}

/// What is known of an execution the schedule materialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecState {
    /// Not finished (scheduled, ready, running or waiting to retry).
    Unfinished,
    /// Finished successfully, or cancelled, or gone.
    Done,
    /// Ended FAILED.
    Failed,
}

/// An execution the schedule materialized and has not seen finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outstanding {
    /// Its occurrence.
    pub occurrence_ms: i64,
    /// The execution.
    pub execution_id: String,
    /// When it was materialized (how long the schedule has been waiting on it).
    pub since_ms: i64,
}

/// Everything one round decides on.
#[derive(Debug, Clone)]
pub struct Round {
    /// Now.
    pub now_ms: i64,
    /// How early an occurrence is materialized.
    pub lookahead_ms: i64,
    /// The schedule's policies.
    pub policies: Policies,
    /// The schedule's jitter offset (see [`super::policy::jitter_offset_ms`]).
    pub jitter_offset_ms: i64,
    /// The next occurrence of the timeline not yet handled.
    pub next_ms: Option<i64>,
    /// No occurrence after this.
    pub end_ms: Option<i64>,
    /// Occurrences of the timeline still to run (`None` = unlimited).
    pub remaining_runs: Option<u32>,
    /// Waiting occurrences, oldest first.
    pub queue: Vec<Queued>,
    /// Unfinished executions as last recorded, with what is known of them now.
    pub outstanding: Vec<(Outstanding, ExecState)>,
}

/// What happened to a missed occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MissedOutcome {
    /// Made up (materialized late), subject to the overlap policy.
    CaughtUp,
    /// Not made up (policy `skip`, or not the latest under `latest`).
    Skipped,
    /// Older than the catch-up window.
    Expired,
}

impl MissedOutcome {
    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            MissedOutcome::CaughtUp => "caught_up",
            MissedOutcome::Skipped => "skipped",
            MissedOutcome::Expired => "expired",
        }
    }
}

/// An occurrence to materialize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Materialize {
    /// The occurrence (its idempotency key).
    pub occurrence_ms: i64,
    /// When its execution is due (`occurrence + jitter`; in the past for late ones).
    pub due_ms: i64,
}

/// The decision of a round.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// Occurrences to materialize, in order.
    pub materialize: Vec<Materialize>,
    /// Executions to cancel first (overlap `cancel-previous`).
    pub cancel: Vec<String>,
    /// The next occurrence of the timeline not yet handled (`None`: the timeline ended).
    pub next_ms: Option<i64>,
    /// Occurrences still waiting.
    pub queue: Vec<Queued>,
    /// Unfinished executions still to follow (those materialized now are added once known).
    pub outstanding: Vec<Outstanding>,
    /// Runs left afterwards.
    pub remaining_runs: Option<u32>,
    /// Occurrences skipped because the previous execution was unfinished.
    pub skipped_overlap: Vec<i64>,
    /// Missed occurrences handled, by outcome (expired ones only counted).
    pub missed: Vec<(i64, MissedOutcome)>,
    /// Missed occurrences dropped as older than the catch-up window.
    pub expired: u64,
    /// Pause the schedule, for this reason (pause-on-failure); nothing else is done.
    pub pause: Option<String>,
    /// The schedule has nothing more to do ever (timeline ended, queue empty).
    pub completed: bool,
    /// When to run the next round (`None`: only when something changes).
    pub wake_ms: Option<i64>,
}

/// How long to wait before looking at an unfinished execution again: a second at first, up to
/// a minute for one that has been running long.
pub fn check_interval_ms(now_ms: i64, since_ms: i64) -> i64 {
    ((now_ms - since_ms) / 10).clamp(CRON_CHECK_INTERVAL_MIN_MS, CRON_CHECK_INTERVAL_MAX_MS)
}

struct State<'a> {
    r: &'a Round,
    d: Decision,
    /// Unfinished executions, those materialized in this round included.
    active: usize,
}

impl State<'_> {
    fn budget_left(&self) -> bool {
        self.d.materialize.len() < CRON_MATERIALIZE_PER_ROUND_MAX
    }

    fn materialize(&mut self, occurrence_ms: i64, due_ms: i64) {
        self.d.materialize.push(Materialize { occurrence_ms, due_ms });
        self.active += 1;
    }

    /// Cancels every unfinished execution: those of earlier rounds by id; those decided in
    /// this round are not materialized at all (superseded).
    fn cancel_active(&mut self) {
        self.d.cancel.extend(self.d.outstanding.iter().map(|o| o.execution_id.clone()));
        self.d.outstanding.clear();
        for m in std::mem::take(&mut self.d.materialize) {
            self.d.skipped_overlap.push(m.occurrence_ms);
            self.d.remaining_runs = self.d.remaining_runs.map(|n| n.saturating_add(1));
        }
        self.active = 0;
    }

    fn buffered(&self, source: Source) -> usize {
        self.d.queue.iter().filter(|q| q.source == source).count()
    }
}

/// What happens to an occurrence of the timeline that is due (or past due).
enum Admit {
    /// Materialized or buffered: it counts as a run.
    Taken,
    /// Skipped for overlap.
    Skipped,
    /// Undecided until `due`: an earlier execution may still finish.
    Defer,
}

fn admit(s: &mut State<'_>, o: i64, due: i64) -> Admit {
    let overlap = s.r.policies.overlap;
    if s.active > 0 && overlap != OverlapPolicy::Allow && due > s.r.now_ms {
        return Admit::Defer;
    }
    match overlap {
        _ if s.active == 0 => {
            s.materialize(o, due);
            Admit::Taken
        }
        OverlapPolicy::Allow => {
            s.materialize(o, due);
            Admit::Taken
        }
        OverlapPolicy::Skip => Admit::Skipped,
        OverlapPolicy::BufferOne | OverlapPolicy::BufferAll => {
            let room = if overlap == OverlapPolicy::BufferOne { 1 } else { CRON_QUEUE_MAX };
            if s.buffered(Source::Schedule) < room && s.d.queue.len() < CRON_QUEUE_MAX {
                s.d.queue.push(Queued { occurrence_ms: o, overlap, source: Source::Schedule });
                Admit::Taken
            } else {
                Admit::Skipped
            }
        }
        OverlapPolicy::CancelPrevious => {
            s.cancel_active();
            s.materialize(o, due);
            Admit::Taken
        }
    }
}

/// Materializes waiting occurrences whose turn has come.
fn drain_queue(s: &mut State<'_>) {
    let mut waiting = std::mem::take(&mut s.d.queue).into_iter().peekable();
    while let Some(q) = waiting.next() {
        if !s.budget_left() {
            s.d.queue.push(q);
            continue;
        }
        let due = q.occurrence_ms + s.r.jitter_offset_ms;
        match q.overlap {
            _ if !s.d.queue.is_empty() => s.d.queue.push(q), // keep the order
            OverlapPolicy::Allow => s.materialize(q.occurrence_ms, due),
            OverlapPolicy::Skip if s.active > 0 => s.d.skipped_overlap.push(q.occurrence_ms),
            OverlapPolicy::Skip => s.materialize(q.occurrence_ms, due),
            OverlapPolicy::BufferOne | OverlapPolicy::BufferAll if s.active > 0 => {
                s.d.queue.push(q)
            }
            OverlapPolicy::BufferOne | OverlapPolicy::BufferAll => {
                s.materialize(q.occurrence_ms, due)
            }
            OverlapPolicy::CancelPrevious => {
                // Only the last of a run of cancel-previous occurrences survives.
                if waiting.peek().is_some_and(|n| n.overlap == OverlapPolicy::CancelPrevious) {
                    s.d.skipped_overlap.push(q.occurrence_ms);
                } else {
                    s.cancel_active();
                    s.materialize(q.occurrence_ms, due);
                }
            }
        }
    }
}

/// Decides one round. `next_after(t)` is the schedule's first occurrence after `t`.
pub fn plan(r: &Round, next_after: impl Fn(i64) -> Option<i64>) -> Decision {
    let mut d = Decision {
        next_ms: r.next_ms,
        remaining_runs: r.remaining_runs,
        queue: r.queue.clone(),
        ..Decision::default()
    };
    // Only unfinished executions are followed further (a failure is acted on now).
    d.outstanding = r
        .outstanding
        .iter()
        .filter(|(_, st)| *st == ExecState::Unfinished)
        .map(|(o, _)| o.clone())
        .collect();
    if r.policies.pause_on_failure
        && let Some((o, _)) = r.outstanding.iter().find(|(_, st)| *st == ExecState::Failed)
    {
        d.pause = Some(format!(
            "the execution {} of the occurrence {} ended FAILED (pause-on-failure)",
            o.execution_id,
            super::zone::utc_rfc3339(o.occurrence_ms)
        ));
        return d;
    }
    let active = d.outstanding.len();
    let mut s = State { r, d, active };
    drain_queue(&mut s);
    let walked = walk(&mut s, &next_after);
    finish(s, walked)
}

/// How far a round's walk over the occurrences got.
struct Walked {
    /// Occurrences looked at.
    scanned: usize,
    /// The due time of an occurrence deferred for the overlap policy.
    deferred_until: Option<i64>,
}

/// Walks the schedule's occurrences from the next one while they are due within the
/// lookahead and the round's budgets last: each expired, skipped as missed, caught up, or
/// admitted under the overlap policy.
fn walk(s: &mut State<'_>, next_after: &impl Fn(i64) -> Option<i64>) -> Walked {
    let (r, p, now) = (s.r, &s.r.policies, s.r.now_ms);
    let (jitter, lookahead) = (r.jitter_offset_ms, r.lookahead_ms);
    let mut w = Walked { scanned: 0, deferred_until: None };
    while let Some(o) = s.d.next_ms {
        if r.end_ms.is_some_and(|e| o > e) || s.d.remaining_runs == Some(0) {
            s.d.next_ms = None;
            break;
        }
        let due = o + jitter;
        if due - lookahead > now || !s.budget_left() || w.scanned >= CRON_SCAN_PER_ROUND_MAX {
            break;
        }
        w.scanned += 1;
        let missed = due + CRON_MISSED_AFTER_MS < now;
        if missed && due < now - p.catch_up_window_ms {
            s.d.expired += 1;
            s.d.next_ms = next_after(o);
            continue;
        }
        if missed {
            let latest = || next_after(o).is_none_or(|n| n + jitter + CRON_MISSED_AFTER_MS >= now);
            let run = match p.missed {
                MissedPolicy::Skip => false,
                MissedPolicy::Latest => latest(),
                MissedPolicy::All => true,
            };
            if !run {
                s.d.missed.push((o, MissedOutcome::Skipped));
                s.d.next_ms = next_after(o);
                continue;
            }
            s.d.missed.push((o, MissedOutcome::CaughtUp));
        }
        match admit(s, o, due) {
            Admit::Taken => s.d.remaining_runs = s.d.remaining_runs.map(|n| n.saturating_sub(1)),
            Admit::Skipped => s.d.skipped_overlap.push(o),
            Admit::Defer => {
                w.deferred_until = Some(due);
                break;
            }
        }
        s.d.next_ms = next_after(o);
    }
    w
}

/// The decision's bounds and its wake-up: at once if the round stopped at a budget, at a
/// deferred occurrence, at the next one's lookahead, or at the next look at an execution it
/// waits on — whichever comes first.
fn finish(s: State<'_>, w: Walked) -> Decision {
    let (r, now) = (s.r, s.r.now_ms);
    let State { mut d, active, .. } = s;
    if d.next_ms.is_some_and(|o| r.end_ms.is_some_and(|e| o > e)) || d.remaining_runs == Some(0) {
        d.next_ms = None;
    }
    // Keep the most recent unfinished executions within the bound.
    if d.outstanding.len() > CRON_OUTSTANDING_MAX {
        let excess = d.outstanding.len() - CRON_OUTSTANDING_MAX;
        d.outstanding.drain(..excess);
    }
    let more = d.materialize.len() >= CRON_MATERIALIZE_PER_ROUND_MAX
        || w.scanned >= CRON_SCAN_PER_ROUND_MAX;
    let waiting_on_execution = !d.queue.is_empty() || (r.policies.pause_on_failure && active > 0);
    let oldest = d.outstanding.iter().map(|o| o.since_ms).min().unwrap_or(now);
    let next_lookahead = d.next_ms.map(|o| (o + r.jitter_offset_ms - r.lookahead_ms).max(now));
    let candidates = [
        more.then_some(now),
        w.deferred_until,
        if w.deferred_until.is_none() { next_lookahead } else { None },
        waiting_on_execution.then(|| now + check_interval_ms(now, oldest)),
    ];
    d.wake_ms = candidates.into_iter().flatten().min();
    d.completed = d.next_ms.is_none() && d.queue.is_empty();
    debug_assert!(d.outstanding.len() <= CRON_OUTSTANDING_MAX);
    d
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
