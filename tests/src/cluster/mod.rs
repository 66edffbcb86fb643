//! A real cluster for the cluster tests (`tests/tests/cluster.rs`): a PostgreSQL primary
//! (optionally with a synchronous streaming standby) in the test's network namespace, and
//! `kairos serve` nodes on it, each in a network namespace of its own joined to the test's by
//! a veth pair ([`netns`]), each with a `kairosctl bench worker` process beside it in its
//! namespace ([`procs`]). Nodes reach the database at their veth's far end through a
//! multi-host URL with `target_session_attrs=read-write` (the primary, then the standby).
//!
//! Only one cluster runs at a time in a test process (they would share CPU and ports); a
//! second [`Cluster::start`] waits. Everything is stopped when the [`Cluster`] is dropped:
//! workers, nodes, namespaces, then the database. Logs stay in the cluster's directory when
//! the test failed (its path is printed) or `KAIROS_CLUSTER_KEEP` is set.
#![allow(clippy::disallowed_methods)] // real processes, real time

pub mod link;
pub mod load;
pub mod netns;
pub mod observe;
pub mod pg;
pub mod procs;
pub mod regions;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result};
use kairos_sdk::Client;

use link::Links;
use netns::Netns;
use pg::PgServer;
use procs::{NodeProc, Starts, WorkerProc};

/// The binaries under test.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `kairos`.
    pub kairos: PathBuf,
    /// `kairosctl` (its `bench worker`).
    pub kairosctl: PathBuf,
}

/// The shape of a cluster.
#[derive(Debug, Clone)]
pub struct Options {
    /// Nodes (each with a worker).
    pub nodes: u8,
    /// A synchronous streaming standby beside the primary.
    pub standby: bool,
    /// Worker slots per worker process.
    pub slots: usize,
    /// The nodes' YAML settings (every node the same, but for `region` in two regions).
    pub node_yaml: String,
    /// Two regions ([`regions`]): nodes 1 and 2 and the primary in region A, the others and
    /// the standby (implied) in region B, every path between them through a delaying link.
    pub regions: bool,
}

/// Shard leases in the cluster tests: short, so a takeover is quick.
pub const SHARD_LEASE_MS: u64 = 3_000;

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 3,
            standby: false,
            regions: false,
            slots: 50,
            node_yaml: format!(
                "shard_count: 64\nshard_lease_ms: {SHARD_LEASE_MS}\nnode_ttl_ms: {SHARD_LEASE_MS}\n\
                 poll_interval_ms: 500\nregion: r1\nauth: off\nlog: info\n"
            ),
        }
    }
}

static SERIAL: Mutex<()> = Mutex::new(());

/// A running cluster; see the module docs.
pub struct Cluster {
    /// The workers, one per node (index `i` beside node `i + 1`).
    pub workers: Vec<WorkerProc>,
    /// The nodes.
    pub nodes: Vec<NodeProc>,
    /// Their namespaces.
    pub nets: Vec<Netns>,
    /// The standby, when asked for.
    pub standby: Option<PgServer>,
    /// The primary.
    pub pg: PgServer,
    /// The delaying links between the regions (none in one region).
    pub links: Links,
    /// Each node's database hosts, primary first (two regions; empty: every server direct).
    routes: Vec<Vec<String>>,
    /// Every start the workers reported.
    pub starts: Starts,
    /// Logs and node data directories.
    pub dir: PathBuf,
    bins: Binaries,
    slots: usize,
    _serial: MutexGuard<'static, ()>,
}

impl Cluster {
    /// Starts the database, the namespaces, the nodes (one after the other, each healthy
    /// before the next), registers the test definition and starts the workers.
    pub async fn start(bins: &Binaries, o: &Options) -> Result<Cluster> {
        let mut c = tokio::task::block_in_place(|| Cluster::start_nodes(bins, o))?;
        c.register_definition().await?;
        for i in 0..c.nodes.len() {
            let w = tokio::task::block_in_place(|| c.worker_proc(i))?;
            c.workers.push(w);
        }
        Ok(c)
    }

    fn start_nodes(bins: &Binaries, o: &Options) -> Result<Cluster> {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        netns::require_root()?;
        let dir = tempfile::Builder::new().prefix("kairos-cluster-").tempdir()?.keep();
        let pg = PgServer::primary(o.standby || o.regions, &[]).context("starting the primary")?;
        let mut links = Links::default();
        let standby = match (o.regions, o.standby) {
            (true, _) => Some(regions::standby(&pg, &mut links)?),
            (false, true) => Some(PgServer::standby_of(&pg)?),
            (false, false) => None,
        };
        let nets = (1..=o.nodes).map(Netns::create).collect::<Result<Vec<_>>>()?;
        let routes = match (&standby, o.regions) {
            (Some(s), true) => regions::routes(&pg, s, &nets, &mut links)?,
            _ => Vec::new(),
        };
        write_configs(&dir, o)?;
        let mut c = Cluster {
            links,
            routes,
            workers: Vec::new(),
            nodes: Vec::new(),
            nets,
            standby,
            pg,
            starts: Starts::default(),
            dir,
            bins: bins.clone(),
            slots: o.slots,
            _serial: serial,
        };
        for i in 0..usize::from(o.nodes) {
            let node = c.node_proc(i);
            c.nodes.push(node);
            c.nodes[i].start(Duration::from_secs(60))?;
        }
        Ok(c)
    }

    /// The database URL node `i` (0-based) uses: every server, through its veth's far end.
    pub fn url(&self, i: usize) -> String {
        let host = self.nets[i].host_ip;
        let mut hosts = vec![self.pg.addr(host)];
        hosts.extend(self.standby.as_ref().map(|s| s.addr(host)));
        if let Some(routes) = self.routes.get(i) {
            hosts.clone_from(routes);
        }
        format!(
            "postgresql://postgres@{}/postgres?target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    fn node_proc(&self, i: usize) -> NodeProc {
        let data = self.dir.join(format!("n{}", i + 1));
        let flags = [
            "--config",
            &self.dir.join(config_name(&self.routes, i)).to_string_lossy(),
            "--data-dir",
            &data.to_string_lossy(),
            "--backend",
            "postgres",
            "--postgres-url",
            &self.url(i),
        ]
        .map(String::from)
        .to_vec();
        let net = &self.nets[i];
        NodeProc::new(net_index(i), &net.name, net.ns_ip, &self.bins.kairos, flags, &self.dir)
    }

    fn worker_proc(&self, i: usize) -> Result<WorkerProc> {
        let (node, net) = (&self.nodes[i], &self.nets[i]);
        WorkerProc::start(
            net_index(i),
            &net.name,
            &self.bins.kairosctl,
            &node.endpoint(),
            self.slots,
            &self.dir,
            self.starts.clone(),
        )
    }

    async fn register_definition(&self) -> Result<()> {
        let c = self.client(0).await?;
        c.register_definition(&load::definition_yaml())
            .await
            .context("registering the test definition")?;
        Ok(())
    }

    /// A client of node `i` (0-based), with a 5 s call timeout.
    pub async fn client(&self, i: usize) -> Result<Client> {
        let c = Client::connect(&self.nodes[i].endpoint()).await?;
        Ok(c.with_timeout(Duration::from_secs(5)))
    }

    /// Clients of every node.
    pub async fn clients(&self) -> Result<Vec<Client>> {
        let mut out = Vec::new();
        for i in 0..self.nodes.len() {
            out.push(self.client(i).await?);
        }
        Ok(out)
    }

    /// The last lines of every node's current log (for a failure message).
    pub fn logs(&self) -> String {
        let nodes = self.nodes.iter().map(|n| n.log_tail(15));
        nodes.collect::<Vec<_>>().join("\n")
    }

    /// The cluster's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

/// Writes `node.yaml` (one region) or `node-a.yaml` and `node-b.yaml` (two).
fn write_configs(dir: &Path, o: &Options) -> Result<()> {
    std::fs::write(dir.join("node.yaml"), &o.node_yaml)?;
    for r in ["a", "b"].iter().filter(|_| o.regions) {
        std::fs::write(dir.join(format!("node-{r}.yaml")), regions::yaml(&o.node_yaml, r))?;
    }
    Ok(())
}

/// The settings file of node `i`: its region's in two regions.
fn config_name(routes: &[Vec<String>], i: usize) -> String {
    match routes.is_empty() {
        true => "node.yaml".to_string(),
        false => format!("node-{}.yaml", regions::region_of(i)),
    }
}

fn net_index(i: usize) -> u8 {
    u8::try_from(i + 1).unwrap_or(u8::MAX)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.workers.clear();
        self.nodes.clear();
        self.nets.clear();
        if std::thread::panicking() || std::env::var_os("KAIROS_CLUSTER_KEEP").is_some() {
            eprintln!("cluster logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
