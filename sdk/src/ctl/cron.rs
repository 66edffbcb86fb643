//! `kairosctl cron …`: durable schedules.
//!
//! ```text
//! cron create <definitionUri> <version> "<expr>" [--tz ZONE] [--id ID] [--inputs JSON]
//!             [--dst-gap P] [--dst-fold P] [--missed P] [--catch-up-window SECONDS] [--overlap P]
//!             [--pause-on-failure] [--jitter SECONDS] [--start RFC3339] [--end RFC3339]
//!             [--runs N] [--notes TEXT] [--paused]
//! cron get <id> | cron list [--limit N] | cron delete <id>
//! cron update <id> [--expression E] [--tz Z] [--inputs J] [--version N] [--dst-gap P] …
//!             [--pause-on-failure true|false] [--runs N (0 = unlimited)] [--notes TEXT]
//! cron pause <id> | cron resume <id> [--catch-up]
//! cron preview "<expr>" --tz ZONE --from RFC3339 --until RFC3339 [--dst-gap P] [--dst-fold P] [--limit N]
//! cron backfill <id> --from RFC3339 --until RFC3339 [--overlap P]
//! cron runs <id> [--limit N]
//! ```
//! `--json cron preview` prints `{"occurrences": [{"utc": "…Z", "local": "…+hh:mm"}, …]}`, in
//! order; it needs no stored job.

use kairos_proto::v1::{
    CreateCronJobRequest, CronJob, CronPolicies, CronStatus, PreviewRequest, UpdateCronJobRequest,
};
use serde_json::{Value, json};

use super::{Failure, Opts, arg, executions_out, table, take_flag, time};
use crate::Client;

fn usage(m: impl Into<String>) -> Failure {
    Failure::Usage(m.into())
}

fn rfc3339(flag: &str, v: &str) -> Result<i64, Failure> {
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|t| t.timestamp_millis())
        .map_err(|e| usage(format!("{flag}: not an RFC 3339 time like 2026-03-08T00:00:00Z ({e})")))
}

fn seconds_ms(flag: &str, v: &str) -> Result<i64, Failure> {
    v.parse::<f64>()
        .ok()
        .filter(|s| *s >= 0.0)
        .map(|s| (s * 1000.0).round() as i64)
        .ok_or_else(|| usage(format!("{flag}: seconds, got {v:?}")))
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, Failure> {
    v.parse().map_err(|_| usage(format!("{flag}: a number, got {v:?}")))
}

fn take_switch(args: &mut Vec<String>, flag: &str) -> bool {
    let had = args.iter().any(|a| a == flag);
    args.retain(|a| a != flag);
    had
}

fn inputs_flag(v: Option<String>) -> Result<Option<String>, Failure> {
    match v {
        None => Ok(None),
        Some(j) => {
            let parsed: Value = serde_json::from_str(&j)
                .map_err(|e| usage(format!("--inputs: malformed JSON: {e}")))?;
            Ok(Some(parsed.to_string()))
        }
    }
}

fn status_name(j: &CronJob) -> String {
    CronStatus::try_from(j.status)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("CRON_STATUS_")
        .to_string()
}

/// A time for JSON: RFC 3339, or null when unset.
fn json_time(ms: i64) -> Value {
    if ms == 0 { Value::Null } else { Value::String(time(ms)) }
}

fn job_json(j: &CronJob) -> Value {
    let p = j.policies.clone().unwrap_or_default();
    json!({
        "cronJobId": j.cron_job_id,
        "namespace": j.namespace,
        "definitionUri": j.definition_uri,
        "definitionVersion": j.definition_version,
        "inputs": serde_json::from_str::<Value>(&j.inputs_json).unwrap_or(Value::Null),
        "expression": j.expression,
        "timezone": j.timezone,
        "policies": {"dstGap": p.dst_gap, "dstFold": p.dst_fold, "missed": p.missed,
            "catchUpWindowMs": p.catch_up_window_ms, "overlap": p.overlap,
            "pauseOnFailure": p.pause_on_failure, "jitterMs": p.jitter_ms},
        "status": status_name(j),
        "nextRunAt": json_time(j.next_run_at_ms),
        "lastOccurrence": json_time(j.last_occurrence_ms),
        "lastExecutionId": j.last_execution_id,
        "startAt": json_time(j.start_at_ms),
        "endAt": json_time(j.end_at_ms),
        "remainingRuns": j.remaining_runs,
        "notes": j.notes,
        "pauseReason": j.pause_reason,
        "materializedCount": j.materialized_count,
        "skippedOverlapCount": j.skipped_overlap_count,
        "missedCount": j.missed_count,
        "waitingOccurrences": j.waiting_occurrences_ms.iter().map(|o| time(*o)).collect::<Vec<_>>(),
    })
}

fn jobs_out(o: &Opts, jobs: &[CronJob]) -> String {
    if o.json {
        return Value::Array(jobs.iter().map(job_json).collect()).to_string();
    }
    let rows = jobs
        .iter()
        .map(|j| {
            vec![
                j.cron_job_id.clone(),
                status_name(j),
                j.expression.clone(),
                j.timezone.clone(),
                time(j.next_run_at_ms),
                j.materialized_count.to_string(),
            ]
        })
        .collect();
    table(&["CRON JOB", "STATUS", "EXPRESSION", "ZONE", "NEXT RUN", "RUNS"], rows)
}

fn job_out(o: &Opts, j: &CronJob, created: Option<bool>) -> String {
    if o.json {
        let mut v = job_json(j);
        if let Some(c) = created {
            v["created"] = Value::Bool(c);
        }
        return v.to_string();
    }
    let mut out = jobs_out(o, std::slice::from_ref(j));
    if let Some(false) = created {
        out.push_str("\n  unchanged (already created)");
    }
    if !j.pause_reason.is_empty() {
        out.push_str(&format!("\n  paused: {}", j.pause_reason));
    }
    out
}

/// Runs `kairosctl cron <subcommand> …` (`args[0]` is `cron`).
pub(super) async fn run(
    client: &Client,
    o: &Opts,
    mut args: Vec<String>,
) -> Result<String, Failure> {
    let sub = arg(&args, 1, "cron subcommand")?;
    match sub.as_str() {
        "create" => {
            let tz = take_flag(&mut args, "--tz")?.unwrap_or_else(|| "UTC".into());
            let id = take_flag(&mut args, "--id")?.unwrap_or_default();
            let inputs = inputs_flag(take_flag(&mut args, "--inputs")?)?;
            let mut p = CronPolicies {
                dst_gap: take_flag(&mut args, "--dst-gap")?.unwrap_or_default(),
                dst_fold: take_flag(&mut args, "--dst-fold")?.unwrap_or_default(),
                missed: take_flag(&mut args, "--missed")?.unwrap_or_default(),
                overlap: take_flag(&mut args, "--overlap")?.unwrap_or_default(),
                pause_on_failure: take_switch(&mut args, "--pause-on-failure"),
                ..CronPolicies::default()
            };
            if let Some(w) = take_flag(&mut args, "--catch-up-window")? {
                p.catch_up_window_ms = Some(seconds_ms("--catch-up-window", &w)?);
            }
            if let Some(j) = take_flag(&mut args, "--jitter")? {
                p.jitter_ms = seconds_ms("--jitter", &j)?;
            }
            let start = take_flag(&mut args, "--start")?;
            let end = take_flag(&mut args, "--end")?;
            let runs = take_flag(&mut args, "--runs")?;
            let notes = take_flag(&mut args, "--notes")?.unwrap_or_default();
            let paused = take_switch(&mut args, "--paused");
            let req = CreateCronJobRequest {
                namespace: String::new(),
                cron_job_id: id,
                definition_uri: arg(&args, 2, "definitionUri")?,
                definition_version: number("version", &arg(&args, 3, "version")?)?,
                inputs_json: inputs.unwrap_or_default(),
                expression: arg(&args, 4, "expression")?,
                timezone: tz,
                policies: Some(p),
                start_at_ms: start.map(|s| rfc3339("--start", &s)).transpose()?.unwrap_or(0),
                end_at_ms: end.map(|s| rfc3339("--end", &s)).transpose()?.unwrap_or(0),
                remaining_runs: runs.map(|r| number("--runs", &r)).transpose()?.unwrap_or(0),
                notes,
                paused,
            };
            let (j, created) = client.create_cron_job(req).await?;
            Ok(job_out(o, &j, Some(created)))
        }
        "update" => {
            let mut req = UpdateCronJobRequest {
                expression: take_flag(&mut args, "--expression")?,
                timezone: take_flag(&mut args, "--tz")?,
                inputs_json: inputs_flag(take_flag(&mut args, "--inputs")?)?,
                definition_uri: take_flag(&mut args, "--definition")?,
                dst_gap: take_flag(&mut args, "--dst-gap")?,
                dst_fold: take_flag(&mut args, "--dst-fold")?,
                missed: take_flag(&mut args, "--missed")?,
                overlap: take_flag(&mut args, "--overlap")?,
                notes: take_flag(&mut args, "--notes")?,
                ..UpdateCronJobRequest::default()
            };
            if let Some(v) = take_flag(&mut args, "--version")? {
                req.definition_version = Some(number("--version", &v)?);
            }
            if let Some(v) = take_flag(&mut args, "--catch-up-window")? {
                req.catch_up_window_ms = Some(seconds_ms("--catch-up-window", &v)?);
            }
            if let Some(v) = take_flag(&mut args, "--jitter")? {
                req.jitter_ms = Some(seconds_ms("--jitter", &v)?);
            }
            if let Some(v) = take_flag(&mut args, "--pause-on-failure")? {
                req.pause_on_failure = Some(number("--pause-on-failure", &v)?);
            }
            if let Some(v) = take_flag(&mut args, "--start")? {
                req.start_at_ms = Some(if v.is_empty() { 0 } else { rfc3339("--start", &v)? });
            }
            if let Some(v) = take_flag(&mut args, "--end")? {
                req.end_at_ms = Some(if v.is_empty() { 0 } else { rfc3339("--end", &v)? });
            }
            if let Some(v) = take_flag(&mut args, "--runs")? {
                req.remaining_runs = Some(number("--runs", &v)?);
            }
            req.cron_job_id = arg(&args, 2, "cron job id")?;
            Ok(job_out(o, &client.update_cron_job(req).await?, None))
        }
        "get" => Ok(job_out(o, &client.get_cron_job(&arg(&args, 2, "cron job id")?).await?, None)),
        "list" => {
            let limit =
                take_flag(&mut args, "--limit")?.map_or(Ok(100), |l| number("--limit", &l))?;
            let (jobs, _) = client.list_cron_jobs(limit, "").await?;
            Ok(jobs_out(o, &jobs))
        }
        "pause" => {
            Ok(job_out(o, &client.pause_cron_job(&arg(&args, 2, "cron job id")?).await?, None))
        }
        "resume" => {
            let catch_up = take_switch(&mut args, "--catch-up");
            let j = client.resume_cron_job(&arg(&args, 2, "cron job id")?, catch_up).await?;
            Ok(job_out(o, &j, None))
        }
        "delete" => {
            let id = arg(&args, 2, "cron job id")?;
            client.delete_cron_job(&id).await?;
            Ok(if o.json { json!({"deleted": id}).to_string() } else { format!("{id} deleted") })
        }
        "preview" => {
            let req = PreviewRequest {
                timezone: take_flag(&mut args, "--tz")?.unwrap_or_else(|| "UTC".into()),
                from_ms: take_flag(&mut args, "--from")?
                    .map(|v| rfc3339("--from", &v))
                    .transpose()?
                    .unwrap_or(0),
                until_ms: take_flag(&mut args, "--until")?
                    .map(|v| rfc3339("--until", &v))
                    .transpose()?
                    .unwrap_or(0),
                dst_gap: take_flag(&mut args, "--dst-gap")?.unwrap_or_default(),
                dst_fold: take_flag(&mut args, "--dst-fold")?.unwrap_or_default(),
                limit: take_flag(&mut args, "--limit")?.map_or(Ok(0), |l| number("--limit", &l))?,
                expression: arg(&args, 2, "expression")?,
            };
            let occ = client.preview_cron(req).await?;
            if o.json {
                let list: Vec<Value> =
                    occ.iter().map(|x| json!({"utc": x.utc, "local": x.local})).collect();
                return Ok(json!({ "occurrences": list }).to_string());
            }
            Ok(table(&["UTC", "LOCAL"], occ.into_iter().map(|x| vec![x.utc, x.local]).collect()))
        }
        "backfill" => {
            let from =
                take_flag(&mut args, "--from")?.ok_or_else(|| usage("--from is required"))?;
            let until =
                take_flag(&mut args, "--until")?.ok_or_else(|| usage("--until is required"))?;
            let overlap = take_flag(&mut args, "--overlap")?.unwrap_or_default();
            let id = arg(&args, 2, "cron job id")?;
            let (j, occ) = client
                .backfill_cron_job(
                    &id,
                    rfc3339("--from", &from)?,
                    rfc3339("--until", &until)?,
                    &overlap,
                )
                .await?;
            if o.json {
                let occ: Vec<String> = occ.iter().map(|x| time(*x)).collect();
                return Ok(json!({"cronJob": job_json(&j), "occurrences": occ}).to_string());
            }
            Ok(format!("{} occurrences queued for {id}", occ.len()))
        }
        "runs" => {
            let limit =
                take_flag(&mut args, "--limit")?.map_or(Ok(100), |l| number("--limit", &l))?;
            let page = client.cron_runs(&arg(&args, 2, "cron job id")?, limit, Vec::new()).await?;
            if o.json {
                let runs: Vec<Value> = page
                    .executions
                    .iter()
                    .map(|e| {
                        let mut v = super::execution_json(e);
                        v["occurrence"] = Value::String(time(e.cron_occurrence_ms));
                        v
                    })
                    .collect();
                return Ok(Value::Array(runs).to_string());
            }
            Ok(executions_out(o, &page.executions))
        }
        other => Err(usage(format!("unknown cron subcommand {other:?}"))),
    }
}
