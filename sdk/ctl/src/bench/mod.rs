//! `kairosctl bench <s1|s2|s3|s4|s5|s6>`: the load generator (see docs/load-generator.md).
//!
//! Everything goes through the public gRPC API, with the node, the workers and the generator
//! in separate processes: by default the bench spawns `kairos dev` on a fresh data dir and
//! free ports ([`node`]), registers its own no-op definition, spawns `--workers` processes of
//! itself (`kairosctl bench worker`, [`workers`]) whose handlers report each start on stdout,
//! submits ([`submit`]) and matches starts against submissions ([`track`]). The scenarios live
//! in [`throughput`] (s1), [`burst`] (s2, s5), [`precision`] (s3, s4) and [`fairness`] (s6); [`stats`] prints
//! the table and the final JSON line.

pub mod args;
mod burst;
mod fairness;
mod node;
mod precision;
mod progress;
mod stats;
mod submit;
mod throughput;
mod track;
mod workers;

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::Client;
use args::{Args, Command, Scenario};
use node::{Node, NodeProc, ProcSample, WorkDir};
use stats::Report;
use track::Shared;
use workers::Pool;

/// The definition the bench registers (the file format of `layer/src/definition`).
pub const DEFINITION_YAML: &str = "name: bench-noop
version: 1
description: kairosctl bench no-op
queue: bench
timeouts:
  lease: 30s
retry:
  max_attempts: 3
  base_delay: 100ms
  max_delay: 1s
execution:
  type: noop
";

/// Runs `kairosctl bench` with its parsed command line; returns the exit code.
///
/// The generator runs on its own multi-threaded runtime (`--threads`, default 2) in a thread
/// of its own: `kairosctl`'s runtime is single-threaded.
pub async fn main(cmd: Command) -> i32 {
    let cmd = cmd.into_run();
    if let Ok(a) = &cmd
        && let Err(e) = a.check()
    {
        eprintln!("kairosctl bench: {e}");
        return 2;
    }
    let threads = match &cmd {
        Ok(a) => a.threads,
        Err(w) => w.threads,
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new().name("kairos-bench".into()).spawn(move || {
        let rt = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("kairos-bench")
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("kairosctl bench: starting the runtime: {e}");
                let _ = tx.send(1);
                return;
            }
        };
        let code = rt.block_on(async move {
            match cmd {
                Ok(a) => run(a).await,
                Err(w) => workers::worker_main(w).await,
            }
        });
        rt.shutdown_timeout(Duration::from_secs(1));
        let _ = tx.send(code);
    });
    if let Err(e) = spawned {
        eprintln!("kairosctl bench: starting a thread: {e}");
        return 1;
    }
    rx.await.unwrap_or_else(|_| {
        eprintln!("kairosctl bench: the run panicked");
        1
    })
}

/// Writes to stdout (a closed pipe, as with `| head`, is not an error).
fn out(text: &str) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text.as_bytes());
    let _ = o.flush();
}

/// Wall clock, ms since the epoch.
pub(crate) fn now_ms() -> i64 {
    workers::now_us() / 1_000
}

/// What every scenario works with.
pub struct Env {
    pub args: Args,
    pub node: Node,
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
    async fn setup(args: Args, dir: WorkDir) -> Result<Env, (anyhow::Error, WorkDir)> {
        let node = match args.endpoint.clone() {
            Some(endpoint) => Node::External { endpoint, pid: args.node_pid },
            None => {
                let kairos = match node::find_kairos(args.kairos.as_deref()) {
                    Ok(k) => k,
                    Err(e) => return Err((e, dir)),
                };
                let t = Instant::now();
                match NodeProc::spawn(kairos.clone(), &dir.path, &args.node_log).await {
                    Ok(p) => {
                        eprintln!(
                            "kairosctl bench: node {} (pid {}) up in {} ms: gRPC {}, HTTP 127.0.0.1:{}, \
                             log {} ({})",
                            kairos.display(),
                            p.pid().unwrap_or(0),
                            t.elapsed().as_millis(),
                            p.endpoint(),
                            p.http_port,
                            p.log_path.display(),
                            p.health
                        );
                        Node::Spawned(Box::new(p))
                    }
                    Err(e) => return Err((e, dir)),
                }
            }
        };
        let mut env = Env {
            progress: progress::enabled(args.progress),
            run_id: format!(
                "{:x}",
                (workers::now_us() as u64 ^ u64::from(std::process::id()) << 40) & 0xffff_ffff_ffff
            ),
            args,
            node,
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

    async fn connect(&mut self) -> Result<()> {
        let endpoint = self.node.endpoint();
        for _ in 0..self.args.connections.max(1) {
            self.clients.push(Client::connect(&endpoint).await?);
        }
        let (d, _created) = self.clients[0]
            .register_definition(DEFINITION_YAML)
            .await
            .context("registering the bench definition bench-noop v1")?;
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
                &self.node.endpoint(),
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
        Usage {
            node: self.node.sample(),
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
        Ok(())
    }

    /// Stops the workers and the spawned node.
    async fn shutdown(&mut self) {
        if let Some(p) = self.pool.take() {
            p.stop().await;
        }
        if let Some(n) = self.node.spawned() {
            n.kill().await;
        }
    }
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

async fn run(args: Args) -> i32 {
    let dir = match WorkDir::create() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("kairosctl bench: {e:#}");
            return 1;
        }
    };
    let (quick, keep) = (args.quick, args.keep);
    let mut env = match Env::setup(args, dir).await {
        Ok(env) => env,
        Err((e, dir)) => {
            eprintln!("kairosctl bench: {e:#}");
            let empty = std::fs::read_dir(&dir.path).map_or(true, |mut d| d.next().is_none());
            if empty {
                dir.remove();
            } else {
                eprintln!("kairosctl bench: node data and logs kept in {}", dir.path.display());
            }
            return 1;
        }
    };
    let result = match env.args.scenario {
        Scenario::S1 => throughput::run(&mut env).await,
        Scenario::S2 => burst::run(&mut env, false).await,
        Scenario::S3 => precision::run_s3(&mut env).await,
        Scenario::S4 => precision::run_s4(&mut env).await,
        Scenario::S5 => burst::run(&mut env, true).await,
        Scenario::S6 => fairness::run(&mut env).await,
    };
    env.shutdown().await;
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kairosctl bench {}: {e:#}", env.args.scenario.name());
            eprintln!("kairosctl bench: node data and logs kept in {}", env.dir.path.display());
            return 1;
        }
    };
    out(&report.table());
    for f in &report.failures {
        eprintln!("kairosctl bench: {}: {f}", if quick { "FAILED" } else { "warning" });
    }
    let failed = quick && !report.failures.is_empty();
    if failed || keep {
        eprintln!("kairosctl bench: node data and logs kept in {}", env.dir.path.display());
    } else {
        env.dir.remove();
    }
    out(&format!("{}\n", report.json_line()));
    i32::from(failed)
}
