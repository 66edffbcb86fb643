//! The processes of a cluster test, each inside its node's network namespace: `kairos serve`
//! nodes (SIGKILLed, stopped with SIGTERM, restarted on the same settings) and
//! `kairosctl bench worker` processes, whose no-op handler prints one line per start
//! (`<execution-id> <attempt> <start-µs>`), gathered here as [`Start`]s.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The HTTP and gRPC ports every node listens on (inside its own namespace).
pub const HTTP_PORT: u16 = 7070;
/// See [`HTTP_PORT`].
pub const GRPC_PORT: u16 = 7071;

/// A `kairos serve` process in a namespace.
#[derive(Debug)]
pub struct NodeProc {
    /// Its index (1-based), also in its node id `n<index>`.
    pub index: u8,
    /// Its HTTP listener (reachable from the test's namespace while the link is up).
    pub http: SocketAddr,
    /// Its gRPC listener.
    pub grpc: SocketAddr,
    netns: String,
    kairos: PathBuf,
    args: Vec<String>,
    logs: PathBuf,
    child: Option<Child>,
    starts: usize,
}

fn in_netns(netns: &str, program: &Path) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", netns]).arg(program);
    c
}

impl NodeProc {
    /// A node (not started yet) in namespace `netns` at `ip`, with these `kairos serve` flags
    /// besides its id and listeners; its logs go to `logs/node-<index>-<start>.log`.
    pub fn new(
        index: u8,
        netns: &str,
        ip: std::net::Ipv4Addr,
        kairos: &Path,
        flags: Vec<String>,
        logs: &Path,
    ) -> NodeProc {
        let (http, grpc) = (SocketAddr::from((ip, HTTP_PORT)), SocketAddr::from((ip, GRPC_PORT)));
        let mut args = vec!["serve".to_string(), "--node-id".into(), format!("n{index}")];
        args.extend(["--listen-http".into(), http.to_string()]);
        args.extend(["--listen-grpc".into(), grpc.to_string()]);
        args.extend(flags);
        NodeProc {
            index,
            http,
            grpc,
            netns: netns.to_string(),
            kairos: kairos.to_path_buf(),
            args,
            logs: logs.to_path_buf(),
            child: None,
            starts: 0,
        }
    }

    /// The gRPC endpoint (`http://ip:port`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// The log of the current (or last) process.
    pub fn log_path(&self) -> PathBuf {
        self.logs.join(format!("node-{}-{}.log", self.index, self.starts.saturating_sub(1)))
    }

    /// Starts the process and waits until `/healthz` answers 200 (at most `within`).
    pub fn start(&mut self, within: Duration) -> Result<()> {
        let log = std::fs::File::create(
            self.logs.join(format!("node-{}-{}.log", self.index, self.starts)),
        )?;
        self.starts += 1;
        let child = in_netns(&self.netns, &self.kairos)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting kairos serve")?;
        self.child = Some(child);
        let t = Instant::now();
        while t.elapsed() < within {
            if let Some(c) = self.child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                bail!("node n{} exited ({status}): {}", self.index, self.log_tail(20));
            }
            if self.healthz().is_ok_and(|(code, _)| code == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("node n{} not healthy within {within:?}: {}", self.index, self.log_tail(20))
    }

    /// `GET /healthz`: status and body.
    pub fn healthz(&self) -> std::io::Result<(u16, String)> {
        crate::http_request_at(self.http, "GET", "/healthz", &[], b"")
    }

    /// The node's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM (drain, release the leases, stop); SIGKILL if it has not exited after `within`.
    pub fn terminate(&mut self, within: Duration) -> Result<()> {
        let Some(mut c) = self.child.take() else { return Ok(()) };
        Command::new("kill").args(["-TERM", &c.id().to_string()]).status()?;
        let t = Instant::now();
        while t.elapsed() < within {
            if let Some(status) = c.try_wait()? {
                if !status.success() {
                    bail!("node n{} stopped with {status}: {}", self.index, self.log_tail(20));
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        bail!("node n{} did not stop within {within:?} of SIGTERM", self.index)
    }

    /// The last `lines` lines of the current log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log_path(), lines)
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    format!("{}:\n{}", path.display(), all[all.len().saturating_sub(lines)..].join("\n"))
}

/// One handler start a worker reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// The execution.
    pub id: String,
    /// Its attempt number.
    pub attempt: u32,
    /// When the handler started, µs since the epoch (the machine's clock, which the nodes
    /// share).
    pub at_us: i64,
    /// The worker (the index of its node).
    pub worker: u8,
}

/// Every start reported so far, by every worker.
pub type Starts = Arc<Mutex<Vec<Start>>>;

/// A `kairosctl bench worker` process in a node's namespace, connected to that node.
#[derive(Debug)]
pub struct WorkerProc {
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl WorkerProc {
    /// Starts worker `index` on `endpoint` with `slots` slots; its starts go to `starts`.
    pub fn start(
        index: u8,
        netns: &str,
        kairosctl: &Path,
        endpoint: &str,
        slots: usize,
        logs: &Path,
        starts: Starts,
    ) -> Result<WorkerProc> {
        let log = std::fs::File::create(logs.join(format!("worker-{index}.log")))?;
        let mut child = in_netns(netns, kairosctl)
            .args(["bench", "worker", "--endpoint", endpoint, "--queue", "bench"])
            .args(["--slots", &slots.to_string(), "--id", &format!("w{index}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting kairosctl bench worker")?;
        let stdout = child.stdout.take().context("the worker's stdout")?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(std::io::Result::ok) {
                if line.starts_with("# ready") {
                    let _ = ready_tx.send(());
                } else if let Some(s) = parse_start(&line, index) {
                    starts.lock().unwrap_or_else(|e| e.into_inner()).push(s);
                }
            }
        });
        let stdin = child.stdin.take();
        let w = WorkerProc { child, stdin, reader: Some(reader) };
        ready_rx.recv_timeout(Duration::from_secs(30)).with_context(|| {
            format!(
                "worker w{index} did not connect: {}",
                tail(&logs.join(format!("worker-{index}.log")), 10)
            )
        })?;
        Ok(w)
    }

    /// Stops it gracefully (stdin closed: running tasks finish, records flushed).
    pub fn stop(&mut self) {
        self.stdin.take();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if self.child.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        self.stop();
    }
}

fn parse_start(line: &str, worker: u8) -> Option<Start> {
    let mut it = line.split_whitespace();
    let id = it.next()?.to_string();
    let attempt = it.next()?.parse().ok()?;
    let at_us = it.next()?.parse().ok()?;
    Some(Start { id, attempt, at_us, worker })
}
