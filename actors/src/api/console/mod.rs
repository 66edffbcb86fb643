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

use axum::Router;
use axum::response::Redirect;
use axum::routing::{get, post};

mod cluster;
mod core;
mod edit;
mod executions;
mod filter;
mod html;
mod keys;
mod pages;
mod runs;
mod schedules;
use self::core::{Console, css, js, login, login_form, logout};
use executions::{cancel, execution, executions, replay};
use filter::bulk;
use pages::{audit, definitions, overview};
use schedules::{
    create_schedule, new_schedule, preview_fragment, schedule, schedule_action, schedules,
};

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
        .route("/ui/failed", get(keys::failed))
        .route("/ui/keys", get(keys::keys).post(keys::create_key))
        .route("/ui/keys/{id}/revoke", post(keys::revoke_key))
        .route("/ui/schedules", get(schedules).post(create_schedule))
        .route("/ui/schedules/new", get(new_schedule))
        .route("/ui/schedules/preview", get(preview_fragment))
        .route("/ui/schedules/{id}", get(schedule))
        .route("/ui/schedules/{id}/edit", get(edit::edit_form).post(edit::edit_post))
        .route("/ui/schedules/{id}/{action}", post(schedule_action))
        .with_state(Console { api, node, secure })
}
