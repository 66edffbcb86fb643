//! A real `kairos dev` node's `/metrics` as Prometheus scrapes it (issue 36): the per-queue
//! gauges, request metrics per gRPC method and HTTP route, `kairos_build_info` and the process
//! series — their values move with what the node is asked to do; and the alerts, their
//! promtool test and the Grafana dashboard in docs/ops/ name only metrics (and, for the test's
//! input series, label sets) of that scrape.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::time::{Duration, Instant};

use kairos_sdk::{Client, Worker};
use kairos_tests::dev::DevNode;
use kairos_tests::http_request;
use tokio::sync::watch;

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");

const ORPHAN: &str = "name: orphan\nversion: 1\nexecution: {type: test}\n";
const SERVED: &str = "name: served\nversion: 1\nexecution: {type: test}\n";

/// `GET /metrics`, its body as is ([`http_request`] keeps only a body's JSON part).
fn scrape(node: &DevNode) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", node.http)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(!head.to_ascii_lowercase().contains("chunked"), "{head}");
    body.to_string()
}

/// The value of the sample `series` (name and labels exactly as exported), if present.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn must(text: &str, series: &str) -> f64 {
    value(text, series).unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}

/// Scrapes until `series` satisfies `ok` (15 s at most).
async fn wait_for(node: &DevNode, series: &str, ok: impl Fn(f64) -> bool) -> String {
    let t = Instant::now();
    loop {
        let text = scrape(node);
        if value(&text, series).is_some_and(&ok) {
            return text;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "{series} never matched:\n{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_scrape_has_queue_request_build_and_process_series() {
    let dir = tempfile::tempdir().unwrap();
    let node = DevNode::start(KAIROS, dir.path()).await;
    let client = Client::connect(&node.endpoint).await.unwrap();
    client.register_definition(ORPHAN).await.unwrap();
    client.register_definition(SERVED).await.unwrap();
    let first = scrape(&node);
    let build = first.lines().find(|l| l.starts_with("kairos_build_info{")).expect("build info");
    assert!(
        build.contains("version=\"0.1.0\"") && build.contains("backend=\"embedded\""),
        "{build}"
    );
    assert!(!build.contains("commit=\"\""), "{build}");
    assert!(must(&first, "process_resident_memory_bytes") > 1e6);
    assert!(must(&first, "process_open_fds") >= 3.0);
    assert!(value(&first, "process_cpu_seconds_total").is_some(), "{first}");

    // Queues: READY work on a queue nobody serves, then a worker on another.
    let depth = "kairos_queue_depth{namespace=\"default\",queue=\"orphan\"}";
    assert_eq!(value(&first, depth), None, "nothing READY yet");
    for _ in 0..2 {
        client.submit("registry://jobs/orphan", 1).send().await.unwrap();
    }
    wait_for(&node, depth, |v| v == 2.0).await;
    let age = "kairos_queue_oldest_ready_age_seconds{namespace=\"default\",queue=\"orphan\"}";
    wait_for(&node, age, |v| v >= 1.0).await;
    let (stop, stopped) = watch::channel(false);
    let worker = Worker::new(client.clone(), "served", "w-metrics")
        .concurrency(7)
        .handle("served", |_task| async { Ok(serde_json::json!({})) });
    let run = tokio::spawn(worker.run(stopped));
    let workers = "kairos_workers_connected{namespace=\"default\",queue=\"served\"}";
    let text = wait_for(&node, workers, |v| v == 1.0).await;
    let credits = "kairos_worker_credits_free{namespace=\"default\",queue=\"served\"}";
    assert_eq!(must(&text, credits), 7.0);
    assert_eq!(
        must(&text, "kairos_workers_connected{namespace=\"default\",queue=\"orphan\"}"),
        0.0
    );

    requests_are_counted(&node, &client, &text).await;
    stop.send(true).unwrap();
    run.await.unwrap().unwrap();
    // Gone with its worker: a queue with neither READY work nor a worker is not exported.
    let t = Instant::now();
    while value(&scrape(&node), workers).is_some() {
        assert!(t.elapsed() < Duration::from_secs(15), "the worker's series stays");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let text = scrape(&node);
    every_metric_has_help(&text);
    docs_use_only_scraped_metrics(&text);
}

/// Every metric family has a `# HELP` line.
fn every_metric_has_help(text: &str) {
    let helps: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# HELP ")).collect();
    for t in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let name = t.split(' ').next().unwrap();
        assert!(helps.iter().any(|h| h.starts_with(&format!("{name} "))), "no help: {name}");
    }
}

/// Requests by route template and gRPC method, errors by code.
async fn requests_are_counted(node: &DevNode, client: &Client, text: &str) {
    // Requests: by route template and gRPC method, errors by code.
    let scrapes = "kairos_http_requests_total{method=\"GET\",route=\"/metrics\"}";
    let before = must(text, scrapes);
    for id in ["nope-1", "nope-2"] {
        let (code, _) =
            http_request(node.http, "GET", &format!("/executions/{id}"), &[], b"").unwrap();
        assert_eq!(code, 404);
        assert!(client.get(id).await.is_err());
    }
    let text = scrape(node);
    assert_eq!(must(&text, scrapes), before + 1.0, "the previous scrape counted");
    let route = "method=\"GET\",route=\"/executions/{id}\"";
    assert_eq!(must(&text, &format!("kairos_http_requests_total{{{route}}}")), 2.0);
    assert_eq!(
        must(&text, &format!("kairos_http_request_errors_total{{{route},code=\"404\"}}")),
        2.0
    );
    assert_eq!(must(&text, &format!("kairos_http_request_duration_seconds_count{{{route}}}")), 2.0);
    assert!(!text.contains("nope-1"), "raw paths never become labels");
    let get = "method=\"/kairos.v1.ExecutionService/Get\"";
    assert_eq!(must(&text, &format!("kairos_grpc_requests_total{{{get}}}")), 2.0);
    assert_eq!(
        must(&text, &format!("kairos_grpc_request_errors_total{{{get},code=\"NotFound\"}}")),
        2.0
    );
    let register = "kairos_grpc_requests_total{method=\"/kairos.v1.DefinitionService/Register\"}";
    assert_eq!(must(&text, register), 2.0);
    assert!(must(&text, &format!("kairos_grpc_request_duration_seconds_count{{{get}}}")) == 2.0);
}

/// `(name, label names)` of every sample of a scrape, and the metric families' names.
fn scraped(text: &str) -> (Vec<(String, Vec<String>)>, Vec<String>) {
    let samples =
        text.lines().filter(|l| !l.starts_with('#')).map(|l| series(l.split(' ').next().unwrap()));
    let families = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next());
    (samples.collect(), families.map(str::to_string).collect())
}

/// `name{a="x",b="y"}` as `(name, [a, b])`, sorted, `instance` (Prometheus's own) left out.
fn series(s: &str) -> (String, Vec<String>) {
    let (name, labels) = s.split_once('{').unwrap_or((s, ""));
    let mut names: Vec<String> = labels
        .trim_end_matches('}')
        .split(',')
        .filter_map(|kv| Some(kv.split_once('=')?.0.trim().to_string()))
        .filter(|k| k != "instance")
        .collect();
    names.sort();
    (name.to_string(), names)
}

fn docs_use_only_scraped_metrics(text: &str) {
    let (samples, families) = scraped(text);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ops");
    for file in ["alerts.yml", "alerts.test.yml", "grafana-kairos.json"] {
        let doc = std::fs::read_to_string(dir.join(file)).unwrap();
        let words = doc.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        let names = words.filter(|w| w.starts_with("kairos_") || w.starts_with("process_"));
        for n in names {
            let known = families.iter().any(|f| f == n) || samples.iter().any(|(s, _)| s == n);
            assert!(known, "{file} names {n}, which a real scrape does not have");
        }
    }
    let tests = std::fs::read_to_string(dir.join("alerts.test.yml")).unwrap();
    let inputs =
        tests.lines().filter_map(|l| l.split_once("series: '")?.1.split_once('\'')).map(|(s, _)| s);
    let mut n = 0;
    for input in inputs {
        let want = series(input);
        assert!(samples.contains(&want), "alerts.test.yml's {input}: no such series in a scrape");
        n += 1;
    }
    assert!(n >= 10, "the promtool test's input series were read: {n}");
}
