//! KV commit benchmark: committed transactions/s of small transactions (3 keys each) with 1,
//! 16 and 256 concurrent writers, on the memory, embedded and postgres backends; mean
//! transactions per fsync (embedded) or per PostgreSQL commit (postgres) and p50/p99 commit
//! latency. Postgres runs on a throwaway cluster with fsync and synchronous_commit on (as
//! durable as embedded), one node and three nodes (three handles: pools, committers) on one
//! schema.
//!
//! Run: `cargo bench -p kairos-layer --bench kv_commit` (`KAIROS_BENCH_SECS` sets each phase's
//! length, default 3; `KAIROS_BENCH_DIR` the directory of the embedded file, default a temp dir;
//! PostgreSQL's server must be installed: `.ci/install-postgres`).
#![allow(clippy::disallowed_methods)] // a benchmark measures real time

use std::sync::Arc;
use std::time::{Duration, Instant};

use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::embedded::EmbeddedDatabase;
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use kairos_layer::kv::postgres::testing::{ClusterOptions, TempCluster};
use kairos_layer::kv::postgres::{PostgresDatabase, PostgresOptions};
use kairos_layer::kv::{Database, Error};

struct Outcome {
    commits: u64,
    elapsed: Duration,
    latencies_us: Vec<u64>,
}

/// How the benchmark's keys are laid out.
#[derive(Clone, Copy, Debug)]
enum Keys {
    /// Time-ordered ids (as Kairos's execution ids and timer keys are): inserts go to the
    /// right edge of the B-tree.
    Ordered,
    /// Each writer appends under its own prefix: 256 insertion points scattered over the tree.
    Scattered,
}

async fn phase(db: &Database, writers: usize, secs: f64, keys: Keys) -> Outcome {
    phase_on(std::slice::from_ref(db), writers, secs, keys).await
}

/// Writers spread over `nodes` handles on one store.
async fn phase_on(nodes: &[Database], writers: usize, secs: f64, keys: Keys) -> Outcome {
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut joins = Vec::new();
    for w in 0..writers {
        let db = nodes[w % nodes.len()].clone();
        let counter = counter.clone();
        joins.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut seq = 0u64;
            let value = [7u8; 60];
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let id = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                db.run(|tx| async move {
                    for j in 0..3u8 {
                        let key = match keys {
                            Keys::Ordered => format!("bench/{id:016}/{j}"),
                            Keys::Scattered => format!("bench/{w:04}/{seq:012}/{j}"),
                        };
                        tx.set(key.as_bytes(), &value)?;
                    }
                    Ok::<_, Error>(())
                })
                .await
                .expect("commit");
                lat.push(t0.elapsed().as_micros() as u64);
                seq += 1;
            }
            lat
        }));
    }
    let mut latencies_us = Vec::new();
    for j in joins {
        latencies_us.extend(j.await.expect("writer"));
    }
    let elapsed = start.elapsed();
    latencies_us.sort_unstable();
    Outcome { commits: latencies_us.len() as u64, elapsed, latencies_us }
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let secs: f64 =
        std::env::var("KAIROS_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        println!(
            "| backend | keys | writers | commits/s | txns per fsync (batch) | p50 commit | p99 commit |"
        );
        println!("|---|---|---|---|---|---|---|");
        for writers in [1usize, 16, 256] {
            let clock: SharedClock = Arc::new(SystemClock::default());
            let db = MemoryDatabase::open(clock, Rng::seeded(1), FaultConfig::none());
            let o = phase(&db, writers, secs, Keys::Ordered).await;
            report("memory", Keys::Ordered, writers, &o, None);
        }
        let base = std::env::var("KAIROS_BENCH_DIR").map(std::path::PathBuf::from).ok();
        for (keys, writers) in [
            (Keys::Ordered, 1usize),
            (Keys::Ordered, 16),
            (Keys::Ordered, 256),
            (Keys::Scattered, 256),
        ] {
            let dir = match &base {
                Some(b) => tempfile::tempdir_in(b),
                None => tempfile::tempdir(),
            }
            .expect("temp dir");
            let clock: SharedClock = Arc::new(SystemClock::default());
            let edb =
                EmbeddedDatabase::open(dir.path().join("kv.redb"), clock.clone()).expect("open");
            let stats = edb.stats();
            let db = Database::new(Arc::new(edb), clock, Rng::seeded(1));
            let o = phase(&db, writers, secs, keys).await;
            report("embedded", keys, writers, &o, Some(stats.transactions_per_fsync()));
            db.close().await;
        }
        let cluster = TempCluster::start_with(ClusterOptions { fsync: true, ..Default::default() })
            .unwrap_or_else(|e| panic!("{e}"));
        for (nodes, writers) in [(1usize, 1usize), (1, 16), (1, 256), (3, 256)] {
            let schema = format!("bench_{nodes}_{writers}");
            let mut handles = Vec::new();
            let mut stats = Vec::new();
            for _ in 0..nodes {
                let clock: SharedClock = Arc::new(SystemClock::default());
                let options = PostgresOptions { schema: schema.clone(), ..PostgresOptions::new(cluster.url()) };
                let pdb = PostgresDatabase::connect(options, clock.clone()).await.expect("connect");
                stats.push(pdb.stats());
                handles.push(Database::new(Arc::new(pdb), clock, Rng::seeded(1)));
            }
            let o = phase_on(&handles, writers, secs, Keys::Ordered).await;
            let committed: f64 = stats.iter().map(|s| s.transactions_committed.load(std::sync::atomic::Ordering::Relaxed) as f64).sum();
            let batches: f64 = stats.iter().map(|s| s.batches_committed.load(std::sync::atomic::Ordering::Relaxed) as f64).sum();
            let name = if nodes == 1 { "postgres".to_string() } else { format!("postgres, {nodes} nodes") };
            report(&name, Keys::Ordered, writers, &o, Some(committed / batches.max(1.0)));
            for h in handles {
                h.close().await;
            }
        }
    });
}

fn report(backend: &str, keys: Keys, writers: usize, o: &Outcome, per_fsync: Option<f64>) {
    let rate = o.commits as f64 / o.elapsed.as_secs_f64();
    let pf = per_fsync.map_or("n/a".to_string(), |x| format!("{x:.1}"));
    println!(
        "| {backend} | {keys:?} | {writers} | {rate:.0} | {pf} | {:.2} ms | {:.2} ms |",
        pct(&o.latencies_us, 0.50) as f64 / 1000.0,
        pct(&o.latencies_us, 0.99) as f64 / 1000.0
    );
}
