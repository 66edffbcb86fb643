//! Storage faults with real `kairos` processes: a store that vanished or was emptied is
//! refused, not silently replaced by an empty cluster.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Runs `kairos dev` on `dir` until it is healthy (then stops it with SIGTERM) or exits; returns
/// whether it came up, and its stderr.
fn run_node(dir: &Path, extra: &[&str]) -> (bool, String) {
    let (http, grpc) = (free_port(), free_port());
    let log = dir.parent().unwrap().join(format!("node-{http}.log"));
    let mut child = Command::new(KAIROS)
        .args(["dev", "--data-dir", dir.to_str().unwrap(), "--log", "warn"])
        .args(["--listen-http", &format!("127.0.0.1:{http}")])
        .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let mut up = false;
    while t.elapsed() < Duration::from_secs(20) {
        if let Some(_status) = child.try_wait().unwrap() {
            break;
        }
        if std::net::TcpStream::connect(("127.0.0.1", http)).is_ok() {
            up = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if up {
        // SIGTERM: drain and stop.
        let _ = Command::new("kill").arg(child.id().to_string()).status();
    }
    let _ = child.wait();
    (up, std::fs::read_to_string(&log).unwrap_or_default())
}

#[test]
fn an_emptied_or_missing_store_is_refused_unless_a_new_one_is_asked_for() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let (up, log) = run_node(&dir, &[]);
    assert!(up, "a first start creates the store: {log}");
    assert!(dir.join("store-created").exists(), "the data directory records that it held a store");

    // Emptied (truncate -s 0): refused, saying what to do.
    std::fs::File::create(dir.join("kv.redb")).unwrap();
    let (up, log) = run_node(&dir, &[]);
    assert!(!up, "an empty store is not silently a new cluster");
    assert!(log.contains("is empty") && log.contains("--new-store"), "{log}");

    // Missing: refused too.
    std::fs::remove_file(dir.join("kv.redb")).unwrap();
    let (up, log) = run_node(&dir, &[]);
    assert!(!up);
    assert!(log.contains("is missing") && log.contains("--new-store"), "{log}");

    // Asked for: a new, empty store.
    let (up, log) = run_node(&dir, &["--new-store"]);
    assert!(up, "{log}");
    let (up, log) = run_node(&dir, &[]);
    assert!(up, "the new store is the store now: {log}");
}
