//! With the `otel` feature: the node's execution spans reach an OTLP/HTTP collector as
//! children of the trace context the submit carried. The collector here is a real HTTP
//! server on a local port that keeps what it is sent.
//! Run: `cargo test -p kairos-actors --features otel --test otel` (in `.ci/run`).
#![cfg(feature = "otel")]

use std::sync::{Arc, Mutex};

use kairos_actors::server::config::NodeConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Accepts OTLP/HTTP posts and keeps their bodies.
async fn collector() -> (String, Arc<Mutex<Vec<Vec<u8>>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/traces", l.local_addr().unwrap());
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = got.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let keep = keep.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + len {
                        keep.lock().unwrap().push(buf[end + 4..end + 4 + len].to_vec());
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
                        buf.drain(..end + 4 + len);
                    }
                }
            });
        }
    });
    (url, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execution_spans_join_the_submitters_trace() {
    let (url, got) = collector().await;
    let config = NodeConfig { otlp_endpoint: Some(url), ..NodeConfig::default() };
    let guard = kairos_actors::server::telemetry::init(&config).unwrap();
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let tp = format!("00-{trace_id}-00f067aa0ba902b7-01");
    {
        let span = kairos_actors::server::telemetry::execution_span("kairos.submit", &tp);
        span.record("execution_id", "01EXAMPLE");
        let _in = span.enter();
    }
    // Dropping the guard flushes the exporter (blocking: off the runtime's threads).
    tokio::task::spawn_blocking(move || drop(guard)).await.unwrap();
    let bodies = got.lock().unwrap().clone();
    let all: Vec<u8> = bodies.concat();
    assert!(!all.is_empty(), "the collector received spans");
    let id: Vec<u8> =
        (0..16).map(|i| u8::from_str_radix(&trace_id[2 * i..2 * i + 2], 16).unwrap()).collect();
    assert!(all.windows(16).any(|w| w == id.as_slice()), "the span is in the submitter's trace");
    assert!(all.windows(13).any(|w| w == b"kairos.submit"), "named kairos.submit");
    assert!(all.windows(9).any(|w| w == b"01EXAMPLE"), "with the execution id");
}
