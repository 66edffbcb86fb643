//! Test support: a throwaway PostgreSQL cluster in a temporary directory, on a private port
//! of 127.0.0.1, from the server binaries of Debian's `postgresql` package (`.ci/install-postgres`
//! installs it). Not for production use.
//!
//! [`TempCluster::start`] runs `initdb` into a new temporary directory and `pg_ctl start` with
//! the socket in that directory — as the `postgres` user when the process runs as root
//! (PostgreSQL refuses to run as root). Dropping the cluster stops it (`pg_ctl stop -m
//! immediate`) and removes the directory. A watchdog process stops it too if this process dies
//! without dropping it (a SIGKILLed test binary), so no server outlives its test.
//!
//! [`shared`] is one cluster per process (fsync off), stopped when the process exits; each test
//! takes its own schema on it ([`fresh_schema`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a test prints when PostgreSQL's server binaries are missing.
pub const INSTALL_HINT: &str = "PostgreSQL's server binaries (initdb, pg_ctl) were not found: run \
    .ci/install-postgres (it installs Debian's postgresql package), or set KAIROS_PG_BIN to the \
    directory holding them";

/// Settings of a throwaway cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// Whether PostgreSQL fsyncs (off for functional tests; on for benchmarks).
    pub fsync: bool,
    /// More `postgresql.conf` settings, as `name=value` (`-c` options of the server).
    pub settings: Vec<String>,
}

/// A running throwaway cluster; stopped and removed when dropped.
#[derive(Debug)]
pub struct TempCluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    owner: Option<(u32, u32)>,
    watchdog: Option<Child>,
    stopped: bool,
}

/// The directory of `initdb` and `pg_ctl`: `KAIROS_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian's layout).
pub fn bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("KAIROS_PG_BIN") {
        let dir = PathBuf::from(dir);
        return if dir.join("initdb").exists() {
            Ok(dir)
        } else {
            Err(format!("KAIROS_PG_BIN={} holds no initdb. {INSTALL_HINT}", dir.display()))
        };
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| INSTALL_HINT.to_string())?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b).ok_or_else(|| INSTALL_HINT.to_string())
}

/// The `postgres` user's uid and gid, when this process runs as root.
fn owner() -> Result<Option<(u32, u32)>, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = c"postgres";
    // SAFETY: a NUL-terminated name; the returned record is read at once, before any other
    // call that could reuse its static storage.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err(format!(
            "running as root needs the postgres user to run the server: {INSTALL_HINT}"
        ));
    }
    // SAFETY: `pw` is a valid record returned just above.
    Ok(Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) }))
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

fn unique_dir() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let mut salt = [0u8; 4];
    let _ = getrandom::fill(&mut salt);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "kairos-pg-{}-{n}-{:08x}",
        std::process::id(),
        u32::from_le_bytes(salt)
    ))
}

impl TempCluster {
    /// A cluster with fsync off.
    pub fn start() -> Result<Self, String> {
        Self::start_with(ClusterOptions::default())
    }

    /// A cluster with `options`.
    pub fn start_with(options: ClusterOptions) -> Result<Self, String> {
        let bin = bin_dir()?;
        let owner = owner()?;
        let dir = unique_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut cluster = TempCluster { dir, bin, port: 0, owner, watchdog: None, stopped: false };
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&cluster.dir, Some(uid), Some(gid))
                .map_err(|e| format!("cannot give {} to postgres: {e}", cluster.dir.display()))?;
        }
        cluster.run(
            "initdb",
            &["-D", "data", "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"],
        )?;
        let mut last = String::new();
        for _ in 0..5 {
            cluster.port = free_port()?;
            match cluster.pg_ctl_start(&options) {
                Ok(()) => {
                    cluster.watchdog = cluster.spawn_watchdog().ok();
                    return Ok(cluster);
                }
                Err(e) => last = e, // most likely the port was taken meanwhile
            }
        }
        Err(format!("PostgreSQL did not start: {last}"))
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(self.bin.join(program));
        c.current_dir(&self.dir).stdin(Stdio::null());
        if let Some((uid, gid)) = self.owner {
            std::os::unix::process::CommandExt::uid(&mut c, uid);
            std::os::unix::process::CommandExt::gid(&mut c, gid);
        }
        c
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let out = self
            .command(program)
            .args(args)
            .output()
            .map_err(|e| format!("cannot run {program}: {e}. {INSTALL_HINT}"))?;
        if !out.status.success() {
            return Err(format!(
                "{program} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }

    fn pg_ctl_start(&self, options: &ClusterOptions) -> Result<(), String> {
        let mut server = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync={} -c max_connections=300",
            self.port,
            self.dir.display(),
            if options.fsync { "on" } else { "off" }
        );
        for s in &options.settings {
            server.push_str(&format!(" -c {s}"));
        }
        let log = self.dir.join("log");
        let log = log.to_string_lossy();
        self.run("pg_ctl", &["-D", "data", "-l", &log, "-w", "-t", "60", "-o", &server, "start"])
            .map_err(|e| {
                format!(
                    "{e}\n{}",
                    std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
                )
            })
    }

    /// A process that stops the server and removes the directory once this process is gone.
    fn spawn_watchdog(&self) -> std::io::Result<Child> {
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             kill -QUIT $(head -n 1 {dir}/data/postmaster.pid 2>/dev/null) 2>/dev/null; \
             sleep 2; rm -rf {dir}",
            pid = std::process::id(),
            dir = self.dir.display()
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    }

    /// The TCP port of the server (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory of the cluster (data in `data/`, the server log in `log`, the socket).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A URL of database `postgres` as user `postgres` (trust authentication).
    pub fn url(&self) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's process id (from `postmaster.pid`).
    pub fn pid(&self) -> Option<u32> {
        let pid = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).ok()?;
        pid.lines().next()?.trim().parse().ok()
    }

    /// Runs SQL through `psql` (from the same binaries) as `postgres`; returns its output.
    pub fn psql(&self, sql: &str) -> Result<String, String> {
        let port = self.port.to_string();
        let out = self
            .command("psql")
            .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-d", "postgres"])
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .map_err(|e| format!("cannot run psql: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Stops the server (immediate shutdown) and removes its directory.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let _ = self.run("pg_ctl", &["-D", "data", "-m", "immediate", "-w", "stop"]);
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for TempCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

static SHARED: Mutex<Option<Result<TempCluster, String>>> = Mutex::new(None);

extern "C" fn stop_shared_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(Ok(c)) = SHARED.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            c.stop();
        }
    });
}

/// The URL of this process's shared cluster (fsync off), started on first use and stopped
/// when the process exits. Fails with [`INSTALL_HINT`] when PostgreSQL is missing.
pub fn shared() -> Result<String, String> {
    let mut guard = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        let started = TempCluster::start();
        if started.is_ok() {
            // SAFETY: registers a plain `extern "C"` function that lets no panic unwind out.
            unsafe { libc::atexit(stop_shared_at_exit) };
        }
        *guard = Some(started);
    }
    match guard.as_ref() {
        Some(Ok(c)) => Ok(c.url()),
        Some(Err(e)) => Err(e.clone()),
        None => Err("unreachable: the shared cluster was just set".into()),
    }
}

/// A schema name no other caller in this process gets (`t1`, `t2`, …, after `prefix`).
pub fn fresh_schema(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}{}", N.fetch_add(1, Ordering::Relaxed) + 1)
}
