//! `/healthz` (liveness, and the cluster as this node sees it) and `/readyz` (readiness).

use std::fmt::Write as _;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use kairos_layer::kv::StoreHealth;

use crate::limits::HEALTHZ_CLUSTER_WAIT_MS;
use crate::node::Node;

/// `200 ok …` while the store takes writes (`200 unverified …` when it was opened after a
/// crash without verifying its pages: nothing shows it damaged, nothing showed it sound),
/// followed by one line per node of the cluster (region, shards, database, last commit,
/// heartbeat age); `503` with the reason while it refuses writes (a full disk: reads go on),
/// while it cannot be reached (a database down or cut off: it heals by itself), or after it
/// failed (the node is stopping).
pub(super) async fn healthz(State(node): State<Node>) -> Response {
    let (id, shards) = (node.node_id().to_string(), node.owned_shards().len());
    match node.store_health() {
        StoreHealth::Healthy => {
            let first = match node.store_doubt() {
                None => format!("ok node={id} shards={shards}\n"),
                Some(why) => format!(
                    "unverified node={id} shards={shards}: the store opened without verifying \
                     its pages ({why}); stop the node and run `kairos check` to verify it\n"
                ),
            };
            (first + &cluster_lines(&node).await).into_response()
        }
        StoreHealth::WritesRefused { reason } => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "30")],
            format!("writes-refused node={id} shards={shards}: {reason}\n"),
        )
            .into_response(),
        StoreHealth::Unavailable { reason } => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            format!("store-unavailable node={id} shards={shards}: {reason}\n"),
        )
            .into_response(),
        StoreHealth::Failed { reason } => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("failed node={id} shards={shards}: {reason}\n"),
        )
            .into_response(),
    }
}

/// `cluster nodes=N` then, per node, `  node=… region=… shard_leases=… database="…"
/// last_commit_ms=… heartbeat_age_ms=… version=…` — or why the list could not be read.
async fn cluster_lines(node: &Node) -> String {
    let wait = Duration::from_millis(HEALTHZ_CLUSTER_WAIT_MS);
    let nodes = match tokio::time::timeout(wait, node.cluster_nodes()).await {
        Ok(Ok(nodes)) => nodes,
        Ok(Err(e)) => return format!("cluster unknown: the nodes could not be read: {e}\n"),
        Err(_) => return format!("cluster unknown: the nodes were not read within {wait:?}\n"),
    };
    let mut out = format!("cluster nodes={}\n", nodes.len());
    for n in &nodes {
        let r = &n.record;
        let commit_ms = r.last_commit_us as f64 / 1000.0;
        let _ = writeln!(
            out,
            "  node={} region={} shard_leases={} database={:?} last_commit_ms={commit_ms:.3} \
             heartbeat_age_ms={} version={}",
            r.node_id, r.region, n.shards, r.database, n.heartbeat_age_ms, r.version
        );
    }
    out
}

/// Readiness, for a load balancer or an orchestrator: `200 ready …` once the store takes
/// writes and the node holds a shard lease (it fires and serves its share); `503 not-ready …`
/// with the reason before that (just started, no lease yet) and while the store is unhealthy.
/// `/healthz` is liveness: the process is up and says what it knows of its store.
pub(super) async fn readyz(State(node): State<Node>) -> Response {
    let (id, shards) = (node.node_id().to_string(), node.owned_shards().len());
    let why = match node.store_health() {
        StoreHealth::Healthy if shards > 0 => {
            return format!("ready node={id} shards={shards}\n").into_response();
        }
        StoreHealth::Healthy => "it holds no shard lease yet".to_string(),
        StoreHealth::WritesRefused { reason } => format!("the store refuses writes: {reason}"),
        StoreHealth::Unavailable { reason } => format!("the store cannot be reached: {reason}"),
        StoreHealth::Failed { reason } => format!("the store failed: {reason}"),
    };
    let body = format!("not-ready node={id} shards={shards}: {why}\n");
    (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")], body).into_response()
}
