//! `kairosctl`: the Kairos admin console (the binary is a thin `main` calling [`main`]). One-shot commands, or `console` for an interactive
//! session; human-readable tables by default, `--json` for scripts.
//!
//! Exit codes: 0 ok · 1 other error · 2 usage · 3 not found · 4 conflict (already exists,
//! wrong state, fenced) · 5 invalid argument · 6 unavailable or timed out.

use std::io::{BufRead, Write};
use std::time::Duration;

use crate::Client;
use kairos_proto::v1::{Definition, Execution, ExecutionStatus};
use serde_json::{Value, json};

mod cron;

const USAGE: &str = "usage: kairosctl [--endpoint URL] [--namespace NS] [--json] <command>
commands:
  submit <definitionUri> <version> [--inputs JSON] [--at RFC3339 | --after SECONDS] [--key KEY]
  get <executionId> | get --key IDEMPOTENCY_KEY
  cancel <executionId>         replay <executionId>
  wait <executionId> [--timeout SECONDS]
  list [--status STATUS] [--definition NAME] [--limit N]
  definitions apply <file> | definitions get <name> [--version N] | definitions list
  cron create <definitionUri> <version> '<expr>' [--tz ZONE] [--id ID] [--inputs JSON]
       [--dst-gap skip|shift-to-gap-end|shift-by-gap] [--dst-fold first|second|both]
       [--missed skip|latest|all] [--catch-up-window SECONDS]
       [--overlap allow|skip|buffer-one|buffer-all|cancel-previous] [--pause-on-failure]
       [--jitter SECONDS] [--start RFC3339] [--end RFC3339] [--runs N] [--notes TEXT] [--paused]
  cron get <id> | cron list [--limit N] | cron delete <id> | cron pause <id>
  cron resume <id> [--catch-up] | cron runs <id> [--limit N]
  cron update <id> [--expression E] [--tz ZONE] [--inputs JSON] [--version N] [--overlap P] ...
  cron preview '<expr>' [--tz ZONE] [--from RFC3339] [--until RFC3339] [--dst-gap P] [--dst-fold P]
  cron backfill <id> --from RFC3339 --until RFC3339 [--overlap P]
  nodes | shards [--space executions|cron] | stats [--all] | quarantined [--limit N]
  bench <s1|s2|s3|s4|s5> [options]   (load generator: kairosctl bench --help)
  --version
  console                      (interactive: one command per line, `quit` to leave)";

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

fn take_flag(args: &mut Vec<String>, flag: &str) -> Result<Option<String>, Failure> {
    match args.iter().position(|a| a == flag) {
        None => Ok(None),
        Some(i) => {
            if i + 1 >= args.len() {
                return Err(Failure::Usage(format!("{flag} needs a value")));
            }
            let v = args.remove(i + 1);
            args.remove(i);
            Ok(Some(v))
        }
    }
}

fn arg(args: &[String], i: usize, what: &str) -> Result<String, Failure> {
    args.get(i).cloned().ok_or_else(|| Failure::Usage(format!("missing {what}\n{USAGE}")))
}

async fn run(client: &Client, o: &Opts, mut args: Vec<String>) -> Result<String, Failure> {
    let cmd = arg(&args, 0, "command")?;
    match cmd.as_str() {
        "submit" => {
            let inputs = take_flag(&mut args, "--inputs")?;
            let at = take_flag(&mut args, "--at")?;
            let after = take_flag(&mut args, "--after")?;
            let key = take_flag(&mut args, "--key")?;
            let uri = arg(&args, 1, "definitionUri")?;
            let version: u32 = arg(&args, 2, "version")?
                .parse()
                .map_err(|_| Failure::Usage("version must be a number".into()))?;
            let mut b = client.submit(&uri, version).return_execution(o.json);
            if let Some(i) = inputs {
                let v: Value = serde_json::from_str(&i)
                    .map_err(|e| Failure::Usage(format!("--inputs: malformed JSON: {e}")))?;
                b = b.inputs(v);
            }
            if let Some(a) = at {
                let t = chrono::DateTime::parse_from_rfc3339(&a)
                    .map_err(|e| Failure::Usage(format!("--at: not an RFC 3339 time ({e})")))?;
                b = b.at(t.timestamp_millis());
            }
            if let Some(s) = after {
                let secs: f64 = s.parse().map_err(|_| Failure::Usage("--after: seconds".into()))?;
                b = b.after(Duration::from_secs_f64(secs.max(0.0)));
            }
            if let Some(k) = key {
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
        "get" => {
            let (e, attempts) = match take_flag(&mut args, "--key")? {
                Some(key) => client.get_by_idempotency_key(&key).await?,
                None => client.get(&arg(&args, 1, "executionId")?).await?,
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
        "cancel" => {
            let r = client.cancel(&arg(&args, 1, "executionId")?).await?;
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
        "replay" => Ok(executions_out(o, &[client.replay(&arg(&args, 1, "executionId")?).await?])),
        "wait" => {
            let timeout = take_flag(&mut args, "--timeout")?
                .map_or(Ok(60.0), |t| t.parse::<f64>())
                .map_err(|_| Failure::Usage("--timeout: seconds".into()))?;
            let e = client
                .wait(&arg(&args, 1, "executionId")?, Duration::from_secs_f64(timeout))
                .await?;
            Ok(executions_out(o, &[e]))
        }
        "list" => {
            let status = take_flag(&mut args, "--status")?;
            let definition = take_flag(&mut args, "--definition")?.unwrap_or_default();
            let limit = take_flag(&mut args, "--limit")?
                .map_or(Ok(100), |l| l.parse::<u32>())
                .map_err(|_| Failure::Usage("--limit: a number".into()))?;
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
        "definitions" => {
            match arg(&args, 1, "definitions subcommand")?.as_str() {
                "apply" => {
                    let file = arg(&args, 2, "file")?;
                    let source = std::fs::read_to_string(&file)
                        .map_err(|e| Failure::Other(format!("{file}: {e}")))?;
                    let (d, created) = client.register_definition(&source).await?;
                    Ok(definition_out(o, &d, Some(created)))
                }
                "get" => {
                    let version = take_flag(&mut args, "--version")?
                        .map(|v| {
                            v.parse::<u32>()
                                .map_err(|_| Failure::Usage("--version: a number".into()))
                        })
                        .transpose()?;
                    Ok(definition_out(
                        o,
                        &client.get_definition(&arg(&args, 2, "name")?, version).await?,
                        None,
                    ))
                }
                "list" => {
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
                other => Err(Failure::Usage(format!(
                    "unknown definitions subcommand {other:?}\n{USAGE}"
                ))),
            }
        }
        "cron" => cron::run(client, o, args).await,
        "nodes" => {
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
        "shards" => {
            let space = take_flag(&mut args, "--space")?.unwrap_or_else(|| "executions".into());
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
        "stats" => {
            let all = args.iter().any(|a| a == "--all");
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
        "quarantined" => {
            let limit = take_flag(&mut args, "--limit")?
                .map_or(Ok(100), |l| l.parse::<u32>())
                .map_err(|_| Failure::Usage("--limit: a number".into()))?;
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
        other => Err(Failure::Usage(format!("unknown command {other:?}\n{USAGE}"))),
    }
}

fn report(r: Result<String, Failure>) -> i32 {
    match r {
        Ok(out) => {
            println!("{out}");
            0
        }
        Err(f) => {
            let code = exit_code(&f);
            match f {
                Failure::Usage(m) | Failure::Other(m) => eprintln!("kairosctl: {m}"),
                Failure::Client(e) => eprintln!("kairosctl: {e}"),
            }
            code
        }
    }
}

/// Runs `kairosctl` with the process arguments; exits the process with its exit code.
pub fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(run_main());
}

async fn run_main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--version") {
        println!("kairosctl {}", env!("CARGO_PKG_VERSION"));
        std::process::exit(0);
    }
    if args.first().map(String::as_str) == Some("bench") {
        std::process::exit(crate::bench::main(args.split_off(1)).await);
    }
    if args.is_empty() || args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        std::process::exit(if args.is_empty() { 2 } else { 0 });
    }
    let json = args.iter().any(|a| a == "--json");
    args.retain(|a| a != "--json");
    let opts = Opts { json };
    let (endpoint, namespace) =
        match (take_flag(&mut args, "--endpoint"), take_flag(&mut args, "--namespace")) {
            (Ok(e), Ok(n)) => (
                e.or_else(|| std::env::var("KAIROS_ENDPOINT").ok())
                    .unwrap_or_else(|| "http://127.0.0.1:7071".into()),
                n.unwrap_or_else(|| "default".into()),
            ),
            (Err(f), _) | (_, Err(f)) => std::process::exit(report(Err(f))),
        };
    let client = match Client::connect(&endpoint).await {
        Ok(c) => c.with_namespace(namespace),
        Err(e) => std::process::exit(report(Err(Failure::Client(e)))),
    };
    if args.first().map(String::as_str) == Some("console") {
        let stdin = std::io::stdin();
        let mut last = 0;
        print!("kairos> ");
        let _ = std::io::stdout().flush();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
            match words.first().map(String::as_str) {
                None => {}
                Some("quit" | "exit") => break,
                Some("help") => println!("{USAGE}"),
                Some(_) => last = report(run(&client, &opts, words).await),
            }
            print!("kairos> ");
            let _ = std::io::stdout().flush();
        }
        println!();
        std::process::exit(last);
    }
    std::process::exit(report(run(&client, &opts, args).await));
}
