//! API keys over both APIs: a key of namespace A reads nothing of B (list cursors included), a
//! worker key cannot submit or register definitions, missing / malformed / wrong / revoked
//! keys are 401, scopes are named when missing, the audit log records who did what, and the
//! cron service's own calls still go through with keys required.
#![allow(clippy::disallowed_methods)] // waits on the real clock for the gRPC server

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use kairos_actors::api::grpc::Api;
use kairos_actors::node::Node;
use kairos_actors::server::auth::AuthMode;
use kairos_actors::server::config::{Backend, NodeConfig};
use kairos_layer::env::{Rng, SharedClock, Timestamp, TokioClock};
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use kairos_proto::v1::{ListExecutionsRequest, PollRequest};
use kairos_sdk::Client;
use serde_json::Value;
use tonic::Code;
use tower::ServiceExt;

const DEF: &str = "name: job\nversion: 1\nexecution: {type: command, command: [\"true\"]}\n";

struct Cluster {
    node: Node,
    endpoint: String,
    /// An admin key of every namespace.
    root: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn cluster() -> Cluster {
    let clock: SharedClock =
        Arc::new(TokioClock::starting_at(Timestamp::from_millis(1_790_000_000_000)));
    let db = MemoryDatabase::open(clock.clone(), Rng::seeded(1), FaultConfig::none());
    let config = NodeConfig {
        node_id: Some("n1".into()),
        backend: Backend::Memory,
        shard_count: 4,
        auth: Some(AuthMode::Keys),
        ..NodeConfig::default()
    };
    let node = Node::start(config, db, clock, Rng::seeded(2)).await.unwrap();
    let root =
        node.scheduler().create_api_key("*", &["admin".into()], "root", "test").await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr, _) = Api::new(node.clone())
        .serve("127.0.0.1:0".parse().unwrap(), async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    Cluster { node, endpoint: format!("http://{addr}"), root: root.token, _stop: stop }
}

impl Cluster {
    async fn client(&self, key: Option<&str>, ns: &str) -> Client {
        let c = Client::connect(&self.endpoint).await.unwrap().with_namespace(ns);
        match key {
            Some(k) => c.with_api_key(k).unwrap(),
            None => c,
        }
    }

    async fn key(&self, ns: &str, scopes: &[&str]) -> String {
        let root = self.client(Some(&self.root), "default").await;
        let scopes: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
        root.create_api_key(ns, &scopes, "test key").await.unwrap().token
    }

    /// An HTTP request through the node's router: (status, JSON body).
    async fn http(
        &self,
        method: &str,
        uri: &str,
        key: Option<&str>,
        ns: &str,
        body: &str,
    ) -> (StatusCode, Value) {
        let mut r = Request::builder()
            .method(method)
            .uri(uri)
            .header("kairos-namespace", ns)
            .header("content-type", "application/json");
        if let Some(k) = key {
            r = r.header("authorization", format!("Bearer {k}"));
        }
        let resp = kairos_actors::api::http::router(self.node.clone())
            .oneshot(r.body(Body::from(body.to_string())).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
}

fn code<T: std::fmt::Debug>(r: Result<T, kairos_sdk::Error>) -> (Code, String) {
    let e = r.expect_err("the call should have been refused");
    (e.code(), e.to_string())
}

#[tokio::test]
async fn a_key_of_one_namespace_reads_nothing_of_another() {
    let c = cluster().await;
    let root_a = c.client(Some(&c.root), "a").await;
    let root_b = c.client(Some(&c.root), "b").await;
    root_a.register_definition(DEF).await.unwrap();
    root_b.register_definition(DEF).await.unwrap();
    let b_ids = three_far_submits_in_each(&root_a, &root_b).await;
    let key_a = c.key("a", &["read", "submit"]).await;
    let a = c.client(Some(&key_a), "a").await;
    let page = a.list(ListExecutionsRequest { limit: 1, ..Default::default() }).await.unwrap();
    assert_eq!(page.executions.len(), 1);
    assert!(!page.next_cursor.is_empty());

    // gRPC: namespace b is refused whatever the call, the cursor of a's list included.
    let in_b = c.client(Some(&key_a), "b").await;
    let (code_, msg) = code(in_b.list(ListExecutionsRequest::default()).await);
    assert_eq!(code_, Code::PermissionDenied, "{msg}");
    assert!(msg.contains("namespace a only"), "{msg}");
    let with_cursor =
        ListExecutionsRequest { cursor: page.next_cursor.clone(), ..Default::default() };
    assert_eq!(code(in_b.list(with_cursor).await).0, Code::PermissionDenied);
    assert_eq!(code(in_b.get(&b_ids[0]).await).0, Code::PermissionDenied);
    assert_eq!(code(in_b.cancel(&b_ids[0]).await).0, Code::PermissionDenied);
    assert_eq!(code(in_b.list_definitions().await).0, Code::PermissionDenied);
    assert_eq!(code(in_b.stats(false).await).0, Code::PermissionDenied);
    assert_eq!(code(a.stats(true).await).0, Code::PermissionDenied, "every namespace's counts");
    assert_eq!(code(a.nodes().await).0, Code::PermissionDenied, "cluster-wide");
    // b's execution through namespace a is simply not there.
    assert_eq!(code(a.get(&b_ids[0]).await).0, Code::NotFound);
    a_batch_item_for_another_namespace_fails_alone(&c, &a).await;

    over_http_the_same(&c, &key_a, &b_ids[0]).await;
}

#[tokio::test]
async fn a_worker_key_works_but_cannot_submit_or_register() {
    let c = cluster().await;
    c.client(Some(&c.root), "a").await.register_definition(DEF).await.unwrap();
    let key = c.key("a", &["worker"]).await;
    let w = c.client(Some(&key), "a").await;
    let (code_, msg) = code(w.submit("registry://jobs/job", 1).send().await);
    assert_eq!(code_, Code::PermissionDenied);
    assert!(msg.contains("lacks the `submit` scope"), "{msg}");
    let (code_, msg) = code(w.register_definition(DEF).await);
    assert_eq!(code_, Code::PermissionDenied);
    assert!(msg.contains("`definitions`"), "{msg}");
    assert_eq!(
        code(w.create_api_key("a", &["submit".into()], "x").await).0,
        Code::PermissionDenied
    );
    // It may claim work.
    let mut raw =
        kairos_proto::v1::worker_service_client::WorkerServiceClient::connect(c.endpoint.clone())
            .await
            .unwrap();
    let mut poll = tonic::Request::new(PollRequest {
        namespace: "a".into(),
        queue: "default".into(),
        worker_id: "w1".into(),
        max_executions: 1,
        wait_ms: 0,
        ..Default::default()
    });
    poll.metadata_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
    raw.poll(poll).await.expect("a worker key polls its namespace");
    let body = r#"{"definitionUri": "registry://jobs/job", "definitionVersion": 1, "delayMs": 0}"#;
    let (s, b) = c.http("POST", "/executions", Some(&key), "a", body).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    let (s, _) = c.http("POST", "/definitions", Some(&key), "a", DEF).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(c.node.scheduler().status_counts("a").await.unwrap().len(), 0, "nothing stored");
}

#[tokio::test]
async fn missing_malformed_wrong_and_revoked_keys_are_unauthenticated() {
    let c = cluster().await;
    let key = c.key("a", &["read"]).await;
    let reader = c.client(Some(&key), "a").await;
    reader.list(ListExecutionsRequest::default()).await.unwrap();

    let none = c.client(None, "a").await;
    let (code_, msg) = code(none.list(ListExecutionsRequest::default()).await);
    assert_eq!(code_, Code::Unauthenticated);
    assert!(msg.contains("requires an API key"), "{msg}");
    let wrong_secret =
        format!("{}{}", &key[..key.len() - 1], if key.ends_with('0') { "1" } else { "0" });
    for bad in ["kai_nope", "not-a-key", wrong_secret.as_str()] {
        let cl = c.client(Some(bad), "a").await;
        assert_eq!(
            code(cl.list(ListExecutionsRequest::default()).await).0,
            Code::Unauthenticated,
            "{bad}"
        );
        assert_eq!(
            c.http("GET", "/executions", Some(bad), "a", "").await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    let (s, body) = c.http("GET", "/executions", None, "a", "").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "UNAUTHENTICATED");
    // Authentication comes first: a bad namespace without a key is still 401.
    assert_eq!(c.http("GET", "/executions", None, "bad ns!", "").await.0, StatusCode::UNAUTHORIZED);

    let id = key.split('_').nth(1).unwrap().to_string();
    let root = c.client(Some(&c.root), "a").await;
    let revoked = root.revoke_api_key(&id).await.unwrap();
    assert!(revoked.revoked_at_ms > 0);
    let (code_, msg) = code(reader.list(ListExecutionsRequest::default()).await);
    assert_eq!(code_, Code::Unauthenticated);
    assert!(msg.contains("revoked"), "{msg}");
    assert_eq!(c.http("GET", "/executions", Some(&key), "a", "").await.0, StatusCode::UNAUTHORIZED);
    // The secret is stored hashed only.
    let stored = c.node.scheduler().api_key(&id).await.unwrap().unwrap();
    let secret = key.rsplit('_').next().unwrap();
    assert_eq!(stored.secret_sha256.len(), 32);
    assert!(!format!("{stored:?}").contains(secret));
}

#[tokio::test]
async fn keys_are_administered_per_namespace_and_audited() {
    let c = cluster().await;
    let admin_a = c.key("a", &["admin"]).await;
    let admin = c.client(Some(&admin_a), "a").await;
    // An admin of a manages a's keys only, and cannot mint a key of every namespace.
    let sub = admin.create_api_key("a", &["submit".into(), "read".into()], "ci").await.unwrap();
    assert_eq!(
        code(admin.create_api_key("b", &["read".into()], "x").await).0,
        Code::PermissionDenied
    );
    assert_eq!(
        code(admin.create_api_key("*", &["read".into()], "x").await).0,
        Code::PermissionDenied
    );
    let (code_, msg) = code(admin.create_api_key("a", &["root".into()], "x").await);
    assert_eq!(code_, Code::InvalidArgument);
    assert!(msg.contains("scopes"), "{msg}");
    let listed = admin.list_api_keys(None).await.unwrap();
    assert!(listed.iter().all(|k| k.namespace == "a"), "{listed:?}");
    assert_eq!(listed.len(), 2);
    let root_key_id = c.root.split('_').nth(1).unwrap();
    assert_eq!(code(admin.revoke_api_key(root_key_id).await).0, Code::NotFound);

    // Audited: a definition, a cancel, a replay, key changes — with the key that did them.
    admin.register_definition(DEF).await.unwrap();
    let s = c.client(Some(&sub.token), "a").await;
    let e =
        s.submit("registry://jobs/job", 1).after(Duration::from_secs(3600)).send().await.unwrap();
    s.cancel(&e.execution_id).await.unwrap();
    admin.revoke_api_key(&sub.key.as_ref().unwrap().id).await.unwrap();
    let log = admin.audit_log(None, 0, 100).await.unwrap();
    let actions: Vec<(&str, &str)> =
        log.iter().map(|e| (e.action.as_str(), e.who.as_str())).collect();
    let admin_who = format!("key:{}", admin_a.split('_').nth(1).unwrap());
    let sub_who = format!("key:{}", sub.key.as_ref().unwrap().id);
    assert!(actions.contains(&("key.create", admin_who.as_str())), "{actions:?}");
    assert!(actions.contains(&("definition.register", admin_who.as_str())), "{actions:?}");
    assert!(actions.contains(&("execution.cancel", sub_who.as_str())), "{actions:?}");
    assert!(actions.contains(&("key.revoke", admin_who.as_str())), "{actions:?}");
    // Reading it takes admin.
    let reader = c.client(Some(&c.key("a", &["read"]).await), "a").await;
    assert_eq!(code(reader.audit_log(None, 0, 10).await).0, Code::PermissionDenied);
    let (s, body) = c.http("GET", "/audit", Some(&admin_a), "a", "").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert!(body["entries"].as_array().unwrap().len() >= 4, "{body}");
    let who = reader.who_am_i().await.unwrap();
    assert_eq!((who.namespace.as_str(), who.authentication), ("a", true));
    let limits = reader.limits().await.unwrap();
    assert_eq!(limits.retention_days, 7);
    keys_are_managed_over_http_too(&c, &admin_a).await;
}

#[tokio::test]
async fn the_cron_service_materializes_with_keys_required() {
    let c = cluster().await;
    let admin = c.client(Some(&c.root), "a").await;
    admin.register_definition(DEF).await.unwrap();
    let req = kairos_proto::v1::CreateCronJobRequest {
        cron_job_id: "every-second".into(),
        definition_uri: "registry://jobs/job".into(),
        definition_version: 1,
        expression: "* * * * * *".into(),
        timezone: "UTC".into(),
        ..Default::default()
    };
    admin.create_cron_job(req).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let n: i64 = c.node.scheduler().status_counts("a").await.unwrap().iter().map(|x| x.1).sum();
        if n >= 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no occurrence materialized; cron shards owned: {:?}; runs {:?}",
            c.node.owned_cron_shards(),
            c.node
                .scheduler()
                .cron_runs("a", "every-second", 10, None)
                .await
                .map(|p| p.executions.len())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn an_open_worker_stream_ends_once_its_key_is_revoked() {
    use kairos_proto::v1::{WorkOpen, WorkRequest};
    let c = cluster().await;
    let key = c.key("a", &["worker"]).await;
    let (tx, rx) = tokio::sync::mpsc::channel::<WorkRequest>(8);
    let open = WorkRequest {
        open: Some(WorkOpen {
            namespace: "a".into(),
            queue: "q".into(),
            worker_id: "w1".into(),
            credits: 1,
            lease_ms: 0,
        }),
        ..Default::default()
    };
    tx.send(open).await.unwrap();
    let mut raw =
        kairos_proto::v1::worker_service_client::WorkerServiceClient::connect(c.endpoint.clone())
            .await
            .unwrap();
    let mut req =
        tonic::Request::new(tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx));
    req.metadata_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
    let mut stream = raw.work(req).await.expect("the stream opens").into_inner();
    // Still valid: a credit message changes nothing.
    tx.send(WorkRequest { credits: 1, ..Default::default() }).await.unwrap();
    let id = key.split('_').nth(1).unwrap().to_string();
    c.client(Some(&c.root), "a").await.revoke_api_key(&id).await.unwrap();
    // Past the key cache's time, the next message finds the key revoked: the stream ends.
    tokio::time::sleep(Duration::from_millis(kairos_actors::server::auth::CACHE_MS as u64 + 200))
        .await;
    tx.send(WorkRequest { credits: 1, ..Default::default() }).await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(s) => return Some(s),
            }
        }
    })
    .await
    .expect("the stream ends");
    let s = end.expect("with an error");
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    assert!(s.message().contains("revoked"), "{s:?}");
}

async fn three_far_submits_in_each(
    root_a: &kairos_sdk::Client,
    root_b: &kairos_sdk::Client,
) -> Vec<String> {
    let mut b_ids = Vec::new();
    for _ in 0..3 {
        root_a
            .submit("registry://jobs/job", 1)
            .after(Duration::from_secs(3600))
            .send()
            .await
            .unwrap();
        let s = root_b
            .submit("registry://jobs/job", 1)
            .after(Duration::from_secs(3600))
            .send()
            .await
            .unwrap();
        b_ids.push(s.execution_id);
    }
    b_ids
}

async fn a_batch_item_for_another_namespace_fails_alone(c: &Cluster, a: &kairos_sdk::Client) {
    // A batch: the item for b fails alone.
    let item = |ns: &str| kairos_proto::v1::SubmitRequest {
        namespace: ns.into(),
        definition_uri: "registry://jobs/job".into(),
        definition_version: 1,
        when: Some(kairos_proto::v1::submit_request::When::DelayMs(60_000)),
        ..Default::default()
    };
    let items = a.submit_batch(vec![item("a"), item("b")]).await.unwrap();
    use kairos_proto::v1::submit_batch_item::Result as Item;
    assert!(matches!(items[0], Item::Ok(_)), "{items:?}");
    assert!(
        matches!(&items[1], Item::Error(e) if e.code == Code::PermissionDenied as i32),
        "{items:?}"
    );
    assert_eq!(
        c.node.scheduler().status_counts("b").await.unwrap().iter().map(|x| x.1).sum::<i64>(),
        3
    );
}

async fn over_http_the_same(c: &Cluster, key_a: &str, b_id: &str) {
    // HTTP: the same.
    let (s, body) = c.http("GET", "/executions?limit=1", Some(key_a), "a", "").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let cursor = body["nextCursor"].as_str().unwrap().to_string();
    let (s, body) = c.http("GET", "/executions", Some(key_a), "b", "").await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "PERMISSION_DENIED");
    let uri = format!("/executions?cursor={cursor}");
    assert_eq!(c.http("GET", &uri, Some(key_a), "b", "").await.0, StatusCode::FORBIDDEN);
    let uri = format!("/executions/{}", b_id);
    assert_eq!(c.http("GET", &uri, Some(key_a), "b", "").await.0, StatusCode::FORBIDDEN);
    assert_eq!(c.http("DELETE", &uri, Some(key_a), "b", "").await.0, StatusCode::FORBIDDEN);
    assert_eq!(c.http("GET", "/definitions", Some(key_a), "b", "").await.0, StatusCode::FORBIDDEN);
    assert_eq!(c.http("GET", "/cron-jobs", Some(key_a), "b", "").await.0, StatusCode::FORBIDDEN);
    assert_eq!(c.http("GET", &uri, Some(key_a), "a", "").await.0, StatusCode::NOT_FOUND);
}

async fn keys_are_managed_over_http_too(c: &Cluster, admin_a: &str) {
    // HTTP key management.
    let (s, body) = c
        .http(
            "POST",
            "/admin/keys",
            Some(admin_a),
            "a",
            r#"{"namespace": "a", "scopes": ["worker"]}"#,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    assert!(body["token"].as_str().unwrap().starts_with("kai_"));
    let (s, _) = c
        .http(
            "POST",
            "/admin/keys",
            Some(admin_a),
            "a",
            r#"{"namespace": "b", "scopes": ["worker"]}"#,
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
}

/// Opens a `Work` stream of namespace `a`, queue `job`, with `credits`: the sender (which the
/// test may keep silent or drop) and the responses.
async fn work_stream(
    c: &Cluster,
    key: &str,
    credits: u32,
) -> (
    tokio::sync::mpsc::Sender<kairos_proto::v1::WorkRequest>,
    tonic::Streaming<kairos_proto::v1::WorkResponse>,
) {
    use kairos_proto::v1::{WorkOpen, WorkRequest};
    let (tx, rx) = tokio::sync::mpsc::channel::<WorkRequest>(8);
    let open = WorkOpen {
        namespace: "a".into(),
        queue: "job".into(),
        worker_id: "w1".into(),
        credits,
        lease_ms: 0,
    };
    tx.send(WorkRequest { open: Some(open), ..Default::default() }).await.unwrap();
    let mut raw =
        kairos_proto::v1::worker_service_client::WorkerServiceClient::connect(c.endpoint.clone())
            .await
            .unwrap();
    let mut req =
        tonic::Request::new(tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx));
    req.metadata_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
    (tx, raw.work(req).await.expect("the stream opens").into_inner())
}

/// Reads `stream` to its end (at most 10 s): the tasks it delivered and how it ended.
async fn until_end(
    stream: &mut tonic::Streaming<kairos_proto::v1::WorkResponse>,
) -> (usize, Option<tonic::Status>) {
    let mut tasks = 0;
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.message().await {
                Ok(Some(m)) => tasks += m.tasks.len(),
                Ok(None) => return None,
                Err(s) => return Some(s),
            }
        }
    })
    .await
    .expect("the stream ends");
    (tasks, end)
}

#[tokio::test]
async fn a_silent_worker_stream_gets_no_work_once_its_key_is_revoked() {
    let c = cluster().await;
    let root_a = c.client(Some(&c.root), "a").await;
    root_a.register_definition(DEF).await.unwrap();
    let key = c.key("a", &["worker"]).await;
    // Many credits, and then the worker never sends again.
    let (_tx, mut stream) = work_stream(&c, &key, 50).await;
    let id = key.split('_').nth(1).unwrap().to_string();
    root_a.revoke_api_key(&id).await.unwrap();
    // Past the key cache's time, work arrives for the stream's queue.
    tokio::time::sleep(Duration::from_millis(kairos_actors::server::auth::CACHE_MS as u64 + 200))
        .await;
    for _ in 0..5 {
        root_a.submit("registry://jobs/job", 1).send().await.unwrap();
    }
    let (tasks, end) = until_end(&mut stream).await;
    assert_eq!(tasks, 0, "a revoked key received work");
    let s = end.expect("ended with an error");
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    assert!(s.message().contains("revoked"), "{s:?}");
    // The executions were not lost: a live key's stream gets them.
    let live = c.key("a", &["worker"]).await;
    let (_tx, mut stream) = work_stream(&c, &live, 50).await;
    let mut got = 0;
    while got < 5 {
        let m = tokio::time::timeout(Duration::from_secs(10), stream.message()).await;
        got += m.expect("the executions reach a live worker").unwrap().unwrap().tasks.len();
    }
}

#[tokio::test]
async fn a_stream_the_worker_half_closes_is_not_told_the_node_drains() {
    let c = cluster().await;
    let key = c.key("a", &["worker"]).await;
    let (tx, mut stream) = work_stream(&c, &key, 1).await;
    drop(tx);
    let (tasks, end) = until_end(&mut stream).await;
    assert_eq!(tasks, 0);
    assert!(end.is_none(), "a clean end, not {end:?}");
}
