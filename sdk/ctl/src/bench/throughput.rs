//! s1 — submit throughput: (a) `--count` through `SubmitBatch` (`--batch` per call,
//! `--in-flight` calls), (b) `--single-count` single `Submit` calls from `--clients`
//! concurrent clients. Everything is due in 1 hour and no worker runs, so nothing fires during
//! the measure. On a spawned (fresh) node the status counts are then checked: every
//! acknowledged execution SCHEDULED, none fired.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use kairos_proto::v1::ExecutionStatus;
use kairos_proto::v1::submit_request::When;
use serde_json::{Value, json};

use super::env::{Env, node_usage};
use super::progress::Progress;
use super::stats::{Report, int, rate};
use super::submit::{self, Make, OnOk};

const HOUR_MS: u64 = 3_600_000;

pub async fn run(env: &mut Env) -> Result<Report> {
    let a = env.args.clone();
    let (count, single_count) = (a.count(), a.single_count());
    let s0 = env.sample();

    let bar = Progress::start("batched", count, env.progress);
    let (run, c0) = (env.run_id.clone(), env.client().clone());
    let inputs = env.args.inputs_json();
    let make: Make = Arc::new(move |i| {
        submit::request(&c0, &inputs, format!("bench-{run}-s1b-{i}"), When::DelayMs(HOUR_MS))
    });
    let on_ok: OnOk = Arc::new(|_, _| {});
    let batched =
        submit::batched(&env.clients, count, a.batch, a.in_flight, make, on_ok, bar.counter())
            .await?;
    bar.finish().await;

    let single = if single_count > 0 {
        let bar = Progress::start("single", single_count, env.progress);
        let run = env.run_id.clone();
        let key = Arc::new(move |i| format!("bench-{run}-s1s-{i}"));
        let s = submit::single(
            &env.clients,
            single_count,
            a.clients,
            key,
            (&a.inputs_json(), Duration::from_millis(HOUR_MS)),
            bar.counter(),
        )
        .await?;
        bar.finish().await;
        Some(s)
    } else {
        None
    };
    let s1 = env.sample();

    let mut r = Report::new(
        "s1",
        format!(
            "kairos bench s1 — submit throughput ({} connections, due in 1 h, no workers)",
            a.connections
        ),
    );
    r.row(
        format!("batched: {} via SubmitBatch({}) x {} in flight", int(count), a.batch, a.in_flight),
        format!("{} in {:.2} s", rate(batched.per_s()), batched.elapsed.as_secs_f64()),
    );
    r.set("count", batched.acked);
    r.set("batch", a.batch as u64);
    r.set("input_bytes", a.input_bytes as u64);
    r.set("in_flight", a.in_flight as u64);
    r.set("batched_per_s", batched.per_s().round());
    r.set("connections", a.connections as u64);
    match &single {
        Some(s) => {
            r.row(
                format!("single: {} Submit calls, {} clients", int(single_count), a.clients),
                format!("{} in {:.2} s", rate(s.per_s()), s.elapsed.as_secs_f64()),
            );
            r.set("single_count", s.acked);
            r.set("clients", a.clients as u64);
            r.set("single_per_s", s.per_s().round());
        }
        None => {
            r.set("single_count", 0);
            r.set("single_per_s", Value::Null);
        }
    }
    let acked = batched.acked + single.map_or(0, |s| s.acked);
    let existing = batched.existing + single.map_or(0, |s| s.existing);
    let retries = batched.retries + single.map_or(0, |s| s.retries);
    r.row(
        "acknowledged / already existing / retried",
        format!("{} / {existing} / {retries}", int(acked)),
    );
    r.set("acknowledged", acked);
    r.set("retries", retries);

    // On a fresh node the status counts must match: every acknowledgement stored, none fired.
    if env.node.spawned().is_some() {
        let counts = env.client().stats(false).await?;
        let scheduled: i64 =
            counts.iter().filter(|(s, _)| *s == ExecutionStatus::Scheduled).map(|(_, n)| n).sum();
        let other: i64 =
            counts.iter().filter(|(s, _)| *s != ExecutionStatus::Scheduled).map(|(_, n)| n).sum();
        let missing = (acked as i64 - scheduled).max(0);
        r.row(
            "stored SCHEDULED / other statuses",
            format!("{} / {other}", int(scheduled.max(0) as u64)),
        );
        r.row("missing (acknowledged, not stored)", missing.to_string());
        r.row("early (fired before due)", other.to_string());
        r.set("stored_scheduled", scheduled);
        r.set("missing", missing);
        r.set("early", other);
        if missing > 0 {
            r.failures
                .push(format!("{missing} acknowledged submissions are not stored as SCHEDULED"));
        }
        if other > 0 {
            r.failures.push(format!(
                "{other} executions are not SCHEDULED although due in 1 hour: {}",
                json!(counts.iter().map(|(s, n)| (s.as_str_name(), n)).collect::<Vec<_>>())
            ));
        }
    } else {
        r.row("missing / early", "not checked (--endpoint: the node is not fresh)");
        r.set("missing", Value::Null);
        r.set("early", Value::Null);
        r.notes.push(format!(
            "the {} executions submitted stay on the node, due in 1 hour (queue bench)",
            int(acked)
        ));
    }
    node_usage(&mut r, s0, s1);
    Ok(r)
}
