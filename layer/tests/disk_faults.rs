//! The embedded store and its disk: a full disk refuses writes with a clear error, keeps reads
//! working, and resumes by itself when space returns; acknowledged data survives; its point
//! reads leave the runtime thread free.

#![allow(clippy::disallowed_methods)] // a real file on a real disk, in real time

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::embedded::{EmbeddedDatabase, EmbeddedOptions};
use kairos_layer::kv::{Database, Error, StoreHealth};

async fn put(db: &Database, k: &str, v: &str) -> Result<(), Error> {
    db.run(|tx| {
        let (k, v) = (k.to_string(), v.to_string());
        async move {
            tx.set(k.as_bytes(), v.as_bytes())?;
            Ok::<_, Error>(())
        }
    })
    .await
}

async fn get(db: &Database, k: &str) -> Result<Option<String>, Error> {
    let tx = db.begin()?;
    Ok(tx.get(k.as_bytes()).await?.map(|v| String::from_utf8_lossy(&v).into_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_clearly_and_recovers_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock: SharedClock = Arc::new(SystemClock::default());
    let full = Arc::new(AtomicBool::new(false));
    let options = EmbeddedOptions { disk_full: Some(full.clone()), ..EmbeddedOptions::default() };
    let db = EmbeddedDatabase::open_database_with(
        dir.path().join("kv.redb"),
        clock,
        Rng::seeded(1),
        options,
    )
    .unwrap();
    for i in 0..50 {
        put(&db, &format!("k{i}"), "v").await.unwrap();
    }
    assert_eq!(db.health(), StoreHealth::Healthy);

    full.store(true, Ordering::SeqCst);
    let t = std::time::Instant::now();
    let e = put(&db, "late", "v").await.unwrap_err();
    assert!(matches!(e, Error::StorageFull(_)), "a clear error, not a hang: {e}");
    assert!(e.to_string().contains("is full"), "{e}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(10),
        "answered at once: {:?}",
        t.elapsed()
    );
    assert!(matches!(db.health(), StoreHealth::WritesRefused { .. }), "{:?}", db.health());
    // Reads go on; what was acknowledged is there.
    assert_eq!(get(&db, "k7").await.unwrap().as_deref(), Some("v"));
    // Writes keep failing fast while the disk is full.
    for _ in 0..3 {
        assert!(matches!(put(&db, "late", "v").await, Err(Error::StorageFull(_))));
    }
    assert_eq!(get(&db, "late").await.unwrap(), None, "nothing half-written");

    // Space returns: the next write goes through, no restart.
    full.store(false, Ordering::SeqCst);
    put(&db, "late", "v2").await.unwrap();
    assert_eq!(db.health(), StoreHealth::Healthy);
    assert_eq!(get(&db, "late").await.unwrap().as_deref(), Some("v2"));
    for i in 0..50 {
        assert_eq!(get(&db, &format!("k{i}")).await.unwrap().as_deref(), Some("v"), "k{i}");
    }
    db.close().await;
}

/// The rarer case: space runs out between the check and the write, so the engine itself hits
/// ENOSPC (after which redb must be re-opened). Writes fail clearly and resume without a
/// restart once space returns; nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enospc_inside_the_engine_is_survived_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock: SharedClock = Arc::new(SystemClock::default());
    let fail = Arc::new(AtomicBool::new(false));
    let options =
        EmbeddedOptions { disk_writes_fail: Some(fail.clone()), ..EmbeddedOptions::default() };
    let db = EmbeddedDatabase::open_database_with(
        dir.path().join("kv.redb"),
        clock,
        Rng::seeded(2),
        options,
    )
    .unwrap();
    for i in 0..50 {
        put(&db, &format!("k{i}"), "v").await.unwrap();
    }
    fail.store(true, Ordering::SeqCst);
    let e = put(&db, "late", "v").await.unwrap_err();
    assert!(matches!(e, Error::StorageFull(_)), "{e}");
    assert!(matches!(db.health(), StoreHealth::WritesRefused { .. }), "{:?}", db.health());
    for _ in 0..3 {
        assert!(put(&db, "late", "v").await.is_err(), "still refused while the disk is full");
    }
    fail.store(false, Ordering::SeqCst);
    // The first batch after space returns re-opens the engine and commits.
    put(&db, "late", "v2").await.unwrap();
    assert_eq!(db.health(), StoreHealth::Healthy);
    assert_eq!(get(&db, "late").await.unwrap().as_deref(), Some("v2"));
    for i in 0..50 {
        assert_eq!(get(&db, &format!("k{i}")).await.unwrap().as_deref(), Some("v"), "k{i}");
    }
    db.close().await;
}

/// A panic inside the engine (what a damaged file did to redb) is contained: the commit that
/// met it fails at once with the reason, the store reports itself failed (final: the node
/// exits so a supervisor restarts it), every later write fails fast instead of hanging, and
/// nothing acknowledged before is lost on a re-open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_inside_the_engine_fails_the_store_clearly_not_silently() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.redb");
    let clock: SharedClock = Arc::new(SystemClock::default());
    let panics = Arc::new(AtomicBool::new(false));
    let options =
        EmbeddedOptions { engine_panics: Some(panics.clone()), ..EmbeddedOptions::default() };
    let db = EmbeddedDatabase::open_database_with(&path, clock.clone(), Rng::seeded(3), options)
        .unwrap();
    for i in 0..20 {
        put(&db, &format!("k{i}"), "v").await.unwrap();
    }
    panics.store(true, Ordering::SeqCst);
    let t = std::time::Instant::now();
    let e = put(&db, "late", "v").await.unwrap_err();
    assert!(e.to_string().contains("panic"), "the error says what happened: {e}");
    let StoreHealth::Failed { reason } = db.health() else {
        panic!("the store reports itself failed: {:?}", db.health())
    };
    assert!(reason.contains("injected engine panic"), "{reason}");
    panics.store(false, Ordering::SeqCst);
    for _ in 0..3 {
        assert!(put(&db, "later", "v").await.is_err(), "failed is final for this process");
    }
    assert!(t.elapsed() < std::time::Duration::from_secs(10), "fails fast: {:?}", t.elapsed());
    db.close().await;
    drop(db);
    // A restart (what the supervisor does) finds everything acknowledged.
    let db = EmbeddedDatabase::open_database(&path, clock, Rng::seeded(4)).unwrap();
    for i in 0..20 {
        assert_eq!(get(&db, &format!("k{i}")).await.unwrap().as_deref(), Some("v"), "k{i}");
    }
    assert_eq!(get(&db, "late").await.unwrap(), None);
    db.close().await;
}

/// The reads of a batch issued together on the embedded store all answer, read-your-writes
/// included. (They run inline: a hop to the blocking pool per read tripled the node's CPU in a
/// burst, see docs/benchmarks.md.)
#[tokio::test(flavor = "current_thread")]
async fn embedded_batch_reads_answer_with_read_your_writes() {
    let dir = tempfile::tempdir().unwrap();
    let clock: SharedClock = Arc::new(SystemClock::default());
    let db =
        EmbeddedDatabase::open_database(dir.path().join("kv.redb"), clock, Rng::seeded(5)).unwrap();
    for i in 0..50 {
        put(&db, &format!("k{i}"), "v").await.unwrap();
    }
    assert_eq!(get(&db, "k0").await.unwrap().as_deref(), Some("v"));
    let tx = db.begin().unwrap();
    tx.set(b"k7", b"mine").unwrap();
    let keys: Vec<Vec<u8>> = (0..50).map(|i| format!("k{i}").into_bytes()).collect();
    let reads = keys.iter().map(|k| tx.get(k));
    let got = futures_util::future::try_join_all(reads).await.unwrap();
    assert!(got.iter().all(Option::is_some));
    assert_eq!(got[7].as_deref(), Some(&b"mine"[..]), "read-your-writes");
    db.close().await;
}

/// The commit log (ADR 0011) between checkpoints, then a clean close: the close takes every
/// logged commit into one durable engine commit and empties the log, so the next open has
/// nothing to replay and trusts the store; what was committed is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_close_leaves_an_empty_commit_log_and_a_trusted_store() {
    use kairos_layer::kv::embedded::Integrity;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.redb");
    let log = dir.path().join("kv.redb.log");
    let clock: SharedClock = Arc::new(SystemClock::default());
    let options =
        EmbeddedOptions { checkpoint_interval_ms: 3_600_000, ..EmbeddedOptions::default() };
    let edb = EmbeddedDatabase::open_with(&path, clock.clone(), options).unwrap();
    let stats = edb.stats();
    let db = Database::new(Arc::new(edb), clock.clone(), Rng::seeded(5));
    for i in 0..40 {
        put(&db, &format!("k{i}"), "v").await.unwrap();
    }
    assert!(std::fs::metadata(&log).unwrap().len() > 0, "the commits are in the log");
    assert_eq!(stats.checkpoints.load(Ordering::Relaxed), 0, "no checkpoint within the hour");
    db.close().await;
    drop(db);
    assert_eq!(std::fs::metadata(&log).unwrap().len(), 0, "a clean close empties the log");
    let edb =
        EmbeddedDatabase::open_with(&path, clock.clone(), EmbeddedOptions::default()).unwrap();
    assert_eq!(edb.integrity(), &Integrity::Trusted, "closed cleanly: trusted");
    let db = Database::new(Arc::new(edb), clock, Rng::seeded(6));
    for i in 0..40 {
        assert_eq!(get(&db, &format!("k{i}")).await.unwrap().as_deref(), Some("v"), "k{i}");
    }
    db.close().await;
}
