//! The real gRPC services served over turmoil's simulated TCP, and SDK channels to them.
//!
//! hyper's HTTP/2 server writes a `date:` header from the real clock; it is turned off
//! (`auto_date_header(false)`) or traces would differ between runs (see FEASIBILITY.md).

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use kairos_actors::api::grpc::Api;
use kairos_actors::node::Node;
use kairos_proto::v1::admin_service_server::AdminServiceServer;
use kairos_proto::v1::cron_service_server::CronServiceServer;
use kairos_proto::v1::definition_service_server::DefinitionServiceServer;
use kairos_proto::v1::execution_service_server::ExecutionServiceServer;
use kairos_proto::v1::worker_service_server::WorkerServiceServer;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

/// The port every node serves gRPC on.
pub const GRPC_PORT: u16 = 7071;

/// HTTP/2 pings both ways: a connection whose packets a partition dropped is dead for good
/// (turmoil's TCP does not retransmit), as a half-open connection is in real life; the ping
/// going unanswered is how either side learns it and reconnects.
const KEEP_ALIVE: Duration = Duration::from_secs(2);

/// Serves the node's gRPC services on the host's simulated network until the host stops.
pub async fn serve(node: Node) -> std::io::Result<()> {
    let api = Api::new(node);
    let routes = tonic::service::Routes::new(ExecutionServiceServer::new(api.clone()))
        .add_service(WorkerServiceServer::new(api.clone()))
        .add_service(DefinitionServiceServer::new(api.clone()))
        .add_service(CronServiceServer::new(api.clone()))
        .add_service(AdminServiceServer::new(api))
        .prepare();
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", GRPC_PORT)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let service = TowerToHyperService::new(routes.clone());
        tokio::spawn(async move {
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .auto_date_header(false)
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(KEEP_ALIVE))
                .keep_alive_timeout(KEEP_ALIVE)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// A lazily connecting channel to `host`'s gRPC services (reconnects by itself after the host
/// restarts).
pub fn channel(host: &str) -> Channel {
    let target = format!("{host}:{GRPC_PORT}");
    let connector = tower::service_fn(move |_: Uri| {
        let target = target.clone();
        async move {
            let s = turmoil::net::TcpStream::connect(target).await?;
            Ok::<_, std::io::Error>(TokioIo::new(s))
        }
    });
    Endpoint::from_shared(format!("http://{host}:{GRPC_PORT}"))
        .expect("a valid endpoint")
        .connect_timeout(Duration::from_secs(2))
        .http2_keep_alive_interval(KEEP_ALIVE)
        .keep_alive_timeout(KEEP_ALIVE)
        .keep_alive_while_idle(true)
        .connect_with_connector_lazy(connector)
}
