//! Load for the cluster tests and what is checked after it: bursts submitted through every
//! node (`SubmitBatch`, idempotency keys, a batch moved to the next node when its node does
//! not answer), and the verdict over the workers' starts — lost (acknowledged, never
//! started), early (started before `execute_at`), duplicates.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use kairos_sdk::Client;
use kairos_sdk::api::{SubmitRequest, submit_batch_item, submit_request};

use super::procs::{Start, Starts};

/// The test definition's name (the bench worker's handler serves it).
pub const DEFINITION: &str = "bench-noop";
/// Its attempt lease: an attempt held by a dead node or worker is retried this long after it
/// started at the latest (plus the lease check's round).
pub const LEASE_MS: i64 = 5_000;

/// The definition the cluster tests register: the bench worker's no-op, with a short lease.
pub fn definition_yaml() -> String {
    format!(
        "name: {DEFINITION}\nversion: 1\nqueue: bench\ntimeouts:\n  lease: {LEASE_MS}ms\n\
         retry:\n  max_attempts: 10\n  base_delay: 100ms\n  max_delay: 1s\n\
         execution:\n  type: noop\n"
    )
}

/// An execution the cluster acknowledged.
#[derive(Debug, Clone)]
pub struct Acked {
    /// Its id.
    pub id: String,
    /// Its `execute_at`, ms since the epoch.
    pub due_ms: i64,
}

/// Requests per `SubmitBatch`.
const BATCH: usize = 1_000;
/// `SubmitBatch` calls in flight.
const IN_FLIGHT: usize = 4;

fn request(tag: &str, i: usize, due_ms: i64) -> SubmitRequest {
    SubmitRequest {
        namespace: "default".into(),
        definition_uri: format!("registry://jobs/{DEFINITION}"),
        definition_version: 1,
        inputs_json: "{}".into(),
        when: Some(submit_request::When::ExecuteAtMs(due_ms)),
        idempotency_key: format!("cluster-{tag}-{i}"),
        return_execution: false,
        traceparent: String::new(),
    }
}

/// Submits `count` executions due at `due_ms` (keys `cluster-<tag>-<i>`), batch `b` through
/// node `b mod n` first; returns every acknowledged one.
pub async fn submit_burst(
    clients: &[Client],
    tag: &str,
    count: usize,
    due_ms: i64,
) -> Result<Vec<Acked>> {
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut set = tokio::task::JoinSet::new();
    for (b, start) in (0..count).step_by(BATCH).enumerate() {
        let indices: Vec<usize> = (start..(start + BATCH).min(count)).collect();
        let permit = slots.clone().acquire_owned().await?;
        let (clients, tag) = (clients.to_vec(), tag.to_string());
        set.spawn(async move {
            let r = one_batch(&clients, b, indices, &tag, due_ms).await;
            drop(permit);
            r
        });
    }
    let mut acked = Vec::with_capacity(count);
    while let Some(r) = set.join_next().await {
        acked.extend(r??);
    }
    Ok(acked)
}

/// One batch, retried on the next node (only its unacknowledged items) until every item is
/// acknowledged; an item refused for good fails the test.
async fn one_batch(
    clients: &[Client],
    b: usize,
    mut left: Vec<usize>,
    tag: &str,
    due_ms: i64,
) -> Result<Vec<Acked>> {
    let mut acked = Vec::with_capacity(left.len());
    for attempt in 0..120 {
        let client = &clients[(b + attempt) % clients.len()];
        let requests = left.iter().map(|i| request(tag, *i, due_ms)).collect();
        match client.submit_batch(requests).await {
            Ok(items) => {
                let mut again = Vec::new();
                for (i, item) in left.iter().zip(items) {
                    match item {
                        submit_batch_item::Result::Ok(r) => {
                            acked.push(Acked { id: r.execution_id, due_ms: r.execute_at_ms })
                        }
                        submit_batch_item::Result::Error(e) if transient(e.code) => again.push(*i),
                        submit_batch_item::Result::Error(e) => {
                            bail!("item {i} refused: {} {}", e.code, e.message)
                        }
                    }
                }
                left = again;
            }
            Err(e) if e.is_transient() => {}
            Err(e) => bail!("batch {b}: {e}"),
        }
        if left.is_empty() {
            return Ok(acked);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("batch {b}: {} items not acknowledged after 120 tries", left.len())
}

fn transient(code: i32) -> bool {
    use tonic::Code;
    [
        Code::Unavailable,
        Code::DeadlineExceeded,
        Code::Aborted,
        Code::ResourceExhausted,
        Code::Unknown,
    ]
    .iter()
    .any(|c| *c as i32 == code)
}

/// Waits until every acknowledged execution has started at least once, or `within` passed;
/// returns whether all did.
pub async fn wait_started(acked: &[Acked], starts: &Starts, within: Duration) -> bool {
    let t = Instant::now();
    loop {
        let missing = {
            let s = starts.lock().unwrap_or_else(|e| e.into_inner());
            let seen: std::collections::HashSet<&str> = s.iter().map(|s| s.id.as_str()).collect();
            acked.iter().filter(|a| !seen.contains(a.id.as_str())).count()
        };
        if missing == 0 {
            return true;
        }
        if t.elapsed() > within {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What happened to the acknowledged executions.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Acknowledged executions.
    pub acked: usize,
    /// Acknowledged, never started.
    pub lost: Vec<String>,
    /// Starts before their `execute_at`.
    pub early: Vec<Start>,
    /// Executions started more than once: every start, in time order.
    pub duplicates: Vec<Vec<Start>>,
}

/// Matches the starts against the acknowledged executions (starts of executions not in
/// `acked` are ignored).
pub fn verdict(acked: &[Acked], starts: &[Start]) -> Verdict {
    let due: BTreeMap<&str, i64> = acked.iter().map(|a| (a.id.as_str(), a.due_ms)).collect();
    let mut by_id: BTreeMap<&str, Vec<Start>> = BTreeMap::new();
    for s in starts.iter().filter(|s| due.contains_key(s.id.as_str())) {
        by_id.entry(s.id.as_str()).or_default().push(s.clone());
    }
    let mut v = Verdict { acked: acked.len(), ..Verdict::default() };
    for a in acked {
        if !by_id.contains_key(a.id.as_str()) {
            v.lost.push(a.id.clone());
        }
    }
    for (id, mut list) in by_id {
        list.sort_by_key(|s| s.at_us);
        v.early.extend(list.iter().filter(|s| s.at_us < due[id] * 1_000).cloned());
        if list.len() > 1 {
            v.duplicates.push(list);
        }
    }
    v
}

/// A snapshot of the starts so far.
pub fn starts_now(starts: &Starts) -> Vec<Start> {
    starts.lock().unwrap_or_else(|e| e.into_inner()).clone()
}
