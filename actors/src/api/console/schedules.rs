//! The schedules pages: list, detail with occurrences and runs, create with a live preview,
//! and the actions (pause, resume, backfill, trigger, delete).

use std::fmt::Write as _;

use axum::extract::{Path, Query, RawForm, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::{Value, json};

use super::core::*;
use super::html::{esc, url_enc};

/// How far ahead previews look for occurrences (five years).
const PREVIEW_AHEAD_MS: i64 = 5 * 366 * 86_400_000;

/// The occurrences of an expression as a table: each in the zone and in UTC, with the ones
/// whose UTC offset differs from the one before marked as across a DST change.
pub(super) async fn occurrences_table(
    c: &Console,
    s: &Session,
    expression: &str,
    timezone: &str,
    n: u32,
) -> String {
    // The API's preview looks a week ahead by default: look years ahead, so that a monthly or
    // yearly schedule shows its next occurrences too.
    let now_ms = c.node.scheduler().clock().now().as_millis();
    let until = crate::api::json::rfc3339(now_ms + PREVIEW_AHEAD_MS).unwrap_or_default();
    let uri = format!(
        "/cron-preview?expression={}&timezone={}&limit={n}&until={}",
        url_enc(expression),
        url_enc(if timezone.is_empty() { "UTC" } else { timezone }),
        url_enc(&until)
    );
    let r = c.call(s, Method::GET, &uri, None).await;
    if !r.ok() {
        let (f, m) = r.error();
        return format!(
            "<p class=\"error\" role=\"alert\" id=\"preview-error\"><strong>{}</strong>: {}</p>",
            esc(f.as_deref().unwrap_or("expression")),
            esc(&m)
        );
    }
    let mut out = String::from(
        "<div class=\"table-wrap\"><table class=\"occurrences\"><thead><tr><th scope=\"col\">In the schedule's zone</th><th scope=\"col\">UTC</th><th scope=\"col\"></th></tr></thead><tbody>",
    );
    let mut prev_offset: Option<String> = None;
    for o in r.body["occurrences"].as_array().cloned().unwrap_or_default() {
        let local = o["local"].as_str().unwrap_or_default();
        let offset = offset_of(local);
        let dst = prev_offset.as_ref().is_some_and(|p| *p != offset);
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(local),
            esc(o["utc"].as_str().unwrap_or_default()),
            if dst {
                format!(
                    "<span class=\"dst\">DST change: offset {} → {}</span>",
                    esc(prev_offset.as_deref().unwrap_or_default()),
                    esc(&offset)
                )
            } else {
                String::new()
            }
        );
        prev_offset = Some(offset);
    }
    out.push_str("</tbody></table></div>");
    out
}

/// The UTC offset at the end of an RFC 3339 local time (`+02:00`, `Z`).
fn offset_of(t: &str) -> String {
    if t.ends_with('Z') {
        return "+00:00".into();
    }
    match t.rfind(['+', '-']) {
        Some(i) if i > 10 => t[i..].to_string(),
        _ => String::new(),
    }
}

pub(super) async fn schedules(State(c): State<Console>, headers: HeaderMap) -> Response {
    let (s, who, fresh) = match enter(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let r = c.call(&s, Method::GET, "/cron-jobs?limit=100", None).await;
    let mut p = c.page(&s, Some(&who), "Schedules");
    p.body.push_str("<h1>Schedules</h1>");
    if who.can_act {
        p.body
            .push_str("<p><a href=\"/ui/schedules/new\" id=\"new-schedule\">New schedule</a></p>");
    }
    if !r.ok() {
        let _ = write!(p.body, "<p class=\"error\" role=\"alert\">{}</p>", esc(&r.error().1));
        return with_csrf(&c, &s, fresh, c.finish(&s, r.status, p));
    }
    let jobs = r.body["cronJobs"].as_array().cloned().unwrap_or_default();
    p.body.push_str("<div class=\"table-wrap\" id=\"schedules-live\" data-live><table id=\"schedules\"><thead><tr><th scope=\"col\">Schedule</th><th scope=\"col\">Expression</th><th scope=\"col\">Zone</th><th scope=\"col\">Status</th><th scope=\"col\">Next run</th><th scope=\"col\">Missed / skipped</th></tr></thead><tbody>");
    if jobs.is_empty() {
        p.body.push_str("<tr><td colspan=\"6\">No schedules.</td></tr>");
    }
    for j in &jobs {
        let id = j["cronJobId"].as_str().unwrap_or_default();
        let _ = write!(
            p.body,
            "<tr><td><a href=\"/ui/schedules/{}\">{}</a></td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td></tr>",
            url_enc(id),
            esc(id),
            esc(&text(&j["expression"])),
            esc(&text(&j["timezone"])),
            status_badge(j["status"].as_str().unwrap_or_default()),
            esc(&text(&j["nextRunAt"])),
            esc(&text(&j["missedCount"])),
            esc(&text(&j["skippedOverlapCount"]))
        );
    }
    p.body.push_str("</tbody></table></div>");
    with_csrf(&c, &s, fresh, c.finish(&s, StatusCode::OK, p))
}

pub(super) async fn preview_fragment(
    State(c): State<Console>,
    headers: HeaderMap,
    Query(q): Query<Vec<(String, String)>>,
) -> Response {
    let s = Session::of(&headers);
    if let Err(r) = c.whoami(&s).await {
        return r;
    }
    let t = occurrences_table(&c, &s, field(&q, "expression"), field(&q, "timezone"), 5).await;
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], t).into_response()
}

pub(super) async fn new_schedule(
    State(c): State<Console>,
    headers: HeaderMap,
    Query(q): Query<Vec<(String, String)>>,
) -> Response {
    let (s, who, fresh) = match enter(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let resp = schedule_form(&c, &s, &who, &q, None, StatusCode::OK).await;
    with_csrf(&c, &s, fresh, resp)
}

pub(super) async fn schedule_form(
    c: &Console,
    s: &Session,
    who: &Who,
    f: &[(String, String)],
    err: Option<(String, String)>,
    status: StatusCode,
) -> Response {
    schedule_form_for(c, s, who, f, err, status, None).await
}

/// The form's preview region's content, and its end.
async fn preview(c: &Console, s: &Session, f: &[(String, String)]) -> String {
    let mut out = if field(f, "expression").is_empty() {
        "<p class=\"readonly\">Type an expression to see its next occurrences.</p>".to_string()
    } else {
        occurrences_table(c, s, field(f, "expression"), field(f, "timezone"), 5).await
    };
    out.push_str("</div>");
    out
}

/// The create form, or (`edit`: the schedule's id) the edit form, with the live preview.
pub(super) async fn schedule_form_for(
    c: &Console,
    s: &Session,
    who: &Who,
    f: &[(String, String)],
    err: Option<(String, String)>,
    status: StatusCode,
    edit: Option<&str>,
) -> Response {
    let title = edit.map_or("New schedule".to_string(), |id| format!("Edit schedule {id}"));
    let mut p = c.page(s, Some(who), &title);
    let _ = write!(p.body, "<h1>{}</h1>", esc(&title));
    if let Some((fl, m)) = &err {
        let _ = write!(
            p.body,
            "<p class=\"error\" role=\"alert\" id=\"form-error\"><strong>{}</strong>: {}</p>",
            esc(fl),
            esc(m)
        );
    }
    let v = |n: &str| esc(field(f, n));
    let tz = if field(f, "timezone").is_empty() { "UTC".to_string() } else { v("timezone") };
    let version = if field(f, "definitionVersion").is_empty() {
        "1".to_string()
    } else {
        v("definitionVersion")
    };
    let inputs = if field(f, "inputs").is_empty() { "{}".to_string() } else { v("inputs") };
    let (action, id_field, button) = match edit {
        None => (
            "/ui/schedules".to_string(),
            format!(
                "<label for=\"cronJobId\">Id (optional)<input id=\"cronJobId\" name=\"cronJobId\" value=\"{}\"></label>",
                v("cronJobId")
            ),
            "<button type=\"submit\" id=\"create\">Create</button>",
        ),
        Some(id) => (
            format!("/ui/schedules/{}/edit", url_enc(id)),
            String::new(),
            "<button type=\"submit\" id=\"save\">Save</button>",
        ),
    };
    let _ = write!(
        p.body,
        "<form class=\"stack\" method=\"post\" action=\"{}\" data-preview=\"/ui/schedules/preview\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">{id_field}\
         <label for=\"definitionUri\">Definition<input id=\"definitionUri\" name=\"definitionUri\" value=\"{}\" placeholder=\"registry://jobs/echo\" required></label>\
         <label for=\"definitionVersion\">Definition version<input id=\"definitionVersion\" name=\"definitionVersion\" value=\"{}\" inputmode=\"numeric\"></label>\
         <label for=\"expression\">Cron expression<input id=\"expression\" name=\"expression\" value=\"{}\" placeholder=\"0 9 * * MON-FRI\" required></label>\
         <label for=\"timezone\">Time zone<input id=\"timezone\" name=\"timezone\" value=\"{}\" placeholder=\"Europe/Berlin\"></label>\
         <label for=\"inputs\">Inputs (JSON)<textarea id=\"inputs\" name=\"inputs\" rows=\"3\">{}</textarea></label>\
         {button}</form>\
         <h2>Next occurrences</h2><div id=\"preview\" aria-live=\"polite\">",
        esc(&action),
        esc(s.csrf.as_deref().unwrap_or_default()),
        v("definitionUri"),
        version,
        v("expression"),
        tz,
        inputs
    );
    p.body.push_str(&preview(c, s, f).await);
    c.finish(s, status, p)
}

/// The API body of a create or edit form, or the field that is wrong and why.
pub(super) fn job_body(f: &[(String, String)]) -> Result<Value, (String, String)> {
    let bad = |fl: &str, m: &str| (fl.to_string(), m.to_string());
    let version = match field(f, "definitionVersion") {
        "" => 1,
        v => v
            .parse::<u32>()
            .map_err(|_| bad("definitionVersion", "must be a whole number from 1"))?,
    };
    let inputs = match field(f, "inputs") {
        "" => json!({}),
        t => serde_json::from_str::<Value>(t)
            .map_err(|e| bad("inputs", &format!("is not JSON: {e}")))?,
    };
    if !inputs.is_object() {
        return Err(bad("inputs", "must be a JSON object"));
    }
    Ok(json!({
        "definitionUri": field(f, "definitionUri"),
        "definitionVersion": version,
        "expression": field(f, "expression"),
        "timezone": if field(f, "timezone").is_empty() { "UTC" } else { field(f, "timezone") },
        "inputs": inputs,
    }))
}

pub(super) async fn create_schedule(
    State(c): State<Console>,
    headers: HeaderMap,
    RawForm(body): RawForm,
) -> Response {
    let (s, who, f) = match enter_post(&c, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let mut b = match job_body(&f) {
        Ok(b) => b,
        Err(e) => return schedule_form(&c, &s, &who, &f, Some(e), StatusCode::BAD_REQUEST).await,
    };
    if !field(&f, "cronJobId").is_empty() {
        b["cronJobId"] = json!(field(&f, "cronJobId"));
    }
    let r = c.call(&s, Method::POST, "/cron-jobs", Some(b)).await;
    if !r.ok() {
        let (fl, m) = r.error();
        let status = r.status;
        return schedule_form(
            &c,
            &s,
            &who,
            &f,
            Some((fl.unwrap_or_else(|| "form".into()), m)),
            status,
        )
        .await;
    }
    let id = r.body["cronJobId"].as_str().unwrap_or_default().to_string();
    Redirect::to(&format!("/ui/schedules/{}", url_enc(&id))).into_response()
}

pub(super) async fn schedule(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let (s, who, fresh) = match enter(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let r = c.call(&s, Method::GET, &format!("/cron-jobs/{}", url_enc(&id)), None).await;
    if !r.ok() {
        return with_csrf(&c, &s, fresh, c.error_page(&s, Some(&who), r.status, &r.error().1));
    }
    let j = r.body;
    let mut p = c.page(&s, Some(&who), &format!("Schedule {id}"));
    let _ = write!(p.body, "<h1>Schedule <code>{}</code></h1>", esc(&id));
    let status = j["status"].as_str().unwrap_or_default().to_string();
    let _ = write!(
        p.body,
        "<div id=\"schedule-live\" data-live><dl class=\"facts\"><dt>Status</dt><dd id=\"schedule-status\">{}</dd><dt>Expression</dt><dd><code>{}</code></dd><dt>Time zone</dt><dd>{}</dd>\
         <dt>Definition</dt><dd>{}@{}</dd><dt>Next run</dt><dd>{}</dd><dt>Missed</dt><dd>{}</dd><dt>Skipped (overlap)</dt><dd>{}</dd><dt>Pause reason</dt><dd>{}</dd><dt>Notes</dt><dd>{}</dd></dl></div>",
        status_badge(&status),
        esc(&text(&j["expression"])),
        esc(&text(&j["timezone"])),
        esc(&text(&j["definitionUri"])),
        esc(&text(&j["definitionVersion"])),
        esc(&text(&j["nextRunAt"])),
        esc(&text(&j["missedCount"])),
        esc(&text(&j["skippedOverlapCount"])),
        esc(&text(&j["pauseReason"])),
        esc(&text(&j["notes"]))
    );
    p.body.push_str("<h2>Next 5 occurrences</h2><div id=\"occurrences\">");
    p.body.push_str(
        &occurrences_table(
            &c,
            &s,
            j["expression"].as_str().unwrap_or_default(),
            j["timezone"].as_str().unwrap_or("UTC"),
            5,
        )
        .await,
    );
    p.body.push_str("</div>");
    p.body.push_str(&schedule_actions(
        &id,
        &status,
        s.csrf.as_deref().unwrap_or_default(),
        who.can_act,
    ));
    p.body.push_str(&super::runs::runs_table(&c, &s, &j).await);
    with_csrf(&c, &s, fresh, c.finish(&s, StatusCode::OK, p))
}

/// A schedule's action forms (pause or resume, backfill, trigger, delete), or the read-only
/// note.
fn schedule_actions(id: &str, status: &str, csrf: &str, can_act: bool) -> String {
    let mut out = String::new();
    if can_act {
        let t = esc(csrf);
        let idu = url_enc(id);
        out.push_str("<div class=\"actions\">");
        if status == "PAUSED" {
            let _ = write!(
                out,
                "<form method=\"post\" action=\"/ui/schedules/{idu}/resume\"><input type=\"hidden\" name=\"csrf\" value=\"{t}\"><label class=\"check\"><input type=\"checkbox\" name=\"catchUp\" value=\"true\">catch up</label><button id=\"resume\" type=\"submit\">Resume</button></form>"
            );
        } else {
            let _ = write!(
                out,
                "<form method=\"post\" action=\"/ui/schedules/{idu}/pause\"><input type=\"hidden\" name=\"csrf\" value=\"{t}\"><label for=\"reason\">Reason<input id=\"reason\" name=\"reason\" placeholder=\"why (kept in the notes)\"></label><button id=\"pause\" type=\"submit\">Pause</button></form>"
            );
        }
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/ui/schedules/{idu}/backfill\"><input type=\"hidden\" name=\"csrf\" value=\"{t}\">\
             <label for=\"from\">Backfill from<input id=\"from\" name=\"from\" placeholder=\"2026-11-01T00:00:00Z\"></label>\
             <label for=\"until\">until<input id=\"until\" name=\"until\" placeholder=\"2026-12-01T00:00:00Z\"></label>\
             <button class=\"secondary\" id=\"backfill\" type=\"submit\">Backfill</button></form>"
        );
        let _ = write!(
            out,
            "<a class=\"button\" id=\"edit\" href=\"/ui/schedules/{idu}/edit\">Edit</a>"
        );
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/ui/schedules/{idu}/trigger\"><input type=\"hidden\" name=\"csrf\" value=\"{t}\"><button class=\"secondary\" id=\"trigger\" type=\"submit\">Trigger now</button></form>"
        );
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/ui/schedules/{idu}/delete\" data-confirm=\"Delete this schedule?\"><input type=\"hidden\" name=\"csrf\" value=\"{t}\"><button class=\"danger\" id=\"delete\" type=\"submit\">Delete</button></form>"
        );
        out.push_str("</div>");
    } else {
        out.push_str("<p class=\"readonly\" id=\"read-only\">Read-only: this key has no <code>submit</code> scope.</p>");
    }
    out
}

pub(super) async fn schedule_action(
    State(c): State<Console>,
    headers: HeaderMap,
    Path((id, action)): Path<(String, String)>,
    RawForm(body): RawForm,
) -> Response {
    let (s, who, f) = match enter_post(&c, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let base = format!("/cron-jobs/{}", url_enc(&id));
    let r = match action.as_str() {
        "pause" => pause(&c, &s, &base, field(&f, "reason")).await,
        "resume" => {
            let catch_up = field(&f, "catchUp") == "true";
            c.call(
                &s,
                Method::POST,
                &format!("{base}/resume"),
                Some(json!({ "catchUp": catch_up })),
            )
            .await
        }
        "trigger" => c.call(&s, Method::POST, &format!("{base}/trigger"), None).await,
        "backfill" => {
            let b = json!({ "from": field(&f, "from"), "until": field(&f, "until") });
            let r = c.call(&s, Method::POST, &format!("{base}/backfill"), Some(b)).await;
            if r.ok() {
                return backfilled(&c, &s, &who, &id, &r.body);
            }
            r
        }
        "delete" => {
            let r = c.call(&s, Method::DELETE, &base, None).await;
            if r.ok() {
                return Redirect::to("/ui/schedules").into_response();
            }
            r
        }
        other => {
            return c.error_page(
                &s,
                Some(&who),
                StatusCode::NOT_FOUND,
                &format!("no schedule action {other:?}"),
            );
        }
    };
    if !r.ok() {
        let (fl, m) = r.error();
        let msg = match fl {
            Some(fl) if !m.starts_with(&fl) => format!("{fl}: {m}"),
            _ => m,
        };
        return c.error_page(&s, Some(&who), r.status, &msg);
    }
    Redirect::to(&format!("/ui/schedules/{}", url_enc(&id))).into_response()
}

/// Pauses a schedule; a reason is kept in its notes (the API's pause takes none).
async fn pause(c: &Console, s: &Session, base: &str, reason: &str) -> Reply {
    let r = c.call(s, Method::POST, &format!("{base}/pause"), None).await;
    if !r.ok() || reason.is_empty() {
        return r;
    }
    let notes = json!({ "notes": format!("paused: {reason}") });
    c.call(s, Method::PATCH, base, Some(notes)).await
}

/// The page after a backfill: the occurrences it submitted.
fn backfilled(c: &Console, s: &Session, who: &Who, id: &str, reply: &Value) -> Response {
    let occ: Vec<String> = reply["occurrences"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(esc)).collect())
        .unwrap_or_default();
    let mut p = c.page(s, Some(who), "Backfill");
    let _ = write!(
        p.body,
        "<h1>Backfill of <a href=\"/ui/schedules/{}\">{}</a></h1><p role=\"status\" id=\"backfill-result\">{} occurrences submitted.</p><ul>{}</ul>",
        url_enc(id),
        esc(id),
        occ.len(),
        occ.iter().map(|o| format!("<li>{o}</li>")).collect::<String>()
    );
    c.finish(s, StatusCode::OK, p)
}
