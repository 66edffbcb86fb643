//! The `kairos.v1` gRPC services over a [`Node`], one file per service: [`executions`],
//! [`workers`] (with the `Work` stream in [`work`], results in [`results`]), [`definitions`],
//! [`admin`] (online backups in `backup`), [`cron`].
//! Here: what they share — the caller's principal, a cache of definition versions, claimed
//! executions as tasks — and serving them. Every accepted connection gets `TCP_NODELAY`:
//! without it each reply's last frame waits for the client's delayed ACK (~40 ms per call).

pub mod admin;
mod backup;
pub mod cron;
pub mod definitions;
pub mod executions;
pub mod results;
pub mod track;
pub mod work;
pub mod workers;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_layer::ops::{self, claim::Claimed};
use kairos_proto::storage::v1::JobDefinition;
use kairos_proto::v1::admin_service_server::AdminServiceServer;
use kairos_proto::v1::cron_service_server::CronServiceServer;
use kairos_proto::v1::definition_service_server::DefinitionServiceServer;
use kairos_proto::v1::execution_service_server::ExecutionServiceServer;
use kairos_proto::v1::worker_service_server::WorkerServiceServer;
use kairos_proto::v1::{Task, WorkResponse};
use tonic::codegen::tokio_stream::{self, Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::convert;
use super::errors::status;
use crate::limits::{DEFINITION_CACHE_MAX, GRPC_KEEPALIVE_TIMEOUT_MS};
use crate::node::Node;
use crate::server::auth::{Principal, Scope};
use crate::server::conns::{self, ConnLimits, Gate};
use crate::server::tls::ServerTls;

type Reply<T> = Result<Response<T>, Status>;

/// What a `Work` call returns: the stream of responses.
pub type WorkStream = Pin<Box<dyn Stream<Item = Result<WorkResponse, Status>> + Send + 'static>>;

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
                    tracing::warn!(namespace = %e.namespace, execution_id = %e.id, attempt = e.attempt_count, error = %err, "definition lookup failed for a claimed task");
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
        self.serve_listener(listener, tls, shutdown)
    }

    /// Serves on a listener bound beforehand until `shutdown` completes (see
    /// [`serve_with`](Self::serve_with)).
    pub fn serve_listener(
        self,
        listener: tokio::net::TcpListener,
        tls: Option<ServerTls>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let bound = listener.local_addr()?;
        let config = self.node.config();
        // A connection must send the HTTP/2 preface within the header time-out.
        let preface = (HTTP2_PREFACE_BYTES, Duration::from_millis(config.http_header_timeout_ms));
        let limits = ConnLimits { first_bytes: Some(preface), ..ConnLimits::of(config) };
        let admitted = conns::accept(listener, Gate::new("grpc", limits));
        let router = tonic::transport::Server::builder()
            .max_concurrent_streams(config.grpc_max_concurrent_streams)
            .http2_keepalive_interval(Some(Duration::from_millis(config.grpc_keepalive_ms)))
            .http2_keepalive_timeout(Some(Duration::from_millis(GRPC_KEEPALIVE_TIMEOUT_MS)))
            .layer(track::TrackLayer(self.node.metrics().clone()))
            .add_service(ExecutionServiceServer::new(self.clone()))
            .add_service(WorkerServiceServer::new(self.clone()))
            .add_service(DefinitionServiceServer::new(self.clone()))
            .add_service(CronServiceServer::new(self.clone()))
            .add_service(AdminServiceServer::new(self));
        let task = tokio::spawn(async move {
            let served = match tls {
                None => {
                    let incoming = tokio_stream::wrappers::ReceiverStream::new(admitted)
                        .map(|(io, _peer)| Ok::<_, std::io::Error>(io));
                    router.serve_with_incoming_shutdown(incoming, shutdown).await
                }
                Some(tls) => {
                    let handshaken =
                        crate::server::tls::accept(admitted, move || tls.grpc_config());
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

/// The HTTP/2 connection preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`), a gRPC client's first
/// bytes (under TLS the handshake's come first, bounded by its own time-out).
const HTTP2_PREFACE_BYTES: usize = 24;

/// The `traceparent` metadata of a call.
fn traceparent_of<T>(req: &Request<T>) -> Option<String> {
    req.metadata().get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_string)
}
