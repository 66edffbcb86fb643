//! `/cron-jobs`: the cron service over HTTP/JSON (camelCase, times in RFC 3339), beside the
//! seed's `/executions`. Errors are the API's: 400 naming the field, 404, 409.
//!
//! | route | does |
//! |---|---|
//! | `POST /cron-jobs` | create (201; 200 for an identical repeat with the same `cronJobId`) |
//! | `GET /cron-jobs?limit=&cursor=` | list |
//! | `GET /cron-jobs/{id}` / `PATCH` / `DELETE` | get / change the given fields / delete (204) |
//! | `POST /cron-jobs/{id}/pause`, `POST /cron-jobs/{id}/resume` (`{"catchUp": true}`) | pause / resume |
//! | `POST /cron-jobs/{id}/backfill` (`{"from", "until", "overlap"}`) | backfill a past range |
//! | `POST /cron-jobs/{id}/trigger` (`{"overlap"}`, optional) | run it now, outside its schedule |
//! | `GET /cron-jobs/{id}/runs?limit=&cursor=` | the executions of its occurrences |
//! | `GET /cron-preview?expression=&timezone=&from=&until=&dstGap=&dstFold=&limit=` | occurrences of an expression |

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kairos_layer::ops::cron::CronPatch;
use kairos_layer::ops::{self, error::invalid};
use kairos_proto::v1 as api;
use serde::Deserialize;
use serde_json::{Value, json};

use super::input::authorized;
use super::reply::{hex_decode, hex_encode, respond};
use crate::api::errors::http_response as error_response;
use crate::api::grpc::cron::{cron_job, inputs_bytes, stored_policies};
use crate::api::json::{self, parse_rfc3339, rfc3339};
use crate::node::Node;
use crate::server::auth::Scope;

/// The JSON view of a cron job (the SDK's, as `kairosctl --json` prints it).
fn view(j: &kairos_proto::storage::v1::CronJob) -> Value {
    kairos_sdk::views::cron_job(&cron_job(j))
}

/// Policies in a request body.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PoliciesBody {
    dst_gap: Option<String>,
    dst_fold: Option<String>,
    missed: Option<String>,
    catch_up_window_ms: Option<i64>,
    overlap: Option<String>,
    pause_on_failure: Option<bool>,
    jitter_ms: Option<i64>,
}

/// The body of `POST /cron-jobs` and `PATCH /cron-jobs/{id}` (all optional for PATCH).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JobBody {
    cron_job_id: Option<String>,
    definition_uri: Option<String>,
    definition_version: Option<u32>,
    inputs: Option<Value>,
    expression: Option<String>,
    timezone: Option<String>,
    policies: Option<PoliciesBody>,
    start_at: Option<String>,
    end_at: Option<String>,
    remaining_runs: Option<u32>,
    notes: Option<String>,
    paused: Option<bool>,
}

fn parse<T: for<'a> Deserialize<'a> + Default>(body: &[u8]) -> Result<T, ops::Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    super::input::json_body(body)
}

fn time(field: &str, v: &Option<String>) -> Result<Option<i64>, ops::Error> {
    match v {
        None => Ok(None),
        Some(s) if s.is_empty() => Ok(Some(0)),
        Some(s) => parse_rfc3339(s).map(Some).map_err(|r| invalid(field, r)),
    }
}

fn inputs_json(v: &Option<Value>) -> Result<String, ops::Error> {
    Ok(v.as_ref().map(Value::to_string).unwrap_or_default())
}

async fn create(State(node): State<Node>, headers: HeaderMap, body: Bytes) -> Response {
    let r = async {
        let (ns, _) = authorized(&node, &headers, Scope::Submit).await?;
        let b: JobBody = parse(&body)?;
        let p = b.policies.unwrap_or_default();
        let req = api::CreateCronJobRequest {
            namespace: ns.clone(),
            cron_job_id: b.cron_job_id.unwrap_or_default(),
            definition_uri: b
                .definition_uri
                .ok_or_else(|| invalid("definitionUri", "is required"))?,
            definition_version: b
                .definition_version
                .ok_or_else(|| invalid("definitionVersion", "is required"))?,
            inputs_json: inputs_json(&b.inputs)?,
            expression: b.expression.ok_or_else(|| invalid("expression", "is required"))?,
            timezone: b
                .timezone
                .ok_or_else(|| invalid("timezone", "is required: an IANA zone such as UTC"))?,
            policies: Some(api::CronPolicies {
                dst_gap: p.dst_gap.unwrap_or_default(),
                dst_fold: p.dst_fold.unwrap_or_default(),
                missed: p.missed.unwrap_or_default(),
                catch_up_window_ms: p.catch_up_window_ms,
                overlap: p.overlap.unwrap_or_default(),
                pause_on_failure: p.pause_on_failure.unwrap_or_default(),
                jitter_ms: p.jitter_ms.unwrap_or_default(),
            }),
            start_at_ms: time("startAt", &b.start_at)?.unwrap_or(0),
            end_at_ms: time("endAt", &b.end_at)?.unwrap_or(0),
            remaining_runs: b.remaining_runs.unwrap_or(0),
            notes: b.notes.unwrap_or_default(),
            paused: b.paused.unwrap_or(false),
        };
        let spec = kairos_proto::storage::v1::CronJob {
            namespace: req.namespace.clone(),
            id: req.cron_job_id.clone(),
            definition_name: kairos_layer::definition::parse_definition_uri(&req.definition_uri)
                .map_err(|e| invalid(e.field(), e.reason()))?,
            definition_version: req.definition_version,
            inputs_json: inputs_bytes(&req.inputs_json)?,
            expression: req.expression.clone(),
            timezone: req.timezone.clone(),
            policies: Some(stored_policies(req.policies.clone())),
            start_at_ms: req.start_at_ms,
            end_at_ms: req.end_at_ms,
            remaining_runs: (req.remaining_runs != 0).then_some(req.remaining_runs),
            notes: req.notes.clone(),
            ..Default::default()
        };
        node.create_cron_job(spec, req.paused).await
    }
    .await;
    match r {
        Ok((j, created)) => {
            let status = if created { StatusCode::CREATED } else { StatusCode::OK };
            (status, axum::Json(view(&j))).into_response()
        }
        Err(e) => error_response(&e),
    }
}

async fn update(
    State(node): State<Node>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    respond(
        async {
            let (ns, _) = authorized(&node, &headers, Scope::Submit).await?;
            let b: JobBody = parse(&body)?;
            if b.cron_job_id.is_some() || b.paused.is_some() {
                return Err(invalid(
                    "body",
                    "cronJobId and paused cannot be changed here (pause and resume have routes)",
                ));
            }
            let p = b.policies.unwrap_or_default();
            let definition = match &b.definition_uri {
                Some(u) => Some(
                    kairos_layer::definition::parse_definition_uri(u)
                        .map_err(|e| invalid(e.field(), e.reason()))?,
                ),
                None => None,
            };
            let inputs = match &b.inputs {
                Some(v) => {
                    Some(serde_json::from_slice(&inputs_bytes(&v.to_string())?).unwrap_or_default())
                }
                None => None,
            };
            let patch = CronPatch {
                definition,
                definition_version: b.definition_version,
                inputs,
                expression: b.expression,
                timezone: b.timezone,
                dst_gap: p.dst_gap,
                dst_fold: p.dst_fold,
                missed: p.missed,
                catch_up_window_ms: p.catch_up_window_ms,
                overlap: p.overlap,
                pause_on_failure: p.pause_on_failure,
                jitter_ms: p.jitter_ms,
                start_at_ms: time("startAt", &b.start_at)?,
                end_at_ms: time("endAt", &b.end_at)?,
                remaining_runs: b.remaining_runs,
                notes: b.notes,
            };
            Ok(view(&node.update_cron_job(&ns, &id, patch).await?))
        }
        .await,
    )
}

async fn get_job(State(node): State<Node>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    respond(
        async {
            let (ns, _) = authorized(&node, &headers, Scope::Read).await?;
            Ok(view(&node.scheduler().get_cron_job(&ns, &id).await?))
        }
        .await,
    )
}

async fn delete(State(node): State<Node>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    match async {
        let (ns, _) = authorized(&node, &headers, Scope::Submit).await?;
        node.delete_cron_job(&ns, &id).await
    }
    .await
    {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => error_response(&e),
    }
}

async fn pause(State(node): State<Node>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    respond(
        async {
            let (ns, _) = authorized(&node, &headers, Scope::Submit).await?;
            Ok(view(&node.pause_cron_job(&ns, &id).await?))
        }
        .await,
    )
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ResumeBody {
    catch_up: Option<bool>,
}

async fn resume(
    State(node): State<Node>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    respond(
        async {
            let (ns, _) = authorized(&node, &headers, Scope::Submit).await?;
            let b: ResumeBody = parse(&body)?;
            Ok(view(&node.resume_cron_job(&ns, &id, b.catch_up.unwrap_or(false)).await?))
        }
        .await,
    )
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BackfillBody {
    from: Option<String>,
    until: Option<String>,
    overlap: Option<String>,
}

async fn backfill(
    State(node): State<Node>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    respond(
        async {
            let (ns, _) = authorized(&node, &headers, Scope::Submit).await?;
            let b: BackfillBody = parse(&body)?;
            let from = time("from", &b.from)?.ok_or_else(|| invalid("from", "is required"))?;
            let until = time("until", &b.until)?.ok_or_else(|| invalid("until", "is required"))?;
            let (j, occ) =
                node.backfill_cron_job(&ns, &id, from, until, b.overlap.as_deref()).await?;
            Ok(json!({
                "cronJob": view(&j),
                "occurrences": occ.iter().filter_map(|o| rfc3339(*o)).collect::<Vec<_>>(),
            }))
        }
        .await,
    )
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TriggerBody {
    overlap: Option<String>,
}

async fn trigger(
    State(node): State<Node>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    respond(
        async {
            let (ns, _) = authorized(&node, &headers, Scope::Submit).await?;
            let b: TriggerBody = if body.is_empty() { TriggerBody::default() } else { parse(&body)? };
            let (j, occurrence) = node.trigger_cron_job(&ns, &id, b.overlap.as_deref()).await?;
            let key = kairos_layer::cron::occurrence_key(&j.id, occurrence);
            Ok(json!({"cronJob": view(&j), "occurrence": rfc3339(occurrence), "idempotencyKey": key}))
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PageParams {
    limit: Option<usize>,
    cursor: Option<String>,
}

async fn list(
    State(node): State<Node>,
    headers: HeaderMap,
    params: Result<Query<PageParams>, QueryRejection>,
) -> Response {
    respond(
        async {
            let (ns, _) = authorized(&node, &headers, Scope::Read).await?;
            let Query(p) = params.map_err(super::input::query_error)?;
            let page = node
                .scheduler()
                .list_cron_jobs(&ns, p.limit.unwrap_or(0), p.cursor.as_deref())
                .await?;
            Ok(json!({
                "cronJobs": page.jobs.iter().map(view).collect::<Vec<_>>(),
                "nextCursor": page.next_cursor,
            }))
        }
        .await,
    )
}

async fn runs(
    State(node): State<Node>,
    headers: HeaderMap,
    Path(id): Path<String>,
    params: Result<Query<PageParams>, QueryRejection>,
) -> Response {
    respond(
        async {
        let (ns, _) = authorized(&node, &headers, Scope::Read).await?;
            let Query(p) = params.map_err(super::input::query_error)?;
            let cursor = match p.cursor.as_deref() {
                None => None,
                Some("") => None,
                Some(c) => Some(hex_decode(c).ok_or_else(|| invalid("cursor", "not a cursor from this API"))?),
            };
            let page = node
                .scheduler()
                .cron_runs(&ns, &id, p.limit.unwrap_or(0), cursor)
                .await?;
            Ok(json!({
                "executions": page.executions.iter().map(|e| json::execution(e, None)).collect::<Vec<_>>(),
                "nextCursor": page.next_cursor.map(|c| hex_encode(&c)),
                "unreadableIds": page.unreadable,
            }))
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PreviewParams {
    expression: Option<String>,
    timezone: Option<String>,
    from: Option<String>,
    until: Option<String>,
    dst_gap: Option<String>,
    dst_fold: Option<String>,
    limit: Option<u32>,
}

async fn preview(
    State(node): State<Node>,
    headers: HeaderMap,
    params: Result<Query<PreviewParams>, QueryRejection>,
) -> Response {
    respond(
        async {
            // Touches no namespace's data: any valid key may preview.
            let header = headers.get(axum::http::header::AUTHORIZATION).map(|v| v.as_bytes());
            node.auth().authenticate(header).await?;
            let Query(p) = params.map_err(super::input::query_error)?;
            let req = api::PreviewRequest {
                expression: p.expression.ok_or_else(|| invalid("expression", "is required"))?,
                timezone: p.timezone.unwrap_or_else(|| "UTC".into()),
                dst_gap: p.dst_gap.unwrap_or_default(),
                dst_fold: p.dst_fold.unwrap_or_default(),
                from_ms: time("from", &p.from)?.unwrap_or(0),
                until_ms: time("until", &p.until)?.unwrap_or(0),
                limit: p.limit.unwrap_or(0),
            };
            let now = node.scheduler().clock().now().as_millis();
            let occ = crate::api::grpc::cron::preview_occurrences(now, req).await?;
            Ok(json!({
                "occurrences": occ.iter().map(|o| json!({"utc": o.utc, "local": o.local})).collect::<Vec<_>>(),
            }))
        }
        .await,
    )
}

/// The cron routes.
pub(super) fn routes() -> Router<Node> {
    Router::new()
        .route("/cron-jobs", get(list).post(create))
        .route("/cron-jobs/{id}", get(get_job).patch(update).delete(delete))
        .route("/cron-jobs/{id}/pause", post(pause))
        .route("/cron-jobs/{id}/resume", post(resume))
        .route("/cron-jobs/{id}/backfill", post(backfill))
        .route("/cron-jobs/{id}/trigger", post(trigger))
        .route("/cron-jobs/{id}/runs", get(runs))
        .route("/cron-preview", get(preview))
}
