//! The worker SDK against an in-process node served over real gRPC (loopback): heartbeats
//! keep a long task's lease, cancellation reaches the handler, stale results are fenced.
#![allow(clippy::disallowed_methods)] // real time: leases run on the wall clock here

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kairos_actors::api::grpc::Api;
use kairos_actors::node::Node;
use kairos_actors::server::config::{Backend, NodeConfig};
use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use kairos_proto::v1::worker_service_client::WorkerServiceClient;
use kairos_proto::v1::{AttemptStatus, ExecutionStatus};
use kairos_proto::v1::{CompleteRequest, HeartbeatRequest, PollRequest};
use kairos_sdk::{Client, TaskError, Worker};
use tokio::sync::watch;

const HELD: &str = "name: held\nversion: 1\ntimeouts: {lease: 30s}\nexecution: {type: test}\n";
const SLOW: &str = "name: slow\nversion: 1\ntimeouts: {lease: 1s}\nretry: {max_attempts: 3, base_delay: 100ms, max_delay: 200ms}\nexecution: {type: test}\n";

async fn node_and_client() -> (Node, Client, std::net::SocketAddr) {
    let clock: SharedClock = Arc::new(SystemClock::default());
    let db = MemoryDatabase::open(clock.clone(), Rng::seeded(1), FaultConfig::none());
    let config = NodeConfig {
        node_id: Some("sdk-test".into()),
        backend: Backend::Memory,
        shard_count: 4,
        poll_interval_ms: 200,
        ..NodeConfig::default()
    };
    let node = Node::start(config, db, clock, Rng::seeded(2)).await.unwrap();
    let (addr, _) = Api::new(node.clone())
        .serve("127.0.0.1:0".parse().unwrap(), std::future::pending())
        .await
        .unwrap();
    let client = Client::connect(&format!("http://{addr}")).await.unwrap();
    client.register_definition(SLOW).await.unwrap();
    while node.owned_shards().len() < 4 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (node, client, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_long_task_alive() {
    let (_node, client, _) = node_and_client().await;
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let (stop, stopped) = watch::channel(false);
    let worker = Worker::new(client.clone(), "slow", "w1").handle("slow", move |_task| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(3_500)).await; // > 3 leases of 1 s
            Ok(serde_json::json!({"done": true}))
        }
    });
    let run = tokio::spawn(worker.run(stopped));
    let s = client.submit("registry://jobs/slow", 1).send().await.unwrap();
    let id = s.execution_id;
    let e = client.wait(&id, Duration::from_secs(20)).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Succeeded);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the lease held: no second attempt");
    assert_eq!(e.attempt_count, 1);
    stop.send(true).unwrap();
    run.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_reaches_the_handler() {
    let (node, client, _) = node_and_client().await;
    let (stop, stopped) = watch::channel(false);
    let worker = Worker::new(client.clone(), "slow", "w1").handle(
        "slow",
        |mut task: kairos_sdk::Task| async move {
            // Wait for the cancel signal (delivered with a heartbeat reply).
            let cancelled =
                tokio::time::timeout(Duration::from_secs(10), task.cancelled.wait_for(|c| *c))
                    .await;
            match cancelled {
                Ok(_) => Err(TaskError::permanent("stopped on request")),
                Err(_) => Ok(serde_json::Value::Null),
            }
        },
    );
    let run = tokio::spawn(worker.run(stopped));
    let id = client.submit("registry://jobs/slow", 1).send().await.unwrap().execution_id;
    loop {
        let (e, _) = client.get(&id).await.unwrap();
        if e.status() == ExecutionStatus::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Cancel through the public API: the worker learns it from its next heartbeat.
    let c = client.cancel(&id).await.unwrap();
    assert!(!c.cancelled, "running: its worker is asked to stop");
    assert!(c.execution.unwrap().cancel_requested);
    let e = client.wait(&id, Duration::from_secs(20)).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Cancelled, "ends CANCELLED, never retried");
    assert_eq!(e.error.unwrap().message, "stopped on request");
    let (e, attempts) = client.get(&id).await.unwrap();
    assert_eq!(e.attempt_count, 1);
    assert_eq!(attempts[0].status(), AttemptStatus::Cancelled);
    let _ = node;
    stop.send(true).unwrap();
    run.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_attempt_is_fenced_out() {
    let (_node, client, addr) = node_and_client().await;
    let id = client.submit("registry://jobs/slow", 1).send().await.unwrap().execution_id;
    // A worker that claims, says it has the task (one heartbeat: a lost lease then counts; an
    // attempt its worker never heard of is released uncounted instead), and dies: no result.
    let mut raw = WorkerServiceClient::connect(format!("http://{addr}")).await.unwrap();
    let poll = PollRequest {
        namespace: "default".into(),
        queue: "slow".into(),
        worker_id: "doomed".into(),
        max_executions: 1,
        lease_ms: 1_000,
        wait_ms: 5_000,
    };
    let task = loop {
        if let Some(t) = raw.poll(poll.clone()).await.unwrap().into_inner().tasks.pop() {
            break t;
        }
    };
    let token = task.fencing_token;
    let hb = HeartbeatRequest {
        namespace: "default".into(),
        execution_id: id.clone(),
        fencing_token: token,
        worker_id: "doomed".into(),
    };
    raw.heartbeat(hb.clone()).await.unwrap();
    // Its lease expires; the attempt times out and the execution moves on.
    loop {
        let (_, attempts) = client.get(&id).await.unwrap();
        if attempts[0].status() == AttemptStatus::TimedOut {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stale = CompleteRequest {
        namespace: "default".into(),
        execution_id: id.clone(),
        fencing_token: token,
        output_json: String::new(),
        output_reference: String::new(),
        worker_id: "doomed".into(),
    };
    let err = raw.complete(stale).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("fenced out"), "{err}");
    assert_eq!(raw.heartbeat(hb).await.unwrap_err().code(), tonic::Code::FailedPrecondition);
    let (e, _) = client.get(&id).await.unwrap();
    assert_ne!(e.status(), ExecutionStatus::Succeeded, "the stale result changed nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_by_idempotency_key_and_due_now_by_the_nodes_clock() {
    use kairos_proto::v1::execution_service_client::ExecutionServiceClient;
    use kairos_proto::v1::{GetExecutionRequest, SubmitRequest};
    let (_node, client, addr) = node_and_client().await;
    // No when: refused, naming the field.
    let mut raw = ExecutionServiceClient::connect(format!("http://{addr}")).await.unwrap();
    let bad = SubmitRequest {
        namespace: "default".into(),
        definition_uri: "registry://jobs/slow".into(),
        definition_version: 1,
        inputs_json: "{}".into(),
        when: None,
        idempotency_key: String::new(),
        return_execution: false,
        traceparent: String::new(),
    };
    let e = raw.submit(bad).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("executeAt:"), "{e}");
    // Due now by the node's clock; the reply is lean unless asked.
    let s = client
        .submit("registry://jobs/slow", 1)
        .idempotency_key("lost-reply")
        .send()
        .await
        .unwrap();
    assert!(s.created && !s.execution_id.is_empty());
    let again = client
        .submit("registry://jobs/slow", 1)
        .idempotency_key("lost-reply")
        .send()
        .await
        .unwrap();
    assert!(!again.created, "the same key and delay is the same request");
    assert_eq!(again.execution_id, s.execution_id);
    let (e, _) = client.get_by_idempotency_key("lost-reply").await.unwrap();
    assert_eq!(e.execution_id, s.execution_id);
    let missing = client.get_by_idempotency_key("never-used").await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let neither = GetExecutionRequest { namespace: "default".into(), ..Default::default() };
    let e = raw.get(neither).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("executionId:"), "{e}");
}

/// A worker holding a finished result when its node goes away keeps it and delivers it to the
/// restarted node: the execution succeeds once, with no second attempt (issue: a worker used
/// to drop a result after one transport error, and it ran again after its lease expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_held_across_a_node_restart_is_delivered_not_rerun() {
    let clock: SharedClock = Arc::new(SystemClock::default());
    let db = MemoryDatabase::open(clock.clone(), Rng::seeded(7), FaultConfig::none());
    let config = NodeConfig {
        node_id: Some("restarting".into()),
        backend: Backend::Memory,
        shard_count: 4,
        poll_interval_ms: 200,
        ..NodeConfig::default()
    };
    let node =
        Node::start(config.clone(), db.clone(), clock.clone(), Rng::seeded(8)).await.unwrap();
    let (addr, server) = Api::new(node.clone())
        .serve("127.0.0.1:0".parse().unwrap(), std::future::pending())
        .await
        .unwrap();
    let client = Client::connect(&format!("http://{addr}")).await.unwrap();
    // A lease long enough to outlast the outage: only the result's delivery is under test.
    client.register_definition(HELD).await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let (stop, stopped) = watch::channel(false);
    let worker = Worker::new(client.clone(), "held", "w-restart").handle("held", move |_task| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(600)).await;
            Ok(serde_json::json!({"done": true}))
        }
    });
    let run = tokio::spawn(worker.run(stopped));
    let id = client.submit("registry://jobs/held", 1).send().await.unwrap().execution_id;
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The node dies while the handler runs: its result has nowhere to go for a while.
    server.abort();
    node.kill().await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    let node = Node::start(config, db, clock, Rng::seeded(9)).await.unwrap();
    let (_, _server) = Api::new(node.clone()).serve(addr, std::future::pending()).await.unwrap();
    let client = Client::connect(&format!("http://{addr}")).await.unwrap();
    let e = client.wait(&id, Duration::from_secs(20)).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Succeeded);
    assert_eq!(e.attempt_count, 1, "the held result was delivered: no second attempt");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    stop.send(true).unwrap();
    run.await.unwrap().unwrap();
}
