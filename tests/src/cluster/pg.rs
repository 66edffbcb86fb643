//! PostgreSQL servers a cluster test starts itself, from Debian's server binaries: a primary,
//! and optionally a synchronous streaming standby (`pg_basebackup -R`) that the test promotes
//! (`pg_ctl promote`) after SIGKILLing the primary. Each server listens on every address of
//! the test's namespace (the nodes reach it through their veth pairs), trusts every client
//! (a throwaway server), runs as the `postgres` user, and lives in a temporary directory that
//! is removed when it is dropped. A watchdog stops it if the test process dies without
//! dropping it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The standby's name in `synchronous_standby_names` (its `application_name`).
pub const STANDBY_NAME: &str = "standby1";

/// One PostgreSQL server (a primary or a standby).
#[derive(Debug)]
pub struct PgServer {
    dir: PathBuf,
    bin: PathBuf,
    /// Its TCP port (on every address).
    pub port: u16,
    owner: (u32, u32),
    watchdog: Option<Child>,
    stopped: bool,
}

/// The `postgres` user's uid and gid (`id -u postgres`, `id -g postgres`).
fn postgres_user() -> Result<(u32, u32)> {
    let id = |flag: &str| -> Result<u32> {
        let out = Command::new("id").args([flag, "postgres"]).output().context("running id")?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .with_context(|| format!("no postgres user ({}): {}", flag, super::netns::NEEDS))
    };
    Ok((id("-u")?, id("-g")?))
}

/// A TCP port free on every address now.
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("0.0.0.0:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

impl PgServer {
    /// A new primary on a free port, with `settings` (`name=value`) on top of: listen on every
    /// address, fsync on, synchronous_commit on, and `synchronous_standby_names` naming
    /// [`STANDBY_NAME`] when `sync_standby` (every commit then waits for that standby).
    pub fn primary(sync_standby: bool, settings: &[&str]) -> Result<PgServer> {
        let mut pg = PgServer::new()?;
        pg.run("initdb", &["-D", "data", "-U", "postgres", "-A", "trust", "-E", "UTF8"])?;
        pg.trust_everyone()?;
        if sync_standby {
            // In postgresql.conf, not on the command line: a `-c` setting outranks ALTER SYSTEM,
            // and the operator's step when the standby is lost is
            // `ALTER SYSTEM SET synchronous_standby_names = ''` (docs/deployment.md).
            let conf = pg.dir.join("data/postgresql.conf");
            let mut text = std::fs::read_to_string(&conf).context("reading postgresql.conf")?;
            text.push_str(&format!("synchronous_standby_names = '{STANDBY_NAME}'\n"));
            std::fs::write(&conf, text).context("writing postgresql.conf")?;
        }
        let all: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
        pg.start(&all)?;
        Ok(pg)
    }

    /// A streaming standby of `primary` named [`STANDBY_NAME`], started on a free port; waits
    /// until the primary counts it as its synchronous standby.
    pub fn standby_of(primary: &PgServer) -> Result<PgServer> {
        PgServer::standby_via(primary, primary.port)
    }

    /// [`PgServer::standby_of`], replicating through `127.0.0.1:port` (a delaying
    /// [`super::link::Link`] to the primary, in the two-region tests).
    pub fn standby_via(primary: &PgServer, port: u16) -> Result<PgServer> {
        let mut pg = PgServer::new()?;
        let conninfo =
            format!("host=127.0.0.1 port={port} user=postgres application_name={STANDBY_NAME}");
        pg.run("pg_basebackup", &["-d", &conninfo, "-D", "data", "-R", "-X", "stream"])?;
        // pg_basebackup copied the primary's postgresql.conf, which names this standby as the
        // synchronous one: once promoted, it would wait for itself. A standby names none.
        let conf = pg.dir.join("data/postgresql.conf");
        let text = std::fs::read_to_string(&conf).context("reading postgresql.conf")?;
        let keep = text.lines().filter(|l| !l.starts_with("synchronous_standby_names"));
        std::fs::write(&conf, keep.collect::<Vec<_>>().join("\n") + "\n")
            .context("writing postgresql.conf")?;
        // Promotion waits this long for WAL that will never come (the primary is gone).
        pg.start(&["wal_retrieve_retry_interval=500ms".to_string()])?;
        let t = Instant::now();
        loop {
            let q = "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'";
            if primary.psql(q)?.lines().any(|l| l.trim() == "sync") {
                return Ok(pg);
            }
            if t.elapsed() > Duration::from_secs(30) {
                bail!("the standby did not become the primary's synchronous standby in 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn new() -> Result<PgServer> {
        let bin = kairos_layer::kv::postgres::testing::bin_dir().map_err(anyhow::Error::msg)?;
        let owner = postgres_user()?;
        let dir = tempfile::Builder::new().prefix("kairos-cluster-pg-").tempdir()?.keep();
        std::os::unix::fs::chown(&dir, Some(owner.0), Some(owner.1))
            .with_context(|| format!("giving {} to postgres", dir.display()))?;
        Ok(PgServer { dir, bin, port: 0, owner, watchdog: None, stopped: false })
    }

    /// Trusts every client and replication connection (a throwaway server).
    fn trust_everyone(&self) -> Result<()> {
        let hba = self.dir.join("data/pg_hba.conf");
        let mut text = std::fs::read_to_string(&hba).context("reading pg_hba.conf")?;
        text.push_str("host all all 0.0.0.0/0 trust\nhost replication all 0.0.0.0/0 trust\n");
        std::fs::write(&hba, text).context("writing pg_hba.conf")
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(self.bin.join(program));
        c.current_dir(&self.dir).stdin(Stdio::null());
        std::os::unix::process::CommandExt::uid(&mut c, self.owner.0);
        std::os::unix::process::CommandExt::gid(&mut c, self.owner.1);
        c
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        let out = self.command(program).args(args).output().with_context(|| {
            format!("running {program}: {}", kairos_layer::kv::postgres::testing::INSTALL_HINT)
        })?;
        if !out.status.success() {
            bail!(
                "{program} {} failed ({}): {}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Starts the server on a free port (a few tries: a port can be taken in between).
    fn start(&mut self, settings: &[String]) -> Result<()> {
        let mut last = None;
        for _ in 0..5 {
            self.port = free_port()?;
            let mut server = format!(
                "-p {} -k {} -c listen_addresses=* -c fsync=on -c synchronous_commit=on \
                 -c max_connections=200 -c wal_sender_timeout=5s",
                self.port,
                self.dir.display()
            );
            for s in settings {
                server.push_str(&format!(" -c {s}"));
            }
            let log = self.dir.join("log").to_string_lossy().into_owned();
            match self.run(
                "pg_ctl",
                &["-D", "data", "-l", &log, "-w", "-t", "60", "-o", &server, "start"],
            ) {
                Ok(_) => {
                    self.watchdog = self.spawn_watchdog().ok();
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .unwrap_or_else(|| anyhow::anyhow!("PostgreSQL did not start"))
            .context(std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()))
    }

    /// Stops the server once this process is gone (if the test did not).
    fn spawn_watchdog(&self) -> std::io::Result<Child> {
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             kill -QUIT $(head -n 1 {dir}/data/postmaster.pid 2>/dev/null) 2>/dev/null; \
             sleep 2; rm -rf {dir}",
            pid = std::process::id(),
            dir = self.dir.display()
        );
        Command::new("sh").args(["-c", &script]).stdin(Stdio::null()).spawn()
    }

    /// `host:port` as seen from a node whose route to this server is `host`.
    pub fn addr(&self, host: std::net::Ipv4Addr) -> String {
        format!("{host}:{}", self.port)
    }

    /// The server's directory (`data/`, the log `log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs SQL with `psql` over 127.0.0.1; returns its unaligned output.
    pub fn psql(&self, sql: &str) -> Result<String> {
        let port = self.port.to_string();
        self.run(
            "psql",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ],
        )
    }

    /// The postmaster's pid.
    fn pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// SIGKILLs the postmaster and every process it started, as a machine dying would.
    pub fn kill(&mut self) -> Result<()> {
        let pid = self.pid().context("no postmaster.pid: the server is not running")?;
        let mut victims = vec![pid];
        for e in std::fs::read_dir("/proc")?.flatten() {
            let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let ppid = stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1));
            if ppid.and_then(|p| p.parse::<u32>().ok()) == Some(pid) {
                victims.push(child);
            }
        }
        let list: Vec<String> = victims.iter().map(u32::to_string).collect();
        Command::new("kill").arg("-KILL").args(&list).status().context("running kill")?;
        Ok(())
    }

    /// Promotes this standby to a primary (`pg_ctl promote -w`).
    pub fn promote(&self) -> Result<()> {
        self.run("pg_ctl", &["-D", "data", "-w", "-t", "60", "promote"]).map(|_| ())
    }

    /// Stops the server (immediate shutdown) and removes its directory.
    pub fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        let _ = self.run("pg_ctl", &["-D", "data", "-m", "immediate", "-w", "stop"]);
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        if std::env::var_os("KAIROS_CLUSTER_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
    }
}
