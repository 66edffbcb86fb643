//! s3 — precision, and s4 — scale.
//!
//! s3: workers running; `--rate` executions per second fall due at a steady pace for
//! `--duration` s, each submitted (in the small batch of its 10 ms tick) about 1 s before its
//! `execute_at`; lateness, missing, early. s4: s3 (baseline), then `--preload` executions due
//! 1–30 days ahead (uniformly spread, `SubmitBatch`), then s3 again: both p99s, their ratio, the
//! node's RSS after the preload.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use kairos_proto::v1::submit_request::When;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use super::burst::{duplicates, missing_and_early};
use super::env::{Env, node_usage};
use super::progress::Progress;
use super::stats::{Report, int, rate, round1, round2};
use super::submit::{self, Make, OnOk};
use super::track::Outcome;
use super::workers::now_ms;

/// How far ahead of its `execute_at` each execution is submitted.
const AHEAD_MS: i64 = 1_000;
/// The submitter's tick.
const TICK: Duration = Duration::from_millis(10);
const DAY_MS: u64 = 86_400_000;
/// s4: pause between the end of the preload and the second s3.
const SETTLE: Duration = Duration::from_secs(2);

/// One steady phase.
struct Steady {
    outcome: Outcome,
    /// Submissions acknowledged only after their `execute_at` (the node was slow to answer).
    acked_late: u64,
    all: bool,
}

async fn steady(env: &Env, phase: &str) -> Result<Steady> {
    let a = &env.args;
    let n = a.rate * a.duration_s();
    let _ = env.tracker.reset();
    let first_due = now_ms() + AHEAD_MS + 100;
    let rate_per_s = a.rate;
    let due = move |i: u64| first_due + (i * 1_000 / rate_per_s) as i64;
    let acked_late = Arc::new(AtomicU64::new(0));
    let (run, c0) = (env.run_id.clone(), env.client().clone());
    let key_phase = phase.to_string();
    let inputs = env.args.inputs_json();
    let make: Make = Arc::new(move |i| {
        submit::request(
            &c0,
            &inputs,
            format!("bench-{run}-{key_phase}-{i}"),
            When::ExecuteAtMs(due(i)),
        )
    });
    let (tracker, late) = (env.tracker.clone(), acked_late.clone());
    let on_ok: OnOk = Arc::new(move |_, r| {
        if now_ms() > r.execute_at_ms {
            late.fetch_add(1, Ordering::Relaxed);
        }
        tracker.lock().expect(r.execution_id.clone(), r.execute_at_ms);
    });
    let bar = Progress::start(phase, n, env.progress);
    let sink = Arc::new(AtomicU64::new(0));
    let mut set: JoinSet<Result<submit::Summary>> = JoinSet::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let (mut next, mut call) = (0u64, 0usize);
    while next < n {
        tick.tick().await;
        let now = now_ms();
        let start = next;
        while next < n && due(next) - AHEAD_MS <= now && next - start < a.batch as u64 {
            next += 1;
        }
        if next > start {
            let client = env.clients[call % env.clients.len()].clone();
            call += 1;
            set.spawn(submit::one_batch(
                client,
                (start..next).collect(),
                make.clone(),
                on_ok.clone(),
                sink.clone(),
            ));
        }
        while let Some(r) = set.try_join_next() {
            r.map_err(|e| anyhow!("submission task: {e}"))??;
        }
        bar.set(env.tracker.lock().started() as u64);
        env.check()?;
    }
    while let Some(r) = set.join_next().await {
        r.map_err(|e| anyhow!("submission task: {e}"))??;
    }
    let acked = env.tracker.lock().expected();
    let deadline = Instant::now() + Duration::from_secs(a.timeout_s);
    let all = env.wait_started(acked, deadline, Some(&bar)).await?;
    bar.finish().await;
    if all {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let outcome = env.tracker.lock().analyze();
    Ok(Steady { outcome, acked_late: acked_late.load(Ordering::Relaxed), all })
}

fn steady_json(s: &Steady) -> Value {
    json!({
        "count": s.outcome.submitted,
        "lateness_ms": s.outcome.lateness.json(),
        "missing": s.outcome.missing.len(),
        "early": s.outcome.early,
        "acked_late": s.acked_late,
        "duplicates": s.outcome.duplicates.total,
    })
}

fn steady_rows(r: &mut Report, label: &str, s: &Steady) {
    r.row(format!("{label}lateness p50 / p90 / p99 / max"), s.outcome.lateness.human());
    r.row(
        format!("{label}submitted / started / acknowledged after due"),
        format!(
            "{} / {} / {}",
            int(s.outcome.submitted as u64),
            int(s.outcome.started as u64),
            s.acked_late
        ),
    );
    if s.acked_late > 0 {
        r.notes.push(format!(
            "{label}{} submissions were acknowledged after their execute_at (sent {AHEAD_MS} ms ahead)",
            s.acked_late
        ));
    }
}

pub async fn run_s3(env: &mut Env) -> Result<Report> {
    let a = env.args.clone();
    env.start_workers().await?;
    let s0 = env.sample();
    let s = steady(env, "s3").await?;
    let s1 = env.sample();
    let mut r = Report::new(
        "s3",
        format!(
            "kairos bench s3 — precision: {}/s for {} s, submitted {AHEAD_MS} ms ahead",
            a.rate,
            a.duration_s()
        ),
    );
    r.row("workers x slots", format!("{} x {}", a.workers, a.slots));
    r.set("rate", a.rate);
    r.set("duration_s", a.duration_s());
    r.set("count", s.outcome.submitted as u64);
    steady_rows(&mut r, "", &s);
    r.set("lateness_ms", s.outcome.lateness.json());
    r.set("acked_late", s.acked_late);
    duplicates(&mut r, &s.outcome);
    missing_and_early(&mut r, env, &s.outcome, false, s.all, a.timeout_s).await;
    node_usage(&mut r, s0, s1);
    Ok(r)
}

/// A well-mixed 64-bit hash (splitmix64): deterministic spread of preloaded due times.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

pub async fn run_s4(env: &mut Env) -> Result<Report> {
    let a = env.args.clone();
    env.start_workers().await?;
    let s0 = env.sample();
    let base = steady(env, "baseline").await?;

    let preload = a.preload();
    let bar = Progress::start("preload", preload, env.progress);
    let (run, c0) = (env.run_id.clone(), env.client().clone());
    let from = now_ms() as u64 + DAY_MS;
    let inputs = env.args.inputs_json();
    let make: Make = Arc::new(move |i| {
        let at = from + mix(i) % (29 * DAY_MS);
        submit::request(&c0, &inputs, format!("bench-{run}-p-{i}"), When::ExecuteAtMs(at as i64))
    });
    let on_ok: OnOk = Arc::new(|_, _| {});
    let pre =
        submit::batched(&env.clients, preload, a.batch, a.in_flight, make, on_ok, bar.counter())
            .await?;
    bar.finish().await;
    let after_preload = env.sample();
    // Let the node settle (a burst of writes just ended) before measuring again.
    tokio::time::sleep(SETTLE).await;

    let after = steady(env, "after").await?;
    let s1 = env.sample();

    let mut r = Report::new(
        "s4",
        format!(
            "kairos bench s4 — scale: s3 ({}/s for {} s), preload {} due 1–30 days ahead, s3 again",
            a.rate,
            a.duration_s(),
            int(preload)
        ),
    );
    r.row("workers x slots", format!("{} x {}", a.workers, a.slots));
    steady_rows(&mut r, "before: ", &base);
    r.row(
        "preload (SubmitBatch)",
        format!("{} in {:.1} s: {}", int(pre.acked), pre.elapsed.as_secs_f64(), rate(pre.per_s())),
    );
    steady_rows(&mut r, "after: ", &after);
    let ratio = if base.outcome.lateness.p99 > 0.0 {
        Some(round2(after.outcome.lateness.p99 / base.outcome.lateness.p99))
    } else {
        None
    };
    r.row("p99 after / before", ratio.map_or("-".into(), |x| format!("{x:.2}")));
    r.set("rate", a.rate);
    r.set("duration_s", a.duration_s());
    r.set("preload", pre.acked);
    r.set("preload_per_s", pre.per_s().round());
    r.set("baseline", steady_json(&base));
    r.set("after", steady_json(&after));
    r.set("p99_before_ms", round1(base.outcome.lateness.p99));
    r.set("p99_after_ms", round1(after.outcome.lateness.p99));
    r.set("p99_ratio", ratio);
    match after_preload.node {
        Some(p) => {
            let mib = round1(p.rss_kib as f64 / 1024.0);
            r.row("node RSS after the preload", format!("{mib:.1} MiB"));
            r.set("node_rss_after_preload_mib", mib);
        }
        None => r.set("node_rss_after_preload_mib", Value::Null),
    }
    // Missing and early over both phases.
    let mut both = Outcome {
        missing: base.outcome.missing.clone(),
        early: base.outcome.early + after.outcome.early,
        early_examples: base.outcome.early_examples.clone(),
        ..Outcome::default()
    };
    both.missing.extend(after.outcome.missing.iter().cloned());
    both.early_examples.extend(after.outcome.early_examples.iter().cloned());
    both.duplicates.total = base.outcome.duplicates.total + after.outcome.duplicates.total;
    both.duplicates.retried = base.outcome.duplicates.retried + after.outcome.duplicates.retried;
    both.duplicates.redelivered =
        base.outcome.duplicates.redelivered + after.outcome.duplicates.redelivered;
    duplicates(&mut r, &both);
    missing_and_early(&mut r, env, &both, false, base.all && after.all, a.timeout_s).await;
    node_usage(&mut r, s0, s1);
    Ok(r)
}

#[cfg(test)]
mod tests {
    #[test]
    fn preload_spread_is_uniform_enough() {
        let mut buckets = [0u32; 29];
        for i in 0..29_000u64 {
            buckets[(super::mix(i) % 29) as usize] += 1;
        }
        assert!(buckets.iter().all(|&b| (800..1_200).contains(&b)), "{buckets:?}");
    }
}
