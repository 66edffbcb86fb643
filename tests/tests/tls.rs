//! TLS over real listeners, with certificates made here: the node's gRPC and HTTP
//! listeners with the right CA, a client trusting another CA refused, mutual TLS on gRPC (a
//! client without a certificate, or with one from another CA, refused; a worker with a good one
//! runs tasks), certificate files replaced while the node runs and served to new connections;
//! then the real binaries: `kairos dev` with TLS flags, `kairosctl` and `kairos worker` over
//! `https://` with `--ca-cert`, `--client-cert`, `--client-key` (and their environment
//! variables), a reload on SIGHUP, and `kairos serve` requiring API keys over TLS.
#![allow(clippy::disallowed_methods)] // real time, real processes

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kairos_actors::api::{grpc::Api, http};
use kairos_actors::node::Node;
use kairos_actors::server::config::{Backend, NodeConfig};
use kairos_actors::server::tls::{ServerTls, TlsFiles};
use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use kairos_proto::v1::ExecutionStatus;
use kairos_sdk::{Client, Tls, Worker};
use kairos_tests::dev::{Killed, free_port_pair};
use kairos_tests::pki::{Ca, Leaf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto::ring};

const ECHO: &str = "name: echo\nversion: 1\ninputs:\n  name: string\nexecution:\n  type: command\n  command: [\"sh\", \"-c\", \"cat\"]\n";
const HELD: &str = "name: held\nversion: 1\nexecution: {type: test}\n";

async fn node() -> Node {
    let clock: SharedClock = Arc::new(SystemClock::default());
    let db = MemoryDatabase::open(clock.clone(), Rng::seeded(1), FaultConfig::none());
    let config = NodeConfig {
        node_id: Some("tls-test".into()),
        backend: Backend::Memory,
        shard_count: 4,
        poll_interval_ms: 200,
        ..NodeConfig::default()
    };
    Node::start(config, db, clock, Rng::seeded(2)).await.unwrap()
}

/// A node served over TLS on both listeners: `(node, gRPC address, HTTP address)`.
async fn serve(tls: &ServerTls) -> (Node, SocketAddr, SocketAddr) {
    let node = node().await;
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let (grpc, _) = Api::new(node.clone())
        .serve_with(any, Some(tls.clone()), std::future::pending())
        .await
        .unwrap();
    let (http, _) = http::serve_with(any, node.clone(), Some(tls.clone()), std::future::pending())
        .await
        .unwrap();
    (node, grpc, http)
}

/// Server files in `dir`: a certificate for localhost/127.0.0.1 signed by `ca`.
fn server_files(dir: &Path, ca: &Ca, client_ca: Option<PathBuf>) -> (TlsFiles, Leaf) {
    let leaf = ca.server("node");
    let (cert, key) = leaf.write(dir, "node");
    (TlsFiles { cert, key, client_ca }, leaf)
}

fn tls_with_ca(ca: &Path) -> Tls {
    Tls { ca_cert: Some(ca.to_path_buf()), ..Tls::default() }
}

/// A raw TLS handshake with `addr` trusting `ca_pem`, offering `alpn`, presenting `client`.
async fn handshake(
    addr: SocketAddr,
    ca_pem: &str,
    alpn: &[u8],
    client: Option<&Leaf>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match client {
        Some(l) => {
            let certs = CertificateDer::pem_slice_iter(l.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(l.key_pem.as_bytes()).unwrap();
            builder.with_client_auth_cert(certs, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    TlsConnector::from(Arc::new(config)).connect(name, tcp).await
}

/// The certificate the listener at `addr` presents to a new connection (DER).
async fn presented(addr: SocketAddr, ca_pem: &str, alpn: &[u8]) -> std::io::Result<Vec<u8>> {
    let s = handshake(addr, ca_pem, alpn, None).await?;
    Ok(s.get_ref().1.peer_certificates().unwrap()[0].to_vec())
}

/// `GET path` over HTTPS on a new connection: the response's text.
async fn https_get(addr: SocketAddr, ca_pem: &str, path: &str) -> std::io::Result<String> {
    let mut s = handshake(addr, ca_pem, b"http/1.1", None).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    match s.read_to_end(&mut buf).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !buf.is_empty() => {}
        Err(e) => return Err(e),
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Connects and makes one call: whether the node served it.
async fn call(endpoint: &str, tls: &Tls) -> Result<(), kairos_sdk::Error> {
    let client = Client::connect_tls(endpoint, tls).await?;
    client.list_definitions().await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_and_http_over_tls_with_the_right_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("kairos test CA");
    let ca_file = ca.write(dir.path(), "ca.pem");
    let (files, leaf) = server_files(dir.path(), &ca, None);
    let tls = ServerTls::load(files).unwrap();
    let (_node, grpc, http) = serve(&tls).await;

    // gRPC: the SDK over https:// with the CA.
    let client =
        Client::connect_tls(&format!("https://127.0.0.1:{}", grpc.port()), &tls_with_ca(&ca_file))
            .await
            .unwrap();
    let (def, created) = client.register_definition(ECHO).await.unwrap();
    assert!(created);
    assert_eq!(def.name, "echo");
    assert_eq!(client.list_definitions().await.unwrap().len(), 1);
    // By name too (the certificate's DNS name).
    let by_name = format!("https://localhost:{}", grpc.port());
    call(&by_name, &tls_with_ca(&ca_file)).await.unwrap();

    // HTTP: the JSON API and /healthz over HTTPS, the node's certificate presented.
    let r = https_get(http, &ca.pem(), "/definitions").await.unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("\"echo\""), "{r}");
    assert_eq!(presented(http, &ca.pem(), b"http/1.1").await.unwrap(), leaf.der);
    assert_eq!(presented(grpc, &ca.pem(), b"h2").await.unwrap(), leaf.der);

    // Plain text to a TLS listener gets no answer.
    let port = http.port();
    let plain = tokio::task::spawn_blocking(move || {
        kairos_tests::http_request(port, "GET", "/healthz", &[], b"")
    })
    .await
    .unwrap();
    assert!(!matches!(plain, Ok((200, _))), "plain HTTP is not served: {plain:?}");
    let plain_grpc = call(&format!("http://127.0.0.1:{}", grpc.port()), &Tls::default()).await;
    assert!(plain_grpc.is_err(), "plain gRPC is not served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("kairos test CA");
    let (files, _) = server_files(dir.path(), &ca, None);
    let tls = ServerTls::load(files).unwrap();
    let (_node, grpc, http) = serve(&tls).await;
    let other = Ca::new("another CA");
    let other_file = other.write(dir.path(), "other.pem");
    let endpoint = format!("https://127.0.0.1:{}", grpc.port());

    // gRPC: the SDK with the wrong CA, and with the default (webpki) roots.
    let e = call(&endpoint, &tls_with_ca(&other_file)).await.unwrap_err();
    assert!(
        matches!(e, kairos_sdk::Error::Connect { .. }) && e.to_string().contains("UnknownIssuer"),
        "{e}"
    );
    let e = call(&endpoint, &Tls::default()).await.unwrap_err();
    assert!(e.to_string().contains("UnknownIssuer"), "webpki roots do not know the test CA: {e}");

    // HTTP: the handshake fails.
    let e = https_get(http, &other.pem(), "/healthz").await.unwrap_err();
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");

    // TLS options with a plain endpoint are a mistake, not silently ignored.
    let e = call(&format!("http://127.0.0.1:{}", grpc.port()), &tls_with_ca(&other_file))
        .await
        .unwrap_err();
    assert!(matches!(e, kairos_sdk::Error::Invalid(_)) && e.to_string().contains("https"), "{e}");
    // A missing CA file is named.
    let e = call(&endpoint, &tls_with_ca(&dir.path().join("nope.pem"))).await.unwrap_err();
    assert!(e.to_string().contains("nope.pem"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_workers_without_a_good_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("kairos test CA");
    let ca_file = ca.write(dir.path(), "ca.pem");
    let workers_ca = Ca::new("kairos workers CA");
    let workers_ca_file = workers_ca.write(dir.path(), "workers-ca.pem");
    let (files, _) = server_files(dir.path(), &ca, Some(workers_ca_file));
    let tls = ServerTls::load(files).unwrap();
    let (node, grpc, http) = serve(&tls).await;
    let endpoint = format!("https://127.0.0.1:{}", grpc.port());

    // No client certificate: refused.
    // (TLS 1.3 refuses a client certificate after the client's side of the handshake: the
    // call fails, with the node's alert as the reason when it reached the client first, else
    // as a closed connection.)
    let e = call(&endpoint, &tls_with_ca(&ca_file)).await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    // A certificate from another CA (here the server CA): refused.
    let stranger = ca.client("stranger");
    let (sc, sk) = stranger.write(dir.path(), "stranger");
    let strangers =
        Tls { ca_cert: Some(ca_file.clone()), client_cert: Some(sc), client_key: Some(sk) };
    let e = call(&endpoint, &strangers).await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    // A raw handshake without a certificate: the node's alert says why.
    let mut s = handshake(grpc, &ca.pem(), b"h2", None).await.unwrap();
    let _ = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    let e = s.read(&mut [0u8; 64]).await.unwrap_err();
    assert!(e.to_string().contains("CertificateRequired"), "{e}");
    let mut s = handshake(grpc, &ca.pem(), b"h2", Some(&stranger)).await.unwrap();
    let _ = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    let e = s.read(&mut [0u8; 64]).await.unwrap_err();
    assert!(e.to_string().contains("UnknownCA"), "{e}");

    // A worker with a certificate from the workers' CA: served, runs a task.
    let good = workers_ca.client("worker-1");
    let (gc, gk) = good.write(dir.path(), "worker-1");
    let workers =
        Tls { ca_cert: Some(ca_file.clone()), client_cert: Some(gc), client_key: Some(gk) };
    let client = Client::connect_tls(&endpoint, &workers).await.unwrap();
    client.register_definition(HELD).await.unwrap();
    while node.owned_shards().len() < 4 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let id = client.submit("registry://jobs/held", 1).send().await.unwrap().execution_id;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let worker = Worker::new(client.clone(), "held", "w-mtls")
        .handle("held", |_task| async { Ok(serde_json::json!({"ok": true})) });
    let run = tokio::spawn(worker.run(stopped));
    let done = client.wait(&id, Duration::from_secs(20)).await.unwrap();
    assert_eq!(done.status(), ExecutionStatus::Succeeded);
    let _ = stop.send(true);
    run.await.unwrap().unwrap();

    // The HTTP listener does not ask for client certificates (probes, scrapers).
    let r = https_get(http, &ca.pem(), "/healthz").await.unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_certificate_files_are_served_to_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("kairos test CA");
    let ca_file = ca.write(dir.path(), "ca.pem");
    let (files, first) = server_files(dir.path(), &ca, None);
    let tls = ServerTls::load(files.clone()).unwrap();
    let watch = tls.watch(Some(Duration::from_millis(100)));
    let (_node, grpc, http) = serve(&tls).await;
    let endpoint = format!("https://127.0.0.1:{}", grpc.port());
    let open = Client::connect_tls(&endpoint, &tls_with_ca(&ca_file)).await.unwrap();
    open.list_definitions().await.unwrap();
    assert_eq!(presented(http, &ca.pem(), b"http/1.1").await.unwrap(), first.der);

    // Half a rotation (a new certificate, the old key): not a usable pair, the first stays.
    let second = ca.server("node, renewed");
    std::fs::write(&files.cert, &second.cert_pem).unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(presented(http, &ca.pem(), b"http/1.1").await.unwrap(), first.der);
    assert_eq!(presented(grpc, &ca.pem(), b"h2").await.unwrap(), first.der);

    // The key follows: new connections get the new certificate, on both listeners, without a
    // restart.
    std::fs::write(&files.key, &second.key_pem).unwrap();
    let t = Instant::now();
    while presented(http, &ca.pem(), b"http/1.1").await.unwrap() != second.der {
        assert!(t.elapsed() < Duration::from_secs(10), "the new certificate is not served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(presented(grpc, &ca.pem(), b"h2").await.unwrap(), second.der);
    // The connection opened before goes on; a new one works too.
    open.list_definitions().await.unwrap();
    call(&endpoint, &tls_with_ca(&ca_file)).await.unwrap();

    // A certificate from a new CA: clients trusting only the old one are refused from now on.
    let new_ca = Ca::new("kairos test CA 2");
    let new_ca_file = new_ca.write(dir.path(), "ca2.pem");
    let third = new_ca.server("node, new CA");
    third.write(dir.path(), "node");
    let t = Instant::now();
    while presented(grpc, &new_ca.pem(), b"h2").await.map_or(true, |d| d != third.der) {
        assert!(t.elapsed() < Duration::from_secs(10), "the new CA's certificate is not served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    call(&endpoint, &tls_with_ca(&new_ca_file)).await.unwrap();
    call(&endpoint, &tls_with_ca(&ca_file)).await.unwrap_err();
    watch.abort();
}

// The real binaries.

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const KAIROSCTL: &str = env!("CARGO_BIN_EXE_e2e-kairosctl");

/// `kairosctl args` with `env`: `(exit code, stdout, stderr)`.
fn ctl(args: &[&str], env: &[(&str, &Path)]) -> (i32, String, String) {
    let mut c = Command::new(KAIROSCTL);
    c.args(args).stdin(Stdio::null());
    for v in ["KAIROS_ENDPOINT", "KAIROS_CA_CERT", "KAIROS_CLIENT_CERT", "KAIROS_CLIENT_KEY"] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binaries_over_https_with_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("kairos test CA");
    let ca_file = ca.write(d, "ca.pem");
    let workers_ca = Ca::new("kairos workers CA");
    let workers_ca_file = workers_ca.write(d, "workers-ca.pem");
    let (node_cert, node_key) = ca.server("node").write(d, "node");
    let (client_cert, client_key) = workers_ca.client("ops").write(d, "ops");
    let (http, grpc) = free_port_pair();
    let data = d.join("data");
    let node = Killed(
        Command::new(KAIROS)
            .args(["dev", "--data-dir", data.to_str().unwrap(), "--log", "warn"])
            .args(["--listen-http", &format!("127.0.0.1:{http}")])
            .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
            .args(["--tls-cert-file", node_cert.to_str().unwrap()])
            .args(["--tls-key-file", node_key.to_str().unwrap()])
            .env("KAIROS_TLS_CLIENT_CA_FILE", &workers_ca_file)
            // Reloaded on SIGHUP only, below.
            .env("KAIROS_TLS_RELOAD_MS", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let http_addr: SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
    let t = Instant::now();
    loop {
        match https_get(http_addr, &ca.pem(), "/healthz").await {
            Ok(r) if r.starts_with("HTTP/1.1 200") && r.contains("shards=64") => break,
            _ if t.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            r => panic!("the node did not become healthy over HTTPS: {r:?}"),
        }
    }
    let endpoint = format!("https://127.0.0.1:{grpc}");
    let file = d.join("echo.yaml");
    std::fs::write(&file, ECHO).unwrap();
    let (ca_s, cert_s, key_s) =
        (ca_file.to_str().unwrap(), client_cert.to_str().unwrap(), client_key.to_str().unwrap());

    // kairosctl with flags.
    let mtls = ["--endpoint", endpoint.as_str(), "--ca-cert", ca_s, "--client-cert", cert_s];
    let mtls = [&mtls[..], &["--client-key", key_s]].concat();
    let (code, _, err) =
        ctl(&[&mtls[..], &["definitions", "apply", file.to_str().unwrap()]].concat(), &[]);
    assert_eq!(code, 0, "{err}");
    // Without a client certificate: refused.
    let (code, out, _) =
        ctl(&["--endpoint", &endpoint, "--ca-cert", ca_s, "definitions", "list"], &[]);
    assert_ne!(code, 0, "served without a client certificate: {out}");
    // A client certificate without its key: a usage error.
    let (code, _, _) =
        ctl(&["--endpoint", &endpoint, "--client-cert", cert_s, "definitions", "list"], &[]);
    assert_eq!(code, 2);

    // kairos worker without one: stops with the reason (no silent retrying).
    let o = Command::new(KAIROS)
        .args(["worker", "--endpoint", &endpoint, "--queue", "echo", "--ca-cert", ca_s])
        .env_remove("KAIROS_CLIENT_CERT")
        .env_remove("KAIROS_CLIENT_KEY")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("CertificateRequired"), "{stderr}");
    // Nor with a CA that did not sign the node's certificate.
    let o = Command::new(KAIROS)
        .args(["worker", "--endpoint", &endpoint, "--queue", "echo"])
        .args(["--ca-cert", workers_ca_file.to_str().unwrap(), "--client-cert", cert_s])
        .args(["--client-key", key_s])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");

    // kairos worker with the environment variables, kairosctl with them too.
    let env: [(&str, &Path); 3] = [
        ("KAIROS_CA_CERT", &ca_file),
        ("KAIROS_CLIENT_CERT", &client_cert),
        ("KAIROS_CLIENT_KEY", &client_key),
    ];
    let mut w = Command::new(KAIROS);
    w.args(["worker", "--endpoint", &endpoint, "--queue", "echo"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        w.env(k, v);
    }
    let _worker = Killed(w.spawn().unwrap());
    let (code, out, err) = ctl(
        &[
            "--endpoint",
            &endpoint,
            "--json",
            "submit",
            "registry://jobs/echo",
            "1",
            "--inputs",
            r#"{"name": "x"}"#,
        ],
        &env,
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let id = v["execution"]["executionId"].as_str().unwrap().to_string();
    let (code, out, err) =
        ctl(&["--endpoint", &endpoint, "--json", "wait", &id, "--timeout", "30"], &env);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("SUCCEEDED"), "{out}");

    // A renewed certificate, then SIGHUP: new connections get it, the node runs on.
    let renewed = ca.server("node, renewed");
    renewed.write(d, "node");
    let grpc_addr: SocketAddr = format!("127.0.0.1:{grpc}").parse().unwrap();
    assert_ne!(presented(grpc_addr, &ca.pem(), b"h2").await.unwrap(), renewed.der, "not before");
    let pid = node.0.id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    let t = Instant::now();
    while presented(grpc_addr, &ca.pem(), b"h2").await.unwrap() != renewed.der {
        assert!(t.elapsed() < Duration::from_secs(10), "SIGHUP did not reload the certificate");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(presented(http_addr, &ca.pem(), b"http/1.1").await.unwrap(), renewed.der);
    let (code, _, err) = ctl(&["--endpoint", &endpoint, "definitions", "list"], &env);
    assert_eq!(code, 0, "{err}");
}

/// TLS and API keys together: `kairos serve` (keys required) over TLS; `kairosctl` with
/// `--ca-cert` and the key, HTTPS with a bearer token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("kairos test CA");
    let ca_file = ca.write(d, "ca.pem");
    let (node_cert, node_key) = ca.server("node").write(d, "node");
    let (http, grpc) = free_port_pair();
    let data = d.join("data");
    let _node = Killed(
        Command::new(KAIROS)
            .args(["serve", "--data-dir", data.to_str().unwrap(), "--log", "warn"])
            .args(["--listen-http", &format!("127.0.0.1:{http}")])
            .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
            .env("KAIROS_TLS_CERT_FILE", &node_cert)
            .env("KAIROS_TLS_KEY_FILE", &node_key)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
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
    let endpoint = format!("https://127.0.0.1:{grpc}");
    let ca_s = ca_file.to_str().unwrap();
    let (code, _, err) = ctl(
        &["--endpoint", &endpoint, "--ca-cert", ca_s, "--api-key", &key, "definitions", "list"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) =
        ctl(&["--endpoint", &endpoint, "--ca-cert", ca_s, "definitions", "list"], &[]);
    assert_eq!(code, 7, "no key: not allowed, over TLS too\n{err}");

    let http_addr: SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
    let mut s = handshake(http_addr, &ca.pem(), b"http/1.1", None).await.unwrap();
    let req = format!(
        "GET /definitions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    let r = String::from_utf8_lossy(&buf);
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let r = https_get(http_addr, &ca.pem(), "/definitions").await.unwrap();
    assert!(r.starts_with("HTTP/1.1 401"), "{r}");
}

/// The web console over TLS: its session cookies (here the CSRF token's, set on the first page)
/// are marked `Secure`, so a browser never sends them over plain HTTP; and `HttpOnly`,
/// `SameSite=Strict`, scoped to `/ui`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_session_cookie_is_secure_under_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("kairos test CA");
    let (files, _) = server_files(dir.path(), &ca, None);
    let tls = ServerTls::load(files).unwrap();
    let (_node, _, http) = serve(&tls).await;
    let r = https_get(http, &ca.pem(), "/ui/executions").await.unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let cookie = r
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie: kairos_csrf="))
        .unwrap_or_else(|| panic!("no session cookie set: {r}"));
    for part in ["; Secure", "; HttpOnly", "; SameSite=Strict", "; Path=/ui"] {
        assert!(cookie.contains(part), "{part} missing: {cookie}");
    }
}
