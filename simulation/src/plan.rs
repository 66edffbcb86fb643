//! What one seed runs: the cluster's knobs (each within its valid range), the workload's
//! size, and the faults (each enabled or not per seed, then firing at times drawn from it).

use std::fmt::Write as _;
use std::time::Duration;

use kairos_actors::server::config::{Backend, NodeConfig};
use kairos_layer::env::Rng;
use kairos_layer::kv::memory::FaultConfig;

/// The primary region's name (multi-region runs).
pub const PRIMARY: &str = "east";
/// The other region's name.
pub const SECONDARY: &str = "west";

pub use crate::limits::WORK_MAX_MS;

/// Faults fire only before this point of simulated time; then everything heals.
pub const FAULT_WINDOW: Duration = Duration::from_secs(40);

/// One simulated node.
#[derive(Debug, Clone)]
pub struct NodePlan {
    /// Host name (also the node id).
    pub name: String,
    /// Its region.
    pub region: String,
    /// How far its clock runs ahead of true time (negative: behind).
    pub skew_ms: i64,
}

/// A fault, at a point of simulated time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// Crash a host (node or worker group): every task on it stops.
    Crash(String),
    /// Restart a crashed host.
    Restart(String),
    /// Drop messages between two hosts.
    Partition(String, String),
    /// Heal a partition.
    Repair(String, String),
    /// Hold messages between two hosts (delivered when released): a paused worker.
    Hold(String, String),
    /// Release held messages.
    Release(String, String),
    /// Cut a node off from the store.
    CutStore(usize),
    /// Reconnect it.
    HealStore(usize),
    /// Every commit of a node waits this long first (a starved process); 0 ends it.
    StallCommits(usize, u64),
    /// The store starts failing over to the other region (commits come back unknown-result).
    FailoverStart,
    /// The failover is over.
    FailoverEnd,
}

/// Everything one seed runs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The seed.
    pub seed: u64,
    /// Nodes.
    pub nodes: Vec<NodePlan>,
    /// `primary_region` (empty: single region).
    pub primary_region: String,
    /// The node settings shared by every node (node_id and region set per node).
    pub config: NodeConfig,
    /// Worker groups (hosts), each running one SDK worker per node.
    pub worker_groups: usize,
    /// Tasks each SDK worker runs at once.
    pub worker_concurrency: usize,
    /// Executions the client submits (besides duplicates, cancels and replays).
    pub executions: usize,
    /// The job definition's attempt lease.
    pub attempt_lease_ms: u64,
    /// The job definition's `max_attempts`.
    pub max_attempts: u32,
    /// Storage faults of the memory backend.
    pub storage: FaultConfig,
    /// The largest network delay between hosts.
    pub max_message_latency_ms: u64,
    /// Faults by time (ms of simulated time), in order.
    pub schedule: Vec<(u64, Action)>,
    /// Which fault kinds this seed enabled.
    pub enabled: Vec<&'static str>,
    /// Simulated-time step of turmoil.
    pub tick_ms: u64,
    /// Cron jobs the client creates (an occurrence every 2 s until faults stop).
    pub cron_jobs: usize,
    /// The payload knob: bytes of padding in each execution's inputs and each success's output
    /// (1 B to just under the 32 KiB input and output limits), so a seed's batches — fire,
    /// claim, results, heartbeats — carry records of realistic sizes.
    pub payload_bytes: usize,
    /// The (namespace, queue) pairs the workload uses: 2–3 namespaces of 1–2 queues each, the
    /// same queue names in every namespace. Each has its own definition, and every worker
    /// group runs one worker per node for each of them.
    pub lanes: Vec<Lane>,
}

/// A (namespace, queue) pair: a definition of its own, workers of its own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lane {
    /// The namespace.
    pub namespace: String,
    /// The queue (also names the definition: `simjob-<queue>`).
    pub queue: String,
}

impl std::fmt::Display for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.queue)
    }
}

/// The client host's name.
pub const CLIENT: &str = "client";

/// A worker group's host name.
pub fn worker_host(g: usize) -> String {
    format!("workers{g}")
}

impl Plan {
    /// The plan of `seed`.
    pub fn from_seed(seed: u64) -> Plan {
        let rng = Rng::seeded(seed);
        let pick = |xs: &[u64]| xs[rng.below(xs.len() as u64) as usize];
        let n_nodes = rng.between(2, 4) as usize;
        let multi_region = rng.chance(0.4);
        let shard_lease_ms = rng.between(1_000, 5_000);
        let skew_bound = rng.between(0, (shard_lease_ms / 4).min(250));
        let shard_count = rng.between(1, 16) as u32;
        let window_ms = rng.between(1_000, 30_000);
        let config = NodeConfig {
            backend: Backend::Memory,
            cluster: "sim".into(),
            shard_count,
            bucket_width_ms: pick(&[1_000, 5_000, 60_000]) as i64,
            ready_partitions: rng.between(0, u64::from(shard_count)) as u32,
            shard_lease_ms,
            max_clock_skew_ms: skew_bound,
            node_ttl_ms: shard_lease_ms * rng.between(1, 3),
            window_ms,
            window_timers_max: pick(&[8, 256, 100_000]) as usize,
            poll_interval_ms: rng.between(100, 1_000.min(window_ms)),
            fire_batch: pick(&[1, 16, 256]) as usize,
            poll_wait_max_ms: 5_000,
            // From a generator of its own: the seeds' other knobs stay what they were.
            prefire_ms: [0, 5, 20, 200][Rng::seeded(seed ^ 0x7072_6566).below(4) as usize],
            ..NodeConfig::default()
        };
        let mut enabled = Vec::new();
        let mut on = |name: &'static str, p: f64| {
            let yes = rng.chance(p);
            if yes {
                enabled.push(name);
            }
            yes
        };
        let skew = on("clock_skew", 0.5);
        let crash_nodes = on("node_crash", 0.5);
        let crash_workers = on("worker_crash", 0.4);
        let pause_workers = on("worker_pause", 0.4);
        let partitions = on("partition", 0.4);
        let storage = on("storage_faults", 0.5);
        let cut_store = on("store_cut", 0.25);
        let stall = on("cpu_starved_node", 0.3);
        let region_loss = multi_region && on("region_loss", 0.6);
        let latency = on("network_delay", 0.5);

        let nodes: Vec<NodePlan> = (0..n_nodes)
            .map(|i| NodePlan {
                name: format!("node{i}"),
                region: if multi_region && i % 2 == 1 { SECONDARY } else { PRIMARY }.into(),
                skew_ms: if skew {
                    rng.between(0, skew_bound) as i64 - (skew_bound / 2) as i64
                } else {
                    0
                },
            })
            .collect();
        let worker_groups = rng.between(1, 2) as usize;
        let attempt_lease_ms = rng.between(1_000, 5_000);
        let mut schedule = Vec::new();
        let window = FAULT_WINDOW.as_millis() as u64;
        let at = |lo: u64| rng.between(lo, window - 1_000);
        if crash_nodes {
            for _ in 0..rng.between(1, 3) {
                let n = nodes[rng.below(n_nodes as u64) as usize].name.clone();
                let t = at(2_000);
                schedule.push((t, Action::Crash(n.clone())));
                schedule.push(((t + rng.between(500, 15_000)).min(window), Action::Restart(n)));
            }
        }
        if crash_workers {
            for _ in 0..rng.between(1, 2) {
                let w = worker_host(rng.below(worker_groups as u64) as usize);
                let t = at(3_000);
                schedule.push((t, Action::Crash(w.clone())));
                schedule.push(((t + rng.between(500, 10_000)).min(window), Action::Restart(w)));
            }
        }
        if pause_workers {
            for _ in 0..rng.between(1, 2) {
                let w = worker_host(rng.below(worker_groups as u64) as usize);
                let t = at(3_000);
                let d = attempt_lease_ms + rng.between(500, 8_000);
                for n in &nodes {
                    schedule.push((t, Action::Hold(w.clone(), n.name.clone())));
                    schedule
                        .push(((t + d).min(window), Action::Release(w.clone(), n.name.clone())));
                }
            }
        }
        if partitions {
            for _ in 0..rng.between(1, 3) {
                let n = nodes[rng.below(n_nodes as u64) as usize].name.clone();
                let other = if rng.chance(0.5) {
                    CLIENT.to_string()
                } else {
                    worker_host(rng.below(worker_groups as u64) as usize)
                };
                let t = at(2_000);
                schedule.push((t, Action::Partition(n.clone(), other.clone())));
                schedule
                    .push(((t + rng.between(500, 10_000)).min(window), Action::Repair(n, other)));
            }
        }
        if cut_store {
            let i = rng.below(n_nodes as u64) as usize;
            let t = at(2_000);
            schedule.push((t, Action::CutStore(i)));
            schedule.push(((t + rng.between(500, 10_000)).min(window), Action::HealStore(i)));
        }
        if stall {
            let i = rng.below(n_nodes as u64) as usize;
            let t = at(2_000);
            let d = rng.between(500, 2 * shard_lease_ms.max(attempt_lease_ms));
            schedule.push((t, Action::StallCommits(i, d)));
            schedule
                .push(((t + rng.between(2_000, 10_000)).min(window), Action::StallCommits(i, 0)));
        }
        if region_loss {
            let t = at(5_000);
            for n in nodes.iter().filter(|n| n.region == PRIMARY) {
                schedule.push((t, Action::Crash(n.name.clone())));
                schedule.push((window, Action::Restart(n.name.clone())));
            }
            schedule.push((t, Action::FailoverStart));
            schedule.push((t + rng.between(100, 2_000), Action::FailoverEnd));
        }
        // In time order; at one instant, in a fixed order of actions.
        schedule.sort();
        // Each site on or off, then firing with a probability. `too_old` fires per read: a
        // transaction of a few hundred reads (a page of a list) would almost never get
        // through at the 5 % the memory backend's own draw allows, so it stays under 1 %.
        let storage_faults = if storage {
            let site = |max: f64| rng.chance(0.5).then(|| 0.001 + rng.unit() * (max - 0.001));
            FaultConfig {
                spurious_conflict: site(0.05),
                unknown_result_applied: site(0.05),
                unknown_result_not_applied: site(0.05),
                too_old: site(0.01),
                latency: site(0.05),
                latency_max: Duration::from_micros(rng.between(100, 5_000)),
                read_round_trip: Duration::ZERO,
            }
        } else {
            FaultConfig::none()
        };
        Plan {
            seed,
            nodes,
            primary_region: if multi_region { PRIMARY.into() } else { String::new() },
            config,
            worker_groups,
            worker_concurrency: rng.between(1, 8) as usize,
            executions: rng.between(20, 100) as usize,
            attempt_lease_ms,
            max_attempts: rng.between(1, 5) as u32,
            storage: storage_faults,
            max_message_latency_ms: if latency { rng.between(1, 50) } else { 1 },
            schedule,
            enabled,
            tick_ms: 5,
            cron_jobs: rng.between(0, 2) as usize,
            lanes: lanes(seed),
            payload_bytes: payload_bytes(seed),
        }
    }

    /// The node settings of node `i`.
    pub fn node_config(&self, i: usize) -> NodeConfig {
        NodeConfig {
            node_id: Some(self.nodes[i].name.clone()),
            region: self.nodes[i].region.clone(),
            primary_region: self.primary_region.clone(),
            ..self.config.clone()
        }
    }

    /// The largest difference between two nodes' clocks.
    pub fn skew_spread_ms(&self) -> i64 {
        let max = self.nodes.iter().map(|n| n.skew_ms).max().unwrap_or(0);
        let min = self.nodes.iter().map(|n| n.skew_ms).min().unwrap_or(0);
        max - min
    }

    /// The liveness bound: once faults stop (and the last execution is due), every execution
    /// reaches a terminal state within this much simulated time. A failed-over lease is free
    /// after node_ttl + lease + skew; each attempt takes at most its lease (a lost worker) or
    /// its work, then up to the retry back-off's cap.
    pub fn liveness_bound(&self) -> Duration {
        let c = &self.config;
        let takeover = c.node_ttl_ms + 2 * c.shard_lease_ms + c.max_clock_skew_ms + c.window_ms;
        let per_attempt = 2 * self.attempt_lease_ms + WORK_MAX_MS + 4_000;
        Duration::from_millis(takeover + u64::from(self.max_attempts) * per_attempt + 10_000)
    }

    /// The knobs, for a failure report.
    pub fn describe(&self) -> String {
        let c = &self.config;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "nodes: {}",
            self.nodes
                .iter()
                .map(|n| format!("{}({}, skew {} ms)", n.name, n.region, n.skew_ms))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let _ = writeln!(
            s,
            "primary_region: {:?}; shard_count {}, bucket_width_ms {}, ready_partitions {}, \
             shard_lease_ms {}, max_clock_skew_ms {}, node_ttl_ms {}, window_ms {}, \
             window_timers_max {}, poll_interval_ms {}, fire_batch {}, prefire_ms {}",
            self.primary_region,
            c.shard_count,
            c.bucket_width_ms,
            c.ready_partitions,
            c.shard_lease_ms,
            c.max_clock_skew_ms,
            c.node_ttl_ms,
            c.window_ms,
            c.window_timers_max,
            c.poll_interval_ms,
            c.fire_batch,
            c.prefire_ms
        );
        let _ = writeln!(
            s,
            "workers: {} groups x {} nodes, concurrency {}; executions {}; attempt lease {} ms, \
             max_attempts {}; network delay up to {} ms; cron jobs {}; payload {} B",
            self.worker_groups,
            self.nodes.len(),
            self.worker_concurrency,
            self.executions,
            self.attempt_lease_ms,
            self.max_attempts,
            self.max_message_latency_ms,
            self.cron_jobs,
            self.payload_bytes
        );
        let _ = writeln!(
            s,
            "lanes (namespace/queue): {}",
            self.lanes.iter().map(Lane::to_string).collect::<Vec<_>>().join(", ")
        );
        let _ = writeln!(s, "faults enabled: {:?}; storage: {:?}", self.enabled, self.storage);
        for (t, a) in &self.schedule {
            let _ = writeln!(s, "  at {t} ms: {a:?}");
        }
        s
    }
}

/// The lanes of `seed`, from an RNG of their own (the other knobs stay what they were).
/// A seed's payload size, from a generator of its own (the other knobs draw as before): 1 B,
/// 1 KiB, 16 KiB or the largest that fits the input and output limits, equally likely.
fn payload_bytes(seed: u64) -> usize {
    let rng = Rng::seeded(seed ^ 0x9A7_10AD);
    let largest = kairos_layer::limits::INPUT_BYTES_MAX - PAYLOAD_ROOM_BYTES;
    [1, 1024, 16 * 1024, largest][rng.below(4) as usize]
}

/// What an execution's inputs (or a success's output) hold besides the padding, at most.
const PAYLOAD_ROOM_BYTES: usize = 256;

fn lanes(seed: u64) -> Vec<Lane> {
    let rng = Rng::seeded(seed ^ 0x1A4E_5EED);
    let mut lanes = Vec::new();
    for n in 0..rng.between(2, 3) {
        for q in 0..rng.between(1, 2) {
            lanes.push(Lane { namespace: format!("ns{n}"), queue: format!("q{q}") });
        }
    }
    lanes
}
