//! A node SIGKILLed while holding claimed executions — tasks handed to a worker that was never
//! heard from, and its dispatch buffer, claimed ahead and unassigned — hands them out again
//! soon after its restart, not a lease later: the receipts of its claims name it, and 5 s after
//! it starts it releases what no worker confirmed. The lease here is 10 minutes, so anything
//! left to its lease check would miss the test's bound by far.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::time::{Duration, Instant};

use kairos_proto::v1::worker_service_client::WorkerServiceClient;
use kairos_proto::v1::{
    ExecutionStatus, SubmitRequest, WorkOpen, WorkRequest, WorkResponse, submit_request,
};
use kairos_sdk::{Client, Worker};
use kairos_tests::dev::DevNode;
use tokio::sync::{mpsc, watch};
use tonic::Streaming;

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const HELD: &str = "name: held\nversion: 1\ntimeouts: {lease: 600s}\nexecution: {type: test}\n";
const EXECUTIONS: usize = 200;
/// The raw worker's credits: the node buffers 4 per slot on top.
const CREDITS: u32 = 10;

async fn count(client: &Client, status: ExecutionStatus) -> i64 {
    let stats = client.stats(false).await.expect("stats");
    stats.iter().find(|(s, _)| *s == status).map_or(0, |(_, n)| *n)
}

/// The value of an unlabelled counter on the node's `/metrics`.
fn metric(http: u16, name: &str) -> u64 {
    let (status, body) = kairos_tests::http_request(http, "GET", "/metrics", &[], b"").unwrap();
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

/// Submits the executions of `held`, due now.
async fn submit_held(client: &Client) {
    let reqs: Vec<SubmitRequest> = (0..EXECUTIONS)
        .map(|i| SubmitRequest {
            namespace: "default".into(),
            definition_uri: "registry://jobs/held".into(),
            definition_version: 1,
            inputs_json: "{}".into(),
            when: Some(submit_request::When::DelayMs(0)),
            idempotency_key: format!("held-{i}"),
            ..SubmitRequest::default()
        })
        .collect();
    client.submit_batch(reqs).await.expect("submitted");
}

/// A raw worker that takes its tasks and is never heard from again (no heartbeat, no result):
/// its stream (kept open while held) and how many tasks it got.
async fn silent_worker(
    endpoint: &str,
) -> ((Streaming<WorkResponse>, mpsc::Sender<WorkRequest>), usize) {
    let mut workers = WorkerServiceClient::connect(endpoint.to_string()).await.unwrap();
    let (tx, rx) = mpsc::channel(4);
    let open = WorkOpen {
        namespace: "default".into(),
        queue: "held".into(),
        worker_id: "w-silent".into(),
        credits: CREDITS,
        lease_ms: 0,
    };
    tx.send(WorkRequest { open: Some(open), ..WorkRequest::default() }).await.unwrap();
    let stream = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut inbound = workers.work(stream).await.expect("stream opens").into_inner();
    let mut tasks = 0;
    while tasks < CREDITS as usize {
        let m = tokio::time::timeout(Duration::from_secs(30), inbound.message())
            .await
            .expect("tasks within 30 s")
            .expect("stream")
            .expect("open");
        tasks += m.tasks.len();
    }
    ((inbound, tx), tasks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_holding_claims_hands_them_out_again_soon_after_its_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = DevNode::start(KAIROS, dir.path()).await;
    let endpoint = node.endpoint.clone();
    let client = Client::connect(&endpoint).await.unwrap().with_timeout(Duration::from_secs(30));
    client.register_definition(HELD).await.unwrap();
    submit_held(&client).await;

    let (silent, tasks) = silent_worker(&endpoint).await;
    // The node claims ahead for the stream's buffer: more RUNNING than the worker holds.
    let t = Instant::now();
    let mut running = count(&client, ExecutionStatus::Running).await;
    while running <= i64::from(CREDITS) && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        running = count(&client, ExecutionStatus::Running).await;
    }
    assert!(running > i64::from(CREDITS), "a buffer beside the {CREDITS} tasks: {running} RUNNING");
    println!("RUNNING at the SIGKILL: {running} ({tasks} handed to the silent worker)");

    drop(node); // SIGKILL
    drop(silent);
    let restarted = Instant::now();
    let node = DevNode::start(KAIROS, dir.path()).await;
    let (http, endpoint) = (node.http, node.endpoint.clone());
    let client = Client::connect(&endpoint).await.unwrap().with_timeout(Duration::from_secs(30));
    let (stop, stopped) = watch::channel(false);
    let worker = Worker::new(client.clone(), "held", "w-2")
        .concurrency(50)
        .handle("held", |_task| async { Ok(serde_json::json!({ "ok": true })) });
    let run = tokio::spawn(worker.run(stopped));

    while count(&client, ExecutionStatus::Succeeded).await < EXECUTIONS as i64 {
        assert!(
            restarted.elapsed() < Duration::from_secs(120),
            "{} of {EXECUTIONS} done 120 s after the restart ({} RUNNING): the claims of the \
             killed node were not released (their lease is 10 minutes)",
            count(&client, ExecutionStatus::Succeeded).await,
            count(&client, ExecutionStatus::Running).await,
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("all {EXECUTIONS} done {:?} after the restart", restarted.elapsed());
    let released = metric(http, "kairos_orphans_released_total");
    assert!(released >= running as u64, "released {released} of the {running} held");
    stop.send(true).unwrap();
    run.await.unwrap().expect("the worker stops cleanly");
}
