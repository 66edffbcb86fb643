//! `kairosctl`: the Kairos admin console (the binary is a thin `main` calling [`main`]).
//! One-shot commands, or `console` for an interactive session; human-readable tables by
//! default, `--json` for scripts (errors too, as `{"error": {"code", "message", "exitCode"}}`
//! on stderr). The command line is declared in [`args`] (clap): `--help` everywhere, usage
//! errors exit 2, `kairosctl completions SHELL` prints a completion script.
//!
//! Exit codes: 0 ok · 1 other error · 2 usage · 3 not found · 4 conflict (already exists,
//! wrong state, fenced) · 5 invalid argument · 6 unavailable or timed out.

use clap::{CommandFactory, Parser};

use crate::Client;
use kairos_proto::v1::{Definition, Execution, ExecutionStatus};
use serde_json::{Value, json};

mod access;
pub mod args;
mod console;
mod cron;

use args::{Api, Cli, Command, Definitions};

struct Opts {
    json: bool,
}

enum Failure {
    Usage(String),
    Client(crate::Error),
    Other(String),
}

impl From<crate::Error> for Failure {
    fn from(e: crate::Error) -> Self {
        Failure::Client(e)
    }
}

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

fn status_name(s: ExecutionStatus) -> String {
    s.as_str_name().trim_start_matches("EXECUTION_STATUS_").to_string()
}

fn time(ms: i64) -> String {
    if ms == 0 {
        return "-".into();
    }
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .map_or_else(|| ms.to_string(), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

fn execution_json(e: &Execution) -> Value {
    json!({
        "executionId": e.execution_id,
        "namespace": e.namespace,
        "definitionUri": e.definition_uri,
        "definitionVersion": e.definition_version,
        "status": status_name(e.status()),
        "executeAt": time(e.execute_at_ms),
        "attemptCount": e.attempt_count,
        "cancelRequested": e.cancel_requested,
        "inputs": serde_json::from_str::<Value>(&e.inputs_json).unwrap_or(Value::Null),
        "output": serde_json::from_str::<Value>(&e.output_json).unwrap_or(Value::Null),
        "outputReference": e.output_reference,
        "error": e.error.as_ref().map(|x| json!({"message": x.message, "retryable": x.retryable, "code": x.code})),
    })
}

fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
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

fn executions_out(o: &Opts, es: &[Execution]) -> String {
    if o.json {
        return serde_json::to_string_pretty(&es.iter().map(execution_json).collect::<Vec<_>>())
            .unwrap_or_default();
    }
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

fn definition_out(o: &Opts, d: &Definition, created: Option<bool>) -> String {
    if o.json {
        return json!({"name": d.name, "version": d.version, "queue": d.queue, "created": created,
            "inputs": d.inputs.iter().map(|i| i.name.clone()).collect::<Vec<_>>()})
        .to_string();
    }
    let what = match created {
        Some(true) => "registered",
        Some(false) => "unchanged (already registered)",
        None => "",
    };
    format!("registry://jobs/{} version {} (queue {}) {what}", d.name, d.version, d.queue)
        .trim_end()
        .to_string()
}

/// The client with the API key, if one was given.
fn with_key(c: Client, key: Option<&str>) -> Result<Client, crate::Error> {
    match key.filter(|k| !k.is_empty()) {
        Some(k) => c.with_api_key(k),
        None => Ok(c),
    }
}

/// Runs one command against the node.
async fn run(client: &Client, o: &Opts, cmd: Api) -> Result<String, Failure> {
    match cmd {
        Api::Submit(s) => {
            let mut b = client.submit(&s.definition_uri, s.version).return_execution(o.json);
            if let Some(v) = s.inputs {
                b = b.inputs(v);
            }
            if let Some(at) = s.at {
                b = b.at(at);
            }
            if let Some(after) = s.after {
                // A delay counted by the node's clock: retrying with the same key and delay
                // is the same request (a time computed here would differ on each retry).
                b = b.after(after);
            }
            if let Some(k) = s.key {
                b = b.idempotency_key(k);
            }
            let s = b.send().await?;
            let e = s.execution.clone().unwrap_or_default();
            Ok(if o.json {
                json!({"created": s.created, "execution": execution_json(&e)}).to_string()
            } else {
                format!(
                    "{} {} {}",
                    s.execution_id,
                    status_name(s.status()),
                    if s.created { "created" } else { "existing" }
                )
            })
        }
        Api::Get { execution_id, key } => {
            let (e, attempts) = match (key, execution_id) {
                (Some(key), _) => client.get_by_idempotency_key(&key).await?,
                (None, Some(id)) => client.get(&id).await?,
                (None, None) => return Err(Failure::Usage("get: an execution id or --key".into())),
            };
            if o.json {
                let mut v = execution_json(&e);
                v["attempts"] = attempts
                    .iter()
                    .map(|a| json!({"number": a.number, "status": a.status().as_str_name().trim_start_matches("ATTEMPT_STATUS_"),
                        "workerId": a.worker_id, "startedAt": time(a.started_at_ms), "endedAt": time(a.ended_at_ms),
                        "error": a.error.as_ref().map(|x| x.message.clone())}))
                    .collect();
                return Ok(v.to_string());
            }
            let mut out = executions_out(o, std::slice::from_ref(&e));
            for a in attempts {
                out.push_str(&format!(
                    "\n  attempt {} {} by {} {} → {}{}",
                    a.number,
                    a.status().as_str_name().trim_start_matches("ATTEMPT_STATUS_"),
                    a.worker_id,
                    time(a.started_at_ms),
                    time(a.ended_at_ms),
                    a.error.map(|x| format!(" ({})", x.message)).unwrap_or_default()
                ));
            }
            if !e.output_json.is_empty() {
                out.push_str(&format!("\n  output {}", e.output_json));
            }
            Ok(out)
        }
        Api::Cancel { execution_id } => {
            let r = client.cancel(&execution_id).await?;
            let e = r.execution.unwrap_or_default();
            if o.json {
                return Ok(
                    json!({"cancelled": r.cancelled, "execution": execution_json(&e)}).to_string()
                );
            }
            let mut out = executions_out(o, std::slice::from_ref(&e));
            if !r.cancelled {
                out.push_str("\n  running: its worker was asked to stop; it ends CANCELLED when the attempt ends");
            }
            Ok(out)
        }
        Api::Replay { execution_id } => {
            Ok(executions_out(o, &[client.replay(&execution_id).await?]))
        }
        Api::Wait { execution_id, timeout } => {
            Ok(executions_out(o, &[client.wait(&execution_id, timeout).await?]))
        }
        Api::List { status, definition, limit } => {
            let status = match status {
                None => ExecutionStatus::Unspecified,
                Some(s) => ExecutionStatus::from_str_name(&format!(
                    "EXECUTION_STATUS_{}",
                    s.to_ascii_uppercase()
                ))
                .ok_or_else(|| Failure::Usage(format!("--status: unknown status {s:?}")))?,
            };
            let page = client
                .list(kairos_proto::v1::ListExecutionsRequest {
                    status: status as i32,
                    definition,
                    limit,
                    ..Default::default()
                })
                .await?;
            Ok(executions_out(o, &page.executions))
        }
        Api::Definitions(d) => {
            match d {
                Definitions::Apply { file } => {
                    let source = std::fs::read_to_string(&file)
                        .map_err(|e| Failure::Other(format!("{}: {e}", file.display())))?;
                    let (d, created) = client.register_definition(&source).await?;
                    Ok(definition_out(o, &d, Some(created)))
                }
                Definitions::Get { name, version } => {
                    Ok(definition_out(o, &client.get_definition(&name, version).await?, None))
                }
                Definitions::List => {
                    let ds = client.list_definitions().await?;
                    if o.json {
                        return Ok(json!(ds.iter().map(|d| json!({"name": d.name, "version": d.version, "queue": d.queue})).collect::<Vec<_>>()).to_string());
                    }
                    let rows = ds
                        .iter()
                        .map(|d| vec![d.name.clone(), d.version.to_string(), d.queue.clone()])
                        .collect();
                    Ok(table(&["NAME", "VERSION", "QUEUE"], rows))
                }
            }
        }
        Api::Cron(c) => cron::run(client, o, *c).await,
        Api::Keys(k) => access::keys(client, o, k).await,
        Api::Audit { from, limit, all_namespaces } => {
            access::audit(client, o, from.unwrap_or(0), limit, all_namespaces).await
        }
        Api::Whoami => access::whoami(client, o).await,
        Api::Limits => access::limits(client, o).await,
        Api::Nodes => {
            let nodes = client.nodes().await?;
            if o.json {
                return Ok(json!(nodes.iter().map(|n| json!({"nodeId": n.node_id, "httpAddress": n.http_address, "grpcAddress": n.grpc_address, "region": n.region, "version": n.version, "heartbeatAt": time(n.heartbeat_at_ms)})).collect::<Vec<_>>()).to_string());
            }
            let rows = nodes
                .iter()
                .map(|n| {
                    vec![
                        n.node_id.clone(),
                        n.grpc_address.clone(),
                        n.region.clone(),
                        n.version.clone(),
                        time(n.heartbeat_at_ms),
                    ]
                })
                .collect();
            Ok(table(&["NODE", "GRPC", "REGION", "VERSION", "HEARTBEAT"], rows))
        }
        Api::Shards { space } => {
            let (leases, count) = client.shards(&space).await?;
            if o.json {
                return Ok(json!({"space": space, "shardCount": count, "leases": leases.iter().map(|l| json!({"shard": l.partition, "owner": l.owner, "epoch": l.epoch, "expiresAt": time(l.expires_at_ms)})).collect::<Vec<_>>()}).to_string());
            }
            let rows = leases
                .iter()
                .map(|l| {
                    vec![
                        l.partition.to_string(),
                        l.owner.clone(),
                        l.epoch.to_string(),
                        time(l.expires_at_ms),
                    ]
                })
                .collect();
            Ok(format!("{count} shards\n{}", table(&["SHARD", "OWNER", "EPOCH", "EXPIRES"], rows)))
        }
        Api::Stats { all } => {
            let counts = client.stats(all).await?;
            if o.json {
                return Ok(json!(
                    counts
                        .iter()
                        .map(|(s, n)| (status_name(*s), *n))
                        .collect::<std::collections::BTreeMap<_, _>>()
                )
                .to_string());
            }
            Ok(table(
                &["STATUS", "EXECUTIONS"],
                counts.iter().map(|(s, n)| vec![status_name(*s), n.to_string()]).collect(),
            ))
        }
        Api::Quarantined { limit } => {
            let records = client.quarantined(limit).await?;
            if o.json {
                return Ok(json!(records.iter().map(|r| json!({"namespace": r.namespace, "executionId": r.execution_id, "reason": r.reason, "at": time(r.at_ms), "keyHex": r.key_hex})).collect::<Vec<_>>()).to_string());
            }
            let rows = records
                .iter()
                .map(|r| {
                    vec![
                        time(r.at_ms),
                        r.namespace.clone(),
                        r.execution_id.clone(),
                        r.reason.clone(),
                    ]
                })
                .collect();
            Ok(table(&["AT", "NAMESPACE", "EXECUTION", "REASON"], rows))
        }
    }
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

/// Prints a result (stdout) or an error (stderr; JSON with `--json`); returns the exit code.
fn report(o: &Opts, r: Result<String, Failure>) -> i32 {
    match r {
        Ok(out) => {
            println!("{out}");
            0
        }
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

/// Whether the raw arguments ask for JSON (before clap has parsed them: for its errors).
fn wants_json<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> bool {
    args.iter().map(AsRef::as_ref).take_while(|a| *a != "--").any(|a| a == "--json")
}

/// Reports a clap outcome that is not a parsed command line: help and version on stdout
/// (exit 0), usage errors on stderr (exit 2; JSON with `--json`).
fn clap_exit(o: &Opts, e: clap::Error) -> i32 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            0
        }
        _ if o.json => {
            let text = e.render().to_string();
            report(o, Err(Failure::Usage(text.trim_start_matches("error: ").to_string())))
        }
        _ => {
            let _ = e.print();
            2
        }
    }
}

/// Runs `kairosctl` with the process arguments; exits the process with its exit code.
pub fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    std::process::exit(main_with(args));
}

/// Runs `kairosctl` with these arguments (the first is the program name); returns the exit code.
pub fn main_with(args: Vec<std::ffi::OsString>) -> i32 {
    let json = wants_json(&args[1.min(args.len())..]);
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => return clap_exit(&Opts { json }, e),
    };
    let o = Opts { json: cli.json };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return report(&o, Err(Failure::Other(format!("starting the runtime: {e}")))),
    };
    match cli.command {
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "kairosctl",
                &mut std::io::stdout(),
            );
            0
        }
        Command::Bench(b) => rt.block_on(crate::bench::main(b.command)),
        Command::Api(cmd) => rt.block_on(async {
            let client = match Client::connect_tls(&cli.endpoint, &cli.tls.tls()).await {
                Ok(c) => with_key(c, cli.api_key.as_deref()),
                Err(e) => Err(e),
            };
            match client {
                Ok(c) => report(&o, run(&c.with_namespace(cli.namespace), &o, cmd).await),
                Err(e) => report(&o, Err(Failure::Client(e))),
            }
        }),
        Command::Console => {
            rt.block_on(console::run(&cli.endpoint, &cli.tls.tls(), cli.api_key, cli.namespace, o))
        }
    }
}
