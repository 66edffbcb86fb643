//! The node's HTTP endpoint: `/metrics` (Prometheus text) and `/healthz`.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::node::Node;

async fn metrics(State(node): State<Node>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], node.metrics_text().await)
}

async fn healthz(State(node): State<Node>) -> impl IntoResponse {
    format!("ok node={} shards={}\n", node.node_id(), node.owned_shards().len())
}

/// The routes of the node's HTTP endpoint.
pub fn router(node: Node) -> Router {
    Router::new().route("/metrics", get(metrics)).route("/healthz", get(healthz)).with_state(node)
}

/// Binds `addr` and serves until `shutdown` completes. Returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    node: Node,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = router(node);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::error!(error = %e, "HTTP server failed");
        }
    });
    Ok((bound, task))
}
