//! Worker processes: the hidden `kairosctl bench worker` subcommand (the SDK [`Worker`] with a
//! no-op handler that records each start on stdout), and the pool of them the bench spawns
//! and reads through pipes.
//!
//! Protocol on the worker's stdout, one line each: `# ready <worker-id>` once connected, then
//! `<execution-id> <attempt> <start-µs>` per handler start (wall clock, µs since the epoch),
//! buffered and flushed whenever the writer catches up. The worker stops (gracefully: running
//! tasks finish and report, records are flushed) when its stdin closes.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot, watch};

use super::args::WorkerArgs;
use super::node::{WorkDir, tail};
use super::track::Shared;
use kairos_sdk::{Client, Task, Worker};

/// The definition the bench registers and its workers handle.
pub const DEFINITION: &str = "bench-noop";
/// Its queue.
pub const QUEUE: &str = "bench";

/// Wall clock, µs since the epoch.
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Wall clock, ms since the epoch.
pub fn now_ms() -> i64 {
    now_us() / 1_000
}

enum Out {
    Line(String),
    Flush(oneshot::Sender<()>),
}

/// Writes records to stdout, flushing whenever it has caught up with the handlers.
async fn writer(mut rx: mpsc::UnboundedReceiver<Out>) {
    let mut out = tokio::io::BufWriter::with_capacity(64 * 1024, tokio::io::stdout());
    let mut failed = false;
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(m) = next {
            match m {
                Out::Line(l) => {
                    if !failed && out.write_all(l.as_bytes()).await.is_err() {
                        failed = true;
                    }
                }
                Out::Flush(done) => {
                    let _ = out.flush().await;
                    let _ = done.send(());
                    return;
                }
            }
            next = rx.try_recv().ok();
        }
        if !failed && out.flush().await.is_err() {
            failed = true;
        }
    }
    let _ = out.flush().await;
}

/// `kairosctl bench worker …`: runs until stdin closes; returns the exit code.
pub async fn worker_main(w: WorkerArgs) -> i32 {
    let client = match Client::connect(&w.endpoint).await {
        Ok(c) => c.with_namespace(w.namespace.clone()),
        Err(e) => {
            eprintln!("bench worker {}: {e}", w.id);
            return 1;
        }
    };
    let (tx, rx) = mpsc::unbounded_channel::<Out>();
    let writing = tokio::spawn(writer(rx));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 256];
        while let Ok(n) = stdin.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        let _ = stop_tx.send(true);
        // Keep the sender: a dropped one would also read as "stop", which is fine, but be plain.
        std::future::pending::<()>().await;
    });
    let rec = tx.clone();
    let handler = move |task: Task| {
        let at = now_us();
        let _ = rec.send(Out::Line(format!("{} {} {at}\n", task.execution_id(), task.attempt())));
        async { Ok(serde_json::Value::Null) }
    };
    let _ = tx.send(Out::Line(format!("# ready {}\n", w.id)));
    let worker = Worker::new(client, w.queue.clone(), w.id.clone())
        .concurrency(w.slots)
        .handle(DEFINITION, handler);
    let result = worker.run(stop_rx).await;
    let (done_tx, done_rx) = oneshot::channel();
    let _ = tx.send(Out::Flush(done_tx));
    let _ = tokio::time::timeout(Duration::from_secs(10), done_rx).await;
    writing.abort();
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("bench worker {}: {e}", w.id);
            1
        }
    }
}

/// The worker processes of a run, their stdout read into the tracker.
pub struct Pool {
    children: Vec<Child>,
    readers: Vec<tokio::task::JoinHandle<()>>,
    ready: Arc<AtomicUsize>,
    exited: Arc<AtomicUsize>,
    logs: Vec<PathBuf>,
}

impl Pool {
    /// Spawns `n` workers of `slots` each, worker `i` against `endpoints[i mod len]`, serving
    /// `namespace`; waits until each has connected.
    #[allow(clippy::too_many_arguments)]
    pub async fn spawn(
        n: usize,
        slots: usize,
        threads: usize,
        endpoints: &[String],
        namespace: &str,
        dir: &WorkDir,
        tracker: Shared,
    ) -> Result<Pool> {
        let exe = std::env::current_exe().context("locating this executable for the workers")?;
        let mut pool = Pool {
            children: Vec::new(),
            readers: Vec::new(),
            ready: Arc::new(AtomicUsize::new(0)),
            exited: Arc::new(AtomicUsize::new(0)),
            logs: Vec::new(),
        };
        for i in 0..n {
            let (log, path) = dir.log(&format!("worker-{namespace}-{i}.log"))?;
            let id = format!("bench-w{i}-{namespace}-{}", std::process::id());
            let endpoint = &endpoints[i % endpoints.len()];
            let mut child = Command::new(&exe)
                .args(["bench", "worker", "--endpoint", endpoint, "--queue", QUEUE])
                .args(["--namespace", namespace])
                .args([
                    "--slots",
                    &slots.to_string(),
                    "--id",
                    &id,
                    "--threads",
                    &threads.to_string(),
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting worker {i} ({})", exe.display()))?;
            let stdout = child.stdout.take().context("worker stdout")?;
            let (tracker, ready, exited) =
                (tracker.clone(), pool.ready.clone(), pool.exited.clone());
            pool.readers.push(tokio::spawn(async move {
                let mut lines = BufReader::with_capacity(64 * 1024, stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.starts_with("# ready") {
                        ready.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let mut f = line.split_ascii_whitespace();
                    let (Some(id), Some(attempt), Some(at)) = (f.next(), f.next(), f.next()) else {
                        continue;
                    };
                    let (Ok(attempt), Ok(at)) = (attempt.parse::<u32>(), at.parse::<i64>()) else {
                        continue;
                    };
                    tracker.lock().start(id, attempt, at);
                }
                exited.fetch_add(1, Ordering::Relaxed);
            }));
            pool.children.push(child);
            pool.logs.push(path);
        }
        let t = Instant::now();
        while pool.ready.load(Ordering::Relaxed) < n {
            pool.check()?;
            if t.elapsed() > Duration::from_secs(30) {
                bail!("workers did not connect within 30 s; their logs: {}", pool.log_list());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(pool)
    }

    /// CPU seconds the worker processes used so far.
    pub fn cpu_s(&self) -> f64 {
        self.children
            .iter()
            .filter_map(|c| c.id())
            .filter_map(super::node::sample)
            .map(|s| s.cpu_s)
            .sum()
    }

    fn log_list(&self) -> String {
        self.logs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    }

    /// An error if a worker exited (its log's tail included).
    pub fn check(&self) -> Result<()> {
        if self.exited.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        let log = self.logs.first().map(|p| tail(p, 10)).unwrap_or_default();
        bail!("a worker process exited during the run; logs: {}\n{log}", self.log_list())
    }

    /// Stops every worker (closes its stdin: it finishes running tasks and flushes its
    /// records), then reads their pipes to the end. Kills a worker that has not stopped
    /// within 20 s.
    pub async fn stop(mut self) {
        for c in &mut self.children {
            drop(c.stdin.take());
        }
        for c in &mut self.children {
            if tokio::time::timeout(Duration::from_secs(20), c.wait()).await.is_err() {
                eprintln!("kairosctl bench: a worker did not stop within 20 s: killed");
                let _ = c.start_kill();
                let _ = c.wait().await;
            }
        }
        for r in self.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), r).await;
        }
    }
}
