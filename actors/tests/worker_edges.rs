//! What a worker, or someone holding a worker key, can do to the node (issue 24).
//!
//! One message: 100,000 heartbeats in one `Work` message were taken whole and got no
//! acknowledgement in 30 s. Now a message with more than `WORK_MESSAGE_ITEMS_MAX` results or
//! heartbeats is refused at once with INVALID_ARGUMENT naming the field, nothing of it applied,
//! and the stream ends; a message at the limit is answered item by item; the node goes on.
//!
//! Fencing tokens: a caller that guesses a running attempt's token (it used to be the attempt
//! number, 1, 2, …) completes nothing and learns no token from the error; the real worker's
//! result is applied, and a later, different result for that attempt is refused as such.
#![allow(clippy::disallowed_methods)] // waits on the real clock for the gRPC server

use std::sync::Arc;
use std::time::{Duration, Instant};

use kairos_actors::api::grpc::Api;
use kairos_actors::limits::WORK_MESSAGE_ITEMS_MAX;
use kairos_actors::node::Node;
use kairos_actors::server::config::{Backend, NodeConfig};
use kairos_layer::env::{Rng, SharedClock, Timestamp, TokioClock};
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use kairos_proto::storage::v1::ExecutionStatus;
use kairos_proto::v1::worker_service_client::WorkerServiceClient;
use kairos_proto::v1::{
    CompleteRequest, HeartbeatRequest, ReportRequest, Task, TaskRef, TaskResult, WorkOpen,
    WorkRequest, WorkResponse, task_result,
};
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

const DEF: &str = "name: job\nversion: 1\nexecution: {type: command, command: [\"true\"]}\n";

/// A node (authentication off) serving gRPC: the node, its endpoint, and what stops it.
async fn node() -> (Node, String, tokio::sync::oneshot::Sender<()>) {
    let clock: SharedClock =
        Arc::new(TokioClock::starting_at(Timestamp::from_millis(1_790_000_000_000)));
    let db = MemoryDatabase::open(clock.clone(), Rng::seeded(1), FaultConfig::none());
    let config = NodeConfig {
        node_id: Some("n1".into()),
        backend: Backend::Memory,
        shard_count: 4,
        ..NodeConfig::default()
    };
    let node = Node::start(config, db, clock, Rng::seeded(2)).await.unwrap();
    let def = kairos_layer::definition::parse_definition(DEF).unwrap();
    node.scheduler().register_definition("default", def, "test").await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr, _) = Api::new(node.clone())
        .serve("127.0.0.1:0".parse().unwrap(), async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    (node, format!("http://{addr}"), stop)
}

/// A `Work` stream of queue `job` for worker `w1`: its sender and its responses.
async fn work_stream(endpoint: &str) -> (mpsc::Sender<WorkRequest>, Streaming<WorkResponse>) {
    let (tx, rx) = mpsc::channel::<WorkRequest>(8);
    let open = WorkOpen {
        namespace: "default".into(),
        queue: "job".into(),
        worker_id: "w1".into(),
        credits: 1,
        lease_ms: 60_000,
    };
    tx.send(WorkRequest { open: Some(open), ..Default::default() }).await.unwrap();
    let mut raw = WorkerServiceClient::connect(endpoint.to_string()).await.unwrap();
    (tx, raw.work(ReceiverStream::new(rx)).await.expect("the stream opens").into_inner())
}

/// The next response on `stream` (at most 10 s).
async fn next(stream: &mut Streaming<WorkResponse>) -> Result<Option<WorkResponse>, tonic::Status> {
    tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("an answer")
}

/// A task claimed over a `Work` stream (one execution submitted for it), and that stream (kept
/// open: the worker holds the task).
async fn claimed(node: &Node, endpoint: &str) -> (Task, mpsc::Sender<WorkRequest>) {
    let client = kairos_sdk::Client::connect(endpoint).await.unwrap();
    let (tx, mut stream) = work_stream(endpoint).await;
    client.submit("registry://jobs/job", 1).send().await.unwrap();
    loop {
        let m = next(&mut stream).await.unwrap().expect("a task");
        if let Some(t) = m.tasks.into_iter().next() {
            let e = node.scheduler().get("default", &t.execution_id).await.unwrap();
            assert_eq!(e.status(), ExecutionStatus::Running);
            return (t, tx);
        }
    }
}

/// `n` heartbeats: `real`'s first, then made-up executions'.
fn beats(real: &Task, n: usize) -> Vec<TaskRef> {
    let first =
        TaskRef { execution_id: real.execution_id.clone(), fencing_token: real.fencing_token };
    let made_up = (1..n).map(|i| TaskRef { execution_id: format!("x{i}"), fencing_token: 7 });
    std::iter::once(first).chain(made_up).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_with_too_many_heartbeats_is_refused_at_once() {
    let (node, endpoint, _stop) = node().await;
    let (task, _holder) = claimed(&node, &endpoint).await;
    let lease_before = node.scheduler().get("default", &task.execution_id).await.unwrap();

    // 100,000 heartbeats in one message (the real one among them): refused whole, at once.
    let (tx, mut stream) = work_stream(&endpoint).await;
    let t = Instant::now();
    tx.send(WorkRequest { heartbeats: beats(&task, 100_000), ..Default::default() }).await.unwrap();
    let refused = loop {
        match next(&mut stream).await {
            Ok(Some(m)) => assert!(m.heartbeats.is_empty(), "heartbeats applied: {m:?}"),
            Ok(None) => panic!("the stream ended without saying why"),
            Err(s) => break s,
        }
    };
    let took = t.elapsed();
    println!("100,000 heartbeats in one message refused in {took:?}");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("heartbeats"), "{refused:?}");
    assert!(refused.message().contains("over the limit of 1000"), "{refused:?}");
    let after = node.scheduler().get("default", &task.execution_id).await.unwrap();
    assert_eq!(after, lease_before, "nothing of the refused message was applied");

    // At the limit: one acknowledgement each, the real attempt's lease extended.
    let (tx, mut stream) = work_stream(&endpoint).await;
    let at_limit = beats(&task, WORK_MESSAGE_ITEMS_MAX);
    tx.send(WorkRequest { heartbeats: at_limit, ..Default::default() }).await.unwrap();
    let acks = loop {
        let m = next(&mut stream).await.unwrap().expect("acknowledgements");
        if !m.heartbeats.is_empty() {
            break m.heartbeats;
        }
    };
    assert_eq!(acks.len(), WORK_MESSAGE_ITEMS_MAX);
    assert_eq!(
        kairos_sdk::limits::MESSAGE_ITEMS_MAX,
        WORK_MESSAGE_ITEMS_MAX,
        "the SDK sends no more"
    );
    assert_eq!((acks[0].code, acks[0].execution_id.as_str()), (0, task.execution_id.as_str()));
    assert!(acks[1..].iter().all(|a| a.code != 0), "made-up executions are not extended");

    let mut raw = WorkerServiceClient::connect(endpoint.clone()).await.unwrap();
    // The node goes on serving: the real worker's heartbeat is answered.
    let hb = HeartbeatRequest {
        namespace: "default".into(),
        execution_id: task.execution_id.clone(),
        fencing_token: task.fencing_token,
        worker_id: "w1".into(),
    };
    let r = raw.heartbeat(hb).await.expect("the real heartbeat is answered").into_inner();
    assert!(r.lease_remaining_ms > 0, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_results_in_one_message_are_refused() {
    let (_node, endpoint, _stop) = node().await;
    let (tx, mut stream) = work_stream(&endpoint).await;
    // Over the limit on the stream and in a unary `Report`.
    let too_many: Vec<TaskResult> = (0..=WORK_MESSAGE_ITEMS_MAX)
        .map(|i| TaskResult {
            execution_id: format!("x{i}"),
            fencing_token: 7,
            outcome: Some(task_result::Outcome::Release(Default::default())),
            namespace: String::new(),
        })
        .collect();
    tx.send(WorkRequest { results: too_many.clone(), ..Default::default() }).await.unwrap();
    let refused = loop {
        match next(&mut stream).await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without saying why"),
            Err(s) => break s,
        }
    };
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("results"), "{refused:?}");
    let mut raw = WorkerServiceClient::connect(endpoint.clone()).await.unwrap();
    let report = ReportRequest { results: too_many, ..Default::default() };
    let e = raw.report(report).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("results"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guessed_token_completes_nothing_and_the_real_worker_s_result_stands() {
    let (node, endpoint, _stop) = node().await;
    let (task, _holder) = claimed(&node, &endpoint).await;
    let mut raw = WorkerServiceClient::connect(endpoint.clone()).await.unwrap();
    let complete = |token: u64, worker: &str, output: &str| CompleteRequest {
        namespace: "default".into(),
        execution_id: task.execution_id.clone(),
        fencing_token: token,
        output_json: output.into(),
        output_reference: String::new(),
        worker_id: worker.into(),
    };
    // Guesses: the attempt number and its neighbours (what tokens were), the real token's
    // neighbours; with no worker id or another one.
    let n = u64::from(task.attempt);
    let guesses = [n, n + 1, 1, 2, 3, task.fencing_token ^ 1, task.fencing_token.wrapping_add(1)];
    for guess in guesses.into_iter().filter(|g| *g != task.fencing_token) {
        for worker in ["", "intruder"] {
            let e =
                raw.complete(complete(guess, worker, r#"{"by":"intruder"}"#)).await.unwrap_err();
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            assert!(!e.message().contains(&task.fencing_token.to_string()), "{e:?}");
        }
    }
    // The real token from another worker: refused too.
    let e = raw.complete(complete(task.fencing_token, "intruder", "{}")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = node.scheduler().get("default", &task.execution_id).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Running, "still the real worker's");

    // The real worker's result is applied; a different one afterwards is refused as such.
    let done = raw.complete(complete(task.fencing_token, "w1", r#"{"by":"w1"}"#)).await.unwrap();
    assert_eq!(done.into_inner().status, ExecutionStatus::Succeeded as i32);
    let again = raw.complete(complete(task.fencing_token, "w1", r#"{"by":"w1"}"#)).await;
    assert!(again.is_ok(), "the same result again (a retry) is answered as applied: {again:?}");
    let other = raw.complete(complete(task.fencing_token, "w1", r#"{"by":"other"}"#)).await;
    let e = other.expect_err("another result for an ended attempt");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("already ended"), "{e:?}");
    let e = node.scheduler().get("default", &task.execution_id).await.unwrap();
    assert_eq!(e.output_json, br#"{"by":"w1"}"#);
}
