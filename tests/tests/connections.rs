//! Connection exhaustion against a real node (issue 24): `kairos serve` started under a low
//! descriptor limit (`prlimit --nofile=256:256`), flooded from one address with more half-open
//! connections than it has descriptors on both listeners, still serves `/healthz`, an
//! authenticated gRPC call and a worker from another address; and the half-open connections
//! are closed after the header-read time-out (HTTP) and the preface time-out (gRPC).
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kairos_tests::dev::{Killed, free_port_pair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const KAIROSCTL: &str = env!("CARGO_BIN_EXE_e2e-kairosctl");
const ECHO: &str = "name: echo\nversion: 1\ninputs:\n  name: string\nexecution:\n  type: command\n  command: [\"sh\", \"-c\", \"cat\"]\n";
/// The node's descriptor limit.
const DESCRIPTORS: u32 = 256;
/// Half-open connections opened on each listener: together more than the node's descriptors.
const FLOOD: usize = 200;

/// `kairosctl args` with the key: `(exit code, stdout, stderr)`.
fn ctl(endpoint: &str, key: &str, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(KAIROSCTL)
        .args(["--endpoint", endpoint])
        .args(args)
        .env("KAIROS_API_KEY", key)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.code().unwrap_or(-1), text(&o.stdout), text(&o.stderr))
}

/// A connection from `from` (another loopback address than the checks' 127.0.0.1) that sends
/// `partial` and then nothing.
async fn half_open(from: &str, to: SocketAddr, partial: &[u8]) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(format!("{from}:0").parse().unwrap())?;
    let mut c = s.connect(to).await?;
    let _ = c.write_all(partial).await;
    Ok(c)
}

/// Whether the node closed `c` (end of stream or reset) within `within`.
async fn closed(c: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, c.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// `kairos serve` under `prlimit --nofile=DESCRIPTORS` (a 2 s header time-out), in `dir`: the
/// node and its admin key, once it has checked its descriptors and said what it runs with.
async fn start_node(dir: &std::path::Path, http: u16, grpc: u16) -> (Killed, String) {
    let data = dir.join("data");
    let log = dir.join("node.log");
    let node = Killed(
        Command::new("prlimit")
            .arg(format!("--nofile={DESCRIPTORS}:{DESCRIPTORS}"))
            .arg(KAIROS)
            .args(["serve", "--data-dir", data.to_str().unwrap(), "--log", "warn"])
            .args(["--listen-http", &format!("127.0.0.1:{http}")])
            .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
            .env("KAIROS_HTTP_HEADER_TIMEOUT_MS", "2000")
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.join("node.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    let key_file = data.join("admin-key");
    let t = Instant::now();
    while std::fs::read_to_string(&key_file).map_or(true, |k| k.trim().is_empty()) {
        assert!(t.elapsed() < Duration::from_secs(30), "no admin key written");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let key = std::fs::read_to_string(&key_file).unwrap().trim().to_string();
    let err = std::fs::read_to_string(dir.join("node.err")).unwrap();
    assert!(err.contains(&format!("only {DESCRIPTORS} file descriptors")), "{err}");
    let out = std::fs::read_to_string(&log).unwrap();
    assert!(out.contains("at most 96 connections per listener, 48 per address"), "{out}");
    (node, key)
}

/// A `kairos worker` started against `endpoint` runs an execution submitted there.
fn a_worker_runs_an_execution(dir: &std::path::Path, endpoint: &str, key: &str) {
    let file = dir.join("echo.yaml");
    std::fs::write(&file, ECHO).unwrap();
    let (code, _, err) = ctl(endpoint, key, &["definitions", "apply", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let _worker = Killed(
        Command::new(KAIROS)
            .args(["worker", "--endpoint", endpoint, "--queue", "echo"])
            .env("KAIROS_API_KEY", key)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let submit = ["--json", "submit", "registry://jobs/echo", "1", "--inputs", r#"{"name":"x"}"#];
    let (code, out, err) = ctl(endpoint, key, &submit);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let id = v["execution"]["executionId"].as_str().unwrap().to_string();
    let (code, out, err) = ctl(endpoint, key, &["--json", "wait", &id, "--timeout", "30"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("SUCCEEDED"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_half_open_connections_leaves_the_node_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (http, grpc) = free_port_pair();
    let (node, key) = start_node(dir.path(), http, grpc).await;

    // The flood: half an HTTP request's headers, half an HTTP/2 preface, then silence.
    let http_addr: SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
    let grpc_addr: SocketAddr = format!("127.0.0.1:{grpc}").parse().unwrap();
    let mut flood = Vec::new();
    for _ in 0..FLOOD {
        flood.push(half_open("127.0.0.2", http_addr, b"GET /healthz HTTP/1.1\r\nHo").await);
        flood.push(half_open("127.0.0.2", grpc_addr, b"PRI * HTTP/2.0\r\n").await);
    }
    let opened = flood.iter().filter(|c| c.is_ok()).count();
    assert!(opened > DESCRIPTORS as usize, "only {opened} connections opened");

    // Another address is still served on both listeners, with a key, by a worker.
    let (status, body) =
        kairos_tests::http_request(http, "GET", "/healthz", &[], b"").expect("/healthz");
    assert_eq!(status, 200, "{body}");
    let endpoint = format!("http://127.0.0.1:{grpc}");
    let (code, out, err) = ctl(&endpoint, &key, &["whoami"]);
    assert_eq!(code, 0, "{out}{err}");
    a_worker_runs_an_execution(dir.path(), &endpoint, &key);

    // The half-open HTTP connections the node admitted are closed by the header-read
    // time-out (2 s here): their places come back.
    let mut admitted_http = flood.iter_mut().step_by(2).filter_map(|c| c.as_mut().ok());
    let first = admitted_http.next().unwrap();
    assert!(closed(first, Duration::from_secs(10)).await, "a half-open request stays open");
    // So are the gRPC ones that never finished the HTTP/2 preface (within the same 2 s).
    let mut admitted_grpc = flood.iter_mut().skip(1).step_by(2).filter_map(|c| c.as_mut().ok());
    let first = admitted_grpc.next().unwrap();
    assert!(closed(first, Duration::from_secs(10)).await, "a half-open preface stays open");
    let (status, _) = kairos_tests::http_request_at(
        SocketAddr::from(([127, 0, 0, 1], http)),
        "GET",
        "/metrics",
        &[],
        b"",
    )
    .unwrap();
    assert_eq!(status, 200);
    drop(node);
}
