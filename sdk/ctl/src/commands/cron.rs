//! `kairosctl cron …`: durable schedules.
//!
//! The flags are declared in [`crate::args::Cron`] (`kairosctl cron --help`).
//!
//! `--json cron preview` prints `{"occurrences": [{"utc": "…Z", "local": "…+hh:mm"}, …]}`, in
//! order; it needs no stored job.

use kairos_proto::v1::{
    CreateCronJobRequest, CronJob, CronPolicies, CronStatus, PreviewRequest, UpdateCronJobRequest,
};
use kairos_sdk::Client;
use serde_json::{Value, json};

use crate::args::{Cron, CronCreate, CronUpdate};
use crate::output::{Failure, Opts, execution_json, page_footer, table, time};

fn status_name(j: &CronJob) -> String {
    CronStatus::try_from(j.status)
        .unwrap_or_default()
        .as_str_name()
        .trim_start_matches("CRON_STATUS_")
        .to_string()
}

/// The API's JSON view of a cron job.
fn job_json(j: &CronJob) -> Value {
    kairos_sdk::views::cron_job(j)
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

/// The request of `cron create`.
fn create_request(c: CronCreate) -> CreateCronJobRequest {
    let p = c.policies;
    CreateCronJobRequest {
        namespace: String::new(),
        cron_job_id: c.id,
        definition_uri: c.definition_uri,
        definition_version: c.version,
        inputs_json: p.inputs.unwrap_or_default(),
        expression: c.expression,
        timezone: c.tz,
        policies: Some(CronPolicies {
            dst_gap: p.dst_gap.unwrap_or_default(),
            dst_fold: p.dst_fold.unwrap_or_default(),
            missed: p.missed.unwrap_or_default(),
            overlap: p.overlap.unwrap_or_default(),
            pause_on_failure: c.pause_on_failure,
            catch_up_window_ms: p.catch_up_window,
            jitter_ms: p.jitter.unwrap_or(0),
        }),
        start_at_ms: p.start.unwrap_or(0),
        end_at_ms: p.end.unwrap_or(0),
        remaining_runs: p.runs.unwrap_or(0),
        notes: p.notes.unwrap_or_default(),
        paused: c.paused,
    }
}

/// The request of `cron update`: only the flags given are set.
fn update_request(u: CronUpdate) -> UpdateCronJobRequest {
    let p = u.policies;
    UpdateCronJobRequest {
        cron_job_id: u.id,
        expression: u.expression,
        timezone: u.tz,
        inputs_json: p.inputs,
        definition_uri: u.definition,
        definition_version: u.version,
        dst_gap: p.dst_gap,
        dst_fold: p.dst_fold,
        missed: p.missed,
        overlap: p.overlap,
        notes: p.notes,
        catch_up_window_ms: p.catch_up_window,
        jitter_ms: p.jitter,
        pause_on_failure: u.pause_on_failure,
        start_at_ms: p.start,
        end_at_ms: p.end,
        remaining_runs: p.runs,
        ..UpdateCronJobRequest::default()
    }
}

/// `cron runs`: a page of a schedule's executions, each with the occurrence it is for.
async fn runs(
    client: &Client,
    o: &Opts,
    id: &str,
    limit: u32,
    cursor: Vec<u8>,
) -> Result<String, Failure> {
    let page = client.cron_runs(id, limit, cursor).await?;
    if o.json {
        let runs: Vec<Value> = page.executions.iter().map(execution_json).collect();
        let next = kairos_sdk::views::cursor_text(&page.next_cursor);
        return Ok(json!({"executions": runs, "nextCursor": next,
            "unreadableIds": page.unreadable_ids})
        .to_string());
    }
    let rows = page
        .executions
        .iter()
        .map(|e| {
            let status = kairos_sdk::views::execution_status(e.status);
            vec![
                time(e.cron_occurrence_ms),
                e.execution_id.clone(),
                status,
                e.attempt_count.to_string(),
            ]
        })
        .collect();
    let mut out = table(&["OCCURRENCE", "EXECUTION", "STATUS", "ATTEMPTS"], rows);
    out.push_str(&page_footer(&page.next_cursor, &page.unreadable_ids));
    Ok(out)
}

/// Runs `kairosctl cron <subcommand> …`.
pub(super) async fn run(client: &Client, o: &Opts, cmd: Cron) -> Result<String, Failure> {
    match cmd {
        Cron::Create(c) => {
            let (j, created) = client.create_cron_job(create_request(c)).await?;
            Ok(job_out(o, &j, Some(created)))
        }
        Cron::Update(u) => Ok(job_out(o, &client.update_cron_job(update_request(u)).await?, None)),
        Cron::Get { id } => Ok(job_out(o, &client.get_cron_job(&id).await?, None)),
        Cron::List { limit, cursor } => {
            let (jobs, next) =
                client.list_cron_jobs(limit, cursor.as_deref().unwrap_or("")).await?;
            if o.json {
                let list: Vec<Value> = jobs.iter().map(kairos_sdk::views::cron_job).collect();
                let next = (!next.is_empty()).then_some(next);
                return Ok(json!({"cronJobs": list, "nextCursor": next}).to_string());
            }
            let mut out = jobs_out(o, &jobs);
            if !next.is_empty() {
                out.push_str(&format!("\nmore: --cursor {next}"));
            }
            Ok(out)
        }
        Cron::Pause { id } => Ok(job_out(o, &client.pause_cron_job(&id).await?, None)),
        Cron::Resume { id, catch_up } => {
            Ok(job_out(o, &client.resume_cron_job(&id, catch_up).await?, None))
        }
        Cron::Delete { id } => {
            client.delete_cron_job(&id).await?;
            Ok(if o.json { json!({"deleted": id}).to_string() } else { format!("{id} deleted") })
        }
        Cron::Preview { expression, tz, from, until, dst_gap, dst_fold, limit } => {
            let req = PreviewRequest {
                timezone: tz,
                from_ms: from.unwrap_or(0),
                until_ms: until.unwrap_or(0),
                dst_gap: dst_gap.unwrap_or_default(),
                dst_fold: dst_fold.unwrap_or_default(),
                limit,
                expression,
            };
            let occ = client.preview_cron(req).await?;
            if o.json {
                let list: Vec<Value> =
                    occ.iter().map(|x| json!({"utc": x.utc, "local": x.local})).collect();
                return Ok(json!({ "occurrences": list }).to_string());
            }
            Ok(table(&["UTC", "LOCAL"], occ.into_iter().map(|x| vec![x.utc, x.local]).collect()))
        }
        Cron::Backfill { id, from, until, overlap } => {
            let (j, occ) =
                client.backfill_cron_job(&id, from, until, &overlap.unwrap_or_default()).await?;
            if o.json {
                let occ: Vec<String> = occ.iter().map(|x| time(*x)).collect();
                return Ok(json!({"cronJob": job_json(&j), "occurrences": occ}).to_string());
            }
            Ok(format!("{} occurrences queued for {id}", occ.len()))
        }
        Cron::Runs { id, limit, cursor } => {
            runs(client, o, &id, limit, cursor.unwrap_or_default()).await
        }
    }
}
