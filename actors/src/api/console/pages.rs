//! The overview, the definitions and the audit log.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use serde_json::Value;

use super::core::*;
use super::html::{esc, url_enc};

/// The namespace's definitions: name, version, queue and declared inputs.
pub(super) async fn definitions(State(c): State<Console>, headers: HeaderMap) -> Response {
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
pub(super) async fn audit(State(c): State<Console>, headers: HeaderMap) -> Response {
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
pub(super) async fn overview(State(c): State<Console>, headers: HeaderMap) -> Response {
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
    p.body.push_str(&status_chart(&counts));
    let _ = write!(
        p.body,
        "<h2>This node</h2><dl class=\"facts\"><dt>Store health</dt><dd id=\"health\"><code>{}</code></dd><dt>Readiness</dt><dd><code>{}</code></dd>\
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
    p.body.push_str("</dl>");
    p.body.push_str(&super::cluster::sections(&c, &s).await);
    p.body.push_str("</div>");
    with_csrf(&c, &s, fresh, c.finish(&s, StatusCode::OK, p))
}

/// Counts by status as a horizontal SVG bar chart (`None`: the count could not be read).
fn status_chart(counts: &[(&str, Option<(usize, bool)>)]) -> String {
    let mut out = String::new();
    let max = counts.iter().filter_map(|(_, n)| n.map(|x| x.0)).max().unwrap_or(0).max(1);
    let (bar_h, w) = (22, 560);
    let _ = write!(
        out,
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
            out,
            "<text x=\"0\" y=\"{}\" font-size=\"13\">{st}</text><rect x=\"120\" y=\"{y}\" width=\"{len}\" height=\"{bar_h}\" class=\"bar status-{st}\" fill=\"currentColor\"></rect>\
             <text x=\"{}\" y=\"{}\" font-size=\"13\">{label}</text>",
            y + 16,
            125 + len,
            y + 16
        );
    }
    out.push_str("</svg>");
    out
}
