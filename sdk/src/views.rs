//! The JSON view of each API object, one per object: the node's HTTP API answers with these and
//! `kairosctl --json` prints them, so a script sees the same fields, names and formats whichever
//! way it asks. camelCase names, times as RFC 3339 (UTC, milliseconds), absent values left out
//! (or `null` where the field is part of the object's shape, as `executeAt`).

use kairos_proto::v1::{
    Attempt, AttemptStatus, CronJob, CronStatus, Definition, Execution, ExecutionError,
    ExecutionStatus,
};
use serde::Serialize;
use serde_json::{Map, Value, json};

/// Milliseconds since the epoch as RFC 3339 (UTC, milliseconds); `None` for 0 (unset).
pub fn rfc3339(ms: i64) -> Option<String> {
    (ms != 0)
        .then(|| chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms))
        .flatten()
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// `SUCCEEDED` from `EXECUTION_STATUS_SUCCEEDED` (any of the API's status enums).
pub fn short_status(full: &str) -> &str {
    full.split_once("_STATUS_").map_or(full, |(_, s)| s)
}

/// The short name of an execution status (`RUNNING`).
pub fn execution_status(s: i32) -> String {
    short_status(ExecutionStatus::try_from(s).unwrap_or_default().as_str_name()).to_string()
}

fn json_or_null(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

fn nonempty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// A list cursor as the API writes it in JSON and URLs (lower-case hex); `None` at the end of
/// a list (an empty cursor).
pub fn cursor_text(cursor: &[u8]) -> Option<String> {
    (!cursor.is_empty()).then(|| cursor.iter().map(|x| format!("{x:02x}")).collect())
}

/// The bytes of a cursor [`cursor_text`] wrote; `None` if it is not hex.
pub fn parse_cursor(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// An error of an attempt or execution.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ErrorView {
    message: String,
    retryable: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    code: String,
}

fn error_view(e: &Option<ExecutionError>) -> Option<ErrorView> {
    e.as_ref().map(|e| ErrorView {
        message: e.message.clone(),
        retryable: e.retryable,
        code: e.code.clone(),
    })
}

/// An attempt.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct AttemptView {
    number: u32,
    status: String,
    worker_id: String,
    started_at: Option<String>,
    ended_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorView>,
}

fn attempt_view(a: &Attempt) -> AttemptView {
    AttemptView {
        number: a.number,
        status: short_status(AttemptStatus::try_from(a.status).unwrap_or_default().as_str_name())
            .to_string(),
        worker_id: a.worker_id.clone(),
        started_at: rfc3339(a.started_at_ms),
        ended_at: rfc3339(a.ended_at_ms),
        error: error_view(&a.error),
    }
}

/// An execution.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ExecutionView {
    execution_id: String,
    namespace: String,
    definition_uri: String,
    definition_version: u32,
    inputs: Value,
    execute_at: Option<String>,
    status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    idempotency_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cron_job_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cron_occurrence: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<String>,
    attempt_count: u32,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    cancel_requested: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempts: Option<Vec<AttemptView>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_reference: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorView>,
    created_at: Option<String>,
    updated_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_at: Option<String>,
}

/// The view of an execution, with its attempts when given (`get`).
pub fn execution(e: &Execution, attempts: Option<&[Attempt]>) -> Value {
    let v = ExecutionView {
        execution_id: e.execution_id.clone(),
        namespace: e.namespace.clone(),
        definition_uri: e.definition_uri.clone(),
        definition_version: e.definition_version,
        inputs: json_or_null(&e.inputs_json),
        execute_at: rfc3339(e.execute_at_ms),
        status: execution_status(e.status),
        idempotency_key: nonempty(&e.idempotency_key),
        cron_job_id: nonempty(&e.cron_job_id),
        cron_occurrence: rfc3339(e.cron_occurrence_ms),
        traceparent: nonempty(&e.traceparent),
        attempt_count: e.attempt_count,
        cancel_requested: e.cancel_requested && e.status != ExecutionStatus::Cancelled as i32,
        attempts: attempts.map(|a| a.iter().map(attempt_view).collect()),
        output: (!e.output_json.is_empty()).then(|| json_or_null(&e.output_json)),
        output_reference: nonempty(&e.output_reference),
        error: error_view(&e.error),
        created_at: rfc3339(e.created_at_ms),
        updated_at: rfc3339(e.updated_at_ms),
        finished_at: rfc3339(e.finished_at_ms),
    };
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// A duration as a definition file writes it (`30s`, `5m`, `250ms`).
pub fn duration_text(ms: u64) -> String {
    const DAY_MS: u64 = 86_400_000;
    let units = [(DAY_MS, "d"), (3_600_000, "h"), (60_000, "m"), (1_000, "s")];
    match units.iter().find(|(scale, _)| ms != 0 && ms.is_multiple_of(*scale)) {
        Some((scale, unit)) => format!("{}{unit}", ms / scale),
        None if ms == 0 => "0s".to_owned(),
        None => format!("{ms}ms"),
    }
}

/// The inputs of a definition as its file declares them: `name: type` when required without
/// a default or a description, the long form otherwise.
fn inputs_view(d: &Definition) -> Value {
    let inputs = d.inputs.iter().map(|i| {
        if i.required && i.default_json.is_empty() && i.description.is_empty() {
            return (i.name.clone(), Value::from(i.r#type.clone()));
        }
        let mut long = Map::new();
        long.insert("type".into(), i.r#type.clone().into());
        if !i.required && i.default_json.is_empty() {
            long.insert("required".into(), false.into());
        }
        if !i.default_json.is_empty() {
            long.insert("default".into(), json_or_null(&i.default_json));
        }
        if !i.description.is_empty() {
            long.insert("description".into(), i.description.clone().into());
        }
        (i.name.clone(), Value::Object(long))
    });
    Value::Object(inputs.collect())
}

/// The view of a definition: the file's own shape (name, version, description, inputs,
/// outputs, execution, queue, retry, timeouts) plus where it lives and when it was registered.
pub fn definition(d: &Definition) -> Value {
    let mut out = Map::new();
    out.insert("name".into(), d.name.clone().into());
    out.insert("version".into(), d.version.into());
    if !d.description.is_empty() {
        out.insert("description".into(), d.description.clone().into());
    }
    out.insert("inputs".into(), inputs_view(d));
    let outputs = d.outputs.iter().map(|o| {
        let ty = Value::from(o.r#type.clone());
        if o.description.is_empty() {
            return (o.name.clone(), ty);
        }
        (o.name.clone(), json!({"type": ty, "description": o.description}))
    });
    out.insert("outputs".into(), Value::Object(outputs.collect()));
    out.insert("execution".into(), json_or_null(&d.execution_json));
    out.insert("queue".into(), d.queue.clone().into());
    if let Some(r) = &d.retry_policy {
        let retry = json!({
            "max_attempts": r.max_attempts,
            "base_delay": duration_text(r.base_delay_ms),
            "max_delay": duration_text(r.max_delay_ms),
        });
        out.insert("retry".into(), retry);
    }
    let timeouts = json!({
        "attempt": duration_text(d.attempt_timeout_ms),
        "lease": duration_text(d.lease_ms),
    });
    out.insert("timeouts".into(), timeouts);
    out.insert("definitionUri".into(), format!("registry://jobs/{}", d.name).into());
    out.insert("namespace".into(), d.namespace.clone().into());
    out.insert("createdAt".into(), rfc3339(d.created_at_ms).map_or(Value::Null, Value::String));
    Value::Object(out)
}

/// The view of a cron job.
pub fn cron_job(j: &CronJob) -> Value {
    let p = j.policies.clone().unwrap_or_default();
    let status = short_status(CronStatus::try_from(j.status).unwrap_or_default().as_str_name());
    json!({
        "cronJobId": j.cron_job_id,
        "namespace": j.namespace,
        "definitionUri": j.definition_uri,
        "definitionVersion": j.definition_version,
        "inputs": json_or_null(&j.inputs_json),
        "expression": j.expression,
        "timezone": j.timezone,
        "policies": {
            "dstGap": p.dst_gap, "dstFold": p.dst_fold, "missed": p.missed,
            "catchUpWindowMs": p.catch_up_window_ms, "overlap": p.overlap,
            "pauseOnFailure": p.pause_on_failure, "jitterMs": p.jitter_ms,
        },
        "status": status,
        "nextRunAt": rfc3339(j.next_run_at_ms),
        "lastOccurrence": rfc3339(j.last_occurrence_ms),
        "lastExecutionId": nonempty(&j.last_execution_id),
        "startAt": rfc3339(j.start_at_ms),
        "endAt": rfc3339(j.end_at_ms),
        "remainingRuns": j.remaining_runs,
        "notes": j.notes,
        "pauseReason": nonempty(&j.pause_reason),
        "materializedCount": j.materialized_count,
        "skippedOverlapCount": j.skipped_overlap_count,
        "missedCount": j.missed_count,
        "waitingOccurrences": j.waiting_occurrences_ms.iter().filter_map(|o| rfc3339(*o)).collect::<Vec<_>>(),
        "createdAt": rfc3339(j.created_at_ms),
        "updatedAt": rfc3339(j.updated_at_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations_read_as_written() {
        assert_eq!(rfc3339(1_786_586_400_000).unwrap(), "2026-08-13T02:00:00.000Z");
        assert_eq!(rfc3339(0), None);
        assert_eq!(duration_text(30_000), "30s");
        assert_eq!(duration_text(250), "250ms");
        assert_eq!(duration_text(0), "0s");
        assert_eq!(short_status("CRON_STATUS_PAUSED"), "PAUSED");
        assert_eq!(cursor_text(&[0, 0xab]).unwrap(), "00ab");
        assert_eq!(parse_cursor("00AB").unwrap(), [0, 0xab]);
        assert_eq!((cursor_text(&[]), parse_cursor("0g")), (None, None));
    }

    #[test]
    fn an_execution_shows_what_it_carries_and_omits_what_it_lacks() {
        let e = Execution {
            execution_id: "E".into(),
            cron_job_id: "nightly".into(),
            cron_occurrence_ms: 1_786_586_400_000,
            idempotency_key: "k".into(),
            created_at_ms: 1,
            finished_at_ms: 2,
            inputs_json: r#"{"a":1}"#.into(),
            status: ExecutionStatus::Succeeded as i32,
            ..Execution::default()
        };
        let v = execution(&e, None);
        assert_eq!(v["cronJobId"], "nightly");
        assert_eq!(v["cronOccurrence"], "2026-08-13T02:00:00.000Z");
        assert_eq!(v["idempotencyKey"], "k");
        assert_eq!(v["status"], "SUCCEEDED");
        assert_eq!(v["inputs"], json!({"a": 1}));
        assert!(v.get("finishedAt").is_some() && v.get("createdAt").is_some());
        assert!(v.get("attempts").is_none() && v.get("output").is_none());
        assert_eq!(v["executeAt"], Value::Null, "part of the shape, null when unset");
    }
}
