//! Online backup and restore of a running node (issue 36): `kairos serve` with mutual TLS and
//! API keys; bursts of executions coming due and a worker completing them while `kairos backup`
//! runs; `kairos restore` into a new data directory (refused into a non-empty one), `kairos
//! check` clean, and a node started on the restored store serving every execution whose submit
//! returned before the backup began. Keys that are not admin keys of `*` are refused.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kairos_proto::v1::{SubmitRequest, submit_batch_item, submit_request};
use kairos_sdk::{Client, Tls, Worker};
use kairos_tests::dev::{Killed, free_port_pair};
use kairos_tests::pki::Ca;
use tokio::sync::watch;

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const BURST: &str = "name: burst\nversion: 1\nexecution: {type: test}\n";

/// The TLS files of a test: the CA, the node's certificate and a client's.
struct Pki {
    ca: PathBuf,
    node: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let ca = Ca::new("kairos backup test CA");
        Pki {
            ca: ca.write(dir, "ca.pem"),
            node: ca.server("node").write(dir, "node"),
            client: ca.client("backup").write(dir, "client"),
        }
    }

    fn tls(&self) -> Tls {
        Tls {
            ca_cert: Some(self.ca.clone()),
            client_cert: Some(self.client.0.clone()),
            client_key: Some(self.client.1.clone()),
        }
    }

    /// The client's TLS flags.
    fn flags(&self) -> Vec<String> {
        let p = |p: &PathBuf| p.to_str().unwrap().to_string();
        vec![
            "--ca-cert".into(),
            p(&self.ca),
            "--client-cert".into(),
            p(&self.client.0),
            "--client-key".into(),
            p(&self.client.1),
        ]
    }
}

/// `kairos serve` on `data`, with mutual TLS when `pki` is given; waits for the admin key.
async fn serve(data: &Path, pki: Option<&Pki>) -> (Killed, String, String) {
    let (http, grpc) = free_port_pair();
    let mut cmd = Command::new(KAIROS);
    cmd.args(["serve", "--data-dir", data.to_str().unwrap(), "--log", "warn"])
        .args(["--listen-http", &format!("127.0.0.1:{http}")])
        .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(p) = pki {
        cmd.arg("--tls-cert-file").arg(&p.node.0).arg("--tls-key-file").arg(&p.node.1);
        cmd.arg("--tls-client-ca-file").arg(&p.ca);
    }
    let node = Killed(cmd.spawn().unwrap());
    let scheme = if pki.is_some() { "https" } else { "http" };
    let key_file = data.join("admin-key");
    let t = Instant::now();
    while std::fs::read_to_string(&key_file).map_or(true, |k| k.trim().is_empty()) {
        assert!(t.elapsed() < Duration::from_secs(30), "no admin key written");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let key = std::fs::read_to_string(&key_file).unwrap().trim().to_string();
    (node, format!("{scheme}://127.0.0.1:{grpc}"), key)
}

/// Connects, retrying while the node starts.
async fn connect(endpoint: &str, tls: &Tls, key: &str) -> Client {
    let t = Instant::now();
    loop {
        if let Ok(c) = Client::connect_tls(endpoint, tls).await {
            let c = c.with_api_key(key).unwrap();
            if c.list_definitions().await.is_ok() {
                return c;
            }
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no node at {endpoint}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `kairos args` with `key` in the environment.
fn kairos(args: &[String], key: &str) -> Output {
    Command::new(KAIROS).args(args).env("KAIROS_API_KEY", key).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Bursts of 200 executions, due 0–300 ms after their submit, until `stop`: every id whose
/// submit returned goes into `acked`.
async fn bursts(client: Client, acked: Arc<Mutex<Vec<String>>>, stop: Arc<AtomicBool>) {
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let requests = (0..200)
            .map(|i| SubmitRequest {
                namespace: "default".into(),
                definition_uri: "registry://jobs/burst".into(),
                definition_version: 1,
                inputs_json: "{}".into(),
                when: Some(submit_request::When::DelayMs(((round * 7 + i) % 4) * 100)),
                ..SubmitRequest::default()
            })
            .collect();
        let items = client.submit_batch(requests).await.expect("a burst is submitted");
        let mut ids = Vec::new();
        for item in items {
            match item {
                submit_batch_item::Result::Ok(s) => ids.push(s.execution_id),
                submit_batch_item::Result::Error(e) => panic!("a submit failed: {e:?}"),
            }
        }
        acked.lock().unwrap().extend(ids);
        round += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A worker completing `burst` executions.
fn worker(client: &Client) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = watch::channel(false);
    let w = Worker::new(client.clone(), "burst", "backup-test-worker")
        .concurrency(32)
        .handle("burst", |_task| async move { Ok(serde_json::json!({"ok": true})) });
    (stop, tokio::spawn(async move { w.run(stopped).await.unwrap() }))
}

/// `kairos backup` of the node at `endpoint` into `to`, over mutual TLS.
fn backup(endpoint: &str, tls_flags: &[String], key: &str, to: &Path) -> Output {
    let mut args = vec!["backup".into(), "--endpoint".into(), endpoint.into()];
    args.extend(tls_flags.iter().cloned());
    args.extend(["--to".into(), to.to_str().unwrap().into()]);
    kairos(&args, key)
}

/// Waits until `n` submits were acknowledged and some of them completed.
async fn loaded(client: &Client, acked: &Mutex<Vec<String>>, n: usize) {
    let t = Instant::now();
    loop {
        let done = client.stats(false).await.unwrap().iter().any(|(s, c)| {
            *s == kairos_proto::v1::ExecutionStatus::Succeeded && *c >= (n / 4) as i64
        });
        if done && acked.lock().unwrap().len() >= n {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no load after 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_every_acknowledged_execution() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pki = Pki::new(d);
    let (node, endpoint, key) = serve(&d.join("data"), Some(&pki)).await;
    let client = connect(&endpoint, &pki.tls(), &key).await;
    client.register_definition(BURST).await.unwrap();
    let (stop_worker, worker) = worker(&client);
    let (acked, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
    let load = tokio::spawn(bursts(client.clone(), acked.clone(), stop.clone()));
    loaded(&client, &acked, 3_000).await;

    let before: Vec<String> = acked.lock().unwrap().clone();
    let file = d.join("kairos.backup");
    let (e, k, f, flags) = (endpoint.clone(), key.clone(), file.clone(), pki.flags());
    let out = tokio::task::spawn_blocking(move || backup(&e, &flags, &k, &f)).await.unwrap();
    let during = acked.lock().unwrap().len() - before.len();
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    stop_worker.send(true).unwrap();
    worker.await.unwrap();
    assert!(out.status.success(), "kairos backup failed:\n{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("%)") && err.contains("wrote"), "progress on stderr:\n{err}");
    assert!(during > 0, "submits went on while the backup ran");
    drop(node);
    println!("backup: {} acknowledged before, {during} during\n{err}", before.len());
    restored_holds(d, &file, &before, &key).await;
}

/// Restores `file` into a new directory (checked, refused a second time), starts a node on it
/// and reads every execution of `before`.
async fn restored_holds(d: &Path, file: &Path, before: &[String], key: &str) {
    let new = d.join("restored");
    let restore = |extra: &[&str]| {
        let mut args = vec!["restore".to_string(), file.to_str().unwrap().into()];
        args.extend(["--data-dir".into(), new.to_str().unwrap().into()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        kairos(&args, "")
    };
    let out = restore(&[]);
    assert!(out.status.success(), "kairos restore failed:\n{}", text(&out));
    let again = restore(&[]);
    assert!(!again.status.success(), "a non-empty data directory is refused");
    assert!(
        text(&again).contains("not empty") && text(&again).contains("--force"),
        "{}",
        text(&again)
    );
    let out = kairos(&["check".into(), "--data-dir".into(), new.to_str().unwrap().into()], "");
    assert!(out.status.success(), "kairos check of the restored store:\n{}", text(&out));
    assert!(text(&out).contains("no problem found"), "{}", text(&out));
    // The node's first start writes the admin key file only for a new store: the restored
    // store's keys are the old node's.
    std::fs::write(new.join("admin-key"), key).unwrap();
    let (_node, endpoint, key) = serve(&new, None).await;
    let client = connect(&endpoint, &Tls::default(), &key).await;
    for id in before {
        match client.get(id).await {
            Ok((e, _)) => assert_eq!(&e.execution_id, id),
            Err(e) => panic!("execution {id}, acknowledged before the backup, is missing: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_are_not_admin_keys_of_every_namespace_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pki = Pki::new(d);
    let (_node, endpoint, key) = serve(&d.join("data"), Some(&pki)).await;
    let client = connect(&endpoint, &pki.tls(), &key).await;
    let admin = |ns: &str, scopes: &[&str]| {
        let scopes: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
        let client = client.clone();
        let ns = ns.to_string();
        async move { client.create_api_key(&ns, &scopes, "backup-test").await.unwrap().token }
    };
    let ns_admin = admin("default", &["admin"]).await;
    let reader = admin("*", &["read"]).await;
    for (key, says) in [(&ns_admin, "every namespace"), (&reader, "`admin` scope")] {
        let to = d.join("refused.backup");
        let flags = pki.flags();
        let out = backup(&endpoint, &flags, key, &to);
        assert!(!out.status.success(), "refused");
        assert!(text(&out).contains(says), "the refusal names why ({says}):\n{}", text(&out));
        assert!(!to.exists(), "no file written");
    }
    let to = d.join("ok.backup");
    let out = backup(&endpoint, &pki.flags(), &key, &to);
    assert!(out.status.success(), "the admin key of `*`: {}", text(&out));
    let out = backup(&endpoint, &pki.flags(), &key, &to);
    assert!(!out.status.success() && text(&out).contains("exists"), "{}", text(&out));
}
