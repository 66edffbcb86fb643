//! The executions search's filter (status, definition, `executeAt` window, namespace for keys
//! of every namespace) and the bulk actions over **every** execution it matches, up to
//! [`CONSOLE_BULK_MAX`] per action (the first ones in `executeAt` order; the confirmation says
//! how many and the bound).

use std::fmt::Write as _;

use axum::extract::{RawForm, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;

use super::core::*;
use super::html::{esc, url_enc};
use crate::limits::CONSOLE_BULK_MAX;

/// A search's filter, as the form and the query name its fields.
#[derive(Debug, Clone, Default)]
pub(super) struct Filter {
    pub(super) status: String,
    pub(super) definition: String,
    pub(super) from: String,
    pub(super) to: String,
    /// The namespace to search (keys of every namespace only; blank: the session's).
    pub(super) namespace: String,
}

impl Filter {
    pub(super) fn of(q: &[(String, String)]) -> Filter {
        let get = |n: &str| field(q, n).to_string();
        Filter {
            status: get("status"),
            definition: get("definition"),
            from: get("from"),
            to: get("to"),
            namespace: get("namespace"),
        }
    }

    /// Whether it narrows the search (bulk actions need that).
    pub(super) fn narrows(&self) -> bool {
        [&self.status, &self.definition, &self.from, &self.to].iter().any(|v| !v.is_empty())
    }

    /// The API query's filter part: `&status=…&definition=…&from=…&to=…`.
    pub(super) fn query(&self) -> String {
        let mut out = String::new();
        for (n, v) in [
            ("status", &self.status),
            ("definition", &self.definition),
            ("from", &self.from),
            ("to", &self.to),
        ] {
            if !v.is_empty() {
                let _ = write!(out, "&{n}={}", url_enc(v));
            }
        }
        out
    }

    /// The console link's query (the API's plus the namespace).
    pub(super) fn link(&self) -> String {
        let mut q = self.query();
        if !self.namespace.is_empty() {
            let _ = write!(q, "&namespace={}", url_enc(&self.namespace));
        }
        q.replace('&', "&amp;")
    }

    /// The session to search with: in the filter's namespace when one is given.
    pub(super) fn session(&self, s: &Session) -> Session {
        Session {
            key: s.key.clone(),
            namespace: if self.namespace.is_empty() {
                s.namespace.clone()
            } else {
                self.namespace.clone()
            },
            csrf: s.csrf.clone(),
        }
    }

    fn hidden(&self) -> String {
        [
            ("status", &self.status),
            ("definition", &self.definition),
            ("from", &self.from),
            ("to", &self.to),
            ("namespace", &self.namespace),
        ]
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(n, v)| format!("<input type=\"hidden\" name=\"{n}\" value=\"{}\">", esc(v)))
        .collect()
    }
}

/// The ids of the executions `f` matches, the first [`CONSOLE_BULK_MAX`], and whether there
/// are more; or the API's refusal.
pub(super) async fn matching(
    c: &Console,
    s: &Session,
    f: &Filter,
) -> Result<(Vec<String>, bool), Reply> {
    let uri = format!("/executions?limit={CONSOLE_BULK_MAX}{}", f.query());
    let r = c.call(&f.session(s), Method::GET, &uri, None).await;
    if !r.ok() {
        return Err(r);
    }
    let ids = r.body["executions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["executionId"].as_str().map(str::to_string))
        .collect();
    Ok((ids, !r.body["nextCursor"].is_null()))
}

fn how_many(n: usize, more: bool) -> String {
    if more {
        format!(
            "the first {n} of more than {n} executions matching this search (at most {CONSOLE_BULK_MAX} per action)"
        )
    } else {
        format!("the {n} executions matching this search (at most {CONSOLE_BULK_MAX} per action)")
    }
}

/// Bulk cancel (and, for FAILED ones, replay: the API replays only those) of everything the
/// filter matches.
pub(super) async fn bulk_forms(c: &Console, s: &Session, f: &Filter) -> String {
    let Ok((ids, more)) = matching(c, s, f).await else { return String::new() };
    if ids.is_empty() {
        return String::new();
    }
    let (t, hidden, n) = (esc(s.csrf.as_deref().unwrap_or_default()), f.hidden(), ids.len());
    let what = how_many(n, more);
    let mut out = format!(
        "<div class=\"actions\" id=\"bulk\"><form method=\"post\" action=\"/ui/executions/bulk\" data-confirm=\"Cancel {what}?\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{t}\"><input type=\"hidden\" name=\"action\" value=\"cancel\">{hidden}\
         <button class=\"danger\" id=\"bulk-cancel\" type=\"submit\">Cancel all {n}{}</button></form>",
        if more { "+" } else { "" }
    );
    if f.status.eq_ignore_ascii_case("FAILED") {
        let _ = write!(
            out,
            "<form method=\"post\" action=\"/ui/executions/bulk\" data-confirm=\"Replay {what}?\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{t}\"><input type=\"hidden\" name=\"action\" value=\"replay\">{hidden}\
             <button class=\"secondary\" id=\"bulk-replay\" type=\"submit\">Replay all {n}</button></form>"
        );
    }
    out.push_str("</div>");
    out
}

/// Cancel or replay every execution the posted filter matches (up to [`CONSOLE_BULK_MAX`]),
/// each through the API as its own call, so each is authorized and audited on its own; the
/// page says what happened to each.
pub(super) async fn bulk(
    State(c): State<Console>,
    headers: HeaderMap,
    RawForm(body): RawForm,
) -> Response {
    let (s, who, form) = match enter_post(&c, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let f = Filter::of(&form);
    let action = field(&form, "action").to_string();
    let verb = match action.as_str() {
        "cancel" => "cancelled",
        "replay" => "replayed",
        other => {
            let msg = format!("action: must be cancel or replay, not {other:?}");
            return c.error_page(&s, Some(&who), StatusCode::BAD_REQUEST, &msg);
        }
    };
    if !f.narrows() {
        let msg = "status: give a status, definition, from or to: a bulk action needs a filter";
        return c.error_page(&s, Some(&who), StatusCode::BAD_REQUEST, msg);
    }
    let (ids, more) = match matching(&c, &s, &f).await {
        Ok(x) => x,
        Err(r) => return c.error_page(&s, Some(&who), r.status, &r.error().1),
    };
    let (rows, ok, refused) = act(&c, &f.session(&s), &action, verb, &ids).await;
    let mut p = c.page(&s, Some(&who), "Bulk action");
    let _ = write!(
        p.body,
        "<h1>Bulk {}</h1><p role=\"status\" id=\"bulk-result\">{ok} {verb}, {refused} refused, of {}{}.</p>\
         <div class=\"table-wrap\"><table><thead><tr><th scope=\"col\">Execution</th><th scope=\"col\">Outcome</th></tr></thead><tbody>{rows}</tbody></table></div>\
         <p><a href=\"/ui/executions?{}\">Back to the search</a></p>",
        esc(&action),
        ids.len(),
        if more {
            format!(" (the first {CONSOLE_BULK_MAX}; more match: run it again)")
        } else {
            String::new()
        },
        f.link()
    );
    c.finish(&s, if refused == 0 { StatusCode::OK } else { StatusCode::MULTI_STATUS }, p)
}

/// Each id's API call; the result rows, and how many were done and refused.
async fn act(
    c: &Console,
    s: &Session,
    action: &str,
    verb: &str,
    ids: &[String],
) -> (String, usize, usize) {
    let (mut rows, mut ok, mut refused) = (String::new(), 0, 0);
    for id in ids {
        let (method, uri) = match action {
            "cancel" => (Method::DELETE, format!("/executions/{}", url_enc(id))),
            _ => (Method::POST, format!("/executions/{}/replay", url_enc(id))),
        };
        let r = c.call(s, method, &uri, None).await;
        let outcome = if r.ok() {
            ok += 1;
            format!("{verb} ({})", esc(r.body["status"].as_str().unwrap_or_default()))
        } else {
            refused += 1;
            format!("<span class=\"error\">{}</span>", esc(&r.error().1))
        };
        let _ = write!(
            rows,
            "<tr><td><a href=\"/ui/executions/{}\"><code>{}</code></a></td><td>{outcome}</td></tr>",
            url_enc(id),
            esc(id)
        );
    }
    (rows, ok, refused)
}

/// The search form; the namespace field only for keys of every namespace.
pub(super) fn search_form(f: &Filter, key: &str, all_namespaces: bool, session_ns: &str) -> String {
    let statuses: String = STATUSES
        .iter()
        .map(|x| {
            let sel = if f.status.eq_ignore_ascii_case(x) { " selected" } else { "" };
            format!("<option{sel}>{x}</option>")
        })
        .collect();
    let ns = if all_namespaces {
        format!(
            "<label for=\"f-namespace\">Namespace<input id=\"f-namespace\" name=\"namespace\" value=\"{}\" placeholder=\"{}\"></label>",
            esc(&f.namespace),
            esc(session_ns)
        )
    } else {
        String::new()
    };
    format!(
        "<form class=\"filters\" method=\"get\" action=\"/ui/executions\" role=\"search\">\
         <label for=\"f-status\">Status<select id=\"f-status\" name=\"status\"><option value=\"\">any</option>{statuses}</select></label>\
         <label for=\"f-definition\">Definition<input id=\"f-definition\" name=\"definition\" value=\"{}\" placeholder=\"echo\"></label>\
         <label for=\"f-from\">Due from<input id=\"f-from\" name=\"from\" value=\"{}\" placeholder=\"2026-12-01T00:00:00Z\"></label>\
         <label for=\"f-to\">Due before<input id=\"f-to\" name=\"to\" value=\"{}\" placeholder=\"2026-12-08T00:00:00Z\"></label>{ns}\
         <label for=\"f-key\">Idempotency key<input id=\"f-key\" name=\"idempotencyKey\" value=\"{}\"></label>\
         <label for=\"f-id\">Execution id<input id=\"f-id\" name=\"id\" value=\"\"></label>\
         <button type=\"submit\">Search</button></form>",
        esc(&f.definition),
        esc(&f.from),
        esc(&f.to),
        esc(key)
    )
}
