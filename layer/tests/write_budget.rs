//! The write budget of an execution's lifecycle (issue 21): what each phase (submit, fire,
//! claim or fire with an offer, complete, retention's delete) commits — sets,
//! clears, range clears, atomic adds and their bytes — counted by the memory store at commit,
//! for one execution and for a batch of 1,000. The budgets below are the figures after issue
//! 21's steps 1 (SCHEDULED and RETRY_WAIT out of the status index) and 5 (SUCCEEDED out of it
//! too: completing sets no status entry, retention clears none) and issue 34's keyspace format
//! 4 (no by-definition entry: submitting sets none, retention clears none): a change that writes more
//! fails here (docs/benchmarks.md, "Writes per lifecycle").

mod common;

use common::*;
use kairos_layer::kv::WriteCounts;
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::ops::claim::{ClaimSlot, Claimed};
use kairos_layer::ops::fire::Offer;
use kairos_layer::ops::worker::{Outcome, Report};
use kairos_proto::storage::v1::ExecutionStatus;

const QUEUE: &str = "report";

/// A phase's budget per execution: (sets, clears, range clears, adds, set bytes, clear bytes).
type Budget = (u64, u64, u64, u64, u64, u64);

fn counts(w: &World) -> WriteCounts {
    w.store.write_counts().expect("the memory store counts its writes")
}

/// Measures `phase`, prints its row and returns what it wrote.
async fn measure<F: std::future::Future<Output = ()>>(
    w: &World,
    n: u64,
    name: &str,
    phase: F,
) -> WriteCounts {
    let before = counts(w);
    phase.await;
    let c = counts(w) - before;
    println!(
        "{n:>5} | {name:<18} | {:>4} | {:>6} | {:>6} | {:>5} | {:>5} | {:>9} | {:>9} | {:>5.1}",
        c.transactions,
        c.sets,
        c.clears,
        c.clear_ranges,
        c.adds,
        c.set_bytes,
        c.clear_bytes,
        c.point_writes() as f64 / n as f64,
    );
    c
}

/// Checks a phase against its budget per execution: exact for one execution; for a batch,
/// per-transaction writes (receipts, watermarks, range clears, and a shared lease check per
/// shard a transaction starts attempts in) may add up to `per_txn` each.
fn within(c: &WriteCounts, n: u64, b: Budget, name: &str) {
    let (sets, clears, ranges, adds, set_bytes, clear_bytes) = b;
    let per_txn = c.transactions * (2 + u64::from(SHARDS));
    assert!(c.sets <= sets * n + per_txn, "{name}: {} sets over {}", c.sets, sets * n);
    assert!(c.clears <= clears * n + per_txn, "{name}: {} clears over {}", c.clears, clears * n);
    assert!(
        c.clear_ranges <= ranges * n + c.transactions,
        "{name}: {} range clears",
        c.clear_ranges
    );
    assert!(c.adds <= adds * n, "{name}: {} adds over {}", c.adds, adds * n);
    assert!(c.set_bytes <= set_bytes * n + per_txn * 80, "{name}: {} set bytes", c.set_bytes);
    assert!(
        c.clear_bytes <= clear_bytes * n + per_txn * 80,
        "{name}: {} clear bytes",
        c.clear_bytes
    );
}

fn header(title: &str) {
    println!("\n{title}");
    println!(
        "    n | phase              | txns |   sets | clears | range |  adds | set bytes | clr bytes | writes/exec"
    );
}

async fn submit(w: &World, n: usize) {
    let at = w.now_ms() + 60_000;
    let items = (0..n).map(|i| Ok(request(Some(&format!("budget-key-{i:012}")), at))).collect();
    for r in w.sched.submit_batch(items).await.unwrap() {
        assert!(r.unwrap().created);
    }
    w.advance_ms(60_000);
}

async fn fire(w: &World, offer: &Offer) -> Vec<Claimed> {
    let mut matched = Vec::new();
    for shard in 0..SHARDS {
        loop {
            let now = w.now_ms();
            let epoch = w.epochs[shard as usize];
            let out = w.sched.fire_due(shard, epoch, now, 256, offer).await.unwrap();
            matched.extend(out.matched.into_iter().map(|m| m.claim));
            if !out.more {
                break;
            }
        }
    }
    matched
}

async fn claim(w: &World, n: usize) -> Vec<Claimed> {
    let mut got = Vec::new();
    while got.len() < n {
        let slot = ClaimSlot { worker_id: "worker-1".into(), max: 256, lease_ms: None };
        let out = w.sched.claim(NS, QUEUE, &[slot.clone(), slot.clone(), slot.clone(), slot]).await;
        let taken: Vec<Claimed> = out.unwrap().per_slot.into_iter().flatten().collect();
        assert!(!taken.is_empty(), "READY work to claim");
        got.extend(taken);
    }
    got
}

async fn complete(w: &World, claimed: &[Claimed]) {
    let reports = claimed
        .iter()
        .map(|c| {
            Ok(Report {
                namespace: NS.into(),
                execution_id: c.execution.id.clone(),
                token: c.attempt.fencing_token,
                outcome: Outcome::Success {
                    output_json: b"{}".to_vec(),
                    output_reference: "".into(),
                },
                worker_id: Some("worker-1".into()),
                queue: Some(QUEUE.into()),
            })
        })
        .collect();
    for r in w.sched.report(reports).await.unwrap() {
        assert_eq!(r.unwrap().status(), ExecutionStatus::Succeeded);
    }
}

/// Budgets per execution, per phase (sets, clears, range clears, adds, set bytes, clear bytes).
// Format 4 (issue 34): no by-definition entry — submit 5 sets / 588 B before, retention 4 clears /
// 234 B before.
const SUBMIT: Budget = (4, 0, 0, 1, 520, 0); // +8: the queue in the DUE timer (ops::hold)
// Format 3 (the spec written once, at submit, as the time index entry's value): a transition
// rewrites the state only. Before: fire 345, claim 455, complete 320, fire + start 445.
const FIRE: Budget = (2, 1, 0, 3, 225, 62);
const CLAIM: Budget = (1, 1, 0, 2, 340, 72);
const COMPLETE: Budget = (1, 0, 0, 2, 200, 0);
const RETENTION: Budget = (0, 3, 1, 1, 0, 170);
const FIRE_MATCHED: Budget = (1, 1, 0, 2, 330, 62);

async fn ready_path(n: usize) {
    let w = world(21, FaultConfig::none()).await;
    let k = n as u64;
    header(&format!("READY path, {n} execution(s)"));
    let total = counts(&w);
    let c = measure(&w, k, "submit", submit(&w, n)).await;
    within(&c, k, SUBMIT, "submit");
    let c = measure(&w, k, "fire -> READY", async {
        assert!(fire(&w, &Offer::new()).await.is_empty());
    })
    .await;
    within(&c, k, FIRE, "fire");
    let mut claimed = Vec::new();
    let c = measure(&w, k, "claim", async { claimed = claim(&w, n).await }).await;
    within(&c, k, CLAIM, "claim");
    let c = measure(&w, k, "complete", complete(&w, &claimed)).await;
    within(&c, k, COMPLETE, "complete");
    w.advance_ms(1);
    let c = measure(&w, k, "retention", async {
        let mut deleted = 0;
        while deleted < k {
            deleted += w.sched.sweep_terminal(NS, w.now_ms(), 500).await.unwrap().deleted;
        }
    })
    .await;
    within(&c, k, RETENTION, "retention");
    let all = counts(&w) - total;
    println!(
        "lifecycle: {all:?}, {:.1} point writes per execution",
        all.point_writes() as f64 / k as f64
    );
    w.check_invariants().await;
}

async fn sync_match(n: usize) {
    let w = world(22, FaultConfig::none()).await;
    let k = n as u64;
    header(&format!("sync match (fire with an offer), {n} execution(s)"));
    let total = counts(&w);
    let c = measure(&w, k, "submit", submit(&w, n)).await;
    within(&c, k, SUBMIT, "submit");
    let slot = ClaimSlot { worker_id: "worker-1".into(), max: 256, lease_ms: None };
    let offer: Offer = [((NS.to_string(), QUEUE.to_string()), vec![slot; n.div_ceil(256)])].into();
    let mut matched = Vec::new();
    let c = measure(&w, k, "fire + start", async { matched = fire(&w, &offer).await }).await;
    within(&c, k, FIRE_MATCHED, "fire with an offer");
    assert_eq!(matched.len(), n, "every execution started by its fire");
    let c = measure(&w, k, "complete", complete(&w, &matched)).await;
    within(&c, k, COMPLETE, "complete");
    let all = counts(&w) - total;
    println!(
        "lifecycle: {all:?}, {:.1} point writes per execution",
        all.point_writes() as f64 / k as f64
    );
    w.check_invariants().await;
}

#[tokio::test]
async fn one_execution_ready_path() {
    ready_path(1).await;
}

#[tokio::test]
async fn a_thousand_executions_ready_path() {
    ready_path(1_000).await;
}

#[tokio::test]
async fn one_execution_sync_match() {
    sync_match(1).await;
}

#[tokio::test]
async fn a_thousand_executions_sync_match() {
    sync_match(1_000).await;
}
