//! What `kairosctl` prints: results as tables or JSON, errors as text or JSON on stderr, and the
//! exit code of each outcome. A leaf module: the commands, the console and `main` use it.

use kairos_proto::v1::{Definition, Execution, ExecutionStatus};
use serde_json::{Value, json};

/// How to print.
pub(crate) struct Opts {
    /// JSON output (results on stdout, errors on stderr).
    pub(crate) json: bool,
}

/// Why a command failed.
pub(crate) enum Failure {
    /// A usage error (exit 2).
    Usage(String),
    /// The node or the client refused (the exit code follows its gRPC code).
    Client(kairos_sdk::Error),
    /// Anything else (exit 1).
    Other(String),
}

impl From<kairos_sdk::Error> for Failure {
    fn from(e: kairos_sdk::Error) -> Self {
        Failure::Client(e)
    }
}

/// The exit code of a failure (the table under `--help`).
fn exit_code(f: &Failure) -> i32 {
    use tonic::Code;
    match f {
        Failure::Usage(_) => 2,
        Failure::Other(_) => 1,
        Failure::Client(e) => match e.code() {
            Code::NotFound => 3,
            Code::AlreadyExists | Code::FailedPrecondition | Code::Aborted => 4,
            Code::InvalidArgument | Code::OutOfRange => 5,
            Code::Unavailable | Code::DeadlineExceeded => 6,
            Code::Unauthenticated | Code::PermissionDenied => 7,
            _ => 1,
        },
    }
}

/// `SUCCEEDED`, not `EXECUTION_STATUS_SUCCEEDED`.
pub(crate) fn status_name(s: ExecutionStatus) -> String {
    s.as_str_name().trim_start_matches("EXECUTION_STATUS_").to_string()
}

/// ms since the epoch as RFC 3339 (UTC, ms); 0 is `-`.
pub(crate) fn time(ms: i64) -> String {
    if ms == 0 {
        return "-".into();
    }
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .map_or_else(|| ms.to_string(), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// An execution as JSON: the API's one view of it ([`kairos_sdk::views`]).
pub(crate) fn execution_json(e: &Execution) -> Value {
    kairos_sdk::views::execution(e, None)
}

/// A page of executions as the API shows it: `{"executions", "nextCursor", "unreadableIds"}`.
pub(crate) fn page_json(es: &[Execution], next_cursor: &[u8], unreadable: &[String]) -> Value {
    json!({
        "executions": es.iter().map(execution_json).collect::<Vec<_>>(),
        "nextCursor": kairos_sdk::views::cursor_text(next_cursor),
        "unreadableIds": unreadable,
    })
}

/// What a table of a page adds below it: the ids it could not read, and how to get the next
/// page.
pub(crate) fn page_footer(next_cursor: &[u8], unreadable: &[String]) -> String {
    let mut out = String::new();
    if !unreadable.is_empty() {
        out.push_str(&format!(
            "\n{} execution(s) in this page could not be read (a damaged store: run `kairos \
             check`): {}",
            unreadable.len(),
            unreadable.join(", ")
        ));
    }
    if let Some(c) = kairos_sdk::views::cursor_text(next_cursor) {
        out.push_str(&format!("\nmore: --cursor {c}"));
    }
    out
}

/// Columns padded to their widest cell.
pub(crate) fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect()).trim_end().to_string();
    for r in rows {
        out.push('\n');
        out.push_str(line(r).trim_end());
    }
    out
}

/// One execution: its row, or its JSON view.
pub(crate) fn execution_out(o: &Opts, e: &Execution) -> String {
    if o.json {
        return execution_json(e).to_string();
    }
    executions_table(std::slice::from_ref(e))
}

/// Executions as a table.
pub(crate) fn executions_table(es: &[Execution]) -> String {
    let rows = es
        .iter()
        .map(|e| {
            vec![
                e.execution_id.clone(),
                status_name(e.status()),
                format!(
                    "{}@{}",
                    e.definition_uri.trim_start_matches("registry://jobs/"),
                    e.definition_version
                ),
                time(e.execute_at_ms),
                e.attempt_count.to_string(),
            ]
        })
        .collect();
    table(&["EXECUTION", "STATUS", "DEFINITION", "EXECUTE AT", "ATTEMPTS"], rows)
}

/// A definition (and whether it was just registered), as a line or its JSON view.
pub(crate) fn definition_out(o: &Opts, d: &Definition, created: Option<bool>) -> String {
    if o.json {
        let mut v = kairos_sdk::views::definition(d);
        if let Some(c) = created {
            v["created"] = Value::Bool(c);
        }
        return v.to_string();
    }
    let what = match created {
        Some(true) => "registered",
        Some(false) => "unchanged (already registered)",
        None => "",
    };
    let mut out =
        format!("registry://jobs/{} version {} (queue {}) {what}", d.name, d.version, d.queue)
            .trim_end()
            .to_string();
    let exec: Value = serde_json::from_str(&d.execution_json).unwrap_or_default();
    let ty = exec.get("type").and_then(Value::as_str).unwrap_or_default();
    if created.is_some() && !ty.is_empty() && !["command", "http"].contains(&ty) {
        out.push_str(&format!(
            "\n  execution.type {ty:?} has no executor in Kairos (`kairos worker` runs command and \
             http): a worker of your own must poll queue {}",
            d.queue
        ));
    }
    out
}

/// A gRPC code as the HTTP API names it (`NOT_FOUND`).
fn code_name(c: tonic::Code) -> String {
    let mut out = String::new();
    for (i, ch) in format!("{c:?}").chars().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_uppercase());
    }
    out
}

/// The exit code when stdout was closed before everything was written (`kairosctl list |
/// head -1`): what a Unix tool killed by SIGPIPE exits with, 128 + 13, without a message.
pub const CLOSED_PIPE_EXIT: i32 = 141;

/// Writes `bytes` to stdout; the exit code: 0, [`CLOSED_PIPE_EXIT`] quietly when the reader
/// has gone, 1 (saying why) when the write failed otherwise (a full disk).
pub(crate) fn write_stdout(bytes: &[u8]) -> i32 {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => CLOSED_PIPE_EXIT,
        Err(e) => {
            eprintln!("kairosctl: writing the output: {e}");
            1
        }
    }
}

/// Prints a result (stdout) or an error (stderr; JSON with `--json`); returns the exit code.
pub(crate) fn report(o: &Opts, r: Result<String, Failure>) -> i32 {
    match r {
        Ok(out) => write_stdout(format!("{out}\n").as_bytes()),
        Err(f) => {
            let code = exit_code(&f);
            let (name, message) = match f {
                Failure::Usage(m) => ("USAGE".to_string(), m),
                Failure::Other(m) => ("ERROR".to_string(), m),
                Failure::Client(e) => (code_name(e.code()), e.to_string()),
            };
            if o.json {
                eprintln!(
                    "{}",
                    json!({"error": {"code": name, "message": message.trim_end(), "exitCode": code}})
                );
            } else {
                eprintln!("kairosctl: {}", message.trim_end());
            }
            code
        }
    }
}
