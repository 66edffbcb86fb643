//! A cron job's specification as stored on its record: checking it (every error names the API
//! field), and what the round planner and the owner need from it.

use kairos_proto::storage::v1::{CronJob, CronPolicies, JobDefinition};
use serde_json::Value;

use crate::cron::placeholders::{self, Occurrence};
use crate::cron::plan::{ExecState, Outstanding, Queued, Round, Source};
use crate::cron::policy::{
    CATCH_UP_WINDOW_DEFAULT_MS, MissedPolicy, OverlapPolicy, Policies, jitter_offset_ms, name_of,
    parse_named,
};
use crate::cron::{Expr, FoldPolicy, GapPolicy, Schedule, parse_zone};
use crate::limits::{CRON_EXPRESSION_BYTES_MAX, CRON_NOTES_BYTES_MAX, INPUT_BYTES_MAX};
use crate::ops::error::{Result, invalid};

/// Checks a client-chosen cron job id: 1-128 of letters, digits, `-`, `_` and `.` (it is part
/// of every occurrence's idempotency key).
pub fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !ok {
        return Err(invalid(
            "cronJobId",
            format!("must be 1-128 letters, digits, '-', '_' or '.', got {id:?}"),
        ));
    }
    Ok(())
}

/// The policies of a record (names checked, defaults filled in).
pub fn policies_of(p: Option<&CronPolicies>) -> Result<Policies> {
    let d = CronPolicies::default();
    let p = p.unwrap_or(&d);
    fn named<T>(field: &str, r: std::result::Result<T, String>) -> Result<T> {
        r.map_err(|e| invalid(field, e))
    }
    let out = Policies {
        gap: named("dstGap", parse_named(&GapPolicy::ALL, &p.dst_gap))?,
        fold: named("dstFold", parse_named(&FoldPolicy::ALL, &p.dst_fold))?,
        missed: named("missed", parse_named(&MissedPolicy::ALL, &p.missed))?,
        catch_up_window_ms: p.catch_up_window_ms,
        overlap: named("overlap", parse_named(&OverlapPolicy::ALL, &p.overlap))?,
        pause_on_failure: p.pause_on_failure,
        jitter_ms: p.jitter_ms,
    };
    out.check().map_err(|(field, reason)| invalid(field, reason))?;
    Ok(out)
}

/// The stored form of policies: every name spelled out.
pub fn stored_policies(p: &Policies) -> CronPolicies {
    CronPolicies {
        dst_gap: name_of(&GapPolicy::ALL, p.gap).into(),
        dst_fold: name_of(&FoldPolicy::ALL, p.fold).into(),
        missed: name_of(&MissedPolicy::ALL, p.missed).into(),
        catch_up_window_ms: p.catch_up_window_ms,
        overlap: name_of(&OverlapPolicy::ALL, p.overlap).into(),
        pause_on_failure: p.pause_on_failure,
        jitter_ms: p.jitter_ms,
    }
}

/// Fills in the defaults of policies as a client gave them (a catch-up window of 0 given as
/// "absent" is the caller's to decide: here `None`).
pub fn with_defaults(p: CronPolicies, window_given: bool) -> CronPolicies {
    CronPolicies {
        catch_up_window_ms: if window_given {
            p.catch_up_window_ms
        } else {
            CATCH_UP_WINDOW_DEFAULT_MS
        },
        ..p
    }
}

/// A schedule from its parts; errors name `expression`, `timezone`, `dstGap`, `dstFold`.
pub fn schedule_from(expr: &str, zone: &str, gap: &str, fold: &str) -> Result<Schedule> {
    if expr.len() > CRON_EXPRESSION_BYTES_MAX {
        return Err(invalid(
            "expression",
            format!("is {} bytes, the limit is {CRON_EXPRESSION_BYTES_MAX}", expr.len()),
        ));
    }
    // "expression: is empty", not "expression: expression: is empty"; a field's error keeps
    // its field ("expression: minute field: 61 is out of range 0-59").
    let e = Expr::parse(expr).map_err(|e| match e.field {
        "expression" => invalid("expression", e.reason),
        _ => invalid("expression", e.to_string()),
    })?;
    let tz = parse_zone(zone).map_err(|e| invalid("timezone", e))?;
    let gap = parse_named(&GapPolicy::ALL, gap).map_err(|e| invalid("dstGap", e))?;
    let fold = parse_named(&FoldPolicy::ALL, fold).map_err(|e| invalid("dstFold", e))?;
    Ok(Schedule::new(e, tz, gap, fold))
}

/// The schedule of a record.
pub fn schedule_of(job: &CronJob) -> Result<Schedule> {
    let p = job.policies.clone().unwrap_or_default();
    schedule_from(&job.expression, &job.timezone, &p.dst_gap, &p.dst_fold)
}

/// The inputs template of a record.
pub fn inputs_of(job: &CronJob) -> Result<Value> {
    if job.inputs_json.is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_slice(&job.inputs_json)
        .map_err(|e| invalid("inputs", format!("malformed JSON: {e}")))
}

/// The inputs of one occurrence (placeholders replaced).
pub fn occurrence_inputs(job: &CronJob, schedule: &Schedule, occurrence_ms: i64) -> Result<Value> {
    let template = inputs_of(job)?;
    let o = Occurrence { cron_job_id: &job.id, occurrence_ms, schedule };
    placeholders::render(&template, &o).map_err(|(field, reason)| invalid(field, reason))
}

/// The first occurrence strictly after `after_ms` within the job's start and end.
pub fn next_occurrence(job: &CronJob, schedule: &Schedule, after_ms: i64) -> Option<i64> {
    let after = if job.start_at_ms != 0 { after_ms.max(job.start_at_ms - 1) } else { after_ms };
    schedule.next_after(after).filter(|o| job.end_at_ms == 0 || *o <= job.end_at_ms)
}

/// Checks a record's specification against its pinned definition: expression, zone, policies,
/// bounds, notes, and the inputs of a sample occurrence (placeholders replaced) against the
/// definition's declared inputs.
pub fn check_job(job: &CronJob, def: &JobDefinition, now_ms: i64) -> Result<(Schedule, Policies)> {
    crate::ops::validate::check_name("namespace", &job.namespace)?;
    check_id(&job.id)?;
    let schedule = schedule_of(job)?;
    let policies = policies_of(job.policies.as_ref())?;
    if job.start_at_ms < 0 || job.end_at_ms < 0 {
        return Err(invalid("startAt", "must be a time after 1970"));
    }
    if job.end_at_ms != 0 && job.end_at_ms <= job.start_at_ms {
        return Err(invalid("endAt", "must be after startAt"));
    }
    if job.notes.len() > CRON_NOTES_BYTES_MAX {
        return Err(invalid("notes", format!("is over {CRON_NOTES_BYTES_MAX} bytes")));
    }
    if job.inputs_json.len() > INPUT_BYTES_MAX {
        return Err(invalid("inputs", format!("is over {INPUT_BYTES_MAX} bytes")));
    }
    if !inputs_of(job)?.is_object() {
        return Err(invalid("inputs", "must be a JSON object"));
    }
    let sample = next_occurrence(job, &schedule, now_ms).unwrap_or(now_ms);
    let inputs = occurrence_inputs(job, &schedule, sample)?;
    crate::definition::validate_inputs(def, &inputs).map_err(|e| invalid(e.field(), e.reason()))?;
    Ok((schedule, policies))
}

/// The state of an execution, from its status as the API reports it.
pub fn exec_state(status: kairos_proto::storage::v1::ExecutionStatus) -> ExecState {
    use kairos_proto::storage::v1::ExecutionStatus as S;
    match status {
        S::Failed => ExecState::Failed,
        S::Succeeded | S::Cancelled => ExecState::Done,
        S::Unspecified | S::Scheduled | S::Ready | S::Running | S::RetryWait => {
            ExecState::Unfinished
        }
    }
}

/// The input of a round for a record, given what is known of its outstanding executions now
/// (`states` by execution id; missing ones count as finished).
pub fn round_of(
    job: &CronJob,
    now_ms: i64,
    lookahead_ms: i64,
    states: &std::collections::BTreeMap<String, ExecState>,
) -> Result<Round> {
    let policies = policies_of(job.policies.as_ref())?;
    let queue = job
        .queue
        .iter()
        .map(|q| {
            Ok(Queued {
                occurrence_ms: q.occurrence_ms,
                overlap: parse_named(&OverlapPolicy::ALL, &q.overlap)
                    .map_err(|e| invalid("overlap", e))?,
                source: if q.backfill { Source::Backfill } else { Source::Schedule },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Round {
        now_ms,
        lookahead_ms,
        policies,
        jitter_offset_ms: jitter_offset_ms(&job.id, policies.jitter_ms),
        next_ms: (job.next_run_at_ms != 0).then_some(job.next_run_at_ms),
        end_ms: (job.end_at_ms != 0).then_some(job.end_at_ms),
        remaining_runs: job.remaining_runs,
        queue,
        outstanding: job
            .outstanding
            .iter()
            .map(|o| {
                let st = states.get(&o.execution_id).copied().unwrap_or(ExecState::Done);
                (
                    Outstanding {
                        occurrence_ms: o.occurrence_ms,
                        execution_id: o.execution_id.clone(),
                        since_ms: o.since_ms,
                    },
                    st,
                )
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expression_error_names_the_field_once() {
        let text = |expr: &str| schedule_from(expr, "UTC", "", "").unwrap_err().to_string();
        let e = text("* * * *");
        assert!(e.contains("expression: ") && !e.contains("expression: expression"), "{e}");
        assert!(e.contains("4 fields"), "{e}");
        let e = text("61 * * * *");
        assert!(e.contains("expression: minute field: "), "{e}");
    }
}
