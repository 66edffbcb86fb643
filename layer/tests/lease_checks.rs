//! Shared lease checks (keyspace format 4, `ops::lease_checks`): the attempts one claim starts in
//! a shard share one LEASE_CHECKS timer. When it fires, a finished member is passed (its result
//! wrote no timer), a renewed one gets a lease check of its own at its renewed deadline, a lost
//! one times out into its retry; a restarted one (a new attempt, a new group) is checked by its
//! new group only. The shared keys are gone once fired, and the invariants hold throughout.

mod common;

use common::*;
use kairos_layer::keys::Tag;
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::ops::claim::Claimed;
use kairos_proto::storage::v1::{ExecutionStatus, TimerKind};

/// The shared lease check timers in the store.
async fn shared_timers(w: &World) -> usize {
    let ks = kairos_layer::keys::Keyspace::new("test");
    let range = ks.subspace_range(Tag::Timer);
    let dump = w.dump().await;
    dump.range(range.begin.clone()..range.end.clone())
        .filter(|(k, _)| ks.parse_timer(k).unwrap().kind == TimerKind::LeaseChecks as i32)
        .count()
}

#[tokio::test]
async fn a_shared_lease_check_passes_finished_members_follows_renewed_ones_and_times_out_lost_ones()
{
    let w = world(34, FaultConfig::none()).await;
    let mut ids = Vec::new();
    for _ in 0..24 {
        ids.push(w.sched.submit(request(None, T0)).await.unwrap().execution.id);
    }
    assert_eq!(w.fire_all().await, 24);
    let claimed = w.sched.claim_for(NS, "report", "w", 24, Some(5_000)).await.unwrap();
    assert_eq!(claimed.len(), 24);
    let groups = shared_timers(&w).await;
    assert!((1..=SHARDS as usize).contains(&groups), "one per shard at most: {groups}");
    for c in &claimed {
        let t = c.execution.timer.as_ref().unwrap();
        assert_eq!(t.kind(), TimerKind::LeaseChecks);
        assert!(!t.group.is_empty());
    }
    w.check_invariants().await;

    // A third finishes, a third keeps heartbeating, a third is lost.
    let (done, rest) = claimed.split_at(8);
    let (beating, lost) = rest.split_at(8);
    for c in done {
        let e = &c.execution;
        w.sched.complete(NS, &e.id, e.fencing_token, Vec::new(), String::new()).await.unwrap();
    }
    assert_eq!(shared_timers(&w).await, groups, "a result writes no timer, clears none");
    w.check_invariants().await;
    w.advance_ms(4_000);
    for c in beating {
        w.sched.heartbeat_one(NS, &c.execution.id, c.execution.fencing_token).await.unwrap();
    }
    w.advance_ms(1_001); // past the first deadline (5 s), before the renewed one (9 s)
    w.fire_all().await;
    assert_eq!(shared_timers(&w).await, 0, "fired and cleared");
    w.check_invariants().await;
    for c in done {
        let e = w.sched.get(NS, &c.execution.id).await.unwrap();
        assert_eq!(e.status(), ExecutionStatus::Succeeded, "passed");
    }
    for c in beating {
        let e = w.sched.get(NS, &c.execution.id).await.unwrap();
        assert_eq!(e.status(), ExecutionStatus::Running, "renewed");
        assert_eq!(e.fencing_token, c.execution.fencing_token);
        let t = e.timer.unwrap();
        assert_eq!((t.kind(), t.fire_at_ms), (TimerKind::LeaseCheck, e.lease_expires_at_ms));
    }
    for c in lost {
        let e = w.sched.get(NS, &c.execution.id).await.unwrap();
        // Never heard from: released uncounted (READY again), as a lost first lease is.
        assert!(
            matches!(e.status(), ExecutionStatus::Ready | ExecutionStatus::RetryWait),
            "{:?}",
            e.status()
        );
        assert_ne!(e.timer.as_ref().map(|t| t.kind()), Some(TimerKind::LeaseChecks));
    }

    restart_and_finish(&w, &ids, beating, lost).await;
}

/// The lost ones start again: a new attempt, a new shared check, which alone applies; then
/// everything finishes.
async fn restart_and_finish(w: &World, ids: &[String], beating: &[Claimed], lost: &[Claimed]) {
    w.fire_all().await;
    let again = w.sched.claim_for(NS, "report", "w2", 8, Some(5_000)).await.unwrap();
    assert_eq!(again.len(), 8);
    for c in &again {
        let before = lost.iter().find(|l| l.execution.id == c.execution.id).unwrap();
        assert_ne!(c.execution.fencing_token, before.execution.fencing_token);
        let (old, new) = (before.execution.timer.as_ref(), c.execution.timer.as_ref());
        assert_ne!(old.unwrap().group, new.unwrap().group);
    }
    w.check_invariants().await;
    for c in beating.iter().chain(&again) {
        let e = &c.execution;
        w.sched.complete(NS, &e.id, e.fencing_token, Vec::new(), String::new()).await.unwrap();
    }
    w.advance_ms(10_000);
    w.fire_all().await;
    assert_eq!(shared_timers(w).await, 0);
    w.check_invariants().await;
    for id in ids {
        let e = w.sched.get(NS, id).await.unwrap();
        assert_eq!(e.status(), ExecutionStatus::Succeeded, "{id}");
    }
}
