//! The workload: a client submitting over gRPC (one-time and delayed executions, duplicates of
//! idempotency keys, cancels, replays), worker handlers (successes, transient and permanent
//! failures, long attempts that heartbeat), and the history they record for the checkers.
#![allow(clippy::disallowed_methods)] // tokio's timer is turmoil's simulated clock here

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_layer::env::Rng;
use kairos_proto::v1::{
    Attempt, AttemptStatus, CreateCronJobRequest, CronPolicies, Execution, ExecutionStatus,
    ListExecutionsRequest,
};
use kairos_sdk::{Client, Task, TaskError};

use crate::clock::true_now_ms;
use crate::plan::{FAULT_WINDOW, Lane, Plan, WORK_MAX_MS};

/// The definition a lane's executions run (one per queue, registered in each namespace).
pub fn job(lane: &Lane) -> String {
    format!("registry://jobs/simjob-{}", lane.queue)
}

/// A lane's definition source for a plan: `simjob-<queue>`, on that queue.
pub fn definition(plan: &Plan, lane: &Lane) -> String {
    format!(
        "name: simjob-{q}\nversion: 1\nqueue: {q}\ninputs:\n  n: int\n  mode: string\n  \
         work_ms: int\n  fail_until: int\n  ns: string\n  q: string\n  \
         pad: {{type: string, required: false}}\n\
         retry: {{max_attempts: {}, base_delay: 1s, max_delay: 4s}}\n\
         timeouts: {{lease: {}ms}}\nexecution: {{type: command, command: [\"true\"]}}\n",
        plan.max_attempts,
        plan.attempt_lease_ms,
        q = lane.queue
    )
}

/// How an execution's handler behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// Succeeds after a short while.
    Ok,
    /// Fails retryably up to attempt `fail_until`, then succeeds.
    Flaky,
    /// Fails permanently.
    Fail,
    /// Works longer than its lease, heartbeating.
    Slow,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Ok => "ok",
            Mode::Flaky => "flaky",
            Mode::Fail => "fail",
            Mode::Slow => "slow",
        }
    }
}

/// An acknowledged submission.
#[derive(Debug, Clone)]
pub struct Acked {
    /// Its idempotency key.
    pub key: String,
    /// `execute_at` as the node answered it.
    pub execute_at_ms: i64,
    /// Its handler's behaviour.
    pub mode: Mode,
    /// Retryable failures before success (flaky).
    pub fail_until: u32,
    /// Its lane (index into `Plan::lanes`).
    pub lane: usize,
}

/// An attempt as a worker's handler saw it start.
#[derive(Debug, Clone)]
pub struct Start {
    /// Attempt number.
    pub attempt: u32,
    /// Fencing token.
    pub token: u64,
    /// True time of the start.
    pub at_ms: i64,
    /// The worker.
    pub worker: String,
}

/// What the client and the workers saw, in order, plus the final state read back.
#[derive(Debug, Default)]
pub struct History {
    /// Time-stamped events (hashed into the trace hash).
    pub trace: Vec<String>,
    /// Acknowledged executions by id.
    pub acked: BTreeMap<String, Acked>,
    /// Execution ids answered per idempotency key.
    pub ids_by_key: BTreeMap<String, BTreeSet<String>>,
    /// Submissions never acknowledged (outcome unknown).
    pub unacked_keys: BTreeSet<String>,
    /// Attempts started, by execution.
    pub starts: BTreeMap<String, Vec<Start>>,
    /// Acknowledged cancels.
    pub cancelled: BTreeSet<String>,
    /// Replays, by execution: acknowledged ones and those answered with an error that may
    /// still have been applied.
    pub replayed: BTreeMap<String, u32>,
    /// The final state read back (terminal ones), by execution.
    pub finals: BTreeMap<String, (Execution, Vec<Attempt>)>,
    /// Read-back failures (e.g. not found), by execution.
    pub missing: BTreeMap<String, String>,
    /// Every execution the cluster lists at the end.
    pub listed: Vec<Execution>,
    /// When faults stopped and the last execution was due (true ms).
    pub quiet_at_ms: i64,
    /// The liveness deadline (true ms).
    pub deadline_ms: i64,
    /// When every acknowledged execution was terminal (true ms), if it happened in time.
    pub all_terminal_at_ms: Option<i64>,
    /// Counts of paths reached.
    pub reached: BTreeMap<&'static str, u64>,
    /// Every worker id that ever ran, with its lane (index into `Plan::lanes`).
    pub workers: BTreeMap<String, usize>,
    /// Tasks a worker received of another namespace or queue than its own (found on receipt).
    pub foreign: Vec<String>,
}

/// Print events to stderr as they happen (`--live`).
pub static LIVE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The shared history.
pub type Shared = Arc<Mutex<History>>;

impl History {
    /// Records an event at the current simulated time.
    pub fn event(&mut self, line: impl AsRef<str>) {
        let t = true_now_ms() - crate::clock::EPOCH_MS;
        let line = format!("{t:>8} {}", line.as_ref());
        if LIVE.load(std::sync::atomic::Ordering::Relaxed) {
            eprintln!("{line}");
        }
        self.trace.push(line);
    }
    /// Counts a path reached.
    pub fn reach(&mut self, what: &'static str) {
        *self.reached.entry(what).or_default() += 1;
    }
}

fn lock(h: &Shared) -> std::sync::MutexGuard<'_, History> {
    h.lock().unwrap_or_else(|e| e.into_inner())
}

/// The worker handler of a worker of `lane`: checks the task is of the worker's own namespace
/// and queue (by the task and by the inputs the client gave it), records the start, works
/// (heartbeats go on meanwhile), then succeeds or fails as the inputs say. Success carries the
/// fencing token it ran with. A task of another lane is recorded as a violation and then run
/// like any other (what a worker would do with it).
pub fn handler(
    history: Shared,
    worker: String,
    lane: Lane,
) -> impl Fn(
    Task,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<serde_json::Value, TaskError>> + Send>,
> + Send
+ Sync
+ 'static {
    move |task: Task| {
        let history = history.clone();
        let worker = worker.clone();
        let lane = lane.clone();
        Box::pin(async move {
            let t = task.task.clone();
            let inputs = task.inputs();
            let work_ms = inputs["work_ms"].as_u64().unwrap_or(0);
            let mode = inputs["mode"].as_str().unwrap_or("ok").to_string();
            let fail_until = inputs["fail_until"].as_u64().unwrap_or(0) as u32;
            {
                let mut h = lock(&history);
                // Isolation: the task's namespace and queue (as the node sent them) and the
                // ones its submitter put in its inputs are this worker's.
                let (ns, q) =
                    (inputs["ns"].as_str().unwrap_or(""), inputs["q"].as_str().unwrap_or(""));
                if t.namespace != lane.namespace
                    || t.queue != lane.queue
                    || ns != lane.namespace
                    || q != lane.queue
                {
                    let what = format!(
                        "worker {worker} of {lane} received {} attempt {} of {}/{} \
                         (submitted to {ns}/{q}, definition {})",
                        t.execution_id, t.attempt, t.namespace, t.queue, t.definition_uri
                    );
                    h.event(format!("FOREIGN TASK: {what}"));
                    h.foreign.push(what);
                }
                h.event(format!(
                    "start {} attempt {} token {} on {worker}",
                    t.execution_id, t.attempt, t.fencing_token
                ));
                h.starts.entry(t.execution_id.clone()).or_default().push(Start {
                    attempt: t.attempt,
                    token: t.fencing_token,
                    at_ms: true_now_ms(),
                    worker: worker.clone(),
                });
            }
            let mut cancelled = task.cancelled.clone();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(work_ms)) => {}
                _ = cancelled.wait_for(|c| *c) => {
                    lock(&history).event(format!("stop {} token {}: cancelled or lease lost", t.execution_id, t.fencing_token));
                    return Err(TaskError::cancelled());
                }
            }
            let out = match mode.as_str() {
                "fail" => Err(TaskError::permanent("permanent failure")),
                "flaky" if t.attempt <= fail_until => {
                    Err(TaskError::retryable("transient failure"))
                }
                // As large an output as the input's padding.
                _ => Ok(serde_json::json!({ "token": t.fencing_token, "attempt": t.attempt,
                    "pad": inputs["pad"] })),
            };
            lock(&history).event(format!(
                "end {} token {}: {}",
                t.execution_id,
                t.fencing_token,
                if out.is_ok() { "ok" } else { "error" }
            ));
            out
        })
    }
}

fn terminal(status: i32) -> bool {
    matches!(
        ExecutionStatus::try_from(status),
        Ok(ExecutionStatus::Succeeded | ExecutionStatus::Failed | ExecutionStatus::Cancelled)
    )
}

struct Submit {
    lane: usize,
    key: String,
    mode: Mode,
    fail_until: u32,
    inputs: serde_json::Value,
    at: Option<i64>,
    after: Option<Duration>,
}

/// The client: submits the workload through the nodes in turn (another node when one fails),
/// waits for faults to stop, then for every acknowledged execution to finish, and reads the
/// final state back.
pub async fn client(plan: Plan, history: Shared) -> turmoil::Result {
    let rng = Rng::seeded(plan.seed ^ 0x00C1_1E47);
    // Which lane a new submission goes to: an RNG of its own, so the rest of the workload
    // draws what it drew before there were lanes.
    let lane_rng = Rng::seeded(plan.seed ^ 0x1A4E_C11E);
    let nodes = plan.nodes.len();
    // One client per (lane, node), each in its lane's namespace; the lanes share one channel
    // (one connection) per node.
    let channels: Vec<_> = plan.nodes.iter().map(|n| crate::net::channel(&n.name)).collect();
    let clients: Vec<Vec<Client>> = plan
        .lanes
        .iter()
        .map(|l| {
            channels
                .iter()
                .map(|c| {
                    Client::from_channel(c.clone())
                        .with_timeout(Duration::from_secs(2))
                        .with_namespace(l.namespace.clone())
                })
                .collect()
        })
        .collect();
    let mut rr = 0usize;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (li, lane) in plan.lanes.iter().enumerate() {
        let def = definition(&plan, lane);
        loop {
            rr += 1;
            match clients[li][rr % nodes].register_definition(&def).await {
                Ok(_) => break,
                Err(e) => {
                    lock(&history).event(format!("register in {lane} failed: {e}"));
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        lock(&history).event(format!("definition registered in {lane}"));
    }
    // Cron schedules: an occurrence every 2 s until faults stop; missed ones made up, each
    // occurrence its own execution (checked: materialized at most once).
    let window_end = crate::clock::EPOCH_MS + FAULT_WINDOW.as_millis() as i64;
    for j in 0..plan.cron_jobs {
        let li = j % plan.lanes.len();
        let lane = &plan.lanes[li];
        let req = CreateCronJobRequest {
            cron_job_id: format!("cron-{j}"),
            definition_uri: job(lane),
            definition_version: 1,
            inputs_json: serde_json::json!({"n": -1, "mode": "ok", "work_ms": 50, "fail_until": 0,
                "ns": lane.namespace, "q": lane.queue})
            .to_string(),
            expression: "*/2 * * * * *".into(),
            timezone: "UTC".into(),
            policies: Some(CronPolicies {
                missed: "all".into(),
                overlap: "allow".into(),
                ..Default::default()
            }),
            end_at_ms: window_end,
            ..Default::default()
        };
        for _ in 0..20 {
            rr += 1;
            match clients[li][rr % nodes].create_cron_job(req.clone()).await {
                Ok(_) => {
                    lock(&history).event(format!("cron job cron-{j} created in {lane}"));
                    break;
                }
                Err(e) => {
                    lock(&history).event(format!("cron create failed: {}", e.code()));
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
    let mut sent: Vec<Submit> = Vec::new();
    let mut acked_ids: Vec<String> = Vec::new();
    let mut lane_of: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..plan.executions {
        tokio::time::sleep(Duration::from_millis(rng.between(0, 500))).await;
        let now = true_now_ms();
        let roll = rng.below(100);
        if roll < 8 && !acked_ids.is_empty() {
            let id = acked_ids[rng.below(acked_ids.len() as u64) as usize].clone();
            let r = clients[lane_of[&id]][rr % nodes].cancel(&id).await;
            rr += 1;
            let mut h = lock(&history);
            h.event(format!("cancel {id}: {}", if r.is_ok() { "ok" } else { "error" }));
            if r.is_ok() {
                h.cancelled.insert(id);
            }
            continue;
        }
        if roll < 13 && !acked_ids.is_empty() {
            let id = acked_ids[rng.below(acked_ids.len() as u64) as usize].clone();
            let r = clients[lane_of[&id]][rr % nodes].replay(&id).await;
            rr += 1;
            let mut h = lock(&history);
            h.event(format!(
                "replay {id}: {}",
                r.as_ref().map_or_else(|e| e.code().to_string(), |_| "ok".into())
            ));
            match &r {
                Ok(_) => {
                    h.reach("replay accepted");
                    *h.replayed.entry(id).or_default() += 1;
                }
                // An error the outcome of which is unknown (unavailable, timed out: the
                // replay may have committed) is "maybe replayed" for the attempt checks.
                // FAILED_PRECONDITION is a refusal: a replay whose commit came back
                // unknown-result and did apply is answered as done by its retry, even once the
                // execution has moved on (seed 45 once had it refused).
                Err(e)
                    if e.code() != tonic::Code::NotFound
                        && e.code() != tonic::Code::FailedPrecondition =>
                {
                    *h.replayed.entry(id).or_default() += 1;
                }
                Err(_) => {}
            }
            continue;
        }
        let s = if roll < 23 && !sent.is_empty() {
            // The same request again under the same key.
            let s = &sent[rng.below(sent.len() as u64) as usize];
            Submit {
                lane: s.lane,
                key: s.key.clone(),
                mode: s.mode,
                fail_until: s.fail_until,
                inputs: s.inputs.clone(),
                at: s.at,
                after: s.after,
            }
        } else {
            let mode = match rng.below(10) {
                0..=5 => Mode::Ok,
                6 | 7 => Mode::Flaky,
                8 => Mode::Fail,
                _ => Mode::Slow,
            };
            let work_ms = match mode {
                Mode::Slow => {
                    rng.between(plan.attempt_lease_ms, (3 * plan.attempt_lease_ms).min(WORK_MAX_MS))
                }
                _ => rng.between(0, 300),
            };
            let fail_until = rng.between(1, u64::from(plan.max_attempts)) as u32;
            let delay = rng.between(0, 20_000);
            let (at, after) = if rng.chance(0.5) {
                (Some(now + delay as i64 - 500), None)
            } else {
                (None, Some(Duration::from_millis(delay)))
            };
            let lane = lane_rng.below(plan.lanes.len() as u64) as usize;
            let (ns, q) = (&plan.lanes[lane].namespace, &plan.lanes[lane].queue);
            Submit {
                lane,
                key: format!("key-{i}"),
                mode,
                fail_until,
                inputs: serde_json::json!({"n": i, "mode": mode.name(), "work_ms": work_ms,
                    "fail_until": fail_until, "ns": ns, "q": q,
                    "pad": "p".repeat(plan.payload_bytes)}),
                at,
                after,
            }
        };
        let mut result = None;
        for _ in 0..2 * nodes {
            rr += 1;
            let mut b = clients[s.lane][rr % nodes]
                .submit(&job(&plan.lanes[s.lane]), 1)
                .idempotency_key(s.key.clone())
                .inputs(s.inputs.clone());
            if let Some(at) = s.at {
                b = b.at(at);
            }
            if let Some(d) = s.after {
                b = b.after(d);
            }
            match b.send().await {
                Ok(r) => {
                    result = Some(r);
                    break;
                }
                Err(e) if e.is_transient() => {
                    lock(&history).event(format!(
                        "submit {} on node{}: {}",
                        s.key,
                        rr % nodes,
                        e.code()
                    ));
                }
                Err(e) => {
                    lock(&history).event(format!("submit {} refused: {e}", s.key));
                    break;
                }
            }
        }
        let mut h = lock(&history);
        match result {
            Some(r) => {
                h.event(format!(
                    "submitted {} to {} -> {} at {} created {}",
                    s.key, plan.lanes[s.lane], r.execution_id, r.execute_at_ms, r.created
                ));
                lane_of.insert(r.execution_id.clone(), s.lane);
                h.ids_by_key.entry(s.key.clone()).or_default().insert(r.execution_id.clone());
                if !h.acked.contains_key(&r.execution_id) {
                    acked_ids.push(r.execution_id.clone());
                }
                h.acked.insert(
                    r.execution_id.clone(),
                    Acked {
                        key: s.key.clone(),
                        execute_at_ms: r.execute_at_ms,
                        mode: s.mode,
                        fail_until: s.fail_until,
                        lane: s.lane,
                    },
                );
            }
            None => {
                h.unacked_keys.insert(s.key.clone());
            }
        }
        drop(h);
        sent.push(s);
    }
    // Faults stop at the end of the fault window; the last execution is due by then or later.
    let last_due = lock(&history).acked.values().map(|a| a.execute_at_ms).max().unwrap_or(0);
    let quiet_at = window_end.max(last_due);
    let deadline = quiet_at + plan.liveness_bound().as_millis() as i64;
    {
        let mut h = lock(&history);
        h.quiet_at_ms = quiet_at;
        h.deadline_ms = deadline;
        h.event(format!(
            "{} acknowledged; quiet at {quiet_at}, deadline {deadline}",
            acked_ids.len()
        ));
    }
    let mut pending: BTreeSet<String> = acked_ids.iter().cloned().collect();
    while !pending.is_empty() && true_now_ms() <= deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if true_now_ms() < window_end {
            continue;
        }
        for id in pending.clone() {
            rr += 1;
            match clients[lane_of[&id]][rr % nodes].get(&id).await {
                Ok((e, attempts)) if terminal(e.status) => {
                    pending.remove(&id);
                    let mut h = lock(&history);
                    h.event(format!(
                        "final {id}: {:?} after {} attempts {:?}",
                        ExecutionStatus::try_from(e.status),
                        e.attempt_count,
                        attempts
                            .iter()
                            .map(|a| format!(
                                "{}:{:?}:{}",
                                a.number,
                                AttemptStatus::try_from(a.status).unwrap_or_default(),
                                a.error.as_ref().map_or("", |e| e.code.as_str())
                            ))
                            .collect::<Vec<_>>()
                    ));
                    h.missing.remove(&id);
                    h.finals.insert(id, (e, attempts));
                }
                Ok(_) => {}
                Err(e) if e.code() == tonic::Code::NotFound => {
                    lock(&history).missing.insert(id, e.to_string());
                }
                Err(_) => {}
            }
        }
    }
    {
        if pending.is_empty() {
            lock(&history).all_terminal_at_ms = Some(true_now_ms());
        }
        // What the stragglers are doing, for the failure report.
        for id in pending.iter().take(20) {
            rr += 1;
            let r = clients[lane_of[id]][rr % nodes].get(id).await;
            let mut h = lock(&history);
            match r {
                Ok((e, attempts)) => h.event(format!(
                    "not terminal {id}: {:?} attempts {} worker {:?} next timer {} execute_at {} ready_at {}",
                    ExecutionStatus::try_from(e.status),
                    attempts.len(),
                    attempts.last().map(|a| a.worker_id.clone()),
                    e.next_timer_at_ms,
                    e.execute_at_ms,
                    e.ready_at_ms
                )),
                Err(e) => h.event(format!("not terminal {id}: {e}")),
            }
        }
        lock(&history).event(format!("liveness: {} not terminal", pending.len()));
    }
    // Every execution the cluster has, namespace by namespace (to check idempotency keys
    // across the whole store).
    let mut listed = Vec::new();
    let mut namespaces: Vec<usize> = Vec::new();
    for (li, l) in plan.lanes.iter().enumerate() {
        if !namespaces.iter().any(|&o| plan.lanes[o].namespace == l.namespace) {
            namespaces.push(li);
        }
    }
    for li in namespaces {
        let mut cursor = Vec::new();
        let mut tries = 0;
        loop {
            rr += 1;
            let req =
                ListExecutionsRequest { limit: 100, cursor: cursor.clone(), ..Default::default() };
            match clients[li][rr % nodes].list(req).await {
                Ok(page) => {
                    listed.extend(page.executions);
                    if page.next_cursor.is_empty() {
                        break;
                    }
                    cursor = page.next_cursor;
                }
                Err(e) => {
                    tries += 1;
                    if tries > 20 {
                        return Err(format!("listing executions failed: {e}").into());
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
    lock(&history).listed = listed;
    Ok(())
}
