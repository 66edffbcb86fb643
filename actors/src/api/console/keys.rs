//! The failed and quarantined executions, and API keys (list, create, revoke): each a call to
//! the API (`/executions?status=FAILED`, `/admin/quarantined`, `/admin/keys`), so a key
//! without `admin` sees the API's refusal naming the scope, and every change is audited.

use std::fmt::Write as _;

use axum::extract::{Path, RawForm, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::{Value, json};

use super::core::*;
use super::executions::executions_table;
use super::html::{esc, url_enc};

/// The scopes a key may be given (docs/security.md).
const SCOPES: [&str; 5] = ["read", "submit", "definitions", "worker", "admin"];

fn refusal(out: &mut String, id: &str, msg: &str) {
    let _ = write!(out, "<p class=\"error\" role=\"alert\" id=\"{id}\">{}</p>", esc(msg));
}

/// `GET /ui/failed`: FAILED executions (replay them from the search), quarantined timers.
pub(super) async fn failed(State(c): State<Console>, headers: HeaderMap) -> Response {
    let (s, who, fresh) = match enter(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let r = c.call(&s, Method::GET, "/executions?status=FAILED&limit=50", None).await;
    let mut p = c.page(&s, Some(&who), "Failed and quarantined");
    p.body.push_str("<h1>Failed executions</h1>");
    if r.ok() {
        let rows = r.body["executions"].as_array().cloned().unwrap_or_default();
        p.body.push_str(&executions_table(&rows));
        p.body.push_str("<p><a id=\"failed-search\" href=\"/ui/executions?status=FAILED\">Search them (and replay in bulk)</a></p>");
    } else {
        refusal(&mut p.body, "failed-error", &r.error().1);
    }
    p.body.push_str("<h2>Quarantined</h2><p class=\"readonly\">Timers the node put aside as unprocessable (a damaged record): nothing runs them until an operator looks.</p>");
    let q = c.call(&s, Method::GET, "/admin/quarantined?limit=100", None).await;
    if !q.ok() {
        refusal(&mut p.body, "quarantined-error", &q.error().1);
    } else {
        p.body.push_str("<div class=\"table-wrap\"><table id=\"quarantined\"><thead><tr><th scope=\"col\">At</th><th scope=\"col\">Namespace</th><th scope=\"col\">Execution</th><th scope=\"col\">Reason</th></tr></thead><tbody>");
        let recs = q.body["records"].as_array().cloned().unwrap_or_default();
        if recs.is_empty() {
            p.body.push_str("<tr><td colspan=\"4\">Nothing quarantined.</td></tr>");
        }
        for e in &recs {
            let _ = write!(
                p.body,
                "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
                esc(&text(&e["at"])),
                esc(&text(&e["namespace"])),
                esc(&text(&e["executionId"])),
                esc(&text(&e["reason"]))
            );
        }
        p.body.push_str("</tbody></table></div>");
    }
    with_csrf(&c, &s, fresh, c.finish(&s, StatusCode::OK, p))
}

fn keys_table(keys: &[Value], csrf: &str) -> String {
    let mut out = String::from(
        "<div class=\"table-wrap\"><table id=\"keys\"><thead><tr><th scope=\"col\">Id</th><th scope=\"col\">Name</th><th scope=\"col\">Namespace</th><th scope=\"col\">Scopes</th><th scope=\"col\">Created</th><th scope=\"col\">Revoked</th><th scope=\"col\"></th></tr></thead><tbody>",
    );
    for k in keys {
        let id = k["id"].as_str().unwrap_or_default();
        let scopes: Vec<String> = k["scopes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        let action = if k["revokedAt"].is_null() {
            format!(
                "<form method=\"post\" action=\"/ui/keys/{}/revoke\" data-confirm=\"Revoke key {}? Clients using it stop working.\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><button class=\"danger\" id=\"revoke-{}\" type=\"submit\">Revoke</button></form>",
                url_enc(id),
                esc(id),
                esc(csrf),
                esc(id)
            )
        } else {
            String::new()
        };
        let _ = write!(
            out,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{} by {}</td><td>{}</td><td>{action}</td></tr>",
            esc(id),
            esc(&text(&k["name"])),
            esc(&text(&k["namespace"])),
            esc(&scopes.join(", ")),
            esc(&text(&k["createdAt"])),
            esc(&text(&k["createdBy"])),
            esc(&text(&k["revokedAt"]))
        );
    }
    out.push_str("</tbody></table></div>");
    out
}

fn create_form(s: &Session) -> String {
    let boxes: String = SCOPES
        .iter()
        .map(|x| format!("<label class=\"check\"><input type=\"checkbox\" id=\"scope-{x}\" name=\"scopes\" value=\"{x}\">{x}</label>"))
        .collect();
    format!(
        "<h2>New key</h2><form class=\"stack\" method=\"post\" action=\"/ui/keys\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <label for=\"key-name\">Name<input id=\"key-name\" name=\"name\" placeholder=\"ci-deployer\"></label>\
         <label for=\"key-namespace\">Namespace<input id=\"key-namespace\" name=\"namespace\" value=\"{}\" placeholder=\"default, or * for every namespace\"></label>\
         <fieldset><legend>Scopes</legend>{boxes}</fieldset><button type=\"submit\" id=\"create-key\">Create key</button></form>",
        esc(s.csrf.as_deref().unwrap_or_default()),
        esc(&s.namespace)
    )
}

/// The keys page; `created`: a key just made (its token, shown once), `err`: a form error.
async fn keys_page(
    c: &Console,
    s: &Session,
    who: &Who,
    created: Option<&Value>,
    err: Option<(String, String)>,
    status: StatusCode,
) -> Response {
    let mut p = c.page(s, Some(who), "API keys");
    p.body.push_str("<h1>API keys</h1>");
    if let Some(k) = created {
        let _ = write!(
            p.body,
            "<p class=\"notice\" role=\"status\">Key <code>{}</code> created. Its token is shown this once: <code id=\"new-token\">{}</code></p>",
            esc(&text(&k["key"]["id"])),
            esc(&text(&k["token"]))
        );
    }
    if let Some((f, m)) = &err {
        let _ = write!(
            p.body,
            "<p class=\"error\" role=\"alert\" id=\"form-error\"><strong>{}</strong>: {}</p>",
            esc(f),
            esc(m)
        );
    }
    let r = c.call(s, Method::GET, "/admin/keys", None).await;
    if !r.ok() {
        refusal(&mut p.body, "keys-error", &r.error().1);
        let code = if status.is_success() { r.status } else { status };
        return c.finish(s, code, p);
    }
    let keys = r.body["keys"].as_array().cloned().unwrap_or_default();
    p.body.push_str(&keys_table(&keys, s.csrf.as_deref().unwrap_or_default()));
    p.body.push_str(&create_form(s));
    c.finish(s, status, p)
}

/// `GET /ui/keys`.
pub(super) async fn keys(State(c): State<Console>, headers: HeaderMap) -> Response {
    let (s, who, fresh) = match enter(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let resp = keys_page(&c, &s, &who, None, None, StatusCode::OK).await;
    with_csrf(&c, &s, fresh, resp)
}

/// `POST /ui/keys`: create one.
pub(super) async fn create_key(
    State(c): State<Console>,
    headers: HeaderMap,
    RawForm(body): RawForm,
) -> Response {
    let (s, who, f) = match enter_post(&c, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let scopes: Vec<&str> =
        f.iter().filter(|(k, _)| k == "scopes").map(|(_, v)| v.as_str()).collect();
    let b =
        json!({"namespace": field(&f, "namespace"), "scopes": scopes, "name": field(&f, "name")});
    let r = c.call(&s, Method::POST, "/admin/keys", Some(b)).await;
    if !r.ok() {
        let (fl, m) = r.error();
        let e = (fl.unwrap_or_else(|| "form".into()), m);
        let status = r.status;
        return keys_page(&c, &s, &who, None, Some(e), status).await;
    }
    keys_page(&c, &s, &who, Some(&r.body), None, StatusCode::CREATED).await
}

/// `POST /ui/keys/{id}/revoke`.
pub(super) async fn revoke_key(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawForm(body): RawForm,
) -> Response {
    let (s, who, _) = match enter_post(&c, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let r = c.call(&s, Method::DELETE, &format!("/admin/keys/{}", url_enc(&id)), None).await;
    if !r.ok() {
        return c.error_page(&s, Some(&who), r.status, &r.error().1);
    }
    Redirect::to("/ui/keys").into_response()
}
