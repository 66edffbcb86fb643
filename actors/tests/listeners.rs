//! Every listener sets TCP_NODELAY on the connections it accepts: without it each reply's last
//! segment waits for the client's delayed ACK (~40 ms per call), which capped a worker at a few
//! hundred calls per second. And a listener admits at most its limits: the excess is closed at
//! once, before anything is read; an idle connection, or one whose first bytes are late (gRPC:
//! the HTTP/2 preface), is closed.
#![allow(clippy::disallowed_methods)] // real sockets on the real timer

use std::time::Duration;

use kairos_actors::server::conns::{self, ConnLimits, Gate};
use tokio::io::AsyncReadExt;

fn limits(max: usize, per_peer: usize) -> ConnLimits {
    ConnLimits { max, per_peer, idle: Duration::from_secs(60), first_bytes: None }
}

#[tokio::test]
async fn connections_are_accepted_with_nodelay() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut admitted = conns::accept(listener, Gate::new("test", limits(8, 8)));
    let client = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(!client.nodelay().unwrap(), "the client side is left alone");
    let (server_side, _) = admitted.recv().await.unwrap();
    assert!(server_side.get_ref().nodelay().unwrap(), "the accepted socket has TCP_NODELAY");
}

#[tokio::test]
async fn connections_over_the_limits_are_closed_at_once() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let gate = Gate::new("test", limits(3, 2));
    let mut admitted = conns::accept(listener, gate.clone());
    let from = |ip: &str| {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(format!("{ip}:0").parse().unwrap()).unwrap();
        s.connect(addr)
    };
    let _a1 = from("127.0.0.2").await.unwrap();
    let _a2 = from("127.0.0.2").await.unwrap();
    let mut a3 = from("127.0.0.2").await.unwrap();
    // The third from one address: closed without a byte (end of stream at once).
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), a3.read(&mut buf)).await;
    assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "{n:?}");
    let _b1 = from("127.0.0.3").await.unwrap();
    let mut b2 = from("127.0.0.3").await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), b2.read(&mut buf)).await;
    assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "the listener is full: {n:?}");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(admitted.recv().await.unwrap());
    }
    assert_eq!(gate.open(), 3);
    held.clear();
    assert_eq!(gate.open(), 0, "a closed connection gives its place back");
}

#[tokio::test]
async fn an_idle_connection_is_closed() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let short = ConnLimits { idle: Duration::from_millis(300), ..limits(8, 8) };
    let mut admitted = conns::accept(listener, Gate::new("test", short));
    let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut io, _) = admitted.recv().await.unwrap();
    let mut buf = [0u8; 1];
    let r = tokio::time::timeout(Duration::from_secs(5), io.read(&mut buf)).await.unwrap();
    assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
}

#[tokio::test]
async fn a_connection_whose_first_bytes_are_late_is_closed() {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let opening = Some((24, Duration::from_millis(300)));
    let limits = ConnLimits { first_bytes: opening, ..limits(8, 8) };
    let mut admitted = conns::accept(listener, Gate::new("test", limits));
    let mut buf = [0u8; 64];
    // Half the preface, then a byte now and then (never idle): closed at the deadline.
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"PRI * HTTP/2").await.unwrap();
    let (mut io, _) = admitted.recv().await.unwrap();
    let drip = tokio::spawn(async move {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if slow.write_all(b".").await.is_err() {
                break;
            }
        }
    });
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match io.read(&mut buf).await {
                Ok(0) => panic!("the client did not close"),
                Ok(_) => continue,
                Err(e) => return e,
            }
        }
    });
    let e = closed.await.expect("closed before the drip ended");
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    drip.abort();
    // The first bytes in time: then only the idle time-out applies.
    let mut prompt = tokio::net::TcpStream::connect(addr).await.unwrap();
    prompt.write_all(&[b'x'; 24]).await.unwrap();
    let (mut io, _) = admitted.recv().await.unwrap();
    let mut got = 0;
    while got < 24 {
        got += io.read(&mut buf).await.unwrap();
    }
    let r = tokio::time::timeout(Duration::from_millis(800), io.read(&mut buf)).await;
    assert!(r.is_err(), "still open past the first-bytes deadline: {r:?}");
}
