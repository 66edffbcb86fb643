//! End-to-end cron: a real `kairos dev` node, a `kairos worker`, and `kairosctl cron`. A
//! per-second schedule's executions are run by the worker; the node is SIGKILLed and restarted
//! mid-way, and no occurrence is lost or materialized twice. Bad input over gRPC and HTTP is
//! refused naming the field; `cron preview` prints the documented JSON.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kairos_tests::dev::{Killed, free_port_pair};
use serde_json::{Value, json};

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const KAIROSCTL: &str = env!("CARGO_BIN_EXE_e2e-kairosctl");

fn log(name: &str) -> Stdio {
    match std::env::var("KAIROS_E2E_LOGS") {
        Ok(dir) => {
            let _ = std::fs::create_dir_all(&dir);
            Stdio::from(std::fs::File::create(format!("{dir}/{name}.log")).unwrap())
        }
        Err(_) => Stdio::null(),
    }
}

fn request(port: u16, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, String)> {
    kairos_tests::http_request(port, method, path, &[("Content-Type", "application/json")], body)
}

fn start_node(dir: &Path, http: u16, grpc: u16, n: usize) -> Killed {
    let child = Command::new(KAIROS)
        .args(["dev", "--data-dir", dir.to_str().unwrap(), "--log", "info"])
        .args(["--listen-http", &format!("127.0.0.1:{http}")])
        .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
        .stdout(Stdio::null())
        .stderr(log(&format!("cron-node-{n}")))
        .spawn()
        .expect("kairos starts");
    let node = Killed(child);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if let Ok((200, body)) = request(http, "GET", "/healthz", b"")
            && body.contains("shards=64")
        {
            return node;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("node did not become healthy");
}

/// `kairosctl` → (exit code, stdout, stderr).
fn ctl(grpc: u16, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(KAIROSCTL)
        .args(["--endpoint", &format!("http://127.0.0.1:{grpc}")])
        .args(args)
        .output()
        .expect("kairosctl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const ECHO: &str = "name: echo\nversion: 1\ninputs:\n  name: string\nexecution:\n  type: command\n  command: [\"sh\", \"-c\", \"cat\"]\n";

/// The executions of job `tick`, by occurrence (every execution of the store is listed, so a
/// second execution of an occurrence would show).
fn ticks(http: u16) -> BTreeMap<String, Vec<Value>> {
    let (status, body) = request(http, "GET", "/executions?limit=1000", b"").unwrap();
    assert_eq!(status, 200, "{body}");
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for e in serde_json::from_str::<Value>(&body).unwrap()["executions"].as_array().unwrap() {
        if e["cronJobId"] == json!("tick") {
            out.entry(e["cronOccurrence"].as_str().unwrap().to_string())
                .or_default()
                .push(e.clone());
        }
    }
    out
}

#[test]
fn a_per_second_schedule_survives_a_sigkill_without_losing_or_doubling_an_occurrence() {
    let dir = tempfile::tempdir().unwrap();
    let (http, grpc) = free_port_pair();
    let mut node = start_node(dir.path(), http, grpc, 0);
    std::fs::write(dir.path().join("echo.yaml"), ECHO).unwrap();
    let (code, out, err) =
        ctl(grpc, &["definitions", "apply", dir.path().join("echo.yaml").to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let _worker = Killed(
        Command::new(KAIROS)
            .args(["worker", "--endpoint", &format!("http://127.0.0.1:{grpc}"), "--queue", "echo"])
            .stdout(Stdio::null())
            .stderr(log("cron-worker"))
            .spawn()
            .expect("worker starts"),
    );

    // Bad input over gRPC: exit code 5, the message names the field.
    let (code, _, err) = ctl(grpc, &["cron", "create", "registry://jobs/echo", "1", "61 * * * *"]);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("expression: minute field"), "{err}");
    let (code, _, err) = ctl(
        grpc,
        &["cron", "create", "registry://jobs/echo", "1", "* * * * *", "--tz", "Mars/Base"],
    );
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("timezone:"), "{err}");
    // And over HTTP: 400 with the field.
    let bad = [
        (
            json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1, "expression": "* * * * *", "timezone": "UTC", "policies": {"overlap": "queue"}}),
            "overlap",
        ),
        (
            json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1, "expression": "0 0 30 2 *", "timezone": "UTC"}),
            "expression",
        ),
        (
            json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1, "expression": "@daily", "timezone": "UTC", "inputs": {"name": 5}}),
            "inputs.name",
        ),
        (
            json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1, "expression": "@daily", "timezone": "UTC", "inputs": {"name": "{{nope}}"}}),
            "inputs.name",
        ),
        (
            json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1, "expression": "@daily"}),
            "timezone",
        ),
        (
            json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1, "expression": "@daily", "timezone": "UTC", "startAt": "soon"}),
            "startAt",
        ),
    ];
    for (body, field) in bad {
        let (status, b) = request(http, "POST", "/cron-jobs", body.to_string().as_bytes()).unwrap();
        assert_eq!(status, 400, "{b}");
        assert_eq!(
            serde_json::from_str::<Value>(&b).unwrap()["error"]["field"],
            json!(field),
            "{b}"
        );
    }

    // Preview: no stored job, the documented JSON.
    let (code, out, err) = ctl(
        grpc,
        &[
            "--json",
            "cron",
            "preview",
            "30 2 * * *",
            "--tz",
            "America/New_York",
            "--from",
            "2026-03-07T00:00:00Z",
            "--until",
            "2026-03-10T00:00:00Z",
            "--dst-gap",
            "shift-by-gap",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        json!({"occurrences": [
            {"utc": "2026-03-07T07:30:00Z", "local": "2026-03-07T02:30:00-05:00"},
            {"utc": "2026-03-08T07:30:00Z", "local": "2026-03-08T03:30:00-04:00"},
            {"utc": "2026-03-09T06:30:00Z", "local": "2026-03-09T02:30:00-04:00"},
        ]}),
    );

    // A per-second schedule: every missed second is made up, overlapping runs allowed.
    let (code, out, err) = ctl(
        grpc,
        &[
            "--json",
            "cron",
            "create",
            "registry://jobs/echo",
            "1",
            "* * * * * *",
            "--id",
            "tick",
            "--missed",
            "all",
            "--catch-up-window",
            "3600",
            "--overlap",
            "allow",
            "--inputs",
            r#"{"name": "{{occurrence}}"}"#,
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["created"], json!(true), "{out}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(ticks(http).len() >= 2, "materialized while up");

    // SIGKILL, stay down two seconds, restart.
    let _ = node.0.kill();
    let _ = node.0.wait();
    std::thread::sleep(Duration::from_secs(2));
    node = start_node(dir.path(), http, grpc, 1);
    std::thread::sleep(Duration::from_secs(3));
    let (code, _, err) = ctl(grpc, &["cron", "pause", "tick"]);
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(Duration::from_millis(500)); // a round in flight settles

    let runs = ticks(http);
    let secs: Vec<i64> = runs.keys().map(|k| chrono_free_secs(k)).collect();
    assert!(secs.len() >= 6, "{} occurrences", secs.len());
    for w in secs.windows(2) {
        assert_eq!(w[1] - w[0], 1, "an occurrence lost between {} and {}", w[0], w[1]);
    }
    for (occ, execs) in &runs {
        assert_eq!(execs.len(), 1, "occurrence {occ} materialized {} times", execs.len());
    }
    // The worker runs them all (the inputs carry the occurrence).
    let t = Instant::now();
    loop {
        let runs = ticks(http);
        let done = runs.values().flatten().filter(|e| e["status"] == json!("SUCCEEDED")).count();
        if done == runs.len() {
            for (occ, execs) in &runs {
                assert_eq!(
                    execs[0]["output"]["name"]
                        .as_str()
                        .map(|s| s.trim_end_matches(".000Z").trim_end_matches('Z')),
                    Some(occ.trim_end_matches(".000Z").trim_end_matches('Z'))
                );
            }
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{done} of {} ran", runs.len());
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, out, _) = ctl(grpc, &["--json", "cron", "runs", "tick", "--limit", "1000"]);
    assert_eq!(code, 0);
    let runs = serde_json::from_str::<Value>(&out).unwrap();
    assert_eq!(runs["executions"].as_array().unwrap().len(), secs.len(), "{runs}");
    let (code, out, _) = ctl(grpc, &["--json", "cron", "get", "tick"]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["status"], json!("PAUSED"));
    let (status, metrics) = request(http, "GET", "/metrics", b"").unwrap();
    assert_eq!(status, 200);
    assert!(metrics.contains("kairos_cron_materialized_total"), "cron metrics exposed");
    drop(node);
    // The store a real session left (cron jobs, timers, executions, keys, a SIGKILL on the
    // way) passes the integrity check: no false alarm from `kairos check`.
    let out = Command::new(KAIROS)
        .args(["check", "--data-dir", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("no problem found"), "{text}");
}

/// Seconds since the epoch of an RFC 3339 UTC time `YYYY-MM-DDTHH:MM:SS(.mmm)Z` (days from the
/// civil date, Howard Hinnant's algorithm).
fn chrono_free_secs(s: &str) -> i64 {
    let n = |a: usize, b: usize| s[a..b].parse::<i64>().unwrap();
    let (y, m, d) = (n(0, 4), n(5, 7), n(8, 10));
    let (hh, mm, ss) = (n(11, 13), n(14, 16), n(17, 19));
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + hh * 3_600 + mm * 60 + ss
}
