//! Per-namespace quotas: over its rate or its unfinished-executions cap a namespace gets
//! RESOURCE_EXHAUSTED / 429 with a retry-after and nothing is stored, while other namespaces
//! go on; time (the rate) or finished work (the cap) lets it in again.
#![allow(clippy::disallowed_methods)] // waits on tokio's paused clock

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use kairos_actors::node::Node;
use kairos_actors::server::config::{Backend, NodeConfig, Quota, Quotas};
use kairos_layer::env::{Rng, SharedClock, Timestamp, TokioClock};
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use kairos_layer::ops::Error;
use kairos_layer::ops::submit::SubmitRequest;
use tower::ServiceExt;

const DEF: &str = "name: job\nversion: 1\ninputs:\n  pad: {type: string, required: false}\nexecution: {type: command, command: [\"true\"]}\n";

async fn node() -> Node {
    let clock: SharedClock =
        Arc::new(TokioClock::starting_at(Timestamp::from_millis(1_790_000_000_000)));
    let db = MemoryDatabase::open(clock.clone(), Rng::seeded(1), FaultConfig::none());
    let quotas = Quotas {
        default: Quota::default(),
        namespaces: BTreeMap::from([
            ("rated".to_string(), Quota { submit_per_s: 10, ..Quota::default() }),
            ("capped".to_string(), Quota { pending_max: 5, ..Quota::default() }),
            (
                "small".to_string(),
                Quota { inputs_bytes_max: 100, definition_bytes_max: 200, ..Quota::default() },
            ),
        ]),
    };
    let config = NodeConfig {
        node_id: Some("n1".into()),
        backend: Backend::Memory,
        shard_count: 4,
        quotas,
        ..NodeConfig::default()
    };
    let node = Node::start(config, db, clock, Rng::seeded(2)).await.unwrap();
    for ns in ["rated", "capped", "free", "small"] {
        let def = kairos_layer::definition::parse_definition(DEF).unwrap();
        node.scheduler().register_definition(ns, def, "test").await.unwrap();
    }
    node
}

fn req(ns: &str) -> SubmitRequest {
    SubmitRequest {
        namespace: ns.into(),
        definition: "job".into(),
        definition_version: 1,
        inputs: serde_json::json!({}),
        delay_ms: Some(3_600_000),
        ..SubmitRequest::default()
    }
}

async fn stored(node: &Node, ns: &str) -> i64 {
    node.scheduler().status_counts(ns).await.unwrap().iter().map(|(_, n)| n).sum()
}

#[tokio::test(start_paused = true)]
async fn a_namespace_over_its_rate_waits_and_others_go_on() {
    let node = node().await;
    for _ in 0..10 {
        node.submit(req("rated")).await.unwrap();
    }
    let e = node.submit(req("rated")).await.unwrap_err();
    let Error::QuotaExceeded { retry_after_ms, .. } = &e else { panic!("{e:?}") };
    assert!((1..=1_000).contains(retry_after_ms), "{e}");
    assert_eq!(stored(&node, "rated").await, 10, "nothing stored when refused");
    for _ in 0..50 {
        node.submit(req("free")).await.unwrap(); // another namespace is not held up
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..5 {
        node.submit(req("rated")).await.unwrap(); // half a second refills half the bucket
    }
    assert!(node.submit(req("rated")).await.is_err());
    // A batch: the refused namespace's items fail alone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let batch = vec![req("rated"), req("free"), req("rated"), req("free")];
    let out = node.submit_batch(batch.into_iter().map(Ok).collect()).await.unwrap();
    assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
    let mut big = vec![req("free")];
    big.extend((0..20).map(|_| req("rated")));
    let out = node.submit_batch(big.into_iter().map(Ok).collect()).await.unwrap();
    assert!(out[0].is_ok(), "the free namespace's item passes");
    assert!(out[1..].iter().all(|r| matches!(r, Err(Error::QuotaExceeded { .. }))), "{out:?}");
    node.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_namespace_at_its_cap_gets_429_with_a_retry_after() {
    let node = node().await;
    for _ in 0..5 {
        node.submit(req("capped")).await.unwrap();
    }
    let body =
        r#"{"definitionUri": "registry://jobs/job", "definitionVersion": 1, "delayMs": 60000}"#;
    let http = Request::builder()
        .method("POST")
        .uri("/executions")
        .header("content-type", "application/json")
        .header("kairos-namespace", "capped")
        .body(Body::from(body))
        .unwrap();
    let resp = kairos_actors::api::http::router(node.clone()).oneshot(http).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()["retry-after"], "1");
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("RESOURCE_EXHAUSTED") && text.contains("pending_max"), "{text}");
    assert_eq!(stored(&node, "capped").await, 5);
    // One finishes (cancelled): after the counts are read again, one more is let in.
    let list = node
        .scheduler()
        .list(&kairos_layer::ops::query::ListQuery {
            namespace: "capped".into(),
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    node.cancel("capped", &list.executions[0].id, "test").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    node.submit(req("capped")).await.unwrap();
    assert!(node.submit(req("capped")).await.is_err());
    node.stop().await;
}

#[tokio::test(start_paused = true)]
async fn payloads_and_definitions_over_a_namespace_limit_are_refused_naming_the_field() {
    let node = node().await;
    let with_inputs = |ns: &str, bytes: usize| SubmitRequest {
        inputs: serde_json::json!({"pad": "x".repeat(bytes)}),
        ..req(ns)
    };
    node.submit(with_inputs("small", 50)).await.unwrap();
    let e = node.submit(with_inputs("small", 150)).await.unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { field, reason } if field == "inputs" && reason.contains("limit of 100")),
        "{e:?}"
    );
    node.submit(with_inputs("free", 150)).await.unwrap(); // other namespaces: the global limit
    // In a batch the big item fails alone.
    let out = node
        .submit_batch(vec![
            Ok(with_inputs("small", 10)),
            Ok(with_inputs("small", 500)),
            Ok(req("free")),
        ])
        .await
        .unwrap();
    assert!(out[0].is_ok() && out[2].is_ok(), "{out:?}");
    assert!(matches!(&out[1], Err(Error::InvalidArgument { field, .. }) if field == "inputs"));
    assert_eq!(stored(&node, "small").await, 2, "nothing stored for the refused ones");
    // A definition over the namespace's limit, over HTTP: 400 naming `definition`.
    let big = format!("{DEF}description: {}\n", "d".repeat(300));
    let http = Request::builder()
        .method("POST")
        .uri("/definitions")
        .header("kairos-namespace", "small")
        .body(Body::from(big))
        .unwrap();
    let resp = kairos_actors::api::http::router(node.clone()).oneshot(http).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["error"]["field"], "definition", "{v}");
    node.stop().await;
}
