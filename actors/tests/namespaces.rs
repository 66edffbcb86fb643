//! Namespaces are separate queues: workers of one namespace never get another namespace's
//! executions, even with the same queue name, whether the work comes through fire-time matches,
//! claims or the dispatch buffers.
#![allow(clippy::disallowed_methods)] // real gRPC server, real time

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_actors::api::grpc::Api;
use kairos_actors::node::Node;
use kairos_actors::server::config::{Backend, NodeConfig};
use kairos_layer::env::{Rng, SharedClock, Timestamp, TokioClock};
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use kairos_sdk::{Client, Task, Worker};

const DEF: &str = "name: job\nversion: 1\nqueue: q\nexecution: {type: noop}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_only_get_their_own_namespaces_work() {
    let clock: SharedClock =
        Arc::new(TokioClock::starting_at(Timestamp::from_millis(1_790_000_000_000)));
    let db = MemoryDatabase::open(clock.clone(), Rng::seeded(1), FaultConfig::none());
    let config = NodeConfig {
        node_id: Some("n1".into()),
        backend: Backend::Memory,
        shard_count: 8,
        ..NodeConfig::default()
    };
    let node = Node::start(config, db, clock, Rng::seeded(2)).await.unwrap();
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr, _) = Api::new(node.clone())
        .serve("127.0.0.1:0".parse().unwrap(), async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    let endpoint = format!("http://{addr}");
    // Which worker ran which execution of which namespace.
    let seen: Arc<Mutex<BTreeMap<String, (String, String)>>> = Arc::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut runs = Vec::new();
    for ns in ["a", "b"] {
        let c = Client::connect(&endpoint).await.unwrap().with_namespace(ns);
        c.register_definition(DEF).await.unwrap();
        let seen = seen.clone();
        let me = format!("worker-{ns}");
        let who = me.clone();
        let w = Worker::new(c, "q", me).concurrency(20).handle("job", move |t: Task| {
            seen.lock().unwrap().insert(t.execution_id().to_string(), (who.clone(), String::new()));
            async { Ok(serde_json::Value::Null) }
        });
        runs.push(tokio::spawn(w.run(stop_rx.clone())));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = Client::connect(&endpoint).await.unwrap().with_namespace("a");
    let mut ids = Vec::new();
    for _ in 0..5 {
        let reqs = (0..200)
            .map(|_| kairos_proto::v1::SubmitRequest {
                namespace: "a".into(),
                definition_uri: "registry://jobs/job".into(),
                definition_version: 1,
                when: Some(kairos_proto::v1::submit_request::When::DelayMs(0)),
                ..Default::default()
            })
            .collect();
        for item in a.submit_batch(reqs).await.unwrap() {
            if let kairos_proto::v1::submit_batch_item::Result::Ok(r) = item {
                ids.push(r.execution_id);
            }
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.lock().unwrap().len() < ids.len() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop_tx.send(true);
    let seen = seen.lock().unwrap().clone();
    let wrong: Vec<_> = seen.iter().filter(|(_, (w, _))| w != "worker-a").collect();
    assert!(
        wrong.is_empty(),
        "{} of namespace a's executions went to another namespace's worker: {:?}",
        wrong.len(),
        wrong.iter().take(3).collect::<Vec<_>>()
    );
    assert_eq!(seen.len(), ids.len(), "every execution ran");
}
