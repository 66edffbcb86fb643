//! End-to-end with realistic payloads: a real `kairos dev` process; 3,000 executions with
//! 30 KB inputs due at one instant, taken by a worker with 500 credits (the SDK's worker over
//! real gRPC), all complete — every batch on the way (fire, buffer refill, tasks sent, results)
//! passes 10 MB by count alone. Meanwhile another tenant's worker sends a poisoned result (an
//! error code of 100 KB) among its other results: it alone fails, naming its field.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::time::{Duration, Instant};

use kairos_proto::v1::worker_service_client::WorkerServiceClient;
use kairos_proto::v1::{
    ExecutionError, ExecutionStatus, SubmitRequest, Success, TaskResult, WorkOpen, WorkRequest,
    submit_batch_item, submit_request, task_result,
};
use kairos_sdk::{Client, Worker};
use kairos_tests::dev::DevNode;
use tokio::sync::{mpsc, watch};

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const BIG: &str = "name: big\nversion: 1\ninputs:\n  blob: string\ntimeouts: {lease: 120s}\nexecution: {type: test}\n";
const EXECUTIONS: usize = 3_000;
const INPUT_BYTES: usize = 30_000;

/// Submits `n` executions of `big` with 30 KB inputs, due now, in batches of 100 (3 MB each).
async fn submit_big(client: &Client, ns: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for start in (0..n).step_by(100) {
        let reqs = (start..(start + 100).min(n))
            .map(|i| SubmitRequest {
                namespace: ns.into(),
                definition_uri: "registry://jobs/big".into(),
                definition_version: 1,
                inputs_json:
                    serde_json::json!({ "blob": format!("{i:08}{}", "x".repeat(INPUT_BYTES)) })
                        .to_string(),
                when: Some(submit_request::When::DelayMs(0)),
                idempotency_key: format!("{ns}-{i}"),
                ..SubmitRequest::default()
            })
            .collect();
        for item in client.submit_batch(reqs).await.expect("a batch of 30 KB inputs is taken") {
            match item {
                submit_batch_item::Result::Ok(s) => ids.push(s.execution_id),
                submit_batch_item::Result::Error(e) => panic!("submit refused: {e:?}"),
            }
        }
    }
    ids
}

/// The other tenant: a raw `Work` stream that takes its 20 tasks and sends their results in one
/// message, one of them poisoned. Returns each acknowledgement's (code, message), in order.
async fn poisoned_tenant(endpoint: String) -> Vec<(i32, String, bool)> {
    let mut workers = WorkerServiceClient::connect(endpoint).await.unwrap();
    let (tx, rx) = mpsc::channel(16);
    let open = WorkOpen {
        namespace: "other".into(),
        queue: "big".into(),
        worker_id: "w-other".into(),
        credits: 20,
        lease_ms: 0,
    };
    tx.send(WorkRequest { open: Some(open), ..WorkRequest::default() }).await.unwrap();
    let stream = tokio_stream_of(rx);
    let mut inbound = workers.work(stream).await.expect("stream opens").into_inner();
    let mut tasks = Vec::new();
    while tasks.len() < 20 {
        let m = inbound.message().await.expect("stream").expect("open");
        tasks.extend(m.tasks);
    }
    let results: Vec<TaskResult> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| TaskResult {
            execution_id: t.execution_id.clone(),
            fencing_token: t.fencing_token,
            outcome: Some(if i == 7 {
                task_result::Outcome::Failure(ExecutionError {
                    message: "boom".into(),
                    retryable: false,
                    code: "c".repeat(100_000),
                })
            } else {
                task_result::Outcome::Success(Success {
                    output_json: "{}".into(),
                    ..Success::default()
                })
            }),
            namespace: String::new(),
        })
        .collect();
    tx.send(WorkRequest { results, ..WorkRequest::default() }).await.unwrap();
    let mut acks = Vec::new();
    while acks.len() < 20 {
        let m = inbound.message().await.expect("stream").expect("acks come");
        acks.extend(
            m.acks
                .into_iter()
                .map(|a| (a.code, a.message, a.execution_id == tasks[7].execution_id)),
        );
    }
    acks
}

fn tokio_stream_of(
    rx: mpsc::Receiver<WorkRequest>,
) -> impl tonic::codegen::tokio_stream::Stream<Item = WorkRequest> {
    tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx)
}

async fn succeeded(client: &Client) -> i64 {
    let stats = client.stats(false).await.expect("stats");
    stats.iter().find(|(s, _)| *s == ExecutionStatus::Succeeded).map_or(0, |(_, n)| *n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_inputs_to_a_500_credit_worker_all_complete_and_a_poisoned_result_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let node = DevNode::start(KAIROS, dir.path()).await;
    let endpoint = node.endpoint.clone();
    let client = Client::connect(&endpoint).await.unwrap().with_timeout(Duration::from_secs(30));
    client.register_definition(BIG).await.unwrap();
    let other = client.clone().with_namespace("other");
    other.register_definition(BIG).await.unwrap();
    submit_big(&other, "other", 20).await;
    submit_big(&client, "default", EXECUTIONS).await;

    let (stop, stopped) = watch::channel(false);
    let worker = Worker::new(client.clone(), "big", "w-500")
        .concurrency(500)
        .handle("big", |_task| async { Ok(serde_json::json!({ "ok": true })) });
    let run = tokio::spawn(worker.run(stopped));
    let acks = tokio::spawn(poisoned_tenant(endpoint.clone()));

    let t = Instant::now();
    while succeeded(&client).await < EXECUTIONS as i64 {
        assert!(
            t.elapsed() < Duration::from_secs(180),
            "{} of {EXECUTIONS} done",
            succeeded(&client).await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!("{EXECUTIONS} executions with {INPUT_BYTES} B inputs done in {:?}", t.elapsed());

    let acks = acks.await.unwrap();
    for (code, message, poisoned) in &acks {
        if *poisoned {
            assert_eq!(*code, tonic::Code::InvalidArgument as i32, "{message}");
            assert!(message.contains("error.code"), "names the field: {message}");
        } else {
            assert_eq!(*code, 0, "the other results apply: {message}");
        }
    }
    assert_eq!(succeeded(&other).await, 19, "the other tenant's other results applied");
    stop.send(true).unwrap();
    run.await.unwrap().expect("the worker stops cleanly");
}
