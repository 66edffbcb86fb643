//! `execution.type: http`: a request (webhook), over `reqwest` with rustls (http and https,
//! proxies from the environment), optionally **signed** so the receiver can check the call
//! came from a Kairos worker holding the definition's secret.
//!
//! ```yaml
//! execution:
//!   type: http
//!   url: https://hooks.example.com/orders     # http:// or https://
//!   method: POST                              # default POST
//!   headers: {X-Team: billing}                # optional
//!   timeout_ms: 30000                         # default 30 s
//!   follow_redirects: 0                       # default 0: a redirect is an answer, not followed
//!   signing_secret_env: ORDERS_HOOK_SECRET    # optional: the worker's environment variable holding the key
//! ```
//!
//! The body is the inputs (JSON). Headers sent: `Kairos-Execution-Id`, `Kairos-Attempt`, and
//! when signing, `Kairos-Signature: t=<unix seconds>,v1=<hex HMAC-SHA-256 of "<t>.<body>">`
//! (receivers recompute it and refuse stale timestamps). A 2xx answer succeeds (its JSON body
//! is the output, other text `{"body": …}`); 5xx, 408, 429, time-outs and connection errors
//! fail retryably; other statuses permanently.

use std::sync::OnceLock;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::worker::{Task, TaskError};

use crate::limits::BODY_READ_MAX;

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "Kairos-Signature";

/// The signature header's value for `body` sent at `unix_secs`: `t=<secs>,v1=<hex>`.
pub fn signature(secret: &[u8], unix_secs: i64, body: &[u8]) -> String {
    let tag = hmac_sha256_hex(secret, &[unix_secs.to_string().as_bytes(), b".", body]);
    format!("t={unix_secs},v1={tag}")
}

/// HMAC-SHA-256 of the concatenated `parts`, in lowercase hex.
fn hmac_sha256_hex(secret: &[u8], parts: &[&[u8]]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// One client per redirect policy, shared by every task (connection reuse).
fn client(follow_redirects: usize) -> Result<reqwest::Client, TaskError> {
    static PLAIN: OnceLock<reqwest::Client> = OnceLock::new();
    let build = |redirects: usize| {
        let policy = match redirects {
            0 => reqwest::redirect::Policy::none(),
            n => reqwest::redirect::Policy::limited(n),
        };
        reqwest::Client::builder()
            .redirect(policy)
            .user_agent(concat!("kairos-worker/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| TaskError::retryable(format!("cannot build the HTTP client: {e}")))
    };
    if follow_redirects == 0 {
        if let Some(c) = PLAIN.get() {
            return Ok(c.clone());
        }
        let c = build(0)?;
        return Ok(PLAIN.get_or_init(|| c).clone());
    }
    build(follow_redirects)
}

/// Runs an `http` task (see the module documentation).
pub async fn run_http(task: Task) -> Result<serde_json::Value, TaskError> {
    let exec = &task.definition_execution;
    let url = exec.get("url").and_then(|u| u.as_str()).unwrap_or_default();
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(TaskError::permanent(format!(
            "execution.url must be an http:// or https:// URL, got {url:?}"
        )));
    }
    let method = exec.get("method").and_then(|m| m.as_str()).unwrap_or("POST").to_ascii_uppercase();
    let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|_| {
        TaskError::permanent(format!("execution.method: {method:?} is not a method"))
    })?;
    let timeout =
        Duration::from_millis(exec.get("timeout_ms").and_then(|t| t.as_u64()).unwrap_or(30_000));
    let follow = exec.get("follow_redirects").and_then(|f| f.as_u64()).unwrap_or(0).min(10);
    let body = task.task.inputs_json.clone().into_bytes();
    let mut req = client(follow as usize)?
        .request(method, url)
        .timeout(timeout)
        .header("Content-Type", "application/json")
        .header("Kairos-Execution-Id", &task.task.execution_id)
        .header("Kairos-Attempt", task.task.attempt.to_string());
    if !task.task.traceparent.is_empty() {
        req = req.header("traceparent", &task.task.traceparent);
    }
    if let Some(h) = exec.get("headers").and_then(|h| h.as_object()) {
        for (k, v) in h {
            let v = v.as_str().unwrap_or_default();
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes());
            let value = reqwest::header::HeaderValue::from_str(v);
            let (Ok(name), Ok(value)) = (name, value) else {
                return Err(TaskError::permanent(format!("execution.headers.{k}: invalid header")));
            };
            req = req.header(name, value);
        }
    }
    if let Some(var) = exec.get("signing_secret_env").and_then(|s| s.as_str()) {
        let secret = std::env::var(var).map_err(|_| {
            TaskError::permanent(format!(
                "execution.signing_secret_env names {var}, which this worker's environment does not set"
            ))
        })?;
        #[allow(clippy::disallowed_methods)] // the signature's timestamp is the wall clock's
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        req = req.header(SIGNATURE_HEADER, signature(secret.as_bytes(), now, &body));
    }
    let exchange = async {
        let resp = req.body(body).send().await?;
        let status = resp.status().as_u16();
        let mut text = Vec::new();
        let mut resp = resp;
        while let Some(chunk) = resp.chunk().await? {
            let room = BODY_READ_MAX.saturating_sub(text.len());
            text.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if room <= chunk.len() {
                break;
            }
        }
        Ok::<_, reqwest::Error>((status, text))
    };
    let mut cancelled = task.cancelled.clone();
    let (status, body) = tokio::select! {
        r = exchange => r.map_err(|e| {
            let what = if e.is_timeout() { format!("no answer within {timeout:?}") } else { e.to_string() };
            TaskError::retryable(format!("{url}: {what}"))
        })?,
        Ok(_) = cancelled.wait_for(|c| *c) => return Err(TaskError::cancelled()),
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    if (200..300).contains(&status) {
        if text.trim().is_empty() {
            return Ok(serde_json::Value::Null);
        }
        return Ok(
            serde_json::from_str(&text).unwrap_or_else(|_| serde_json::json!({ "body": text }))
        );
    }
    let snippet: String = text.chars().take(300).collect();
    let mut e = TaskError::retryable(format!("{url} answered {status}: {snippet}"));
    e.retryable = status >= 500 || status == 429 || status == 408;
    e.code = format!("http:{status}");
    Err(e)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::executors::test_task as task;

    /// A one-shot HTTP server answering `response`; returns its address and the request seen.
    async fn server(response: &'static str) -> (String, tokio::task::JoinHandle<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let h = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = vec![0u8; 4096];
            // Read the head and the body (Content-Length) before answering.
            loop {
                let n = s.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if body.len() >= len {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            s.write_all(response.as_bytes()).await.unwrap();
            let _ = s.shutdown().await;
            String::from_utf8_lossy(&buf).into_owned()
        });
        (addr, h)
    }

    #[tokio::test]
    async fn http_success_returns_the_json_body() {
        let (addr, seen) = server(
            "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\n{\"ok\":true}",
        )
        .await;
        let out = run_http(task(
            serde_json::json!({"type": "http", "url": format!("http://{addr}/hook")}),
        ))
        .await;
        assert_eq!(out.unwrap(), serde_json::json!({"ok": true}));
        let req = seen.await.unwrap();
        assert!(req.starts_with("POST /hook HTTP/1.1"), "{req}");
        let lower = req.to_ascii_lowercase();
        assert!(lower.contains("kairos-execution-id: e1") && req.ends_with(r#"{"n":1}"#), "{req}");
        assert!(!lower.contains("kairos-signature"), "unsigned unless asked: {req}");
    }

    #[tokio::test]
    async fn a_signed_call_carries_a_signature_the_receiver_can_check() {
        let (addr, seen) = server("HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n").await;
        // A variable cargo sets for every test process (setting one here would race other
        // tests reading the environment): the secret is "kairos-sdk".
        let out = run_http(task(serde_json::json!({"type": "http",
            "url": format!("http://{addr}/hook"), "signing_secret_env": "CARGO_PKG_NAME"})))
        .await;
        assert_eq!(out.unwrap(), serde_json::Value::Null);
        let req = seen.await.unwrap();
        let line = req
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("kairos-signature:"))
            .unwrap_or_else(|| panic!("no signature: {req}"));
        let value = line.split_once(':').unwrap().1.trim();
        let t: i64 = value.split(',').next().unwrap().trim_start_matches("t=").parse().unwrap();
        let body = req.split_once("\r\n\r\n").unwrap().1;
        // The receiver's check: the same key over "<t>.<body>".
        let secret = env!("CARGO_PKG_NAME").as_bytes();
        assert_eq!(value, signature(secret, t, body.as_bytes()));
        assert_ne!(value, signature(b"another", t, body.as_bytes()));
        assert_ne!(value, signature(secret, t, b"{\"n\":2}"));
        // A secret the worker does not have: a permanent error naming the variable.
        let e = run_http(task(serde_json::json!({"type": "http",
            "url": format!("http://{addr}/hook"), "signing_secret_env": "KAIROS_TEST_NOT_SET"})))
        .await
        .unwrap_err();
        assert!(!e.retryable && e.message.contains("KAIROS_TEST_NOT_SET"), "{e:?}");
    }

    #[tokio::test]
    async fn the_trace_context_is_handed_on() {
        let (addr, seen) = server("HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n").await;
        let mut t = task(serde_json::json!({"type": "http", "url": format!("http://{addr}/")}));
        t.task.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into();
        run_http(t).await.unwrap();
        let req = seen.await.unwrap().to_ascii_lowercase();
        assert!(
            req.contains("traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            "{req}"
        );
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_timestamp_dot_body() {
        // The well-known vector: HMAC-SHA-256("key", "The quick brown fox jumps over the lazy dog").
        assert_eq!(
            hmac_sha256_hex(b"key", &[b"The quick brown fox ", b"jumps over the lazy dog"]),
            "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
        );
        let s = signature(b"key", 1_700_000_000, b"{}");
        assert_eq!(s, format!("t=1700000000,v1={}", hmac_sha256_hex(b"key", &[b"1700000000.{}"])));
    }

    #[tokio::test]
    async fn http_errors_are_retryable_or_permanent_by_status() {
        let (addr, _) = server(
            "HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n4\r\nbusy\r\n0\r\n\r\n",
        )
        .await;
        let e =
            run_http(task(serde_json::json!({"type": "http", "url": format!("http://{addr}/")})))
                .await
                .unwrap_err();
        assert!(e.retryable && e.code == "http:503" && e.message.contains("busy"), "{e:?}");
        let (addr, _) =
            server("HTTP/1.1 400 Bad\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
        let e =
            run_http(task(serde_json::json!({"type": "http", "url": format!("http://{addr}/")})))
                .await
                .unwrap_err();
        assert!(!e.retryable && e.code == "http:400", "{e:?}");
        // A redirect is an answer unless the definition says to follow it.
        let (addr, _) = server(
            "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:1/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        let e =
            run_http(task(serde_json::json!({"type": "http", "url": format!("http://{addr}/")})))
                .await
                .unwrap_err();
        assert!(!e.retryable && e.code == "http:302", "{e:?}");
        let e =
            run_http(task(serde_json::json!({"type": "http", "url": "ftp://example.invalid/"})))
                .await
                .unwrap_err();
        assert!(!e.retryable && e.message.contains("https://"), "{e:?}");
        let e = run_http(task(serde_json::json!({"type": "http", "url": "http://127.0.0.1:1/"})))
            .await
            .unwrap_err();
        assert!(e.retryable, "connection refused is retryable: {e:?}");
    }
}
