//! How the cron service reaches the executions API: the SDK client (an in-process channel to
//! this node's own gRPC services, [`crate::api::in_process`]) as the layer's [`Executions`],
//! with the API's errors sorted into transient, conflict and permanent.

use kairos_layer::ops::cron::round::{Executions, ExecutionsError, Materialization, Materialized};
use kairos_proto::storage::v1::ExecutionStatus;
use kairos_proto::v1::{SubmitRequest, submit_batch_item, submit_request};
use kairos_sdk::Client;

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
        let items = self.ns(&ns).submit_batch(reqs).await.map_err(|e| classify(&e))?;
        Ok(items
            .into_iter()
            .map(|item| match item {
                submit_batch_item::Result::Ok(s) => {
                    Ok(Materialized { execution_id: s.execution_id, created: s.created })
                }
                submit_batch_item::Result::Error(e) => Err(classify_code(e.code, e.message)),
            })
            .collect())
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
