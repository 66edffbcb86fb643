//! Editing a schedule: its form filled from the API's view, the same live preview as the
//! create form, and a `PATCH /cron-jobs/{id}` of what the form holds.

use axum::extract::{Path, RawForm, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::Value;

use super::core::*;
use super::html::url_enc;
use super::schedules::{job_body, schedule_form_for};

/// `GET /ui/schedules/{id}/edit`.
pub(super) async fn edit_form(
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
    let j = &r.body;
    let get = |n: &str| match &j[n] {
        Value::String(v) => v.clone(),
        Value::Null => String::new(),
        v => v.to_string(),
    };
    let f: Vec<(String, String)> =
        ["definitionUri", "definitionVersion", "expression", "timezone", "inputs"]
            .iter()
            .map(|n| (n.to_string(), get(n)))
            .collect();
    let resp = schedule_form_for(&c, &s, &who, &f, None, StatusCode::OK, Some(&id)).await;
    with_csrf(&c, &s, fresh, resp)
}

/// The edit form as a PATCH; a bad field re-renders the form
/// naming it.
pub(super) async fn save(
    c: &Console,
    s: &Session,
    who: &Who,
    id: &str,
    f: &[(String, String)],
) -> Response {
    let b = match job_body(f) {
        Ok(b) => b,
        Err(e) => {
            return schedule_form_for(c, s, who, f, Some(e), StatusCode::BAD_REQUEST, Some(id))
                .await;
        }
    };
    let r = c.call(s, Method::PATCH, &format!("/cron-jobs/{}", url_enc(id)), Some(b)).await;
    if !r.ok() {
        let (fl, m) = r.error();
        let e = (fl.unwrap_or_else(|| "form".into()), m);
        return schedule_form_for(c, s, who, f, Some(e), r.status, Some(id)).await;
    }
    Redirect::to(&format!("/ui/schedules/{}", url_enc(id))).into_response()
}

/// `POST /ui/schedules/{id}/edit`.
pub(super) async fn edit_post(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawForm(body): RawForm,
) -> Response {
    match enter_post(&c, &headers, &body).await {
        Ok((s, who, f)) => save(&c, &s, &who, &id, &f).await,
        Err(r) => r,
    }
}
