//! What the cluster tests watch while faults happen: who owns which shard (and when the
//! shards of a dead or cut-off node moved), how far a burst got, when a timer of a given set
//! of shards was first fired again after a fault, whether every duplicate start waited for an
//! attempt lease to run out, and a steady trickle of submissions through every node.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use kairos_sdk::Client;

use super::load::{Acked, LEASE_MS, Verdict, starts_now, submit_burst};
use super::procs::{Start, Starts};

/// The machine's clock, ms since the epoch (nodes, workers and the test share it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The execution shards `node` holds, and the shard count.
pub async fn owned_by(client: &Client, node: &str) -> Result<(BTreeSet<u32>, u32)> {
    let (leases, count) = client.shards("executions").await?;
    let now = now_ms();
    let mine = leases
        .iter()
        .filter(|l| l.owner == node && l.expires_at_ms > now)
        .map(|l| l.partition)
        .collect();
    Ok((mine, count))
}

/// Waits until none of `shards` is owned by `node` any more and each has a live owner;
/// returns how long that took from `since_ms`.
pub async fn wait_moved(
    client: &Client,
    node: &str,
    shards: &BTreeSet<u32>,
    since_ms: i64,
    within: Duration,
) -> Result<Duration> {
    let t = Instant::now();
    loop {
        if let Ok((leases, _)) = client.shards("executions").await {
            let now = now_ms();
            let moved = shards.iter().all(|s| {
                leases.iter().any(|l| {
                    l.partition == *s
                        && l.owner != node
                        && !l.owner.is_empty()
                        && l.expires_at_ms > now
                })
            });
            if moved {
                return Ok(Duration::from_millis((now - since_ms).max(0) as u64));
            }
        }
        if t.elapsed() > within {
            bail!("the shards of {node} did not move within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `fraction` of `acked` started (at most `within`).
pub async fn wait_fraction(starts: &Starts, acked: &[Acked], fraction: f64, within: Duration) {
    let ids: std::collections::HashSet<&str> = acked.iter().map(|a| a.id.as_str()).collect();
    let want = (acked.len() as f64 * fraction) as usize;
    let t = Instant::now();
    while t.elapsed() < within {
        let started: BTreeSet<String> = starts_now(starts)
            .into_iter()
            .filter(|s| ids.contains(s.id.as_str()))
            .map(|s| s.id)
            .collect();
        if started.len() >= want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first execution of `shards` fired after `after_ms` and started by a worker in
/// `workers`: `(fired ms, started ms)`. An execution's fire is when it became READY, or
/// when its attempt started if the fire handed it straight to a worker; executions already
/// fired before `after_ms` (READY, or held by a dispatch buffer) do not count.
pub async fn first_fire_after(
    client: &Client,
    starts: &[Start],
    shards: &BTreeSet<u32>,
    shard_count: u32,
    after_ms: i64,
    workers: &[u8],
) -> Result<Option<(i64, i64)>> {
    let mut later: Vec<&Start> = starts
        .iter()
        .filter(|s| s.at_us / 1_000 >= after_ms && workers.contains(&s.worker))
        .filter(|s| shards.contains(&kairos_layer::ids::shard_of(&s.id, shard_count)))
        .collect();
    later.sort_by_key(|s| s.at_us);
    // Bounded: the first 1,000 such starts (those fired before the fault come first).
    for s in later.into_iter().take(1_000) {
        let (e, _) = client.get(&s.id).await?;
        let fired = if e.ready_at_ms > 0 { e.ready_at_ms } else { e.started_at_ms };
        if fired > after_ms {
            return Ok(Some((fired, s.at_us / 1_000)));
        }
    }
    Ok(None)
}

/// Problems with the duplicates: a later start of an execution less than half an attempt
/// lease after the one before (an attempt is handed out with at least half its lease left,
/// so another start that soon means it ran twice without its lease running out).
pub fn early_duplicates(v: &Verdict) -> Vec<String> {
    let gap_us = LEASE_MS * 1_000 / 2;
    v.duplicates
        .iter()
        .filter(|list| list.windows(2).any(|w| w[1].at_us - w[0].at_us < gap_us))
        .map(|list| format!("{list:?}"))
        .collect()
}

/// Submissions due `lead_ms` after they are sent, `per_tick` every 100 ms through every node
/// in turn, until stopped; a batch a node does not take goes to the next one.
pub struct Trickle {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<Vec<Acked>>>,
}

impl Trickle {
    /// Starts trickling (keys `cluster-<tag>-<tick>-…`).
    pub fn start(clients: Vec<Client>, tag: &str, per_tick: usize, lead_ms: i64) -> Trickle {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, tag) = (stop.clone(), tag.to_string());
        let task = tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut tick = 0usize;
            while !flag.load(Ordering::Acquire) {
                // This tick's node first, then the others if it does not answer.
                let mut order = clients.clone();
                order.rotate_left(tick % clients.len());
                let due = now_ms() + lead_ms;
                acked.extend(submit_burst(&order, &format!("{tag}-{tick}"), per_tick, due).await?);
                tick += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(acked)
        });
        Trickle { stop, task }
    }

    /// Stops it; returns what was acknowledged.
    pub async fn stop(self) -> Result<Vec<Acked>> {
        self.stop.store(true, Ordering::Release);
        self.task.await?
    }
}
