//! The node's HTTP endpoint: the seed design's API (`POST /executions` with an
//! `Idempotency-Key` header, `GET` and `DELETE /executions/{executionId}`), definitions, cron
//! jobs (`/cron-jobs`, [`cron`]),
//! `/metrics` (Prometheus text) and `/healthz`. JSON is camelCase; errors are
//! `{"error": {"code", "field", "message"}}` with a 4xx for anything the caller got wrong.
//! The namespace is the `Kairos-Namespace` header (default `default`). See docs/api.md and
//! docs/openapi.yaml.

use std::net::SocketAddr;
use std::time::Duration;

use crate::limits::HTTP_BODY_BYTES_MAX;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kairos_layer::definition::parse_definition_uri;
use kairos_layer::ops::query::ListQuery;
use kairos_layer::ops::submit::SubmitRequest;
use kairos_layer::ops::{self, error::invalid};
use serde::Deserialize;
use serde_json::{Value, json};

pub(crate) use self::input::namespace;
use self::input::{authorized, json_body, query_error};
use self::reply::{hex_decode, hex_encode, respond};
use super::errors::{self, http_response as error_response};
use super::json::{self, parse_rfc3339};
use crate::node::Node;
use crate::server::auth::Scope;
use crate::server::conns::{self, ConnLimits, Gate};
use crate::server::tls::ServerTls;

mod admin;
mod cluster;
mod cron;
mod health;
mod input;
mod reply;

/// The body of `POST /executions`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SubmitBody {
    definition_uri: String,
    definition_version: u32,
    #[serde(default)]
    inputs: Option<Value>,
    /// RFC 3339; or give `delayMs` instead.
    #[serde(default)]
    execute_at: Option<String>,
    /// A delay counted by the node's clock (0 = now), instead of `executeAt`.
    #[serde(default)]
    delay_ms: Option<u64>,
}

fn parse_submit(headers: &HeaderMap, body: &[u8]) -> Result<SubmitRequest, ops::Error> {
    let ns = namespace(headers)?;
    let idempotency_key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map(str::to_string)
                .map_err(|_| invalid("Idempotency-Key", "must be printable ASCII"))?,
        ),
    };
    let b: SubmitBody = json_body(body)?;
    let name =
        parse_definition_uri(&b.definition_uri).map_err(|e| invalid(e.field(), e.reason()))?;
    let execute_at_ms = match (&b.execute_at, b.delay_ms) {
        (Some(at), None) => parse_rfc3339(at).map_err(|r| invalid("executeAt", r))?,
        (None, Some(_)) => 0,
        (None, None) => {
            return Err(invalid(
                "executeAt",
                "is required (or delayMs, counted by the node's clock)",
            ));
        }
        (Some(_), Some(_)) => {
            return Err(invalid("delayMs", "give executeAt or delayMs, not both"));
        }
    };
    Ok(SubmitRequest {
        namespace: ns,
        definition: name,
        definition_version: b.definition_version,
        inputs: b.inputs.unwrap_or_else(|| json!({})),
        execute_at_ms,
        delay_ms: b.delay_ms,
        idempotency_key,
        traceparent: headers.get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_string),
    })
}

async fn submit(State(node): State<Node>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = authorized(&node, &headers, Scope::Submit).await {
        return error_response(&e);
    }
    let req = match parse_submit(&headers, &body) {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let span = crate::server::telemetry::execution_span(
        "kairos.submit",
        req.traceparent.as_deref().unwrap_or(""),
    );
    let submitted = tracing::Instrument::instrument(node.submit(req), span.clone()).await;
    if let Ok(s) = &submitted {
        span.record("execution_id", s.execution.id.as_str());
    }
    match submitted {
        Ok(s) => {
            let status = if s.created { StatusCode::CREATED } else { StatusCode::OK };
            let loc = format!("/executions/{}", s.execution.id);
            (status, [(header::LOCATION, loc)], axum::Json(json::execution(&s.execution, None)))
                .into_response()
        }
        Err(e) => error_response(&e),
    }
}

/// Query of `GET /executions/{id}`: the page of its attempts.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AttemptsParams {
    attempts_cursor: Option<String>,
    attempts_limit: Option<u64>,
}

async fn get_execution(
    State(node): State<Node>,
    headers: HeaderMap,
    Path(id): Path<String>,
    params: Result<Query<AttemptsParams>, QueryRejection>,
) -> Response {
    respond(
        async {
            let ns = authorized(&node, &headers, Scope::Read).await?.0;
            let Query(q) = params.map_err(query_error)?;
            let (after, limit) =
                super::attempts_page(q.attempts_cursor.as_deref(), q.attempts_limit)?;
            let e = node.scheduler().get(&ns, &id).await?;
            let page = node.scheduler().attempts_page(&ns, &id, after, limit).await?;
            let mut view = json::execution(&e, Some(&page.attempts));
            // The cursor of the next page of attempts (`?attemptsCursor=`), if there may be more.
            if let (Some(next), Some(o)) = (page.next, view.as_object_mut()) {
                o.insert("attemptsNextCursor".into(), next.to_string().into());
            }
            Ok(view)
        }
        .await,
    )
}

/// `DELETE /executions/{id}`: 200 with the CANCELLED execution if it had not started; 202
/// with the RUNNING one (`cancelRequested: true`) if its worker was asked to stop; 409 once
/// finished.
async fn cancel(State(node): State<Node>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let r = async {
        let caller = authorized(&node, &headers, Scope::Submit).await?;
        node.cancel(&caller.0, &id, &caller.1.who).await
    }
    .await;
    match r {
        Ok(c) => {
            let status = if c.done { StatusCode::OK } else { StatusCode::ACCEPTED };
            (status, axum::Json(json::execution(&c.execution, None))).into_response()
        }
        Err(e) => error_response(&e),
    }
}

async fn replay(State(node): State<Node>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    respond(
        async {
            let caller = authorized(&node, &headers, Scope::Submit).await?;
            Ok(json::execution(&node.replay(&caller.0, &id, &caller.1.who).await?, None))
        }
        .await,
    )
}

/// Query of `GET /executions`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ListParams {
    status: Option<String>,
    definition: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
    idempotency_key: Option<String>,
    /// `execute_at` at or after (RFC 3339).
    from: Option<String>,
    /// `execute_at` before (RFC 3339).
    to: Option<String>,
}

/// An optional RFC 3339 query parameter `name` as ms.
fn time_param(name: &str, v: &Option<String>) -> Result<Option<i64>, ops::Error> {
    match v.as_deref().filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(t) => parse_rfc3339(t).map(Some).map_err(|m| invalid(name, m)),
    }
}

async fn list(
    State(node): State<Node>,
    headers: HeaderMap,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Response {
    let r = async {
        let (ns, _) = authorized(&node, &headers, Scope::Read).await?;
        let Query(p) = params.map_err(query_error)?;
        if let Some(key) = &p.idempotency_key {
            // The execution submitted with this key, as a one-item list (a client that lost
            // the reply to its POST).
            let e = node.scheduler().get_by_idempotency_key(&ns, key).await?;
            return Ok(json!({ "executions": [json::execution(&e, None)], "nextCursor": null }));
        }
        let status = match &p.status {
            None => None,
            Some(s) => Some(
                kairos_layer::state::parse_status(s)
                    .ok_or_else(|| invalid("status", format!("unknown status {s:?}")))?,
            ),
        };
        let cursor = match p.cursor.as_deref().filter(|c| !c.is_empty()) {
            None => None,
            Some(c) => {
                Some(hex_decode(c).ok_or_else(|| invalid("cursor", "not a cursor from this API"))?)
            }
        };
        let (from_ms, to_ms) = (time_param("from", &p.from)?, time_param("to", &p.to)?);
        if let (Some(f), Some(t)) = (from_ms, to_ms)
            && t <= f
        {
            return Err(invalid("to", "must be after from"));
        }
        let q = ListQuery {
            namespace: ns,
            status,
            definition: p.definition.clone(),
            from_ms,
            to_ms,
            limit: p.limit.unwrap_or(0),
            cursor,
        };
        let page = node.scheduler().list(&q).await?;
        let items: Vec<_> = page.executions.iter().map(|e| json::execution(e, None)).collect();
        Ok::<_, ops::Error>(json!({
            "executions": items,
            "nextCursor": page.next_cursor.map(|c| hex_encode(&c)),
            "unreadableIds": page.unreadable,
        }))
    }
    .await;
    match r {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn register_definition(
    State(node): State<Node>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let r = async {
        let caller = authorized(&node, &headers, Scope::Definitions).await?;
        node.check_definition_size(&caller.0, body.len())?;
        let def = super::parse_definition(body.to_vec()).await?;
        node.scheduler().register_definition(&caller.0, def, &caller.1.who).await
    }
    .await;
    match r {
        Ok((d, created)) => {
            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
            (status, axum::Json(json::definition(&d))).into_response()
        }
        Err(e) => error_response(&e),
    }
}

/// Query of `GET /definitions/{name}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VersionParam {
    version: Option<u32>,
}

async fn get_definition(
    State(node): State<Node>,
    headers: HeaderMap,
    Path(name): Path<String>,
    params: Result<Query<VersionParam>, QueryRejection>,
) -> Response {
    let r = async {
        let (ns, _) = authorized(&node, &headers, Scope::Read).await?;
        let Query(p) = params.map_err(query_error)?;
        // 0 is the latest, as over gRPC.
        let version = p.version.filter(|v| *v != 0);
        node.scheduler().get_definition(&ns, &name, version).await
    }
    .await;
    match r {
        Ok(d) => axum::Json(json::definition(&d)).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn list_definitions(State(node): State<Node>, headers: HeaderMap) -> Response {
    let r = async {
        node.scheduler().list_definitions(&authorized(&node, &headers, Scope::Read).await?.0).await
    }
    .await;
    match r {
        Ok(ds) => axum::Json(
            json!({ "definitions": ds.iter().map(json::definition).collect::<Vec<_>>() }),
        )
        .into_response(),
        Err(e) => error_response(&e),
    }
}

async fn metrics(State(node): State<Node>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, crate::server::metrics::CONTENT_TYPE)], node.metrics_text().await)
}

async fn not_found() -> Response {
    let body = errors::body(tonic::Code::NotFound, None, "no such route".into());
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

async fn method_not_allowed() -> Response {
    let body = errors::body(tonic::Code::Unimplemented, None, "method not allowed here".into());
    (StatusCode::METHOD_NOT_ALLOWED, axum::Json(body)).into_response()
}

/// Error answers made outside the handlers (a body over the limit, an extractor's rejection)
/// in the API's one JSON shape.
async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    // 4xx only: `/healthz` answers 503 in plain text on purpose.
    if !status.is_client_error() || is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_string();
    let (code, field) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            (tonic::Code::InvalidArgument, Some(format!("body over {HTTP_BODY_BYTES_MAX} bytes")))
        }
        _ => (tonic::Code::InvalidArgument, None),
    };
    let (field, message) = match field {
        Some(m) => (Some("body".to_string()), m),
        None => (None, if text.is_empty() { status.to_string() } else { text }),
    };
    let body = serde_json::to_vec(&errors::body(code, field, errors::shorten(message)))
        .unwrap_or_default();
    parts.headers.insert(header::CONTENT_TYPE, "application/json".parse().expect("a header"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body))
}

/// The routes of the node's HTTP endpoint: the API and the web console at `/ui/`
/// ([`super::console`], which calls the API in-process), with cookies not marked `Secure`.
pub fn router(node: Node) -> Router {
    router_with(node, false)
}

/// [`router`], the console's cookies `Secure` when `tls` (the listener serves TLS).
pub fn router_with(node: Node, tls: bool) -> Router {
    let api = api_router(node.clone());
    let metrics = node.metrics().clone();
    api.clone()
        .merge(super::console::router(api, node, tls))
        .layer(axum::middleware::from_fn(move |req, next| track(metrics.clone(), req, next)))
}

/// Counts a request in the node's request metrics by its route template (`_unmatched` when no
/// route matched).
async fn track(
    metrics: std::sync::Arc<crate::server::metrics::Metrics>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("_unmatched", |p| p.as_str())
        .to_string();
    let method = req.method().to_string();
    #[allow(clippy::disallowed_methods)] // a request's latency: wall time of real I/O
    let start = std::time::Instant::now();
    let resp = next.run(req).await;
    metrics.requests.http(&method, &route, resp.status().as_u16(), start.elapsed());
    resp
}

/// The API's routes alone.
fn api_router(node: Node) -> Router {
    Router::new()
        .route("/executions", get(list).post(submit))
        .route("/executions/{id}", get(get_execution).delete(cancel))
        .route("/executions/{id}/replay", axum::routing::post(replay))
        .route("/definitions", get(list_definitions).post(register_definition))
        .route("/definitions/{name}", get(get_definition))
        .merge(cron::routes())
        .merge(admin::routes())
        .merge(cluster::routes())
        .route("/metrics", get(metrics))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(HTTP_BODY_BYTES_MAX))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(node)
}

/// Binds `addr` and serves (plain TCP) until `shutdown` completes. Returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    node: Node,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_with(addr, node, None, shutdown).await
}

/// Binds `addr` and serves until `shutdown` completes: over TLS with `tls` (its HTTP
/// configuration, current at each accepted connection), plain TCP without. Returns the bound
/// address.
pub async fn serve_with(
    addr: SocketAddr,
    node: Node,
    tls: Option<ServerTls>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    serve_listener(listener, node, tls, shutdown)
}

/// Serves on a listener bound beforehand (`kairos serve` binds its ports before it starts the
/// node, so a port in use stops it before it takes any lease) until `shutdown` completes.
pub fn serve_listener(
    listener: tokio::net::TcpListener,
    node: Node,
    tls: Option<ServerTls>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let bound = listener.local_addr()?;
    let limits = ConnLimits::of(node.config());
    let header_timeout = Duration::from_millis(node.config().http_header_timeout_ms);
    let admitted = conns::accept(listener, Gate::new("http", limits));
    let app = router_with(node, tls.is_some());
    let task = match tls {
        None => tokio::spawn(conns::serve_http(admitted, app, header_timeout, shutdown)),
        Some(tls) => {
            let handshaken = crate::server::tls::accept(admitted, move || tls.http_config());
            tokio::spawn(conns::serve_http(handshaken, app, header_timeout, shutdown))
        }
    };
    Ok((bound, task))
}
