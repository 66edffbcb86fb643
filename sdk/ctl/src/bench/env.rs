//! What every scenario works with ([`Env`]): the node under test (spawned or given), one client
//! per connection, the worker processes, the tracker of starts; and what a scenario reports
//! about the processes' usage ([`node_usage`]) and about executions that never started
//! ([`describe`]).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kairos_sdk::Client;
use serde_json::{Value, json};

use super::args::Args;
use super::node::{self, Node, NodeProc, ProcSample, WorkDir};
use super::progress;
use super::stats::{self, Report};
use super::track::Shared;
use super::workers::{self, Pool};

/// The definition the bench registers (the file format of `layer/src/definition`).
pub const DEFINITION_YAML: &str = "name: bench-noop
version: 2
description: kairosctl bench no-op
queue: bench
inputs:
  payload: {type: string, required: false}
timeouts:
  lease: 30s
retry:
  max_attempts: 3
  base_delay: 100ms
  max_delay: 1s
execution:
  type: noop
";

/// What every scenario works with.
pub struct Env {
    pub args: Args,
    /// The node (the first, with `--nodes`).
    pub node: Node,
    /// The other spawned nodes (`--nodes`).
    pub more: Vec<NodeProc>,
    /// One client per connection (`--connections`).
    pub clients: Vec<Client>,
    /// Makes this run's idempotency keys unique: `bench-<run>-<phase>-<n>`.
    pub run_id: String,
    pub dir: WorkDir,
    pub pool: Option<Pool>,
    pub tracker: Shared,
    /// Whether progress bars are drawn.
    pub progress: bool,
}

impl Env {
    pub(super) async fn setup(args: Args, dir: WorkDir) -> Result<Env, (anyhow::Error, WorkDir)> {
        let run_id = format!(
            "{:x}",
            (workers::now_us() as u64 ^ u64::from(std::process::id()) << 40) & 0xffff_ffff_ffff
        );
        let (node, more) = match spawn_nodes(&args, &dir, &run_id).await {
            Ok(n) => n,
            Err(e) => return Err((e, dir)),
        };
        let mut env = Env {
            progress: progress::enabled(args.progress),
            run_id,
            args,
            node,
            more,
            clients: Vec::new(),
            dir,
            pool: None,
            tracker: Shared::default(),
        };
        match env.connect().await {
            Ok(()) => Ok(env),
            Err(e) => {
                env.shutdown().await;
                Err((e, env.dir))
            }
        }
    }

    /// Every node's gRPC endpoint, the first node's first.
    pub fn endpoints(&self) -> Vec<String> {
        let mut all = vec![self.node.endpoint()];
        all.extend(self.more.iter().map(NodeProc::endpoint));
        all
    }

    async fn connect(&mut self) -> Result<()> {
        let endpoints = self.endpoints();
        for i in 0..self.args.connections.max(endpoints.len()) {
            self.clients.push(Client::connect(&endpoints[i % endpoints.len()]).await?);
        }
        let (d, _created) = self.clients[0]
            .register_definition(DEFINITION_YAML)
            .await
            .context("registering the bench definition bench-noop v2")?;
        if d.queue != workers::QUEUE {
            bail!("bench-noop v1 on this node has queue {:?}, not {:?}", d.queue, workers::QUEUE);
        }
        Ok(())
    }

    /// The first client.
    pub fn client(&self) -> &Client {
        &self.clients[0]
    }

    /// Starts the worker processes (once per run).
    pub async fn start_workers(&mut self) -> Result<()> {
        if self.pool.is_none() {
            let a = &self.args;
            let pool = Pool::spawn(
                a.workers,
                a.slots,
                a.threads,
                &self.endpoints(),
                "default",
                &self.dir,
                self.tracker.clone(),
            )
            .await?;
            self.pool = Some(pool);
        }
        Ok(())
    }

    /// CPU seconds (and the node's RSS) of the node, this generator and the workers.
    pub fn sample(&self) -> Usage {
        let node = self.more.iter().fold(self.node.sample(), |sum, n| {
            let (s, more) = (sum?, n.sample());
            Some(ProcSample {
                cpu_s: s.cpu_s + more.cpu_s,
                hwm_kib: s.hwm_kib.max(more.hwm_kib),
                rss_kib: s.rss_kib + more.rss_kib,
            })
        });
        Usage {
            node,
            generator_cpu_s: node::sample(std::process::id()).map_or(0.0, |s| s.cpu_s),
            workers_cpu_s: self.pool.as_ref().map_or(0.0, Pool::cpu_s),
        }
    }

    /// Waits until `target` executions of the current phase have started, or `deadline`;
    /// `bar` follows the started count. Fails if a worker process died.
    pub async fn wait_started(
        &self,
        target: usize,
        deadline: Instant,
        bar: Option<&progress::Progress>,
    ) -> Result<bool> {
        loop {
            let started = self.tracker.lock().started();
            if let Some(b) = bar {
                b.set(started as u64);
            }
            if started >= target {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            self.check()?;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// An error if a worker process or the spawned node died.
    pub fn check(&self) -> Result<()> {
        if let Some(p) = &self.pool {
            p.check()?;
        }
        if let Node::Spawned(n) = &self.node {
            n.check()?;
        }
        for n in &self.more {
            n.check()?;
        }
        Ok(())
    }

    /// Stops the workers and the spawned node.
    pub(super) async fn shutdown(&mut self) {
        if let Some(p) = self.pool.take() {
            p.stop().await;
        }
        if let Some(n) = self.node.spawned() {
            n.kill().await;
        }
        for n in &mut self.more {
            n.kill().await;
        }
    }
}

/// The node as given (`--endpoint`), or the spawned nodes: the first, and the others.
async fn spawn_nodes(args: &Args, dir: &WorkDir, run_id: &str) -> Result<(Node, Vec<NodeProc>)> {
    if let Some(endpoint) = args.endpoint.clone() {
        return Ok((Node::External { endpoint, pid: args.node_pid }, Vec::new()));
    }
    let kairos = node::find_kairos(args.kairos.as_deref())?;
    let mut extra = Vec::new();
    if let Some(url) = &args.postgres_url {
        extra.extend(["--backend", "postgres", "--postgres-url", url].map(String::from));
        extra.extend(["--postgres-schema".to_string(), format!("bench_{run_id}")]);
    }
    extra.extend(args.node_arg.iter().cloned());
    let mut spawned = Vec::new();
    for i in 0..args.nodes {
        let t = Instant::now();
        let p = NodeProc::spawn(kairos.clone(), &dir.path, &args.node_log, i, extra.clone()).await;
        let p = match p {
            Ok(p) => p,
            Err(e) => {
                for mut n in spawned {
                    NodeProc::kill(&mut n).await;
                }
                return Err(e);
            }
        };
        eprintln!(
            "kairosctl bench: node {} (pid {}) up in {} ms: gRPC {}, HTTP 127.0.0.1:{}, log {} ({})",
            kairos.display(),
            p.pid().unwrap_or(0),
            t.elapsed().as_millis(),
            p.endpoint(),
            p.http_port,
            p.log_path.display(),
            p.health
        );
        spawned.push(p);
    }
    let first = spawned.remove(0);
    Ok((Node::Spawned(Box::new(first)), spawned))
}

/// CPU seconds of the processes of a run at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// The node (CPU and RSS), when known.
    pub node: Option<ProcSample>,
    /// This process.
    pub generator_cpu_s: f64,
    /// The worker processes.
    pub workers_cpu_s: f64,
}

/// The node's CPU seconds and peak RSS between two samples, and the CPU the generator and
/// the workers used meanwhile, into the report.
pub(crate) fn node_usage(r: &mut Report, before: Usage, after: Usage) {
    let gen_cpu = stats::round2(after.generator_cpu_s - before.generator_cpu_s);
    let workers_cpu = stats::round2(after.workers_cpu_s - before.workers_cpu_s);
    r.row("generator / workers CPU", format!("{gen_cpu:.2} s / {workers_cpu:.2} s"));
    r.set("generator_cpu_s", gen_cpu);
    r.set("workers_cpu_s", workers_cpu);
    match (before.node, after.node) {
        (Some(b), Some(a)) => {
            let cpu = stats::round2(a.cpu_s - b.cpu_s);
            let mib = stats::round1(a.hwm_kib as f64 / 1024.0);
            r.row("node CPU", format!("{cpu:.2} s"));
            r.row("node peak RSS", format!("{mib:.1} MiB"));
            r.set("node_cpu_s", cpu);
            r.set("node_peak_rss_mib", mib);
        }
        _ => {
            r.row("node CPU / peak RSS", "unknown (with --endpoint, give --node-pid)");
            r.set("node_cpu_s", Value::Null);
            r.set("node_peak_rss_mib", Value::Null);
        }
    }
}

/// What the node says about executions that never started (at most 20 of them).
pub(crate) async fn describe(client: &Client, ids: &[String]) -> Vec<Value> {
    let mut out = Vec::new();
    for id in ids.iter().take(20) {
        match client.get(id).await {
            Ok((e, attempts)) => out.push(json!({
                "id": id,
                "status": e.status().as_str_name().trim_start_matches("EXECUTION_STATUS_"),
                "execute_at_ms": e.execute_at_ms,
                "attempt_count": e.attempt_count,
                "next_timer_at_ms": e.next_timer_at_ms,
                "attempts": attempts.iter().map(|a| json!({
                    "number": a.number,
                    "worker": a.worker_id,
                    "status": a.status().as_str_name().trim_start_matches("ATTEMPT_STATUS_"),
                    "started_at_ms": a.started_at_ms,
                })).collect::<Vec<_>>(),
            })),
            Err(e) => out.push(json!({"id": id, "error": e.to_string()})),
        }
    }
    out
}
