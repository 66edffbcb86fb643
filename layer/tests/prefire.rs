//! Pre-fires (`ops::prefire`): executions falling due within the next milliseconds started for
//! waiting workers before their `execute_at` — exactly as their fire would have started them
//! then, and nothing else touched.

mod common;

use common::*;
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::ops::Error;
use kairos_layer::ops::claim::ClaimSlot;
use kairos_layer::ops::fire::Offer;
use kairos_proto::storage::v1::{ExecutionStatus, TimerKind};

fn offer(worker: &str, max: usize) -> Offer {
    let slot = ClaimSlot { worker_id: worker.into(), max, lease_ms: None };
    Offer::from([((NS.to_string(), "report".to_string()), vec![slot])])
}

/// Pre-fires every shard once, each with `max` slots of worker `w1`; the ids started.
async fn prefire_all(w: &World, until: i64, max: usize) -> Vec<String> {
    let mut started = Vec::new();
    for shard in 0..SHARDS {
        let out = w
            .sched
            .prefire(shard, w.epochs[shard as usize], w.now_ms(), until, &offer("w1", max))
            .await
            .expect("prefire");
        assert!(out.matched.len() <= max, "at most the offer");
        assert_eq!(out.matched.len(), out.fired.len());
        assert!(!out.more && out.held == 0);
        started.extend(out.matched.into_iter().map(|m| m.claim.execution.id));
    }
    started
}

#[tokio::test]
async fn started_as_its_fire_would_at_its_due_time_and_nothing_else_touched() {
    let w = world(31, FaultConfig::none()).await;
    let due = T0 + 10;
    let mut soon = Vec::new();
    for _ in 0..12 {
        soon.push(w.sched.submit(request(None, due)).await.unwrap().execution.id);
    }
    let later = w.sched.submit(request(None, T0 + 500)).await.unwrap().execution.id;
    // One slot per shard: at most four start, the rest wait for their fire.
    let started = prefire_all(&w, T0 + 20, 1).await;
    assert!(!started.is_empty() && started.len() <= SHARDS as usize, "{started:?}");
    for id in &soon {
        let e = w.sched.get(NS, id).await.unwrap();
        if started.contains(id) {
            assert_eq!(e.status(), ExecutionStatus::Running);
            assert_eq!(e.worker_id, "w1");
            assert!(!e.worker_confirmed);
            assert_eq!(e.attempt_count, 1);
            assert_eq!(e.started_at_ms, due, "started at its due time, not before");
            assert_eq!(e.lease_expires_at_ms, due + 30_000, "its lease counts from then");
            assert_eq!(e.timer.as_ref().map(|t| t.kind), Some(TimerKind::LeaseChecks as i32));
        } else {
            assert_eq!(e.status(), ExecutionStatus::Scheduled, "no slot left: untouched");
            assert_eq!(e.timer.as_ref().map(|t| t.fire_at_ms), Some(due));
        }
    }
    let l = w.sched.get(NS, &later).await.unwrap();
    assert_eq!(l.status(), ExecutionStatus::Scheduled, "due after the window: untouched");
    w.check_invariants().await;

    // At the due time the fires take the rest, and leave the started ones alone.
    w.advance_ms(10);
    let fired = w.fire_all().await;
    assert_eq!(fired, soon.len() - started.len());
    for id in &soon {
        let e = w.sched.get(NS, id).await.unwrap();
        let want =
            if started.contains(id) { ExecutionStatus::Running } else { ExecutionStatus::Ready };
        assert_eq!(e.status(), want, "{id}");
    }
    w.check_invariants().await;
}

#[tokio::test]
async fn only_due_timers_of_scheduled_executions_are_started_and_the_epoch_fences_it() {
    let w = world(32, FaultConfig::none()).await;
    // A running execution: its lease check is not a pre-fire's business, however close.
    let a = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    w.fire_all().await;
    let slot = ClaimSlot { worker_id: "w0".into(), max: 1, lease_ms: Some(1_000) };
    let claimed = w.sched.claim(NS, "report", &[slot]).await.unwrap().per_slot.concat();
    assert_eq!(claimed.len(), 1);
    w.advance_ms(990); // its lease check falls due in 10 ms
    assert!(prefire_all(&w, w.now_ms() + 20, 5).await.is_empty());
    assert_eq!(w.sched.get(NS, &a).await.unwrap().status(), ExecutionStatus::Running);

    // A stale owner starts nothing.
    let b = w.sched.submit(request(None, w.now_ms() + 5)).await.unwrap().execution;
    let stale = w.epochs[b.shard as usize] + 1;
    let r = w.sched.prefire(b.shard, stale, w.now_ms(), w.now_ms() + 20, &offer("w1", 5)).await;
    assert!(matches!(r, Err(Error::OwnershipLost { .. })), "{r:?}");
    // An empty offer or window starts nothing, and does not even read.
    let empty = w.sched.prefire(b.shard, stale, w.now_ms(), w.now_ms() + 20, &Offer::new()).await;
    assert!(empty.unwrap().matched.is_empty());
    let now = w.now_ms();
    let shut =
        w.sched.prefire(b.shard, w.epochs[b.shard as usize], now, now, &offer("w1", 5)).await;
    assert!(shut.unwrap().matched.is_empty());
    // The right owner starts it.
    assert_eq!(prefire_all(&w, w.now_ms() + 20, 5).await, vec![b.id.clone()]);
    w.check_invariants().await;
}
