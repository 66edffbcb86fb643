//! The camelCase JSON views of the HTTP API, and RFC 3339 times.

use chrono::{DateTime, SecondsFormat, Utc};
use kairos_layer::definition::definition_uri;
use kairos_layer::state::short_name;
use kairos_proto::storage::v1::{Attempt, Execution, ExecutionError, JobDefinition};
use serde::Serialize;
use serde_json::Value;

/// Milliseconds since the epoch as RFC 3339 (UTC, milliseconds).
pub fn rfc3339(ms: i64) -> Option<String> {
    (ms != 0)
        .then(|| DateTime::<Utc>::from_timestamp_millis(ms))
        .flatten()
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
}

/// Parses an RFC 3339 timestamp (with offset) into milliseconds since the epoch.
pub fn parse_rfc3339(s: &str) -> Result<i64, String> {
    DateTime::parse_from_rfc3339(s).map(|t| t.timestamp_millis()).map_err(|e| {
        format!("must be an RFC 3339 timestamp like 2026-08-13T02:00:00Z ({e}), got {s:?}")
    })
}

/// An error of an attempt or execution.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorView {
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
pub struct AttemptView {
    number: u32,
    status: String,
    worker_id: String,
    started_at: Option<String>,
    ended_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorView>,
}

/// An execution.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionView {
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
    /// The cursor of the next page of attempts (`?attemptsCursor=`), if there may be more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts_next_cursor: Option<String>,
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

/// The view of an execution (with its attempts when given).
pub fn execution(e: &Execution, attempts: Option<&[Attempt]>) -> ExecutionView {
    ExecutionView {
        execution_id: e.id.clone(),
        namespace: e.namespace.clone(),
        definition_uri: definition_uri(&e.definition_name),
        definition_version: e.definition_version,
        inputs: serde_json::from_slice(&e.input_json).unwrap_or(Value::Null),
        execute_at: rfc3339(e.execute_at_ms),
        status: short_name(e.status().as_str_name()).to_string(),
        idempotency_key: (!e.idempotency_key.is_empty()).then(|| e.idempotency_key.clone()),
        cron_job_id: (!e.cron_job_id.is_empty()).then(|| e.cron_job_id.clone()),
        cron_occurrence: rfc3339(e.cron_occurrence_ms),
        traceparent: (!e.traceparent.is_empty()).then(|| e.traceparent.clone()),
        attempt_count: e.attempt_count,
        cancel_requested: e.cancel_requested
            && e.status != kairos_proto::storage::v1::ExecutionStatus::Cancelled as i32,
        attempts: attempts.map(|a| {
            a.iter()
                .map(|a| AttemptView {
                    number: a.number,
                    status: short_name(a.status().as_str_name()).to_string(),
                    worker_id: a.worker_id.clone(),
                    started_at: rfc3339(a.started_at_ms),
                    ended_at: rfc3339(a.ended_at_ms),
                    error: error_view(&a.error),
                })
                .collect()
        }),
        attempts_next_cursor: None,
        output: (!e.output_json.is_empty())
            .then(|| serde_json::from_slice(&e.output_json).unwrap_or(Value::Null)),
        output_reference: (!e.output_reference.is_empty()).then(|| e.output_reference.clone()),
        error: error_view(&e.error),
        created_at: rfc3339(e.created_at_ms),
        updated_at: rfc3339(e.updated_at_ms),
        finished_at: rfc3339(e.finished_at_ms),
    }
}

/// The view of a definition: the file's own shape plus where it lives.
pub fn definition(d: &JobDefinition) -> Value {
    let mut v = kairos_layer::definition::to_json(d);
    if let Some(m) = v.as_object_mut() {
        m.insert("definitionUri".into(), Value::String(definition_uri(&d.name)));
        m.insert("namespace".into(), Value::String(d.namespace.clone()));
        m.insert("createdAt".into(), rfc3339(d.created_at_ms).map_or(Value::Null, Value::String));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_and_bad_ones_are_explained() {
        let ms = parse_rfc3339("2026-08-13T02:00:00Z").unwrap();
        assert_eq!(rfc3339(ms).unwrap(), "2026-08-13T02:00:00.000Z");
        assert_eq!(parse_rfc3339("2026-08-13T04:00:00+02:00").unwrap(), ms);
        assert!(parse_rfc3339("2026-13-13T02:00:00Z").unwrap_err().contains("RFC 3339"));
        assert!(parse_rfc3339("tomorrow").is_err());
        assert_eq!(rfc3339(0), None);
    }
}
