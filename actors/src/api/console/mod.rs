//! The web console at `/ui/`: server-rendered HTML over the node's own HTTP API.
//!
//! Every page and every action is a call to the API router in-process (the same handlers
//! `curl` reaches, see docs/api.md) with the signed-in key as its `authorization`, so the
//! console authorizes and audits exactly as the API does and cannot do anything the key
//! could not do with `curl`. The key lives in an HttpOnly, SameSite=Strict cookie scoped to
//! `/ui` (Secure when the listener is TLS); forms carry a per-session CSRF token as well.
//! Keys without `submit` see no action buttons, and their POSTs are refused by the API (403,
//! naming the missing scope). Assets are one CSS and one small script, embedded. See
//! docs/console.md and docs/decisions/ for why it is built this way.

use std::fmt::Write as _;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, RawForm, State};
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tower::ServiceExt;

mod html;
use html::{Page, esc, url_enc};

const CSS: &str = include_str!("console.css");
const JS: &str = include_str!("console.js");
const KEY_COOKIE: &str = "kairos_key";
const NS_COOKIE: &str = "kairos_ns";
const CSRF_COOKIE: &str = "kairos_csrf";
/// API responses read into the console (an execution's output is capped far below this).
const BODY_MAX: usize = 32 * 1024 * 1024;

/// The console's state: the API router it calls and whether cookies must be `Secure`.
#[derive(Clone)]
struct Console {
    api: Router,
    /// For its clock (how far ahead previews look).
    node: crate::node::Node,
    secure: bool,
}

/// The console's routes, calling `api` (the node's HTTP API router) for everything.
pub fn router(api: Router, node: crate::node::Node, secure: bool) -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(overview))
        .route("/ui/assets/console.css", get(css))
        .route("/ui/assets/console.js", get(js))
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/executions", get(executions))
        .route("/ui/executions/bulk", post(bulk))
        .route("/ui/executions/{id}", get(execution))
        .route("/ui/executions/{id}/cancel", post(cancel))
        .route("/ui/executions/{id}/replay", post(replay))
        .route("/ui/definitions", get(definitions))
        .route("/ui/audit", get(audit))
        .route("/ui/schedules", get(schedules).post(create_schedule))
        .route("/ui/schedules/new", get(new_schedule))
        .route("/ui/schedules/preview", get(preview_fragment))
        .route("/ui/schedules/{id}", get(schedule))
        .route("/ui/schedules/{id}/{action}", post(schedule_action))
        .with_state(Console { api, node, secure })
}

async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

async fn js() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], JS).into_response()
}

/// The cookies of a request, by name.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty())
}

/// A request's session: its key (none when signed out or authentication is off), the
/// namespace it works in and its CSRF token.
struct Session {
    key: Option<String>,
    namespace: String,
    csrf: Option<String>,
}

impl Session {
    fn of(headers: &HeaderMap) -> Session {
        Session {
            key: cookie(headers, KEY_COOKIE).map(str::to_string),
            namespace: cookie(headers, NS_COOKIE).unwrap_or("default").to_string(),
            csrf: cookie(headers, CSRF_COOKIE).map(str::to_string),
        }
    }
}

/// What the API answered.
struct Reply {
    status: StatusCode,
    body: Value,
}

impl Reply {
    fn ok(&self) -> bool {
        self.status.is_success()
    }

    /// The API's error: `(field, message)`.
    fn error(&self) -> (Option<String>, String) {
        let e = &self.body["error"];
        let field = e["field"].as_str().filter(|f| !f.is_empty()).map(str::to_string);
        let msg = e["message"]
            .as_str()
            .map(str::to_string)
            .or_else(|| self.body.as_str().map(str::to_string))
            .unwrap_or_else(|| self.status.to_string());
        (field, msg)
    }
}

impl Console {
    /// Calls the API as the session's key, in its namespace.
    async fn call(&self, s: &Session, method: Method, uri: &str, body: Option<Value>) -> Reply {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(k) = &s.key {
            req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        req = req.header("kairos-namespace", s.namespace.as_str());
        let body = match body {
            Some(v) => {
                req = req.header(header::CONTENT_TYPE, "application/json");
                Body::from(serde_json::to_vec(&v).unwrap_or_default())
            }
            None => Body::empty(),
        };
        let Ok(req) = req.body(body) else {
            return Reply { status: StatusCode::BAD_REQUEST, body: json!("a malformed request") };
        };
        let resp = match self.api.clone().oneshot(req).await {
            Ok(r) => r,
            Err(e) => match e {},
        };
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), BODY_MAX).await.unwrap_or_default();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Reply { status, body }
    }

    /// Who the session is, or the response that sends it to sign in.
    async fn whoami(&self, s: &Session) -> Result<Who, Response> {
        let r = self.call(s, Method::GET, "/whoami", None).await;
        if r.status == StatusCode::UNAUTHORIZED {
            return Err(Redirect::to("/ui/login").into_response());
        }
        if !r.ok() {
            return Err(self.error_page(s, None, r.status, &r.error().1));
        }
        let scopes: Vec<String> = r.body["scopes"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        Ok(Who {
            who: r.body["who"].as_str().unwrap_or_default().to_string(),
            can_act: scopes.iter().any(|x| x == "submit" || x == "admin"),
            scopes,
            auth_on: r.body["authentication"].as_bool().unwrap_or(true),
        })
    }

    fn page(&self, s: &Session, who: Option<&Who>, title: &str) -> Page {
        Page::new(
            title,
            who.map(|w| html::WhoLine {
                who: w.who.clone(),
                namespace: s.namespace.clone(),
                scopes: w.scopes.join(", "),
                signed_in: w.auth_on,
                csrf: s.csrf.clone().unwrap_or_default(),
            }),
        )
    }

    fn error_page(
        &self,
        s: &Session,
        who: Option<&Who>,
        status: StatusCode,
        msg: &str,
    ) -> Response {
        let mut p = self.page(s, who, "Error");
        let _ = write!(
            p.body,
            "<h1>{}</h1><p class=\"error\" role=\"alert\">{}</p><p><a href=\"javascript:history.back()\">Back</a></p>",
            esc(status.canonical_reason().unwrap_or("Error")),
            esc(msg)
        );
        self.finish(s, status, p)
    }

    /// The page as a response, with a CSRF cookie set if the session had none.
    fn finish(&self, _s: &Session, status: StatusCode, p: Page) -> Response {
        let mut resp = (status, axum::response::Html(p.render())).into_response();
        resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp
    }
}

/// The signed-in caller as the API describes it.
struct Who {
    who: String,
    scopes: Vec<String>,
    can_act: bool,
    auth_on: bool,
}

fn random_token() -> String {
    let mut b = [0u8; 24];
    if getrandom::fill(&mut b).is_err() {
        // No OS randomness: std's hasher keys (seeded from the OS once per thread) instead;
        // the cookies are SameSite=Strict in any case.
        use std::hash::{BuildHasher, Hasher};
        for chunk in b.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(chunk.as_ptr() as usize);
            chunk.copy_from_slice(&h.finish().to_le_bytes()[..chunk.len()]);
        }
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn set_cookie(secure: bool, name: &str, value: &str, max_age: Option<u32>) -> HeaderValue {
    let mut c = format!("{name}={value}; Path=/ui; HttpOnly; SameSite=Strict");
    if secure {
        c.push_str("; Secure");
    }
    if let Some(a) = max_age {
        let _ = write!(c, "; Max-Age={a}");
    }
    HeaderValue::from_str(&c).unwrap_or_else(|_| HeaderValue::from_static("x=; Path=/ui"))
}

/// A page handler's preamble: the session (with a CSRF token made if it had none; the cookie
/// for it is added by [`with_csrf`]) and who it is.
async fn enter(c: &Console, headers: &HeaderMap) -> Result<(Session, Who, bool), Response> {
    let mut s = Session::of(headers);
    let fresh = s.csrf.is_none();
    if fresh {
        s.csrf = Some(random_token());
    }
    let who = c.whoami(&s).await?;
    Ok((s, who, fresh))
}

fn with_csrf(c: &Console, s: &Session, fresh: bool, mut resp: Response) -> Response {
    if fresh && let Some(t) = &s.csrf {
        resp.headers_mut().append(header::SET_COOKIE, set_cookie(c.secure, CSRF_COOKIE, t, None));
    }
    resp
}

/// A form body as pairs (repeated names kept).
fn form(body: &Bytes) -> Vec<(String, String)> {
    url::form_urlencoded_parse(body)
}

mod url {
    /// `application/x-www-form-urlencoded` pairs.
    pub fn form_urlencoded_parse(b: &[u8]) -> Vec<(String, String)> {
        std::str::from_utf8(b)
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (decode(k), decode(v))
            })
            .collect()
    }

    fn decode(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < b.len() => {
                    let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                        Some(x) => {
                            out.push(x);
                            i += 2;
                        }
                        None => out.push(b'%'),
                    }
                }
                x => out.push(x),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

fn field<'a>(f: &'a [(String, String)], name: &str) -> &'a str {
    f.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.trim())
}

/// A POST's preamble: the session, who it is, and the form once its CSRF token matches.
async fn enter_post(
    c: &Console,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Session, Who, Vec<(String, String)>), Response> {
    let s = Session::of(headers);
    let who = c.whoami(&s).await?;
    let f = form(body);
    let sent = field(&f, "csrf");
    if s.csrf.as_deref().is_none_or(|t| t != sent) {
        return Err(c.error_page(
            &s,
            Some(&who),
            StatusCode::FORBIDDEN,
            "the form's csrf token does not match this session: reload the page and try again",
        ));
    }
    Ok((s, who, f))
}

// ---- sign-in ----

async fn login_form(State(c): State<Console>, headers: HeaderMap) -> Response {
    let s = Session::of(&headers);
    login_page(&c, &s, None, "", &s.namespace.clone(), StatusCode::OK)
}

fn login_page(
    c: &Console,
    s: &Session,
    err: Option<(&str, &str)>,
    _key: &str,
    ns: &str,
    status: StatusCode,
) -> Response {
    let mut p = c.page(s, None, "Sign in");
    p.body.push_str("<h1>Sign in</h1>");
    if let Some((f, m)) = err {
        let _ = write!(
            p.body,
            "<p class=\"error\" role=\"alert\" id=\"form-error\"><strong>{}</strong>: {}</p>",
            esc(f),
            esc(m)
        );
    }
    let _ = write!(
        p.body,
        "<form class=\"stack\" method=\"post\" action=\"/ui/login\">\
         <label for=\"apiKey\">API key<input id=\"apiKey\" name=\"apiKey\" type=\"password\" autocomplete=\"off\" required placeholder=\"kai_…\" autofocus></label>\
         <label for=\"namespace\">Namespace<input id=\"namespace\" name=\"namespace\" value=\"{}\" placeholder=\"the key's own, or default\"></label>\
         <button type=\"submit\">Sign in</button></form>\
         <p class=\"readonly\">The key is kept in an HttpOnly cookie for this console only; its namespace and scopes decide what is shown and allowed.</p>",
        esc(ns)
    );
    c.finish(s, status, p)
}

async fn login(State(c): State<Console>, headers: HeaderMap, RawForm(body): RawForm) -> Response {
    let f = form(&body);
    let key = field(&f, "apiKey").to_string();
    let mut ns = field(&f, "namespace").to_string();
    let blank = Session { key: None, namespace: "default".into(), csrf: None };
    let _ = &headers;
    if key.is_empty() {
        return login_page(
            &c,
            &blank,
            Some(("apiKey", "is required")),
            "",
            &ns,
            StatusCode::BAD_REQUEST,
        );
    }
    let probe = Session { key: Some(key.clone()), namespace: "default".into(), csrf: None };
    let r = c.call(&probe, Method::GET, "/whoami", None).await;
    if !r.ok() {
        return login_page(
            &c,
            &blank,
            Some(("apiKey", &r.error().1)),
            "",
            &ns,
            StatusCode::UNAUTHORIZED,
        );
    }
    let key_ns = r.body["namespace"].as_str().unwrap_or("*").to_string();
    if ns.is_empty() {
        ns = if key_ns == "*" { "default".into() } else { key_ns };
    }
    let probe = Session { key: Some(key.clone()), namespace: ns.clone(), csrf: None };
    let r = c.call(&probe, Method::GET, "/executions?limit=1", None).await;
    if !r.ok() {
        let (_, msg) = r.error();
        return login_page(&c, &blank, Some(("namespace", &msg)), "", &ns, StatusCode::FORBIDDEN);
    }
    let mut resp = Redirect::to("/ui/executions").into_response();
    let h = resp.headers_mut();
    h.append(header::SET_COOKIE, set_cookie(c.secure, KEY_COOKIE, &key, None));
    h.append(header::SET_COOKIE, set_cookie(c.secure, NS_COOKIE, &ns, None));
    h.append(header::SET_COOKIE, set_cookie(c.secure, CSRF_COOKIE, &random_token(), None));
    resp
}

async fn logout(State(c): State<Console>) -> Response {
    let mut resp = Redirect::to("/ui/login").into_response();
    for name in [KEY_COOKIE, NS_COOKIE, CSRF_COOKIE] {
        resp.headers_mut().append(header::SET_COOKIE, set_cookie(c.secure, name, "", Some(0)));
    }
    resp
}

// ---- executions ----

/// The statuses of an execution (docs/state-machines.md), as the API names them.
const STATUSES: [&str; 7] =
    ["SCHEDULED", "READY", "RUNNING", "RETRY_WAIT", "SUCCEEDED", "FAILED", "CANCELLED"];

fn status_badge(s: &str) -> String {
    format!("<span class=\"status status-{0}\">{0}</span>", esc(s))
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "—".into(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

async fn executions(
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
    let _ = write!(
        p.body,
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
        esc(&definition),
        esc(&key)
    );
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
        p.body.push_str("<div class=\"table-wrap\" id=\"executions-live\" data-live><table id=\"executions\"><thead><tr><th scope=\"col\">Execution</th><th scope=\"col\">Definition</th><th scope=\"col\">Status</th><th scope=\"col\">Execute at</th><th scope=\"col\">Attempts</th><th scope=\"col\">Idempotency key</th></tr></thead><tbody>");
        if rows.is_empty() {
            p.body.push_str("<tr><td colspan=\"6\">No executions match.</td></tr>");
        }
        for e in &rows {
            let id = e["executionId"].as_str().unwrap_or_default();
            let _ = write!(
                p.body,
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
        p.body.push_str("</tbody></table></div>");
        let ids: Vec<&str> = rows.iter().filter_map(|e| e["executionId"].as_str()).collect();
        if who.can_act && !ids.is_empty() && (!status.is_empty() || !definition.is_empty()) {
            let hidden: String = ids
                .iter()
                .map(|id| format!("<input type=\"hidden\" name=\"id\" value=\"{}\">", esc(id)))
                .collect();
            let t = esc(s.csrf.as_deref().unwrap_or_default());
            let n = ids.len();
            let _ = write!(
                p.body,
                "<div class=\"actions\" id=\"bulk\"><form method=\"post\" action=\"/ui/executions/bulk\" data-confirm=\"Cancel the {n} executions shown?\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{t}\"><input type=\"hidden\" name=\"action\" value=\"cancel\">{hidden}\
                 <button class=\"danger\" id=\"bulk-cancel\" type=\"submit\">Cancel these {n}</button></form>\
                 <form method=\"post\" action=\"/ui/executions/bulk\" data-confirm=\"Replay the {n} executions shown?\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{t}\"><input type=\"hidden\" name=\"action\" value=\"replay\">{hidden}\
                 <button class=\"secondary\" id=\"bulk-replay\" type=\"submit\">Replay these {n}</button></form></div>"
            );
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

async fn execution(
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
    let _ = write!(
        p.body,
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
    p.body.push_str("<h2>Attempts</h2><div class=\"table-wrap\"><table id=\"attempts\"><thead><tr><th scope=\"col\">#</th><th scope=\"col\">Status</th><th scope=\"col\">Worker</th><th scope=\"col\">Started</th><th scope=\"col\">Ended</th><th scope=\"col\">Error</th></tr></thead><tbody>");
    let attempts = e["attempts"].as_array().cloned().unwrap_or_default();
    if attempts.is_empty() {
        p.body.push_str("<tr><td colspan=\"6\">No attempt yet.</td></tr>");
    }
    for a in &attempts {
        let _ = write!(
            p.body,
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&text(&a["number"])),
            status_badge(a["status"].as_str().unwrap_or_default()),
            esc(&text(&a["workerId"])),
            esc(&text(&a["startedAt"])),
            esc(&text(&a["endedAt"])),
            esc(&a["error"]["message"].as_str().map_or("—".into(), str::to_string))
        );
    }
    p.body.push_str("</tbody></table></div>");
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

async fn cancel(
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

async fn replay(
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
async fn bulk(State(c): State<Console>, headers: HeaderMap, RawForm(body): RawForm) -> Response {
    let (s, who, f) = match enter_post(&c, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let action = field(&f, "action").to_string();
    let ids: Vec<&str> = f.iter().filter(|(k, _)| k == "id").map(|(_, v)| v.as_str()).collect();
    if ids.is_empty() || ids.len() > BULK_MAX {
        let msg = format!("id: give 1 to {BULK_MAX} executions, not {}", ids.len());
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

/// The most executions one bulk action takes (one page of the search).
const BULK_MAX: usize = 50;

// ---- definitions and the audit log ----

/// The namespace's definitions: name, version, queue and declared inputs.
async fn definitions(State(c): State<Console>, headers: HeaderMap) -> Response {
    let (s, who, fresh) = match enter(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let r = c.call(&s, Method::GET, "/definitions", None).await;
    let mut p = c.page(&s, Some(&who), "Definitions");
    p.body.push_str("<h1>Definitions</h1>");
    if !r.ok() {
        let _ = write!(p.body, "<p class=\"error\" role=\"alert\">{}</p>", esc(&r.error().1));
        return with_csrf(&c, &s, fresh, c.finish(&s, r.status, p));
    }
    p.body.push_str("<div class=\"table-wrap\"><table id=\"definitions\"><thead><tr><th scope=\"col\">Definition</th><th scope=\"col\">Version</th><th scope=\"col\">Queue</th><th scope=\"col\">Inputs</th><th scope=\"col\">Executions</th></tr></thead><tbody>");
    let defs = r.body["definitions"].as_array().cloned().unwrap_or_default();
    if defs.is_empty() {
        p.body.push_str("<tr><td colspan=\"5\">No definitions.</td></tr>");
    }
    for d in &defs {
        let name = d["name"].as_str().unwrap_or_default();
        let inputs = match &d["inputs"] {
            Value::Object(m) if !m.is_empty() => m
                .iter()
                .map(|(k, v)| format!("<code>{}</code>: {}", esc(k), esc(&text(v))))
                .collect::<Vec<_>>()
                .join("<br>"),
            _ => "none".into(),
        };
        let _ = write!(
            p.body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{inputs}</td><td><a href=\"/ui/executions?definition={}\">search</a> · <a href=\"/ui/executions?definition={}&amp;status=FAILED\">failed</a></td></tr>",
            esc(name),
            esc(&text(&d["version"])),
            esc(&text(&d["queue"])),
            url_enc(name),
            url_enc(name)
        );
    }
    p.body.push_str("</tbody></table></div>");
    with_csrf(&c, &s, fresh, c.finish(&s, StatusCode::OK, p))
}

/// The audit log of the namespace (the API's `/audit`, which needs `admin`).
async fn audit(State(c): State<Console>, headers: HeaderMap) -> Response {
    let (s, who, fresh) = match enter(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let r = c.call(&s, Method::GET, "/audit?limit=200", None).await;
    let mut p = c.page(&s, Some(&who), "Audit log");
    p.body.push_str("<h1>Audit log</h1>");
    if !r.ok() {
        let _ = write!(
            p.body,
            "<p class=\"error\" role=\"alert\" id=\"audit-error\">{}</p>",
            esc(&r.error().1)
        );
        return with_csrf(&c, &s, fresh, c.finish(&s, r.status, p));
    }
    p.body.push_str("<div class=\"table-wrap\" id=\"audit-live\" data-live><table id=\"audit\"><thead><tr><th scope=\"col\">At</th><th scope=\"col\">Who</th><th scope=\"col\">Action</th><th scope=\"col\">Target</th><th scope=\"col\">Detail</th></tr></thead><tbody>");
    for e in r.body["entries"].as_array().cloned().unwrap_or_default() {
        let _ = write!(
            p.body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
            esc(&text(&e["at"])),
            esc(&text(&e["who"])),
            esc(&text(&e["action"])),
            esc(&text(&e["target"])),
            esc(&text(&e["detail"]))
        );
    }
    p.body.push_str("</tbody></table></div>");
    with_csrf(&c, &s, fresh, c.finish(&s, StatusCode::OK, p))
}

// ---- overview ----

/// How many executions of `status` there are, counting up to `cap` (a page of the API's).
async fn count(c: &Console, s: &Session, status: &str, cap: usize) -> Option<(usize, bool)> {
    let r = c.call(s, Method::GET, &format!("/executions?status={status}&limit={cap}"), None).await;
    if !r.ok() {
        return None;
    }
    let n = r.body["executions"].as_array().map_or(0, Vec::len);
    Some((n, !r.body["nextCursor"].is_null()))
}

/// The `q`-quantile of a Prometheus histogram `name` in `metrics` (the upper bound of the
/// bucket it falls in), and its count.
fn quantile(metrics: &str, name: &str, q: f64) -> Option<(f64, u64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter_map(|rest| {
            let (le, v) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, v.trim().parse().ok()?))
        })
        .collect();
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let at = buckets.iter().find(|(_, n)| *n >= q * total)?;
    Some((at.0, total as u64))
}

fn metric_sum(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn seconds(s: f64) -> String {
    if s.is_infinite() {
        "over 10 min".into()
    } else if s < 1.0 {
        format!("≤ {:.1} ms", s * 1000.0)
    } else {
        format!("≤ {s} s")
    }
}

/// Executions by status (an SVG bar chart), this node's health, shards and counters, and
/// lateness quantiles from its histograms (since the node started).
async fn overview(State(c): State<Console>, headers: HeaderMap) -> Response {
    let (s, who, fresh) = match enter(&c, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    const CAP: usize = 500;
    let mut counts = Vec::new();
    for st in STATUSES {
        counts.push((st, count(&c, &s, st, CAP).await));
    }
    let health = c.call(&s, Method::GET, "/healthz", None).await;
    let ready = c.call(&s, Method::GET, "/readyz", None).await;
    let metrics = c.call(&s, Method::GET, "/metrics", None).await;
    let metrics = metrics.body.as_str().unwrap_or_default().to_string();
    let mut p = c.page(&s, Some(&who), "Overview");
    p.body.push_str("<h1>Overview</h1><div id=\"overview-live\" data-live>");
    let _ = write!(
        p.body,
        "<h2>Executions by status</h2><p class=\"readonly\">In namespace {}; counted up to {CAP} each.</p>",
        esc(&s.namespace)
    );
    let max = counts.iter().filter_map(|(_, n)| n.map(|x| x.0)).max().unwrap_or(0).max(1);
    let (bar_h, w) = (22, 560);
    let _ = write!(
        p.body,
        "<svg id=\"status-chart\" role=\"img\" aria-label=\"Executions by status\" viewBox=\"0 0 {w} {}\" width=\"100%\" style=\"max-width:{w}px\">",
        counts.len() * (bar_h + 6)
    );
    for (i, (st, n)) in counts.iter().enumerate() {
        let y = i * (bar_h + 6);
        let (v, more) = n.unwrap_or((0, false));
        let len = 1 + v * 330 / max;
        let label = match n {
            None => "—".to_string(),
            Some(_) if more => format!("{v}+"),
            Some(_) => v.to_string(),
        };
        let _ = write!(
            p.body,
            "<text x=\"0\" y=\"{}\" font-size=\"13\">{st}</text><rect x=\"120\" y=\"{y}\" width=\"{len}\" height=\"{bar_h}\" class=\"bar status-{st}\" fill=\"currentColor\"></rect>\
             <text x=\"{}\" y=\"{}\" font-size=\"13\">{label}</text>",
            y + 16,
            125 + len,
            y + 16
        );
    }
    p.body.push_str("</svg>");
    let _ = write!(
        p.body,
        "<h2>This node</h2><dl class=\"facts\"><dt>Health</dt><dd id=\"health\"><code>{}</code></dd><dt>Readiness</dt><dd><code>{}</code></dd>\
         <dt>Shard leases held</dt><dd>{}</dd><dt>Submitted</dt><dd>{}</dd><dt>Claimed by workers</dt><dd>{}</dd><dt>Timers fired</dt><dd>{}</dd>\
         <dt>Quarantined</dt><dd>{}</dd><dt>Cron missed / skipped</dt><dd>{} / {}</dd>",
        esc(health.body.as_str().unwrap_or_default().trim()),
        esc(ready.body.as_str().unwrap_or_default().trim()),
        metric_sum(&metrics, "kairos_shards_owned"),
        metric_sum(&metrics, "kairos_submitted_total"),
        metric_sum(&metrics, "kairos_claimed_total"),
        metric_sum(&metrics, "kairos_timers_fired_total"),
        metric_sum(&metrics, "kairos_quarantined_total"),
        metric_sum(&metrics, "kairos_cron_missed_total"),
        metric_sum(&metrics, "kairos_cron_skipped_overlap_total"),
    );
    for (label, name) in [
        ("Lateness, due → ready", "kairos_lateness_ready_seconds"),
        ("Lateness, due → started", "kairos_lateness_start_seconds"),
    ] {
        let text = match (quantile(&metrics, name, 0.5), quantile(&metrics, name, 0.99)) {
            (Some((p50, n)), Some((p99, _))) => format!(
                "p50 {} · p99 {} (of {n}, since the node started)",
                seconds(p50),
                seconds(p99)
            ),
            _ => "no executions yet".into(),
        };
        let _ = write!(p.body, "<dt>{label}</dt><dd>{}</dd>", esc(&text));
    }
    p.body.push_str("</dl></div>");
    with_csrf(&c, &s, fresh, c.finish(&s, StatusCode::OK, p))
}

// ---- schedules ----

/// How far ahead previews look for occurrences (five years).
const PREVIEW_AHEAD_MS: i64 = 5 * 366 * 86_400_000;

/// The occurrences of an expression as a table: each in the zone and in UTC, with the ones
/// whose UTC offset differs from the one before marked as across a DST change.
async fn occurrences_table(
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
        "<table class=\"occurrences\"><thead><tr><th scope=\"col\">In the schedule's zone</th><th scope=\"col\">UTC</th><th scope=\"col\"></th></tr></thead><tbody>",
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
    out.push_str("</tbody></table>");
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

async fn schedules(State(c): State<Console>, headers: HeaderMap) -> Response {
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

async fn preview_fragment(
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

async fn new_schedule(
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

async fn schedule_form(
    c: &Console,
    s: &Session,
    who: &Who,
    f: &[(String, String)],
    err: Option<(String, String)>,
    status: StatusCode,
) -> Response {
    let mut p = c.page(s, Some(who), "New schedule");
    p.body.push_str("<h1>New schedule</h1>");
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
    let _ = write!(
        p.body,
        "<form class=\"stack\" method=\"post\" action=\"/ui/schedules\" data-preview=\"/ui/schedules/preview\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <label for=\"cronJobId\">Id (optional)<input id=\"cronJobId\" name=\"cronJobId\" value=\"{}\"></label>\
         <label for=\"definitionUri\">Definition<input id=\"definitionUri\" name=\"definitionUri\" value=\"{}\" placeholder=\"registry://jobs/echo\" required></label>\
         <label for=\"definitionVersion\">Definition version<input id=\"definitionVersion\" name=\"definitionVersion\" value=\"{}\" inputmode=\"numeric\"></label>\
         <label for=\"expression\">Cron expression<input id=\"expression\" name=\"expression\" value=\"{}\" placeholder=\"0 9 * * MON-FRI\" required></label>\
         <label for=\"timezone\">Time zone<input id=\"timezone\" name=\"timezone\" value=\"{}\" placeholder=\"Europe/Berlin\"></label>\
         <label for=\"inputs\">Inputs (JSON)<textarea id=\"inputs\" name=\"inputs\" rows=\"3\">{}</textarea></label>\
         <button type=\"submit\" id=\"create\">Create</button></form>\
         <h2>Next occurrences</h2><div id=\"preview\" aria-live=\"polite\">",
        esc(s.csrf.as_deref().unwrap_or_default()),
        v("cronJobId"),
        v("definitionUri"),
        version,
        v("expression"),
        tz,
        inputs
    );
    if !field(f, "expression").is_empty() {
        p.body.push_str(
            &occurrences_table(c, s, field(f, "expression"), field(f, "timezone"), 5).await,
        );
    } else {
        p.body
            .push_str("<p class=\"readonly\">Type an expression to see its next occurrences.</p>");
    }
    p.body.push_str("</div>");
    c.finish(s, status, p)
}

async fn create_schedule(
    State(c): State<Console>,
    headers: HeaderMap,
    RawForm(body): RawForm,
) -> Response {
    let (s, who, f) = match enter_post(&c, &headers, &body).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let bad = |fl: &str, m: &str| Some((fl.to_string(), m.to_string()));
    let version = match field(&f, "definitionVersion") {
        "" => Ok(1),
        v => {
            v.parse::<u32>().map_err(|_| bad("definitionVersion", "must be a whole number from 1"))
        }
    };
    let inputs = match field(&f, "inputs") {
        "" => Ok(json!({})),
        t => serde_json::from_str::<Value>(t)
            .map_err(|e| bad("inputs", &format!("is not JSON: {e}")))
            .and_then(|v| {
                if v.is_object() { Ok(v) } else { Err(bad("inputs", "must be a JSON object")) }
            }),
    };
    let (version, inputs) = match (version, inputs) {
        (Ok(v), Ok(i)) => (v, i),
        (Err(e), _) | (_, Err(e)) => {
            return schedule_form(&c, &s, &who, &f, e, StatusCode::BAD_REQUEST).await;
        }
    };
    let mut b = json!({
        "definitionUri": field(&f, "definitionUri"),
        "definitionVersion": version,
        "expression": field(&f, "expression"),
        "timezone": if field(&f, "timezone").is_empty() { "UTC" } else { field(&f, "timezone") },
        "inputs": inputs,
    });
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

async fn schedule(
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
    if who.can_act {
        let t = esc(s.csrf.as_deref().unwrap_or_default());
        let idu = url_enc(&id);
        p.body.push_str("<div class=\"actions\">");
        if status == "PAUSED" {
            let _ = write!(
                p.body,
                "<form method=\"post\" action=\"/ui/schedules/{idu}/resume\"><input type=\"hidden\" name=\"csrf\" value=\"{t}\"><label class=\"check\"><input type=\"checkbox\" name=\"catchUp\" value=\"true\">catch up</label><button id=\"resume\" type=\"submit\">Resume</button></form>"
            );
        } else {
            let _ = write!(
                p.body,
                "<form method=\"post\" action=\"/ui/schedules/{idu}/pause\"><input type=\"hidden\" name=\"csrf\" value=\"{t}\"><label for=\"reason\">Reason<input id=\"reason\" name=\"reason\" placeholder=\"why (kept in the notes)\"></label><button id=\"pause\" type=\"submit\">Pause</button></form>"
            );
        }
        let _ = write!(
            p.body,
            "<form method=\"post\" action=\"/ui/schedules/{idu}/backfill\"><input type=\"hidden\" name=\"csrf\" value=\"{t}\">\
             <label for=\"from\">Backfill from<input id=\"from\" name=\"from\" placeholder=\"2026-11-01T00:00:00Z\"></label>\
             <label for=\"until\">until<input id=\"until\" name=\"until\" placeholder=\"2026-12-01T00:00:00Z\"></label>\
             <button class=\"secondary\" id=\"backfill\" type=\"submit\">Backfill</button></form>"
        );
        let _ = write!(
            p.body,
            "<form method=\"post\" action=\"/ui/schedules/{idu}/trigger\"><input type=\"hidden\" name=\"csrf\" value=\"{t}\"><button class=\"secondary\" id=\"trigger\" type=\"submit\">Trigger now</button></form>"
        );
        let _ = write!(
            p.body,
            "<form method=\"post\" action=\"/ui/schedules/{idu}/delete\" data-confirm=\"Delete this schedule?\"><input type=\"hidden\" name=\"csrf\" value=\"{t}\"><button class=\"danger\" id=\"delete\" type=\"submit\">Delete</button></form>"
        );
        p.body.push_str("</div>");
    } else {
        p.body.push_str("<p class=\"readonly\" id=\"read-only\">Read-only: this key has no <code>submit</code> scope.</p>");
    }
    let runs =
        c.call(&s, Method::GET, &format!("/cron-jobs/{}/runs?limit=20", url_enc(&id)), None).await;
    p.body.push_str("<h2>Last runs</h2><div class=\"table-wrap\" id=\"runs-live\" data-live><table id=\"runs\"><thead><tr><th scope=\"col\">Occurrence</th><th scope=\"col\">Execution</th><th scope=\"col\">Status</th></tr></thead><tbody>");
    let list = runs.body["runs"]
        .as_array()
        .or_else(|| runs.body["executions"].as_array())
        .cloned()
        .unwrap_or_default();
    if list.is_empty() {
        p.body.push_str("<tr><td colspan=\"3\">No runs yet.</td></tr>");
    }
    for e in &list {
        let eid = e["executionId"].as_str().unwrap_or_default();
        let _ = write!(
            p.body,
            "<tr><td>{}</td><td><a href=\"/ui/executions/{}\"><code>{}</code></a></td><td>{}</td></tr>",
            esc(&text(&e["cronOccurrence"])),
            url_enc(eid),
            esc(eid),
            status_badge(e["status"].as_str().unwrap_or_default())
        );
    }
    p.body.push_str("</tbody></table></div>");
    with_csrf(&c, &s, fresh, c.finish(&s, StatusCode::OK, p))
}

async fn schedule_action(
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
        "pause" => {
            let r = c.call(&s, Method::POST, &format!("{base}/pause"), None).await;
            let reason = field(&f, "reason");
            if r.ok() && !reason.is_empty() {
                // The API's pause takes no reason: it is kept in the schedule's notes.
                c.call(
                    &s,
                    Method::PATCH,
                    &base,
                    Some(json!({ "notes": format!("paused: {reason}") })),
                )
                .await
            } else {
                r
            }
        }
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
                let occ: Vec<String> = r.body["occurrences"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|v| v.as_str().map(esc)).collect())
                    .unwrap_or_default();
                let mut p = c.page(&s, Some(&who), "Backfill");
                let _ = write!(
                    p.body,
                    "<h1>Backfill of <a href=\"/ui/schedules/{}\">{}</a></h1><p role=\"status\" id=\"backfill-result\">{} occurrences submitted.</p><ul>{}</ul>",
                    url_enc(&id),
                    esc(&id),
                    occ.len(),
                    occ.iter().map(|o| format!("<li>{o}</li>")).collect::<String>()
                );
                return c.finish(&s, StatusCode::OK, p);
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
