//! A new user's first week with the real `kairos` and `kairosctl` binaries: global flags after
//! the command and an endpoint without a scheme, definitions no shipped executor could run
//! refused at registration, a backfill that says what it made and why, "trigger now", errors
//! naming the namespace, the console switching namespace, and `/metrics` help texts.
#![allow(clippy::disallowed_methods)] // real processes, real time

use kairos_tests::dev::{Killed, free_port_pair, spawn_dev};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const KAIROSCTL: &str = env!("CARGO_BIN_EXE_e2e-kairosctl");

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `kairosctl ARGS` (with `input` on stdin when given).
fn ctl_with(args: &[&str], input: Option<&str>) -> Run {
    let mut child = Command::new(KAIROSCTL)
        .args(args)
        .env_remove("KAIROS_ENDPOINT")
        .env_remove("KAIROS_NAMESPACE")
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(i) = input {
        child.stdin.take().unwrap().write_all(i.as_bytes()).unwrap();
    }
    let o = child.wait_with_output().unwrap();
    Run {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// A `kairos dev` node: (the process, its HTTP port, its gRPC `host:port` without a scheme).
fn start_node(dir: &std::path::Path) -> (Killed, u16, String) {
    let (http, grpc) = free_port_pair();
    let node = spawn_dev(KAIROS, dir, http, grpc);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        if let Ok((200, body)) = kairos_tests::http_request(http, "GET", "/readyz", &[], b"")
            && body.contains("shards=64")
        {
            return (node, http, format!("127.0.0.1:{grpc}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("node not ready");
}

const ECHO: &str =
    "name: echo\nversion: 1\nexecution:\n  type: command\n  command: [\"sh\", \"-c\", \"cat\"]\n";

#[test]
fn a_first_week_with_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let (_node, http, grpc) = start_node(&dir.path().join("data"));
    // Every global flag after the command; the endpoint without a scheme is http://.
    let ctl = |args: &[&str]| ctl_with(&[args, &["--endpoint", grpc.as_str()]].concat(), None);
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    definitions(&ctl, &write);
    cron_backfill_and_trigger(&ctl);

    // Not found names the namespace (a definition registered elsewhere is not found here).
    let r = ctl(&["submit", "registry://jobs/echo", "1", "--namespace", "team-b"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("in namespace team-b"), "{}", r.stderr);

    // One JSON view per object: the command line prints what the HTTP API answers.
    let r = ctl(&["--json", "cron", "runs", "daily"]);
    let runs: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    let id = runs["executions"][0]["executionId"].as_str().unwrap().to_string();
    for (args, path) in [
        (vec!["--json", "get", id.as_str()], format!("/executions/{id}")),
        (vec!["--json", "definitions", "get", "echo"], "/definitions/echo".to_string()),
        (vec!["--json", "cron", "get", "daily"], "/cron-jobs/daily".to_string()),
    ] {
        let r = ctl(&args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
        let cli: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
        let (status, body) = kairos_tests::http_request(http, "GET", &path, &[], b"").unwrap();
        assert_eq!(status, 200, "{path}: {body}");
        let api: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(cli, api, "{args:?} against GET {path}");
    }

    // `list` pages by cursor, takes the definition's URI, and refuses a limit of 0.
    let r = ctl(&["list", "--limit", "0"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    let page = |cursor: Option<&str>| {
        let mut args =
            vec!["--json", "list", "--definition", "registry://jobs/echo", "--limit", "1"];
        args.extend(cursor.map(|c| ["--cursor", c]).into_iter().flatten());
        let r = ctl(&args);
        assert_eq!(r.code, 0, "{}", r.stderr);
        serde_json::from_str::<serde_json::Value>(r.stdout.trim()).unwrap()
    };
    let first = page(None);
    assert_eq!(first["executions"].as_array().unwrap().len(), 1, "{first}");
    let second = page(first["nextCursor"].as_str());
    assert_eq!(second["executions"].as_array().unwrap().len(), 1, "{second}");
    assert_ne!(first["executions"][0]["executionId"], second["executions"][0]["executionId"]);

    // The console switches namespace.
    let r =
        ctl_with(&["--endpoint", &grpc, "console"], Some("namespace\nns team-b\nget nope\nquit\n"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("namespace default")
            && r.stdout.contains("namespace team-b (was default)"),
        "{}",
        r.stdout
    );

    // One full stop at the end of each metric's help text.
    let (status, text) = kairos_tests::http_request(http, "GET", "/metrics", &[], b"").unwrap();
    assert_eq!(status, 200);
    assert!(text.contains("# HELP") && !text.contains("..\n"), "{text}");
}

/// Definitions: one no shipped executor could run is refused; a custom type is named.
fn definitions(ctl: &dyn Fn(&[&str]) -> Run, write: &dyn Fn(&str, &str) -> String) {
    let r = ctl(&[
        "definitions",
        "apply",
        &write("bad.yaml", "name: b\nversion: 1\nexecution: {type: command}\n"),
    ]);
    assert_eq!(r.code, 5, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("execution.command") && r.stderr.contains("is required"),
        "{}",
        r.stderr
    );
    let r = ctl(&[
        "definitions",
        "apply",
        &write("c.yaml", "name: c\nversion: 1\nexecution: {type: container, image: x}\n"),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("no executor in Kairos") && r.stdout.contains("queue c"),
        "{}",
        r.stdout
    );
    let r = ctl(&["definitions", "apply", &write("echo.yaml", ECHO), "--namespace", "default"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
}

/// Backfill says what it made and why; trigger runs now.
fn cron_backfill_and_trigger(ctl: &dyn Fn(&[&str]) -> Run) {
    // A daily schedule; five past days backfilled under its overlap policy `skip`: one run,
    // four skipped (no worker runs the first), and the command says so and why.
    let r = ctl(&["cron", "create", "registry://jobs/echo", "1", "0 3 * * *", "--id", "daily"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let (from, until) = ("2026-01-01T00:00:00Z", "2026-01-06T00:00:00Z");
    let r = ctl(&["cron", "backfill", "daily", "--from", from, "--until", until]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("5 occurrences queued for daily under the overlap policy skip"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("1 executions made, 4 occurrences skipped for overlap"),
        "{}",
        r.stdout
    );

    // Trigger now, allowed to overlap: an execution for this instant, listed by `cron runs`.
    let r = ctl(&["cron", "trigger", "daily", "--overlap", "allow"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("daily triggered: occurrence ") && r.stdout.contains(", execution "),
        "{}",
        r.stdout
    );
    let r = ctl(&["--json", "cron", "runs", "daily"]);
    let runs: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    let runs = runs["executions"].as_array().unwrap().clone();
    assert_eq!(runs.len(), 2, "the backfilled one and the triggered one: {runs:?}");
    assert_eq!(runs[0]["cronOccurrence"], "2026-01-01T03:00:00.000Z", "{runs:?}");
    let r = ctl(&["cron", "runs", "daily"]);
    assert!(r.stdout.starts_with("OCCURRENCE"), "the occurrence each run is for: {}", r.stdout);
    assert!(r.stdout.contains("2026-01-01T03:00:00"), "{}", r.stdout);
    let r = ctl(&["cron", "pause", "daily"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = ctl(&["cron", "trigger", "daily"]);
    assert_eq!(r.code, 4, "a paused schedule is not triggered: {}", r.stderr);
    assert!(r.stderr.contains("PAUSED"), "{}", r.stderr);
}

/// With `log_format: json`, stderr is JSON lines only: the start-up warnings (authentication
/// off, a memory store keeping nothing) are log events, not plain lines mixed in.
#[test]
fn json_logs_hold_the_warnings_too() {
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("node.err");
    let (http, grpc) = free_port_pair();
    let _node = Killed(
        Command::new(KAIROS)
            .args(["dev", "--data-dir", dir.path().join("d").to_str().unwrap()])
            .args(["--listen-http", &format!("127.0.0.1:{http}")])
            .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
            .env("KAIROS_LOG_FORMAT", "json")
            .env("KAIROS_BACKEND", "memory")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap(),
    );
    let t = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&err).unwrap_or_default();
        if text.contains("authentication is OFF") && text.contains("nothing is durable") {
            break text;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no warnings: {text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v.get("level").is_some(), "{line}");
    }
    assert!(!text.contains("dev's default"), "{text}");
}
