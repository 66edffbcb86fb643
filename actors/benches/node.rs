//! In-process node benchmark on the embedded backend (every acknowledgement fsynced):
//! 1. burst — N executions (default 100,000) all due at one instant, drained by 50 no-op
//!    workers polling in batches: completions/s and lateness (handler start − execute_at);
//! 2. lifecycle — M executions (default 20,000) submitted due now while workers run:
//!    executions/s through submit → fire → claim → complete.
//!
//! Run: `cargo bench -p kairos-actors --bench node` (`KAIROS_BENCH_BURST`, `KAIROS_BENCH_FLOW`
//! set N and M; `KAIROS_BENCH_DIR` the data directory's parent; `KAIROS_BENCH_BACKEND=memory`
//! runs the same on the memory backend).
#![allow(clippy::disallowed_methods)] // a benchmark measures real time

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kairos_actors::node::Node;
use kairos_actors::node::WorkerPoll;
use kairos_actors::server::config::NodeConfig;
use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::embedded::{EmbeddedDatabase, EmbeddedStats};
use kairos_layer::ops::submit::SubmitRequest;
use kairos_layer::ops::worker::{Outcome, Report};

const NS: &str = "bench";
const WORKERS: usize = 50;
const DEF: &str = "name: noop\nversion: 1\nexecution: {type: command, command: [\"true\"]}\n";

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn pct(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_string))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        .map_or(0.0, |kb| kb / 1024.0)
}

fn request(at: i64) -> SubmitRequest {
    SubmitRequest {
        namespace: NS.into(),
        definition: "noop".into(),
        definition_version: 1,
        inputs: serde_json::json!({}),
        execute_at_ms: at,
        delay_ms: None,
        idempotency_key: None,
        traceparent: None,
    }
}

/// Submits `n` executions due at `at` in batches of 1,000, 4 batches in flight.
async fn submit_all(
    node: &Node,
    n: usize,
    at: impl Fn(usize) -> i64 + Send + Sync + 'static,
) -> Duration {
    let t = Instant::now();
    let at = Arc::new(at);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (node, next, at) = (node.clone(), next.clone(), at.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let start = next.fetch_add(1_000, Ordering::Relaxed);
                if start >= n {
                    break;
                }
                let reqs = (start..(start + 1_000).min(n)).map(|i| Ok(request(at(i)))).collect();
                for r in node.submit_batch(reqs).await.expect("batch") {
                    r.expect("submit");
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    t.elapsed()
}

/// Workers that complete everything; returns the lateness (ms) of each handler start.
async fn drain(node: &Node, clock: &SharedClock, n: usize) -> (Vec<i64>, Instant) {
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let (node, clock, done) = (node.clone(), clock.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut late = Vec::new();
            let req = WorkerPoll {
                namespace: NS.into(),
                queue: "noop".into(),
                worker_id: format!("w{w}"),
                max: 64,
                lease_ms: None,
                wait_ms: 500,
            };
            while done.load(Ordering::Relaxed) < n {
                let batch = node.poll(req.clone()).await.expect("poll");
                if batch.is_empty() {
                    continue;
                }
                let now = clock.now().as_millis();
                let mut results = Vec::with_capacity(batch.len());
                for c in &batch {
                    late.push(now - c.execution.execute_at_ms);
                    results.push(Ok(Report {
                        namespace: NS.into(),
                        execution_id: c.execution.id.clone(),
                        token: c.attempt.fencing_token,
                        outcome: Outcome::Success {
                            output_json: Vec::new(),
                            output_reference: String::new(),
                        },
                        worker_id: None,
                        queue: None,
                    }));
                }
                // The no-op handlers finished: report their results in one call.
                for r in node.report(results).await.expect("complete") {
                    r.expect("completed");
                }
                done.fetch_add(batch.len(), Ordering::Relaxed);
            }
            late
        }));
    }
    let mut late = Vec::new();
    for t in tasks {
        late.extend(t.await.unwrap());
    }
    late.sort_unstable();
    (late, Instant::now())
}

fn main() {
    let burst = env("KAIROS_BENCH_BURST", 100_000);
    let flow = env("KAIROS_BENCH_FLOW", 20_000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let base = std::env::var("KAIROS_BENCH_DIR").map(std::path::PathBuf::from).ok();
        let dir = match &base {
            Some(b) => tempfile::tempdir_in(b),
            None => tempfile::tempdir(),
        }
        .unwrap();
        let clock: SharedClock = Arc::new(SystemClock::default());
        let edb = EmbeddedDatabase::open(dir.path().join("kv.redb"), clock.clone()).unwrap();
        let stats = edb.stats();
        let memory = std::env::var("KAIROS_BENCH_BACKEND").as_deref() == Ok("memory");
        let backend = if memory { "memory" } else { "embedded" };
        let db = if memory {
            kairos_layer::kv::memory::MemoryDatabase::open(
                clock.clone(),
                Rng::seeded(1),
                Default::default(),
            )
        } else {
            kairos_layer::kv::Database::new(Arc::new(edb), clock.clone(), Rng::seeded(1))
        };
        let config = NodeConfig { node_id: Some("bench".into()), ..NodeConfig::default() };
        let node = Node::start(config, db.clone(), clock.clone(), Rng::seeded(2)).await.unwrap();
        let def = kairos_layer::definition::parse_definition(DEF).unwrap();
        node.scheduler().register_definition(NS, def, "test").await.unwrap();
        while node.owned_shards().len() < 64 {
            clock.sleep(Duration::from_millis(50)).await;
        }
        run_burst(&node, &clock, burst, backend).await;
        run_lifecycle(&node, &clock, flow, &stats).await;
        if std::env::var("KAIROS_BENCH_METRICS").is_ok() {
            for l in node
                .metrics_text()
                .await
                .lines()
                .filter(|l| !l.starts_with('#') && !l.contains("_bucket"))
            {
                println!("{l}");
            }
        }
        node.stop().await;
        db.close().await;
    });
}

/// 1. Burst: all due at one instant, after submission finished.
async fn run_burst(node: &Node, clock: &SharedClock, burst: usize, backend: &str) {
    let due_at = clock.now().as_millis() + 3_000 + (burst as i64 / 10);
    let took = submit_all(node, burst, move |_| due_at).await;
    let submitted_at = clock.now().as_millis();
    assert!(
        submitted_at < due_at,
        "submission took past the due instant; lower KAIROS_BENCH_BURST"
    );
    let (late, end) = drain(node, clock, burst).await;
    let due_instant =
        Instant::now() - Duration::from_millis((clock.now().as_millis() - due_at) as u64);
    let drain_s = end.duration_since(due_instant).as_secs_f64();
    println!(
        "## burst: {burst} executions due at one instant, {WORKERS} no-op workers (in-process, {backend})"
    );
    println!("| measure | value |\n|---|---|");
    println!(
        "| submit (batched, 1,000 per call, 4 in flight) | {:.0} executions/s |",
        burst as f64 / took.as_secs_f64()
    );
    println!("| completions/s (due instant → last completion) | {:.0} |", burst as f64 / drain_s);
    println!(
        "| lateness p50 / p90 / p99 / max (handler start − execute_at) | {} / {} / {} / {} ms |",
        pct(&late, 0.5),
        pct(&late, 0.9),
        pct(&late, 0.99),
        late.last().copied().unwrap_or(0)
    );
    println!("| first handler start after due | {} ms |", late.first().copied().unwrap_or(0));
    println!("| never before execute_at | {} |", late.first().is_none_or(|l| *l >= 0));
}

/// 2. Lifecycle: submitted due now while the workers run.
async fn run_lifecycle(node: &Node, clock: &SharedClock, flow: usize, stats: &EmbeddedStats) {
    let t0 = Instant::now();
    let node2 = node.clone();
    let clock2 = clock.clone();
    let submitter =
        tokio::spawn(
            async move { submit_all(&node2, flow, move |_| clock2.now().as_millis()).await },
        );
    let (late2, end2) = drain(node, clock, flow).await;
    submitter.await.unwrap();
    let secs = end2.duration_since(t0).as_secs_f64();
    println!(
        "\n## lifecycle: {flow} executions submit → fire → claim → complete (due on submission)"
    );
    println!("| measure | value |\n|---|---|");
    println!("| executions/s through the whole lifecycle | {:.0} |", flow as f64 / secs);
    println!("| lateness p50 / p99 | {} / {} ms |", pct(&late2, 0.5), pct(&late2, 0.99));
    println!("| mean transactions per fsync | {:.1} |", stats.transactions_per_fsync());
    println!("| peak RSS | {:.0} MiB |", peak_rss_mib());
    let m = node.metrics();
    println!(
        "| store retries: conflicts / other | {} / {} |",
        m.store_retries_conflict.load(Ordering::Relaxed),
        m.store_retries_other.load(Ordering::Relaxed)
    );
}
