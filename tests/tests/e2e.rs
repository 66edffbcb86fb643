//! End-to-end: real `kairos` processes (a node, workers) and `kairosctl`, over real sockets.
//! The node is SIGKILLed and restarted mid-way; every acknowledged execution must still end.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kairos_tests::dev::{Killed, free_port_pair};
use serde_json::{Value, json};

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const KAIROSCTL: &str = env!("CARGO_BIN_EXE_e2e-kairosctl");

static NODE_STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

struct Node {
    proc: Killed,
}

fn start_node(dir: &Path, http: u16, grpc: u16) -> Node {
    let child = Command::new(KAIROS)
        .args(["dev", "--data-dir", dir.to_str().unwrap(), "--log", "info"])
        .args([
            "--listen-http",
            &format!("127.0.0.1:{http}"),
            "--listen-grpc",
            &format!("127.0.0.1:{grpc}"),
        ])
        .stdout(Stdio::null())
        .stderr(log_file(&format!(
            "node-{}",
            NODE_STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        )))
        .spawn()
        .expect("kairos starts");
    let node = Node { proc: Killed(child) };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if let Ok((200, body)) = request(http, "GET", "/healthz", &[], b"")
            && body.contains("shards=64")
        {
            return node;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("node did not become healthy");
}

fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    kairos_tests::http_request(port, method, path, headers, body)
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

fn ctl(grpc: u16, args: &[&str]) -> (i32, String) {
    let out = Command::new(KAIROSCTL)
        .args(["--endpoint", &format!("http://127.0.0.1:{grpc}")])
        .args(args)
        .output()
        .expect("kairosctl runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

fn log_file(name: &str) -> Stdio {
    match std::env::var("KAIROS_E2E_LOGS") {
        Ok(dir) => {
            let _ = std::fs::create_dir_all(&dir);
            Stdio::from(std::fs::File::create(format!("{dir}/{name}.log")).unwrap())
        }
        Err(_) => Stdio::null(),
    }
}

fn worker(grpc: u16, queue: &str) -> Killed {
    Killed(
        Command::new(KAIROS)
            .args(["worker", "--endpoint", &format!("http://127.0.0.1:{grpc}"), "--queue", queue])
            .stdout(Stdio::null())
            .stderr(log_file(&format!("worker-{queue}")))
            .spawn()
            .expect("worker starts"),
    )
}

fn submit(http: u16, key: Option<&str>, body: &Value) -> (u16, Value) {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(k) = key {
        headers.push(("Idempotency-Key", k));
    }
    let (status, b) =
        request(http, "POST", "/executions", &headers, body.to_string().as_bytes()).unwrap();
    (status, json_of(&b))
}

fn get(http: u16, id: &str) -> Value {
    let (status, b) = request(http, "GET", &format!("/executions/{id}"), &[], b"").unwrap();
    assert_eq!(status, 200, "{b}");
    json_of(&b)
}

fn wait_status(http: u16, id: &str, want: &[&str], within: Duration) -> Value {
    let t = Instant::now();
    loop {
        if let Ok((200, b)) = request(http, "GET", &format!("/executions/{id}"), &[], b"") {
            let v = json_of(&b);
            if want.contains(&v["status"].as_str().unwrap_or("")) {
                return v;
            }
            assert!(t.elapsed() < within, "{id} still {} after {within:?}", v["status"]);
        } else {
            assert!(t.elapsed() < within, "node unreachable for {within:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn rfc3339_in(secs: i64) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
        as i64
        + secs;
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let (days, rem) = (now.div_euclid(86_400), now.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3_600, rem % 3_600 / 60, rem % 60)
}

const ECHO: &str = "name: echo\nversion: 1\ninputs:\n  name: string\nexecution:\n  type: command\n  command: [\"sh\", \"-c\", \"cat\"]\n";
const SLOW: &str = "name: slow\nversion: 1\ntimeouts: {lease: 2s}\nexecution:\n  type: command\n  command: [\"sh\", \"-c\", \"sleep 1; cat\"]\n";
const FLAKY: &str = "name: flaky\nversion: 1\nretry: {max_attempts: 2, base_delay: 100ms, max_delay: 200ms}\nexecution:\n  type: command\n  command: [\"sh\", \"-c\", \"echo boom >&2; exit 3\"]\n";

#[test]
fn a_user_session_with_real_processes() {
    let dir = tempfile::tempdir().unwrap();
    let (http, grpc) = free_port_pair();
    let mut node = start_node(dir.path(), http, grpc);
    std::fs::write(dir.path().join("echo.yaml"), ECHO).unwrap();
    std::fs::write(dir.path().join("flaky.yaml"), FLAKY).unwrap();
    std::fs::write(dir.path().join("slow.yaml"), SLOW).unwrap();
    for f in ["echo.yaml", "flaky.yaml", "slow.yaml"] {
        let (code, out) =
            ctl(grpc, &["definitions", "apply", dir.path().join(f).to_str().unwrap()]);
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("registered"), "{out}");
    }

    // Idempotent submission over HTTP.
    let body = json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1,
        "inputs": {"name": "kairos"}, "executeAt": rfc3339_in(0)});
    let (s1, e1) = submit(http, Some("key-1"), &body);
    assert_eq!(s1, 201, "{e1}");
    let (s2, e2) = submit(http, Some("key-1"), &body);
    assert_eq!((s2, &e2["executionId"]), (200, &e1["executionId"]), "repeat → same execution");
    let mut changed = body.clone();
    changed["inputs"]["name"] = json!("other");
    let (s3, e3) = submit(http, Some("key-1"), &changed);
    assert_eq!(s3, 409, "{e3}");
    let id = e1["executionId"].as_str().unwrap().to_string();

    // Bad input: always a 4xx naming the field, never a 5xx.
    let bad: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{not json".to_vec(), 400, "body"),
        (json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1, "inputs": {"name": 5}, "executeAt": rfc3339_in(0)}).to_string().into_bytes(), 400, "inputs.name"),
        (json!({"definitionUri": "registry://jobs/nope", "definitionVersion": 1, "executeAt": rfc3339_in(0)}).to_string().into_bytes(), 404, ""),
        (json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 9, "inputs": {"name": "x"}, "executeAt": rfc3339_in(0)}).to_string().into_bytes(), 404, ""),
        (json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1, "inputs": {"name": "x"}, "executeAt": "soon"}).to_string().into_bytes(), 400, "executeAt"),
        (json!({"definitionUri": "jobs/echo", "definitionVersion": 1, "executeAt": rfc3339_in(0)}).to_string().into_bytes(), 400, "definitionUri"),
        (json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1, "inputs": {"name": "x".repeat(40_000)}, "executeAt": rfc3339_in(0)}).to_string().into_bytes(), 400, "inputs"),
        (vec![b'x'; 300_000], 413, ""),
    ];
    for (payload, want, field) in bad {
        let (status, b) =
            request(http, "POST", "/executions", &[("Content-Type", "application/json")], &payload)
                .unwrap();
        assert_eq!(status, want, "{b}");
        if !field.is_empty() {
            assert_eq!(json_of(&b)["error"]["field"], json!(field), "{b}");
        }
    }

    // A command worker runs it; the output is visible over HTTP and gRPC.
    let _echo_worker = worker(grpc, "echo");
    let _flaky_worker = worker(grpc, "flaky");
    let done = wait_status(http, &id, &["SUCCEEDED"], Duration::from_secs(20));
    assert_eq!(done["output"], json!({"name": "kairos"}));
    let (code, out) = ctl(grpc, &["--json", "get", &id]);
    assert_eq!(code, 0);
    assert_eq!(json_of(&out)["output"], json!({"name": "kairos"}));

    // A failing command retries with back-off, then FAILED; replay runs it again.
    let (_, f) = submit(
        http,
        None,
        &json!({"definitionUri": "registry://jobs/flaky", "definitionVersion": 1, "executeAt": rfc3339_in(0)}),
    );
    let fid = f["executionId"].as_str().unwrap().to_string();
    let failed = wait_status(http, &fid, &["FAILED"], Duration::from_secs(20));
    assert_eq!(failed["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(failed["error"]["code"], json!("exit:3"));
    let (code, _) = ctl(grpc, &["replay", &fid]);
    assert_eq!(code, 0);
    let t = Instant::now();
    while get(http, &fid)["attempts"].as_array().unwrap().len() < 4 {
        assert!(t.elapsed() < Duration::from_secs(20), "replay did not run");
        std::thread::sleep(Duration::from_millis(100));
    }

    // DELETE before start cancels; after start it is refused.
    let (_, later) = submit(
        http,
        None,
        &json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1, "inputs": {"name": "later"}, "executeAt": rfc3339_in(3_600)}),
    );
    let lid = later["executionId"].as_str().unwrap();
    let (status, b) = request(http, "DELETE", &format!("/executions/{lid}"), &[], b"").unwrap();
    assert_eq!((status, json_of(&b)["status"].clone()), (200, json!("CANCELLED")));
    let (status, _) = request(http, "DELETE", &format!("/executions/{id}"), &[], b"").unwrap();
    assert_eq!(status, 409, "a finished execution cannot be cancelled");
    assert_eq!(ctl(grpc, &["get", "no-such-id"]).0, 3, "exit code 3 = not found");

    // SIGKILL the node with executions scheduled and due soon, then restart it: every
    // acknowledged execution still ends.
    let mut acked = Vec::new();
    for i in 0..20 {
        let (status, e) = submit(
            http,
            None,
            &json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1, "inputs": {"name": format!("n{i}")}, "executeAt": rfc3339_in(i % 3)}),
        );
        assert_eq!(status, 201);
        acked.push(e["executionId"].as_str().unwrap().to_string());
    }
    let _ = node.proc.0.kill(); // SIGKILL
    let _ = node.proc.0.wait();
    node = start_node(dir.path(), http, grpc);
    for id in &acked {
        let v = wait_status(http, id, &["SUCCEEDED"], Duration::from_secs(40));
        assert!(v["output"]["name"].is_string());
    }
    drop(node);
}
