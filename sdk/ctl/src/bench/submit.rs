//! Submissions: batched (`SubmitBatch`, N calls in flight) and single calls from concurrent
//! clients. Every request has an idempotency key (`bench-<run>-<phase>-<n>`), so a retry after
//! an unknown outcome never makes a second execution.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use kairos_proto::v1::{SubmitRequest, SubmitResponse, submit_batch_item, submit_request};
use tokio::task::JoinSet;

use kairos_sdk::Client;

/// The bench definition's URI.
pub const URI: &str = "registry://jobs/bench-noop";
/// Its version.
pub const VERSION: u32 = 2;

/// One submission of the bench definition with `inputs` (JSON).
pub fn request(
    client: &Client,
    inputs: &str,
    key: String,
    when: submit_request::When,
) -> SubmitRequest {
    SubmitRequest {
        namespace: client.namespace().to_string(),
        definition_uri: URI.into(),
        definition_version: VERSION,
        inputs_json: inputs.into(),
        when: Some(when),
        idempotency_key: key,
        return_execution: false,
        traceparent: String::new(),
    }
}

/// How a submission phase went.
#[derive(Debug, Default, Clone, Copy)]
pub struct Summary {
    /// Acknowledged executions.
    pub acked: u64,
    /// Of them, answered `created: false` (the key was already used).
    pub existing: u64,
    /// Calls (or items) sent again after a transient failure.
    pub retries: u64,
    /// From the first call to the last acknowledgement.
    pub elapsed: Duration,
}

impl Summary {
    /// Acknowledged executions per second.
    pub fn per_s(&self) -> f64 {
        self.acked as f64 / self.elapsed.as_secs_f64().max(1e-6)
    }
}

/// Item codes worth a retry: the node was busy or went away.
fn transient(code: i32) -> bool {
    use tonic::Code;
    [
        Code::Unavailable,
        Code::DeadlineExceeded,
        Code::Aborted,
        Code::ResourceExhausted,
        Code::Unknown,
        Code::Cancelled,
    ]
    .iter()
    .any(|c| *c as i32 == code)
}

/// Builds request `i` (deterministic: a retry builds the same request again).
pub type Make = Arc<dyn Fn(u64) -> SubmitRequest + Send + Sync>;
/// Called with each acknowledgement.
pub type OnOk = Arc<dyn Fn(u64, &SubmitResponse) + Send + Sync>;

/// One `SubmitBatch` of `indices`, retried (only the items that failed transiently) until
/// every item is acknowledged; an item refused for good fails the phase.
pub async fn one_batch(
    client: Client,
    mut indices: Vec<u64>,
    make: Make,
    on_ok: OnOk,
    done: Arc<AtomicU64>,
) -> Result<Summary> {
    let mut s = Summary::default();
    let mut tries = 0u32;
    loop {
        let reqs: Vec<SubmitRequest> = indices.iter().map(|&i| make(i)).collect();
        let why = match client.submit_batch(reqs).await {
            Ok(items) => {
                let mut again = Vec::new();
                let mut why = String::new();
                for (i, item) in indices.iter().zip(items) {
                    match item {
                        submit_batch_item::Result::Ok(r) => {
                            on_ok(*i, &r);
                            s.acked += 1;
                            s.existing += u64::from(!r.created);
                        }
                        submit_batch_item::Result::Error(e) if transient(e.code) => {
                            why = format!("{:?}: {}", tonic::Code::from(e.code), e.message);
                            again.push(*i);
                        }
                        submit_batch_item::Result::Error(e) => {
                            bail!(
                                "submission {} refused: {:?}: {}",
                                make(*i).idempotency_key,
                                tonic::Code::from(e.code),
                                e.message
                            );
                        }
                    }
                }
                done.fetch_add((indices.len() - again.len()) as u64, Ordering::Relaxed);
                if again.is_empty() {
                    return Ok(s);
                }
                s.retries += again.len() as u64;
                indices = again;
                why
            }
            Err(e) if e.is_transient() => {
                s.retries += 1;
                e.to_string()
            }
            Err(e) => bail!("SubmitBatch failed: {e}"),
        };
        tries += 1;
        if tries > 30 {
            bail!("SubmitBatch still failing after 30 tries: {why}");
        }
        tokio::time::sleep(Duration::from_millis(50u64 << tries.min(5))).await;
    }
}

/// Submits requests `0..total` in `SubmitBatch` calls of `batch`, `in_flight` at a time,
/// spread over `clients` (connections). `done` counts acknowledgements as they come.
pub async fn batched(
    clients: &[Client],
    total: u64,
    batch: usize,
    in_flight: usize,
    make: Make,
    on_ok: OnOk,
    done: Arc<AtomicU64>,
) -> Result<Summary> {
    let t = Instant::now();
    let mut sum = Summary::default();
    let mut set: JoinSet<Result<Summary>> = JoinSet::new();
    let (mut next, mut call) = (0u64, 0usize);
    loop {
        while set.len() < in_flight && next < total {
            let end = (next + batch as u64).min(total);
            let client = clients[call % clients.len()].clone();
            call += 1;
            set.spawn(one_batch(
                client,
                (next..end).collect(),
                make.clone(),
                on_ok.clone(),
                done.clone(),
            ));
            next = end;
        }
        let Some(r) = set.join_next().await else { break };
        let s = r.map_err(|e| anyhow!("submission task: {e}"))??;
        sum.acked += s.acked;
        sum.existing += s.existing;
        sum.retries += s.retries;
    }
    sum.elapsed = t.elapsed();
    Ok(sum)
}

/// Submits requests `0..total` as single `Submit` calls through the SDK's builder, from
/// `concurrency` tasks; `key(i)` and `at(i)` (`None` = after `delay`) give each request.
pub async fn single(
    clients: &[Client],
    total: u64,
    concurrency: usize,
    key: Arc<dyn Fn(u64) -> String + Send + Sync>,
    (inputs, delay): (&str, Duration),
    done: Arc<AtomicU64>,
) -> Result<Summary> {
    let inputs: serde_json::Value = serde_json::from_str(inputs)?;
    let t = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut set: JoinSet<Result<Summary>> = JoinSet::new();
    for c in 0..concurrency {
        let client = clients[c % clients.len()].clone();
        let (next, done, key) = (next.clone(), done.clone(), key.clone());
        let inputs = inputs.clone();
        set.spawn(async move {
            let mut s = Summary::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok(s);
                }
                let r = client
                    .submit(URI, VERSION)
                    .inputs(inputs.clone())
                    .after(delay)
                    .idempotency_key(key(i))
                    .send()
                    .await
                    .map_err(|e| anyhow!("Submit {} failed: {e}", key(i)))?;
                s.acked += 1;
                s.existing += u64::from(!r.created);
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let mut sum = Summary::default();
    while let Some(r) = set.join_next().await {
        let s = r.map_err(|e| anyhow!("submission task: {e}"))??;
        sum.acked += s.acked;
        sum.existing += s.existing;
    }
    sum.elapsed = t.elapsed();
    Ok(sum)
}
