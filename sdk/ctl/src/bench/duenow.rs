//! s7 — work due now, end to end: workers first; then `--count` executions submitted through
//! `SubmitBatch` as fast as the node takes them, each due at its submission (no `execute_at`),
//! or — with `--delayed-share F` — that share of them delayed by `--delay-ms` (a mix of
//! due-now and delayed work); collect until every acknowledged execution has started. The
//! figure: starts / (last start − submission start), enqueue to handler, as a job queue is
//! used; and the lateness of each start after its `execute_at`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use kairos_proto::v1::submit_request::When;

use super::burst::{duplicates, missing_and_early};
use super::env::{Env, node_usage};
use super::progress::Progress;
use super::stats::{Report, int, rate, round1};
use super::submit::{self, Make, OnOk};
use super::workers::now_us;

/// After everything started: how long to keep reading for immediate duplicates.
const GRACE: Duration = Duration::from_millis(500);

pub async fn run(env: &mut Env) -> Result<Report> {
    let a = env.args.clone();
    let count = a.count();
    env.start_workers().await?;
    let _ = env.tracker.reset();
    let s0 = env.sample();
    let deadline = Instant::now() + Duration::from_secs(a.timeout_s);
    // Every `1 / share`-th one delayed, spread evenly through the run.
    let every = (a.delayed_share > 0.0).then(|| (1.0 / a.delayed_share).max(1.0));
    let (delay, run, c0) = (a.delay_ms, env.run_id.clone(), env.client().clone());
    let inputs = env.args.inputs_json();
    let make: Make = Arc::new(move |i| {
        let delayed = every.is_some_and(|e| (i as f64 / e).floor() != ((i + 1) as f64 / e).floor());
        let when = When::DelayMs(if delayed { delay } else { 0 });
        submit::request(&c0, &inputs, format!("bench-{run}-s7-{i}"), when)
    });
    let tracker = env.tracker.clone();
    let on_ok: OnOk =
        Arc::new(move |_, r| tracker.lock().expect(r.execution_id.clone(), r.execute_at_ms));
    let bar = Progress::start("submit", count, env.progress);
    let start_us = now_us();
    let sub =
        submit::batched(&env.clients, count, a.batch, a.in_flight, make, on_ok, bar.counter())
            .await?;
    bar.finish().await;
    let acked = env.tracker.lock().expected();
    let bar = Progress::start("drain", acked as u64, env.progress);
    let all = env.wait_started(acked, deadline, Some(&bar)).await?;
    bar.finish().await;
    if all {
        tokio::time::sleep(GRACE).await;
    }
    let s1 = env.sample();
    let o = env.tracker.lock().analyze();

    let share = a.delayed_share;
    let title = if share > 0.0 {
        format!(
            "kairos bench s7 — due now, end to end: {} submitted, {:.0} % delayed by {} ms",
            int(count),
            share * 100.0,
            a.delay_ms
        )
    } else {
        format!("kairos bench s7 — due now, end to end: {} submitted and run", int(count))
    };
    let mut r = Report::new("s7", title);
    r.row("workers x slots", format!("{} x {}", a.workers, a.slots));
    r.set("count", acked as u64);
    r.set("workers", a.workers as u64);
    r.set("slots", a.slots as u64);
    r.set("input_bytes", a.input_bytes as u64);
    r.set("delayed_share", share);
    r.set("delay_ms", a.delay_ms);
    r.row(
        "submit (SubmitBatch)",
        format!("{} ({} in {:.2} s)", rate(sub.per_s()), int(sub.acked), sub.elapsed.as_secs_f64()),
    );
    r.set("submit_per_s", sub.per_s().round());
    let last = o.last_start_us.unwrap_or(start_us);
    let span_s = ((last - start_us) as f64 / 1e6).max(1e-3);
    let e2e = if o.started > 0 { o.started as f64 / span_s } else { 0.0 };
    r.row("completions, end to end (started / (last start − submission start))", rate(e2e));
    r.set("e2e_per_s", e2e.round());
    r.row("last start after submission start", format!("{span_s:.2} s"));
    r.set("span_s", round1(span_s));
    r.row("lateness (start − execute_at) p50 / p90 / p99 / max", o.lateness.human());
    r.set("lateness_ms", o.lateness.json());
    duplicates(&mut r, &o);
    missing_and_early(&mut r, env, &o, false, all, a.timeout_s).await;
    node_usage(&mut r, s0, s1);
    Ok(r)
}
