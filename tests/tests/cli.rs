//! The command lines as users run them: the real `kairos` and `kairosctl` binaries: help and
//! version everywhere, usage errors with exit code 2 and no backtrace, conflicting flags
//! refused, errors as JSON with `--json`, no node needed for help,
//! a worker that fails fast on bad settings, environment variables, completions, a retryable
//! `submit --key --after`, and the console (quoting, help, `quit` exits 0).
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kairos_tests::dev::{Killed, free_port, free_port_pair, spawn_dev};
use serde_json::{Value, json};

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const KAIROSCTL: &str = env!("CARGO_BIN_EXE_e2e-kairosctl");

/// An endpoint nobody listens on.
fn closed_endpoint() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn output(o: Output) -> Run {
    Run {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Runs a binary with `args` (RUST_BACKTRACE=1: a backtrace, std's or anyhow's, would show),
/// stdin closed; kills it after 30 s (a command that should have failed at once and did not).
fn run(bin: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut c = Command::new(bin);
    c.args(args)
        .env("RUST_BACKTRACE", "1")
        .env_remove("KAIROS_ENDPOINT")
        .env_remove("KAIROS_NAMESPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let child = c.spawn().expect("runs");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(out) => output(out.unwrap()),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{bin} {args:?} still running after 30 s");
        }
    }
}

fn ctl(args: &[&str]) -> Run {
    run(KAIROSCTL, args, &[])
}

fn kairos(args: &[&str]) -> Run {
    run(KAIROS, args, &[])
}

/// `kairosctl … console` with `input` on stdin (not a terminal: plain lines).
fn console(args: &[&str], input: &str) -> Run {
    let mut child = Command::new(KAIROSCTL)
        .args(args)
        .arg("console")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("console starts");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    output(child.wait_with_output().unwrap())
}

fn json_of(s: &str) -> Value {
    serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

fn assert_usage_error(r: &Run, what: &str) {
    assert_eq!(r.code, 2, "{what}: exit code 2 for a usage error\n{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("--help"), "{what}: points to --help\n{}", r.stderr);
    assert!(
        !r.stderr.to_lowercase().contains("stack backtrace"),
        "{what}: no backtrace\n{}",
        r.stderr
    );
}

#[test]
fn help_and_version_everywhere_without_a_node() {
    let closed = closed_endpoint();
    let helps: &[&[&str]] = &[
        &["--help"],
        &["dev", "--help"],
        &["serve", "--help"],
        &["check", "--help"],
        &["worker", "--help"],
        &["help", "worker"],
    ];
    for args in helps {
        let r = kairos(args);
        assert_eq!(r.code, 0, "kairos {args:?}: {}", r.stderr);
        assert!(r.stdout.contains("Usage: kairos"), "kairos {args:?}: {}", r.stdout);
    }
    let r = kairos(&["dev", "--help"]);
    for flag in ["--data-dir", "--store-cache-mib", "--new-store", "KAIROS_LISTEN_HTTP"] {
        assert!(r.stdout.contains(flag), "kairos dev --help names {flag}: {}", r.stdout);
    }
    let helps: &[&[&str]] = &[
        &["--help"],
        &["help"],
        &["submit", "--help"],
        &["cron", "create", "--help"],
        &["help", "definitions", "apply"],
        &["console", "--help"],
        &["bench", "--help"],
    ];
    for args in helps {
        // Pointed at a closed port: help never connects.
        let r = ctl(&[&["--endpoint", &closed], *args].concat());
        assert_eq!(r.code, 0, "kairosctl {args:?}: {}", r.stderr);
        assert!(r.stdout.contains("sage: kairosctl"), "kairosctl {args:?}: {}", r.stdout);
    }
    assert!(ctl(&["submit", "--help"]).stdout.contains("--after"));
    for (bin, name) in [(KAIROS, "kairos"), (KAIROSCTL, "kairosctl")] {
        let r = run(bin, &["--version"], &[]);
        assert_eq!((r.code, r.stdout.trim()), (0, format!("{name} 0.1.0").as_str()));
    }
}

#[test]
fn usage_errors_exit_2_without_a_backtrace() {
    let closed = closed_endpoint();
    assert_usage_error(&kairos(&["dev", "--bogus"]), "kairos dev --bogus");
    assert_usage_error(&kairos(&["dev", "--data-dir"]), "a flag without its value");
    assert_usage_error(&kairos(&["dev", "extra"]), "an extra argument");
    assert_usage_error(&kairos(&["serve", "--shard-count", "many"]), "not a number");
    assert_usage_error(&kairos(&["dev", "--listen-http", "nope"]), "not an address");
    assert_usage_error(&kairos(&["worker"]), "worker without --queue");
    assert_usage_error(&kairos(&["check", "--backend", "memory"]), "check of a memory store");
    assert_usage_error(&kairos(&["launch"]), "an unknown command");
    assert_eq!(kairos(&[]).code, 2, "no command: the usage, exit 2");
    let e = &["--endpoint", closed.as_str()];
    let r = ctl(&[e, &["submit", "registry://jobs/echo", "1", "--affter", "3600"][..]].concat());
    assert_usage_error(&r, "a misspelt flag");
    assert!(r.stderr.contains("--affter"), "{}", r.stderr);
    let r = ctl(&[e, &["get", "an-id", "extra"][..]].concat());
    assert_usage_error(&r, "an extra argument");
    let r =
        ctl(&[
            e,
            &[
                "submit",
                "registry://jobs/echo",
                "1",
                "--at",
                "2030-01-01T00:00:00Z",
                "--after",
                "5",
            ][..],
        ]
        .concat());
    assert_usage_error(&r, "--at with --after");
    assert!(r.stderr.contains("cannot be used with"), "{}", r.stderr);
    assert_usage_error(&ctl(&[e, &["submit", "u", "one"][..]].concat()), "a version not a number");
    assert_usage_error(&ctl(&[e, &["list", "--status", "sleepy"][..]].concat()), "a bad status");
    assert_usage_error(
        &ctl(&[e, &["cron", "create", "u", "1", "@daily", "--overlap", "queue"][..]].concat()),
        "a bad policy",
    );
    assert_eq!(ctl(&["frobnicate"]).code, 2);
    assert_eq!(ctl(&["bench", "s9"]).code, 2, "bench's own usage errors exit 2 too");
}

#[test]
fn json_mode_reports_every_error_as_json() {
    let closed = closed_endpoint();
    // A usage error.
    let r = ctl(&["--endpoint", &closed, "--json", "submit", "u", "1", "--at", "soon"]);
    assert_eq!(r.code, 2);
    let v = json_of(&r.stderr);
    assert_eq!(
        (v["error"]["code"].clone(), v["error"]["exitCode"].clone()),
        (json!("USAGE"), json!(2))
    );
    assert!(v["error"]["message"].as_str().unwrap().contains("--at"), "{v}");
    // `--json` after the command counts too.
    let r = ctl(&["--endpoint", &closed, "get", "x", "y", "--json"]);
    assert_eq!(json_of(&r.stderr)["error"]["code"], json!("USAGE"));
    // The node unreachable.
    let r = ctl(&["--endpoint", &closed, "--json", "nodes"]);
    assert_eq!(r.code, 6);
    let v = json_of(&r.stderr);
    assert_eq!(v["error"]["code"], json!("UNAVAILABLE"), "{v}");
    assert_eq!(v["error"]["exitCode"], json!(6), "{v}");
    assert!(r.stdout.is_empty(), "nothing on stdout: {}", r.stdout);
}

#[test]
fn environment_variables_are_read() {
    // kairosctl: KAIROS_ENDPOINT (the error names the port it tried).
    let closed = closed_endpoint();
    let r = run(KAIROSCTL, &["nodes"], &[("KAIROS_ENDPOINT", &closed)]);
    assert_eq!(r.code, 6);
    assert!(r.stderr.contains(&closed), "{}", r.stderr);
    // kairos: a bad KAIROS_* value is refused naming the variable, exit 1, no backtrace.
    let dir = tempfile::tempdir().unwrap();
    let r = run(
        KAIROS,
        &["dev", "--data-dir", dir.path().to_str().unwrap()],
        &[("KAIROS_LISTEN_HTTP", "nope")],
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("KAIROS_LISTEN_HTTP"), "{}", r.stderr);
    assert!(!r.stderr.to_lowercase().contains("stack backtrace"), "{}", r.stderr);
    let r = run(
        KAIROS,
        &["dev", "--data-dir", dir.path().to_str().unwrap()],
        &[("KAIROS_STORE_CACHE_MIB", "1")],
    );
    assert_eq!(r.code, 1, "KAIROS_STORE_CACHE_MIB is read (1 MiB is below the minimum)");
    assert!(r.stderr.contains("store_cache_mib"), "{}", r.stderr);
    // kairos worker: KAIROS_NAMESPACE, checked like --namespace.
    let r = run(KAIROS, &["worker", "--queue", "q"], &[("KAIROS_NAMESPACE", "bad namespace")]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("namespace"), "{}", r.stderr);
}

#[test]
fn a_worker_fails_fast_on_bad_settings() {
    let closed = closed_endpoint();
    for (args, what) in [
        (&["--queue", "bad queue"][..], "queue"),
        (&["--queue", "q", "--concurrency", "0"], "concurrency"),
        (&["--queue", "q", "--worker-id", ""], "worker"),
    ] {
        let t = Instant::now();
        let r = kairos(&[&["worker", "--endpoint", closed.as_str()][..], args].concat());
        assert_usage_error(&r, what);
        assert!(r.stderr.contains(what), "{}", r.stderr);
        assert!(t.elapsed() < Duration::from_secs(5), "at once, not after the connect retries");
    }
}

#[test]
fn completions_for_both() {
    for (bin, shell, needle) in
        [(KAIROSCTL, "bash", "kairosctl"), (KAIROSCTL, "zsh", "submit"), (KAIROS, "fish", "worker")]
    {
        let r = run(bin, &["completions", shell], &[]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        assert!(r.stdout.contains(needle), "{bin} completions {shell}");
    }
    assert_eq!(ctl(&["completions", "tcsh"]).code, 2);
}

#[test]
fn the_console_without_a_node() {
    let closed = closed_endpoint();
    let r = console(
        &["--endpoint", &closed],
        "help\nhelp submit\nnodes\nfrobnicate\nget 'unbalanced\nquit\n",
    );
    assert_eq!(r.code, 0, "quit exits 0 whatever the last command did: {}", r.stderr);
    // Its own help: the commands it accepts, none it refuses.
    assert!(r.stdout.contains("submit") && r.stdout.contains("quit"), "{}", r.stdout);
    assert!(!r.stdout.contains("  console ") && !r.stdout.contains("  bench "), "{}", r.stdout);
    assert!(r.stdout.contains("--after"), "help submit: {}", r.stdout);
    assert!(r.stderr.contains("cannot reach"), "{}", r.stderr);
    assert!(r.stderr.contains("frobnicate"), "{}", r.stderr);
    assert!(r.stderr.contains("unbalanced quotes"), "{}", r.stderr);
    // End of input leaves as well, exit 0.
    assert_eq!(console(&["--endpoint", &closed], "nodes\n").code, 0);
}

/// Runs `bin` with its stdout a pipe whose reader has already gone.
fn closed_stdout(bin: &str, args: &[&str]) -> Run {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(bin)
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    output(out)
}

fn start_node(dir: &Path) -> (Killed, String) {
    let (http, grpc) = free_port_pair();
    let node = spawn_dev(KAIROS, dir, http, grpc);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if let Ok((200, body)) = kairos_tests::http_request(http, "GET", "/healthz", &[], b"")
            && body.contains("shards=64")
        {
            return (node, format!("http://127.0.0.1:{grpc}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("node did not become healthy");
}

const ECHO: &str = "name: echo\nversion: 1\ninputs:\n  name: string\nexecution:\n  type: command\n  command: [\"sh\", \"-c\", \"cat\"]\n";

#[test]
fn against_a_node_retries_and_the_console() {
    let dir = tempfile::tempdir().unwrap();
    let (_node, endpoint) = start_node(dir.path());
    let file = dir.path().join("echo.yaml");
    std::fs::write(&file, ECHO).unwrap();
    let e = ["--endpoint", endpoint.as_str()];
    let r = ctl(&[&e[..], &["definitions", "apply", file.to_str().unwrap()]].concat());
    assert_eq!(r.code, 0, "{}", r.stderr);

    // `submit --key K --after N` sent again (a retry): the same execution, not a conflict.
    let submit = [
        &e[..],
        &["--json", "submit", "registry://jobs/echo", "1", "--key", "retry-1", "--after", "3600"],
        &["--inputs", r#"{"name": "x"}"#],
    ]
    .concat();
    let first = ctl(&submit);
    assert_eq!(first.code, 0, "{}", first.stderr);
    std::thread::sleep(Duration::from_millis(50)); // the node's clock moves on
    let second = ctl(&submit);
    assert_eq!(second.code, 0, "a retry is the same request: {}", second.stderr);
    let (a, b) = (json_of(&first.stdout), json_of(&second.stdout));
    assert_eq!(a["created"], json!(true));
    assert_eq!(b["created"], json!(false));
    assert_eq!(a["execution"]["executionId"], b["execution"]["executionId"]);
    assert_eq!(a["execution"]["executeAt"], b["execution"]["executeAt"]);
    // A misspelt flag no longer submits a job due at once.
    let r = ctl(&[&e[..], &["submit", "registry://jobs/echo", "1", "--affter", "3600"]].concat());
    assert_eq!(r.code, 2);
    let r = ctl(&[&e[..], &["--json", "list"]].concat());
    assert_eq!(json_of(&r.stdout)["executions"].as_array().unwrap().len(), 1, "only the one");

    // A reader that leaves early (`| head -1`) ends the command quietly, no panic.
    for args in [&["--json", "list"][..], &["completions", "bash"][..]] {
        let r = closed_stdout(KAIROSCTL, &[&e[..], args].concat());
        assert!(!r.stderr.contains("panicked") && r.code != 101, "{args:?}: {}", r.stderr);
        assert!(r.stderr.is_empty(), "quietly: {}", r.stderr);
    }
    let r = closed_stdout(KAIROS, &["completions", "bash"]);
    assert!(r.code == 0 && r.stderr.is_empty(), "{}", r.stderr);

    // The console: a quoted argument with spaces, a JSON error, then quit → 0.
    let r = console(
        &e,
        "submit registry://jobs/echo 1 --json --key c-1 --after 60 --inputs '{\"name\": \"a b\"}'\n\
         get --key c-1 --json\n\
         get no-such-id --json\n\
         quit\n",
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(lines.len(), 2, "{}", r.stdout);
    assert_eq!(json_of(lines[0])["execution"]["inputs"], json!({"name": "a b"}));
    assert_eq!(json_of(lines[1])["inputs"], json!({"name": "a b"}));
    let err = json_of(r.stderr.lines().last().unwrap());
    assert_eq!(
        (err["error"]["code"].clone(), err["error"]["exitCode"].clone()),
        (json!("NOT_FOUND"), json!(3))
    );
}

/// The console on a terminal (a pseudo-terminal from util-linux `script`, in Debian's essential
/// bsdutils; `.ci/run` makes sure it is there): the Up arrow recalls the last line (it used to
/// be read as the command "\u{1b}[A"), Tab completes a command, the history is saved, and `quit`
/// leaves with 0. Without `script` the test fails, saying so.
#[test]
fn the_console_on_a_terminal_edits_and_keeps_history() {
    if let Err(e) = Command::new("script").arg("--version").output() {
        panic!(
            "this test needs `script` (util-linux, Debian package bsdutils) for a pseudo-terminal: {e}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history");
    let closed = closed_endpoint();
    let mut child = Command::new("script")
        .args(["-qec", &format!("{KAIROSCTL} --endpoint {closed} console"), "/dev/null"])
        .env("KAIROS_CONSOLE_HISTORY", &history)
        .env("TERM", "xterm")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script starts");
    let mut stdin = child.stdin.take().unwrap();
    for keys in ["nodes\r", "\x1b[A\r", "qui\t\r"] {
        std::thread::sleep(Duration::from_millis(1_500));
        stdin.write_all(keys.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let out = match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(out) => output(out.unwrap()),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("the console did not quit");
        }
    };
    drop(stdin);
    let text = format!("{}{}", out.stdout, out.stderr);
    assert_eq!(out.code, 0, "{text}");
    assert_eq!(text.matches("cannot reach").count(), 2, "Up + Enter ran `nodes` again: {text}");
    assert!(!text.contains("unrecognized"), "{text}");
    let saved = std::fs::read_to_string(&history).unwrap_or_default();
    assert!(saved.contains("nodes"), "history saved: {saved:?}");
}

/// `kairos serve` requires API keys: with none in the store it writes a first admin key to
/// `DATA_DIR/admin-key` (mode 0600); `kairosctl` without a key exits 7; with it, keys are
/// created per namespace and a worker key cannot submit; `kairos dev` says authentication is
/// off.
#[test]
fn serve_requires_keys_and_kairosctl_manages_them() {
    let dir = tempfile::tempdir().unwrap();
    let (http, grpc) = free_port_pair();
    let log = dir.path().join("serve.out");
    let child = Command::new(KAIROS)
        .args(["serve", "--data-dir", dir.path().to_str().unwrap(), "--log", "warn"])
        .args(["--listen-http", &format!("127.0.0.1:{http}")])
        .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("kairos starts");
    let _node = Killed(child);
    let key_file = dir.path().join("admin-key");
    let t = Instant::now();
    while !key_file.exists() || std::fs::read_to_string(&key_file).unwrap().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(20), "no admin key written");
        std::thread::sleep(Duration::from_millis(100));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "only its owner may read the admin key");
    }
    let out = std::fs::read_to_string(&log).unwrap();
    assert!(out.contains("admin-key"), "{out}");
    let root = std::fs::read_to_string(&key_file).unwrap().trim().to_string();
    let endpoint = format!("http://127.0.0.1:{grpc}");
    let e = ["--endpoint", endpoint.as_str()];

    let r = ctl(&[&e[..], &["list"]].concat());
    assert_eq!(r.code, 7, "no key: not allowed\n{}", r.stderr);
    assert!(r.stderr.contains("API key"), "{}", r.stderr);
    let (status, _) = kairos_tests::http_request(http, "GET", "/executions", &[], b"").unwrap();
    assert_eq!(status, 401);

    let as_root =
        |args: &[&str]| run(KAIROSCTL, &[&e[..], args].concat(), &[("KAIROS_API_KEY", &root)]);
    let r = as_root(&[
        "--json", "keys", "create", "--for", "team-a", "--scope", "worker", "--name", "w",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let worker_key = json_of(&r.stdout)["token"].as_str().unwrap().to_string();
    let r = as_root(&["keys", "create", "--for", "team-a", "--scope", "submit,read,definitions"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let submit_key = r.stdout.lines().find(|l| l.starts_with("kai_")).unwrap().to_string();
    let r = as_root(&["keys", "list"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("team-a") && r.stdout.contains("bootstrap"), "{}", r.stdout);

    let file = dir.path().join("echo.yaml");
    std::fs::write(&file, ECHO).unwrap();
    let team = |key: &str, args: &[&str]| {
        run(KAIROSCTL, &[&e[..], &["--namespace", "team-a", "--api-key", key], args].concat(), &[])
    };
    let r = team(&submit_key, &["definitions", "apply", file.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = team(&worker_key, &["submit", "registry://jobs/echo", "1", "--after", "60"]);
    assert_eq!(r.code, 7, "a worker key cannot submit\n{}", r.stderr);
    assert!(r.stderr.contains("`submit`"), "{}", r.stderr);
    let r = team(
        &submit_key,
        &["submit", "registry://jobs/echo", "1", "--after", "60", "--inputs", r#"{"name": "x"}"#],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    // A worker whose key lacks the `worker` scope stops at once with the reason (exit 1).
    let r = run(
        KAIROS,
        &["worker", "--queue", "echo", "--endpoint", &endpoint, "--namespace", "team-a"],
        &[("KAIROS_API_KEY", &submit_key)],
    );
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("`worker`"), "{}", r.stderr);
    let r = team(&submit_key, &["whoami"]);
    assert!(r.stdout.contains("namespace team-a"), "{}", r.stdout);
    let r = team(&submit_key, &["limits"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("7 days"), "{}", r.stdout);
    let r = as_root(&["--namespace", "team-a", "audit"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("definition.register"), "{}", r.stdout);
}

#[test]
fn dev_says_authentication_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let (http, grpc) = free_port_pair();
    let err = dir.path().join("dev.err");
    let child = Command::new(KAIROS)
        .args(["dev", "--data-dir", dir.path().to_str().unwrap()])
        .args(["--listen-http", &format!("127.0.0.1:{http}")])
        .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("kairos starts");
    let _node = Killed(child);
    let t = Instant::now();
    loop {
        let text = std::fs::read_to_string(&err).unwrap_or_default();
        if text.contains("authentication is OFF") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no warning: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, _) = kairos_tests::http_request(http, "GET", "/executions", &[], b"").unwrap();
    assert_eq!(status, 200, "no key needed");
}

/// Starts `kairos dev` on `dir/e` and waits until `/readyz` says `ready` with shards: the
/// process and its gRPC port. Every `/readyz` answer on the way is `not-ready …` (503).
fn start_until_ready(dir: &Path) -> (Killed, u16) {
    // Ports from `free_port` can be taken by a parallel test before the node binds them: a node
    // that stops saying so is started again on fresh ports; any other exit fails with its log.
    let mut attempt = 0;
    'started: loop {
        attempt += 1;
        let (http, grpc) = free_port_pair();
        let log = dir.join(format!("node-{attempt}.log"));
        let mut node = Killed(
            Command::new(KAIROS)
                .args(["dev", "--data-dir", dir.join("e").to_str().unwrap(), "--log", "warn"])
                .args(["--listen-http", &format!("127.0.0.1:{http}")])
                .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        let t = Instant::now();
        loop {
            if let Some(status) = node.0.try_wait().unwrap() {
                let stderr = std::fs::read_to_string(&log).unwrap_or_default();
                if attempt < 3 && stderr.contains("in use") {
                    continue 'started;
                }
                panic!("the node exited ({status}) before it was ready:\n{stderr}");
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "never ready in 30 s; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            match kairos_tests::http_request(http, "GET", "/readyz", &[], b"") {
                Ok((200, body)) => {
                    assert!(body.starts_with("ready ") && !body.contains("shards=0"), "{body}");
                    break 'started (node, grpc);
                }
                Ok((503, body)) => assert!(body.starts_with("not-ready "), "{body}"),
                Ok((s, body)) => panic!("/readyz answered {s}: {body}"),
                Err(_) => {}
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The ports are bound before the node starts: with the HTTP port taken, `kairos dev` stops at
/// once, saying which port, and never logs that the node started (nor takes a lease). Once up,
/// `/readyz` says `ready` with the shards it holds.
#[test]
fn a_port_in_use_stops_the_node_before_it_starts_and_readyz_says_when_it_is_ready() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let r = run(
        KAIROS,
        &[
            "dev",
            "--data-dir",
            dir.path().join("d").to_str().unwrap(),
            "--log",
            "info",
            "--listen-http",
            &format!("127.0.0.1:{port}"),
            "--listen-grpc",
            &format!("127.0.0.1:{}", free_port()),
        ],
        &[],
    );
    assert_ne!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains(&format!("127.0.0.1:{port}")), "{}", r.stderr);
    assert!(!r.stderr.contains("node started"), "not started before binding: {}", r.stderr);
    assert!(!r.stdout.contains(" up "), "{}", r.stdout);
    drop(taken);

    let (_node, grpc) = start_until_ready(dir.path());
    // `--endpoint host:port` without a scheme is http://host:port.
    let r = ctl(&["--endpoint", &format!("127.0.0.1:{grpc}"), "list"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
}

/// `/healthz` lists every node of the cluster (region, shards, database, last commit) and
/// `kairosctl nodes` shows the same.
#[test]
fn healthz_and_nodes_show_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let (http, grpc) = free_port_pair();
    let _node = spawn_dev(KAIROS, dir.path(), http, grpc);
    let t = Instant::now();
    let body = loop {
        assert!(t.elapsed() < Duration::from_secs(30), "no node line with a commit");
        if let Ok((200, body)) = kairos_tests::http_request(http, "GET", "/healthz", &[], b"")
            && body.contains("cluster nodes=1\n")
            && body.contains(" shard_leases=64 ")
            && !body.contains("last_commit_ms=0.000")
        {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(body.starts_with("ok node="), "{body}");
    let line = body.lines().find(|l| l.starts_with("  node=")).expect(&body);
    let want = format!("region=local shard_leases=64 database=\"embedded:{}", dir.path().display());
    assert!(line.contains(&want), "{line}");
    assert!(line.contains("heartbeat_age_ms="), "{line}");
    let endpoint = format!("http://127.0.0.1:{grpc}");
    let r = ctl(&["--endpoint", &endpoint, "--json", "nodes"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = json_of(&r.stdout);
    assert_eq!(v[0]["shards"], json!(64), "{v}");
    assert_eq!(v[0]["region"], json!("local"), "{v}");
    assert!(v[0]["database"].as_str().unwrap().starts_with("embedded:"), "{v}");
    assert!(v[0]["lastCommitUs"].as_i64().unwrap() > 0, "{v}");
    let r = ctl(&["--endpoint", &endpoint, "nodes"]);
    assert!(r.stdout.contains("DATABASE") && r.stdout.contains("LAST COMMIT"), "{}", r.stdout);
}
