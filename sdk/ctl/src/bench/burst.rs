//! s2 — burst, and s5 — recovery.
//!
//! s2: workers first; then `--count` executions all due at one instant T = submission start +
//! `--lead-ms`, through `SubmitBatch`; then collect until every acknowledged execution has
//! started once (or `--timeout`). s5: the same burst (default 50,000); once `--kill-at` of them
//! have started, SIGKILL the node and restart it at once on the same data dir and ports (the
//! data dir keeps the node id), and collect until every acknowledged execution has started.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use kairos_proto::v1::submit_request::When;
use serde_json::{Value, json};

use super::env::{Env, describe, node_usage};
use super::progress::Progress;
use super::stats::{Report, int, ms, rate, round1};
use super::submit::{self, Make, OnOk};
use super::track::Outcome;
use super::workers::{now_ms, now_us};

/// After everything started: how long to keep reading for immediate duplicates.
const GRACE: Duration = Duration::from_millis(500);

struct Crash {
    started_at_kill: usize,
    kill_us: i64,
    restart_us: i64,
    up: Duration,
}

pub async fn run(env: &mut Env, recovery: bool) -> Result<Report> {
    let a = env.args.clone();
    let (count, lead) = (a.count(), a.lead_ms());
    env.start_workers().await?;
    let _ = env.tracker.reset();
    let s0 = env.sample();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(a.timeout_s);
    let due = now_ms() + lead as i64;

    let bar = Progress::start("submit", count, env.progress);
    let (run, c0) = (env.run_id.clone(), env.client().clone());
    let phase = if recovery { "s5" } else { "s2" };
    let inputs = env.args.inputs_json();
    let make: Make = Arc::new(move |i| {
        submit::request(&c0, &inputs, format!("bench-{run}-{phase}-{i}"), When::ExecuteAtMs(due))
    });
    let tracker = env.tracker.clone();
    let on_ok: OnOk =
        Arc::new(move |_, r| tracker.lock().expect(r.execution_id.clone(), r.execute_at_ms));
    let sub =
        submit::batched(&env.clients, count, a.batch, a.in_flight, make, on_ok, bar.counter())
            .await?;
    bar.finish().await;
    let submitted_at = now_ms();
    let acked = env.tracker.lock().expected();

    let bar = Progress::start("drain", acked as u64, env.progress);
    let mut crash = None;
    if recovery {
        let target = ((acked as f64 * a.kill_at).ceil() as usize).clamp(1, acked.max(1));
        if !env.wait_started(target, deadline, Some(&bar)).await? {
            bar.finish().await;
            bail!(
                "only {} of {acked} executions started within --timeout {} s: the node was not killed",
                env.tracker.lock().started(),
                a.timeout_s
            );
        }
        let started_at_kill = env.tracker.lock().started();
        let kill_us = now_us();
        let Some(node) = env.node.spawned() else { bail!("s5 needs a spawned node") };
        node.kill().await;
        let restart_us = now_us();
        let up = node.start().await?;
        crash = Some(Crash { started_at_kill, kill_us, restart_us, up });
    }
    let all = env.wait_started(acked, deadline, Some(&bar)).await?;
    bar.finish().await;
    if all {
        tokio::time::sleep(GRACE).await;
    }
    let s1 = env.sample();
    let (o, fire_again) = {
        let tracker = env.tracker.lock();
        (tracker.analyze(), crash.as_ref().and_then(|c| tracker.first_start_after(c.restart_us)))
    };

    let name = if recovery { "s5" } else { "s2" };
    let title = if recovery {
        format!(
            "kairos bench s5 — recovery: SIGKILL at {:.0} % of a burst of {}",
            a.kill_at * 100.0,
            int(count)
        )
    } else {
        format!("kairos bench s2 — burst: {} due at one instant", int(count))
    };
    let mut r = Report::new(name, title);
    r.row("workers x slots", format!("{} x {}", a.workers, a.slots));
    r.set("count", acked as u64);
    r.set("workers", a.workers as u64);
    r.set("slots", a.slots as u64);
    r.set("input_bytes", a.input_bytes as u64);
    r.set("lead_ms", lead);
    r.row(
        "submit (SubmitBatch)",
        format!("{} ({} in {:.2} s)", rate(sub.per_s()), int(sub.acked), sub.elapsed.as_secs_f64()),
    );
    r.set("submit_per_s", sub.per_s().round());
    if submitted_at > due {
        r.notes.push(format!(
            "submission ended {} after T (--lead-ms {lead} too short for this node): lateness includes it",
            ms((submitted_at - due) as f64)
        ));
    }
    burst_figures(&mut r, &o, due);
    if let Some(c) = &crash {
        r.row(
            "started before the SIGKILL",
            format!("{} of {}", int(c.started_at_kill as u64), int(acked as u64)),
        );
        r.row("node up again after (healthz 200)", format!("{} ms", c.up.as_millis()));
        r.set("killed_after_started", c.started_at_kill as u64);
        r.set("node_up_after_restart_ms", c.up.as_millis() as u64);
        match fire_again {
            Some(t) => {
                let v = round1((t - c.restart_us) as f64 / 1_000.0);
                r.row("time to fire again (restart → first start)", ms(v));
                r.row("… from the SIGKILL", ms((t - c.kill_us) as f64 / 1_000.0));
                r.set("time_to_fire_again_ms", v);
            }
            None => {
                r.row("time to fire again", "never (nothing started after the restart)");
                r.set("time_to_fire_again_ms", Value::Null);
            }
        }
    }
    missing_and_early(&mut r, env, &o, recovery, all, a.timeout_s).await;
    node_usage(&mut r, s0, s1);
    Ok(r)
}

/// Completions/s, drain, lateness, first start and duplicates of a burst due at `due`.
fn burst_figures(r: &mut Report, o: &Outcome, due: i64) {
    let (first, last) = (o.first_start_us.unwrap_or(0), o.last_start_us.unwrap_or(0));
    let span_s = ((last - first) as f64 / 1e6).max(1e-3);
    let per_s = if o.started > 0 { o.started as f64 / span_s } else { 0.0 };
    r.row("completions (started / (last − first start))", rate(per_s));
    r.set("completions_per_s", per_s.round());
    let drain_s = (last - due * 1_000) as f64 / 1e6;
    let first_ms = (first - due * 1_000) as f64 / 1e3;
    if o.started > 0 {
        r.row("drain (last start − T)", format!("{drain_s:.2} s"));
        r.row("first start after due", ms(first_ms));
        r.set("drain_s", super::stats::round2(drain_s));
        r.set("first_start_ms", round1(first_ms));
    } else {
        r.row("drain", "nothing started");
        r.set("drain_s", Value::Null);
        r.set("first_start_ms", Value::Null);
    }
    r.row("lateness p50 / p90 / p99 / max", o.lateness.human());
    r.set("lateness_ms", o.lateness.json());
    duplicates(r, o);
}

/// The duplicates row and JSON.
pub(crate) fn duplicates(r: &mut Report, o: &Outcome) {
    let d = o.duplicates;
    r.row(
        "duplicates (retried / redelivered)",
        format!("{} ({} / {})", d.total, d.retried, d.redelivered),
    );
    r.set(
        "duplicates",
        json!({"total": d.total, "retried": d.retried, "redelivered": d.redelivered}),
    );
    if o.first_seen_retry > 0 {
        r.notes.push(format!(
            "{} executions were first seen at an attempt after 1",
            o.first_seen_retry
        ));
    }
    if o.foreign > 0 {
        r.notes.push(format!(
            "{} starts of executions not submitted by this phase (leftovers on the node) were ignored",
            o.foreign
        ));
    }
}

/// Missing (or lost) and early: rows, JSON, failures, and what the node says about the
/// missing ones.
pub(crate) async fn missing_and_early(
    r: &mut Report,
    env: &Env,
    o: &Outcome,
    lost: bool,
    all: bool,
    timeout_s: u64,
) {
    let word = if lost { "lost" } else { "missing" };
    r.row(format!("{word} (acknowledged, never started)"), int(o.missing.len() as u64));
    r.set(word, o.missing.len() as u64);
    r.row("early (started before execute_at)", int(o.early as u64));
    r.set("early", o.early as u64);
    if !all {
        r.notes.push(format!("--timeout {timeout_s} s reached before every execution started"));
    }
    r.set("timed_out", !all);
    if !o.missing.is_empty() {
        let detail = describe(env.client(), &o.missing).await;
        for d in &detail {
            r.notes.push(format!("{word}: {d}"));
        }
        r.set(&format!("{word}_detail"), Value::Array(detail));
        r.failures.push(format!(
            "{} acknowledged executions never started (first: {})",
            o.missing.len(),
            o.missing[0]
        ));
    }
    if o.early > 0 {
        let ex: Vec<String> = o
            .early_examples
            .iter()
            .map(|(id, at, s)| {
                format!("{id} due {at} started {:.1} ms early", (at * 1_000 - s) as f64 / 1e3)
            })
            .collect();
        r.failures.push(format!(
            "{} executions started before execute_at: {}",
            o.early,
            ex.join("; ")
        ));
    }
}
