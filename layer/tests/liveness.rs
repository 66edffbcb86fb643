//! Liveness: nothing waits forever and nothing piles up. Ready work made after an empty claim is
//! seen when the watch is set; a retention sweep passes rows it may not delete yet and reaches
//! the rest; an execution cancelled before its time is kept from its end, not its due time;
//! claim receipts are cleared by fires too, and `kairos check` finds any left behind; releases
//! count as attempts after ten; attempts are read in pages.

mod common;

use std::time::Duration;

use common::*;
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::ops::check::check_records;
use kairos_layer::ops::claim::ClaimSlot;
use kairos_layer::ops::fire::Offer;
use kairos_layer::ops::retention::SweepCursor;

const DAY_MS: u64 = 86_400_000;

/// Work made ready between an empty claim and the watch being set is claimed at once (the
/// watch is set where the queue is read); once the queue is empty, new work fires the watch.
#[tokio::test]
async fn work_made_ready_after_an_empty_claim_is_not_missed() {
    let w = world(31, FaultConfig::none()).await;
    assert!(w.sched.claim_for(NS, "report", "w", 10, None).await.unwrap().is_empty());
    // Meanwhile another node makes work ready.
    w.sched.submit(request(Some("a"), T0)).await.unwrap();
    w.fire_all().await;
    let set = w.sched.watch_ready(NS, "report").await.unwrap();
    assert!(set.is_none(), "ready work found where the watch is set: claim now");
    assert_eq!(w.sched.claim_for(NS, "report", "w", 10, None).await.unwrap().len(), 1);
    let watches = w.sched.watch_ready(NS, "report").await.unwrap().expect("empty: watches");
    w.sched.submit(request(Some("b"), T0)).await.unwrap();
    w.fire_all().await;
    let fired = futures_util::future::select_all(watches);
    let fired = tokio::time::timeout(Duration::from_secs(5), fired).await;
    assert!(fired.expect("a watch fires for new ready work").0.is_ok());
}

/// Sweeps the namespace from the start to the end of its index, in batches of `max`; how many
/// were deleted (bounded: a sweep that never reaches the end fails).
async fn sweep_through(w: &World, cutoff: i64, max: usize) -> u64 {
    let mut cursor = SweepCursor::default();
    let mut deleted = 0;
    for _ in 0..100 {
        let s = w.sched.sweep_terminal_from(NS, cutoff, max, &cursor).await.unwrap();
        deleted += s.deleted;
        if !s.more {
            return deleted;
        }
        cursor = s.cursor;
    }
    panic!("the sweep never reached the end of the index");
}

/// Twelve executions due at T0, cancelled eight days later (finished recently), head the index;
/// three due in 300 days were cancelled at T0 (finished long ago). Past a 7-day retention the
/// three go — the sweep passes the twelve it may not delete yet — and the twelve stay.
#[tokio::test]
async fn a_sweep_passes_what_it_may_not_delete_and_cancelled_executions_go_from_their_end() {
    let w = world(32, FaultConfig::none()).await;
    let mut early = Vec::new();
    for i in 0..3 {
        let at = T0 + 300 * DAY_MS as i64;
        let id = w.sched.submit(request(Some(&format!("f{i}")), at)).await.unwrap().execution.id;
        w.sched.cancel(NS, &id, "test").await.unwrap();
        early.push(id);
    }
    let mut head = Vec::new();
    for i in 0..12 {
        let at = T0 + 1_000;
        head.push(w.sched.submit(request(Some(&format!("h{i}")), at)).await.unwrap().execution.id);
    }
    w.advance_ms(8 * DAY_MS);
    for id in &head {
        w.sched.cancel(NS, id, "test").await.unwrap();
    }
    let cutoff = w.now_ms() - 7 * DAY_MS as i64;
    assert_eq!(sweep_through(&w, cutoff, 5).await, 3, "the three cancelled long ago");
    for id in &early {
        assert!(w.sched.get(NS, id).await.is_err(), "{id} should be gone");
    }
    for id in &head {
        w.sched.get(NS, id).await.unwrap_or_else(|e| panic!("{id} was deleted: {e}"));
    }
    w.check_invariants().await;
}

/// Receipts a fire leaves for the workers it matched are cleared by later fires (a node whose
/// fires always meet waiting workers never claims); one left behind is a `kairos check` finding.
#[tokio::test]
async fn fires_clear_expired_receipts_and_check_finds_stale_ones() {
    let w = world(33, FaultConfig::none()).await;
    let slot = ClaimSlot { worker_id: "w".into(), max: 10, lease_ms: None };
    let offer: Offer = [((NS.to_string(), "report".to_string()), vec![slot])].into();
    // Receipts older than a minute (the time they are kept).
    let old_receipts = || async {
        let r = w.ks.subspace_range(kairos_layer::keys::Tag::ClaimReceipt);
        let dump = w.dump().await;
        let at = dump.range(r.begin..r.end).map(|(k, _)| w.ks.parse_claim_receipt(k).unwrap().0);
        at.filter(|at| *at < w.now_ms() - 60_000).count()
    };
    for round in 0..3u64 {
        w.sched.submit(request(Some(&format!("r{round}")), w.now_ms())).await.unwrap();
        let mut matched = 0;
        for shard in 0..SHARDS {
            let epoch = w.epochs[shard as usize];
            let out = w.sched.fire_due(shard, epoch, w.now_ms(), 100, &offer).await.unwrap();
            matched += out.matched.len();
        }
        assert!(matched >= 1, "the fire hands the execution to the waiting worker");
        if round < 2 {
            w.advance_ms(3_600_000);
        }
    }
    assert_eq!(old_receipts().await, 0, "only the last fires' receipts are kept");
    let report = check_records(w.sched.database(), w.sched.keyspace(), |_| {}).await.unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
    // A receipt from a day before the newest, never cleared: a finding.
    let stale = w.ks.claim_receipt(w.now_ms() - DAY_MS as i64, 7, "");
    let empty: Vec<(String, String, u64, u32)> = Vec::new();
    let tx = w.db.begin().unwrap();
    tx.set(&stale, &kairos_layer::tuple::pack(&empty)).unwrap();
    tx.commit().await.unwrap();
    let report = check_records(w.sched.database(), w.sched.keyspace(), |_| {}).await.unwrap();
    assert!(
        report.findings.iter().any(|f| f.problem.contains("claim receipt")),
        "{:#?}",
        report.findings
    );
}

/// A worker that releases its task every time: ten releases are free, then each counts as an
/// attempt (a retryable failure), so the execution ends FAILED after its three attempts instead
/// of cycling READY → RUNNING → READY forever.
#[tokio::test]
async fn releases_past_ten_count_as_attempts() {
    use kairos_layer::ops::worker::Outcome;
    use kairos_proto::storage::v1::ExecutionStatus;
    let w = world(34, FaultConfig::none()).await;
    let id = w.sched.submit(request(Some("rel"), T0)).await.unwrap().execution.id;
    w.fire_all().await;
    let mut releases = 0;
    loop {
        w.advance_ms(20_000); // past any retry delay
        w.fire_all().await;
        let Some(c) = w.sched.claim_for(NS, "report", "w", 1, None).await.unwrap().pop() else {
            break;
        };
        let t = c.attempt.fencing_token;
        let e = w.sched.report_one(NS, &id, t, Outcome::Release).await.unwrap();
        releases += 1;
        let want = if releases <= 10 { ExecutionStatus::Ready } else { e.status() };
        assert_eq!(e.status(), want, "release {releases}");
        assert!(releases <= 13, "releases never counted");
    }
    let e = w.sched.get(NS, &id).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Failed, "three counted releases use up the attempts");
    assert_eq!(releases, 13, "ten free releases, then three counted attempts");
    w.check_invariants().await;
}

/// An execution's attempts are read in pages: 13 attempts (10 releases, 3 counted) in pages of
/// 5, 5 and 3, each page's cursor leading to the next; a limit past 100 is refused naming it.
#[tokio::test]
async fn attempts_are_read_in_pages() {
    use kairos_layer::ops::worker::Outcome;
    let w = world(35, FaultConfig::none()).await;
    let id = w.sched.submit(request(Some("pages"), T0)).await.unwrap().execution.id;
    w.fire_all().await;
    loop {
        w.advance_ms(20_000);
        w.fire_all().await;
        let Some(c) = w.sched.claim_for(NS, "report", "w", 1, None).await.unwrap().pop() else {
            break;
        };
        w.sched.report_one(NS, &id, c.attempt.fencing_token, Outcome::Release).await.unwrap();
    }
    let (mut after, mut pages) = (None, Vec::new());
    loop {
        let page = w.sched.attempts_page(NS, &id, after, 5).await.unwrap();
        pages.push(page.attempts.iter().map(|a| a.number).collect::<Vec<_>>());
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let want: Vec<Vec<u32>> = vec![(1..=5).collect(), (6..=10).collect(), (11..=13).collect()];
    assert_eq!(pages, want);
    assert_eq!(w.sched.attempts(NS, &id).await.unwrap().len(), 13, "the first page: up to 100");
    let e = w.sched.attempts_page(NS, &id, None, 101).await.unwrap_err();
    assert!(e.to_string().contains("limit"), "{e}");
}

/// A node killed holding claims finds them at its restart through the receipts naming it: what
/// its buffer claimed unassigned and what it started for a waiting worker are READY again
/// (uncounted) unless a worker was heard from (a heartbeat or a result); another node's claims
/// and claims older than the receipts are left to their lease checks.
#[tokio::test]
async fn a_restarted_node_releases_what_its_previous_run_claimed_and_never_handed_over() {
    use kairos_layer::ops::claim::Claimed;
    use kairos_proto::storage::v1::ExecutionStatus;

    let w = world(37, FaultConfig::none()).await;
    let a = w.sched.clone().with_holder("node-a");
    let b = w.sched.clone().with_holder("node-b");
    for i in 0..8 {
        w.sched.submit(request(Some(&format!("k{i}")), T0)).await.unwrap();
    }
    w.fire_all().await;
    // 60 s before the restart: one claim, past what receipts keep.
    let old = a.claim_for(NS, "report", "", 1, None).await.unwrap();
    w.advance_ms(61_000);
    let buffered = a.claim_for(NS, "report", "", 3, None).await.unwrap();
    let waiting = a.claim_for(NS, "report", "w1", 2, None).await.unwrap();
    let other = b.claim_for(NS, "report", "", 2, None).await.unwrap();
    assert_eq!((old.len(), buffered.len(), waiting.len(), other.len()), (1, 3, 2, 2));
    let token = |c: &Claimed| (c.execution.id.clone(), c.attempt.fencing_token);
    // One buffered attempt reached its worker (a heartbeat), one waiting worker's finished.
    let (id, t) = token(&buffered[0]);
    a.heartbeat_one(NS, &id, t).await.unwrap();
    let (id, t) = token(&waiting[0]);
    a.complete(NS, &id, t, Vec::new(), String::new()).await.unwrap();

    w.advance_ms(5_000);
    let released = a.release_orphaned_claims("node-a", w.now_ms()).await.unwrap();
    let mut got: Vec<String> = released.iter().map(|e| e.id.clone()).collect();
    let mut want: Vec<String> =
        [&buffered[1], &buffered[2], &waiting[1]].iter().map(|c| token(c).0).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "the unconfirmed attempts of node-a's receipts");
    for id in &want {
        let e = w.sched.get(NS, id).await.unwrap();
        assert_eq!(e.status, ExecutionStatus::Ready as i32, "{id}");
        assert_eq!((e.attempt_count, e.attempts_released), (1, 1), "released uncounted");
    }
    let status = |c: &Claimed| {
        let id = token(c).0;
        let sched = &w.sched;
        async move { sched.get(NS, &id).await.unwrap().status }
    };
    assert_eq!(status(&buffered[0]).await, ExecutionStatus::Running as i32, "heard from");
    assert_eq!(status(&waiting[0]).await, ExecutionStatus::Succeeded as i32);
    assert_eq!(status(&other[0]).await, ExecutionStatus::Running as i32, "node-b's");
    assert_eq!(status(&old[0]).await, ExecutionStatus::Running as i32, "past the receipts");
    // Done once: a second pass finds the tokens moved on.
    assert!(a.release_orphaned_claims("node-a", w.now_ms()).await.unwrap().is_empty());
    // The released executions are claimed again, under new tokens.
    let again = a.claim_for(NS, "report", "w2", 10, None).await.unwrap();
    assert_eq!(again.len(), 3);
    w.check_invariants().await;
}

/// Another node is released from only while its record still shows it silent, read in the
/// release transaction itself: a node whose view of the others was stale (a round whose reads
/// stalled across a network cut) must not give back the attempts a live node is handing to
/// its workers — they would start twice (tests/tests/cluster.rs, the cut-off, found it).
#[tokio::test]
async fn a_node_taken_for_dead_that_still_beats_keeps_its_claims() {
    use kairos_proto::storage::v1::{ExecutionStatus, NodeRecord};

    let w = world(41, FaultConfig::none()).await;
    let a = w.sched.clone().with_holder("node-a");
    for i in 0..3 {
        w.sched.submit(request(Some(&format!("k{i}")), T0)).await.unwrap();
    }
    w.fire_all().await;
    let beat = || NodeRecord { node_id: "node-a".into(), ..NodeRecord::default() };
    w.sched.heartbeat_node(beat()).await.unwrap();
    let claimed = a.claim_for(NS, "report", "w1", 3, None).await.unwrap();
    assert_eq!(claimed.len(), 3);
    w.advance_ms(9_000);
    w.sched.heartbeat_node(beat()).await.unwrap(); // alive after all
    w.advance_ms(1_000);
    let silent_ms = 8_000;
    let none = w.sched.release_dead_node_claims("node-a", silent_ms).await.unwrap();
    assert!(none.is_empty(), "a node heard from 1 s ago is not dead: {none:?}");
    for c in &claimed {
        let e = w.sched.get(NS, &c.execution.id).await.unwrap();
        assert_eq!(e.status, ExecutionStatus::Running as i32, "kept: {}", e.id);
    }
    w.advance_ms(8_000); // silent for 9 s now
    let released = w.sched.release_dead_node_claims("node-a", silent_ms).await.unwrap();
    assert_eq!(released.len(), 3, "silent past the bound: its unconfirmed claims go back");
    w.check_invariants().await;
}
