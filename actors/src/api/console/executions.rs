//! The executions pages: search, detail with attempts, cancel, replay, bulk actions.

use std::fmt::Write as _;

use axum::extract::{Path, Query, RawForm, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::Value;

use super::core::*;
use super::html::{esc, url_enc};

pub(super) async fn executions(
    State(c): State<Console>,
    headers: HeaderMap,
    Query(q): Query<Vec<(String, String)>>,
) -> Response {
    let (s, who, fresh) = match enter(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let get = |n: &str| field(&q, n).to_string();
    let (status, definition, key, id, cursor) =
        (get("status"), get("definition"), get("idempotencyKey"), get("id"), get("cursor"));
    if !id.is_empty() {
        return Redirect::to(&format!("/ui/executions/{}", url_enc(&id))).into_response();
    }
    let mut uri = String::from("/executions?limit=50");
    for (n, v) in [
        ("status", &status),
        ("definition", &definition),
        ("idempotencyKey", &key),
        ("cursor", &cursor),
    ] {
        if !v.is_empty() {
            let _ = write!(uri, "&{n}={}", url_enc(v));
        }
    }
    let r = c.call(&s, Method::GET, &uri, None).await;
    let mut p = c.page(&s, Some(&who), "Executions");
    p.body.push_str("<h1>Executions</h1>");
    p.body.push_str(&search_form(&status, &definition, &key));
    let code = if r.ok() {
        StatusCode::OK
    } else if r.status == StatusCode::NOT_FOUND && !key.is_empty() {
        p.body.push_str("<p class=\"notice\" role=\"status\">No execution was submitted with that idempotency key.</p>");
        StatusCode::OK
    } else {
        let (f, m) = r.error();
        let _ = write!(
            p.body,
            "<p class=\"error\" role=\"alert\" id=\"form-error\"><strong>{}</strong>: {}</p>",
            esc(f.as_deref().unwrap_or("search")),
            esc(&m)
        );
        if r.status.is_server_error() { r.status } else { StatusCode::BAD_REQUEST }
    };
    if r.ok() {
        let rows = r.body["executions"].as_array().cloned().unwrap_or_default();
        p.body.push_str(&executions_table(&rows));
        let ids: Vec<&str> = rows.iter().filter_map(|e| e["executionId"].as_str()).collect();
        if who.can_act && !ids.is_empty() && (!status.is_empty() || !definition.is_empty()) {
            p.body.push_str(&bulk_forms(&ids, s.csrf.as_deref().unwrap_or_default()));
        }
        if let Some(next) = r.body["nextCursor"].as_str() {
            let _ = write!(
                p.body,
                "<p><a rel=\"next\" href=\"/ui/executions?status={}&amp;definition={}&amp;cursor={}\">Next page →</a></p>",
                url_enc(&status),
                url_enc(&definition),
                url_enc(next)
            );
        }
    }
    with_csrf(&c, &s, fresh, c.finish(&s, code, p))
}

fn search_form(status: &str, definition: &str, key: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<form class=\"filters\" method=\"get\" action=\"/ui/executions\" role=\"search\">\
         <label for=\"f-status\">Status<select id=\"f-status\" name=\"status\"><option value=\"\">any</option>{}</select></label>\
         <label for=\"f-definition\">Definition<input id=\"f-definition\" name=\"definition\" value=\"{}\" placeholder=\"echo\"></label>\
         <label for=\"f-key\">Idempotency key<input id=\"f-key\" name=\"idempotencyKey\" value=\"{}\"></label>\
         <label for=\"f-id\">Execution id<input id=\"f-id\" name=\"id\" value=\"\"></label>\
         <button type=\"submit\">Search</button></form>",
        STATUSES
            .iter()
            .map(|x| format!(
                "<option{}>{x}</option>",
                if status.eq_ignore_ascii_case(x) { " selected" } else { "" }
            ))
            .collect::<String>(),
        esc(definition),
        esc(key)
    );
    out
}

fn executions_table(rows: &[Value]) -> String {
    let mut out = String::new();
    out.push_str("<div class=\"table-wrap\" id=\"executions-live\" data-live><table id=\"executions\"><thead><tr><th scope=\"col\">Execution</th><th scope=\"col\">Definition</th><th scope=\"col\">Status</th><th scope=\"col\">Execute at</th><th scope=\"col\">Attempts</th><th scope=\"col\">Idempotency key</th></tr></thead><tbody>");
    if rows.is_empty() {
        out.push_str("<tr><td colspan=\"6\">No executions match.</td></tr>");
    }
    for e in rows {
        let id = e["executionId"].as_str().unwrap_or_default();
        let _ = write!(
            out,
            "<tr><td><a href=\"/ui/executions/{}\"><code>{}</code></a></td><td>{}@{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            url_enc(id),
            esc(id),
            esc(&text(&e["definitionUri"])),
            esc(&text(&e["definitionVersion"])),
            status_badge(e["status"].as_str().unwrap_or_default()),
            esc(&text(&e["executeAt"])),
            esc(&text(&e["attemptCount"])),
            esc(&text(&e["idempotencyKey"]))
        );
    }
    out.push_str("</tbody></table></div>");
    out
}

fn bulk_forms(ids: &[&str], csrf: &str) -> String {
    let mut out = String::new();
    let hidden: String = ids
        .iter()
        .map(|id| format!("<input type=\"hidden\" name=\"id\" value=\"{}\">", esc(id)))
        .collect();
    let t = esc(csrf);
    let n = ids.len();
    let _ = write!(
        out,
        "<div class=\"actions\" id=\"bulk\"><form method=\"post\" action=\"/ui/executions/bulk\" data-confirm=\"Cancel the {n} executions shown?\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{t}\"><input type=\"hidden\" name=\"action\" value=\"cancel\">{hidden}\
             <button class=\"danger\" id=\"bulk-cancel\" type=\"submit\">Cancel these {n}</button></form>\
             <form method=\"post\" action=\"/ui/executions/bulk\" data-confirm=\"Replay the {n} executions shown?\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{t}\"><input type=\"hidden\" name=\"action\" value=\"replay\">{hidden}\
             <button class=\"secondary\" id=\"bulk-replay\" type=\"submit\">Replay these {n}</button></form></div>"
    );
    out
}

pub(super) async fn execution(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let (s, who, fresh) = match enter(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let r = c
        .call(&s, Method::GET, &format!("/executions/{}?attemptsLimit=100", url_enc(&id)), None)
        .await;
    if !r.ok() {
        let status = r.status;
        return with_csrf(&c, &s, fresh, c.error_page(&s, Some(&who), status, &r.error().1));
    }
    let e = &r.body;
    let status = e["status"].as_str().unwrap_or_default();
    let mut p = c.page(&s, Some(&who), &format!("Execution {id}"));
    let _ = write!(p.body, "<h1>Execution <code>{}</code></h1>", esc(&id));
    p.body.push_str("<div id=\"execution-live\" data-live>");
    p.body.push_str(&execution_facts(e));
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default();
    let _ =
        write!(p.body, "<h2>Inputs</h2><pre id=\"inputs\">{}</pre>", esc(&pretty(&e["inputs"])));
    if !e["output"].is_null() {
        let _ = write!(
            p.body,
            "<h2>Output</h2><pre id=\"output\">{}</pre>",
            esc(&pretty(&e["output"]))
        );
    }
    if let Some(err) = e["error"].as_object() {
        let _ = write!(
            p.body,
            "<h2>Error</h2><p class=\"error\">{}</p>",
            esc(&text(&err.get("message").cloned().unwrap_or_default()))
        );
    }
    p.body.push_str(&attempts_table(e));
    let finished = matches!(status, "SUCCEEDED" | "FAILED" | "CANCELLED");
    if who.can_act {
        let token = esc(s.csrf.as_deref().unwrap_or_default());
        p.body.push_str("<div class=\"actions\">");
        if !finished {
            let _ = write!(
                p.body,
                "<form method=\"post\" action=\"/ui/executions/{0}/cancel\" data-confirm=\"Cancel this execution?\"><input type=\"hidden\" name=\"csrf\" value=\"{1}\"><button class=\"danger\" id=\"cancel\" type=\"submit\">Cancel</button></form>",
                url_enc(&id),
                token
            );
        } else {
            let _ = write!(
                p.body,
                "<form method=\"post\" action=\"/ui/executions/{0}/replay\"><input type=\"hidden\" name=\"csrf\" value=\"{1}\"><button id=\"replay\" type=\"submit\">Replay</button></form>",
                url_enc(&id),
                token
            );
        }
        p.body.push_str("</div>");
    } else {
        p.body.push_str("<p class=\"readonly\" id=\"read-only\">Read-only: this key has no <code>submit</code> scope, so cancel and replay are not offered.</p>");
    }
    p.body.push_str("</div>");
    with_csrf(&c, &s, fresh, c.finish(&s, StatusCode::OK, p))
}

/// An execution's facts: status, definition, times, key, schedule, trace context.
fn execution_facts(e: &Value) -> String {
    let status = e["status"].as_str().unwrap_or_default();
    let mut out = String::new();
    let _ = write!(
        out,
        "<dl class=\"facts\"><dt>Status</dt><dd id=\"execution-status\">{}{}</dd><dt>Definition</dt><dd>{}@{}</dd>\
         <dt>Execute at</dt><dd>{}</dd><dt>Idempotency key</dt><dd>{}</dd><dt>Schedule</dt><dd>{}</dd>\
         <dt>Created</dt><dd>{}</dd><dt>Finished</dt><dd>{}</dd><dt>Trace context</dt><dd><code>{}</code></dd></dl>",
        status_badge(status),
        if e["cancelRequested"].as_bool() == Some(true) { " (cancel requested)" } else { "" },
        esc(&text(&e["definitionUri"])),
        esc(&text(&e["definitionVersion"])),
        esc(&text(&e["executeAt"])),
        esc(&text(&e["idempotencyKey"])),
        match e["cronJobId"].as_str() {
            Some(j) => format!(
                "<a href=\"/ui/schedules/{}\">{}</a> ({})",
                url_enc(j),
                esc(j),
                esc(&text(&e["cronOccurrence"]))
            ),
            None => "—".into(),
        },
        esc(&text(&e["createdAt"])),
        esc(&text(&e["finishedAt"])),
        esc(&text(&e["traceparent"]))
    );
    out
}

/// An execution's attempts as a timeline: worker, start, end, error of each.
fn attempts_table(e: &Value) -> String {
    let mut out = String::new();
    out.push_str("<h2>Attempts</h2><div class=\"table-wrap\"><table id=\"attempts\"><thead><tr><th scope=\"col\">#</th><th scope=\"col\">Status</th><th scope=\"col\">Worker</th><th scope=\"col\">Started</th><th scope=\"col\">Ended</th><th scope=\"col\">Error</th></tr></thead><tbody>");
    let attempts = e["attempts"].as_array().cloned().unwrap_or_default();
    if attempts.is_empty() {
        out.push_str("<tr><td colspan=\"6\">No attempt yet.</td></tr>");
    }
    for a in &attempts {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&text(&a["number"])),
            status_badge(a["status"].as_str().unwrap_or_default()),
            esc(&text(&a["workerId"])),
            esc(&text(&a["startedAt"])),
            esc(&text(&a["endedAt"])),
            esc(&a["error"]["message"].as_str().map_or("—".into(), str::to_string))
        );
    }
    out.push_str("</tbody></table></div>");
    out
}

pub(super) async fn cancel(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawForm(body): RawForm,
) -> Response {
    let (s, who, _) = match enter_post(&c, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let r = c.call(&s, Method::DELETE, &format!("/executions/{}", url_enc(&id)), None).await;
    if !r.ok() {
        return c.error_page(&s, Some(&who), r.status, &r.error().1);
    }
    Redirect::to(&format!("/ui/executions/{}", url_enc(&id))).into_response()
}

pub(super) async fn replay(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawForm(body): RawForm,
) -> Response {
    let (s, who, _) = match enter_post(&c, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let r = c.call(&s, Method::POST, &format!("/executions/{}/replay", url_enc(&id)), None).await;
    if !r.ok() {
        return c.error_page(&s, Some(&who), r.status, &r.error().1);
    }
    let new_id = r.body["executionId"].as_str().unwrap_or(&id).to_string();
    Redirect::to(&format!("/ui/executions/{}", url_enc(&new_id))).into_response()
}

/// Cancel or replay a set of executions (the page of a filtered search), each through the
/// API as its own call, so each is authorized and audited on its own; the page says what
/// happened to each.
pub(super) async fn bulk(
    State(c): State<Console>,
    headers: HeaderMap,
    RawForm(body): RawForm,
) -> Response {
    let (s, who, f) = match enter_post(&c, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let action = field(&f, "action").to_string();
    let ids: Vec<&str> = f.iter().filter(|(k, _)| k == "id").map(|(_, v)| v.as_str()).collect();
    if ids.is_empty() || ids.len() > crate::limits::CONSOLE_BULK_MAX {
        let msg = format!(
            "id: give 1 to {} executions, not {}",
            crate::limits::CONSOLE_BULK_MAX,
            ids.len()
        );
        return c.error_page(&s, Some(&who), StatusCode::BAD_REQUEST, &msg);
    }
    let (method, verb) = match action.as_str() {
        "cancel" => (Method::DELETE, "cancelled"),
        "replay" => (Method::POST, "replayed"),
        other => {
            let msg = format!("action: must be cancel or replay, not {other:?}");
            return c.error_page(&s, Some(&who), StatusCode::BAD_REQUEST, &msg);
        }
    };
    let mut rows = String::new();
    let (mut ok, mut failed) = (0, 0);
    for id in &ids {
        let uri = match action.as_str() {
            "cancel" => format!("/executions/{}", url_enc(id)),
            _ => format!("/executions/{}/replay", url_enc(id)),
        };
        let r = c.call(&s, method.clone(), &uri, None).await;
        let outcome = if r.ok() {
            ok += 1;
            match r.body["executionId"].as_str() {
                Some(new) if new != *id => format!(
                    "{verb} as <a href=\"/ui/executions/{}\">{}</a>",
                    url_enc(new),
                    esc(new)
                ),
                _ => format!("{verb} ({})", esc(r.body["status"].as_str().unwrap_or_default())),
            }
        } else {
            failed += 1;
            format!("<span class=\"error\">{}</span>", esc(&r.error().1))
        };
        let _ = write!(
            rows,
            "<tr><td><a href=\"/ui/executions/{}\"><code>{}</code></a></td><td>{outcome}</td></tr>",
            url_enc(id),
            esc(id)
        );
    }
    let mut p = c.page(&s, Some(&who), "Bulk action");
    let _ = write!(
        p.body,
        "<h1>Bulk {}</h1><p role=\"status\" id=\"bulk-result\">{ok} {verb}, {failed} refused, of {}.</p>\
         <div class=\"table-wrap\"><table><thead><tr><th scope=\"col\">Execution</th><th scope=\"col\">Outcome</th></tr></thead><tbody>{rows}</tbody></table></div>\
         <p><a href=\"/ui/executions\">Back to executions</a></p>",
        esc(&action),
        ids.len()
    );
    c.finish(&s, if failed == 0 { StatusCode::OK } else { StatusCode::MULTI_STATUS }, p)
}
