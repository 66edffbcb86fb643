//! The executions pages: search, detail with attempts, cancel, replay, bulk actions.

use std::fmt::Write as _;

use axum::extract::{Path, Query, RawForm, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::Value;

use super::core::*;
use super::filter::{Filter, bulk_forms, search_form};
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
    let (f, key, id, cursor) = (
        Filter::of(&q),
        field(&q, "idempotencyKey").to_string(),
        field(&q, "id").to_string(),
        field(&q, "cursor").to_string(),
    );
    if !id.is_empty() {
        return Redirect::to(&format!("/ui/executions/{}", url_enc(&id))).into_response();
    }
    let mut uri = format!("/executions?limit=50{}", f.query());
    for (n, v) in [("idempotencyKey", &key), ("cursor", &cursor)] {
        if !v.is_empty() {
            let _ = write!(uri, "&{n}={}", url_enc(v));
        }
    }
    let all_ns = who.key_namespace == "*";
    let f = if all_ns { f } else { Filter { namespace: String::new(), ..f } };
    let r = c.call(&f.session(&s), Method::GET, &uri, None).await;
    let mut p = c.page(&s, Some(&who), "Executions");
    p.body.push_str("<h1>Executions</h1>");
    p.body.push_str(&search_form(&f, &key, all_ns, &s.namespace));
    let code = if r.ok() {
        StatusCode::OK
    } else if r.status == StatusCode::NOT_FOUND && !key.is_empty() {
        p.body.push_str("<p class=\"notice\" role=\"status\">No execution was submitted with that idempotency key.</p>");
        StatusCode::OK
    } else {
        let (field, m) = r.error();
        let _ = write!(
            p.body,
            "<p class=\"error\" role=\"alert\" id=\"form-error\"><strong>{}</strong>: {}</p>",
            esc(field.as_deref().unwrap_or("search")),
            esc(&m)
        );
        if r.status.is_server_error() { r.status } else { StatusCode::BAD_REQUEST }
    };
    if r.ok() {
        let rows = r.body["executions"].as_array().cloned().unwrap_or_default();
        p.body.push_str(&executions_table(&rows));
        if who.can_act && !rows.is_empty() && f.narrows() && key.is_empty() {
            p.body.push_str(&bulk_forms(&c, &s, &f).await);
        }
        if let Some(next) = r.body["nextCursor"].as_str() {
            let _ = write!(
                p.body,
                "<p><a rel=\"next\" href=\"/ui/executions?cursor={}{}\">Next page →</a></p>",
                url_enc(next),
                f.link()
            );
        }
    }
    with_csrf(&c, &s, fresh, c.finish(&s, code, p))
}

pub(super) fn executions_table(rows: &[Value]) -> String {
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
        } else if status == "FAILED" {
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
