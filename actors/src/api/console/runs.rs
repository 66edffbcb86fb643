//! A schedule's last runs, each marked: **failed** (it ended FAILED), **late** (its first
//! attempt started more than [`CONSOLE_RUN_LATE_MS`] after it was due, or it is due that long
//! and not started), and the occurrences of its expression since it was created that have no
//! run, marked **skipped** (the overlap policy) or **missed** (reached too late) — which of
//! the two from the job's counters: the store keeps the counts, not each occurrence, so when
//! both counters are non-zero the row says "missed or skipped".

use std::collections::BTreeSet;
use std::fmt::Write as _;

use axum::http::Method;
use serde_json::Value;

use super::core::*;
use super::html::{esc, url_enc};
use crate::api::json::{parse_rfc3339, rfc3339};
use crate::limits::{CONSOLE_RUN_LATE_MS, CONSOLE_RUNS_MAX};

/// When its first attempt started (ms), if it has one.
async fn first_start(c: &Console, s: &Session, id: &str) -> Option<i64> {
    let uri = format!("/executions/{}?attemptsLimit=1", url_enc(id));
    let r = c.call(s, Method::GET, &uri, None).await;
    parse_rfc3339(r.body["attempts"][0]["startedAt"].as_str()?).ok()
}

fn ms(v: &Value) -> Option<i64> {
    parse_rfc3339(v.as_str()?).ok()
}

/// The marks of one run.
async fn marks(c: &Console, s: &Session, e: &Value, now: i64) -> Vec<&'static str> {
    let mut out = Vec::new();
    let status = e["status"].as_str().unwrap_or_default();
    if status == "FAILED" {
        out.push("failed");
    }
    let due = ms(&e["executeAt"]).unwrap_or(now);
    let started = match e["attemptCount"].as_u64() {
        Some(n) if n > 0 => first_start(c, s, e["executionId"].as_str().unwrap_or_default()).await,
        _ => None,
    };
    let waited = started.unwrap_or(if matches!(status, "SCHEDULED" | "READY") { now } else { due });
    if waited - due > CONSOLE_RUN_LATE_MS {
        out.push("late");
    }
    out
}

/// The occurrences since `since` (ms) with no run among `have`, newest first.
async fn gaps(
    c: &Console,
    s: &Session,
    job: &Value,
    since: i64,
    have: &BTreeSet<String>,
    now: i64,
) -> Vec<String> {
    let uri = format!(
        "/cron-preview?expression={}&timezone={}&from={}&until={}&limit={CONSOLE_RUNS_MAX}",
        url_enc(job["expression"].as_str().unwrap_or_default()),
        url_enc(job["timezone"].as_str().unwrap_or("UTC")),
        url_enc(&rfc3339(since).unwrap_or_default()),
        url_enc(&rfc3339(now - 1_000).unwrap_or_default()),
    );
    let r = c.call(s, Method::GET, &uri, None).await;
    let mut out: Vec<String> = r.body["occurrences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o["utc"].as_str())
        .filter(|u| ms(&Value::from(*u)).is_some_and(|t| t > since && t < now - 1_000))
        .filter(|u| !have.iter().any(|h| ms(&Value::from(h.as_str())) == ms(&Value::from(*u))))
        .map(str::to_string)
        .collect();
    out.reverse();
    out
}

fn gap_mark(job: &Value) -> &'static str {
    let missed = job["missedCount"].as_u64().unwrap_or(0);
    let skipped = job["skippedOverlapCount"].as_u64().unwrap_or(0);
    match (missed > 0, skipped > 0) {
        (false, true) => "skipped",
        (true, false) => "missed",
        _ => "missed or skipped",
    }
}

/// The runs table of schedule `job` (the API's view of it).
pub(super) async fn runs_table(c: &Console, s: &Session, job: &Value) -> String {
    let id = job["cronJobId"].as_str().unwrap_or_default();
    let uri = format!("/cron-jobs/{}/runs?limit={CONSOLE_RUNS_MAX}", url_enc(id));
    let runs = c.call(s, Method::GET, &uri, None).await;
    let list = runs.body["executions"].as_array().cloned().unwrap_or_default();
    let now = c.node.scheduler().clock().now().as_millis();
    let mut rows: Vec<(String, String)> = Vec::new();
    for e in &list {
        let eid = e["executionId"].as_str().unwrap_or_default();
        let m = marks(c, s, e, now).await;
        let row = format!(
            "<tr><td>{}</td><td><a href=\"/ui/executions/{}\"><code>{}</code></a></td><td>{}</td><td>{}</td></tr>",
            esc(&text(&e["cronOccurrence"])),
            url_enc(eid),
            esc(eid),
            status_badge(e["status"].as_str().unwrap_or_default()),
            m.iter()
                .map(|x| format!("<span class=\"mark mark-{x}\">{x}</span>"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        rows.push((text(&e["cronOccurrence"]), row));
    }
    let have: BTreeSet<String> = rows.iter().map(|(o, _)| o.clone()).collect();
    let mut since = ms(&job["createdAt"]).unwrap_or(now);
    if list.len() >= CONSOLE_RUNS_MAX {
        // A full page: only the occurrences since its oldest run matter.
        let oldest = list.iter().filter_map(|e| ms(&e["cronOccurrence"])).min();
        since = since.max(oldest.unwrap_or(since));
    }
    let mark = gap_mark(job);
    for g in gaps(c, s, job, since, &have, now).await {
        let row = format!(
            "<tr class=\"gap\"><td>{}</td><td>no run</td><td>—</td><td><span class=\"mark mark-gap\">{mark}</span></td></tr>",
            esc(&g)
        );
        rows.push((g, row));
    }
    rows.sort_by_key(|(o, _)| std::cmp::Reverse(ms(&Value::from(o.as_str())).unwrap_or(0)));
    rows.truncate(CONSOLE_RUNS_MAX);
    let mut out = String::from(
        "<h2>Last runs</h2><div class=\"table-wrap\" id=\"runs-live\" data-live><table id=\"runs\"><thead><tr><th scope=\"col\">Occurrence</th><th scope=\"col\">Execution</th><th scope=\"col\">Status</th><th scope=\"col\">Marks</th></tr></thead><tbody>",
    );
    if rows.is_empty() {
        out.push_str("<tr><td colspan=\"4\">No runs yet.</td></tr>");
    }
    for (_, r) in rows {
        out.push_str(&r);
    }
    let _ = write!(
        out,
        "</tbody></table></div><p class=\"readonly\">late: started more than {} s after due; missed / skipped: an occurrence since the schedule was created with no run ({} missed, {} skipped in all).</p>",
        CONSOLE_RUN_LATE_MS / 1_000,
        text(&job["missedCount"]),
        text(&job["skippedOverlapCount"])
    );
    out
}
