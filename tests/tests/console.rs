//! The web console at `/ui/` in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`) driven over WebDriver, against a real `kairos serve` (API keys on) with
//! a real `kairos worker` running the executions. Each step saves a screenshot into
//! `target/console-screenshots/`.
//!
//! Marked `#[ignore]`: they need Chromium installed (root and apt). `.ci/console` installs it
//! and runs them with `--ignored`.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kairos_tests::dev::{Killed, free_port_pair};
use kairos_tests::http_request;
use kairos_tests::webdriver::{self, Browser};
use serde_json::{Value, json};

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");

/// Quick, and slow enough to cancel while it runs; one queue for both.
const ECHO: &str = "name: echo\nversion: 1\nqueue: console\ninputs:\n  greeting: string\nexecution:\n  type: command\n  command: [\"sh\", \"-c\", \"cat\"]\n";
const SLOW: &str = "name: slow\nversion: 1\nqueue: console\ninputs:\n  greeting: string\nexecution:\n  type: command\n  command: [\"sh\", \"-c\", \"sleep 120\"]\n";

fn shots() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A `kairos serve` node with its admin key, plus keys made for the tests and a worker.
struct Cluster {
    http: u16,
    admin: String,
    operator: String,
    reader: String,
    _node: Killed,
    _worker: Killed,
    _dir: tempfile::TempDir,
}

fn api(
    http: u16,
    key: &str,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> (u16, Value) {
    let auth = format!("Bearer {key}");
    let mut headers = vec![("Authorization", auth.as_str()), ("Content-Type", "application/json")];
    headers.extend_from_slice(extra);
    let (status, text) = http_request(http, method, path, &headers, body).unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn make_key(http: u16, admin: &str, scopes: &[&str], name: &str) -> String {
    let body = json!({"namespace": "default", "scopes": scopes, "name": name}).to_string();
    let (status, v) = api(http, admin, "POST", "/admin/keys", &[], body.as_bytes());
    assert_eq!(status, 201, "{v}");
    v["token"].as_str().unwrap().to_string()
}

fn start() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let (http, grpc) = free_port_pair();
    let node = Command::new(KAIROS)
        .args(["serve", "--data-dir", dir.path().to_str().unwrap(), "--log", "warn"])
        .args(["--listen-http", &format!("127.0.0.1:{http}")])
        .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kairos serve starts");
    let node = Killed(node);
    let key_file = dir.path().join("admin-key");
    let t = Instant::now();
    let admin = loop {
        if let Ok(k) = std::fs::read_to_string(&key_file)
            && !k.trim().is_empty()
            && matches!(http_request(http, "GET", "/readyz", &[], b""), Ok((200, _)))
        {
            break k.trim().to_string();
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the node did not become ready");
        std::thread::sleep(Duration::from_millis(100));
    };
    let operator = make_key(http, &admin, &["submit", "read", "definitions"], "operator");
    let reader = make_key(http, &admin, &["read"], "reader");
    let worker_key = make_key(http, &admin, &["worker"], "worker");
    for def in [ECHO, SLOW] {
        let (status, v) = api(http, &operator, "POST", "/definitions", &[], def.as_bytes());
        assert!(status == 201 || status == 200, "{status} {v}");
    }
    let worker = Command::new(KAIROS)
        .args(["worker", "--queue", "console", "--worker-id", "console-worker-1"])
        .args(["--endpoint", &format!("http://127.0.0.1:{grpc}")])
        .env("KAIROS_API_KEY", &worker_key)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kairos worker starts");
    Cluster { http, admin, operator, reader, _node: node, _worker: Killed(worker), _dir: dir }
}

impl Cluster {
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.http)
    }

    fn submit(&self, def: &str, key: &str) -> String {
        let body =
            json!({"definitionUri": format!("registry://jobs/{def}"), "definitionVersion": 1,
            "inputs": {"greeting": "hello"}, "delayMs": 0})
            .to_string();
        let (status, v) = api(
            self.http,
            &self.operator,
            "POST",
            "/executions",
            &[("Idempotency-Key", key)],
            body.as_bytes(),
        );
        assert_eq!(status, 201, "{v}");
        v["executionId"].as_str().unwrap().to_string()
    }

    /// Submitted to run in an hour (SCHEDULED meanwhile).
    fn submit_later(&self, def: &str, key: &str) -> String {
        let body =
            json!({"definitionUri": format!("registry://jobs/{def}"), "definitionVersion": 1,
            "inputs": {"greeting": "later"}, "delayMs": 3_600_000})
            .to_string();
        let (status, v) = api(
            self.http,
            &self.operator,
            "POST",
            "/executions",
            &[("Idempotency-Key", key)],
            body.as_bytes(),
        );
        assert_eq!(status, 201, "{v}");
        v["executionId"].as_str().unwrap().to_string()
    }

    fn status(&self, id: &str) -> String {
        let (_, v) = api(self.http, &self.operator, "GET", &format!("/executions/{id}"), &[], b"");
        v["status"].as_str().unwrap_or_default().to_string()
    }

    fn wait_status(&self, id: &str, want: &str) {
        let t = Instant::now();
        while self.status(id) != want {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{id} never {want}: {}",
                self.status(id)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn sign_in(b: &Browser, c: &Cluster, key: &str) {
    b.goto(&c.url("/ui/executions"));
    b.find("#apiKey");
    assert!(b.url().ends_with("/ui/login"), "signed out: sent to sign in, at {}", b.url());
    b.fill("#apiKey", key);
    b.click("form[action='/ui/login'] button");
    b.wait_text("#who", 10, |t| t.contains("namespace default"));
}

/// Sign in with a key; find an execution by its idempotency key and read its attempts (the
/// worker that ran it); cancel a running one and watch it end CANCELLED without reloading;
/// bad input names the field; a phone-width window has no sideways scroll.
#[test]
#[ignore = "needs Debian's chromium and chromium-driver; .ci/console installs them and runs it"]
fn executions_sign_in_search_attempts_and_cancel() {
    let c = start();
    let done = c.submit("echo", "console-key-1");
    c.wait_status(&done, "SUCCEEDED");
    let b = Browser::start();

    // A wrong key: the form says which field and why, and nothing is let in.
    b.goto(&c.url("/ui/login"));
    b.fill("#apiKey", "kai_nope_nope");
    b.click("form[action='/ui/login'] button");
    let err = b.text("#form-error");
    assert!(err.starts_with("apiKey"), "{err}");
    b.screenshot(&shots().join("sign-in-refused.png"));

    sign_in(&b, &c, &c.operator);
    b.fill("#f-key", "console-key-1");
    b.click("form[role=search] button");
    let table = b.wait_text("#executions", 10, |t| t.contains(&done));
    assert!(table.contains("SUCCEEDED") && table.contains("console-key-1"), "{table}");
    b.screenshot(&shots().join("executions-search.png"));
    b.click(&format!("#executions a[href='/ui/executions/{done}']"));
    let attempts = b.text("#attempts");
    assert!(
        attempts.contains("SUCCEEDED") && attempts.contains("console-worker-1"),
        "the attempt, and the worker that ran it: {attempts}"
    );
    assert!(b.text("#inputs").contains("hello"));
    // The API replays FAILED executions only: a SUCCEEDED one is not offered it.
    assert!(b.try_find("#replay").is_none(), "no replay for a SUCCEEDED execution");
    b.screenshot(&shots().join("execution-detail.png"));

    // Cancel a running one: the page follows it to CANCELLED by itself (live polling).
    let running = c.submit("slow", "console-key-2");
    c.wait_status(&running, "RUNNING");
    b.goto(&c.url(&format!("/ui/executions/{running}")));
    assert!(b.text("#execution-status").contains("RUNNING"));
    b.run("window.confirm = function () { return true; };", json!([]));
    b.click("#cancel");
    b.wait_text("#execution-status", 60, |t| t.contains("CANCELLED"));
    assert_eq!(c.status(&running), "CANCELLED");
    b.screenshot(&shots().join("execution-cancelled.png"));
    // The console's cancel is the API's: audited under the operator's key.
    let (_, audit) =
        api(c.http, &c.admin, "GET", "/audit", &[("Kairos-Namespace", "default")], b"");
    let cancel_audited = audit["entries"].as_array().unwrap().iter().any(|e| {
        e["action"] == "execution.cancel"
            && e["target"].as_str().unwrap_or_default().contains(&running)
    });
    assert!(cancel_audited, "the cancel is in the audit log: {audit}");

    // Bulk: two waiting an hour, found by their status and definition, cancelled at once
    // after a confirmation that says how many.
    let later: Vec<String> =
        (0..2).map(|i| c.submit_later("slow", &format!("console-bulk-{i}"))).collect();
    b.goto(&c.url("/ui/executions?status=SCHEDULED&definition=slow"));
    let table = b.text("#executions");
    assert!(later.iter().all(|id| table.contains(id)), "{table}");
    let asks = b.run(
        "window.confirm = function () { return true; };\
         return document.querySelector('#bulk form').getAttribute('data-confirm');",
        json!([]),
    );
    assert_eq!(
        asks,
        json!("Cancel the 2 executions matching this search (at most 1000 per action)?")
    );
    b.click("#bulk-cancel");
    let result = b.wait_text("#bulk-result", 20, |t| !t.is_empty());
    assert!(result.starts_with("2 cancelled, 0 refused, of 2"), "{result}");
    b.screenshot(&shots().join("bulk-cancel.png"));
    for id in &later {
        assert_eq!(c.status(id), "CANCELLED");
    }

    // The overview: executions by status, and this node's health and lateness.
    b.goto(&c.url("/ui/"));
    b.find("#status-chart");
    let health = b.text("#health");
    assert!(health.starts_with("ok node="), "{health}");
    assert!(b.text("main").contains("p99"), "lateness quantiles shown");
    b.screenshot(&shots().join("overview.png"));

    // Definitions with their declared inputs; the audit log needs `admin`, and says so.
    b.goto(&c.url("/ui/definitions"));
    let defs = b.text("#definitions");
    assert!(defs.contains("slow") && defs.contains("greeting"), "{defs}");
    b.goto(&c.url("/ui/audit"));
    let refused = b.text("#audit-error");
    assert!(refused.contains("`admin`"), "{refused}");

    // Bad search input: the field is named, and it is a 400, not a 5xx.
    b.goto(&c.url("/ui/executions?status=SLEEPING"));
    let err = b.text("#form-error");
    assert!(err.starts_with("status"), "{err}");

    // A phone's width: nothing scrolls sideways but the tables' own boxes.
    b.goto(&c.url("/ui/executions"));
    b.resize(390, 844);
    let fits =
        b.run("return document.documentElement.scrollWidth <= window.innerWidth + 1;", json!([]));
    b.screenshot(&shots().join("executions-phone.png"));
    assert_eq!(fits, json!(true), "the page fits a phone's width");
}

/// A `read` key sees no action buttons, and an action posted anyway is refused with a page
/// naming the missing scope; forms without the session's CSRF token are refused; bad form
/// input is a 4xx naming the field, never a 5xx.
#[test]
#[ignore = "needs Debian's chromium and chromium-driver; .ci/console installs them and runs it"]
fn a_read_key_is_refused_actions() {
    let c = start();
    let id = c.submit("slow", "console-read-1");
    let b = Browser::start();
    sign_in(&b, &c, &c.reader);
    assert!(b.text("#who").contains("scopes read"));
    b.goto(&c.url(&format!("/ui/executions/{id}")));
    b.find("#read-only");
    assert!(b.try_find("#cancel").is_none(), "no cancel button for a read key");
    // Post the cancel form anyway, with the session's token.
    b.run(
        "var t = document.querySelector('input[name=csrf]').value;\
         var f = document.createElement('form'); f.method = 'post'; f.action = arguments[0];\
         var i = document.createElement('input'); i.type = 'hidden'; i.name = 'csrf'; i.value = t;\
         f.appendChild(i); document.body.appendChild(f); f.submit();",
        json!([format!("/ui/executions/{id}/cancel")]),
    );
    let msg = b.wait_text("main", 10, |t| t.contains("Forbidden"));
    assert!(msg.contains("`submit`"), "the refusal names the missing scope: {msg}");
    b.screenshot(&shots().join("read-only-refused.png"));
    assert_ne!(c.status(&id), "CANCELLED");

    // Without the browser: a form without the session's token is refused (403), and a
    // schedule form with a bad expression is a 400 naming `expression`.
    let cookie = format!("kairos_key={}; kairos_ns=default; kairos_csrf=tok", c.operator);
    let h = [("Cookie", cookie.as_str()), ("Content-Type", "application/x-www-form-urlencoded")];
    let post =
        |path: &str, form: &[u8]| webdriver::request(c.http, "POST", path, &h, form).unwrap();
    let (status, _) = post(&format!("/ui/executions/{id}/cancel"), b"csrf=other");
    assert_eq!(status, 403);
    assert_ne!(c.status(&id), "CANCELLED");
    let form = b"csrf=tok&definitionUri=registry%3A%2F%2Fjobs%2Fecho&definitionVersion=1&expression=bogus&timezone=UTC";
    let (status, page) = post("/ui/schedules", form);
    assert_eq!(status, 400, "{page}");
    assert!(page.contains("<strong>expression</strong>"), "{page}");
    let form = b"csrf=tok&definitionUri=registry%3A%2F%2Fjobs%2Fecho&definitionVersion=x&expression=*+*+*+*+*";
    let (status, page) = post("/ui/schedules", form);
    assert_eq!(status, 400, "{page}");
    assert!(page.contains("<strong>definitionVersion</strong>"), "{page}");
    let form = b"csrf=tok&definitionUri=registry%3A%2F%2Fjobs%2Fecho&expression=*+*+*+*+*&timezone=Mars%2FOlympus";
    let (status, page) = post("/ui/schedules", form);
    assert!((400..500).contains(&status), "{status} {page}");
    assert!(page.contains("timezone"), "{page}");
}

/// Create a schedule in Europe/Berlin whose preview crosses the March DST change (shown as
/// the user types), read its next occurrences in the zone and in UTC, pause it with a reason
/// and resume it.
#[test]
#[ignore = "needs Debian's chromium and chromium-driver; .ci/console installs them and runs it"]
fn schedules_preview_across_dst_create_and_pause() {
    let c = start();
    let b = Browser::start();
    sign_in(&b, &c, &c.operator);
    b.goto(&c.url("/ui/schedules"));
    b.click("#new-schedule");
    b.fill("#cronJobId", "monthly-report");
    b.fill("#definitionUri", "registry://jobs/echo");
    b.fill("#timezone", "Europe/Berlin");
    // Noon on the 1st of each month: from December on, five occurrences cross the last
    // Sunday of March, where Berlin goes from +01:00 to +02:00.
    b.fill("#inputs", r#"{"greeting": "monthly"}"#);
    b.fill("#expression", "0 12 1 * *");
    let preview = b.wait_text("#preview", 10, |t| t.contains("DST change"));
    assert!(preview.contains("12:00:00+01:00") && preview.contains("12:00:00+02:00"), "{preview}");
    assert!(preview.contains("T11:00:00Z") && preview.contains("T10:00:00Z"), "{preview}");
    assert!(preview.contains("+01:00 → +02:00"), "{preview}");
    b.run("document.getElementById('preview').scrollIntoView();", json!([]));
    b.screenshot(&shots().join("schedule-preview-dst.png"));
    b.click("#create");
    b.wait_text("#schedule-status", 10, |t| !t.is_empty());
    assert!(b.url().ends_with("/ui/schedules/monthly-report"), "{}", b.url());
    let occ = b.text("#occurrences");
    assert!(occ.contains("DST change"), "{occ}");
    b.fill("#reason", "month-end freeze");
    b.click("#pause");
    b.wait_text("#schedule-status", 10, |t| t.contains("PAUSED"));
    let (_, job) = api(c.http, &c.operator, "GET", "/cron-jobs/monthly-report", &[], b"");
    assert_eq!(job["status"], "PAUSED", "{job}");
    assert!(b.text("main").contains("month-end freeze"));
    b.screenshot(&shots().join("schedule-paused.png"));
    b.click("#resume");
    b.wait_text("#schedule-status", 10, |t| !t.contains("PAUSED"));
    // Backfill: a bad time is named; a past range submits its occurrences.
    b.fill("#from", "last tuesday");
    b.click("#backfill");
    let err = b.wait_text("main", 10, |t| t.contains("Bad Request"));
    assert!(err.contains("from"), "{err}");
    b.goto(&c.url("/ui/schedules/monthly-report"));
    b.fill("#from", "2026-09-15T00:00:00Z");
    b.fill("#until", "2026-12-02T00:00:00Z");
    b.click("#backfill");
    let done = b.wait_text("#backfill-result", 20, |t| !t.is_empty());
    assert!(done.starts_with("3 occurrences"), "October, November, December 1st: {done}");
    b.goto(&c.url("/ui/schedules/monthly-report"));
    // Trigger now: a run appears in its last runs (live), and the worker runs it.
    b.click("#trigger");
    let runs = b.wait_text("#runs", 30, |t| t.contains("SUCCEEDED"));
    assert!(!runs.contains("No runs yet"), "{runs}");
    b.goto(&c.url("/ui/schedules"));
    assert!(b.text("#schedules").contains("monthly-report"));
}

/// No worker serves this queue: what is submitted to it waits READY.
const IDLE: &str =
    "name: idle\nversion: 1\nqueue: idle\nexecution:\n  type: command\n  command: [\"true\"]\n";

/// The overview's cluster sections: a queue without workers with its depth and oldest READY
/// age, the worker streaming on this node with its credits, the node and its shard leases
/// (admins; another key is told it lacks `admin`), and the last hour's completions and
/// lateness as charts; at a phone's width nothing scrolls sideways.
#[test]
#[ignore = "needs Debian's chromium and chromium-driver; .ci/console installs them and runs it"]
fn overview_queues_workers_nodes_and_the_last_hour() {
    let c = start();
    let (status, v) = api(c.http, &c.operator, "POST", "/definitions", &[], IDLE.as_bytes());
    assert!(status == 201 || status == 200, "{status} {v}");
    for i in 0..3 {
        let id = c.submit("echo", &format!("overview-{i}"));
        c.wait_status(&id, "SUCCEEDED");
    }
    for i in 0..2 {
        let body =
            json!({"definitionUri": "registry://jobs/idle", "definitionVersion": 1, "delayMs": 0})
                .to_string();
        let key = format!("idle-{i}");
        let (status, v) = api(
            c.http,
            &c.operator,
            "POST",
            "/executions",
            &[("Idempotency-Key", &key)],
            body.as_bytes(),
        );
        assert_eq!(status, 201, "{v}");
    }
    let b = Browser::start();
    sign_in(&b, &c, &c.admin);
    b.goto(&c.url("/ui/"));
    let queues = b.wait_text("#queues", 10, |t| t.contains("idle"));
    let idle_row = queues.lines().find(|l| l.contains("idle")).unwrap_or_default().to_string();
    assert!(idle_row.contains('2'), "two READY in the queue without workers: {queues}");
    assert!(queues.contains("ms") || queues.contains(" s"), "the oldest READY age: {queues}");
    let workers = b.text("#workers");
    assert!(
        workers.contains("console-worker-1") && workers.contains("stream"),
        "the worker and its stream: {workers}"
    );
    let health = b.text("#health");
    let node_id = health.split("node=").nth(1).unwrap().split(' ').next().unwrap().to_string();
    let nodes = b.text("#nodes");
    assert!(nodes.contains(&node_id), "this node among the live ones: {nodes}");
    assert!(b.text("main").contains("leased"), "the shard leases counted");
    b.find("#completions-chart");
    b.find("#lateness-chart");
    let totals = b.text("#last-hour-totals");
    let finished: u64 = totals.split(' ').next().unwrap().parse().unwrap();
    assert!(finished >= 3, "the three echoes finished this hour: {totals}");
    b.run("document.getElementById('completions-chart').scrollIntoView();", json!([]));
    b.screenshot(&shots().join("overview-cluster.png"));
    b.resize(390, 844);
    let fits =
        b.run("return document.documentElement.scrollWidth <= window.innerWidth + 1;", json!([]));
    b.screenshot(&shots().join("overview-phone.png"));
    assert_eq!(fits, json!(true), "the overview fits a phone's width");

    // Another key sees its queues and workers, and is told why not the nodes.
    let b = Browser::start();
    sign_in(&b, &c, &c.operator);
    b.goto(&c.url("/ui/"));
    assert!(b.text("#queues").contains("idle"));
    let refused = b.text("#nodes-refused");
    assert!(refused.contains("`admin`") || refused.contains("every namespace"), "{refused}");
}

/// Fails at once, and is not retried: a FAILED execution to replay.
const FAIL: &str = "name: fail\nversion: 1\nqueue: console\ninputs:\n  greeting: string\nretry: {max_attempts: 1}\nexecution:\n  type: command\n  command: [\"sh\", \"-c\", \"echo boom >&2; exit 3\"]\n";

/// Submits `def` due in `delay_ms` as `key` in `ns`; its id and `executeAt`.
fn submit_in(
    c: &Cluster,
    key: &str,
    ns: &str,
    def: &str,
    delay_ms: u64,
    idem: &str,
) -> (String, String) {
    let body = json!({"definitionUri": format!("registry://jobs/{def}"), "definitionVersion": 1,
        "inputs": {"greeting": "x"}, "delayMs": delay_ms})
    .to_string();
    let h = [("Idempotency-Key", idem), ("Kairos-Namespace", ns)];
    let (status, v) = api(c.http, key, "POST", "/executions", &h, body.as_bytes());
    assert_eq!(status, 201, "{v}");
    (v["executionId"].as_str().unwrap().into(), v["executeAt"].as_str().unwrap().into())
}

/// The executions search by a due-time window (a bad time named), bulk cancel of every
/// execution the search matches (more than a page), bulk replay offered for FAILED ones only
/// and done, and the namespace filter of a key of every namespace.
#[test]
#[ignore = "needs Debian's chromium and chromium-driver; .ci/console installs them and runs it"]
fn executions_window_bulk_over_the_whole_set_and_namespaces() {
    let c = start();
    let (status, v) = api(c.http, &c.operator, "POST", "/definitions", &[], FAIL.as_bytes());
    assert!(status == 201 || status == 200, "{status} {v}");
    let soon: Vec<String> = (0..60)
        .map(|i| submit_in(&c, &c.operator, "default", "slow", 3_600_000, &format!("w-{i}")).0)
        .collect();
    let (late, late_at) = submit_in(&c, &c.operator, "default", "slow", 7_200_000, "w-late");
    let b = Browser::start();
    sign_in(&b, &c, &c.operator);
    assert!(b.try_find("#f-namespace").is_none(), "one namespace: no namespace filter");

    // The window: from the late one's due time on, only it.
    b.goto(&c.url("/ui/executions?definition=slow"));
    b.fill("#f-from", &late_at);
    b.click("form[role=search] button");
    let table = b.wait_text("#executions", 10, |t| t.contains(&late));
    assert!(!table.contains(&soon[0]), "{table}");
    b.fill("#f-from", "yesterday");
    b.click("form[role=search] button");
    let err = b.wait_text("#form-error", 10, |t| !t.is_empty());
    assert!(err.starts_with("from"), "{err}");

    // Before it: the 60, over two pages; the bulk cancel takes all 60 and says so first.
    let q = format!(
        "/ui/executions?status=SCHEDULED&definition=slow&to={}",
        late_at.replace('+', "%2B")
    );
    b.goto(&c.url(&q));
    b.find("a[rel=next]");
    assert!(b.try_find("#bulk-replay").is_none(), "replay is for FAILED executions only");
    let asks = b.run(
        "window.confirm = function () { return true; };\
         return document.querySelector('#bulk form').getAttribute('data-confirm');",
        json!([]),
    );
    assert_eq!(
        asks,
        json!("Cancel the 60 executions matching this search (at most 1000 per action)?")
    );
    b.screenshot(&shots().join("executions-window-bulk.png"));
    b.click("#bulk-cancel");
    let result = b.wait_text("#bulk-result", 60, |t| !t.is_empty());
    assert!(result.starts_with("60 cancelled, 0 refused, of 60"), "{result}");
    assert!(soon.iter().all(|id| c.status(id) == "CANCELLED"));
    assert_eq!(c.status(&late), "SCHEDULED", "outside the window: untouched");

    // A FAILED one: replay offered (on its page and in bulk), and done in place.
    let (failed, _) = submit_in(&c, &c.operator, "default", "fail", 0, "w-fail");
    c.wait_status(&failed, "FAILED");
    b.goto(&c.url(&format!("/ui/executions/{failed}")));
    b.find("#replay");
    b.goto(&c.url("/ui/executions?status=FAILED&definition=fail"));
    b.run("window.confirm = function () { return true; };", json!([]));
    b.click("#bulk-replay");
    let result = b.wait_text("#bulk-result", 30, |t| !t.is_empty());
    assert!(result.starts_with("1 replayed, 0 refused, of 1"), "{result}");
    let t = Instant::now();
    loop {
        let (_, e) = api(c.http, &c.operator, "GET", &format!("/executions/{failed}"), &[], b"");
        if e["attemptCount"].as_u64() == Some(2) && e["status"] == "FAILED" {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the replay ran a second attempt: {e}");
        std::thread::sleep(Duration::from_millis(200));
    }

    a_key_of_every_namespace_searches_another(&c, &late);
}

/// Edit a schedule with the live preview (a bad expression named), and its last runs marked:
/// a FAILED run `failed`, occurrences skipped by the overlap policy `skipped`.
#[test]
#[ignore = "needs Debian's chromium and chromium-driver; .ci/console installs them and runs it"]
fn schedules_edit_and_runs_marked() {
    let c = start();
    let (status, v) = api(c.http, &c.operator, "POST", "/definitions", &[], FAIL.as_bytes());
    assert!(status == 201 || status == 200, "{status} {v}");
    let job = |id: &str, def: &str, expr: &str| {
        let body = json!({"cronJobId": id, "definitionUri": format!("registry://jobs/{def}"),
            "definitionVersion": 1, "expression": expr, "timezone": "UTC", "inputs": {"greeting": "cron"}})
        .to_string();
        let (status, v) = api(c.http, &c.operator, "POST", "/cron-jobs", &[], body.as_bytes());
        assert_eq!(status, 201, "{v}");
    };
    // Every 2 s, each run 120 s long: after the first, the overlap policy (skip) skips them.
    job("every-2s-slow", "slow", "*/2 * * * * *");
    job("every-3s-fail", "fail", "*/3 * * * * *");
    std::thread::sleep(Duration::from_secs(8));
    let b = Browser::start();
    sign_in(&b, &c, &c.operator);
    b.goto(&c.url("/ui/schedules/every-2s-slow"));
    let runs = b.wait_text("#runs", 20, |t| t.contains("skipped"));
    assert!(runs.contains("no run") && runs.contains("RUNNING"), "{runs}");
    b.run("document.getElementById('runs').scrollIntoView();", json!([]));
    b.screenshot(&shots().join("schedule-runs-skipped.png"));
    b.goto(&c.url("/ui/schedules/every-3s-fail"));
    let runs = b.wait_text("#runs", 20, |t| t.contains("failed"));
    assert!(runs.contains("FAILED"), "{runs}");
    b.run("document.getElementById('runs').scrollIntoView();", json!([]));
    b.screenshot(&shots().join("schedule-runs-failed.png"));

    // Edit: a bad expression is named; a good one previews live (DST marked) and is saved.
    b.click("#edit");
    b.find("#save");
    b.fill("#expression", "bogus");
    b.click("#save");
    let err = b.wait_text("#form-error", 10, |t| !t.is_empty());
    assert!(err.starts_with("expression"), "{err}");
    b.fill("#timezone", "Europe/Berlin");
    b.fill("#expression", "0 12 1 * *");
    let preview = b.wait_text("#preview", 10, |t| t.contains("DST change"));
    assert!(preview.contains("12:00:00+01:00"), "{preview}");
    b.screenshot(&shots().join("schedule-edit-preview.png"));
    b.click("#save");
    b.wait_text("#schedule-status", 10, |t| !t.is_empty());
    assert!(b.url().ends_with("/ui/schedules/every-3s-fail"), "{}", b.url());
    let (_, j) = api(c.http, &c.operator, "GET", "/cron-jobs/every-3s-fail", &[], b"");
    assert_eq!(
        (j["expression"].as_str(), j["timezone"].as_str()),
        (Some("0 12 1 * *"), Some("Europe/Berlin")),
        "{j}"
    );
    b.resize(390, 844);
    b.goto(&c.url("/ui/schedules/every-3s-fail/edit"));
    let fits =
        b.run("return document.documentElement.scrollWidth <= window.innerWidth + 1;", json!([]));
    b.screenshot(&shots().join("schedule-edit-phone.png"));
    assert_eq!(fits, json!(true), "the edit form fits a phone's width");
}

/// The failed and quarantined page, and API keys: an admin lists, creates (the token shown
/// once, and it works) and revokes (and it stops working); another key is refused naming
/// `admin`. At a phone's width nothing scrolls sideways.
#[test]
#[ignore = "needs Debian's chromium and chromium-driver; .ci/console installs them and runs it"]
fn failed_quarantined_and_api_keys() {
    let c = start();
    let (status, v) = api(c.http, &c.operator, "POST", "/definitions", &[], FAIL.as_bytes());
    assert!(status == 201 || status == 200, "{status} {v}");
    let (failed, _) = submit_in(&c, &c.operator, "default", "fail", 0, "k-fail");
    c.wait_status(&failed, "FAILED");

    let b = Browser::start();
    sign_in(&b, &c, &c.operator);
    b.goto(&c.url("/ui/failed"));
    assert!(b.text("#executions").contains(&failed));
    let refused = b.text("#quarantined-error");
    assert!(refused.contains("`admin`") || refused.contains("every namespace"), "{refused}");
    b.goto(&c.url("/ui/keys"));
    let refused = b.text("#keys-error");
    assert!(refused.contains("`admin`"), "{refused}");
    b.screenshot(&shots().join("keys-refused.png"));

    let b = Browser::start();
    sign_in(&b, &c, &c.admin);
    b.goto(&c.url("/ui/failed"));
    assert!(b.text("#quarantined").contains("Nothing quarantined"));
    b.resize(390, 844);
    let fits =
        b.run("return document.documentElement.scrollWidth <= window.innerWidth + 1;", json!([]));
    b.screenshot(&shots().join("failed-phone.png"));
    assert_eq!(fits, json!(true), "the failed page fits a phone's width");
    b.resize(1280, 900);
    b.goto(&c.url("/ui/keys"));
    let keys = b.text("#keys");
    assert!(keys.contains("operator") && keys.contains("reader"), "{keys}");
    b.fill("#key-name", "made-in-console");
    b.click("#scope-read");
    b.click("#create-key");
    let token = b.wait_text("#new-token", 10, |t| t.starts_with("kai_"));
    let (status, me) = api(c.http, &token, "GET", "/whoami", &[], b"");
    assert_eq!(status, 200, "the new key works: {me}");
    assert_eq!(me["scopes"], json!(["read"]), "{me}");
    b.screenshot(&shots().join("keys-created.png"));
    let id = me["who"].as_str().unwrap().trim_start_matches("key:").to_string();
    b.run("window.confirm = function () { return true; };", json!([]));
    b.click(&format!("#revoke-{id}"));
    b.wait_text("#keys", 10, |t| t.contains("made-in-console"));
    let t = Instant::now();
    while api(c.http, &token, "GET", "/whoami", &[], b"").0 != 401 {
        assert!(t.elapsed() < Duration::from_secs(10), "the revoked key still works");
        std::thread::sleep(Duration::from_millis(200));
    }
    b.resize(390, 844);
    let fits =
        b.run("return document.documentElement.scrollWidth <= window.innerWidth + 1;", json!([]));
    b.screenshot(&shots().join("keys-phone.png"));
    assert_eq!(fits, json!(true), "the keys page fits a phone's width");
}

/// A key of every namespace searches another namespace (and not `late`'s), at 390 px too.
fn a_key_of_every_namespace_searches_another(c: &Cluster, late: &str) {
    let h = [("Kairos-Namespace", "other")];
    let (status, v) = api(c.http, &c.admin, "POST", "/definitions", &h, ECHO.as_bytes());
    assert!(status == 201 || status == 200, "{status} {v}");
    let (other, _) = submit_in(c, &c.admin, "other", "echo", 3_600_000, "w-other");
    let b = Browser::start();
    sign_in(&b, c, &c.admin);
    b.goto(&c.url("/ui/executions"));
    b.fill("#f-namespace", "other");
    b.click("form[role=search] button");
    let table = b.wait_text("#executions", 10, |t| t.contains(&other));
    assert!(!table.contains(late), "only namespace other: {table}");
    b.resize(390, 844);
    let fits =
        b.run("return document.documentElement.scrollWidth <= window.innerWidth + 1;", json!([]));
    b.screenshot(&shots().join("executions-namespace-phone.png"));
    assert_eq!(fits, json!(true), "the filters fit a phone's width");
}
