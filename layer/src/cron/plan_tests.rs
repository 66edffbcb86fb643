//! The round's decisions with simulated time: a schedule every minute, no I/O.

use super::*;

const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;
/// Some minute boundary.
const T0: i64 = 1_790_000_000_000 / MIN * MIN;

fn every_minute(t: i64) -> Option<i64> {
    Some((t.div_euclid(MIN) + 1) * MIN)
}

fn round(now: i64, next: i64) -> Round {
    Round {
        now_ms: now,
        lookahead_ms: 5_000,
        policies: Policies::default(),
        jitter_offset_ms: 0,
        next_ms: Some(next),
        end_ms: None,
        remaining_runs: None,
        queue: Vec::new(),
        outstanding: Vec::new(),
    }
}

fn running(o: i64) -> (Outstanding, ExecState) {
    (
        Outstanding { occurrence_ms: o, execution_id: format!("E{o}"), since_ms: o },
        ExecState::Unfinished,
    )
}

fn occurrences(d: &Decision) -> Vec<i64> {
    d.materialize.iter().map(|m| m.occurrence_ms).collect()
}

#[test]
fn an_occurrence_is_materialized_ahead_by_the_lookahead() {
    let d = plan(&round(T0 - 6_000, T0), every_minute);
    assert!(d.materialize.is_empty(), "not yet: 6 s before, lookahead 5 s");
    assert_eq!(d.wake_ms, Some(T0 - 5_000));
    let d = plan(&round(T0 - 5_000, T0), every_minute);
    assert_eq!(d.materialize, [Materialize { occurrence_ms: T0, due_ms: T0 }]);
    assert_eq!(d.next_ms, Some(T0 + MIN));
    assert_eq!(d.wake_ms, Some(T0 + MIN - 5_000));
    assert!(d.missed.is_empty() && !d.completed);
}

#[test]
fn jitter_moves_the_due_time_not_the_occurrence() {
    let mut r = round(T0 + 7_000 - 5_000, T0);
    r.jitter_offset_ms = 7_000;
    let d = plan(&r, every_minute);
    assert_eq!(d.materialize, [Materialize { occurrence_ms: T0, due_ms: T0 + 7_000 }]);
}

/// A 3-hour outage: the schedule's next occurrence is 3 hours old.
fn after_outage(missed: MissedPolicy) -> Decision {
    let mut r = round(T0 + 3 * HOUR, T0);
    r.policies.missed = missed;
    r.policies.catch_up_window_ms = HOUR;
    r.policies.overlap = OverlapPolicy::Allow;
    plan(&r, every_minute)
}

#[test]
fn catch_up_after_a_three_hour_outage_under_each_missed_policy() {
    let now = T0 + 3 * HOUR;
    let skip = after_outage(MissedPolicy::Skip);
    assert_eq!(occurrences(&skip), [now], "only the one on time");
    assert_eq!(skip.expired, 120, "older than the 1 h window");
    assert_eq!(skip.missed.len(), 60);
    assert!(skip.missed.iter().all(|(_, o)| *o == MissedOutcome::Skipped));
    // The occurrence at `now` itself is on time.
    let latest = after_outage(MissedPolicy::Latest);
    assert_eq!(occurrences(&latest), [now - MIN, now]);
    assert_eq!(latest.missed.iter().filter(|(_, o)| *o == MissedOutcome::CaughtUp).count(), 1);
    assert!(latest.materialize[0].due_ms < now, "late: due in the past, runs at once");
    let all = after_outage(MissedPolicy::All);
    assert_eq!(all.materialize.len(), 61, "each within the window, and now's");
    assert_eq!(all.materialize[0].occurrence_ms, now - HOUR);
    assert_eq!(all.expired, 120);
    for d in [skip, latest, all] {
        assert_eq!(d.next_ms, Some(now + MIN));
    }
}

#[test]
fn catch_up_all_with_overlap_skip_runs_the_first_only() {
    let mut r = round(T0 + 10 * MIN + 30_000, T0);
    r.policies.missed = MissedPolicy::All;
    let d = plan(&r, every_minute);
    assert_eq!(occurrences(&d), [T0]);
    assert_eq!(d.skipped_overlap.len(), 10);
}

#[test]
fn every_overlap_policy_while_the_previous_execution_runs() {
    let prev = T0 - MIN;
    let at = |overlap: OverlapPolicy, now: i64| {
        let mut r = round(now, T0);
        r.policies.overlap = overlap;
        r.outstanding = vec![running(prev)];
        plan(&r, every_minute)
    };
    // Before it is due nothing is decided: the previous one may still finish.
    for (p, _) in OverlapPolicy::ALL {
        let d = at(p, T0 - 3_000);
        if p == OverlapPolicy::Allow {
            assert_eq!(occurrences(&d), [T0], "allow: ahead as usual");
        } else {
            assert!(d.materialize.is_empty(), "{p:?}");
            assert_eq!(d.wake_ms, Some(T0), "{p:?}: decided when due");
            assert_eq!(d.next_ms, Some(T0));
        }
    }
    let d = at(OverlapPolicy::Skip, T0);
    assert!(d.materialize.is_empty());
    assert_eq!(d.skipped_overlap, [T0]);
    assert_eq!(d.next_ms, Some(T0 + MIN));
    let d = at(OverlapPolicy::Allow, T0);
    assert_eq!(occurrences(&d), [T0]);
    let d = at(OverlapPolicy::CancelPrevious, T0);
    assert_eq!(d.cancel, [format!("E{prev}")]);
    assert_eq!(occurrences(&d), [T0]);
    assert!(d.outstanding.is_empty());
    // Three occurrences come while it runs.
    let buffered = |p| {
        let mut r = round(T0 + 2 * MIN, T0);
        r.policies.overlap = p;
        r.policies.missed = MissedPolicy::All;
        r.outstanding = vec![running(prev)];
        plan(&r, every_minute)
    };
    let one = buffered(OverlapPolicy::BufferOne);
    assert!(one.materialize.is_empty());
    assert_eq!(one.queue.iter().map(|q| q.occurrence_ms).collect::<Vec<_>>(), [T0]);
    assert_eq!(one.skipped_overlap, [T0 + MIN, T0 + 2 * MIN]);
    assert!(one.wake_ms.unwrap() <= T0 + 2 * MIN + 60_000, "looks at the execution again");
    let all = buffered(OverlapPolicy::BufferAll);
    assert_eq!(all.queue.len(), 3);
    // The previous one finished: the buffered ones run one at a time.
    let mut r = round(T0 + 2 * MIN + 10_000, T0 + 3 * MIN);
    r.policies.overlap = OverlapPolicy::BufferAll;
    r.queue = all.queue.clone();
    r.outstanding = vec![(
        Outstanding { occurrence_ms: prev, execution_id: "E".into(), since_ms: prev },
        ExecState::Done,
    )];
    let d = plan(&r, every_minute);
    assert_eq!(occurrences(&d), [T0]);
    assert_eq!(d.queue.len(), 2);
}

#[test]
fn pause_on_failure_pauses_and_does_nothing_else() {
    let mut r = round(T0, T0);
    r.policies.pause_on_failure = true;
    r.outstanding = vec![(
        Outstanding { occurrence_ms: T0 - MIN, execution_id: "E1".into(), since_ms: T0 - MIN },
        ExecState::Failed,
    )];
    let d = plan(&r, every_minute);
    assert!(d.pause.as_deref().unwrap().contains("E1"));
    assert!(d.materialize.is_empty());
    assert_eq!(d.next_ms, Some(T0), "the timeline is where it was");
    // Without the policy a failure is just a finished execution.
    r.policies.pause_on_failure = false;
    assert_eq!(occurrences(&plan(&r, every_minute)), [T0]);
    // With it, an unfinished execution is looked at again before the next occurrence.
    let mut r = round(T0 + 1_000, T0 + MIN);
    r.policies.pause_on_failure = true;
    r.outstanding = vec![running(T0)];
    assert_eq!(plan(&r, every_minute).wake_ms, Some(T0 + 2_000));
}

#[test]
fn runs_and_end_complete_the_schedule() {
    let mut r = round(T0 + 2 * MIN, T0);
    r.policies.overlap = OverlapPolicy::Allow;
    r.policies.missed = MissedPolicy::All;
    r.remaining_runs = Some(2);
    let d = plan(&r, every_minute);
    assert_eq!(occurrences(&d), [T0, T0 + MIN]);
    assert_eq!(d.remaining_runs, Some(0));
    assert!(d.completed && d.next_ms.is_none() && d.wake_ms.is_none());
    let mut r = round(T0, T0);
    r.end_ms = Some(T0 + MIN);
    let d = plan(&r, every_minute);
    assert_eq!(occurrences(&d), [T0]);
    assert!(!d.completed);
    let mut r = round(T0 + MIN, T0 + MIN);
    r.end_ms = Some(T0 + MIN);
    let d = plan(&r, every_minute);
    assert_eq!(occurrences(&d), [T0 + MIN]);
    assert!(d.completed, "nothing after the end");
}

#[test]
fn backfill_follows_the_overlap_policy_of_its_request() {
    let queue = |p| -> Vec<Queued> {
        (1..=3)
            .map(|i| Queued {
                occurrence_ms: T0 - 10 * HOUR + i * HOUR,
                overlap: p,
                source: Source::Backfill,
            })
            .collect()
    };
    let mut r = round(T0 - 30_000, T0);
    r.queue = queue(OverlapPolicy::Allow);
    assert_eq!(plan(&r, every_minute).materialize.len(), 3);
    r.queue = queue(OverlapPolicy::BufferAll);
    let d = plan(&r, every_minute);
    assert_eq!(d.materialize.len(), 1, "one at a time");
    assert_eq!(d.queue.len(), 2);
    r.queue = queue(OverlapPolicy::CancelPrevious);
    let d = plan(&r, every_minute);
    assert_eq!(occurrences(&d), [T0 - 7 * HOUR], "only the last");
    assert_eq!(d.skipped_overlap.len(), 2);
    r.queue = queue(OverlapPolicy::Skip);
    r.outstanding = vec![running(T0 - MIN)];
    let d = plan(&r, every_minute);
    assert!(d.materialize.is_empty());
    assert_eq!(d.skipped_overlap.len(), 3);
}

#[test]
fn a_long_catch_up_continues_in_the_next_round() {
    let mut r = round(T0 + 5 * HOUR, T0);
    r.policies.overlap = OverlapPolicy::Allow;
    r.policies.missed = MissedPolicy::All;
    r.policies.catch_up_window_ms = 6 * HOUR;
    let d = plan(&r, every_minute);
    assert_eq!(d.materialize.len(), CRON_MATERIALIZE_PER_ROUND_MAX);
    assert_eq!(d.wake_ms, Some(T0 + 5 * HOUR), "at once");
    assert_eq!(d.next_ms, Some(T0 + CRON_MATERIALIZE_PER_ROUND_MAX as i64 * MIN));
}
