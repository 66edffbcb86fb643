//! s6 — fairness between namespaces.
//!
//! Two namespaces, each with its own workers: `bench-a` (`--workers` x `--slots`) and `bench-b`
//! (one worker of `--slots`). First `bench-b` alone: `--trickle` executions per second, each
//! submitted 1 s before its `execute_at`, for the baseline. Then `bench-a` floods `--count`
//! executions all due at one instant T (as s2) while `bench-b`'s trickle goes on until the
//! flood has drained: `bench-b`'s lateness during the flood against its baseline (the ratio of
//! the p99s), and the flood's own figures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use kairos_proto::v1::submit_request::When;
use kairos_sdk::Client;
use tokio::task::JoinSet;

use super::env::{DEFINITION_YAML, Env, describe, node_usage};
use super::progress::Progress;
use super::stats::{Report, int, rate, round1, round2};
use super::submit::{self, Make, OnOk};
use super::track::{Outcome, Shared};
use super::workers::{Pool, now_ms};

/// The flooding namespace.
pub const FLOOD: &str = "bench-a";
/// The trickling namespace.
pub const TRICKLE: &str = "bench-b";
/// How far ahead of its `execute_at` each trickle execution is submitted.
const AHEAD_MS: i64 = 1_000;

/// Submits `rate`/s executions of `client`'s namespace into `tracker` until `stop` is set; each
/// due `AHEAD_MS` after it is sent. Returns how many were acknowledged after their due time.
async fn trickle(
    client: Client,
    tracker: Shared,
    run: String,
    phase: &'static str,
    rate: u64,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<u64> {
    let period = Duration::from_micros(1_000_000 / rate.max(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut set: JoinSet<Result<bool>> = JoinSet::new();
    let mut i = 0u64;
    while !*stop.borrow() {
        tick.tick().await;
        let (client, tracker) = (client.clone(), tracker.clone());
        let key = format!("bench-{run}-{phase}-{i}");
        i += 1;
        set.spawn(async move {
            let due = now_ms() + AHEAD_MS;
            let b = client.submit(submit::URI, submit::VERSION).at(due).idempotency_key(key);
            let r = b.send().await.context("a trickle submission")?;
            tracker.lock().expect(r.execution_id.clone(), r.execute_at_ms);
            Ok(now_ms() > r.execute_at_ms)
        });
        while let Some(r) = set.try_join_next() {
            r.map_err(|e| anyhow!("trickle task: {e}"))??;
        }
    }
    let mut late = 0;
    while let Some(r) = set.join_next().await {
        late += u64::from(r.map_err(|e| anyhow!("trickle task: {e}"))??);
    }
    Ok(late)
}

/// Runs the trickle for `d` (or until `until` returns true, checked every 20 ms, when given).
async fn trickle_phase(
    env: &Env,
    b: &Client,
    tracker: &Shared,
    phase: &'static str,
    until: impl Fn() -> bool,
    at_least: Duration,
) -> Result<u64> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(trickle(
        b.clone(),
        tracker.clone(),
        env.run_id.clone(),
        phase,
        env.args.trickle,
        stop_rx,
    ));
    let t = Instant::now();
    let deadline = t + Duration::from_secs(env.args.timeout_s);
    while t.elapsed() < at_least || !until() {
        if Instant::now() >= deadline {
            break;
        }
        env.check()?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(true);
    task.await.map_err(|e| anyhow!("trickle: {e}"))?
}

/// Waits until every acknowledged execution of `tracker` started (or the timeout).
async fn drained(tracker: &Shared, timeout: Duration) -> bool {
    let t = Instant::now();
    loop {
        {
            let tr = tracker.lock();
            if tr.started() >= tr.expected() {
                return true;
            }
        }
        if t.elapsed() > timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn rows(r: &mut Report, label: &str, o: &Outcome, late: u64) {
    r.row(format!("{label}: lateness p50 / p90 / p99 / max"), o.lateness.human());
    r.row(
        format!("{label}: submitted / started / acknowledged after due"),
        format!("{} / {} / {late}", int(o.submitted as u64), int(o.started as u64)),
    );
}

pub async fn run(env: &mut Env) -> Result<Report> {
    let a = env.args.clone();
    let endpoint = env.endpoints();
    let flood_client: Vec<Client> =
        env.clients.iter().map(|c| c.clone().with_namespace(FLOOD)).collect();
    let b = env.client().clone().with_namespace(TRICKLE);
    for c in [&flood_client[0], &b] {
        c.register_definition(DEFINITION_YAML)
            .await
            .with_context(|| format!("registering bench-noop in {}", c.namespace()))?;
    }
    let (ta, tb) = (Shared::default(), Shared::default());
    let pool_a =
        Pool::spawn(a.workers, a.slots, a.threads, &endpoint, FLOOD, &env.dir, ta.clone()).await?;
    let pool_b =
        Pool::spawn(1, a.slots, a.threads, &endpoint, TRICKLE, &env.dir, tb.clone()).await?;
    let s0 = env.sample();

    // Baseline: the trickle alone.
    let quiet = Duration::from_secs(if a.quick { 2 } else { 5 });
    let base_late = trickle_phase(env, &b, &tb, "s6-base", || true, quiet).await?;
    drained(&tb, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let base = tb.reset().analyze();

    // The flood, with the trickle going on until it has drained.
    let (count, lead) = (a.count(), a.lead_ms());
    let due = now_ms() + lead as i64;
    let bar = Progress::start("flood", count, env.progress);
    let run = env.run_id.clone();
    let c0 = flood_client[0].clone();
    let inputs = env.args.inputs_json();
    let make: Make = Arc::new(move |i| {
        submit::request(&c0, &inputs, format!("bench-{run}-s6-{i}"), When::ExecuteAtMs(due))
    });
    let track_a = ta.clone();
    let on_ok: OnOk =
        Arc::new(move |_, r| track_a.lock().expect(r.execution_id.clone(), r.execute_at_ms));
    let flood = {
        let (clients, batch, in_flight, counter) =
            (flood_client.clone(), a.batch, a.in_flight, bar.counter());
        tokio::spawn(async move {
            submit::batched(&clients, count, batch, in_flight, make, on_ok, counter).await
        })
    };
    let flood_done = {
        let (ta, flood) = (ta.clone(), &flood);
        move || {
            let t = ta.lock();
            flood.is_finished() && t.started() >= t.expected()
        }
    };
    // At least until T plus a second, so the trickle overlaps the whole drain.
    let at_least = Duration::from_millis(lead + 1_000);
    let flood_late = trickle_phase(env, &b, &tb, "s6-flood", flood_done, at_least).await?;
    let sub = flood.await.map_err(|e| anyhow!("flood: {e}"))??;
    bar.finish().await;
    let all_a = drained(&ta, Duration::from_secs(a.timeout_s)).await;
    let all_b = drained(&tb, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s1 = env.sample();
    let oa = ta.lock().analyze();
    let ob = tb.lock().analyze();
    pool_a.stop().await;
    pool_b.stop().await;

    let mut r = Report::new(
        "s6",
        format!(
            "kairos bench s6 — fairness: {} floods {} due at once, {} trickles {}/s",
            FLOOD,
            int(count),
            TRICKLE,
            a.trickle
        ),
    );
    r.row(
        "workers x slots",
        format!("{FLOOD}: {} x {}, {TRICKLE}: 1 x {}", a.workers, a.slots, a.slots),
    );
    rows(&mut r, &format!("{TRICKLE} alone"), &base, base_late);
    r.row(
        format!("{FLOOD} flood (SubmitBatch)"),
        format!("{} ({} in {:.2} s)", rate(sub.per_s()), int(sub.acked), sub.elapsed.as_secs_f64()),
    );
    let (first, last) = (oa.first_start_us.unwrap_or(0), oa.last_start_us.unwrap_or(0));
    let drain_s = (last - due * 1_000) as f64 / 1e6;
    let per_s = oa.started as f64 / ((last - first) as f64 / 1e6).max(1e-3);
    r.row(
        format!("{FLOOD}: drain (last start − T) / completions"),
        format!("{drain_s:.2} s / {}", rate(per_s)),
    );
    r.row(format!("{FLOOD}: lateness p50 / p90 / p99 / max"), oa.lateness.human());
    rows(&mut r, &format!("{TRICKLE} during the flood"), &ob, flood_late);
    let ratio = (base.lateness.p99 > 0.0).then(|| round2(ob.lateness.p99 / base.lateness.p99));
    r.row(format!("{TRICKLE} p99 during / alone"), ratio.map_or("-".into(), |x| format!("{x:.2}")));
    r.set("count", oa.submitted as u64);
    r.set("trickle_per_s", a.trickle);
    r.set("flood_submit_per_s", sub.per_s().round());
    r.set("flood_drain_s", round2(drain_s));
    r.set("flood_completions_per_s", per_s.round());
    r.set("flood_lateness_ms", oa.lateness.json());
    r.set("trickle_alone_lateness_ms", base.lateness.json());
    r.set("trickle_flood_lateness_ms", ob.lateness.json());
    r.set("trickle_flood_count", ob.submitted as u64);
    r.set("trickle_p99_ratio", ratio);
    r.set("trickle_p99_flood_ms", round1(ob.lateness.p99));
    let missing = oa.missing.len() + ob.missing.len() + base.missing.len();
    let early = oa.early + ob.early + base.early;
    let dups = oa.duplicates.total + ob.duplicates.total + base.duplicates.total;
    r.row("missing / early / duplicates", format!("{missing} / {early} / {dups}"));
    r.set("missing", missing as u64);
    r.set("early", early as u64);
    r.set("duplicates", dups as u64);
    if missing > 0 {
        r.failures.push(format!("{missing} acknowledged executions never started"));
        for (client, o) in [(&flood_client[0], &oa), (&b, &ob)] {
            for d in describe(client, &o.missing).await {
                r.notes.push(format!("missing: {d}"));
            }
        }
    }
    if early > 0 {
        r.failures.push(format!("{early} executions started before execute_at"));
    }
    if !(all_a && all_b) {
        r.notes.push(format!("--timeout {} s reached before every execution started", a.timeout_s));
    }
    if ob.started == 0 {
        r.notes.push(format!("no {TRICKLE} execution started during the flood"));
    }
    node_usage(&mut r, s0, s1);
    Ok(r)
}
