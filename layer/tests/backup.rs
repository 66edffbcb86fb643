//! The embedded store's online backup (`EmbeddedDatabase::backup_to`) while a writer commits
//! without pause: the copy is one consistent snapshot (each transaction wholly in it or wholly
//! out), holds every commit acknowledged before the backup began, passes the engine's check,
//! and opens as a store.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::embedded::{EmbeddedDatabase, EngineCheck, check_file};
use kairos_layer::kv::{Database, RangeOption};

fn key(i: u64) -> Vec<u8> {
    format!("k/{i:08}").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::disallowed_methods)] // a real store on the wall clock
async fn a_backup_under_writes_is_one_consistent_snapshot_holding_every_acknowledged_commit() {
    let dir = tempfile::tempdir().unwrap();
    let clock: SharedClock = Arc::new(SystemClock::default());
    let edb = EmbeddedDatabase::open(dir.path().join("kv.redb"), clock.clone()).unwrap();
    let db = Database::new(Arc::new(edb.clone()), clock.clone(), Rng::seeded(1));
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Transaction i writes k/i and sets `last` to i, with a value large enough to span chunks.
    let writer = {
        let (db, acked, stop) = (db.clone(), acked.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                db.run(|tx| async move {
                    tx.set(&key(i), &vec![b'v'; 20_000])?;
                    tx.set(b"last", &i.to_be_bytes())
                })
                .await
                .unwrap();
                i += 1;
                acked.store(i, Ordering::Release);
            }
        })
    };
    while acked.load(Ordering::Acquire) < 400 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let before = acked.load(Ordering::Acquire);
    let to = dir.path().join("backup.redb");
    let report = edb.backup_to(&to).await.unwrap();
    let during = acked.load(Ordering::Acquire);
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    db.close().await;
    assert!(edb.backup_to(&to).await.is_err(), "an existing file is never overwritten");

    assert_eq!(check_file(&to).unwrap(), EngineCheck::Clean);
    let copy = EmbeddedDatabase::open_database(&to, clock, Rng::seeded(2)).unwrap();
    let last = copy.run(|tx| async move { tx.get(b"last").await }).await.unwrap().unwrap();
    let last = u64::from_be_bytes(last[..].try_into().unwrap());
    assert!(last + 1 >= before, "commit {} acknowledged before the backup is missing", before - 1);
    let all = &RangeOption::new(b"k/".to_vec(), b"k0".to_vec());
    let keys = copy.run(|tx| async move { tx.get_range(all, true).await }).await.unwrap();
    let want: Vec<Vec<u8>> = (0..=last).map(key).collect();
    let got: Vec<Vec<u8>> = keys.iter().map(|kv| kv.key.to_vec()).collect();
    assert!(got == want, "k/0..=k/{last} exactly, as `last` says: {} keys", got.len());
    assert_eq!(report.keys, last + 2, "{report:?}");
    println!(
        "backup: {} keys, {} bytes, acknowledged before {before}, during {during}",
        report.keys, report.bytes
    );
    copy.close().await;
}
