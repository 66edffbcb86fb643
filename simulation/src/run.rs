//! One seed's run: the turmoil world (node hosts, worker hosts, the client), the fault
//! schedule applied between steps, then the checkers.
#![allow(clippy::disallowed_methods)] // tokio's timer is turmoil's simulated clock here

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_actors::node::Node;
use kairos_layer::env::{Rng, SharedClock};
use kairos_layer::kv::Database;
use kairos_layer::kv::memory::MemoryDatabase;
use kairos_sdk::{Client, Worker};

use crate::clock::SimClock;
use crate::plan::{Action, CLIENT, Plan, worker_host};
use crate::store::{GatedStore, NodeGate, StoreGate};
use crate::workload::{self, History, Shared};

/// The seed running and its simulated seconds (`seed << 24 | seconds`), for a watchdog: a
/// step that never ends (a task spinning without letting simulated time advance) shows as no
/// progress.
pub static PROGRESS: AtomicU64 = AtomicU64::new(0);

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    /// The plan it ran.
    pub plan: Plan,
    /// Violated invariants (empty: passed).
    pub violations: Vec<String>,
    /// The trace hash.
    pub hash: u64,
    /// Simulated time the run took.
    pub simulated: Duration,
    /// Rare paths reached, with counts.
    pub reached: BTreeMap<&'static str, u64>,
    /// The event trace.
    pub trace: Vec<String>,
}

impl Outcome {
    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The failure report: seed, knobs, violations and the replay command.
    pub fn report(&self) -> String {
        format!(
            "seed {} FAILED\n{}violations:\n  {}\nreplay: cargo run --release -p kairos-simulation -- --seed {} --trace\n",
            self.plan.seed,
            self.plan.describe(),
            self.violations.join("\n  "),
            self.plan.seed
        )
    }
}

/// Runs `seed`.
pub fn run(seed: u64) -> Outcome {
    run_plan(Plan::from_seed(seed))
}

/// Runs a plan.
pub fn run_plan(plan: Plan) -> Outcome {
    let history: Shared = Arc::new(Mutex::new(History::default()));
    let rng = Rng::seeded(plan.seed ^ 0x0005_707E);
    let store_clock: SharedClock = Arc::new(SimClock::new(0));
    let memory = Arc::new(MemoryDatabase::with_faults(store_clock, rng.fork(), plan.storage));
    let store_gate = Arc::new(StoreGate::new(rng.fork()));
    let gates: Vec<Arc<NodeGate>> = plan.nodes.iter().map(|_| Arc::default()).collect();
    let nodes_seen: Arc<Mutex<Vec<Node>>> = Arc::default();

    let limit = plan.liveness_bound() + crate::plan::FAULT_WINDOW + Duration::from_secs(120);
    let mut sim = turmoil::Builder::new()
        .simulation_duration(limit)
        .tick_duration(Duration::from_millis(plan.tick_ms))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(plan.max_message_latency_ms))
        .rng_seed(plan.seed)
        .build();

    for (i, n) in plan.nodes.iter().enumerate() {
        let config = plan.node_config(i);
        let skew = n.skew_ms;
        let (memory, gate, store_gate) = (memory.clone(), gates[i].clone(), store_gate.clone());
        let boots = Arc::new(AtomicU64::new(0));
        let node_seed = rng.next_u64();
        let (history, nodes_seen) = (history.clone(), nodes_seen.clone());
        sim.host(n.name.as_str(), move || {
            let config = config.clone();
            let kv = Arc::new(GatedStore::new(memory.clone(), gate.clone(), store_gate.clone()));
            let boot = boots.fetch_add(1, Ordering::SeqCst);
            let (history, nodes_seen) = (history.clone(), nodes_seen.clone());
            async move {
                let clock: SharedClock = Arc::new(SimClock::new(skew));
                let rng = Rng::seeded(node_seed ^ boot.wrapping_mul(0x9E37_79B9));
                let db = Database::new(kv, clock.clone(), rng.fork());
                let name = config.node_id.clone().unwrap_or_default();
                let node = loop {
                    match Node::start(config.clone(), db.clone(), clock.clone(), rng.fork()).await {
                        Ok(n) => break n,
                        Err(e) => {
                            history
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .event(format!("{name} start failed: {e}"));
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                };
                {
                    let mut h = history.lock().unwrap_or_else(|e| e.into_inner());
                    h.event(format!("{name} started (boot {boot})"));
                    if boot > 0 {
                        h.reach("node restarted");
                    }
                }
                nodes_seen.lock().unwrap_or_else(|e| e.into_inner()).push(node.clone());
                crate::net::serve(node).await?;
                Ok(())
            }
        });
    }

    for g in 0..plan.worker_groups {
        let name = worker_host(g);
        let nodes: Vec<String> = plan.nodes.iter().map(|n| n.name.clone()).collect();
        let concurrency = plan.worker_concurrency;
        let lanes = plan.lanes.clone();
        let boots = Arc::new(AtomicU64::new(0));
        let history = history.clone();
        let host = name.clone();
        sim.host(name.as_str(), move || {
            let boot = boots.fetch_add(1, Ordering::SeqCst);
            let (nodes, history, host) = (nodes.clone(), history.clone(), host.clone());
            let lanes = lanes.clone();
            async move {
                let (_stop, stop_rx) = tokio::sync::watch::channel(false);
                let mut tasks = Vec::new();
                // One worker per node and lane: each serves its lane's namespace and queue
                // only, and runs whatever it is sent (a task of another lane is recorded).
                for n in &nodes {
                    // The lanes' workers share one channel (one connection) to the node.
                    let channel = crate::net::channel(n);
                    for (li, lane) in lanes.iter().enumerate() {
                        let id = format!("{host}-{n}-{}-{}-b{boot}", lane.namespace, lane.queue);
                        history
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .workers
                            .insert(id.clone(), li);
                        let client = Client::from_channel(channel.clone())
                            .with_timeout(Duration::from_secs(2))
                            .with_namespace(lane.namespace.clone());
                        let worker = Worker::new(client, lane.queue.clone(), id.clone())
                            .concurrency(concurrency)
                            .fallback(workload::handler(history.clone(), id, lane.clone()));
                        tasks.push(tokio::spawn(worker.run(stop_rx.clone())));
                    }
                }
                for t in tasks {
                    match t.await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return Err(format!("worker stopped: {e}").into()),
                        Err(e) => return Err(format!("worker panicked: {e}").into()),
                    }
                }
                Ok(())
            }
        });
    }

    {
        let (plan, history) = (plan.clone(), history.clone());
        sim.client(CLIENT, workload::client(plan, history));
    }

    let mut schedule = plan.schedule.iter().peekable();
    let mut crashed: std::collections::BTreeSet<String> = Default::default();
    let mut violations = Vec::new();
    loop {
        let now = sim.elapsed().as_millis() as u64;
        PROGRESS.store((plan.seed << 24) | (now / 1_000), Ordering::Relaxed);
        while let Some((t, a)) = schedule.peek() {
            if *t > now {
                break;
            }
            apply(&mut sim, a, &gates, &store_gate, &mut crashed, &history);
            schedule.next();
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                violations.push(format!("simulation error: {e}"));
                break;
            }
        }
    }
    let simulated = sim.elapsed();
    drop(sim);

    let mut h = std::mem::take(&mut *history.lock().unwrap_or_else(|e| e.into_inner()));
    violations.extend(crate::check::check(&plan, &h));
    if !violations.is_empty() {
        // What the store itself says (records, references, every READY execution on its ready
        // queue and every timer indexed): often the shortest way to the cause.
        violations.extend(store_findings(&memory, &plan));
    }
    // Rare paths reached, from the nodes' own counters (every incarnation) and the store.
    for n in nodes_seen.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let m = n.metrics();
        let outcomes = kairos_actors::server::metrics::OUTCOMES;
        for (i, o) in outcomes.iter().enumerate() {
            if *o == "fenced_out" {
                *h.reached.entry("result fenced out (stale token)").or_default() +=
                    m.attempts[i].load(Ordering::Relaxed);
            }
        }
        *h.reached.entry("attempt lease expired").or_default() +=
            m.lease_expiries.load(Ordering::Relaxed);
        *h.reached.entry("store retry (conflict)").or_default() +=
            m.store_retries_conflict.load(Ordering::Relaxed);
        *h.reached.entry("store retry (other: too old, unknown result)").or_default() +=
            m.store_retries_other.load(Ordering::Relaxed);
        *h.reached.entry("clock skew suspected").or_default() +=
            m.clock_skew_suspected.load(Ordering::Relaxed);
        *h.reached.entry("actor restarted").or_default() +=
            m.actor_restarts.load(Ordering::Relaxed);
        *h.reached
            .entry("execution pre-fired (started ahead, handed over when due)")
            .or_default() += m.prefired.load(Ordering::Relaxed);
    }
    *h.reached.entry("commit unknown result during region failover").or_default() +=
        store_gate.failover_unknown.load(Ordering::Relaxed);
    *h.reached.entry("commit stalled (starved node)").or_default() +=
        store_gate.stalled_commits.load(Ordering::Relaxed);
    let mut retried = 0;
    for starts in h.starts.values() {
        let mut tokens: Vec<u64> = starts.iter().map(|s| s.token).collect();
        tokens.dedup();
        if tokens.len() > 1 {
            retried += 1;
        }
    }
    *h.reached.entry("execution with several attempts").or_default() += retried;
    let mut late = 0;
    for (id, starts) in &h.starts {
        if let Some((_, attempts)) = h.finals.get(id) {
            let abandoned = kairos_proto::v1::AttemptStatus::Abandoned as i32;
            late += starts
                .iter()
                .filter(|s| attempts.iter().any(|a| a.number == s.attempt && a.status == abandoned))
                .count() as u64;
        }
    }
    *h.reached.entry("handler ran an attempt its node released uncounted").or_default() += late;
    let cron = h.listed.iter().filter(|e| !e.cron_job_id.is_empty()).count() as u64;
    *h.reached.entry("cron occurrence materialized").or_default() += cron;
    h.reached.retain(|_, n| *n > 0);
    Outcome {
        hash: crate::check::trace_hash(&h),
        violations,
        simulated,
        reached: std::mem::take(&mut h.reached),
        trace: std::mem::take(&mut h.trace),
        plan,
    }
}

fn apply(
    sim: &mut turmoil::Sim<'_>,
    a: &Action,
    gates: &[Arc<NodeGate>],
    store: &StoreGate,
    crashed: &mut std::collections::BTreeSet<String>,
    history: &Shared,
) {
    let mut h = history.lock().unwrap_or_else(|e| e.into_inner());
    let t = sim.elapsed().as_millis();
    h.trace.push(format!("{t:>8} fault {a:?}"));
    match a {
        Action::Crash(host) => {
            if crashed.insert(host.clone()) {
                sim.crash(host.as_str());
                h.reach("host crashed");
            }
        }
        Action::Restart(host) => {
            if crashed.remove(host) {
                sim.bounce(host.as_str());
            }
        }
        Action::Partition(a, b) => {
            sim.partition(a.as_str(), b.as_str());
            h.reach("partition");
        }
        Action::Repair(a, b) => sim.repair(a.as_str(), b.as_str()),
        Action::Hold(a, b) => {
            sim.hold(a.as_str(), b.as_str());
            h.reach("worker paused");
        }
        Action::Release(a, b) => sim.release(a.as_str(), b.as_str()),
        Action::CutStore(i) => {
            gates[*i].cut.store(true, Ordering::SeqCst);
            h.reach("node cut off from the store");
        }
        Action::HealStore(i) => gates[*i].cut.store(false, Ordering::SeqCst),
        Action::StallCommits(i, ms) => gates[*i].commit_delay_ms.store(*ms, Ordering::SeqCst),
        Action::FailoverStart => {
            store.failover.store(true, Ordering::SeqCst);
            h.reach("region lost");
        }
        Action::FailoverEnd => store.failover.store(false, Ordering::SeqCst),
    }
}

/// The integrity check of the shared store after the run (`kairos check`'s record check).
fn store_findings(memory: &Arc<MemoryDatabase>, plan: &Plan) -> Vec<String> {
    let clock: SharedClock =
        Arc::new(kairos_layer::env::ManualClock::new(kairos_layer::env::Timestamp::from_millis(0)));
    let db = Database::new(memory.clone(), clock, Rng::seeded(plan.seed));
    let ks = kairos_layer::keys::Keyspace::new(&plan.node_config(0).cluster);
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return Vec::new();
    };
    match rt.block_on(kairos_layer::ops::check::check_records(&db, &ks, |_| {})) {
        Ok(r) if r.is_clean() => {
            vec![format!(
                "store: passes the integrity check ({} keys, {} executions)",
                r.keys, r.executions
            )]
        }
        Ok(r) => r
            .findings
            .iter()
            .take(20)
            .map(|f| format!("store: {} — {}", f.key, f.problem))
            .collect(),
        Err(e) => vec![format!("store: the integrity check failed: {e}")],
    }
}
