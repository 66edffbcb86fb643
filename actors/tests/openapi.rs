//! The HTTP API against its description, `docs/openapi.yaml`: every operation is called with a
//! good request and with seeded mutations of it (wrong types, unknown and missing fields,
//! odd path and query values). Every answer must be a status the description lists for that
//! operation, with a body matching the schema it gives; a schema-valid request never gets a
//! 5xx, a schema-invalid one always gets a 4xx; every operation is seen succeeding at least
//! once. A property test in the spirit of schemathesis, in Rust, run by `cargo test`.
#![allow(clippy::disallowed_methods)] // waits on tokio's paused clock

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use kairos_actors::node::Node;
use kairos_actors::server::config::{Backend, NodeConfig};
use kairos_layer::env::{Rng, SharedClock, Timestamp, TokioClock};
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use serde_json::{Value, json};
use tower::ServiceExt;

const DEF: &str = "name: echo\nversion: 1\ninputs:\n  name: string\nexecution: {type: command, command: [\"true\"]}\n";
/// Mutations tried per operation.
const MUTATIONS: usize = 40;

fn spec() -> Value {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.yaml"))
            .expect("docs/openapi.yaml");
    serde_yaml_ng::from_str(&text).expect("openapi.yaml is YAML")
}

/// Follows `$ref` (`#/components/...`).
fn resolve<'a>(spec: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let mut at = spec;
            for part in r.trim_start_matches("#/").split('/') {
                at = &at[part];
            }
            assert!(!at.is_null(), "dangling $ref {r}");
            resolve(spec, at)
        }
        None => v,
    }
}

/// Checks `v` against an OpenAPI schema (the subset the description uses).
fn validate(spec: &Value, schema: &Value, v: &Value, at: &str) -> Result<(), String> {
    let schema = resolve(spec, schema);
    if v.is_null() {
        return if schema["nullable"] == json!(true) || schema.get("type").is_none() {
            Ok(())
        } else {
            Err(format!("{at}: null where {schema} is not nullable"))
        };
    }
    if let Some(options) = schema["enum"].as_array()
        && !options.contains(v)
    {
        return Err(format!("{at}: {v} not in {options:?}"));
    }
    let ty = schema["type"].as_str().unwrap_or("");
    let ok = match ty {
        "" => true,
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        other => return Err(format!("{at}: schema type {other} unknown to this checker")),
    };
    if !ok {
        return Err(format!("{at}: {v} is not {ty}"));
    }
    if schema["format"] == json!("date-time") {
        let s = v.as_str().unwrap_or_default();
        kairos_actors::api::json::parse_rfc3339(s).map_err(|e| format!("{at}: {s:?}: {e}"))?;
    }
    if let (Some(min), Some(n)) = (schema["minimum"].as_i64(), v.as_i64())
        && n < min
    {
        return Err(format!("{at}: {n} < minimum {min}"));
    }
    if let (Some(max), Some(n)) = (schema["maximum"].as_i64(), v.as_i64())
        && n > max
    {
        return Err(format!("{at}: {n} > maximum {max}"));
    }
    if let Some(obj) = v.as_object() {
        for r in schema["required"].as_array().into_iter().flatten() {
            let r = r.as_str().unwrap();
            if !obj.contains_key(r) {
                return Err(format!("{at}: required {r} missing"));
            }
        }
        let props = schema["properties"].as_object();
        for (k, val) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(s) => validate(spec, s, val, &format!("{at}.{k}"))?,
                None if schema["additionalProperties"] == json!(false) => {
                    return Err(format!("{at}: unexpected property {k}"));
                }
                None => {}
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), v.as_array()) {
        for (i, x) in arr.iter().enumerate() {
            validate(spec, items, x, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

/// Percent-encoding of a path segment or query value.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One request.
#[derive(Debug, Clone)]
struct Call {
    method: &'static str,
    /// The path template of the description (`/executions/{executionId}`).
    template: &'static str,
    path: String,
    query: Vec<(String, String)>,
    body: Option<String>,
    /// The request breaks the description (a mutation made it so): it must get a 4xx.
    invalid: bool,
}

impl Call {
    fn new(method: &'static str, template: &'static str, path: &str) -> Call {
        Call { method, template, path: path.into(), query: Vec::new(), body: None, invalid: false }
    }
    fn query(mut self, k: &str, v: &str) -> Call {
        self.query.push((k.into(), v.into()));
        self
    }
    fn body(mut self, b: Value) -> Call {
        self.body = Some(b.to_string());
        self
    }
    fn raw_body(mut self, b: &str) -> Call {
        self.body = Some(b.into());
        self
    }
    fn uri(&self) -> String {
        let q: Vec<String> =
            self.query.iter().map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect();
        if q.is_empty() { self.path.clone() } else { format!("{}?{}", self.path, q.join("&")) }
    }
}

async fn send(node: &Node, c: &Call) -> (u16, String, Vec<u8>) {
    let mut req = Request::builder().method(c.method).uri(c.uri());
    if c.body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let req = req.body(Body::from(c.body.clone().unwrap_or_default())).unwrap();
    let resp = kairos_actors::api::http::router(node.clone()).oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 24).await.unwrap().to_vec();
    (status, ct, body)
}

/// Strings a client might send where a string is expected.
fn odd_strings() -> [String; 8] {
    [
        String::new(),
        " ".into(),
        "é✓".into(),
        "../../etc".into(),
        "x".repeat(300),
        "%00".into(),
        "-1".into(),
        "99999999999999999999".into(),
    ]
}

fn pick<T: Clone>(rng: &Rng, from: &[T]) -> T {
    from[rng.below(from.len() as u64) as usize].clone()
}

/// Mutations of a good call: values of the wrong type, unknown and missing fields, odd path
/// segments and query values.
fn mutate(rng: &Rng, good: &Call, body_schema: Option<&Value>, spec: &Value) -> Call {
    let mut c = good.clone();
    match rng.below(4) {
        // A path parameter replaced (any string is a valid path parameter).
        0 if c.template.contains('{') => {
            let params: Vec<usize> = c
                .template
                .split('/')
                .enumerate()
                .filter(|(_, s)| s.starts_with('{'))
                .map(|(i, _)| i)
                .collect();
            let mut segs: Vec<String> = c.path.split('/').map(str::to_string).collect();
            let odd = pick(rng, &odd_strings());
            segs[pick(rng, &params)] = enc(if odd.is_empty() { "e" } else { &odd });
            c.path = segs.join("/");
        }
        // A query value replaced or an unknown parameter added (the server may refuse either;
        // it must not fail).
        0 | 1 => {
            if !c.query.is_empty() && rng.chance(0.7) {
                let i = rng.below(c.query.len() as u64) as usize;
                c.query[i].1 = pick(rng, &odd_strings());
            } else {
                c.query.push(("bogus".into(), "1".into()));
            }
        }
        // A body field of the wrong type, unknown, or missing.
        _ => mutate_body(rng, &mut c, body_schema, spec),
    }
    c
}

/// A body field of the wrong type, unknown, or missing (an unknown parameter when no body).
fn mutate_body(rng: &Rng, c: &mut Call, body_schema: Option<&Value>, spec: &Value) {
    let Some(body) = c.body.clone() else {
        c.query.push(("bogus".into(), "1".into()));
        return;
    };
    let mut v: Value = serde_json::from_str(&body).unwrap_or(json!({}));
    let Some(obj) = v.as_object_mut() else { return };
    let keys: Vec<String> = obj.keys().cloned().collect();
    let schema = body_schema.map(|s| resolve(spec, s));
    let required = |k: &str| {
        schema
            .as_ref()
            .is_some_and(|s| s["required"].as_array().is_some_and(|r| r.contains(&json!(k))))
    };
    match rng.below(3) {
        0 if !keys.is_empty() => {
            let odd_values = [
                json!(null),
                json!(-1),
                json!("x"),
                json!([1]),
                json!({"a": 1}),
                json!(1.5),
                json!(true),
            ];
            let k = pick(rng, &keys);
            let new = pick(rng, &odd_values);
            // null for an optional field is the field left out (as the API documents).
            let fits = (new.is_null() && !required(&k))
                || schema
                    .as_ref()
                    .map(|s| validate(spec, &s["properties"][k.as_str()], &new, &k).is_ok())
                    .unwrap_or(true);
            obj.insert(k, new);
            c.invalid |= !fits;
        }
        1 if !keys.is_empty() => {
            let k = pick(rng, &keys);
            obj.remove(&k);
            c.invalid |= required(&k);
        }
        _ => {
            obj.insert("bogusField".into(), json!(1));
            let closed = schema.as_ref().is_some_and(|s| s["additionalProperties"] == json!(false));
            c.invalid |= closed;
        }
    }
    c.body = Some(v.to_string());
}

#[tokio::test(start_paused = true)]
async fn every_answer_is_one_the_description_gives() {
    let spec = spec();
    let clock: SharedClock =
        Arc::new(TokioClock::starting_at(Timestamp::from_millis(1_790_000_000_000)));
    let db = MemoryDatabase::open(clock.clone(), Rng::seeded(1), FaultConfig::none());
    let config = NodeConfig {
        node_id: Some("n1".into()),
        backend: Backend::Memory,
        shard_count: 4,
        ..NodeConfig::default()
    };
    let node = Node::start(config, db, clock, Rng::seeded(2)).await.unwrap();
    let calls = calls(&node).await;
    every_described_operation_is_called(&spec, &calls);
    let rng = Rng::seeded(0x0A9E_4A91);
    let mut succeeded: BTreeMap<String, u32> = BTreeMap::new();
    let mut seen: BTreeMap<u16, u32> = BTreeMap::new();
    // (operation, status, kind) → one example: every kind of mismatch reported at once.
    let mut wrong = Mismatches::default();
    for good in &calls {
        let op = &spec["paths"][good.template][good.method.to_lowercase()];
        assert!(op.is_object(), "{} {} is not described", good.method, good.template);
        let body_schema = op["requestBody"]["content"]["application/json"].get("schema");
        let mut tries = vec![good.clone()];
        tries.extend((0..MUTATIONS).map(|_| mutate(&rng, good, body_schema, &spec)));
        for c in tries {
            let answer = send(&node, &c).await;
            let status = answer.0;
            *seen.entry(status).or_default() += 1;
            if check_answer(&spec, op, &c, answer, &mut wrong) && (200..300).contains(&status) {
                *succeeded.entry(format!("{} {}", c.method, c.template)).or_default() += 1;
            }
        }
    }
    let report: Vec<String> =
        wrong.0.iter().map(|((op, st, kind), ex)| format!("{op} {st}: {kind}\n    {ex}")).collect();
    assert!(report.is_empty(), "{} mismatches:\n{}", report.len(), report.join("\n"));
    for c in &calls {
        let key = format!("{} {}", c.method, c.template);
        assert!(succeeded.contains_key(&key), "{key} never succeeded");
    }
    eprintln!("statuses seen: {seen:?}");
    node.stop().await;
}

/// Mismatches between answers and the description: (operation, status, kind) → an example.
#[derive(Default)]
struct Mismatches(BTreeMap<(String, u16, &'static str), String>);

/// Checks one answer against the operation's description.
/// Whether the status is documented at all.
fn check_answer(
    spec: &Value,
    op: &Value,
    c: &Call,
    answer: (u16, String, Vec<u8>),
    wrong: &mut Mismatches,
) -> bool {
    let (status, ct, body) = answer;
    let what = format!(
        "{} {} {} → {status}: {}",
        c.method,
        c.uri(),
        c.body.as_deref().unwrap_or_default(),
        String::from_utf8_lossy(&body)
    );
    let op_name = format!("{} {}", c.method, c.template);
    let mut fail = |kind: &'static str, detail: String| {
        wrong.0.entry((op_name.clone(), status, kind)).or_insert(detail);
    };
    let documented = &op["responses"][status.to_string()];
    if !documented.is_object() {
        fail("undocumented status", what.clone());
        return false;
    }
    if status >= 500 {
        fail("server error", what.clone());
    }
    if c.invalid && status < 400 {
        fail("accepted a request against the description", what.clone());
    }
    let documented = resolve(spec, documented);
    if let Some(schema) = documented["content"]["application/json"].get("schema") {
        match serde_json::from_slice::<Value>(&body) {
            Err(e) => fail("not JSON", format!("{e}: {what}")),
            Ok(v) => {
                if let Err(e) = validate(spec, schema, &v, "body") {
                    fail("body does not match its schema", format!("{e}\n{what}"));
                }
            }
        }
        if !ct.starts_with("application/json") {
            fail("content type not JSON", what.clone());
        }
    } else if status >= 400 {
        // Every error has the error shape, documented or not.
        let err = &spec["components"]["schemas"]["Error"];
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) if validate(spec, err, &v, "body").is_ok() => {}
            _ => fail("error not in the error shape", what.clone()),
        }
    }
    true
}

/// Every operation of the description is among the calls.
fn every_described_operation_is_called(spec: &Value, calls: &[Call]) {
    let described: Vec<(String, String)> = spec["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(p, ops)| {
            ops.as_object().unwrap().keys().map(move |m| (m.to_uppercase(), p.clone()))
        })
        .collect();
    for (m, p) in &described {
        assert!(
            calls.iter().any(|c| c.method == m && c.template == p),
            "{m} {p} is described but not called"
        );
    }
}

/// The fixtures (a definition, executions, a cron job, a FAILED execution, a key), and one good
/// call of every operation.
async fn calls(node: &Node) -> Vec<Call> {
    // Fixtures: a definition, executions, a cron job.
    let def_call = Call::new("POST", "/definitions", "/definitions").raw_body(DEF);
    assert_eq!(send(node, &def_call).await.0, 201);
    let submit = json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1,
        "inputs": {"name": "x"}, "executeAt": "2028-08-13T02:00:00Z"});
    let (s, _, b) =
        send(node, &Call::new("POST", "/executions", "/executions").body(submit.clone())).await;
    assert_eq!(s, 201);
    let exec: Value = serde_json::from_slice(&b).unwrap();
    let id = exec["executionId"].as_str().unwrap().to_string();
    let cron = json!({"cronJobId": "nightly", "definitionUri": "registry://jobs/echo",
        "definitionVersion": 1, "inputs": {"name": "x"}, "expression": "0 2 * * *",
        "timezone": "Europe/Berlin"});
    let (s, _, b) =
        send(node, &Call::new("POST", "/cron-jobs", "/cron-jobs").body(cron.clone())).await;
    assert_eq!(s, 201, "{}", String::from_utf8_lossy(&b));
    let failed = a_failed_execution(node).await;
    let key =
        node.scheduler().create_api_key("default", &["read".into()], "k", "test").await.unwrap();
    let revoke = format!("/admin/keys/{}", key.key.id);
    let e = format!("/executions/{id}");
    vec![
        Call::new("POST", "/executions", "/executions").body(submit.clone()),
        Call::new("GET", "/executions", "/executions")
            .query("limit", "10")
            .query("status", "scheduled"),
        Call::new("GET", "/executions/{executionId}", &e),
        Call::new("DELETE", "/executions/{executionId}", &e),
        Call::new(
            "POST",
            "/executions/{executionId}/replay",
            &format!("/executions/{failed}/replay"),
        ),
        Call::new("POST", "/definitions", "/definitions").raw_body(DEF),
        Call::new("GET", "/definitions", "/definitions"),
        Call::new("GET", "/definitions/{name}", "/definitions/echo").query("version", "1"),
        Call::new("GET", "/metrics", "/metrics"),
        Call::new("GET", "/healthz", "/healthz"),
        Call::new("GET", "/readyz", "/readyz"),
        Call::new("POST", "/cron-jobs", "/cron-jobs").body(cron.clone()),
        Call::new("GET", "/cron-jobs", "/cron-jobs").query("limit", "10"),
        Call::new("GET", "/cron-jobs/{cronJobId}", "/cron-jobs/nightly"),
        Call::new("PATCH", "/cron-jobs/{cronJobId}", "/cron-jobs/nightly")
            .body(json!({"notes": "n"})),
        Call::new("POST", "/cron-jobs/{cronJobId}/pause", "/cron-jobs/nightly/pause"),
        Call::new("POST", "/cron-jobs/{cronJobId}/resume", "/cron-jobs/nightly/resume")
            .body(json!({"catchUp": false})),
        Call::new("POST", "/cron-jobs/{cronJobId}/backfill", "/cron-jobs/nightly/backfill")
            .body(json!({"from": "2026-09-01T00:00:00Z", "until": "2026-09-03T00:00:00Z"})),
        Call::new("POST", "/cron-jobs/{cronJobId}/trigger", "/cron-jobs/nightly/trigger")
            .body(json!({"overlap": "allow"})),
        Call::new("GET", "/cron-jobs/{cronJobId}/runs", "/cron-jobs/nightly/runs")
            .query("limit", "5"),
        Call::new("GET", "/cron-preview", "/cron-preview")
            .query("expression", "30 2 * * *")
            .query("timezone", "America/New_York"),
        Call::new("DELETE", "/cron-jobs/{cronJobId}", "/cron-jobs/nightly"),
        Call::new("GET", "/audit", "/audit").query("limit", "10"),
        Call::new("POST", "/admin/keys", "/admin/keys")
            .body(json!({"namespace": "default", "scopes": ["read"], "name": "t"})),
        Call::new("GET", "/admin/keys", "/admin/keys"),
        Call::new("DELETE", "/admin/keys/{keyId}", &revoke),
    ]
    .into_iter()
    .chain(views())
    .collect()
}

/// The calls that only look: who the caller is, limits, queues, workers, nodes.
fn views() -> Vec<Call> {
    vec![
        Call::new("GET", "/whoami", "/whoami"),
        Call::new("GET", "/limits", "/limits"),
        Call::new("GET", "/queues", "/queues"),
        Call::new("GET", "/workers", "/workers"),
        Call::new("GET", "/last-hour", "/last-hour"),
        Call::new("GET", "/admin/nodes", "/admin/nodes"),
        Call::new("GET", "/admin/quarantined", "/admin/quarantined"),
    ]
}

/// A FAILED execution, for replay.
async fn a_failed_execution(node: &Node) -> String {
    let now = json!({"definitionUri": "registry://jobs/echo", "definitionVersion": 1,
        "inputs": {"name": "x"}, "delayMs": 0});
    let (s, _, b) = send(node, &Call::new("POST", "/executions", "/executions").body(now)).await;
    assert_eq!(s, 201);
    let failed: Value = serde_json::from_slice(&b).unwrap();
    let failed = failed["executionId"].as_str().unwrap().to_string();
    let claimed = loop {
        let c = node
            .scheduler()
            .claim(
                "default",
                "echo",
                &[kairos_layer::ops::claim::ClaimSlot {
                    worker_id: "w1".into(),
                    max: 1,
                    lease_ms: None,
                }],
            )
            .await
            .map(|mut o| o.per_slot.remove(0))
            .unwrap();
        if let Some(c) = c.into_iter().next() {
            break c;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let no_retry = kairos_proto::storage::v1::ExecutionError {
        message: "boom".into(),
        retryable: false,
        code: String::new(),
    };
    let failure = kairos_layer::ops::worker::Report {
        namespace: "default".into(),
        execution_id: failed.clone(),
        token: claimed.attempt.fencing_token,
        outcome: kairos_layer::ops::worker::Outcome::Failure(no_retry),
        worker_id: None,
        queue: None,
    };
    node.report(vec![Ok(failure)]).await.unwrap().pop().unwrap().unwrap();
    failed
}
