//! The `kairos.v1` gRPC services over a [`Node`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use kairos_layer::definition::{parse_definition, parse_definition_uri};
use kairos_layer::ops::query::ListQuery;
use kairos_layer::ops::submit::SubmitRequest;
use kairos_layer::ops::{self, error::invalid};
use kairos_proto::storage::v1::{ExecutionError, ExecutionStatus, JobDefinition};
use kairos_proto::v1::admin_service_server::{AdminService, AdminServiceServer};
use kairos_proto::v1::definition_service_server::{DefinitionService, DefinitionServiceServer};
use kairos_proto::v1::execution_service_server::{ExecutionService, ExecutionServiceServer};
use kairos_proto::v1::worker_service_server::{WorkerService, WorkerServiceServer};
use kairos_proto::v1::*;
use tonic::{Request, Response, Status};

use super::errors::status;
use crate::dispatcher::PollRequest;
use crate::node::Node;

type Reply<T> = Result<Response<T>, Status>;

fn ok<T>(v: T) -> Reply<T> {
    Ok(Response::new(v))
}

fn or_default(ns: &str) -> String {
    if ns.is_empty() { "default".into() } else { ns.to_string() }
}

/// (namespace, name, version) → definition.
type DefinitionCache = BTreeMap<(String, String, u32), Arc<JobDefinition>>;

/// The services, sharing one node and a cache of (immutable) definition versions.
#[derive(Clone)]
pub struct Api {
    node: Node,
    definitions: Arc<Mutex<DefinitionCache>>,
}

/// Cached definitions at most (versions are immutable, so the cache is never stale).
const DEFINITION_CACHE_MAX: usize = 1_024;

impl Api {
    /// The services over `node`.
    pub fn new(node: Node) -> Self {
        Api { node, definitions: Arc::default() }
    }

    fn submit_request(&self, r: SubmitRequest_) -> Result<SubmitRequest, ops::Error> {
        let inputs: serde_json::Value = if r.inputs_json.trim().is_empty() {
            serde_json::json!({})
        } else {
            serde_json::from_str(&r.inputs_json)
                .map_err(|e| invalid("inputs", format!("malformed JSON: {e}")))?
        };
        Ok(SubmitRequest {
            namespace: or_default(&r.namespace),
            definition: parse_definition_uri(&r.definition_uri)
                .map_err(|e| invalid(e.field(), e.reason()))?,
            definition_version: r.definition_version,
            inputs,
            execute_at_ms: r.execute_at_ms,
            idempotency_key: (!r.idempotency_key.is_empty()).then_some(r.idempotency_key),
        })
    }

    async fn definition(
        &self,
        ns: &str,
        name: &str,
        version: u32,
    ) -> Result<Arc<JobDefinition>, ops::Error> {
        let key = (ns.to_string(), name.to_string(), version);
        if let Some(d) = self.definitions.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(d.clone());
        }
        let d = Arc::new(self.node.scheduler().get_definition(ns, name, Some(version)).await?);
        let mut cache = self.definitions.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= DEFINITION_CACHE_MAX {
            cache.clear();
        }
        cache.insert(key, d.clone());
        Ok(d)
    }

    /// Serves the four services on `addr` until `shutdown` completes.
    pub async fn serve(
        self,
        addr: SocketAddr,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        let incoming = tokio_stream_from(listener);
        let router = tonic::transport::Server::builder()
            .add_service(ExecutionServiceServer::new(self.clone()))
            .add_service(WorkerServiceServer::new(self.clone()))
            .add_service(DefinitionServiceServer::new(self.clone()))
            .add_service(AdminServiceServer::new(self));
        let task = tokio::spawn(async move {
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, shutdown).await {
                tracing::error!(error = %e, "gRPC server failed");
            }
        });
        Ok((bound, task))
    }
}

/// Accepted connections as the stream tonic serves.
fn tokio_stream_from(
    listener: tokio::net::TcpListener,
) -> impl tonic::codegen::tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    tonic::codegen::tokio_stream::wrappers::TcpListenerStream::new(listener)
}

type SubmitRequest_ = kairos_proto::v1::SubmitRequest;

fn list_query(r: ListExecutionsRequest) -> Result<ListQuery, ops::Error> {
    let status = match r.status() {
        ExecutionStatus::Unspecified => None,
        s => Some(s),
    };
    Ok(ListQuery {
        namespace: or_default(&r.namespace),
        status,
        definition: (!r.definition.is_empty()).then_some(r.definition),
        from_ms: (r.from_ms != 0).then_some(r.from_ms),
        to_ms: (r.to_ms != 0).then_some(r.to_ms),
        limit: r.limit as usize,
        cursor: (!r.cursor.is_empty()).then_some(r.cursor),
    })
}

#[tonic::async_trait]
impl ExecutionService for Api {
    async fn submit(&self, req: Request<SubmitRequest_>) -> Reply<SubmitResponse> {
        let r = self.submit_request(req.into_inner()).map_err(|e| status(&e))?;
        let s = self.node.submit(r).await.map_err(|e| status(&e))?;
        ok(SubmitResponse { execution: Some(s.execution), created: s.created })
    }

    async fn submit_batch(&self, req: Request<SubmitBatchRequest>) -> Reply<SubmitBatchResponse> {
        let reqs = req.into_inner().requests;
        let mut parsed = Vec::with_capacity(reqs.len());
        let mut items: Vec<Option<SubmitBatchItem>> = Vec::with_capacity(reqs.len());
        for r in reqs {
            match self.submit_request(r) {
                Ok(r) => {
                    parsed.push(r);
                    items.push(None);
                }
                Err(e) => items.push(Some(error_item(&e))),
            }
        }
        let mut results = self.node.submit_batch(parsed).await.map_err(|e| status(&e))?.into_iter();
        let items = items
            .into_iter()
            .map(|i| {
                i.unwrap_or_else(|| match results.next() {
                    Some(Ok(s)) => SubmitBatchItem {
                        result: Some(submit_batch_item::Result::Ok(SubmitResponse {
                            execution: Some(s.execution),
                            created: s.created,
                        })),
                    },
                    Some(Err(e)) => error_item(&e),
                    None => error_item(&ops::Error::Corrupt("batch result missing".into())),
                })
            })
            .collect();
        ok(SubmitBatchResponse { items })
    }

    async fn get(&self, req: Request<GetExecutionRequest>) -> Reply<GetExecutionResponse> {
        let r = req.into_inner();
        let ns = or_default(&r.namespace);
        let sched = self.node.scheduler();
        let e = sched.get(&ns, &r.execution_id).await.map_err(|e| status(&e))?;
        let attempts = sched.attempts(&ns, &r.execution_id).await.map_err(|e| status(&e))?;
        ok(GetExecutionResponse { execution: Some(e), attempts })
    }

    async fn cancel(&self, req: Request<ExecutionRef>) -> Reply<ExecutionResponse> {
        let r = req.into_inner();
        let e = self
            .node
            .cancel(&or_default(&r.namespace), &r.execution_id)
            .await
            .map_err(|e| status(&e))?;
        ok(ExecutionResponse { execution: Some(e) })
    }

    async fn list(&self, req: Request<ListExecutionsRequest>) -> Reply<ListExecutionsResponse> {
        let q = list_query(req.into_inner()).map_err(|e| status(&e))?;
        let page = self.node.scheduler().list(&q).await.map_err(|e| status(&e))?;
        ok(ListExecutionsResponse {
            executions: page.executions,
            next_cursor: page.next_cursor.unwrap_or_default(),
        })
    }

    async fn replay(&self, req: Request<ExecutionRef>) -> Reply<ExecutionResponse> {
        let r = req.into_inner();
        let e = self
            .node
            .replay(&or_default(&r.namespace), &r.execution_id)
            .await
            .map_err(|e| status(&e))?;
        ok(ExecutionResponse { execution: Some(e) })
    }
}

fn error_item(e: &ops::Error) -> SubmitBatchItem {
    let s = status(e);
    SubmitBatchItem {
        result: Some(submit_batch_item::Result::Error(ItemError {
            code: s.code() as i32,
            message: s.message().to_string(),
        })),
    }
}

#[tonic::async_trait]
impl WorkerService for Api {
    async fn poll(&self, req: Request<kairos_proto::v1::PollRequest>) -> Reply<PollResponse> {
        let r = req.into_inner();
        let ns = or_default(&r.namespace);
        let claimed = self
            .node
            .poll(PollRequest {
                namespace: ns.clone(),
                queue: r.queue,
                worker_id: r.worker_id,
                max: r.max_executions.max(1) as usize,
                lease_ms: (r.lease_ms != 0).then_some(r.lease_ms),
                wait_ms: r.wait_ms,
            })
            .await
            .map_err(|e| status(&e))?;
        let mut tasks = Vec::with_capacity(claimed.len());
        for c in claimed {
            let e = &c.execution;
            // The executions are claimed already: a failed definition lookup must not lose
            // them, so the task goes out without the `execution` block (handlers registered
            // by name do not need it).
            let execution_json = match self
                .definition(&ns, &e.definition_name, e.definition_version)
                .await
            {
                Ok(def) => String::from_utf8_lossy(&def.execution_json).into_owned(),
                Err(err) => {
                    tracing::warn!(execution = %e.id, error = %err, "definition lookup failed for a claimed task");
                    String::new()
                }
            };
            tasks.push(Task {
                definition_execution_json: execution_json,
                execution: Some(c.execution),
                attempt: Some(c.attempt),
            });
        }
        ok(PollResponse { tasks })
    }

    async fn heartbeat(&self, req: Request<HeartbeatRequest>) -> Reply<HeartbeatResponse> {
        let r = req.into_inner();
        let h = self
            .node
            .heartbeat(&or_default(&r.namespace), &r.execution_id, r.fencing_token)
            .await
            .map_err(|e| status(&e))?;
        ok(HeartbeatResponse {
            lease_expires_at_ms: h.lease_expires_at_ms,
            cancel_requested: h.cancel_requested,
        })
    }

    async fn complete(&self, req: Request<CompleteRequest>) -> Reply<ExecutionResponse> {
        let r = req.into_inner();
        let e = self
            .node
            .complete(
                &or_default(&r.namespace),
                &r.execution_id,
                r.fencing_token,
                r.output_json.into_bytes(),
                r.output_reference,
            )
            .await
            .map_err(|e| status(&e))?;
        ok(ExecutionResponse { execution: Some(e) })
    }

    async fn fail(&self, req: Request<FailRequest>) -> Reply<ExecutionResponse> {
        let r = req.into_inner();
        let error = r.error.unwrap_or(ExecutionError {
            message: "failed".into(),
            retryable: true,
            code: String::new(),
        });
        let e = self
            .node
            .fail(&or_default(&r.namespace), &r.execution_id, r.fencing_token, error)
            .await
            .map_err(|e| status(&e))?;
        ok(ExecutionResponse { execution: Some(e) })
    }
}

#[tonic::async_trait]
impl DefinitionService for Api {
    async fn register(
        &self,
        req: Request<RegisterDefinitionRequest>,
    ) -> Reply<RegisterDefinitionResponse> {
        let r = req.into_inner();
        let def =
            parse_definition(&r.source).map_err(|e| status(&invalid(e.field(), e.reason())))?;
        let (d, created) = self
            .node
            .scheduler()
            .register_definition(&or_default(&r.namespace), def)
            .await
            .map_err(|e| status(&e))?;
        ok(RegisterDefinitionResponse { definition: Some(d), created })
    }

    async fn get(&self, req: Request<GetDefinitionRequest>) -> Reply<DefinitionResponse> {
        let r = req.into_inner();
        let version = (r.version != 0).then_some(r.version);
        let d = self
            .node
            .scheduler()
            .get_definition(&or_default(&r.namespace), &r.name, version)
            .await
            .map_err(|e| status(&e))?;
        ok(DefinitionResponse { definition: Some(d) })
    }

    async fn list(&self, req: Request<ListDefinitionsRequest>) -> Reply<ListDefinitionsResponse> {
        let r = req.into_inner();
        let ds = self
            .node
            .scheduler()
            .list_definitions(&or_default(&r.namespace))
            .await
            .map_err(|e| status(&e))?;
        ok(ListDefinitionsResponse { definitions: ds })
    }
}

#[tonic::async_trait]
impl AdminService for Api {
    async fn nodes(&self, _: Request<Empty>) -> Reply<NodesResponse> {
        let nodes = self.node.scheduler().nodes().await.map_err(|e| status(&e))?;
        ok(NodesResponse { nodes })
    }

    async fn shards(&self, _: Request<Empty>) -> Reply<ShardsResponse> {
        let sched = self.node.scheduler();
        let leases = sched.shard_leases().await.map_err(|e| status(&e))?;
        ok(ShardsResponse { leases, shard_count: sched.config().shard_count })
    }

    async fn stats(&self, req: Request<StatsRequest>) -> Reply<StatsResponse> {
        let r = req.into_inner();
        let sched = self.node.scheduler();
        let counts = if r.namespace.is_empty() {
            sched.all_status_counts().await
        } else {
            sched.status_counts(&r.namespace).await
        }
        .map_err(|e| status(&e))?;
        let executions =
            counts.into_iter().map(|(s, n)| StatusCount { status: s as i32, count: n }).collect();
        ok(StatsResponse { executions })
    }

    async fn failed_executions(
        &self,
        req: Request<ListExecutionsRequest>,
    ) -> Reply<ListExecutionsResponse> {
        let mut q = list_query(req.into_inner()).map_err(|e| status(&e))?;
        q.status = Some(ExecutionStatus::Failed);
        let page = self.node.scheduler().list(&q).await.map_err(|e| status(&e))?;
        ok(ListExecutionsResponse {
            executions: page.executions,
            next_cursor: page.next_cursor.unwrap_or_default(),
        })
    }
}
