//! The dispatcher's decisions, asserted on the actions its core returns (no runtime, no store).

use std::time::Duration;

use kairos_layer::ops::Error;
use kairos_layer::ops::claim::{ClaimOutcome, Claimed};
use kairos_proto::storage::v1::{Attempt, Execution, ExecutionStatus};

use super::state::{Action, Core, Event, POLL_LINGER, Timer, Waiting, claim_retry_pause};
use crate::runtime::matchmaker::Matchmaker;
use crate::runtime::messages::{Grant, QueueKey};

const NOW: i64 = 1_000_000;

fn q() -> QueueKey {
    ("ns".into(), "q".into())
}

fn waiting(id: u64, credits: usize) -> Waiting {
    Waiting { id, queue: q(), worker_id: format!("w{id}"), lease_ms: None, credits }
}

/// A claimed execution of `q()` with `left_ms` of its 30 s lease left at [`NOW`].
fn claimed(id: &str, left_ms: i64) -> Claimed {
    let execution = Execution {
        id: id.into(),
        namespace: "ns".into(),
        queue: "q".into(),
        status: ExecutionStatus::Running as i32,
        lease_ms: 30_000,
        lease_expires_at_ms: NOW + left_ms,
        ..Execution::default()
    };
    Claimed { execution, attempt: Attempt::default() }
}

struct Harness {
    core: Core,
    ledger: Matchmaker,
}

impl Harness {
    fn new() -> Self {
        Harness { core: Core::new(30_000), ledger: Matchmaker::default() }
    }

    fn apply(&mut self, e: Event) -> Vec<Action> {
        self.core.apply(&self.ledger, NOW, e)
    }

    fn poll(&mut self, credits: usize) -> (u64, Vec<Action>) {
        let id = self.core.new_id();
        (id, self.apply(Event::Poll(waiting(id, credits), 5_000)))
    }

    fn open(&mut self, credits: usize) -> (u64, Vec<Action>) {
        let id = self.core.new_id();
        (id, self.apply(Event::Open(waiting(id, credits))))
    }
}

fn claims(actions: &[Action]) -> Vec<(Vec<Grant>, Vec<usize>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Claim(_, g, s) => Some((g.clone(), s.iter().map(|s| s.max).collect())),
            _ => None,
        })
        .collect()
}

fn answers(actions: &[Action]) -> Vec<(u64, Vec<String>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Answer(id, c) => {
                Some((*id, c.iter().map(|c| c.execution.id.clone()).collect()))
            }
            _ => None,
        })
        .collect()
}

fn outcome(per_slot: Vec<Vec<Claimed>>, more: bool) -> Result<ClaimOutcome, Error> {
    Ok(ClaimOutcome { per_slot, more })
}

#[test]
fn a_first_poll_claims_at_once_and_plans_its_expiry() {
    let mut h = Harness::new();
    let (id, a) = h.poll(3);
    assert!(a.iter().any(|a| matches!(a, Action::Later(d, Timer::Expire(i))
        if *i == id && *d == Duration::from_millis(5_000))));
    let c = claims(&a);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].1, vec![3], "one claim slot with the poll's credits");
    // A second poll while the claim runs: no second claim for the queue.
    let (_, a) = h.poll(1);
    assert!(claims(&a).is_empty(), "{a:?}");
}

#[test]
fn a_claim_fills_the_poll_which_lingers_then_answers() {
    let mut h = Harness::new();
    let (id, a) = h.poll(2);
    let (grants, _) = claims(&a).remove(0);
    let a = h.apply(Event::Claimed(q(), grants, outcome(vec![vec![claimed("e1", 30_000)]], false)));
    assert!(
        a.iter().any(|a| matches!(a, Action::Later(d, Timer::Flush(i))
        if *i == id && *d == POLL_LINGER)),
        "{a:?}"
    );
    assert!(answers(&a).is_empty(), "one of two: it lingers");
    assert!(a.iter().any(|a| matches!(a, Action::Watch(_))), "ran dry: watch the queue");
    let a = h.apply(Event::Flush(id));
    assert_eq!(answers(&a), vec![(id, vec!["e1".to_string()])]);
    assert_eq!(h.ledger.available(&q()), 0, "an answered poll leaves the ledger");
}

#[test]
fn a_full_poll_answers_at_once() {
    let mut h = Harness::new();
    let (id, a) = h.poll(1);
    let (grants, _) = claims(&a).remove(0);
    let a = h.apply(Event::Claimed(q(), grants, outcome(vec![vec![claimed("e1", 30_000)]], true)));
    assert_eq!(answers(&a), vec![(id, vec!["e1".to_string()])]);
}

#[test]
fn an_expired_poll_answers_empty_and_a_drained_dispatcher_takes_no_polls() {
    let mut h = Harness::new();
    let (id, _) = h.poll(1);
    assert_eq!(answers(&h.apply(Event::Expire(id))), vec![(id, vec![])]);
    let (_, a) = h.poll(1);
    let a2 = h.apply(Event::Drain);
    assert_eq!(answers(&a2).len(), 1, "draining answers the waiting poll");
    assert!(claims(&a).len() <= 1);
    let (id, a) = h.poll(1);
    assert_eq!(answers(&a), vec![(id, vec![])], "no work while draining");
    let (sid, a) = h.open(2);
    assert!(a.iter().any(|a| matches!(a, Action::EndStream(i) if *i == sid)));
}

#[test]
fn a_stream_queue_is_served_through_a_buffer_claimed_ahead_unassigned() {
    let mut h = Harness::new();
    let (sid, a) = h.open(4);
    let refill: Vec<_> = a
        .iter()
        .filter_map(|a| match a {
            Action::Refill(_, slots) => Some(slots.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(refill.len(), 1, "{a:?}");
    assert_eq!(refill[0][0].worker_id, "", "unassigned");
    let ahead = 4 * crate::limits::DISPATCH_BUFFER_PER_SLOT;
    assert_eq!(refill[0].iter().map(|s| s.max).sum::<usize>(), ahead, "per slot of the stream");
    let got = vec![vec![claimed("e1", 30_000), claimed("e2", 30_000)]];
    let a = h.apply(Event::Buffered(q(), outcome(got, false)));
    let sent: Vec<_> = a
        .iter()
        .filter_map(|a| match a {
            Action::Send(id, c) => Some((*id, c.len())),
            _ => None,
        })
        .collect();
    assert_eq!(sent, vec![(sid, 2)], "the stream's credits take the buffer at once");
}

#[test]
fn orphans_go_to_another_waiting_worker_or_are_released_when_stale() {
    let mut h = Harness::new();
    let (id, a) = h.poll(1);
    let (grants, _) = claims(&a).remove(0);
    // The claim found nothing; the poll still waits.
    h.apply(Event::Claimed(q(), grants, outcome(vec![vec![]], false)));
    let a = h.apply(Event::Orphans(vec![claimed("fresh", 30_000)]));
    assert_eq!(answers(&a), vec![(id, vec!["fresh".to_string()])]);
    let a = h.apply(Event::Orphans(vec![claimed("stale", 1_000)]));
    assert!(
        a.iter().any(|a| matches!(a, Action::Release(c) if c[0].execution.id == "stale")),
        "{a:?}"
    );
}

#[test]
fn what_a_gone_stream_could_not_take_is_rerouted_and_the_stream_forgotten() {
    let mut h = Harness::new();
    let (dead, _) = h.open(1);
    let a = h.apply(Event::Undelivered(dead, vec![claimed("e1", 30_000)]));
    assert!(a.iter().any(|a| matches!(a, Action::EndStream(i) if *i == dead)));
    assert_eq!(h.ledger.credits(&q(), dead), 0, "out of the ledger");
    assert!(a.iter().any(|a| matches!(a, Action::Release(_))), "no other worker: released, {a:?}");
}

#[test]
fn a_failed_claim_gives_its_grants_back_and_retries_with_a_doubling_pause() {
    let mut h = Harness::new();
    let (_, a) = h.poll(2);
    let (grants, _) = claims(&a).remove(0);
    assert_eq!(h.ledger.available(&q()), 0);
    let err = || Err(Error::FailedPrecondition("store down".into()));
    let a = h.apply(Event::Claimed(q(), grants.clone(), err()));
    assert_eq!(h.ledger.available(&q()), 2, "grants given back");
    assert!(a.iter().any(|a| matches!(a, Action::ClaimFailed(_, 1, _))));
    assert!(a.iter().any(|a| matches!(a, Action::Later(d, Timer::Retry(_))
        if *d == claim_retry_pause(1))));
    let a = h.apply(Event::Ready(q()));
    let (grants, _) = claims(&a).remove(0);
    let a = h.apply(Event::Claimed(q(), grants, err()));
    assert!(a.iter().any(|a| matches!(a, Action::Later(d, Timer::Retry(_))
        if *d == Duration::from_millis(200))));
}

#[test]
fn fire_matches_are_marked_used_and_delivered_to_their_workers() {
    let mut h = Harness::new();
    let (id, a) = h.poll(2);
    let (grants, _) = claims(&a).remove(0);
    h.apply(Event::Claimed(q(), grants, outcome(vec![vec![]], false)));
    // A fire reserved one of the poll's credits and started e1 for it.
    let offer = h.ledger.offer(1);
    let grant = offer[&q()].grants[0].clone();
    assert_eq!(h.ledger.pending(&q(), id), 1);
    let a = h.apply(Event::Matched(vec![(claimed("e1", 30_000), grant.slot)]));
    assert_eq!(h.ledger.pending(&q(), id), 0, "used");
    assert!(a.iter().any(|a| matches!(a, Action::Later(_, Timer::Flush(i)) if *i == id)));
    assert_eq!(answers(&h.apply(Event::Flush(id))), vec![(id, vec!["e1".to_string()])]);
}

/// Past the node's watch bound (4,096 watches: 256 queues of 16 ready partitions) a queue whose
/// workers wait is not watched but claimed from every 500 ms; once a watched queue lets go of
/// its watch, the next such claim that runs dry takes a watch again.
#[test]
fn queues_past_the_watch_bound_are_claimed_periodically() {
    let mut h = Harness::new();
    let watched = |a: &[Action]| a.iter().filter(|a| matches!(a, Action::Watch(_))).count();
    let reclaims = |a: &[Action]| {
        a.iter()
            .filter(|a| matches!(a, Action::Later(d, Timer::Reclaim(_)) if d.as_millis() == 500))
            .count()
    };
    let (mut watches, mut periodic, mut first) = (0, 0, None);
    for i in 0..300 {
        let queue: QueueKey = ("ns".into(), format!("q{i}"));
        let id = h.core.new_id();
        first = first.or(Some(id));
        let w =
            Waiting { id, queue: queue.clone(), worker_id: "w".into(), lease_ms: None, credits: 1 };
        let (grants, _) = claims(&h.apply(Event::Poll(w, 30_000))).remove(0);
        let a = h.apply(Event::Claimed(queue, grants, outcome(vec![vec![]], false)));
        (watches, periodic) = (watches + watched(&a), periodic + reclaims(&a));
    }
    assert_eq!(watches, 256, "as many queues watched as 4,096 watches allow");
    assert_eq!(periodic, 44, "the other queues claimed from periodically");
    // The periodic claim of an unwatched queue claims (and plans the next when it runs dry).
    let q299: QueueKey = ("ns".into(), "q299".into());
    let a = h.apply(Event::Reclaim(q299.clone()));
    let (grants, _) = claims(&a).remove(0);
    let a = h.apply(Event::Claimed(q299.clone(), grants.clone(), outcome(vec![vec![]], false)));
    assert_eq!((watched(&a), reclaims(&a)), (0, 1), "{a:?}");
    // A watch let go of (its queue's poll answered) makes room: the next periodic claim that
    // runs dry watches instead.
    h.apply(Event::Expire(first.unwrap()));
    h.apply(Event::WatchEnded(("ns".into(), "q0".into())));
    let a = h.apply(Event::Reclaim(q299.clone()));
    let (grants, _) = claims(&a).remove(0);
    let a = h.apply(Event::Claimed(q299, grants, outcome(vec![vec![]], false)));
    assert_eq!((watched(&a), reclaims(&a)), (1, 0), "{a:?}");
}
