//! A node over a real embedded store whose disk fills up or whose engine fails: the API says
//! so with the right codes, `/healthz` tells the states apart, and a full disk heals by itself.
#![allow(clippy::disallowed_methods)] // a real store on the wall clock

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use kairos_actors::node::Node;
use kairos_actors::server::config::{Backend, NodeConfig};
use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::StoreHealth;
use kairos_layer::kv::embedded::{EmbeddedDatabase, EmbeddedOptions};
use kairos_layer::ops::Error;
use kairos_layer::ops::submit::SubmitRequest;
use tower::ServiceExt;

const DEF: &str = "name: job\nversion: 1\nexecution: {type: command, command: [\"true\"]}\n";

async fn node(dir: &std::path::Path, options: EmbeddedOptions) -> Node {
    let clock: SharedClock = Arc::new(SystemClock::default());
    let db = EmbeddedDatabase::open_database_with(
        dir.join("kv.redb"),
        clock.clone(),
        Rng::seeded(1),
        options,
    )
    .unwrap();
    let config = NodeConfig {
        node_id: Some("n1".into()),
        backend: Backend::Embedded,
        shard_count: 4,
        ..NodeConfig::default()
    };
    let node = Node::start(config, db, clock, Rng::seeded(2)).await.unwrap();
    let def = kairos_layer::definition::parse_definition(DEF).unwrap();
    node.scheduler().register_definition("default", def, "test").await.unwrap();
    node
}

fn submit() -> SubmitRequest {
    SubmitRequest {
        namespace: "default".into(),
        definition: "job".into(),
        definition_version: 1,
        inputs: serde_json::json!({}),
        execute_at_ms: 0,
        idempotency_key: None,
        delay_ms: Some(3_600_000),
        traceparent: None,
    }
}

/// `(status, retry-after header, body)` of a request to the node's HTTP API.
async fn http(node: &Node, method: &str, path: &str, body: &str) -> (StatusCode, String, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = kairos_actors::api::http::router(node.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (status, retry, String::from_utf8_lossy(&body).into_owned())
}

async fn wait_health(node: &Node, want: fn(&StoreHealth) -> bool) {
    for _ in 0..100 {
        if want(&node.store_health()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("health stayed {:?}", node.store_health());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_with_507_and_heals_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let full = Arc::new(AtomicBool::new(false));
    let options = EmbeddedOptions { disk_full: Some(full.clone()), ..EmbeddedOptions::default() };
    let node = node(dir.path(), options).await;
    let kept = node.submit(submit()).await.unwrap().execution.id;
    let (s, _, body) = http(&node, "GET", "/healthz", "").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert!(body.starts_with("ok "), "{body}");

    full.store(true, Ordering::SeqCst);
    let e = node.submit(submit()).await.unwrap_err();
    assert!(matches!(e, Error::Kv(kairos_layer::kv::Error::StorageFull(_))), "{e}");
    let sub = r#"{"definitionUri": "registry://jobs/job", "definitionVersion": 1, "inputs": {}, "delayMs": 60000}"#;
    let (s, retry, body) = http(&node, "POST", "/executions", sub).await;
    assert_eq!(s, StatusCode::INSUFFICIENT_STORAGE, "{body}");
    assert_eq!(retry, "30", "a client is told when to try again");
    assert!(
        body.contains("STORAGE_FULL") || body.contains("storage_full") || body.contains("full"),
        "{body}"
    );
    wait_health(&node, |h| matches!(h, StoreHealth::WritesRefused { .. })).await;
    let (s, retry, body) = http(&node, "GET", "/healthz", "").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(retry, "30");
    assert!(body.starts_with("writes-refused"), "{body}");
    // Reads go on.
    let (s, _, body) = http(&node, "GET", &format!("/executions/{kept}"), "").await;
    assert_eq!(s, StatusCode::OK, "{body}");

    full.store(false, Ordering::SeqCst);
    node.submit(submit()).await.expect("the next write after space returns goes through");
    wait_health(&node, |h| *h == StoreHealth::Healthy).await;
    let (s, _, body) = http(&node, "GET", "/healthz", "").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_engine_makes_the_node_report_failed_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let panics = Arc::new(AtomicBool::new(false));
    let options =
        EmbeddedOptions { engine_panics: Some(panics.clone()), ..EmbeddedOptions::default() };
    let node = node(dir.path(), options).await;
    let mut health = node.watch_store_health();
    panics.store(true, Ordering::SeqCst);
    assert!(node.submit(submit()).await.is_err());
    // What `kairos` waits for to exit non-zero.
    let failed = tokio::time::timeout(
        Duration::from_secs(5),
        health.wait_for(|h| matches!(h, StoreHealth::Failed { .. })),
    )
    .await
    .expect("the node learns of the failure within seconds")
    .unwrap()
    .clone();
    let StoreHealth::Failed { reason } = failed else { unreachable!() };
    assert!(reason.contains("panic"), "{reason}");
    let (s, _, body) = http(&node, "GET", "/healthz", "").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.starts_with("failed") && body.contains("panic"), "{body}");
    panics.store(false, Ordering::SeqCst);
    let _ = tokio::time::timeout(Duration::from_secs(10), node.stop()).await;
}
