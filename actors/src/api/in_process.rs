//! The in-process client the cron service uses: the SDK client (the same calls any client
//! makes) over an in-process channel to this node's own gRPC services (an in-memory duplex
//! stream per connection: no socket, works in every test and under simulated time). The cron
//! owners see it as the layer's `Executions` ([`crate::runtime::cron_api`]).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

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
