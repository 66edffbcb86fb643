//! In-process node tests: one or more nodes over one shared memory backend, with simulated
//! time (tokio's paused clock drives the injected clock, so waits are exact and instant).

#![allow(clippy::disallowed_methods)] // the tests wait on tokio's paused clock

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kairos_actors::node::{Node, WorkerPoll, WorkerStream};
use kairos_actors::server::config::{Backend, NodeConfig};
use kairos_layer::env::{Rng, SharedClock, Timestamp, TokioClock};
use kairos_layer::kv::Database;
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use kairos_layer::ops::Error;
use kairos_layer::ops::submit::SubmitRequest;
use kairos_proto::storage::v1::{AttemptStatus, ExecutionStatus};

use common::NodeTestOps;

const NS: &str = "default";
const SHARDS: u32 = 8;

const DEF: &str = r#"
name: job
version: 1
inputs:
  n: int
retry: {max_attempts: 3, base_delay: 1s, max_delay: 4s}
timeouts: {lease: 2s}
execution: {type: command, command: ["true"]}
"#;

struct Cluster {
    db: Database,
    clock: SharedClock,
}

fn cluster() -> Cluster {
    let clock: SharedClock =
        Arc::new(TokioClock::starting_at(Timestamp::from_millis(1_790_000_000_000)));
    let db = MemoryDatabase::open(clock.clone(), Rng::seeded(7), FaultConfig::none());
    Cluster { db, clock }
}

fn config(node_id: &str) -> NodeConfig {
    NodeConfig {
        node_id: Some(node_id.into()),
        backend: Backend::Memory,
        shard_count: SHARDS,
        shard_lease_ms: 3_000,
        node_ttl_ms: 6_000,
        poll_interval_ms: 500,
        window_ms: 10_000,
        ..NodeConfig::default()
    }
}

impl Cluster {
    async fn node(&self, id: &str) -> Node {
        let node = Node::start(
            config(id),
            self.db.clone(),
            self.clock.clone(),
            Rng::seeded(kairos_layer::ids::fnv1a64(id.as_bytes())),
        )
        .await
        .expect("node starts");
        let def = kairos_layer::definition::parse_definition(DEF).unwrap();
        node.scheduler().register_definition(NS, def, "test").await.unwrap();
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

fn submit_at(at: i64, n: i64) -> SubmitRequest {
    SubmitRequest {
        namespace: NS.into(),
        definition: "job".into(),
        definition_version: 1,
        inputs: serde_json::json!({ "n": n }),
        execute_at_ms: at,
        idempotency_key: None,
        delay_ms: None,
        traceparent: None,
    }
}

fn poll(worker: &str, max: usize) -> WorkerPoll {
    WorkerPoll {
        namespace: NS.into(),
        queue: "job".into(),
        worker_id: worker.into(),
        max,
        lease_ms: None,
        wait_ms: 1_000,
    }
}

/// A worker that completes everything it gets; records (id → handler start).
async fn run_worker(node: Node, name: &'static str, until_count: usize) -> BTreeMap<String, i64> {
    let mut started = BTreeMap::new();
    while started.len() < until_count {
        for c in node.poll(poll(name, 64)).await.expect("poll") {
            started.insert(c.execution.id.clone(), c.attempt.started_at_ms);
            node.complete(NS, &c.execution.id, c.attempt.fencing_token, Vec::new(), String::new())
                .await
                .unwrap();
        }
    }
    started
}

#[tokio::test(start_paused = true)]
async fn fires_at_execute_at_never_before_and_within_precision() {
    let c = cluster();
    let node = c.node("a").await;
    wait_for("all shards owned", || node.owned_shards().len() == SHARDS as usize).await;
    let t0 = c.now();
    let mut due = BTreeMap::new();
    for i in 0..40 {
        let at = t0 + 1_000 + i * 137;
        let s = node.submit(submit_at(at, i)).await.unwrap();
        due.insert(s.execution.id, at);
    }
    let started = run_worker(node.clone(), "w", due.len()).await;
    for (id, at) in &due {
        let s = started[id];
        assert!(s >= *at, "{id} started {} ms before execute_at", at - s);
        assert!(s - at <= 25, "{id} started {} ms late", s - at);
    }
    assert_eq!(node.metrics().lateness_start.count(), 40);
    let text = node.metrics_text().await;
    assert!(text.contains("kairos_executions{state=\"SUCCEEDED\"} 40"), "{text}");
    node.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_burst_due_at_one_instant_all_fires() {
    let c = cluster();
    let node = c.node("a").await;
    wait_for("all shards owned", || node.owned_shards().len() == SHARDS as usize).await;
    let at = c.now() + 2_000;
    for i in 0..1_000 {
        node.submit(submit_at(at, i)).await.unwrap();
    }
    let workers: Vec<_> = ["w0", "w1", "w2", "w3"]
        .into_iter()
        .map(|w| tokio::spawn(run_worker(node.clone(), w, usize::MAX)))
        .collect();
    wait_for("all 1000 done", || {
        node.metrics().attempts[0].load(std::sync::atomic::Ordering::Relaxed) == 1_000
    })
    .await;
    for w in workers {
        w.abort();
    }
    let counts = node.scheduler().status_counts(NS).await.unwrap();
    assert!(counts.contains(&(ExecutionStatus::Succeeded, 1_000)), "{counts:?}");
    assert!(c.now() - at < 5_000, "drained within 5 s of simulated time");
    node.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_silent_worker_loses_its_lease_then_retries_then_fail() {
    let c = cluster();
    let node = c.node("a").await;
    wait_for("all shards owned", || node.owned_shards().len() == SHARDS as usize).await;
    let id = node.submit(submit_at(c.now(), 1)).await.unwrap().execution.id;
    let mut tokens = Vec::new();
    // The worker claims, says it has the task (one heartbeat: the attempt reached it, so a
    // lost lease counts; one it never heard of would be released uncounted), then goes
    // silent: no heartbeat, no result.
    while tokens.len() < 3 {
        for claimed in node.poll(poll("silent", 1)).await.unwrap() {
            let token = claimed.attempt.fencing_token;
            node.heartbeat_one(NS, &id, token).await.unwrap();
            tokens.push((token, c.now()));
        }
    }
    for _ in 0..600 {
        if node.scheduler().get(NS, &id).await.unwrap().status() == ExecutionStatus::Failed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(node.scheduler().get(NS, &id).await.unwrap().status(), ExecutionStatus::Failed);
    let attempts = node.scheduler().attempts(NS, &id).await.unwrap();
    assert_eq!(attempts.len(), 3, "max_attempts");
    assert!(attempts.iter().all(|a| a.status() == AttemptStatus::TimedOut));
    // Backoff between attempts: each retry started after the previous lease (2 s) expired.
    for w in attempts.windows(2) {
        assert!(w[1].started_at_ms >= w[0].lease_expires_at_ms, "{w:?}");
        assert!(
            w[1].started_at_ms <= w[0].lease_expires_at_ms + 4_000 + 600,
            "within the back-off cap"
        );
    }
    assert_eq!(node.metrics().lease_expiries.load(std::sync::atomic::Ordering::Relaxed), 3);
    node.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_stale_worker_cannot_complete() {
    let c = cluster();
    let node = c.node("a").await;
    wait_for("all shards owned", || node.owned_shards().len() == SHARDS as usize).await;
    let id = node.submit(submit_at(c.now(), 1)).await.unwrap().execution.id;
    let first = loop {
        if let Some(x) = node.poll(poll("old", 1)).await.unwrap().pop() {
            break x;
        }
    };
    let second = loop {
        if let Some(x) = node.poll(poll("new", 1)).await.unwrap().pop() {
            break x;
        }
    };
    assert_eq!(second.attempt.number, 2);
    let e = node
        .complete(NS, &id, first.attempt.fencing_token, Vec::new(), String::new())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::FencedOut { .. }), "{e}");
    assert!(node.heartbeat_one(NS, &id, first.attempt.fencing_token).await.is_err());
    let done = node
        .complete(NS, &id, second.attempt.fencing_token, Vec::new(), String::new())
        .await
        .unwrap();
    assert_eq!(done.status(), ExecutionStatus::Succeeded);
    node.stop().await;
}

#[tokio::test(start_paused = true)]
async fn two_nodes_split_shards_and_the_survivor_takes_over() {
    let c = cluster();
    let a = c.node("a").await;
    let b = c.node("b").await;
    wait_for("shards split", || {
        a.owned_shards().len() + b.owned_shards().len() == SHARDS as usize
            && a.owned_shards().len() == SHARDS as usize / 2
    })
    .await;
    let t0 = c.now();
    let mut due = BTreeMap::new();
    for i in 0..60 {
        let at = t0 + 2_000 + i * 100;
        let node = if i % 2 == 0 { &a } else { &b };
        due.insert(node.submit(submit_at(at, i)).await.unwrap().execution.id, at);
    }
    a.kill().await; // crash: no drain, leases stay until they expire
    let started = run_worker(b.clone(), "w", due.len()).await;
    assert_eq!(b.owned_shards().len(), SHARDS as usize, "b took every shard over");
    for (id, at) in &due {
        if started[id] < *at {
            let e = b.scheduler().get(NS, id).await.unwrap();
            let atts = b.scheduler().attempts(NS, id).await.unwrap();
            panic!(
                "{id} fired before its time: at {at} started {} t0 {t0}\n{e:?}\n{atts:?}",
                started[id]
            );
        }
    }
    let late = due.iter().map(|(id, at)| started[id] - at).max().unwrap();
    assert!(late <= 10_000, "taken over within lease expiry + a poll: {late} ms");
    b.stop().await;
}

#[tokio::test(start_paused = true)]
async fn cancel_before_fire_prevents_dispatch() {
    let c = cluster();
    let node = c.node("a").await;
    wait_for("all shards owned", || node.owned_shards().len() == SHARDS as usize).await;
    let keep = node.submit(submit_at(c.now() + 1_000, 1)).await.unwrap().execution.id;
    let cancel = node.submit(submit_at(c.now() + 1_000, 2)).await.unwrap().execution.id;
    node.cancel(NS, &cancel, "test").await.unwrap();
    let started = run_worker(node.clone(), "w", 1).await;
    assert!(started.contains_key(&keep));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        node.poll(poll("w", 8)).await.unwrap().is_empty(),
        "cancelled execution never dispatched"
    );
    assert_eq!(
        node.scheduler().get(NS, &cancel).await.unwrap().status(),
        ExecutionStatus::Cancelled
    );
    node.stop().await;
}

#[tokio::test(start_paused = true)]
async fn graceful_drain_releases_leases_for_an_immediate_takeover() {
    let c = cluster();
    let a = c.node("a").await;
    wait_for("all shards owned", || a.owned_shards().len() == SHARDS as usize).await;
    a.drain().await;
    let leases =
        a.scheduler().partition_leases(kairos_layer::keys::Space::Executions).await.unwrap();
    assert!(leases.iter().all(|l| l.expires_at_ms == 0), "released: {leases:?}");
    assert!(a.owned_shards().is_empty());
    let before = c.now();
    let b = c.node("b").await;
    wait_for("b owns every shard", || b.owned_shards().len() == SHARDS as usize).await;
    assert!(c.now() - before < 3_000, "no wait for lease expiry");
    assert!(a.poll(poll("w", 1)).await.is_err() || a.poll(poll("w", 1)).await.unwrap().is_empty());
    a.stop().await;
    b.stop().await;
}

#[tokio::test(start_paused = true)]
async fn work_claimed_for_a_vanished_poll_goes_to_the_next_poller() {
    let c = cluster();
    let node = c.node("a").await;
    wait_for("all shards owned", || node.owned_shards().len() == SHARDS as usize).await;
    // A worker polls an empty queue, then disconnects while its poll is parked.
    let dead = {
        let node = node.clone();
        tokio::spawn(
            async move { node.poll(WorkerPoll { wait_ms: 10_000, ..poll("dead", 1) }).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    dead.abort();
    let t0 = c.now();
    let id = node.submit(submit_at(t0, 1)).await.unwrap().execution.id;
    let got = loop {
        if let Some(x) = node.poll(poll("alive", 1)).await.unwrap().pop() {
            break x;
        }
    };
    assert_eq!(got.execution.id, id);
    // The submit itself may have started it for the vanished poll (sync match at submit,
    // before "alive" polled): then it was released at once — READY again, the attempt not
    // counted against the retry policy — and claimed again; a fire's match is handed over.
    assert!(got.attempt.number <= 2, "handed over or released, not retried after a lease expiry");
    let e = node.scheduler().get(NS, &id).await.unwrap();
    assert_eq!(e.attempts_released, got.attempt.number - 1, "an earlier attempt was a release");
    assert!(c.now() - t0 < 2_000, "before the 2 s lease ran out");
    node.complete(NS, &id, got.attempt.fencing_token, Vec::new(), String::new()).await.unwrap();
    node.stop().await;
}

/// Simulation seed 437: a worker stream that reopened while all its slots were busy (credits 0)
/// and got its slots back later as credits was never served from the ready queues — the node
/// sized the queue's dispatch buffer by the credits the stream opened with (0), so it never
/// claimed; only fire-time matches reached the worker, and work already READY waited forever.
#[tokio::test(start_paused = true)]
async fn a_stream_opened_with_no_free_slots_gets_ready_work_once_it_frees_one() {
    let c = cluster();
    let node = c.node("a").await;
    wait_for("all shards owned", || node.owned_shards().len() == SHARDS as usize).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let session = node
        .open_stream(WorkerStream {
            namespace: NS.into(),
            queue: "job".into(),
            worker_id: "busy".into(),
            lease_ms: None,
            credits: 0, // every slot busy with work from before the stream broke
            tasks: tx,
        })
        .await
        .unwrap();
    let id = node.submit(submit_at(c.now(), 1)).await.unwrap().execution.id;
    // Nobody can take it: it waits — held due for this node's own busy worker (the node is
    // alone: nothing READY for other nodes' workers), not started.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let status = node.scheduler().get(NS, &id).await.unwrap().status();
    assert_eq!(status, ExecutionStatus::Scheduled, "held for the busy worker");
    assert!(rx.try_recv().is_err(), "no task for a stream without credits");
    // A task from before finishes: its result frees a slot.
    let t0 = c.now();
    node.stream_credits(session, 1);
    let got = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("the waiting execution reaches the stream once it has a free slot")
        .expect("the stream is open");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].execution.id, id);
    assert!(c.now() - t0 < 1_000, "started at once, not after some timeout");
    node.close_stream(session);
    node.stop().await;
}

/// Pre-fires: a worker stream with free slots gets each execution at its `execute_at` — never
/// before — though it was started ahead (`prefire_ms`), its attempt recorded as started then.
#[tokio::test(start_paused = true)]
async fn executions_pre_fired_for_a_stream_reach_it_when_due_never_before() {
    let c = cluster();
    let node = c.node("a").await;
    wait_for("all shards owned", || node.owned_shards().len() == SHARDS as usize).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let session = node
        .open_stream(WorkerStream {
            namespace: NS.into(),
            queue: "job".into(),
            worker_id: "w".into(),
            lease_ms: None,
            credits: 4,
            tasks: tx,
        })
        .await
        .unwrap();
    let t0 = c.now();
    let mut due = BTreeMap::new();
    for i in 0..20 {
        let at = t0 + 1_000 + i * 137;
        due.insert(node.submit(submit_at(at, i)).await.unwrap().execution.id, at);
    }
    let mut seen = 0;
    while seen < due.len() {
        let got = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("work keeps coming")
            .expect("the stream is open");
        let now = c.now();
        for t in got {
            let at = due[&t.execution.id];
            assert!(now >= at, "{} reached its worker {} ms early", t.execution.id, at - now);
            assert!(now - at <= 5, "{} reached its worker {} ms late", t.execution.id, now - at);
            assert_eq!(t.attempt.started_at_ms, at, "recorded as started when due");
            let token = t.attempt.fencing_token;
            node.complete(NS, &t.execution.id, token, Vec::new(), String::new()).await.unwrap();
            node.stream_credits(session, 1);
            seen += 1;
        }
    }
    let prefired = node.metrics().prefired.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(prefired, due.len() as u64, "every one started ahead of its time");
    node.close_stream(session);
    node.stop().await;
}

/// Issue 21, step 3: a burst due at one instant, one worker stream with 8 slots. A node alone
/// holds what its worker cannot take yet and starts it at a later fire when the worker returns
/// credits: every execution starts at its fire (no READY write, no claim), once, in due order
/// per shard; the store stays consistent.
#[tokio::test(start_paused = true)]
async fn a_burst_for_a_busy_worker_is_started_at_fire_as_room_appears() {
    let c = cluster();
    let node = c.node("a").await;
    wait_for("all shards owned", || node.owned_shards().len() == SHARDS as usize).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // the lease manager knows it is alone
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let session = node
        .open_stream(WorkerStream {
            namespace: NS.into(),
            queue: "job".into(),
            worker_id: "w".into(),
            lease_ms: None,
            credits: 8,
            tasks: tx,
        })
        .await
        .unwrap();
    let due = c.now() + 1_000;
    let n = 400;
    for i in 0..n {
        node.submit(submit_at(due, i)).await.unwrap();
    }
    let (mut done, mut seen) = (0, std::collections::BTreeSet::new());
    while done < n {
        let got = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("work keeps coming")
            .expect("the stream is open");
        for t in got {
            assert!(seen.insert(t.execution.id.clone()), "each started once");
            let token = t.attempt.fencing_token;
            node.complete(NS, &t.execution.id, token, Vec::new(), String::new()).await.unwrap();
            node.stream_credits(session, 1);
            done += 1;
        }
    }
    let matched = node.metrics().matched_at_fire.load(std::sync::atomic::Ordering::Relaxed);
    let claimed = node.metrics().claimed.load(std::sync::atomic::Ordering::Relaxed);
    println!("{n} due at once, 8 slots: {matched} started at their fire, {claimed} delivered");
    assert_eq!(matched, n as u64, "every execution started at its fire: none READY, none claimed");
    node.close_stream(session);
    node.stop().await;
}

const HELD: &str = r#"
name: held
version: 1
timeouts: {lease: 600s}
execution: {type: command, command: ["true"]}
"#;

/// A node killed holding claims it never handed over — tasks sent on a stream whose worker was
/// never heard from, and its dispatch buffer — has them released by the surviving node once it
/// counts as dead (node_ttl_ms + 5 s), not after their 10-minute lease.
#[tokio::test(start_paused = true)]
async fn a_dead_nodes_unconfirmed_claims_are_released_by_the_survivor() {
    let c = cluster();
    let (a, b) = (c.node("a").await, c.node("b").await);
    let def = kairos_layer::definition::parse_definition(HELD).unwrap();
    a.scheduler().register_definition(NS, def, "test").await.unwrap();
    wait_for("shards split", || a.owned_shards().len() == SHARDS as usize / 2).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let stream = WorkerStream {
        namespace: NS.into(),
        queue: "held".into(),
        worker_id: "silent".into(),
        lease_ms: None,
        credits: 4,
        tasks: tx,
    };
    a.open_stream(stream).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..40 {
        let mut r = submit_at(c.now(), i);
        (r.definition, r.inputs) = ("held".into(), serde_json::json!({}));
        ids.push(a.submit(r).await.unwrap().execution.id);
    }
    let mut handed = 0;
    while handed < 4 {
        handed += rx.recv().await.expect("tasks for the silent worker").len();
    }
    // Its buffer claims ahead: more RUNNING than the stream got.
    let mut running = 0;
    for _ in 0..50 {
        running = 0;
        for id in &ids {
            running += usize::from(
                b.scheduler().get(NS, id).await.unwrap().status() == ExecutionStatus::Running,
            );
        }
        if running > handed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(running > handed, "a buffer beside the {handed} tasks: {running} RUNNING");
    let killed = c.now();
    a.kill().await;
    let mut done = 0;
    while done < ids.len() {
        let mut p = poll("w", 64);
        p.queue = "held".into();
        for got in b.poll(p).await.expect("poll") {
            let token = got.attempt.fencing_token;
            b.complete(NS, &got.execution.id, token, Vec::new(), String::new()).await.unwrap();
            done += 1;
        }
    }
    let after = c.now() - killed;
    println!(
        "{} executions, {running} RUNNING at the kill: all done {after} ms after it",
        ids.len()
    );
    assert!(after < 60_000, "all done {after} ms after the kill: not released before their lease");
    b.stop().await;
}
