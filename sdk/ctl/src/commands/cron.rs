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

/// What an overlap policy does with the occurrences of a backfill.
fn backfill_rule(policy: &str) -> &'static str {
    match policy {
        "allow" => "each gets an execution at once",
        "skip" => {
            "an occurrence gets an execution only while the schedule has none unfinished; \
             the others are skipped (skippedOverlapCount) — --overlap buffer-all runs them all, \
             one after the other"
        }
        "buffer-one" | "buffer-all" => {
            "they run one after the other, each once the one before ended"
        }
        "cancel-previous" => {
            "only the last gets an execution; unfinished ones before it are cancelled"
        }
        _ => "see docs/cron.md (Backfill)",
    }
}

/// `cron backfill`: queues the occurrences, then (for up to `wait`) follows the schedule until
/// none of them waits, and says what was made and skipped, and why (the overlap policy).
async fn backfill(
    client: &Client,
    o: &Opts,
    id: &str,
    (from, until): (i64, i64),
    overlap: String,
    wait: std::time::Duration,
) -> Result<String, Failure> {
    let (before, occ) = client.backfill_cron_job(id, from, until, &overlap).await?;
    let policy = match overlap.as_str() {
        "" => before.policies.clone().unwrap_or_default().overlap,
        o => o.to_string(),
    };
    let policy = if policy.is_empty() { "skip".to_string() } else { policy };
    let deadline = tokio::time::Instant::now() + wait;
    let mut after = before.clone();
    let waiting = |j: &CronJob| occ.iter().filter(|x| j.waiting_occurrences_ms.contains(x)).count();
    // Settled: none waits, and each was made or skipped (an occurrence that had an execution
    // already keeps it and is neither: then the wait runs out, and the counts still hold).
    let settled = |j: &CronJob| {
        let made = j.materialized_count.saturating_sub(before.materialized_count);
        let skipped = j.skipped_overlap_count.saturating_sub(before.skipped_overlap_count);
        waiting(j) == 0 && made + skipped >= occ.len() as u64
    };
    while !settled(&after) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        after = client.get_cron_job(id).await?;
    }
    let made = after.materialized_count.saturating_sub(before.materialized_count);
    let skipped = after.skipped_overlap_count.saturating_sub(before.skipped_overlap_count);
    let still = waiting(&after);
    if o.json {
        let list: Vec<String> = occ.iter().map(|x| time(*x)).collect();
        return Ok(json!({"cronJob": job_json(&after), "occurrences": list, "overlap": policy,
            "made": made, "skippedOverlap": skipped, "waiting": still})
        .to_string());
    }
    let mut out = format!(
        "{} occurrences queued for {id} under the overlap policy {policy}: {}",
        occ.len(),
        backfill_rule(&policy)
    );
    if !wait.is_zero() {
        out.push_str(&format!(
            "\n{made} executions made, {skipped} occurrences skipped for overlap"
        ));
        if still > 0 {
            out.push_str(&format!(", {still} still waiting"));
        }
        out.push_str(&format!(" — `kairosctl cron runs {id}` lists them"));
    }
    Ok(out)
}

/// `cron trigger`: queues a run now, then (for up to `wait`) looks for its execution by the
/// occurrence's idempotency key, and says what became of it.
async fn trigger(
    client: &Client,
    o: &Opts,
    id: &str,
    overlap: String,
    wait: std::time::Duration,
) -> Result<String, Failure> {
    let r = client.trigger_cron_job(id, &overlap).await?;
    let (job, occurrence, key) =
        (r.cron_job.unwrap_or_default(), r.occurrence_ms, r.idempotency_key);
    let deadline = tokio::time::Instant::now() + wait;
    let mut found = None;
    let mut after = job.clone();
    while !wait.is_zero() && found.is_none() && tokio::time::Instant::now() < deadline {
        match client.get_by_idempotency_key(&key).await {
            Ok((e, _)) => found = Some(e),
            Err(e) if e.code() == tonic::Code::NotFound => {
                after = client.get_cron_job(id).await?;
                if !after.waiting_occurrences_ms.contains(&occurrence)
                    && after.skipped_overlap_count > job.skipped_overlap_count
                {
                    break; // skipped for overlap
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    if o.json {
        let mut v = json!({"cronJob": job_json(&after), "occurrence": time(occurrence)});
        if let Some(e) = &found {
            v["execution"] = execution_json(e);
        }
        return Ok(v.to_string());
    }
    let when = time(occurrence);
    Ok(match found {
        Some(e) => format!(
            "{id} triggered: occurrence {when}, execution {} {}",
            e.execution_id,
            kairos_sdk::views::execution_status(e.status)
        ),
        None if after.skipped_overlap_count > job.skipped_overlap_count => format!(
            "{id} triggered: occurrence {when} skipped — its previous run has not ended and the \
             overlap policy skips (--overlap allow runs it anyway)"
        ),
        None if wait.is_zero() => format!("{id} triggered: occurrence {when} queued"),
        None => format!(
            "{id} triggered: occurrence {when} still waiting (the overlap policy holds it until \
             the previous run ends) — `kairosctl cron runs {id}` lists it once made"
        ),
    })
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
        Cron::Backfill { id, from, until, overlap, wait } => {
            backfill(client, o, &id, (from, until), overlap.unwrap_or_default(), wait).await
        }
        Cron::Trigger { id, overlap, wait } => {
            trigger(client, o, &id, overlap.unwrap_or_default(), wait).await
        }
        Cron::Runs { id, limit, cursor } => {
            runs(client, o, &id, limit, cursor.unwrap_or_default()).await
        }
    }
}
