//! How the cron service reaches the executions API: the SDK client (an in-process channel to
//! this node's own gRPC services, [`crate::api::in_process`]) as the layer's [`Executions`],
//! with the API's errors sorted into transient, conflict and permanent.

use kairos_layer::ops::cron::round::{Executions, ExecutionsError, Materialization, Materialized};
use kairos_proto::storage::v1::ExecutionStatus;
use kairos_proto::v1::{SubmitRequest, submit_batch_item, submit_request};
use kairos_sdk::Client;

use crate::limits::CRON_SUBMIT_CALL_BYTES_MAX;

/// The executions API through an SDK client.
#[derive(Clone)]
pub struct SdkExecutions(pub Client);

fn classify(e: &kairos_sdk::Error) -> ExecutionsError {
    if e.is_transient() {
        return ExecutionsError::Transient(e.to_string());
    }
    match e.code() {
        tonic::Code::AlreadyExists => ExecutionsError::Conflict(e.to_string()),
        // A namespace over its quota, a full disk: the occurrence waits, it is not dropped.
        tonic::Code::ResourceExhausted => ExecutionsError::Transient(e.to_string()),
        _ => ExecutionsError::Permanent(e.to_string()),
    }
}

fn classify_code(code: i32, message: String) -> ExecutionsError {
    let e = kairos_sdk::Error::Status(tonic::Status::new(tonic::Code::from_i32(code), message));
    classify(&e)
}

impl SdkExecutions {
    fn ns(&self, ns: &str) -> Client {
        self.0.clone().with_namespace(ns)
    }
}

impl Executions for SdkExecutions {
    async fn submit(
        &self,
        batch: Vec<Materialization>,
    ) -> Result<Vec<Result<Materialized, ExecutionsError>>, ExecutionsError> {
        let Some(ns) = batch.first().map(|m| m.namespace.clone()) else { return Ok(Vec::new()) };
        let reqs = batch
            .into_iter()
            .map(|m| SubmitRequest {
                namespace: m.namespace,
                definition_uri: kairos_layer::definition::definition_uri(&m.definition),
                definition_version: m.definition_version,
                inputs_json: m.inputs.to_string(),
                when: Some(match m.execute_at_ms {
                    Some(at) => submit_request::When::ExecuteAtMs(at),
                    None => submit_request::When::DelayMs(0),
                }),
                idempotency_key: m.idempotency_key,
                return_execution: false,
                traceparent: String::new(),
            })
            .collect();
        // In calls that fit the node's request size, each split further while the namespace's
        // quota refuses it whole (what fits its room goes through; the rest waits).
        let client = self.ns(&ns);
        let mut out = Vec::new();
        for chunk in chunks(reqs) {
            out.extend(submit_within_quota(&client, chunk).await?);
        }
        Ok(out)
    }

    async fn status(&self, ns: &str, id: &str) -> Result<Option<ExecutionStatus>, ExecutionsError> {
        match self.ns(ns).get(id).await {
            // The API and storage enums share their numbers (checked in api::convert).
            Ok((e, _)) => Ok(Some(ExecutionStatus::try_from(e.status).unwrap_or_default())),
            Err(e) if e.code() == tonic::Code::NotFound => Ok(None),
            Err(e) => Err(classify(&e)),
        }
    }

    async fn by_key(&self, ns: &str, key: &str) -> Result<Option<String>, ExecutionsError> {
        match self.ns(ns).get_by_idempotency_key(key).await {
            Ok((e, _)) => Ok(Some(e.execution_id)),
            Err(e) if e.code() == tonic::Code::NotFound => Ok(None),
            Err(e) => Err(classify(&e)),
        }
    }

    async fn cancel(&self, ns: &str, id: &str) -> Result<(), ExecutionsError> {
        match self.ns(ns).cancel(id).await {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(e.code(), tonic::Code::NotFound | tonic::Code::FailedPrecondition) =>
            {
                Ok(())
            }
            Err(e) => Err(classify(&e)),
        }
    }
}

type Item = Result<Materialized, ExecutionsError>;

/// The requests in calls of at most [`CRON_SUBMIT_CALL_BYTES_MAX`] of inputs (at least one each).
fn chunks(reqs: Vec<SubmitRequest>) -> Vec<Vec<SubmitRequest>> {
    let mut out: Vec<Vec<SubmitRequest>> = Vec::new();
    let mut bytes = 0;
    for r in reqs {
        let size = r.inputs_json.len() + r.idempotency_key.len() + 256;
        match out.last_mut() {
            Some(last) if bytes + size <= CRON_SUBMIT_CALL_BYTES_MAX => {
                bytes += size;
                last.push(r);
            }
            _ => {
                bytes = size;
                out.push(vec![r]);
            }
        }
    }
    out
}

/// Submits `reqs`; if every one is refused for the namespace's quota, the first half alone,
/// then (if it went through) the second: a quota with room for some is not refused whole.
async fn submit_within_quota(
    client: &Client,
    reqs: Vec<SubmitRequest>,
) -> Result<Vec<Item>, ExecutionsError> {
    let n = reqs.len();
    let items = client.submit_batch(reqs.clone()).await.map_err(|e| classify(&e))?;
    let exhausted = |i: &submit_batch_item::Result| matches!(i, submit_batch_item::Result::Error(e) if e.code == tonic::Code::ResourceExhausted as i32);
    if n < 2 || !items.iter().all(exhausted) {
        return Ok(items.into_iter().map(item).collect());
    }
    let mut first = reqs;
    let second = first.split_off(n / 2);
    let mut out = Box::pin(submit_within_quota(client, first)).await?;
    if out.iter().all(|r| matches!(r, Err(ExecutionsError::Transient(_)))) {
        // Still no room: the rest waits too.
        out.extend(items.into_iter().skip(n / 2).map(item));
        return Ok(out);
    }
    out.extend(Box::pin(submit_within_quota(client, second)).await?);
    Ok(out)
}

fn item(i: submit_batch_item::Result) -> Item {
    match i {
        submit_batch_item::Result::Ok(s) => {
            Ok(Materialized { execution_id: s.execution_id, created: s.created })
        }
        submit_batch_item::Result::Error(e) => Err(classify_code(e.code, e.message)),
    }
}
