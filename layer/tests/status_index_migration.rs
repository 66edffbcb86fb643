//! Issue 21, steps 1 and 5: SCHEDULED, RETRY_WAIT and SUCCEEDED executions have no status index
//! entries. A store written before has them (all three at status index revision 0, SUCCEEDED
//! ones at revision 1); its first open clears them (once), and listing by status, the counts
//! and `kairos check` stay right.

#![allow(clippy::disallowed_methods)] // a real file on a real disk

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::*;
use kairos_layer::env::{ManualClock, Rng, SharedClock, Timestamp};
use kairos_layer::keys::{Keyspace, Tag};
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::kv::{Database, RangeOption};
use kairos_layer::ops::Scheduler;
use kairos_layer::ops::check::check_records;
use kairos_layer::ops::query::ListQuery;
use kairos_proto::storage::v1::{ClusterConfig, Execution, ExecutionError, ExecutionStatus};
use prost::Message;

const OTHER: &str = "other";
fn in_ns(ns: &str, at: i64) -> kairos_layer::ops::submit::SubmitRequest {
    kairos_layer::ops::submit::SubmitRequest { namespace: ns.into(), ..request(None, at) }
}

/// The states whose entries a store at status index revision `level` still has.
fn still_indexed(level: u32) -> &'static [ExecutionStatus] {
    use ExecutionStatus::*;
    match level {
        0 => &[Scheduled, RetryWait, Succeeded],
        _ => &[Succeeded],
    }
}

/// Makes a store as a build of status index revision `level` left it: executions SCHEDULED
/// (two namespaces), RETRY_WAIT, FAILED and SUCCEEDED, with status index entries for the
/// states that revision indexed, and a cluster config saying `level`.
async fn old_store(db: &Database, sched: &Scheduler, clock: &ManualClock, level: u32) {
    for ns in [NS, OTHER] {
        sched.register_definition(ns, report_definition(), "test").await.unwrap();
    }
    let now = kairos_layer::env::Clock::now(clock).as_millis();
    let mut items: Vec<_> = (0..120).map(|i| Ok(in_ns(NS, now + 60_000 * (i % 7 + 1)))).collect();
    items.extend((0..30).map(|i| Ok(in_ns(OTHER, now + 1_000 * (i + 1)))));
    items.extend((0..6).map(|_| Ok(in_ns(NS, now))));
    sched.submit_batch(items).await.unwrap().into_iter().for_each(|r| drop(r.unwrap()));
    let epochs: Vec<u64> = (0..4)
        .map(|s| async move { sched.acquire_shard(s, NODE, 3_600_000).await.unwrap().epoch })
        .collect::<futures_util::future::JoinAll<_>>()
        .await;
    for s in 0..4u32 {
        sched.fire_due(s, epochs[s as usize], now, 100, &Default::default()).await.unwrap();
    }
    let claimed = sched.claim_for(NS, "report", "w", 6, None).await.unwrap();
    assert_eq!(claimed.len(), 6);
    for (i, c) in claimed.iter().enumerate() {
        let (id, token) = (&c.execution.id, c.attempt.fencing_token);
        let e = if i < 4 {
            let retryable = i < 3;
            let err = ExecutionError { message: "again".into(), retryable, code: String::new() };
            sched.fail(NS, id, token, err).await.unwrap()
        } else {
            sched.complete(NS, id, token, b"{}".to_vec(), String::new()).await.unwrap()
        };
        use ExecutionStatus::*;
        assert!(matches!(e.status(), RetryWait | Failed | Succeeded), "{:?}", e.status());
    }
    // What the build before wrote and this one does not.
    let ks = sched.keyspace();
    let waiting = executions(db, ks).await;
    db.run(|tx| {
        let waiting = waiting.clone();
        async move {
            for e in &waiting {
                if still_indexed(level).contains(&e.status()) {
                    tx.set(&ks.by_status(&e.namespace, e.status, e.execute_at_ms, &e.id), b"")?;
                }
            }
            let mut config =
                ClusterConfig::decode(&tx.get(&ks.cluster()).await?.unwrap()[..]).unwrap();
            config.status_index = level;
            tx.set(&ks.cluster(), &config.encode_to_vec())
        }
    })
    .await
    .unwrap();
}

async fn executions(db: &Database, ks: &Keyspace) -> Vec<Execution> {
    let r = ks.subspace_range(Tag::Execution);
    let rows = db
        .run(|tx| {
            let r = r.clone();
            async move { tx.get_range(&r, true).await }
        })
        .await
        .unwrap();
    rows.iter().map(|kv| Execution::decode(&kv.value[..]).unwrap()).collect()
}

/// The status index entries of each status.
async fn indexed(db: &Database, ks: &Keyspace) -> Vec<i32> {
    let r: RangeOption = ks.subspace_range(Tag::ByStatus);
    let rows = db
        .run(|tx| {
            let r = r.clone();
            async move { tx.get_range(&r, true).await }
        })
        .await
        .unwrap();
    rows.iter().map(|kv| ks.parse_by_status(&kv.key).unwrap().1).collect()
}

/// Every execution of `ns` in `status`, listed `page` at a time.
async fn list_all(
    sched: &Scheduler,
    ns: &str,
    status: ExecutionStatus,
    page: usize,
) -> BTreeSet<String> {
    let mut q = ListQuery {
        namespace: ns.into(),
        status: Some(status),
        limit: page,
        ..ListQuery::default()
    };
    let mut ids = BTreeSet::new();
    loop {
        let p = sched.list(&q).await.unwrap();
        assert!(p.executions.len() <= page);
        for e in p.executions {
            assert_eq!(e.status(), status);
            assert!(ids.insert(e.id), "listed twice");
        }
        match p.next_cursor {
            Some(c) => q.cursor = Some(c),
            None => return ids,
        }
    }
}

fn ids_in(all: &[Execution], ns: &str, status: ExecutionStatus) -> BTreeSet<String> {
    all.iter().filter(|e| e.namespace == ns && e.status() == status).map(|e| e.id.clone()).collect()
}

/// The number of entries of `status` in `indexed`.
fn of(indexed: &[i32], status: ExecutionStatus) -> usize {
    indexed.iter().filter(|s| **s == status as i32).count()
}

/// Opens a store of revision `level` with this build: it clears the old entries (in
/// `ranges` range clears) once, and listing, the counts and the check agree before and after.
async fn migrates_from(level: u32, ranges: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.redb");
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let (db, sched) = open_file(&path, &clock).await;
    old_store(&db, &sched, &clock, level).await;
    let ks = sched.keyspace().clone();
    let before = indexed(&db, &ks).await;
    let scheduled = if level == 0 { 150 } else { 0 };
    assert_eq!(of(&before, ExecutionStatus::Scheduled), scheduled);
    assert_eq!(of(&before, ExecutionStatus::RetryWait), if level == 0 { 3 } else { 0 });
    assert_eq!(of(&before, ExecutionStatus::Succeeded), 2);
    assert_eq!(of(&before, ExecutionStatus::Failed), 1);
    let old = check_records(&db, &ks, |_| {}).await.unwrap();
    assert!(old.is_clean(), "an old store's entries are not damage: {:#?}", old.findings);
    let counts =
        (sched.status_counts(NS).await.unwrap(), sched.status_counts(OTHER).await.unwrap());
    db.close().await;
    drop((db, sched));

    let (db, sched) = open_file(&path, &clock).await;
    assert_eq!(sched.config().status_index, 2, "recorded, so it runs once");
    let writes = db.write_counts().expect("the embedded store counts its writes");
    assert_eq!(writes.clear_ranges, ranges, "{writes:?}");
    assert_eq!((writes.sets, writes.clears), (1, 0), "{writes:?}");
    assert_eq!(writes.transactions, ranges + 1, "a chunk per range, the config: {writes:?}");
    let after = indexed(&db, &ks).await;
    assert_eq!(after, vec![ExecutionStatus::Failed as i32], "only FAILED/CANCELLED are indexed");
    let all = executions(&db, &ks).await;
    for (ns, status) in [
        (NS, ExecutionStatus::Scheduled),
        (OTHER, ExecutionStatus::Scheduled),
        (NS, ExecutionStatus::RetryWait),
        (NS, ExecutionStatus::Succeeded),
        (NS, ExecutionStatus::Failed),
    ] {
        let want = ids_in(&all, ns, status);
        assert!(!want.is_empty());
        for page in [7, 100] {
            assert_eq!(list_all(&sched, ns, status, page).await, want, "{ns} {status:?} by {page}");
        }
    }
    assert_eq!(
        (sched.status_counts(NS).await.unwrap(), sched.status_counts(OTHER).await.unwrap()),
        counts
    );
    let report = check_records(&db, &ks, |_| {}).await.unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
    db.close().await;
    drop((db, sched));
    let (db, _sched) = open_file(&path, &clock).await;
    let writes = db.write_counts().unwrap();
    assert_eq!(writes.transactions, 0, "the next open writes nothing: {writes:?}");
    db.close().await;
}

/// A store of a build before issue 21: SCHEDULED, RETRY_WAIT and SUCCEEDED entries go, in
/// (default, 1), (default, 4), (default, 5) and (other, 1).
#[tokio::test]
async fn the_first_open_clears_the_old_entries_once_and_listing_stays_complete() {
    migrates_from(0, 4).await;
}

/// A store migrated by step 1 (revision 1): its SUCCEEDED entries go, in one range clear, and
/// nothing else is read.
#[tokio::test]
async fn a_store_of_step_one_loses_its_succeeded_entries_once() {
    migrates_from(1, 1).await;
}

/// A store made by this build never runs the migration, and an open writes nothing for it.
#[tokio::test]
async fn a_new_store_is_never_migrated() {
    let w = world(7, FaultConfig::none()).await;
    assert_eq!(w.sched.config().status_index, 2);
    w.sched.submit(request(None, T0 + 60_000)).await.unwrap();
    assert!(indexed(&w.db, &w.ks).await.is_empty(), "no entry for a SCHEDULED execution");
    let before = w.store.write_counts().unwrap();
    let clock: SharedClock = Arc::new(w.clock.clone());
    let again = Scheduler::open(w.db.clone(), w.ks.clone(), clock, Rng::seeded(3), w.params).await;
    assert_eq!(again.unwrap().config().status_index, 2);
    let writes = w.store.write_counts().unwrap() - before;
    assert_eq!(writes.transactions, 0, "{writes:?}");
}
