//! The cron service on in-process nodes over one memory backend, with simulated time (tokio's
//! paused clock drives the injected clock): schedules materialize through the node's own API
//! and workers run them; catch-up after a 3-hour outage under each missed-run policy; every
//! overlap policy with executions that run long; pause-on-failure; backfill; a round larger
//! than its namespace's `pending_max` split to fit.

#![allow(clippy::disallowed_methods)] // the tests wait on tokio's paused clock

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_actors::node::Node;
use kairos_actors::node::WorkerPoll;
use kairos_actors::server::config::{Backend, NodeConfig, Quota, Quotas};
use kairos_layer::env::{Rng, SharedClock, Timestamp, TokioClock};
use kairos_layer::kv::Database;
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use kairos_proto::storage::v1::{
    CronJob, CronPolicies, CronStatus, Execution, ExecutionError, ExecutionStatus,
};

use common::NodeTestOps;

const NS: &str = "default";
const SHARDS: u32 = 4;
const MIN: i64 = 60_000;

const TICK: &str = r#"
name: tick
version: 1
inputs:
  at: {type: string, required: false}
timeouts: {lease: 60s}
retry: {max_attempts: 1}
execution: {type: test}
"#;

struct Cluster {
    db: Database,
    clock: SharedClock,
}

fn cluster() -> Cluster {
    // A whole minute, so minute schedules line up with the test's arithmetic.
    let start = 1_790_000_000_000 / MIN * MIN;
    let clock: SharedClock = Arc::new(TokioClock::starting_at(Timestamp::from_millis(start)));
    let db = MemoryDatabase::open(clock.clone(), Rng::seeded(9), FaultConfig::none());
    Cluster { db, clock }
}

impl Cluster {
    async fn node(&self, id: &str) -> Node {
        self.node_with(id, Quotas::default()).await
    }

    async fn node_with(&self, id: &str, quotas: Quotas) -> Node {
        let config = NodeConfig {
            quotas,
            node_id: Some(id.into()),
            backend: Backend::Memory,
            shard_count: SHARDS,
            shard_lease_ms: 3_000,
            node_ttl_ms: 6_000,
            poll_interval_ms: 500,
            window_ms: 10_000,
            cron_lookahead_ms: 2_000,
            ..NodeConfig::default()
        };
        let node = Node::start(config, self.db.clone(), self.clock.clone(), Rng::seeded(3))
            .await
            .expect("node starts");
        let def = kairos_layer::definition::parse_definition(TICK).unwrap();
        node.scheduler().register_definition(NS, def, "test").await.unwrap();
        wait_for("every cron shard owned", || node.owned_cron_shards().len() == SHARDS as usize)
            .await;
        node
    }

    fn now(&self) -> i64 {
        self.clock.now().as_millis()
    }
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..600 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

fn job(id: &str, expr: &str, f: impl FnOnce(&mut CronPolicies)) -> CronJob {
    let mut p = CronPolicies { catch_up_window_ms: 3_600_000, ..CronPolicies::default() };
    f(&mut p);
    CronJob {
        namespace: NS.into(),
        id: id.into(),
        definition_name: "tick".into(),
        definition_version: 1,
        inputs_json: br#"{"at": "{{occurrence}}"}"#.to_vec(),
        expression: expr.into(),
        timezone: "UTC".into(),
        policies: Some(p),
        ..CronJob::default()
    }
}

async fn runs(node: &Node, id: &str) -> Vec<Execution> {
    node.scheduler().cron_runs(NS, id, 1_000, None).await.unwrap().executions
}

/// What a worker saw of one execution.
#[derive(Debug, Clone, Default)]
struct Seen {
    started: i64,
    ended: i64,
}

/// A worker that holds each execution `hold_ms` (heartbeating), stops on a cancel request,
/// and fails those whose job id is in `fail`.
fn worker(
    node: Node,
    clock: SharedClock,
    hold_ms: i64,
    fail: &'static [&'static str],
) -> (tokio::task::JoinHandle<()>, Arc<Mutex<BTreeMap<String, Seen>>>) {
    let seen: Arc<Mutex<BTreeMap<String, Seen>>> = Arc::default();
    let out = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            let poll = WorkerPoll {
                namespace: NS.into(),
                queue: "tick".into(),
                worker_id: "w".into(),
                max: 64,
                lease_ms: None,
                wait_ms: 1_000,
            };
            let Ok(claimed) = node.poll(poll).await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            for c in claimed {
                let (node, clock, seen) = (node.clone(), clock.clone(), seen.clone());
                tokio::spawn(async move {
                    let id = c.execution.id.clone();
                    let token = c.attempt.fencing_token;
                    let started = clock.now().as_millis();
                    seen.lock().unwrap().insert(id.clone(), Seen { started, ended: 0 });
                    let failing = fail.contains(&c.execution.cron_job_id.as_str());
                    loop {
                        if clock.now().as_millis() - started >= hold_ms || failing {
                            if failing {
                                let e = ExecutionError {
                                    message: "boom".into(),
                                    retryable: false,
                                    code: String::new(),
                                };
                                let _ = node.fail(NS, &id, token, e).await;
                            } else {
                                let _ =
                                    node.complete(NS, &id, token, Vec::new(), String::new()).await;
                            }
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        match node.heartbeat_one(NS, &id, token).await {
                            Ok(h) if h.cancel_requested => {
                                let e = ExecutionError {
                                    message: "stopped".into(),
                                    retryable: false,
                                    code: String::new(),
                                };
                                let _ = node.fail(NS, &id, token, e).await;
                                break;
                            }
                            Ok(_) => {}
                            Err(_) => break,
                        }
                    }
                    seen.lock().unwrap().get_mut(&id).unwrap().ended = clock.now().as_millis();
                });
            }
        }
    });
    (task, out)
}

#[tokio::test(start_paused = true)]
async fn a_per_second_schedule_runs_each_second_through_workers() {
    let c = cluster();
    let node = c.node("a").await;
    let (w, seen) = worker(node.clone(), c.clock.clone(), 0, &[]);
    let (j, created) =
        node.create_cron_job(job("every-second", "* * * * * *", |_| {}), false).await.unwrap();
    assert!(created);
    let first = j.next_run_at_ms;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let r = runs(&node, "every-second").await;
    assert!(r.len() >= 10, "{} runs", r.len());
    for (k, e) in r.iter().enumerate() {
        assert_eq!(e.cron_occurrence_ms, first + k as i64 * 1_000, "one per second, in order");
        assert_eq!(e.execute_at_ms, e.cron_occurrence_ms);
        let inputs: serde_json::Value = serde_json::from_slice(&e.input_json).unwrap();
        assert_eq!(inputs["at"], kairos_layer::cron::utc_rfc3339(e.cron_occurrence_ms));
    }
    let seen = seen.lock().unwrap().clone();
    for e in r.iter().filter(|e| e.status() == ExecutionStatus::Succeeded) {
        let s = &seen[&e.id];
        assert!(s.started >= e.cron_occurrence_ms, "never before its occurrence");
        assert!(
            s.started - e.cron_occurrence_ms < 200,
            "started {} ms late",
            s.started - e.cron_occurrence_ms
        );
    }
    let text = node.metrics_text().await;
    assert!(text.contains("kairos_cron_materialized_total"), "{text}");
    w.abort();
    node.stop().await;
}

#[tokio::test(start_paused = true)]
async fn catch_up_after_a_three_hour_outage_under_each_missed_policy() {
    let c = cluster();
    let node = c.node("a").await;
    for (id, missed) in [("skip", "skip"), ("latest", "latest"), ("all", "all")] {
        let spec = job(id, "*/15 * * * *", |p| {
            p.missed = missed.into();
            p.overlap = "allow".into();
        });
        node.create_cron_job(spec, false).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    node.kill().await; // a crash: no drain
    let down_at = c.now();
    tokio::time::sleep(Duration::from_secs(3 * 3600)).await;
    let node = c.node("a").await;
    let up_at = c.now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let during = |r: &[Execution]| {
        r.iter().filter(|e| e.cron_occurrence_ms > down_at && e.cron_occurrence_ms < up_at).count()
    };
    // 12 occurrences passed while down; the catch-up window (1 h) holds the last 4.
    assert_eq!(during(&runs(&node, "skip").await), 0);
    let latest = runs(&node, "latest").await;
    assert_eq!(during(&latest), 1);
    let newest = up_at / (15 * MIN) * (15 * MIN);
    assert!(latest.iter().any(|e| e.cron_occurrence_ms == newest), "the most recent one");
    assert_eq!(during(&runs(&node, "all").await), 4);
    for id in ["skip", "latest", "all"] {
        let j = node.scheduler().get_cron_job(NS, id).await.unwrap();
        assert!(j.next_run_at_ms > up_at, "{id} moved on");
        assert_eq!(j.missed_count, 12, "{id}");
    }
    let text = node.metrics_text().await;
    assert!(text.contains("kairos_cron_missed_total{outcome=\"expired\"} 24"), "{text}");
    node.stop().await;
}

/// Runs a job every 10 s whose executions take 25 s, for about a minute.
async fn overlapping(overlap: &'static str) -> (Vec<Execution>, BTreeMap<String, Seen>, CronJob) {
    let c = cluster();
    let node = c.node("a").await;
    let (w, seen) = worker(node.clone(), c.clock.clone(), 25_000, &[]);
    let spec = job(overlap, "*/10 * * * * *", |p| p.overlap = overlap.into());
    node.create_cron_job(spec, false).await.unwrap();
    tokio::time::sleep(Duration::from_secs(61)).await;
    node.pause_cron_job(NS, overlap).await.unwrap();
    tokio::time::sleep(Duration::from_secs(90)).await; // what runs finishes
    let r = runs(&node, overlap).await;
    let j = node.scheduler().get_cron_job(NS, overlap).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    w.abort();
    node.stop().await;
    (r, seen, j)
}

fn overlaps(r: &[Execution], seen: &BTreeMap<String, Seen>) -> bool {
    let spans: Vec<(i64, i64)> =
        r.iter().filter_map(|e| seen.get(&e.id)).map(|s| (s.started, s.ended)).collect();
    spans.iter().enumerate().any(|(i, a)| spans.iter().skip(i + 1).any(|b| a.0 < b.1 && b.0 < a.1))
}

#[tokio::test(start_paused = true)]
async fn every_overlap_policy_with_executions_that_run_long() {
    // allow: every occurrence runs, alongside the previous one.
    let (r, seen, j) = overlapping("allow").await;
    assert!(r.len() >= 6, "{}", r.len());
    assert!(overlaps(&r, &seen));
    assert_eq!(j.skipped_overlap_count, 0);
    // skip: the occurrences while one runs are skipped; never two at once.
    let (r, seen, j) = overlapping("skip").await;
    assert!(!overlaps(&r, &seen));
    assert!((2..=3).contains(&r.len()), "{}", r.len());
    assert!(j.skipped_overlap_count >= 3);
    // buffer-one: one waits and runs as soon as the previous ends; the others are skipped.
    let (r, seen, j) = overlapping("buffer-one").await;
    assert!(!overlaps(&r, &seen));
    assert!(j.skipped_overlap_count >= 1);
    let late = r
        .iter()
        .filter(|e| seen.get(&e.id).is_some_and(|s| s.started > e.cron_occurrence_ms + 5_000))
        .count();
    assert!(late >= 1, "a buffered occurrence ran late");
    // buffer-all: each one runs in turn, none skipped.
    let (r, seen, j) = overlapping("buffer-all").await;
    assert!(!overlaps(&r, &seen));
    assert_eq!(j.skipped_overlap_count, 0);
    assert!(r.len() + j.queue.len() >= 6, "{} + {}", r.len(), j.queue.len());
    // cancel-previous: each occurrence cancels the running one.
    let (r, _, j) = overlapping("cancel-previous").await;
    assert!(r.len() >= 6, "{}", r.len());
    let cancelled = r.iter().filter(|e| e.status() == ExecutionStatus::Cancelled).count();
    assert!(cancelled >= r.len() - 2, "{cancelled} of {}", r.len());
    assert_eq!(j.skipped_overlap_count, 0);
}

#[tokio::test(start_paused = true)]
async fn pause_on_failure_pauses_until_resumed() {
    let c = cluster();
    let node = c.node("a").await;
    let (w, _) = worker(node.clone(), c.clock.clone(), 0, &["fragile"]);
    let spec = job("fragile", "*/5 * * * * *", |p| p.pause_on_failure = true);
    node.create_cron_job(spec, false).await.unwrap();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let j = node.scheduler().get_cron_job(NS, "fragile").await.unwrap();
    assert_eq!(j.status(), CronStatus::Paused);
    assert!(j.pause_reason.contains("FAILED"), "{}", j.pause_reason);
    let r = runs(&node, "fragile").await;
    assert_eq!(r.len(), 1, "paused after the first failure");
    assert_eq!(r[0].status(), ExecutionStatus::Failed);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(runs(&node, "fragile").await.len(), 1, "nothing while paused");
    node.resume_cron_job(NS, "fragile", false).await.unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(runs(&node, "fragile").await.len(), 2, "runs again once resumed");
    w.abort();
    node.stop().await;
}

#[tokio::test(start_paused = true)]
async fn backfill_runs_a_past_range_in_turn() {
    let c = cluster();
    let node = c.node("a").await;
    let (w, seen) = worker(node.clone(), c.clock.clone(), 2_000, &[]);
    let spec = job("daily", "0 3 * * *", |_| {});
    node.create_cron_job(spec, false).await.unwrap();
    let now = c.now();
    let (_, occ) = node
        .backfill_cron_job(NS, "daily", now - 5 * 24 * 3_600_000, now, Some("buffer-all"))
        .await
        .unwrap();
    assert_eq!(occ.len(), 5);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let r = runs(&node, "daily").await;
    assert_eq!(r.iter().map(|e| e.cron_occurrence_ms).collect::<Vec<_>>(), occ);
    assert!(r.iter().all(|e| e.status() == ExecutionStatus::Succeeded));
    let seen = seen.lock().unwrap().clone();
    assert!(!overlaps(&r, &seen), "buffer-all: one after the other");
    w.abort();
    node.stop().await;
}

/// A catch-up round of 4 occurrences in a namespace whose `pending_max` is 3: not refused whole
/// on every retry (the job stalled forever), but split: 3 go through, the 4th waits in the
/// outbox and goes through once a worker has finished some.
#[tokio::test(start_paused = true)]
async fn a_round_larger_than_pending_max_is_split_to_fit() {
    let c = cluster();
    let quotas = Quotas {
        default: Quota::default(),
        namespaces: BTreeMap::from([(
            NS.to_string(),
            Quota { pending_max: 3, ..Quota::default() },
        )]),
    };
    let node = c.node_with("a", quotas.clone()).await;
    let spec = job("all", "*/15 * * * *", |p| {
        p.missed = "all".into();
        p.overlap = "allow".into();
    });
    node.create_cron_job(spec, false).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    node.kill().await;
    tokio::time::sleep(Duration::from_secs(3 * 3600)).await;
    let node = c.node_with("a", quotas).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The catch-up window (1 h) holds 4 occurrences; the quota has room for 3.
    assert_eq!(runs(&node, "all").await.len(), 3, "as many as the quota has room for");
    let j = node.scheduler().get_cron_job(NS, "all").await.unwrap();
    assert_eq!(j.pending.len(), 1, "the 4th waits in the outbox");
    let (w, _) = worker(node.clone(), c.clock.clone(), 100, &[]);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let r = runs(&node, "all").await;
    assert_eq!(r.len(), 4, "the 4th went through once there was room");
    assert!(r.iter().all(|e| e.status() == ExecutionStatus::Succeeded), "{r:?}");
    let j = node.scheduler().get_cron_job(NS, "all").await.unwrap();
    assert!(j.pending.is_empty(), "the outbox is empty");
    let text = node.metrics_text().await;
    let refused = text
        .lines()
        .find_map(|l| l.strip_prefix("kairos_quota_refused_total{quota=\"pending\"} "))
        .and_then(|n| n.trim().parse::<f64>().ok());
    assert!(refused.is_some_and(|n| n >= 1.0), "the refusals are counted: {text}");
    w.abort();
    node.stop().await;
}
