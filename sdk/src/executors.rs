//! Generic executors for definitions that declare how to run: `command` (a process) and
//! `http` (a request). `kairos worker` dispatches on `execution.type` to these.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::worker::{Task, TaskError};

/// Runs a task with the executor its definition's `execution.type` names.
pub async fn run_generic(task: Task) -> Result<serde_json::Value, TaskError> {
    match task.definition_execution.get("type").and_then(|t| t.as_str()) {
        Some("command") => run_command(task).await,
        Some("http") => run_http(task).await,
        Some(other) => Err(TaskError::permanent(format!(
            "no executor for execution.type {other:?} (supported: command, http)"
        ))),
        None => Err(TaskError::permanent("definition has no execution.type")),
    }
}

/// The generic executor for definitions whose `execution.type` is `command`: runs
/// `execution.command` (argv), writes the inputs as JSON on stdin, parses stdout as the output
/// JSON (empty = none); exit code 0 is success, any other a retryable failure unless listed in
/// `execution.permanent_exit_codes`. Cancellation kills the process.
pub async fn run_command(task: Task) -> Result<serde_json::Value, TaskError> {
    let exec = &task.definition_execution;
    let argv: Vec<String> = exec
        .get("command")
        .and_then(|c| c.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    let Some((program, args)) = argv.split_first() else {
        return Err(TaskError::permanent("execution.command must be a non-empty list of strings"));
    };
    let permanent: Vec<i64> = exec
        .get("permanent_exit_codes")
        .and_then(|c| c.as_array())
        .map(|a| a.iter().filter_map(|c| c.as_i64()).collect())
        .unwrap_or_default();
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env("KAIROS_EXECUTION_ID", &task.task.execution_id)
        .env("KAIROS_ATTEMPT", task.task.attempt.to_string())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| TaskError::permanent(format!("cannot start {program:?}: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(task.task.inputs_json.as_bytes()).await;
    }
    let mut cancelled = task.cancelled.clone();
    let out = tokio::select! {
        out = child.wait_with_output() => out.map_err(|e| TaskError::retryable(format!("{program}: {e}")))?,
        Ok(_) = cancelled.wait_for(|c| *c) => return Err(TaskError::cancelled()),
    };
    let code = out.status.code().unwrap_or(-1);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: String =
            stderr.chars().rev().take(500).collect::<Vec<_>>().into_iter().rev().collect();
        let mut e = TaskError::retryable(format!("{program} exited with {code}: {}", tail.trim()));
        e.retryable = !permanent.contains(&i64::from(code));
        e.code = format!("exit:{code}");
        return Err(e);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    if stdout.trim().is_empty() {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_str(stdout.trim()).map_err(|e| {
        TaskError::permanent(format!("{program} printed output that is not JSON: {e}"))
    })
}

/// The generic executor for `execution.type: http`: sends the inputs as a JSON body to
/// `execution.url` (plain `http://` only) with `execution.method` (default POST) and optional
/// `execution.headers`, within `execution.timeout_ms` (default 30 s). A 2xx answer succeeds
/// (its JSON body is the output; other text becomes `{"body": …}`); 5xx, 429, time-outs and
/// connection errors fail retryably; other statuses fail permanently.
pub async fn run_http(task: Task) -> Result<serde_json::Value, TaskError> {
    let exec = &task.definition_execution;
    let url = exec.get("url").and_then(|u| u.as_str()).unwrap_or_default();
    let method = exec.get("method").and_then(|m| m.as_str()).unwrap_or("POST").to_ascii_uppercase();
    let timeout =
        Duration::from_millis(exec.get("timeout_ms").and_then(|t| t.as_u64()).unwrap_or(30_000));
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(TaskError::permanent(format!(
            "execution.url must be an http:// URL (the built-in executor has no TLS), got {url:?}"
        )));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || !method.chars().all(|c| c.is_ascii_uppercase()) {
        return Err(TaskError::permanent(format!(
            "bad execution.url {url:?} or method {method:?}"
        )));
    }
    let addr =
        if authority.contains(':') { authority.to_string() } else { format!("{authority}:80") };
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\nKairos-Execution-Id: {}\r\nKairos-Attempt: {}\r\n",
        task.task.inputs_json.len(),
        task.task.execution_id,
        task.task.attempt
    );
    if let Some(h) = exec.get("headers").and_then(|h| h.as_object()) {
        for (k, v) in h {
            let v = v.as_str().unwrap_or_default();
            if k.contains(['\r', '\n', ':']) || v.contains(['\r', '\n']) {
                return Err(TaskError::permanent(format!("execution.headers.{k}: invalid header")));
            }
            head.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    head.push_str("\r\n");
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(&addr).await?;
        s.write_all(head.as_bytes()).await?;
        s.write_all(task.task.inputs_json.as_bytes()).await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let mut cancelled = task.cancelled.clone();
    let raw = tokio::select! {
        r = tokio::time::timeout(timeout, exchange) => match r {
            Ok(Ok(raw)) => raw,
            Ok(Err(e)) => return Err(TaskError::retryable(format!("{url}: {e}"))),
            Err(_) => return Err(TaskError::retryable(format!("{url}: no answer within {timeout:?}"))),
        },
        Ok(_) = cancelled.wait_for(|c| *c) => return Err(TaskError::cancelled()),
    };
    let (status, body) =
        parse_response(&raw).map_err(|e| TaskError::retryable(format!("{url}: {e}")))?;
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

/// Status and body of an HTTP/1.1 response read to its end (chunked bodies decoded).
fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("truncated response")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or("no status line")?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let mut body = raw[split + 4..].to_vec();
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let nl = rest.windows(2).position(|w| w == b"\r\n").ok_or("bad chunk")?;
            let size_text = String::from_utf8_lossy(&rest[..nl]);
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| "bad chunk size")?;
            rest = &rest[nl + 2..];
            if size == 0 {
                break;
            }
            if rest.len() < size {
                return Err("truncated chunk".into());
            }
            out.extend_from_slice(&rest[..size]);
            rest = rest.get(size + 2..).unwrap_or(&[]);
        }
        body = out;
    }
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(exec: serde_json::Value) -> Task {
        let (_tx, rx) = tokio::sync::watch::channel(false);
        Task {
            task: kairos_proto::v1::Task {
                execution_id: "E1".into(),
                inputs_json: r#"{"n":1}"#.into(),
                attempt: 1,
                ..Default::default()
            },
            definition_execution: exec,
            cancelled: rx,
        }
    }

    /// A one-shot HTTP server answering `response`; returns its address and the request seen.
    async fn server(response: &'static str) -> (String, tokio::task::JoinHandle<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let h = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).await.unwrap();
            s.write_all(response.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        (addr, h)
    }

    #[tokio::test]
    async fn http_success_returns_the_json_body() {
        let (addr, seen) =
            server("HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"ok\":true}").await;
        let out = run_http(task(
            serde_json::json!({"type": "http", "url": format!("http://{addr}/hook")}),
        ))
        .await;
        assert_eq!(out.unwrap(), serde_json::json!({"ok": true}));
        let req = seen.await.unwrap();
        assert!(req.starts_with("POST /hook HTTP/1.1"), "{req}");
        assert!(req.contains("Kairos-Execution-Id: E1") && req.ends_with(r#"{"n":1}"#), "{req}");
    }

    #[tokio::test]
    async fn http_errors_are_retryable_or_permanent_by_status() {
        let (addr, _) =
            server("HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\n\r\n")
                .await;
        let e =
            run_http(task(serde_json::json!({"type": "http", "url": format!("http://{addr}/")})))
                .await
                .unwrap_err();
        assert!(e.retryable && e.code == "http:503" && e.message.contains("busy"), "{e:?}");
        let (addr, _) = server("HTTP/1.1 400 Bad\r\nContent-Length: 0\r\n\r\n").await;
        let e =
            run_http(task(serde_json::json!({"type": "http", "url": format!("http://{addr}/")})))
                .await
                .unwrap_err();
        assert!(!e.retryable && e.code == "http:400", "{e:?}");
        let e =
            run_http(task(serde_json::json!({"type": "http", "url": "https://example.invalid/"})))
                .await
                .unwrap_err();
        assert!(!e.retryable && e.message.contains("http://"), "{e:?}");
        let e = run_http(task(serde_json::json!({"type": "http", "url": "http://127.0.0.1:1/"})))
            .await
            .unwrap_err();
        assert!(e.retryable, "connection refused is retryable: {e:?}");
    }

    #[tokio::test]
    async fn commands_succeed_fail_and_declare_permanent_codes() {
        let ok = run_command(task(
            serde_json::json!({"type": "command", "command": ["sh", "-c", "cat"]}),
        ))
        .await;
        assert_eq!(ok.unwrap(), serde_json::json!({"n": 1}), "stdin → stdout");
        let e = run_command(task(serde_json::json!({"type": "command", "command": ["sh", "-c", "echo oops >&2; exit 4"]})))
            .await
            .unwrap_err();
        assert!(e.retryable && e.code == "exit:4" && e.message.contains("oops"), "{e:?}");
        let e = run_command(task(serde_json::json!({"type": "command", "command": ["sh", "-c", "exit 4"], "permanent_exit_codes": [4]})))
            .await
            .unwrap_err();
        assert!(!e.retryable);
        let e = run_command(task(serde_json::json!({"type": "command", "command": []})))
            .await
            .unwrap_err();
        assert!(!e.retryable);
    }
}
