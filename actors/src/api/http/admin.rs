//! API keys, the audit log, the caller and a namespace's limits over HTTP: the gRPC
//! `AdminService` calls (same checks, same errors), with the `Authorization` header as their
//! metadata and JSON in camelCase.
//!
//! | route | call |
//! |---|---|
//! | `POST /admin/keys` `{namespace, scopes, name}` | create a key: 201 with the token, once |
//! | `GET /admin/keys[?namespace=]` | list keys |
//! | `DELETE /admin/keys/{id}` | revoke a key |
//! | `GET /audit[?from=&limit=]` (namespace header; `*` for all-namespace keys) | the audit log |
//! | `GET /whoami` | the caller |
//! | `GET /limits` (namespace header) | quotas, retention, pending executions |
//! | `GET /queues` (namespace header, `*` for all; none: the key's) | READY work and workers per queue |

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use kairos_proto::v1 as api;
use kairos_proto::v1::admin_service_server::AdminService;
use serde::Deserialize;
use serde_json::{Value, json};

use super::input::{json_body, query_error};
use crate::api::errors;
use crate::api::errors::http_response as error_response;
use crate::api::grpc::Api;
use crate::api::json::parse_rfc3339;
use crate::api::json::rfc3339;
use crate::node::Node;

/// A gRPC request carrying the HTTP request's `Authorization` header.
fn request<T>(headers: &HeaderMap, message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    if let Some(v) = headers.get(header::AUTHORIZATION)
        && let Ok(v) = tonic::metadata::MetadataValue::try_from(v.as_bytes())
    {
        r.metadata_mut().insert("authorization", v);
    }
    r
}

/// A gRPC status as the HTTP API's error answer.
fn status_response(s: &tonic::Status) -> Response {
    use tonic::Code;
    let http = match s.code() {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted | Code::FailedPrecondition => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    // "field: reason" messages of invalid arguments name their field.
    let field = (s.code() == Code::InvalidArgument)
        .then(|| s.message().split_once(": ").map(|(f, _)| f.to_string()))
        .flatten();
    (http, Json(errors::body(s.code(), field, s.message().to_string()))).into_response()
}

fn ms(at: i64) -> Value {
    if at == 0 { Value::Null } else { json!(rfc3339(at)) }
}

fn key_view(k: &api::ApiKey) -> Value {
    json!({
        "id": k.id,
        "namespace": k.namespace,
        "scopes": k.scopes,
        "name": k.name,
        "createdAt": ms(k.created_at_ms),
        "createdBy": k.created_by,
        "revokedAt": ms(k.revoked_at_ms),
        "revokedBy": if k.revoked_by.is_empty() { Value::Null } else { json!(k.revoked_by) },
    })
}

/// The body of `POST /admin/keys`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateKeyBody {
    namespace: String,
    scopes: Vec<String>,
    #[serde(default)]
    name: String,
}

async fn create_key(State(node): State<Node>, headers: HeaderMap, body: Bytes) -> Response {
    let api = Api::new(node);
    // Authenticated before the body is read: a caller without a key learns nothing from it.
    if let Err(s) = api.principal(&request(&headers, ())).await {
        return status_response(&s);
    }
    let b: CreateKeyBody = match json_body(&body) {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    let msg = api::CreateApiKeyRequest { namespace: b.namespace, scopes: b.scopes, name: b.name };
    match api.create_api_key(request(&headers, msg)).await {
        Ok(r) => {
            let r = r.into_inner();
            let key = r.key.as_ref().map(key_view).unwrap_or(Value::Null);
            (StatusCode::CREATED, Json(json!({ "key": key, "token": r.token }))).into_response()
        }
        Err(s) => status_response(&s),
    }
}

/// Query of `GET /admin/keys`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListKeysParams {
    namespace: Option<String>,
}

async fn list_keys(
    State(node): State<Node>,
    headers: HeaderMap,
    params: Result<Query<ListKeysParams>, QueryRejection>,
) -> Response {
    let api = Api::new(node);
    if let Err(s) = api.principal(&request(&headers, ())).await {
        return status_response(&s);
    }
    let p = match params {
        Ok(Query(p)) => p,
        Err(e) => return error_response(&query_error(e)),
    };
    let msg = api::ListApiKeysRequest { namespace: p.namespace.unwrap_or_default() };
    match api.list_api_keys(request(&headers, msg)).await {
        Ok(r) => {
            let keys: Vec<Value> = r.into_inner().keys.iter().map(key_view).collect();
            Json(json!({ "keys": keys })).into_response()
        }
        Err(s) => status_response(&s),
    }
}

async fn revoke_key(
    State(node): State<Node>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let api = Api::new(node);
    match api.revoke_api_key(request(&headers, api::RevokeApiKeyRequest { id })).await {
        Ok(r) => {
            Json(r.into_inner().key.as_ref().map(key_view).unwrap_or(Value::Null)).into_response()
        }
        Err(s) => status_response(&s),
    }
}

/// Query of `GET /audit`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditParams {
    /// RFC 3339.
    from: Option<String>,
    limit: Option<u32>,
}

async fn audit(
    State(node): State<Node>,
    headers: HeaderMap,
    params: Result<Query<AuditParams>, QueryRejection>,
) -> Response {
    let api = Api::new(node);
    if let Err(s) = api.principal(&request(&headers, ())).await {
        return status_response(&s);
    }
    let p = match params {
        Ok(Query(p)) => p,
        Err(e) => return error_response(&query_error(e)),
    };
    let from_ms = match p.from.as_deref().map(parse_rfc3339).transpose() {
        Ok(v) => v.unwrap_or(0),
        Err(r) => return error_response(&kairos_layer::ops::error::invalid("from", r)),
    };
    // `*` (key changes of all-namespace keys) is not a namespace name: read it as is.
    let namespace = match headers.get("kairos-namespace").map(|v| v.to_str()) {
        Some(Ok("*")) => "*".to_string(),
        _ => match super::input::namespace(&headers) {
            Ok(ns) => ns,
            Err(e) => return error_response(&e),
        },
    };
    let msg = api::AuditLogRequest { namespace, from_ms, limit: p.limit.unwrap_or(0) };
    match api.audit_log(request(&headers, msg)).await {
        Ok(r) => {
            let entries: Vec<Value> = r
                .into_inner()
                .entries
                .iter()
                .map(|e| {
                    json!({
                        "namespace": e.namespace,
                        "at": ms(e.at_ms),
                        "who": e.who,
                        "action": e.action,
                        "target": e.target,
                        "detail": e.detail,
                    })
                })
                .collect();
            Json(json!({ "entries": entries })).into_response()
        }
        Err(s) => status_response(&s),
    }
}

async fn whoami(State(node): State<Node>, headers: HeaderMap) -> Response {
    match Api::new(node).who_am_i(request(&headers, api::Empty {})).await {
        Ok(r) => {
            let r = r.into_inner();
            Json(json!({
                "who": r.who,
                "namespace": r.namespace,
                "scopes": r.scopes,
                "authentication": r.authentication,
            }))
            .into_response()
        }
        Err(s) => status_response(&s),
    }
}

async fn limits(State(node): State<Node>, headers: HeaderMap) -> Response {
    let api = Api::new(node);
    if let Err(s) = api.principal(&request(&headers, ())).await {
        return status_response(&s);
    }
    let namespace = match super::input::namespace(&headers) {
        Ok(ns) => ns,
        Err(e) => return error_response(&e),
    };
    match api.limits(request(&headers, api::LimitsRequest { namespace })).await {
        Ok(r) => {
            let r = r.into_inner();
            Json(json!({
                "namespace": r.namespace,
                "submitPerS": r.submit_per_s,
                "pendingMax": r.pending_max,
                "pending": r.pending,
                "retentionDays": r.retention_days,
                "inputBytesMax": r.input_bytes_max,
                "outputBytesMax": r.output_bytes_max,
                "definitionBytesMax": r.definition_bytes_max,
            }))
            .into_response()
        }
        Err(s) => status_response(&s),
    }
}

async fn queues(State(node): State<Node>, headers: HeaderMap) -> Response {
    let api = Api::new(node);
    if let Err(s) = api.principal(&request(&headers, ())).await {
        return status_response(&s);
    }
    // No header: the key's namespace; `*`: every namespace.
    let namespace = match headers.get("kairos-namespace").map(|v| v.to_str()) {
        None => String::new(),
        Some(Ok("*")) => "*".to_string(),
        _ => match super::input::namespace(&headers) {
            Ok(ns) => ns,
            Err(e) => return error_response(&e),
        },
    };
    match api.queues(request(&headers, api::QueuesRequest { namespace })).await {
        Ok(r) => {
            let r = r.into_inner();
            let queues: Vec<Value> = r.queues.iter().map(queue_view).collect();
            Json(json!({ "queues": queues, "truncated": r.truncated })).into_response()
        }
        Err(s) => status_response(&s),
    }
}

fn queue_view(q: &api::QueueInfo) -> Value {
    json!({
        "namespace": q.namespace,
        "queue": q.queue,
        "depth": q.depth,
        "depthCapped": q.depth_capped,
        "oldestReadyAt": ms(q.oldest_ready_at_ms),
        "oldestReadyAgeSeconds": q.oldest_ready_age_ms as f64 / 1000.0,
        "workers": q.workers,
        "creditsFree": q.credits_free,
    })
}

/// The admin routes.
pub(super) fn routes() -> Router<Node> {
    Router::new()
        .route("/admin/keys", get(list_keys).post(create_key))
        .route("/admin/keys/{id}", delete(revoke_key))
        .route("/audit", get(audit))
        .route("/whoami", get(whoami))
        .route("/limits", get(limits))
        .route("/queues", get(queues))
}
