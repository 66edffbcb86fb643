//! Retention: exactly the terminal executions that finished before the cutoff are deleted,
//! with everything kept for them, while live executions (and a replayed one) stay untouched;
//! the store passes the integrity check afterwards. SUCCEEDED executions, which have no status
//! index entry, are found through the time index, and a later round does not read again the
//! rows an earlier one kept until one of them may be deleted.

mod common;

use common::*;
use kairos_layer::keys::Tag;
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::ops::check::check_records;
use kairos_layer::ops::retention::SweepCursor;
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

/// One round of sweeps of `NS` from `cursor` (left where the next round goes on), in batches
/// of `max`: (deleted, index rows read).
async fn round(w: &World, cutoff: i64, max: usize, cursor: &mut SweepCursor) -> (u64, u64) {
    let (mut deleted, mut scanned) = (0, 0);
    for _ in 0..100 {
        let s = w.sched.sweep_terminal_from(NS, cutoff, max, cursor).await.unwrap();
        assert!(s.scanned <= max as u64, "a transaction reads at most its batch: {s:?}");
        (deleted, scanned) = (deleted + s.deleted, scanned + s.scanned);
        *cursor = s.cursor;
        if !s.more {
            return (deleted, scanned);
        }
    }
    panic!("the round never ended");
}

/// The statuses of the status index entries.
async fn indexed_statuses(w: &World) -> Vec<i32> {
    let r = w.ks.subspace_range(Tag::ByStatus);
    let dump = w.dump().await;
    dump.range(r.begin..r.end).map(|(k, _)| w.ks.parse_by_status(k).unwrap().1).collect()
}

/// Seven executions due at T0: four succeed and one fails at once; one finishes eight days
/// later (recently, at a 7-day retention) and one is still RUNNING then. The sweep deletes the
/// five through the time index (no SUCCEEDED execution has a status index entry) and keeps the
/// other two; the next rounds read nothing again until the horizon passes the earliest time
/// one of those could be deleted, and then delete both.
#[tokio::test]
async fn succeeded_executions_go_through_the_time_index_and_kept_rows_are_not_read_again() {
    let w = world(13, FaultConfig::none()).await;
    let mut ids = Vec::new();
    for i in 0..7 {
        ids.push(w.sched.submit(request(Some(&format!("s{i}")), T0)).await.unwrap().execution.id);
    }
    w.fire_all().await;
    let claimed = w.sched.claim_for(NS, "report", "w", 7, None).await.unwrap();
    assert_eq!(claimed.len(), 7);
    let token = |i: usize| (&claimed[i].execution.id, claimed[i].attempt.fencing_token);
    for i in 0..4 {
        let (id, t) = token(i);
        w.sched.complete(NS, id, t, Vec::new(), String::new()).await.unwrap();
    }
    w.sched.fail(NS, token(4).0, token(4).1, boom()).await.unwrap();
    w.advance_ms(8 * 86_400_000);
    let (recent, running) = (token(5), token(6));
    w.sched.complete(NS, recent.0, recent.1, Vec::new(), String::new()).await.unwrap();
    let failed = ExecutionStatus::Failed as i32;
    assert_eq!(indexed_statuses(&w).await, vec![failed], "only the FAILED one is indexed");

    let mut cursor = SweepCursor::default();
    let cutoff = w.now_ms() - 7 * 86_400_000;
    assert_eq!(round(&w, cutoff, 2, &mut cursor).await, (5, 7), "the four, the FAILED one");
    for c in &claimed[..5] {
        assert!(
            w.sched.get(NS, &c.execution.id).await.is_err(),
            "{} should be gone",
            c.execution.id
        );
    }
    assert_eq!(w.sched.get(NS, recent.0).await.unwrap().status(), ExecutionStatus::Succeeded);
    assert_eq!(w.sched.get(NS, running.0).await.unwrap().status(), ExecutionStatus::Running);
    assert!(indexed_statuses(&w).await.is_empty());
    assert!(cursor.resumes_walk(), "the next round goes on where this one stopped");

    // The next rounds read none of the two kept rows again, even once the RUNNING one ends.
    w.advance_ms(60_000);
    assert_eq!(round(&w, cutoff + 60_000, 2, &mut cursor).await, (0, 0));
    w.sched.complete(NS, running.0, running.1, Vec::new(), String::new()).await.unwrap();
    w.advance_ms(60_000);
    assert_eq!(round(&w, cutoff + 120_000, 2, &mut cursor).await, (0, 0));

    // Once the horizon passes their ends, the walk starts over and both go.
    w.advance_ms(8 * 86_400_000);
    let cutoff = w.now_ms() - 7 * 86_400_000;
    assert_eq!(round(&w, cutoff, 2, &mut cursor).await, (2, 2));
    for id in &ids {
        assert!(w.sched.get(NS, id).await.is_err(), "{id} should be gone");
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
