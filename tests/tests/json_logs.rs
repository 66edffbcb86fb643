//! JSON logs (`log_format: json`, issue 36): every line the node writes to stderr is one JSON
//! object carrying the node's id, and a line about an execution carries its namespace,
//! execution id and attempt. The real binary, a real worker.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kairos_proto::v1::ExecutionStatus;
use kairos_sdk::{Client, Worker};
use kairos_tests::dev::{Killed, free_port_pair};

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const ECHO: &str = "name: logged\nversion: 1\nexecution: {type: test}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_json_line_carries_the_node_id_and_execution_lines_their_execution() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log = dir.path().join("stderr.log");
    let (http, grpc) = free_port_pair();
    let mut node = Killed(
        Command::new(KAIROS)
            .args(["dev", "--data-dir", data.to_str().unwrap()])
            .args(["--log", "info,kairos_actors::api::grpc::results=debug"])
            .args(["--listen-http", &format!("127.0.0.1:{http}")])
            .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
            .env("KAIROS_LOG_FORMAT", "json")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let client = connect(grpc).await;
    client.register_definition(ECHO).await.unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let w = Worker::new(client.clone(), "logged", "json-log-worker")
        .handle("logged", |_t| async move { Ok(serde_json::json!({})) });
    let run = tokio::spawn(w.run(stopped));
    let id = client.submit("registry://jobs/logged", 1).send().await.unwrap().execution_id;
    let e = client.wait(&id, Duration::from_secs(20)).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Succeeded);
    stop.send(true).unwrap();
    run.await.unwrap().unwrap();
    // SIGTERM: the node drains and logs as it stops.
    let pid = node.0.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let t = Instant::now();
    while node.0.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(30), "the node did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let node_id = std::fs::read_to_string(data.join("node-id")).unwrap().trim().to_string();
    let lines = parsed(&std::fs::read_to_string(&log).unwrap());
    assert!(lines.len() >= 2, "some lines were logged: {lines:?}");
    for l in &lines {
        assert_eq!(l["node_id"], node_id.as_str(), "every line carries the node id: {l}");
    }
    let recorded = lines
        .iter()
        .find(|l| l["fields"]["message"] == "result recorded")
        .unwrap_or_else(|| panic!("the result's line: {lines:?}"));
    let f = &recorded["fields"];
    assert_eq!((&f["namespace"], &f["execution_id"]), (&"default".into(), &id.as_str().into()));
    assert_eq!(f["attempt"], 1, "{recorded}");
}

/// Each stderr line as JSON (a line that is not JSON fails the test).
fn parsed(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

async fn connect(grpc: u16) -> Client {
    let t = Instant::now();
    loop {
        if let Ok(c) = Client::connect(&format!("http://127.0.0.1:{grpc}")).await
            && c.list_definitions().await.is_ok()
        {
            return c;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no node");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
