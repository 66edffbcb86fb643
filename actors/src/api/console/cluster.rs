//! The overview's cluster sections: queues (depth, oldest READY age), this node's waiting
//! workers (streams, polls, credits per queue), nodes and shard leases (admins), and the last
//! hour's completions and start lateness as server-drawn SVG charts. Each is one call to the
//! HTTP API (`/queues`, `/workers`, `/admin/nodes`, `/last-hour`); a refused one shows the
//! API's reason in its place.

use std::fmt::Write as _;

use axum::http::Method;
use serde_json::Value;

use super::core::{Console, Session, text};
use super::html::esc;

fn refused(out: &mut String, id: &str, msg: &str) {
    let _ = write!(out, "<p class=\"readonly\" id=\"{id}\">{}</p>", esc(msg));
}

fn age(ms: i64) -> String {
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < 120_000 {
        format!("{} s", ms / 1_000)
    } else if ms < 7_200_000 {
        format!("{} min", ms / 60_000)
    } else {
        format!("{} h", ms / 3_600_000)
    }
}

fn table(out: &mut String, id: &str, heads: &[&str], rows: &[Vec<String>], empty: &str) {
    let _ = write!(out, "<div class=\"table-wrap\"><table id=\"{id}\"><thead><tr>");
    for h in heads {
        let _ = write!(out, "<th scope=\"col\">{h}</th>");
    }
    out.push_str("</tr></thead><tbody>");
    if rows.is_empty() {
        let _ = write!(out, "<tr><td colspan=\"{}\">{empty}</td></tr>", heads.len());
    }
    for r in rows {
        out.push_str("<tr>");
        for cell in r {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
}

async fn queues(c: &Console, s: &Session, out: &mut String) {
    out.push_str("<h2>Queues</h2>");
    let r = c.call(s, Method::GET, "/queues", None).await;
    if !r.ok() {
        return refused(out, "queues-refused", &r.error().1);
    }
    let rows: Vec<Vec<String>> = r.body["queues"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|q| {
            let capped = if q["depthCapped"].as_bool() == Some(true) { "+" } else { "" };
            vec![
                esc(&text(&q["queue"])),
                format!("{}{capped}", q["depth"]),
                esc(&age((q["oldestReadyAgeSeconds"].as_f64().unwrap_or(0.0) * 1e3) as i64)),
            ]
        })
        .collect();
    table(out, "queues", &["Queue", "READY", "Oldest READY for"], &rows, "No READY work.");
}

async fn workers(c: &Console, s: &Session, out: &mut String) {
    let r = c.call(s, Method::GET, "/workers", None).await;
    let _ = write!(out, "<h2>Workers on this node</h2>");
    if !r.ok() {
        return refused(out, "workers-refused", &r.error().1);
    }
    let rows: Vec<Vec<String>> = r.body["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            let limit = w["queueLimit"].as_u64().map_or("none".into(), |l| l.to_string());
            vec![
                esc(&text(&w["workerId"])),
                esc(&text(&w["queue"])),
                esc(&text(&w["kind"])),
                w["credits"].to_string(),
                limit,
            ]
        })
        .collect();
    let heads = ["Worker", "Queue", "Kind", "Credits", "Queue limit"];
    table(out, "workers", &heads, &rows, "No worker is connected to this node.");
}

async fn nodes(c: &Console, s: &Session, out: &mut String) {
    out.push_str("<h2>Nodes and shard leases</h2>");
    let r = c.call(s, Method::GET, "/admin/nodes", None).await;
    if !r.ok() {
        return refused(out, "nodes-refused", &r.error().1);
    }
    let leases = r.body["leases"].as_array().cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = r.body["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            let id = n["nodeId"].as_str().unwrap_or_default();
            let held: Vec<String> = leases
                .iter()
                .filter(|l| l["owner"].as_str() == Some(id))
                .map(|l| l["shard"].to_string())
                .collect();
            vec![
                format!("<code>{}</code>", esc(id)),
                esc(&text(&n["httpAddress"])),
                esc(&text(&n["version"])),
                esc(&text(&n["heartbeatAt"])),
                if held.is_empty() { "none".into() } else { held.join(", ") },
            ]
        })
        .collect();
    let heads = ["Node", "HTTP", "Version", "Last heartbeat", "Shards held"];
    table(out, "nodes", &heads, &rows, "No live node.");
    let _ = write!(
        out,
        "<p>{} shards; {} leased.</p>",
        r.body["shardCount"],
        leases.iter().filter(|l| !l["owner"].as_str().unwrap_or_default().is_empty()).count()
    );
}

/// One value per minute as SVG bars, with its label and the largest value on the axis.
fn minute_bars(id: &str, label: &str, values: &[(u64, Option<u64>)], unit: &str) -> String {
    let (w, h, bw) = (600u64, 120u64, 10u64);
    let max = values.iter().flat_map(|(a, b)| [*a, b.unwrap_or(0)]).max().unwrap_or(0).max(1);
    let mut out = format!(
        "<figure><svg id=\"{id}\" role=\"img\" aria-label=\"{}\" viewBox=\"0 0 {w} {}\" width=\"100%\" style=\"max-width:{w}px\">",
        esc(label),
        h + 18
    );
    for (i, (v, v2)) in values.iter().enumerate() {
        let x = i as u64 * bw;
        let bar = v * h / max;
        let _ = write!(
            out,
            "<rect x=\"{x}\" y=\"{}\" width=\"{}\" height=\"{bar}\" class=\"bar\" fill=\"currentColor\"><title>{v}{unit}</title></rect>",
            h - bar,
            bw - 2
        );
        if let Some(v2) = v2 {
            let y = h - v2 * h / max;
            let _ = write!(
                out,
                "<rect x=\"{x}\" y=\"{y}\" width=\"{}\" height=\"3\" class=\"p99\"><title>p99 {v2}{unit}</title></rect>",
                bw - 2
            );
        }
    }
    let _ = write!(
        out,
        "<line x1=\"0\" y1=\"{h}\" x2=\"{w}\" y2=\"{h}\" stroke=\"currentColor\"></line>\
         <text x=\"0\" y=\"{}\" font-size=\"12\">60 min ago</text><text x=\"{}\" y=\"{}\" font-size=\"12\">now · max {max}{unit}</text></svg>\
         <figcaption>{}</figcaption></figure>",
        h + 15,
        w - 150,
        h + 15,
        esc(label)
    );
    out
}

async fn last_hour(c: &Console, s: &Session, out: &mut String) {
    out.push_str("<h2>The last hour on this node</h2>");
    let r = c.call(s, Method::GET, "/last-hour", None).await;
    if !r.ok() {
        return refused(out, "last-hour-refused", &r.error().1);
    }
    let minutes = r.body["minutes"].as_array().cloned().unwrap_or_default();
    let ms = |v: &Value| v.as_u64().or_else(|| v.as_str().map(|_| 600_001));
    let done: Vec<(u64, Option<u64>)> =
        minutes.iter().map(|m| (m["completions"].as_u64().unwrap_or(0), None)).collect();
    let late: Vec<(u64, Option<u64>)> = minutes
        .iter()
        .map(|m| (ms(&m["latenessP50Ms"]).unwrap_or(0), ms(&m["latenessP99Ms"])))
        .collect();
    let total: u64 = done.iter().map(|d| d.0).sum();
    let started: u64 = minutes.iter().map(|m| m["started"].as_u64().unwrap_or(0)).sum();
    let _ = write!(
        out,
        "<p id=\"last-hour-totals\">{total} finished, {started} first attempts started in the last 60 minutes (this node, since it started at most).</p>"
    );
    out.push_str(&minute_bars("completions-chart", "Executions finished per minute", &done, ""));
    out.push_str(&minute_bars(
        "lateness-chart",
        "Start lateness (due → started) per minute: p50 bars, p99 marks",
        &late,
        " ms",
    ));
}

/// The cluster sections of the overview, in order.
pub(super) async fn sections(c: &Console, s: &Session) -> String {
    let mut out = String::new();
    last_hour(c, s, &mut out).await;
    queues(c, s, &mut out).await;
    workers(c, s, &mut out).await;
    nodes(c, s, &mut out).await;
    out
}
