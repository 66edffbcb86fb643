//! Workers' results and heartbeats as the node takes them, shared by the unary calls
//! ([`super::workers`]) and the `Work` stream ([`super::work`]): one acknowledgement per item,
//! in order; an item the caller may not report fails alone, in place.

use kairos_layer::ops::Error;
use kairos_layer::ops::error::invalid;
use kairos_layer::ops::worker::{Beat, Outcome, Report, check_report};
use kairos_proto::storage::v1 as storage;
use kairos_proto::v1::*;
use tonic::Status;

use super::{Api, status};
use crate::limits::WORK_MESSAGE_ITEMS_MAX;
use crate::server::auth::{Principal, Scope};

/// Who reports: the worker's id (may be empty) and, on a worker stream, the queue it serves.
pub(super) type Reporter<'a> = (&'a str, Option<&'a str>);

/// A worker's result as the layer takes it (the stream's namespace when it names none), bound
/// to the reporting worker and its queue.
fn report_of(ns: &str, (worker, queue): Reporter<'_>, r: TaskResult) -> Result<Report, Error> {
    let outcome = match r.outcome {
        Some(task_result::Outcome::Success(s)) => Outcome::Success {
            output_json: s.output_json.into_bytes(),
            output_reference: s.output_reference,
        },
        Some(task_result::Outcome::Failure(e)) => Outcome::Failure(storage::ExecutionError {
            message: e.message,
            retryable: e.retryable,
            code: e.code,
        }),
        Some(task_result::Outcome::Release(_)) => Outcome::Release,
        None => return Err(invalid("outcome", "is required: success, failure or release")),
    };
    let namespace = if r.namespace.is_empty() { ns.to_string() } else { r.namespace };
    Ok(Report {
        namespace,
        execution_id: r.execution_id,
        token: r.fencing_token,
        outcome,
        worker_id: (!worker.is_empty()).then(|| worker.to_string()),
        queue: queue.map(str::to_string),
    })
}

fn ack(id: String, r: Result<&storage::Execution, &Error>) -> ResultAck {
    match r {
        Ok(e) => ResultAck { execution_id: id, code: 0, message: String::new(), status: e.status },
        Err(err) => {
            let s = status(err);
            ResultAck {
                execution_id: id,
                code: s.code() as i32,
                message: s.message().to_string(),
                status: 0,
            }
        }
    }
}

/// Refuses `n` items of `field` (`results`, `heartbeats`) in one message when over
/// [`WORK_MESSAGE_ITEMS_MAX`]; checked before any of them is applied.
pub(super) fn within_message_limit(field: &str, n: usize) -> Result<(), Status> {
    if n <= WORK_MESSAGE_ITEMS_MAX {
        return Ok(());
    }
    let reason = format!(
        "{n} in one message, over the limit of {WORK_MESSAGE_ITEMS_MAX}; send them in several messages"
    );
    Err(status(&invalid(field, reason)))
}

/// A lease as asked (0: the definition's).
pub(super) fn lease_of(lease_ms: u64) -> Option<u64> {
    (lease_ms != 0).then_some(lease_ms)
}

impl Api {
    /// Applies results (batched with others on the node); one acknowledgement each, in order.
    /// A result the caller may not report, or without an outcome, fails alone, in place.
    pub(super) async fn report(
        &self,
        caller: &Principal,
        ns: &str,
        worker: Reporter<'_>,
        results: Vec<TaskResult>,
    ) -> Result<Vec<ResultAck>, Status> {
        within_message_limit("results", results.len())?;
        let ids: Vec<String> = results.iter().map(|r| r.execution_id.clone()).collect();
        let items = results
            .into_iter()
            .map(|r| {
                // Checked here, before the node merges it with other callers' results.
                report_of(ns, worker, r)
                    .and_then(|rep| caller.allow(&rep.namespace, Scope::Worker).map(|()| rep))
                    .and_then(|rep| check_report(&rep).map(|()| rep))
            })
            .collect();
        let out = self.node.report(items).await.map_err(|e| status(&e))?;
        for e in out.iter().flatten() {
            tracing::debug!(
                namespace = %e.namespace,
                execution_id = %e.id,
                attempt = e.attempt_count,
                status = kairos_layer::state::status_name(e.status),
                "result recorded"
            );
        }
        Ok(ids.into_iter().zip(out).map(|(id, r)| ack(id, r.as_ref())).collect())
    }

    /// Extends leases (batched with others on the node); one acknowledgement each.
    pub(super) async fn heartbeats(
        &self,
        ns: &str,
        (worker, queue): Reporter<'_>,
        refs: Vec<TaskRef>,
    ) -> Result<Vec<HeartbeatAck>, Status> {
        within_message_limit("heartbeats", refs.len())?;
        let now = self.node.scheduler().clock().now().as_millis();
        let beats: Vec<Beat> = refs
            .iter()
            .map(|r| Beat {
                namespace: ns.to_string(),
                execution_id: r.execution_id.clone(),
                token: r.fencing_token,
                worker_id: (!worker.is_empty()).then(|| worker.to_string()),
                queue: queue.map(str::to_string),
            })
            .collect();
        let out = self.node.heartbeat(beats).await.map_err(|e| status(&e))?;
        Ok(refs
            .into_iter()
            .zip(out)
            .map(|(r, h)| match h {
                Ok(h) => HeartbeatAck {
                    execution_id: r.execution_id,
                    code: 0,
                    lease_remaining_ms: u64::try_from(h.lease_expires_at_ms - now).unwrap_or(0),
                    cancel_requested: h.cancel_requested,
                },
                Err(e) => HeartbeatAck {
                    execution_id: r.execution_id,
                    code: status(&e).code() as i32,
                    lease_remaining_ms: 0,
                    cancel_requested: false,
                },
            })
            .collect())
    }
}
