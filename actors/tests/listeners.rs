//! Every listener sets TCP_NODELAY on the connections it accepts: without it each reply's last
//! segment waits for the client's delayed ACK (~40 ms per call), which capped a worker at a few
//! hundred calls per second.

use axum::serve::Listener;
use kairos_actors::api::{grpc, http};
use tonic::codegen::tokio_stream::StreamExt;

#[tokio::test]
async fn grpc_connections_are_accepted_with_nodelay() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut accepted = Box::pin(grpc::accepted(listener));
    let client = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(!client.nodelay().unwrap(), "the client side is left alone");
    let server_side = accepted.next().await.unwrap().unwrap();
    assert!(server_side.nodelay().unwrap(), "the accepted socket has TCP_NODELAY");
}

#[tokio::test]
async fn http_connections_are_accepted_with_nodelay() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut l = http::with_nodelay(listener);
    let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (io, _) = l.accept().await;
    assert!(io.nodelay().unwrap(), "the accepted socket has TCP_NODELAY");
}
