//! What an operator sees of a real `kairos dev` node's queues (issue 36): `kairosctl queues`
//! and `GET /queues` show READY work waiting on a queue no worker serves (its depth and the
//! oldest one's age), and a connected worker stream with its free credits.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::process::Command;
use std::time::{Duration, Instant};

use kairos_sdk::{Client, Worker};
use kairos_tests::dev::DevNode;
use kairos_tests::http_request;
use serde_json::Value;
use tokio::sync::watch;

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const KAIROSCTL: &str = env!("CARGO_BIN_EXE_e2e-kairosctl");

const ORPHAN: &str = "name: orphan\nversion: 1\nexecution: {type: test}\n";
const SERVED: &str = "name: served\nversion: 1\nexecution: {type: test}\n";

/// `kairosctl --json queues [args]` against the node: the parsed output.
fn ctl_queues(node: &DevNode, args: &[&str]) -> Value {
    let out = Command::new(KAIROSCTL)
        .args(["--endpoint", &node.endpoint, "--json", "queues"])
        .args(args)
        .output()
        .expect("kairosctl runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn queue<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v["queues"].as_array().unwrap().iter().find(|q| q["queue"] == name)
}

/// Polls `kairosctl queues` until `ok` holds for queue `name` (15 s at most).
async fn wait_queue(node: &DevNode, name: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let v = ctl_queues(node, &[]);
        if let Some(q) = queue(&v, name).filter(|q| ok(q)) {
            return q.clone();
        }
        assert!(t.elapsed() < Duration::from_secs(15), "queue {name} never matched: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_show_ready_work_without_workers_and_connected_credits() {
    let dir = tempfile::tempdir().unwrap();
    let node = DevNode::start(KAIROS, dir.path()).await;
    let client = Client::connect(&node.endpoint).await.unwrap();
    client.register_definition(ORPHAN).await.unwrap();
    client.register_definition(SERVED).await.unwrap();
    assert!(queue(&ctl_queues(&node, &[]), "orphan").is_none(), "nothing READY yet");
    for _ in 0..3 {
        client.submit("registry://jobs/orphan", 1).send().await.unwrap();
    }
    let q = wait_queue(&node, "orphan", |q| q["depth"] == 3).await;
    assert_eq!((q["namespace"].as_str(), q["workers"].as_u64()), (Some("default"), Some(0)));
    assert_eq!(q["depthCapped"], false);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let q = wait_queue(&node, "orphan", |_| true).await;
    let age = q["oldestReadyAgeSeconds"].as_f64().unwrap();
    assert!((1.0..60.0).contains(&age), "the oldest READY execution waits: {q}");

    let (stop, stopped) = watch::channel(false);
    let worker = Worker::new(client.clone(), "served", "w-queues")
        .concurrency(5)
        .handle("served", |_task| async { Ok(serde_json::json!({})) });
    let run = tokio::spawn(worker.run(stopped));
    let q = wait_queue(&node, "served", |q| q["workers"] == 1).await;
    assert_eq!((q["creditsFree"].as_u64(), q["depth"].as_u64()), (Some(5), Some(0)), "{q}");

    // The HTTP twin says the same; another namespace sees none of it.
    let (code, body) = http_request(node.http, "GET", "/queues", &[], b"").unwrap();
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(queue(&v, "orphan").unwrap()["depth"], 3, "{v}");
    assert_eq!(queue(&v, "served").unwrap()["creditsFree"], 5, "{v}");
    let other = [("Kairos-Namespace", "other")];
    let (code, body) = http_request(node.http, "GET", "/queues", &other, b"").unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["queues"], serde_json::json!([]));
    let bad = [("Kairos-Namespace", "no spaces")];
    let (code, body) = http_request(node.http, "GET", "/queues", &bad, b"").unwrap();
    assert!(code == 400 && body.contains("namespace"), "{code} {body}");

    stop.send(true).unwrap();
    run.await.unwrap().unwrap();
    wait_queue(&node, "orphan", |q| q["depth"] == 3).await;
    let v = ctl_queues(&node, &["--all"]);
    assert!(queue(&v, "served").is_none(), "the worker left: {v}");
}
