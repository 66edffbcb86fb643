//! Issue 21, step 1: SCHEDULED and RETRY_WAIT executions have no status index entries. A store
//! written before has them; its first open clears them (once), and listing by status, the
//! counts and `kairos check` stay right.

#![allow(clippy::disallowed_methods)] // a real file on a real disk

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use common::*;
use kairos_layer::env::{ManualClock, Rng, SharedClock, Timestamp};
use kairos_layer::keys::{Keyspace, Tag};
use kairos_layer::kv::embedded::EmbeddedDatabase;
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::kv::{Database, RangeOption};
use kairos_layer::ops::check::check_records;
use kairos_layer::ops::query::ListQuery;
use kairos_layer::ops::{ClusterParams, Scheduler};
use kairos_proto::storage::v1::{ClusterConfig, Execution, ExecutionError, ExecutionStatus};
use prost::Message;

const OTHER: &str = "other";
const PARAMS: ClusterParams =
    ClusterParams { shard_count: 4, bucket_width_ms: 60_000, ready_partitions: 2 };

async fn open(path: &Path, clock: &ManualClock) -> (Database, Scheduler) {
    let shared: SharedClock = Arc::new(clock.clone());
    let db = EmbeddedDatabase::open_database(path, shared.clone(), Rng::seeded(1)).unwrap();
    let sched = Scheduler::open(db.clone(), Keyspace::new("test"), shared, Rng::seeded(2), PARAMS)
        .await
        .expect("the store opens");
    (db, sched)
}

fn in_ns(ns: &str, at: i64) -> kairos_layer::ops::submit::SubmitRequest {
    kairos_layer::ops::submit::SubmitRequest { namespace: ns.into(), ..request(None, at) }
}

/// Makes a store as the build before issue 21 left it: executions SCHEDULED (two namespaces),
/// RETRY_WAIT and SUCCEEDED, with status index entries for every state but READY and RUNNING,
/// and a cluster config without the status index revision.
async fn old_store(db: &Database, sched: &Scheduler, clock: &ManualClock) {
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
            let err =
                ExecutionError { message: "again".into(), retryable: true, code: String::new() };
            sched.fail(NS, id, token, err).await.unwrap()
        } else {
            sched.complete(NS, id, token, b"{}".to_vec(), String::new()).await.unwrap()
        };
        assert!(matches!(e.status(), ExecutionStatus::RetryWait | ExecutionStatus::Succeeded));
    }
    // What the build before wrote and this one does not.
    let ks = sched.keyspace();
    let waiting = executions(db, ks).await;
    db.run(|tx| {
        let waiting = waiting.clone();
        async move {
            for e in &waiting {
                if matches!(e.status(), ExecutionStatus::Scheduled | ExecutionStatus::RetryWait) {
                    tx.set(&ks.by_status(&e.namespace, e.status, e.execute_at_ms, &e.id), b"")?;
                }
            }
            let mut config =
                ClusterConfig::decode(&tx.get(&ks.cluster()).await?.unwrap()[..]).unwrap();
            config.status_index = 0;
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

#[tokio::test]
async fn the_first_open_clears_the_old_entries_once_and_listing_stays_complete() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.redb");
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let (db, sched) = open(&path, &clock).await;
    old_store(&db, &sched, &clock).await;
    let ks = sched.keyspace().clone();
    let before = indexed(&db, &ks).await;
    assert_eq!(before.iter().filter(|s| **s == ExecutionStatus::Scheduled as i32).count(), 150);
    assert_eq!(before.iter().filter(|s| **s == ExecutionStatus::RetryWait as i32).count(), 4);
    let old = check_records(&db, &ks, |_| {}).await.unwrap();
    assert!(old.is_clean(), "an old store's entries are not damage: {:#?}", old.findings);
    let counts =
        (sched.status_counts(NS).await.unwrap(), sched.status_counts(OTHER).await.unwrap());
    db.close().await;
    drop((db, sched));

    let (db, sched) = open(&path, &clock).await;
    assert_eq!(sched.config().status_index, 1, "recorded, so it runs once");
    let writes = db.write_counts().expect("the embedded store counts its writes");
    assert_eq!(writes.clear_ranges, 3, "{writes:?}: (default, 1), (default, 4), (other, 1)");
    assert_eq!((writes.sets, writes.clears, writes.transactions), (1, 0, 4), "{writes:?}");
    let after = indexed(&db, &ks).await;
    assert_eq!(after, vec![ExecutionStatus::Succeeded as i32; 2], "only ended states are indexed");
    let all = executions(&db, &ks).await;
    for (ns, status) in [
        (NS, ExecutionStatus::Scheduled),
        (OTHER, ExecutionStatus::Scheduled),
        (NS, ExecutionStatus::RetryWait),
        (NS, ExecutionStatus::Succeeded),
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
    let (db, _sched) = open(&path, &clock).await;
    let writes = db.write_counts().unwrap();
    assert_eq!(writes.transactions, 0, "the next open writes nothing: {writes:?}");
    db.close().await;
}

/// A store made by this build never runs the migration, and an open writes nothing for it.
#[tokio::test]
async fn a_new_store_is_never_migrated() {
    let w = world(7, FaultConfig::none()).await;
    assert_eq!(w.sched.config().status_index, 1);
    w.sched.submit(request(None, T0 + 60_000)).await.unwrap();
    assert!(indexed(&w.db, &w.ks).await.is_empty(), "no entry for a SCHEDULED execution");
    let before = w.store.write_counts().unwrap();
    let clock: SharedClock = Arc::new(w.clock.clone());
    let again = Scheduler::open(w.db.clone(), w.ks.clone(), clock, Rng::seeded(3), w.params).await;
    assert_eq!(again.unwrap().config().status_index, 1);
    let writes = w.store.write_counts().unwrap() - before;
    assert_eq!(writes.transactions, 0, "{writes:?}");
}
