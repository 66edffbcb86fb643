//! The embedded engine on Kairos's own workload: redb (copy-on-write B-tree) against fjall
//! (LSM tree), through the shape the embedded backend uses — one committer writing group-commit
//! batches with one fsync each, and readers taking MVCC snapshots whose stored version agrees
//! with the data they read.
//!
//! The workload is an execution's life as the scheduler writes it: submit (record, idempotency
//! key, timer), fire (timer deleted, record rewritten), complete (record rewritten, attempt
//! record), retention (record, idempotency key and attempt deleted) — three versions of every
//! record plus deletes — with a hot status counter per shard; keys of 30–120 bytes, values of
//! 100 B–2 KiB with one in a hundred of 32 KiB. While the committer runs, a reader thread does
//! what the node does: point reads of records and ordered scans of due timers.
//!
//! Each engine runs in its own child process (so its memory is its own). The crash-recovery
//! phase builds a large store, keeps writing, is SIGKILLed mid-write, and the time to open it
//! again (and read) is measured in a fresh process.
//!
//! Run: `cargo bench -p kairos-layer --bench engines`. Settings (environment):
//! `KAIROS_BENCH_SECS` (each commit phase, default 6), `KAIROS_BENCH_LARGE_MIB` (the crash
//! store, default 2048; 0 skips it), `KAIROS_BENCH_DIR` (where the stores go, default a temp
//! dir), `KAIROS_BENCH_ENGINES` (default `redb,fjall`; also `redb-1sync` and `redb-2pc`: redb without quick repair, with a
//! 1- or 2-phase commit, and `fjall-small`: fjall with 64 MiB of journals and 16 MiB
//! memtables). Figures and the decision: docs/benchmarks.md, ADR 0009.
#![allow(clippy::disallowed_methods)] // a benchmark measures real time

#[path = "engines/stores.rs"]
mod stores;
#[path = "engines/workload.rs"]
mod workload;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stores::{Store, open_store};
use workload::{Workload, disk_bytes, rss_kib};

const CHILD: &str = "KAIROS_ENGINES_CHILD";
/// Group-commit sizes measured (transactions per fsync).
const BATCHES: [usize; 4] = [1, 64, 512, 2_000];

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
        return;
    }
    let engines = std::env::var("KAIROS_BENCH_ENGINES").unwrap_or_else(|_| "redb,fjall".into());
    let engines: Vec<&str> = engines.split(',').collect();
    let base = std::env::var("KAIROS_BENCH_DIR").map(PathBuf::from).ok();
    let tmp = tempfile::tempdir_in(base.as_deref().unwrap_or(&std::env::temp_dir())).unwrap();
    let mut results: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for engine in &engines {
        let dir = tmp.path().join(format!("{engine}-work"));
        for (k, v) in run_child(&format!("work {engine} {}", dir.display()), None) {
            if !order.contains(&k) {
                order.push(k.clone());
            }
            results.insert((k, engine.to_string()), v);
        }
        std::fs::remove_dir_all(&dir).ok();
        if env_u64("KAIROS_BENCH_LARGE_MIB", 2_048) > 0 {
            let dir = tmp.path().join(format!("{engine}-large"));
            for (k, v) in crash_recovery(engine, &dir) {
                if !order.contains(&k) {
                    order.push(k.clone());
                }
                results.insert((k, engine.to_string()), v);
            }
            std::fs::remove_dir_all(&dir).ok();
        }
    }
    print_table(&engines, &order, &results);
}

fn print_table(engines: &[&str], order: &[String], results: &BTreeMap<(String, String), String>) {
    println!();
    print!("| measure |");
    for e in engines {
        print!(" {e} |");
    }
    for e in &engines[1..] {
        print!(" {e} / {} |", engines[0]);
    }
    println!();
    println!("|---|{}", "---|".repeat(2 * engines.len() - 1));
    for k in order {
        print!("| {k} |");
        let cells: Vec<String> = engines
            .iter()
            .map(|e| results.get(&(k.clone(), e.to_string())).cloned().unwrap_or_default())
            .collect();
        for c in &cells {
            print!(" {c} |");
        }
        for c in &cells[1..] {
            let ratio = match (leading_number(&cells[0]), leading_number(c)) {
                (Some(a), Some(b)) if a > 0.0 => format!("{:.2}×", b / a),
                _ => String::new(),
            };
            print!(" {ratio} |");
        }
        println!();
    }
}

fn leading_number(s: &str) -> Option<f64> {
    let n: String =
        s.chars().take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ',').collect();
    n.replace(',', "").parse().ok()
}

/// Runs this binary as a child with `spec`; returns its `RESULT key\tvalue` lines. With
/// `kill_after_ready`, SIGKILLs it that long after it prints `READY`.
fn run_child(spec: &str, kill_after_ready: Option<Duration>) -> Vec<(String, String)> {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .env(CHILD, spec)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the child");
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut results = Vec::new();
    for line in out.lines().map_while(Result::ok) {
        if let Some(r) = line.strip_prefix("RESULT ") {
            let (k, v) = r.split_once('\t').unwrap();
            results.push((k.to_string(), v.to_string()));
        } else if line == "READY" {
            if let Some(d) = kill_after_ready {
                std::thread::sleep(d);
                child.kill().unwrap(); // SIGKILL, mid-write
                break;
            }
        } else {
            eprintln!("  {line}");
        }
    }
    let status = child.wait().unwrap();
    assert!(kill_after_ready.is_some() || status.success(), "child {spec} failed: {status}");
    results
}

fn crash_recovery(engine: &str, dir: &Path) -> Vec<(String, String)> {
    let mut r =
        run_child(&format!("large {engine} {}", dir.display()), Some(Duration::from_secs(3)));
    r.extend(run_child(&format!("reopen {engine} {}", dir.display()), None));
    r
}

fn emit(key: &str, value: String) {
    println!("RESULT {key}\t{value}");
}

fn child(spec: &str) {
    let mut parts = spec.splitn(3, ' ');
    let (what, engine, dir) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    match what {
        "work" => work(engine, &dir),
        "large" => large(engine, &dir),
        "reopen" => reopen(engine, &dir),
        other => panic!("unknown child {other}"),
    }
}

fn thousands(n: f64) -> String {
    let s = format!("{:.0}", n);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The main measurements on one engine.
fn work(engine: &str, dir: &Path) {
    let secs = env_u64("KAIROS_BENCH_SECS", 6) as f64;
    let store = open_store(engine, dir);
    let mut w = Workload::new(1);
    // A store of scheduled executions that the run does not touch (due later).
    let t = Instant::now();
    let preload = 200_000;
    w.preload(&*store, preload, 2_000);
    emit(
        "preload 200,000 scheduled executions (commits of 2,000): s",
        format!("{:.1} s", t.elapsed().as_secs_f64()),
    );
    emit("store size after the preload", mib(disk_bytes(dir)));
    for b in BATCHES {
        let s = w.lifecycle(&store, b, Duration::from_secs_f64(secs));
        emit(
            &format!("lifecycle, {b} txns per fsync: transactions/s (executions/s = ÷4)"),
            format!("{} ({} commits/s)", thousands(s.txns_per_s), thousands(s.commits_per_s)),
        );
        emit(
            &format!("lifecycle, {b} txns per fsync: CPU µs per txn (committer + engine threads)"),
            format!("{:.1} µs", s.engine_cpu_us_per_txn),
        );
        emit(
            &format!("lifecycle, {b} txns per fsync: commit p50 / p99"),
            format!("{:.2} / {:.2} ms", s.p50_ms, s.p99_ms),
        );
        emit(
            &format!(
                "lifecycle, {b} txns per fsync: concurrent reader ops/s (get + 100-row timer scan)"
            ),
            format!(
                "{} (get {:.0} µs, scan {:.0} µs)",
                thousands(s.reader_ops_per_s),
                s.reader_get_us,
                s.reader_scan_us
            ),
        );
    }
    emit("store size after the lifecycle runs", mib(disk_bytes(dir)));
    let idle = w.idle_reads(&*store);
    emit("idle: snapshot + version + point get", format!("{:.1} µs", idle.get_us));
    emit("idle: snapshot + version + 100-row scan, forward", format!("{:.1} µs", idle.scan_us));
    emit("idle: snapshot + version + 100-row scan, reverse", format!("{:.1} µs", idle.rev_us));
    let before = disk_bytes(dir);
    let t = Instant::now();
    let removed = w.retire_everything(&*store, 2_000);
    emit(
        "delete every record (retention), commits of 2,000 keys: keys/s",
        thousands(removed as f64 / t.elapsed().as_secs_f64()),
    );
    std::thread::sleep(Duration::from_secs(5));
    emit(
        "size before the deletes → 5 s after",
        format!("{} → {}", mib(before), mib(disk_bytes(dir))),
    );
    let (vm_hwm, vm_rss) = rss_kib();
    emit("peak RSS of the process (cache 128 MiB)", format!("{} MiB", vm_hwm / 1024));
    drop(store);
    let t = Instant::now();
    let store = open_store(engine, dir);
    let opened = t.elapsed();
    emit("clean reopen of the emptied store", format!("{:.1} ms", opened.as_secs_f64() * 1e3));
    emit("size after the reopen", mib(disk_bytes(dir)));
    let _ = (store, vm_rss);
}

/// Builds a large store, then keeps committing lifecycle batches until killed.
fn large(engine: &str, dir: &Path) {
    let target = env_u64("KAIROS_BENCH_LARGE_MIB", 2_048) * 1024 * 1024;
    let store = open_store(engine, dir);
    let mut w = Workload::new(7);
    w.big_values = true;
    let t = Instant::now();
    let mut n = 0;
    while disk_bytes(dir) < target {
        w.preload(&*store, 20_000, 2_000);
        n += 20_000;
    }
    emit(
        "crash store: build (commits of 2,000 submits, ~1 KiB records)",
        format!(
            "{} in {:.0} s, {} executions",
            mib(disk_bytes(dir)),
            t.elapsed().as_secs_f64(),
            thousands(n as f64)
        ),
    );
    println!("READY");
    loop {
        w.lifecycle_until_killed(&*store, 512);
    }
}

/// Opens a store after a SIGKILL and reads it.
fn reopen(engine: &str, dir: &Path) {
    let size = disk_bytes(dir);
    let t = Instant::now();
    let store = open_store(engine, dir);
    let opened = t.elapsed();
    let (version, rows) = store.scan(b"t/", b"t0", 100, false);
    let first = t.elapsed();
    assert!(rows > 0 && version > 0, "the store reads after the crash");
    emit(
        "open after SIGKILL mid-write (large store)",
        format!("{:.0} ms ({} on disk)", opened.as_secs_f64() * 1e3, mib(size)),
    );
    emit(
        "open after SIGKILL → first scan answered",
        format!("{:.0} ms", first.as_secs_f64() * 1e3),
    );
    drop(store);
    let t = Instant::now();
    let store = open_store(engine, dir);
    emit("clean reopen of the large store", format!("{:.1} ms", t.elapsed().as_secs_f64() * 1e3));
    drop(store);
    let took = stores::verify_store(engine, dir);
    let gib = disk_bytes(dir) as f64 / (1024.0 * 1024.0 * 1024.0);
    emit(
        "full integrity check (every checksum): s per GiB on disk",
        format!("{:.2} s/GiB ({:.1} s)", took.as_secs_f64() / gib, took.as_secs_f64()),
    );
}

#[allow(dead_code)]
fn assert_store_object_safe(_: &dyn Store) {}
