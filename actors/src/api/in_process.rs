//! How the cron service reaches the executions API: the SDK client (the same calls any client
//! makes), over an in-process channel to this node's own gRPC services (an in-memory duplex
//! stream per connection: no socket, works in every test and under simulated time).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kairos_layer::ops::cron::round::{Executions, ExecutionsError, Materialization, Submitted};
use kairos_proto::storage::v1::ExecutionStatus;
use kairos_proto::v1::execution_service_server::{ExecutionService, ExecutionServiceServer};
use kairos_proto::v1::*;
use kairos_sdk::Client;
use tonic::codegen::tokio_stream;
use tonic::transport::{Endpoint, Uri};
use tonic::{Request, Response, Status};

use crate::api::grpc::Api;
use crate::node::Node;

/// How the in-process channel finds the node (set once the node exists; it holds the node
/// weakly, so the channel does not keep a stopped node alive).
pub type NodeSlot = Arc<OnceLock<Box<dyn Fn() -> Option<Node> + Send + Sync>>>;

/// Per-call time-out of the cron service's API calls.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// An SDK client whose connections are served in process by the node in `slot`.
pub fn in_process_client(slot: NodeSlot) -> Client {
    let connector = tower::service_fn(move |_: Uri| {
        let slot = slot.clone();
        async move {
            if slot.get().and_then(|find| find()).is_none() {
                return Err(std::io::Error::other("the node has stopped"));
            }
            let (client_io, server_io) = tokio::io::duplex(256 * 1024);
            let api = ViaSlot(slot);
            tokio::spawn(async move {
                let incoming = tokio_stream::once(Ok::<_, std::io::Error>(server_io));
                let served = tonic::transport::Server::builder()
                    .add_service(ExecutionServiceServer::new(api))
                    .serve_with_incoming(incoming)
                    .await;
                if let Err(e) = served {
                    tracing::debug!(error = %e, "in-process API connection ended");
                }
            });
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(client_io))
        }
    });
    let channel =
        Endpoint::from_static("http://in-process.kairos").connect_with_connector_lazy(connector);
    Client::from_channel(channel).with_timeout(CALL_TIMEOUT)
}

/// The node's executions service, reached through the slot on every call: the connection never
/// holds the node itself (the node holds the client, so that would be a cycle keeping a stopped
/// node alive).
#[derive(Clone)]
struct ViaSlot(NodeSlot);

impl ViaSlot {
    fn api(&self) -> Result<Api, Status> {
        self.0
            .get()
            .and_then(|find| find())
            .map(Api::new)
            .ok_or_else(|| Status::unavailable("the node has stopped"))
    }
}

type Reply<T> = Result<Response<T>, Status>;

/// The call as made by the cron service itself (a principal on the request's extensions, which
/// only code in this process can set: no API key needed, audited as `cron`).
fn as_cron<T>(mut r: Request<T>) -> Request<T> {
    r.extensions_mut().insert(crate::server::auth::Principal::unrestricted("cron"));
    r
}

#[tonic::async_trait]
impl ExecutionService for ViaSlot {
    async fn submit(&self, r: Request<SubmitRequest>) -> Reply<SubmitResponse> {
        ExecutionService::submit(&self.api()?, as_cron(r)).await
    }
    async fn submit_batch(&self, r: Request<SubmitBatchRequest>) -> Reply<SubmitBatchResponse> {
        ExecutionService::submit_batch(&self.api()?, as_cron(r)).await
    }
    async fn get(&self, r: Request<GetExecutionRequest>) -> Reply<GetExecutionResponse> {
        ExecutionService::get(&self.api()?, as_cron(r)).await
    }
    async fn cancel(&self, r: Request<ExecutionRef>) -> Reply<CancelResponse> {
        ExecutionService::cancel(&self.api()?, as_cron(r)).await
    }
    async fn list(&self, r: Request<ListExecutionsRequest>) -> Reply<ListExecutionsResponse> {
        ExecutionService::list(&self.api()?, as_cron(r)).await
    }
    async fn replay(&self, r: Request<ExecutionRef>) -> Reply<ExecutionResponse> {
        ExecutionService::replay(&self.api()?, as_cron(r)).await
    }
}

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
    ) -> Result<Vec<Result<Submitted, ExecutionsError>>, ExecutionsError> {
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
                    Ok(Submitted { execution_id: s.execution_id, created: s.created })
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
