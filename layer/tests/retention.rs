//! Retention: exactly the terminal executions that finished before the cutoff are deleted,
//! with everything kept for them, while live executions (and a replayed one) stay untouched;
//! the store passes the integrity check afterwards.

mod common;

use common::*;
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::ops::check::check_records;
use kairos_proto::storage::v1::{ExecutionError, ExecutionStatus};

fn boom() -> ExecutionError {
    ExecutionError { message: "boom".into(), retryable: false, code: String::new() }
}

#[tokio::test]
async fn retention_removes_exactly_what_is_past_its_time() {
    let w = world(11, FaultConfig::none()).await;
    let (ids, live, failed) = finished_and_live(&w).await;
    // Eight days later one FAILED execution is replayed: READY again, not terminal.
    w.advance_ms(8 * 86_400_000);
    w.sched.replay(NS, &failed[0], "test").await.unwrap();
    // A cutoff before they finished deletes nothing.
    let s = w.sched.sweep_terminal(NS, T0 - 1, 500).await.unwrap();
    assert_eq!(s.deleted, 0);
    // Sweep 7 days back, in batches of 7.
    let cutoff = w.now_ms() - 7 * 86_400_000;
    let mut deleted = 0;
    loop {
        let s = w.sched.sweep_terminal(NS, cutoff, 7).await.unwrap();
        deleted += s.deleted;
        assert!(s.deleted <= 7);
        if !s.more {
            break;
        }
    }
    assert_eq!(deleted, 29, "every terminal execution but the replayed one");
    for id in &ids {
        let r = w.sched.get(NS, id).await;
        if id == &failed[0] {
            assert_eq!(r.unwrap().status(), ExecutionStatus::Ready);
        } else {
            assert!(matches!(r, Err(kairos_layer::ops::Error::NotFound { .. })), "{id}: {r:?}");
        }
    }
    for id in &live {
        assert_eq!(w.sched.get(NS, id).await.unwrap().status(), ExecutionStatus::Scheduled);
    }
    // The keys went with their executions: the same key now makes a new execution.
    let again = w.sched.submit(request(Some("k0"), w.now_ms() + 60_000)).await.unwrap();
    assert!(again.created);
    // Counters, indexes and references all agree.
    let report = check_records(w.sched.database(), w.sched.keyspace(), |_| {}).await.unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
    let counts = w.sched.status_counts(NS).await.unwrap();
    let total: i64 = counts.iter().map(|(_, n)| n).sum();
    assert_eq!(total, 5 + 1 + 1, "5 live, the replayed one, the new one: {counts:?}");
    assert_eq!(w.sched.namespaces().await.unwrap(), vec![NS.to_string()]);
    w.check_invariants().await;
}

/// A sweep running while new executions are submitted, fired, claimed and finished (with
/// injected conflicts): exactly the old terminal executions go; nothing live or recent does.
#[tokio::test]
async fn a_sweep_under_load_removes_only_what_is_past_its_time() {
    let w = world(12, FaultConfig { spurious_conflict: Some(0.1), ..FaultConfig::none() }).await;
    // 120 executions that finished at T0.
    let mut old = Vec::new();
    for i in 0..120 {
        old.push(w.sched.submit(request(Some(&format!("old{i}")), T0)).await.unwrap().execution.id);
    }
    w.fire_all().await;
    for c in w.sched.claim_for(NS, "report", "w", 120, None).await.unwrap() {
        let t = c.attempt.fencing_token;
        w.sched.complete(NS, &c.execution.id, t, Vec::new(), String::new()).await.unwrap();
    }
    w.advance_ms(8 * 86_400_000);
    let cutoff = w.now_ms() - 7 * 86_400_000;
    let now = w.now_ms();
    // The load: 200 new executions, half of them run to the end, while the sweep goes on.
    let load = async {
        let mut new = Vec::new();
        for i in 0..200 {
            let at = if i % 2 == 0 { now } else { now + 86_400_000 };
            new.push(
                w.sched.submit(request(Some(&format!("new{i}")), at)).await.unwrap().execution.id,
            );
            if i % 20 == 19 {
                w.fire_all().await;
                for c in w.sched.claim_for(NS, "report", "w", 10, None).await.unwrap() {
                    let t = c.attempt.fencing_token;
                    w.sched
                        .complete(NS, &c.execution.id, t, Vec::new(), String::new())
                        .await
                        .unwrap();
                }
            }
            tokio::task::yield_now().await;
        }
        new
    };
    let sweep = async {
        let mut deleted = 0;
        loop {
            let s = w.sched.sweep_terminal(NS, cutoff, 9).await.unwrap();
            deleted += s.deleted;
            tokio::task::yield_now().await;
            if !s.more && deleted >= 120 {
                break;
            }
        }
        deleted
    };
    let (new, deleted) = tokio::join!(load, sweep);
    assert_eq!(deleted, 120, "exactly the old terminal executions");
    for id in &old {
        assert!(w.sched.get(NS, id).await.is_err(), "{id} should be gone");
    }
    for id in &new {
        w.sched.get(NS, id).await.unwrap_or_else(|e| panic!("{id} was deleted: {e}"));
    }
    let report = check_records(w.sched.database(), w.sched.keyspace(), |_| {}).await.unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
    w.check_invariants().await;
}

/// 30 executions due now: 10 succeed, 10 fail, 10 are cancelled; 5 more stay scheduled far
/// ahead; all with idempotency keys. Returns (the 30, the 5, the failed ones).
async fn finished_and_live(w: &World) -> (Vec<String>, Vec<String>, Vec<String>) {
    let mut ids = Vec::new();
    for i in 0..30 {
        let key = format!("k{i}");
        ids.push(w.sched.submit(request(Some(&key), T0)).await.unwrap().execution.id);
    }
    let mut live = Vec::new();
    for i in 0..5 {
        let key = format!("live{i}");
        live.push(
            w.sched.submit(request(Some(&key), T0 + 30 * 86_400_000)).await.unwrap().execution.id,
        );
    }
    w.fire_all().await;
    for id in &ids[20..] {
        w.sched.cancel(NS, id, "test").await.unwrap();
    }
    let claimed = w.sched.claim_for(NS, "report", "w", 20, None).await.unwrap();
    assert_eq!(claimed.len(), 20);
    for (i, c) in claimed.iter().enumerate() {
        let id = &c.execution.id;
        if i % 2 == 0 {
            w.sched
                .complete(NS, id, c.attempt.fencing_token, Vec::new(), String::new())
                .await
                .unwrap();
        } else {
            w.sched.fail(NS, id, c.attempt.fencing_token, boom()).await.unwrap();
        }
    }
    let failed: Vec<String> = claimed
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, c)| c.execution.id.clone())
        .collect();
    (ids, live, failed)
}
