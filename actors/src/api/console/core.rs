//! What the console's pages share: its state, sessions (cookies, CSRF), the in-process API
//! calls, the page frame, and signing in and out.

use std::fmt::Write as _;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{RawForm, State};
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::{Value, json};
use tower::ServiceExt;

use super::html::{Page, esc};

pub(super) const CSS: &str = include_str!("console.css");
pub(super) const JS: &str = include_str!("console.js");
pub(super) const KEY_COOKIE: &str = "kairos_key";
pub(super) const NS_COOKIE: &str = "kairos_ns";
pub(super) const CSRF_COOKIE: &str = "kairos_csrf";

/// The console's state: the API router it calls and whether cookies must be `Secure`.
#[derive(Clone)]
pub(super) struct Console {
    pub(super) api: Router,
    /// For its clock (how far ahead previews look).
    pub(super) node: crate::node::Node,
    pub(super) secure: bool,
}

pub(super) async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

pub(super) async fn js() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], JS).into_response()
}

/// The cookies of a request, by name.
pub(super) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
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
pub(super) struct Session {
    pub(super) key: Option<String>,
    pub(super) namespace: String,
    pub(super) csrf: Option<String>,
}

impl Session {
    pub(super) fn of(headers: &HeaderMap) -> Session {
        Session {
            key: cookie(headers, KEY_COOKIE).map(str::to_string),
            namespace: cookie(headers, NS_COOKIE).unwrap_or("default").to_string(),
            csrf: cookie(headers, CSRF_COOKIE).map(str::to_string),
        }
    }
}

/// What the API answered.
pub(super) struct Reply {
    pub(super) status: StatusCode,
    pub(super) body: Value,
}

impl Reply {
    pub(super) fn ok(&self) -> bool {
        self.status.is_success()
    }

    /// The API's error: `(field, message)`.
    pub(super) fn error(&self) -> (Option<String>, String) {
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
    pub(super) async fn call(
        &self,
        s: &Session,
        method: Method,
        uri: &str,
        body: Option<Value>,
    ) -> Reply {
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
        let bytes =
            axum::body::to_bytes(resp.into_body(), crate::limits::CONSOLE_API_REPLY_BYTES_MAX)
                .await
                .unwrap_or_default();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Reply { status, body }
    }

    /// Who the session is, or the response that sends it to sign in.
    pub(super) async fn whoami(&self, s: &Session) -> Result<Who, Response> {
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
            key_namespace: r.body["namespace"].as_str().unwrap_or("*").to_string(),
            scopes,
            auth_on: r.body["authentication"].as_bool().unwrap_or(true),
        })
    }

    pub(super) fn page(&self, s: &Session, who: Option<&Who>, title: &str) -> Page {
        Page::new(
            title,
            who.map(|w| super::html::WhoLine {
                who: w.who.clone(),
                namespace: s.namespace.clone(),
                scopes: w.scopes.join(", "),
                signed_in: w.auth_on,
                csrf: s.csrf.clone().unwrap_or_default(),
            }),
        )
    }

    pub(super) fn error_page(
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
    pub(super) fn finish(&self, _s: &Session, status: StatusCode, p: Page) -> Response {
        let mut resp = (status, axum::response::Html(p.render())).into_response();
        resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp
    }
}

/// The signed-in caller as the API describes it.
pub(super) struct Who {
    pub(super) who: String,
    pub(super) scopes: Vec<String>,
    pub(super) can_act: bool,
    pub(super) auth_on: bool,
    /// The key's namespace (`*`: every namespace).
    pub(super) key_namespace: String,
}

pub(super) fn random_token() -> String {
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

pub(super) fn set_cookie(
    secure: bool,
    name: &str,
    value: &str,
    max_age: Option<u32>,
) -> HeaderValue {
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
pub(super) async fn enter(
    c: &Console,
    headers: &HeaderMap,
) -> Result<(Session, Who, bool), Response> {
    let mut s = Session::of(headers);
    let fresh = s.csrf.is_none();
    if fresh {
        s.csrf = Some(random_token());
    }
    let who = c.whoami(&s).await?;
    Ok((s, who, fresh))
}

pub(super) fn with_csrf(c: &Console, s: &Session, fresh: bool, mut resp: Response) -> Response {
    if fresh && let Some(t) = &s.csrf {
        resp.headers_mut().append(header::SET_COOKIE, set_cookie(c.secure, CSRF_COOKIE, t, None));
    }
    resp
}

/// A form body as pairs (repeated names kept).
pub(super) fn form(body: &Bytes) -> Vec<(String, String)> {
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

    pub(super) fn decode(s: &str) -> String {
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

pub(super) fn field<'a>(f: &'a [(String, String)], name: &str) -> &'a str {
    f.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.trim())
}

/// A POST's preamble: the session, who it is, and the form once its CSRF token matches.
pub(super) async fn enter_post(
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

pub(super) async fn login_form(State(c): State<Console>, headers: HeaderMap) -> Response {
    let s = Session::of(&headers);
    login_page(&c, &s, None, "", &s.namespace.clone(), StatusCode::OK)
}

pub(super) fn login_page(
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

pub(super) async fn login(
    State(c): State<Console>,
    headers: HeaderMap,
    RawForm(body): RawForm,
) -> Response {
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

pub(super) async fn logout(State(c): State<Console>) -> Response {
    let mut resp = Redirect::to("/ui/login").into_response();
    for name in [KEY_COOKIE, NS_COOKIE, CSRF_COOKIE] {
        resp.headers_mut().append(header::SET_COOKIE, set_cookie(c.secure, name, "", Some(0)));
    }
    resp
}

// ---- shared by the pages ----

/// The statuses of an execution (docs/state-machines.md), as the API names them.
pub(super) const STATUSES: [&str; 7] =
    ["SCHEDULED", "READY", "RUNNING", "RETRY_WAIT", "SUCCEEDED", "FAILED", "CANCELLED"];

pub(super) fn status_badge(s: &str) -> String {
    format!("<span class=\"status status-{0}\">{0}</span>", esc(s))
}

pub(super) fn text(v: &Value) -> String {
    match v {
        Value::Null => "—".into(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}
