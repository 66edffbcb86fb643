//! Online backup benchmark: seconds per GiB of store for `EmbeddedDatabase::backup_to` (one
//! snapshot copied into a new store file) while a writer commits small transactions, and for
//! reading the copy back sequentially (what the node streams to `kairos backup`).
//!
//! Run: `cargo bench -p kairos-layer --bench backup` (`KAIROS_BENCH_MIB` sets the store's size
//! in MiB of values, default 512; `KAIROS_BENCH_DIR` the directory of the files, default a temp
//! dir).
#![allow(clippy::disallowed_methods)] // a benchmark measures real time

use std::io::Read as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::Database;
use kairos_layer::kv::embedded::EmbeddedDatabase;

const VALUE_BYTES: usize = 16 << 10;
const PER_TX: u64 = 200;

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Fills the store with `mib` MiB of 16 KiB values, 200 per transaction.
async fn fill(db: &Database, mib: u64) {
    let n = mib * (1 << 20) / VALUE_BYTES as u64;
    for start in (0..n).step_by(PER_TX as usize) {
        db.run(|tx| async move {
            for i in start..(start + PER_TX).min(n) {
                let mut v = vec![0u8; VALUE_BYTES];
                v[..8].copy_from_slice(&i.to_le_bytes());
                tx.set(format!("data/{i:012}").as_bytes(), &v)?;
            }
            Ok::<(), kairos_layer::kv::Error>(())
        })
        .await
        .unwrap();
    }
}

fn main() {
    let mib: u64 =
        std::env::var("KAIROS_BENCH_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(512);
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::env::var("KAIROS_BENCH_DIR").map(Into::into).unwrap_or(tmp.path().to_path_buf());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let clock: SharedClock = Arc::new(SystemClock::default());
        let edb = EmbeddedDatabase::open(dir.join("bench-backup.redb"), clock.clone()).unwrap();
        let db = Database::new(Arc::new(edb.clone()), clock, Rng::seeded(1));
        let t = Instant::now();
        fill(&db, mib).await;
        let store = std::fs::metadata(dir.join("bench-backup.redb")).unwrap().len();
        println!(
            "store: {mib} MiB of values, file {:.2} GiB, filled in {:.1} s",
            gib(store),
            t.elapsed().as_secs_f64()
        );
        let (stop, commits) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let writer = {
            let (db, stop, commits) = (db.clone(), stop.clone(), commits.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    db.run(
                        |tx| async move { tx.set(format!("w/{i:012}").as_bytes(), &[1u8; 200]) },
                    )
                    .await
                    .unwrap();
                    i += 1;
                    commits.store(i, Ordering::Relaxed);
                }
            })
        };
        let to = dir.join("bench-backup.copy.redb");
        let t = Instant::now();
        let report = edb.backup_to(&to).await.unwrap();
        let copy_s = t.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        writer.await.unwrap();
        let copied = std::fs::metadata(&to).unwrap().len();
        let t = Instant::now();
        let mut f = std::fs::File::open(&to).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        while f.read(&mut buf).unwrap() > 0 {}
        let read_s = t.elapsed().as_secs_f64();
        println!(
            "backup_to: {} keys, copy file {:.2} GiB in {copy_s:.2} s = {:.1} s per GiB of store \
             ({} writer commits meanwhile, {:.0}/s)",
            report.keys,
            gib(copied),
            copy_s / gib(store),
            commits.load(Ordering::Relaxed),
            commits.load(Ordering::Relaxed) as f64 / copy_s
        );
        println!(
            "read back (the stream's source): {read_s:.2} s = {:.1} s per GiB (page cache warm)",
            read_s / gib(copied)
        );
        db.close().await;
    });
}
