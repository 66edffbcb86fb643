//! What the cluster is doing, over HTTP, for the console's overview and operators:
//!
//! | route | scope | what |
//! |---|---|---|
//! | `GET /queues` (namespace header) | `read` | the namespace's queues with READY work: depth (counted up to a bound) and the oldest READY age |
//! | `GET /workers` (namespace header) | `read` | the workers waiting on **this node** in the namespace: worker id, stream or poll, credits per queue |
//! | `GET /last-hour` | `read` | **this node's** last 60 minutes, per minute: executions finished, first attempts started and their lateness p50 / p99 |
//! | `GET /admin/nodes` | `admin` on every namespace | the live nodes and the execution shards' leases |
//! | `GET /admin/quarantined[?limit=]` | `admin` on every namespace | timers put aside as unprocessable |

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use kairos_layer::keys::Space;
use kairos_layer::ops::{self, access::ALL_NAMESPACES};
use serde::Deserialize;
use serde_json::{Value, json};

use super::input::{authorized, query_error};
use super::reply::respond;
use crate::api::json::rfc3339;
use crate::node::Node;
use crate::server::auth::Scope;

fn at(ms: i64) -> Value {
    if ms == 0 { Value::Null } else { json!(rfc3339(ms)) }
}

async fn workers(State(node): State<Node>, headers: HeaderMap) -> Response {
    respond(
        async {
            let (ns, _) = authorized(&node, &headers, Scope::Read).await?;
            let workers: Vec<Value> = node
                .workers()
                .into_iter()
                .filter(|w| w.namespace == ns)
                .map(|w| {
                    json!({
                        "queue": w.queue,
                        "workerId": w.worker_id,
                        "kind": if w.poll { "poll" } else { "stream" },
                        "credits": w.credits,
                        "queueLimit": w.limit,
                    })
                })
                .collect();
            Ok::<_, ops::Error>(json!({ "node": node.node_id(), "workers": workers }))
        }
        .await,
    )
}

async fn last_hour(State(node): State<Node>, headers: HeaderMap) -> Response {
    respond(
        async {
            authorized(&node, &headers, Scope::Read).await?;
            let minutes: Vec<Value> = node
                .last_hour()
                .iter()
                .map(|m| {
                    let q = |v: Option<Option<u64>>| match v {
                        None => Value::Null,
                        Some(None) => json!("over 600000"),
                        Some(Some(ms)) => json!(ms),
                    };
                    json!({
                        "start": rfc3339(m.start_ms),
                        "completions": m.completions,
                        "started": m.started,
                        "latenessP50Ms": q(m.p50_ms),
                        "latenessP99Ms": q(m.p99_ms),
                    })
                })
                .collect();
            Ok::<_, ops::Error>(json!({ "node": node.node_id(), "minutes": minutes }))
        }
        .await,
    )
}

async fn nodes(State(node): State<Node>, headers: HeaderMap) -> Response {
    respond(
        async {
            let (_, caller) = authorized(&node, &headers, Scope::Read).await?;
            caller.allow(ALL_NAMESPACES, Scope::Admin)?;
            let sched = node.scheduler();
            let nodes: Vec<Value> = sched
                .nodes()
                .await?
                .iter()
                .map(|n| {
                    json!({
                        "nodeId": n.node_id,
                        "httpAddress": n.address,
                        "grpcAddress": n.grpc_address,
                        "region": n.region,
                        "version": n.version,
                        "heartbeatAt": at(n.heartbeat_at_ms),
                        "startedAt": at(n.started_at_ms),
                    })
                })
                .collect();
            let leases: Vec<Value> = sched
                .partition_leases(Space::Executions)
                .await?
                .iter()
                .map(|l| {
                    json!({
                        "shard": l.partition,
                        "owner": l.owner,
                        "epoch": l.epoch,
                        "expiresAt": at(l.expires_at_ms),
                    })
                })
                .collect();
            Ok::<_, ops::Error>(json!({
                "nodes": nodes,
                "shardCount": sched.partition_count(Space::Executions),
                "leases": leases,
            }))
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuarantinedParams {
    limit: Option<usize>,
}

async fn quarantined(
    State(node): State<Node>,
    headers: HeaderMap,
    params: Result<Query<QuarantinedParams>, QueryRejection>,
) -> Response {
    respond(
        async {
            let (_, caller) = authorized(&node, &headers, Scope::Read).await?;
            caller.allow(ALL_NAMESPACES, Scope::Admin)?;
            let Query(p) = params.map_err(query_error)?;
            let records = node.scheduler().quarantined(p.limit.unwrap_or(100)).await?;
            let records: Vec<Value> = records
                .iter()
                .map(|q| {
                    json!({
                        "namespace": q.namespace,
                        "executionId": q.execution_id,
                        "reason": q.reason,
                        "at": at(q.at_ms),
                    })
                })
                .collect();
            Ok::<_, ops::Error>(json!({ "records": records }))
        }
        .await,
    )
}

/// The routes.
pub(super) fn routes() -> Router<Node> {
    Router::new()
        .route("/workers", get(workers))
        .route("/last-hour", get(last_hour))
        .route("/admin/nodes", get(nodes))
        .route("/admin/quarantined", get(quarantined))
}
