//! The node under test: a `kairos dev` process the bench spawns (fresh data dir, free ports,
//! logs in the bench's temp dir), or a running node given by `--endpoint`; its CPU seconds and
//! RSS from `/proc`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio::process::{Child, Command};

/// The bench's own temp dir: the node's data dir and every log. Removed at the end of a
/// successful run (unless `--keep`), kept on failure.
pub struct WorkDir {
    pub path: PathBuf,
}

impl WorkDir {
    /// A fresh directory under the system temp dir.
    pub fn create() -> Result<WorkDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!(
            "kairos-bench-{}-{:x}",
            std::process::id(),
            nanos & 0xff_ffff_ffff
        ));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(WorkDir { path })
    }

    /// Removes it (data and logs).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }

    /// A log file in it.
    pub fn log(&self, name: &str) -> Result<(std::fs::File, PathBuf)> {
        let p = self.path.join(name);
        let f = std::fs::File::create(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok((f, p))
    }
}

/// A free TCP port on 127.0.0.1 (bound then released: another process could take it in
/// between, which the node's start-up would report).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// The `kairos` binary: `--kairos`, else `kairos` next to this executable, else
/// `e2e-kairos` next to it.
pub fn find_kairos(flag: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = flag {
        if !p.is_file() {
            bail!("--kairos {}: no such file", p.display());
        }
        return Ok(p.to_path_buf());
    }
    let exe = std::env::current_exe().context("locating this executable")?;
    let dir = exe.parent().ok_or_else(|| anyhow!("{} has no parent directory", exe.display()))?;
    for name in ["kairos", "e2e-kairos"] {
        let p = dir.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "no kairos binary next to {} (looked for kairos and e2e-kairos): build it \
         (cargo build --release -p kairos-actors) or pass --kairos PATH or --endpoint URL",
        exe.display()
    )
}

/// CPU seconds (user + system) and memory of a process, from `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    pub cpu_s: f64,
    /// Peak resident set (VmHWM), KiB.
    pub hwm_kib: u64,
    /// Resident set now (VmRSS), KiB.
    pub rss_kib: u64,
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// Samples `/proc/<pid>`; `None` when the process is gone (or not on Linux).
pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at field 3 (state):
    // utime is field 14, stime field 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some(ProcSample {
        cpu_s: (utime + stime) / clock_ticks(),
        hwm_kib: kib("VmHWM:"),
        rss_kib: kib("VmRSS:"),
    })
}

/// Whether process `pid` exists and is not a zombie (dead, not yet reaped).
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 1..].trim_start().starts_with(['Z', 'X'])))
        .is_some_and(|dead| !dead)
}

/// `GET /healthz` on 127.0.0.1:`port`: the status code and body.
fn healthz(port: u16) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(1),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let code = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    // Its first line: this node's own state (the lines after it list the cluster's nodes).
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let body = body.lines().next().unwrap_or_default().trim().to_string();
    Ok((code, body))
}

/// The last lines of a log file, for an error message.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A `kairos dev` process the bench spawned (and may SIGKILL and restart on the same data dir
/// and ports).
pub struct NodeProc {
    kairos: PathBuf,
    data_dir: PathBuf,
    dir: PathBuf,
    log_level: String,
    /// Which spawned node this is (0 for the first).
    index: usize,
    /// More flags (`--node-arg`, the postgres settings).
    extra: Vec<String>,
    pub http_port: u16,
    pub grpc_port: u16,
    child: Option<Child>,
    starts: usize,
    /// The current process's log.
    pub log_path: PathBuf,
    /// CPU seconds of the processes killed before (sampled just before each kill).
    retired_cpu_s: f64,
    /// Their peak RSS, KiB.
    retired_hwm_kib: u64,
    /// What `/healthz` answered last.
    pub health: String,
}

impl NodeProc {
    /// Spawns node `index` (`kairos dev` with `extra` flags) on a fresh data dir in `dir`
    /// (`data`, then `data-1`, `data-2`, …) and free ports; waits for `/healthz`.
    pub async fn spawn(
        kairos: PathBuf,
        dir: &Path,
        log_level: &str,
        index: usize,
        extra: Vec<String>,
    ) -> Result<NodeProc> {
        let data = if index == 0 { "data".to_string() } else { format!("data-{index}") };
        let mut node = NodeProc {
            kairos,
            data_dir: dir.join(data),
            dir: dir.to_path_buf(),
            log_level: log_level.to_string(),
            index,
            extra,
            http_port: free_port()?,
            grpc_port: free_port()?,
            child: None,
            starts: 0,
            log_path: PathBuf::new(),
            retired_cpu_s: 0.0,
            retired_hwm_kib: 0,
            health: String::new(),
        };
        node.start().await?;
        Ok(node)
    }

    /// The gRPC endpoint (`http://127.0.0.1:<port>`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// The current process's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// Starts the process (again) and waits until `/healthz` answers 200 (at most 60 s).
    pub async fn start(&mut self) -> Result<Duration> {
        let t = Instant::now();
        let log_name = match self.index {
            0 => format!("node-{}.log", self.starts),
            i => format!("node{i}-{}.log", self.starts),
        };
        self.starts += 1;
        let log = std::fs::File::create(self.dir.join(&log_name))
            .with_context(|| format!("creating {}", self.dir.join(&log_name).display()))?;
        self.log_path = self.dir.join(&log_name);
        let child = Command::new(&self.kairos)
            .arg("dev")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--listen-http", &format!("127.0.0.1:{}", self.http_port)])
            .args(["--listen-grpc", &format!("127.0.0.1:{}", self.grpc_port)])
            .args(["--log", &self.log_level])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.kairos.display()))?;
        self.child = Some(child);
        let deadline = t + Duration::from_secs(60);
        loop {
            let port = self.http_port;
            let probe = tokio::task::spawn_blocking(move || healthz(port)).await?;
            if let Ok((200, body)) = probe {
                self.health = body;
                return Ok(t.elapsed());
            }
            if let Some(c) = self.child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                bail!(
                    "the node exited ({status}) before answering /healthz; its log is {}:\n{}",
                    self.log_path.display(),
                    tail(&self.log_path, 20)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "the node did not answer GET http://127.0.0.1:{}/healthz with 200 within 60 s \
                     (last: {probe:?}); its log is {}:\n{}",
                    self.http_port,
                    self.log_path.display(),
                    tail(&self.log_path, 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILLs the process (its CPU and peak RSS, sampled just before, are kept).
    pub async fn kill(&mut self) {
        if let Some(s) = self.pid().and_then(sample) {
            self.retired_cpu_s += s.cpu_s;
            self.retired_hwm_kib = self.retired_hwm_kib.max(s.hwm_kib);
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }

    /// An error naming the log if the process died.
    pub fn check(&self) -> Result<()> {
        match self.pid() {
            Some(pid) if running(pid) => Ok(()),
            _ => bail!(
                "the node died during the run; its log is {}:\n{}",
                self.log_path.display(),
                tail(&self.log_path, 20)
            ),
        }
    }

    /// CPU seconds of every process so far, and their peak RSS (KiB), and the current RSS.
    pub fn sample(&self) -> ProcSample {
        let now = self.pid().and_then(sample).unwrap_or_default();
        ProcSample {
            cpu_s: self.retired_cpu_s + now.cpu_s,
            hwm_kib: self.retired_hwm_kib.max(now.hwm_kib),
            rss_kib: now.rss_kib,
        }
    }
}

/// The node as the scenarios see it: spawned, or running elsewhere.
pub enum Node {
    /// Spawned by the bench.
    Spawned(Box<NodeProc>),
    /// `--endpoint`, with `--node-pid` if given.
    External { endpoint: String, pid: Option<u32> },
}

impl Node {
    /// Its gRPC endpoint.
    pub fn endpoint(&self) -> String {
        match self {
            Node::Spawned(p) => p.endpoint(),
            Node::External { endpoint, .. } => endpoint.clone(),
        }
    }

    /// CPU seconds and RSS, when known.
    pub fn sample(&self) -> Option<ProcSample> {
        match self {
            Node::Spawned(p) => Some(p.sample()),
            Node::External { pid, .. } => pid.and_then(sample),
        }
    }

    /// The spawned process, if any.
    pub fn spawned(&mut self) -> Option<&mut NodeProc> {
        match self {
            Node::Spawned(p) => Some(p),
            Node::External { .. } => None,
        }
    }
}
