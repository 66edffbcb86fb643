//! The `kairos.v1` gRPC services over a [`Node`]. Every accepted connection gets
//! `TCP_NODELAY`: without it each reply's last frame waits for the client's delayed ACK
//! (~40 ms per call).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use kairos_layer::definition::parse_definition_uri;
use kairos_layer::keys::Space;
use kairos_layer::ops::claim::Claimed;
use kairos_layer::ops::query::ListQuery;
use kairos_layer::ops::submit::SubmitRequest as LayerSubmit;
use kairos_layer::ops::worker::{Beat, Outcome, Report};
use kairos_layer::ops::{self, error::invalid};
use kairos_proto::storage::v1 as storage;
use kairos_proto::storage::v1::JobDefinition;
use kairos_proto::v1::admin_service_server::{AdminService, AdminServiceServer};
use kairos_proto::v1::definition_service_server::{DefinitionService, DefinitionServiceServer};
use kairos_proto::v1::execution_service_server::{ExecutionService, ExecutionServiceServer};
use kairos_proto::v1::worker_service_server::{WorkerService, WorkerServiceServer};
use kairos_proto::v1::*;
use tonic::codegen::tokio_stream::{self, Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use super::errors::status;
use crate::node::Node;
use crate::runtime::dispatcher::{PollRequest as NodePoll, SessionOpen};
use crate::server::auth::{Principal, Scope};
use crate::server::tls::ServerTls;
use tracing::Instrument as _;

pub mod cron;

type Reply<T> = Result<Response<T>, Status>;

/// The namespace of cluster-wide calls: only keys of every namespace may make them.
const ALL: &str = kairos_layer::ops::access::ALL_NAMESPACES;

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
/// Responses queued on one worker stream before its writer waits.
const STREAM_BUFFER: usize = 256;

impl Api {
    /// The services over `node`.
    pub fn new(node: Node) -> Self {
        Api { node, definitions: Arc::default() }
    }

    /// The caller: the principal the node put on an in-process call (the cron service), or
    /// the one the call's API key names.
    pub(crate) async fn principal<T>(&self, req: &Request<T>) -> Result<Principal, Status> {
        if let Some(p) = req.extensions().get::<Principal>() {
            return Ok(p.clone());
        }
        let header = req.metadata().get("authorization").map(|v| v.as_bytes());
        self.node.auth().authenticate(header).await.map_err(|e| status(&e))
    }

    /// The caller, allowed to act on `ns` with `scope`.
    pub(crate) async fn authorize<T>(
        &self,
        req: &Request<T>,
        ns: &str,
        scope: Scope,
    ) -> Result<Principal, Status> {
        let p = self.principal(req).await?;
        p.allow(&or_default(ns), scope).map_err(|e| status(&e))?;
        Ok(p)
    }

    /// A submit request for the layer; `trace` is the call's `traceparent` metadata, used
    /// when the request has none of its own.
    fn submit_request(
        &self,
        r: SubmitRequest,
        trace: Option<&str>,
    ) -> Result<(LayerSubmit, bool), ops::Error> {
        let inputs: serde_json::Value = if r.inputs_json.trim().is_empty() {
            serde_json::json!({})
        } else {
            serde_json::from_str(&r.inputs_json)
                .map_err(|e| invalid("inputs", format!("malformed JSON: {e}")))?
        };
        let (execute_at_ms, delay_ms) = match r.when {
            Some(submit_request::When::ExecuteAtMs(ms)) => (ms, None),
            Some(submit_request::When::DelayMs(d)) => (0, Some(d)),
            None => {
                return Err(invalid(
                    "executeAt",
                    "is required (or delayMs: a delay counted by the node's clock, 0 = now)",
                ));
            }
        };
        Ok((
            LayerSubmit {
                namespace: or_default(&r.namespace),
                definition: parse_definition_uri(&r.definition_uri)
                    .map_err(|e| invalid(e.field(), e.reason()))?,
                definition_version: r.definition_version,
                inputs,
                execute_at_ms,
                delay_ms,
                idempotency_key: (!r.idempotency_key.is_empty()).then_some(r.idempotency_key),
                traceparent: Some(r.traceparent)
                    .filter(|t| !t.is_empty())
                    .or_else(|| trace.map(str::to_string)),
            },
            r.return_execution,
        ))
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

    /// Claimed executions as tasks for the worker that claimed them. The executions are
    /// claimed already: a failed definition lookup must not lose them, so such a task goes out
    /// without the `execution` block (handlers registered by name do not need it).
    async fn tasks(&self, claimed: &[Claimed]) -> Vec<Task> {
        let now = self.node.scheduler().clock().now().as_millis();
        let mut out = Vec::with_capacity(claimed.len());
        for c in claimed {
            let e = &c.execution;
            let execution_json = match self
                .definition(&e.namespace, &e.definition_name, e.definition_version)
                .await
            {
                Ok(def) => String::from_utf8_lossy(&def.execution_json).into_owned(),
                Err(err) => {
                    tracing::warn!(execution = %e.id, error = %err, "definition lookup failed for a claimed task");
                    String::new()
                }
            };
            if !e.traceparent.is_empty() {
                let span =
                    crate::server::telemetry::execution_span("kairos.dispatch", &e.traceparent);
                span.record("execution_id", e.id.as_str());
            }
            out.push(convert::task(c, execution_json, now));
        }
        out
    }

    /// Serves the services on `addr` (plain TCP) until `shutdown` completes.
    pub async fn serve(
        self,
        addr: SocketAddr,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        self.serve_with(addr, None, shutdown).await
    }

    /// Serves the services on `addr` until `shutdown` completes: over TLS with `tls` (its gRPC
    /// configuration, current at each accepted connection), plain TCP without.
    pub async fn serve_with(
        self,
        addr: SocketAddr,
        tls: Option<ServerTls>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        let router = tonic::transport::Server::builder()
            .add_service(ExecutionServiceServer::new(self.clone()))
            .add_service(WorkerServiceServer::new(self.clone()))
            .add_service(DefinitionServiceServer::new(self.clone()))
            .add_service(kairos_proto::v1::cron_service_server::CronServiceServer::new(
                self.clone(),
            ))
            .add_service(AdminServiceServer::new(self));
        let task = tokio::spawn(async move {
            let served = match tls {
                None => router.serve_with_incoming_shutdown(accepted(listener), shutdown).await,
                Some(tls) => {
                    let handshaken =
                        crate::server::tls::accept(listener, move || tls.grpc_config());
                    let incoming = tokio_stream::wrappers::ReceiverStream::new(handshaken)
                        .map(|(io, _peer)| Ok::<_, std::io::Error>(io));
                    router.serve_with_incoming_shutdown(incoming, shutdown).await
                }
            };
            if let Err(e) = served {
                tracing::error!(error = %e, "gRPC server failed");
            }
        });
        Ok((bound, task))
    }
}

/// Accepted connections, each with `TCP_NODELAY` set, as the stream tonic serves.
pub fn accepted(
    listener: tokio::net::TcpListener,
) -> impl Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|r| {
        let s = r?;
        s.set_nodelay(true)?;
        Ok(s)
    })
}

fn list_query(r: ListExecutionsRequest) -> Result<ListQuery, ops::Error> {
    let status = match storage::ExecutionStatus::try_from(r.status) {
        Ok(storage::ExecutionStatus::Unspecified) => None,
        Ok(s) => Some(s),
        Err(_) => return Err(invalid("status", format!("unknown status {}", r.status))),
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

fn submit_response(s: &ops::submit::Submitted, full: bool) -> SubmitResponse {
    SubmitResponse {
        execution_id: s.execution.id.clone(),
        created: s.created,
        status: s.execution.status,
        execute_at_ms: s.execution.execute_at_ms,
        execution: full.then(|| convert::execution(&s.execution)),
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

/// The `traceparent` metadata of a call.
fn traceparent_of<T>(req: &Request<T>) -> Option<String> {
    req.metadata().get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_string)
}

#[tonic::async_trait]
impl ExecutionService for Api {
    async fn submit(&self, req: Request<SubmitRequest>) -> Reply<SubmitResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Submit).await?;
        let trace = traceparent_of(&req);
        let (r, full) =
            self.submit_request(req.into_inner(), trace.as_deref()).map_err(|e| status(&e))?;
        let span = crate::server::telemetry::execution_span(
            "kairos.submit",
            r.traceparent.as_deref().unwrap_or_default(),
        );
        let s = self.node.submit(r).instrument(span.clone()).await.map_err(|e| status(&e))?;
        span.record("execution_id", s.execution.id.as_str());
        ok(submit_response(&s, full))
    }

    async fn submit_batch(&self, req: Request<SubmitBatchRequest>) -> Reply<SubmitBatchResponse> {
        let caller = self.principal(&req).await?;
        let trace = traceparent_of(&req);
        let reqs = req.into_inner().requests;
        if reqs.len() > ops::submit::SUBMIT_BATCH_MAX {
            return Err(status(&invalid(
                "requests",
                format!("at most {} per batch, got {}", ops::submit::SUBMIT_BATCH_MAX, reqs.len()),
            )));
        }
        let mut parsed = Vec::with_capacity(reqs.len());
        let mut items: Vec<Option<SubmitBatchItem>> = Vec::with_capacity(reqs.len());
        let mut full = Vec::with_capacity(reqs.len());
        for r in reqs {
            // Each item names its namespace: one the key may not submit to fails alone.
            let allowed = caller.allow(&or_default(&r.namespace), Scope::Submit);
            match allowed.and_then(|()| self.submit_request(r, trace.as_deref())) {
                Ok((r, f)) => {
                    parsed.push(r);
                    full.push(f);
                    items.push(None);
                }
                Err(e) => items.push(Some(error_item(&e))),
            }
        }
        let results = self.node.submit_batch(parsed).await.map_err(|e| status(&e))?;
        let mut results = results.into_iter().zip(full);
        let items = items
            .into_iter()
            .map(|i| {
                i.unwrap_or_else(|| match results.next() {
                    Some((Ok(s), f)) => SubmitBatchItem {
                        result: Some(submit_batch_item::Result::Ok(submit_response(&s, f))),
                    },
                    Some((Err(e), _)) => error_item(&e),
                    None => error_item(&ops::Error::Corrupt("batch result missing".into())),
                })
            })
            .collect();
        ok(SubmitBatchResponse { items })
    }

    async fn get(&self, req: Request<GetExecutionRequest>) -> Reply<GetExecutionResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let r = req.into_inner();
        let ns = or_default(&r.namespace);
        let sched = self.node.scheduler();
        let e = match (r.execution_id.is_empty(), r.idempotency_key.is_empty()) {
            (false, true) => sched.get(&ns, &r.execution_id).await,
            (true, false) => sched.get_by_idempotency_key(&ns, &r.idempotency_key).await,
            (true, true) => Err(invalid("executionId", "is required (or idempotencyKey)")),
            (false, false) => {
                Err(invalid("idempotencyKey", "give executionId or idempotencyKey, not both"))
            }
        }
        .map_err(|e| status(&e))?;
        let attempts = sched.attempts(&ns, &e.id).await.map_err(|e| status(&e))?;
        ok(GetExecutionResponse {
            execution: Some(convert::execution(&e)),
            attempts: attempts.iter().map(convert::attempt).collect(),
        })
    }

    async fn cancel(&self, req: Request<ExecutionRef>) -> Reply<CancelResponse> {
        let caller = self.authorize(&req, &req.get_ref().namespace, Scope::Submit).await?;
        let r = req.into_inner();
        let c = self
            .node
            .cancel(&or_default(&r.namespace), &r.execution_id, &caller.who)
            .await
            .map_err(|e| status(&e))?;
        ok(CancelResponse { execution: Some(convert::execution(&c.execution)), cancelled: c.done })
    }

    async fn list(&self, req: Request<ListExecutionsRequest>) -> Reply<ListExecutionsResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let q = list_query(req.into_inner()).map_err(|e| status(&e))?;
        let page = self.node.scheduler().list(&q).await.map_err(|e| status(&e))?;
        ok(ListExecutionsResponse {
            executions: page.executions.iter().map(convert::execution).collect(),
            next_cursor: page.next_cursor.unwrap_or_default(),
            unreadable_ids: page.unreadable,
        })
    }

    async fn replay(&self, req: Request<ExecutionRef>) -> Reply<ExecutionResponse> {
        let caller = self.authorize(&req, &req.get_ref().namespace, Scope::Submit).await?;
        let r = req.into_inner();
        let e = self
            .node
            .replay(&or_default(&r.namespace), &r.execution_id, &caller.who)
            .await
            .map_err(|e| status(&e))?;
        ok(ExecutionResponse { execution: Some(convert::execution(&e)) })
    }
}

/// A worker's result as the layer takes it; `field` names where it came from in errors.
fn report_of(ns: &str, worker: &str, r: TaskResult) -> Result<Report, ops::Error> {
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
    })
}

fn ack(id: String, r: Result<&storage::Execution, &ops::Error>) -> ResultAck {
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

impl Api {
    /// Applies results (batched with others on the node); one acknowledgement each, in order.
    async fn report(
        &self,
        caller: &Principal,
        ns: &str,
        worker: &str,
        results: Vec<TaskResult>,
    ) -> Result<Vec<ResultAck>, Status> {
        if results.len() > ops::worker::REPORT_BATCH_MAX {
            return Err(status(&invalid(
                "results",
                format!("at most {} per call", ops::worker::REPORT_BATCH_MAX),
            )));
        }
        let mut acks: Vec<Option<ResultAck>> = Vec::with_capacity(results.len());
        let mut ids = Vec::new();
        let mut reports = Vec::new();
        for r in results {
            let id = r.execution_id.clone();
            let reported = report_of(ns, worker, r)
                .and_then(|rep| caller.allow(&rep.namespace, Scope::Worker).map(|()| rep));
            match reported {
                Ok(rep) => {
                    ids.push(id);
                    reports.push(rep);
                    acks.push(None);
                }
                Err(e) => acks.push(Some(ack(id, Err(&e)))),
            }
        }
        let out = if reports.is_empty() {
            Vec::new()
        } else {
            self.node.report(reports).await.map_err(|e| status(&e))?
        };
        let mut applied = ids.into_iter().zip(out).map(|(id, r)| ack(id, r.as_ref()));
        Ok(acks
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| {
                    applied.next().unwrap_or_else(|| ResultAck {
                        code: tonic::Code::Internal as i32,
                        message: "result missing".into(),
                        ..ResultAck::default()
                    })
                })
            })
            .collect())
    }

    /// Extends leases (batched with others on the node); one acknowledgement each.
    async fn heartbeats(
        &self,
        ns: &str,
        worker: &str,
        refs: Vec<TaskRef>,
    ) -> Result<Vec<HeartbeatAck>, Status> {
        let now = self.node.scheduler().clock().now().as_millis();
        let beats: Vec<Beat> = refs
            .iter()
            .map(|r| Beat {
                namespace: ns.to_string(),
                execution_id: r.execution_id.clone(),
                token: r.fencing_token,
                worker_id: (!worker.is_empty()).then(|| worker.to_string()),
            })
            .collect();
        let out = self.node.heartbeat_many(beats).await.map_err(|e| status(&e))?;
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

type WorkStream = Pin<Box<dyn Stream<Item = Result<WorkResponse, Status>> + Send + 'static>>;

fn check_lease(lease_ms: u64) -> Result<Option<u64>, ops::Error> {
    use kairos_layer::limits::{LEASE_MS_MAX, LEASE_MS_MIN};
    match lease_ms {
        0 => Ok(None),
        l if (LEASE_MS_MIN..=LEASE_MS_MAX).contains(&l) => Ok(Some(l)),
        _ => Err(invalid(
            "leaseMs",
            format!("must be 0 (the definition's) or between {LEASE_MS_MIN} and {LEASE_MS_MAX}"),
        )),
    }
}

#[tonic::async_trait]
impl WorkerService for Api {
    type WorkStream = WorkStream;

    async fn work(&self, req: Request<Streaming<WorkRequest>>) -> Reply<Self::WorkStream> {
        // Authenticated now; the namespace is checked once `open` names it. A key (not the
        // node's own principal) is checked again as the stream goes on: a revoked key ends it.
        let caller = self.principal(&req).await?;
        let recheck: Option<Vec<u8>> = match req.extensions().get::<Principal>() {
            Some(_) => None,
            None => Some(
                req.metadata()
                    .get("authorization")
                    .map(|v| v.as_bytes().to_vec())
                    .unwrap_or_default(),
            ),
        };
        let mut inbound = req.into_inner();
        let mut first = match inbound.message().await? {
            Some(m) => m,
            None => return Err(status(&invalid("open", "the stream ended before opening"))),
        };
        let open = first
            .open
            .take()
            .ok_or_else(|| status(&invalid("open", "the first message must carry `open`")))?;
        let ns = or_default(&open.namespace);
        caller.allow(&ns, Scope::Worker).map_err(|e| status(&e))?;
        let checks = [("namespace", &ns), ("queue", &open.queue), ("workerId", &open.worker_id)];
        for (field, v) in checks {
            ops::submit::check_name(field, v).map_err(|e| status(&e))?;
        }
        let lease_ms = check_lease(open.lease_ms).map_err(|e| status(&e))?;
        let (out_tx, out_rx) =
            tokio::sync::mpsc::channel::<Result<WorkResponse, Status>>(STREAM_BUFFER);
        let (task_tx, mut task_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<Claimed>>();
        let session = self
            .node
            .open_session(SessionOpen {
                namespace: ns.clone(),
                queue: open.queue.clone(),
                worker_id: open.worker_id.clone(),
                lease_ms,
                credits: open.credits as usize,
                tasks: task_tx,
            })
            .await
            .map_err(|e| status(&e))?;
        // Tasks out: what the dispatcher hands this stream, converted; anything the client can
        // no longer take goes back as orphans.
        {
            let (api, out) = (self.clone(), out_tx.clone());
            tokio::spawn(async move {
                while let Some(claimed) = task_rx.recv().await {
                    let tasks = api.tasks(&claimed).await;
                    if out
                        .send(Ok(WorkResponse { tasks, ..WorkResponse::default() }))
                        .await
                        .is_err()
                    {
                        api.node.orphans(claimed);
                        while let Ok(more) = task_rx.try_recv() {
                            api.node.orphans(more);
                        }
                        return;
                    }
                }
                // The dispatcher let go of this stream (the node is draining): end it, so the
                // worker reconnects elsewhere.
                let _ = out.send(Err(Status::unavailable("the node is draining; reconnect"))).await;
            });
        }
        // Requests in: credits, results and heartbeats, until the worker closes the stream.
        {
            let api = self.clone();
            tokio::spawn(async move {
                let mut next = Some(first);
                let clock = api.node.scheduler().clock().clone();
                let mut checked_ms = clock.now().as_millis();
                loop {
                    let m = match next.take() {
                        Some(m) => m,
                        None => match inbound.message().await {
                            Ok(Some(m)) => m,
                            Ok(None) | Err(_) => break,
                        },
                    };
                    let now = clock.now().as_millis();
                    if let Some(header) = &recheck
                        && now.saturating_sub(checked_ms) >= crate::server::auth::CACHE_MS
                    {
                        checked_ms = now;
                        let h = (!header.is_empty()).then_some(header.as_slice());
                        // Only a refused key ends the stream (a busy store does not).
                        if let Err(e @ ops::Error::Unauthenticated(_)) =
                            api.node.auth().authenticate(h).await
                        {
                            let _ = out_tx.send(Err(status(&e))).await;
                            break;
                        }
                    }
                    if m.open.is_some() {
                        let _ = out_tx
                            .send(Err(status(&invalid(
                                "open",
                                "only the first message opens the stream",
                            ))))
                            .await;
                        break;
                    }
                    if m.credits > 0 {
                        api.node.session_credits(session, m.credits as usize);
                    }
                    if !m.results.is_empty() {
                        let (api, out, ns, worker, caller) = (
                            api.clone(),
                            out_tx.clone(),
                            ns.clone(),
                            open.worker_id.clone(),
                            caller.clone(),
                        );
                        tokio::spawn(async move {
                            let msg = match api.report(&caller, &ns, &worker, m.results).await {
                                Ok(acks) => Ok(WorkResponse { acks, ..WorkResponse::default() }),
                                // Not applied (the store is unavailable): the worker sends them
                                // again on its next stream.
                                Err(s) => Err(s),
                            };
                            let _ = out.send(msg).await;
                        });
                    }
                    if !m.heartbeats.is_empty() {
                        let (api, out, ns, worker) =
                            (api.clone(), out_tx.clone(), ns.clone(), open.worker_id.clone());
                        tokio::spawn(async move {
                            if let Ok(heartbeats) = api.heartbeats(&ns, &worker, m.heartbeats).await
                            {
                                let _ = out
                                    .send(Ok(WorkResponse {
                                        heartbeats,
                                        ..WorkResponse::default()
                                    }))
                                    .await;
                            }
                        });
                    }
                }
                api.node.close_session(session);
            });
        }
        ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(out_rx)))
    }

    async fn poll(&self, req: Request<PollRequest>) -> Reply<PollResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Worker).await?;
        let r = req.into_inner();
        let ns = or_default(&r.namespace);
        let checks = [("namespace", &ns), ("queue", &r.queue), ("workerId", &r.worker_id)];
        for (field, v) in checks {
            ops::submit::check_name(field, v).map_err(|e| status(&e))?;
        }
        let lease_ms = check_lease(r.lease_ms).map_err(|e| status(&e))?;
        let claimed = self
            .node
            .poll(NodePoll {
                namespace: ns.clone(),
                queue: r.queue,
                worker_id: r.worker_id,
                max: r.max_executions.max(1) as usize,
                lease_ms,
                wait_ms: r.wait_ms,
            })
            .await
            .map_err(|e| status(&e))?;
        ok(PollResponse { tasks: self.tasks(&claimed).await })
    }

    async fn heartbeat(&self, req: Request<HeartbeatRequest>) -> Reply<HeartbeatResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Worker).await?;
        let r = req.into_inner();
        let ns = or_default(&r.namespace);
        let now = self.node.scheduler().clock().now().as_millis();
        let beat = Beat {
            namespace: ns,
            execution_id: r.execution_id,
            token: r.fencing_token,
            worker_id: (!r.worker_id.is_empty()).then_some(r.worker_id),
        };
        let h = self
            .node
            .heartbeat_many(vec![beat])
            .await
            .map_err(|e| status(&e))?
            .pop()
            .unwrap_or_else(|| Err(ops::Error::Corrupt("heartbeat result missing".into())))
            .map_err(|e| status(&e))?;
        ok(HeartbeatResponse {
            lease_expires_at_ms: h.lease_expires_at_ms,
            cancel_requested: h.cancel_requested,
            lease_remaining_ms: u64::try_from(h.lease_expires_at_ms - now).unwrap_or(0),
        })
    }

    async fn complete(&self, req: Request<CompleteRequest>) -> Reply<ResultResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Worker).await?;
        let r = req.into_inner();
        let report = Report {
            namespace: or_default(&r.namespace),
            execution_id: r.execution_id,
            token: r.fencing_token,
            outcome: Outcome::Success {
                output_json: r.output_json.into_bytes(),
                output_reference: r.output_reference,
            },
            worker_id: (!r.worker_id.is_empty()).then_some(r.worker_id),
        };
        let e = self.node.report_one(report).await.map_err(|e| status(&e))?;
        ok(ResultResponse { status: e.status })
    }

    async fn fail(&self, req: Request<FailRequest>) -> Reply<ResultResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Worker).await?;
        let r = req.into_inner();
        let error = r.error.map_or(
            storage::ExecutionError {
                message: "failed".into(),
                retryable: true,
                code: String::new(),
            },
            |e| storage::ExecutionError {
                message: e.message,
                retryable: e.retryable,
                code: e.code,
            },
        );
        let report = Report {
            namespace: or_default(&r.namespace),
            execution_id: r.execution_id,
            token: r.fencing_token,
            outcome: Outcome::Failure(error),
            worker_id: (!r.worker_id.is_empty()).then_some(r.worker_id),
        };
        let e = self.node.report_one(report).await.map_err(|e| status(&e))?;
        ok(ResultResponse { status: e.status })
    }

    async fn report(&self, req: Request<ReportRequest>) -> Reply<ReportResponse> {
        let caller = self.authorize(&req, &req.get_ref().namespace, Scope::Worker).await?;
        let r = req.into_inner();
        let acks =
            Api::report(self, &caller, &or_default(&r.namespace), &r.worker_id, r.results).await?;
        ok(ReportResponse { acks })
    }
}

#[tonic::async_trait]
impl DefinitionService for Api {
    async fn register(
        &self,
        req: Request<RegisterDefinitionRequest>,
    ) -> Reply<RegisterDefinitionResponse> {
        let caller = self.authorize(&req, &req.get_ref().namespace, Scope::Definitions).await?;
        let r = req.into_inner();
        self.node
            .check_definition_size(&or_default(&r.namespace), r.source.len())
            .map_err(|e| status(&e))?;
        let def = super::parse_definition(r.source.into_bytes()).await.map_err(|e| status(&e))?;
        let (d, created) = self
            .node
            .scheduler()
            .register_definition_by(&or_default(&r.namespace), def, &caller.who)
            .await
            .map_err(|e| status(&e))?;
        ok(RegisterDefinitionResponse { definition: Some(convert::definition(&d)), created })
    }

    async fn get(&self, req: Request<GetDefinitionRequest>) -> Reply<DefinitionResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let r = req.into_inner();
        let version = (r.version != 0).then_some(r.version);
        let d = self
            .node
            .scheduler()
            .get_definition(&or_default(&r.namespace), &r.name, version)
            .await
            .map_err(|e| status(&e))?;
        ok(DefinitionResponse { definition: Some(convert::definition(&d)) })
    }

    async fn list(&self, req: Request<ListDefinitionsRequest>) -> Reply<ListDefinitionsResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let r = req.into_inner();
        let ds = self
            .node
            .scheduler()
            .list_definitions(&or_default(&r.namespace))
            .await
            .map_err(|e| status(&e))?;
        ok(ListDefinitionsResponse { definitions: ds.iter().map(convert::definition).collect() })
    }
}

#[tonic::async_trait]
impl AdminService for Api {
    async fn nodes(&self, req: Request<Empty>) -> Reply<NodesResponse> {
        self.authorize(&req, ALL, Scope::Admin).await?;
        let nodes = self.node.scheduler().nodes().await.map_err(|e| status(&e))?;
        ok(NodesResponse { nodes: nodes.iter().map(convert::node).collect() })
    }

    async fn shards(&self, req: Request<ShardsRequest>) -> Reply<ShardsResponse> {
        self.authorize(&req, ALL, Scope::Admin).await?;
        let space = match req.into_inner().space.as_str() {
            "" | "executions" => Space::Executions,
            "cron" => Space::Cron,
            other => {
                return Err(status(&invalid(
                    "space",
                    format!("{other:?} is not executions or cron"),
                )));
            }
        };
        let sched = self.node.scheduler();
        let leases = sched.partition_leases(space).await.map_err(|e| status(&e))?;
        ok(ShardsResponse {
            leases: leases.iter().map(convert::lease).collect(),
            shard_count: sched.partition_count(space),
        })
    }

    async fn stats(&self, req: Request<StatsRequest>) -> Reply<StatsResponse> {
        // Every namespace's counts are for keys of every namespace.
        let ns = match req.get_ref().namespace.as_str() {
            "" => ALL.to_string(),
            ns => ns.to_string(),
        };
        self.authorize(&req, &ns, Scope::Read).await?;
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
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let mut q = list_query(req.into_inner()).map_err(|e| status(&e))?;
        q.status = Some(storage::ExecutionStatus::Failed);
        let page = self.node.scheduler().list(&q).await.map_err(|e| status(&e))?;
        ok(ListExecutionsResponse {
            executions: page.executions.iter().map(convert::execution).collect(),
            next_cursor: page.next_cursor.unwrap_or_default(),
            unreadable_ids: page.unreadable,
        })
    }

    async fn quarantined(&self, req: Request<QuarantinedRequest>) -> Reply<QuarantinedResponse> {
        self.authorize(&req, ALL, Scope::Admin).await?;
        let limit = match req.into_inner().limit {
            0 => 100,
            n => n as usize,
        };
        let records = self.node.scheduler().quarantined(limit).await.map_err(|e| status(&e))?;
        ok(QuarantinedResponse { records: records.iter().map(convert::quarantined).collect() })
    }

    async fn create_api_key(
        &self,
        req: Request<CreateApiKeyRequest>,
    ) -> Reply<CreateApiKeyResponse> {
        let ns = req.get_ref().namespace.clone();
        if ns.is_empty() {
            return Err(status(&invalid(
                "namespace",
                "is required: a namespace, or * for every one",
            )));
        }
        let caller = self.authorize(&req, &ns, Scope::Admin).await?;
        let r = req.into_inner();
        let k = self
            .node
            .scheduler()
            .create_api_key(&ns, &r.scopes, &r.name, &caller.who)
            .await
            .map_err(|e| status(&e))?;
        ok(CreateApiKeyResponse { key: Some(convert::api_key(&k.key)), token: k.token })
    }

    async fn list_api_keys(&self, req: Request<ListApiKeysRequest>) -> Reply<ListApiKeysResponse> {
        let caller = self.principal(&req).await?;
        let ns = req.into_inner().namespace;
        // Empty: every key the caller administers.
        let filter = match (ns.is_empty(), caller.all_namespaces()) {
            (true, true) => None,
            (true, false) => Some(caller.namespace.clone()),
            (false, _) => Some(ns),
        };
        caller.allow(filter.as_deref().unwrap_or(ALL), Scope::Admin).map_err(|e| status(&e))?;
        let keys =
            self.node.scheduler().list_api_keys(filter.as_deref()).await.map_err(|e| status(&e))?;
        ok(ListApiKeysResponse { keys: keys.iter().map(convert::api_key).collect() })
    }

    async fn revoke_api_key(&self, req: Request<RevokeApiKeyRequest>) -> Reply<ApiKeyResponse> {
        let caller = self.principal(&req).await?;
        let id = req.into_inner().id;
        let sched = self.node.scheduler();
        let not_found =
            || status(&ops::Error::NotFound { what: "API key", id: ops::error::shown(&id) });
        // A key the caller does not administer is "not found" (not a hint that it exists).
        let key = sched.api_key(&id).await.map_err(|e| status(&e))?.ok_or_else(not_found)?;
        if caller.allow(&key.namespace, Scope::Admin).is_err() {
            return Err(not_found());
        }
        let key = sched.revoke_api_key(&id, &caller.who).await.map_err(|e| status(&e))?;
        self.node.auth().forget(&id);
        ok(ApiKeyResponse { key: Some(convert::api_key(&key)) })
    }

    async fn audit_log(&self, req: Request<AuditLogRequest>) -> Reply<AuditLogResponse> {
        let caller = self.authorize(&req, &req.get_ref().namespace, Scope::Admin).await?;
        drop(caller);
        let r = req.into_inner();
        let limit = if r.limit == 0 { 100 } else { r.limit as usize };
        let records = self
            .node
            .scheduler()
            .audit_log(&or_default(&r.namespace), r.from_ms, limit)
            .await
            .map_err(|e| status(&e))?;
        ok(AuditLogResponse { entries: records.iter().map(convert::audit).collect() })
    }

    async fn who_am_i(&self, req: Request<Empty>) -> Reply<WhoAmIResponse> {
        let p = self.principal(&req).await?;
        ok(WhoAmIResponse {
            who: p.who,
            namespace: p.namespace,
            scopes: p.scopes,
            authentication: self.node.auth().mode() == crate::server::auth::AuthMode::Keys,
        })
    }

    async fn limits(&self, req: Request<LimitsRequest>) -> Reply<LimitsResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let ns = or_default(&req.into_inner().namespace);
        let config = self.node.config();
        let quota = config.quotas.of(&ns);
        let counts = self.node.scheduler().status_counts(&ns).await.map_err(|e| status(&e))?;
        use storage::ExecutionStatus as S;
        let pending = counts
            .iter()
            .filter(|(s, _)| matches!(s, S::Scheduled | S::Ready | S::Running | S::RetryWait))
            .map(|(_, n)| (*n).max(0) as u64)
            .sum();
        use kairos_layer::limits as l;
        ok(LimitsResponse {
            namespace: ns.clone(),
            submit_per_s: quota.submit_per_s,
            pending_max: quota.pending_max,
            pending,
            retention_days: config
                .namespace_retention_days
                .get(&ns)
                .copied()
                .unwrap_or(config.retention_days),
            input_bytes_max: match quota.inputs_bytes_max {
                0 => l::INPUT_BYTES_MAX as u32,
                n => n.min(l::INPUT_BYTES_MAX as u32),
            },
            output_bytes_max: l::OUTPUT_BYTES_MAX as u32,
            definition_bytes_max: match quota.definition_bytes_max {
                0 => kairos_layer::kv::limits::VALUE_BYTES_MAX as u32,
                n => n.min(kairos_layer::kv::limits::VALUE_BYTES_MAX as u32),
            },
        })
    }
}
