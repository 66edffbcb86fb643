//! A running node: the facade the API server (gRPC/HTTP), the command line and in-process
//! users go through. It admits requests (sizes and quotas: [`admission`]), runs the layer's
//! operations or hands them to the actors (polls and worker streams to the dispatcher, results
//! and heartbeats to the batcher: [`work`]), and has what follows a commit done by
//! [`effects`](crate::runtime::effects). Started by [`Node::start`] (in `boot`, above the API
//! whose in-process client the cron service uses); the store's health is watched by
//! [`health`].

mod admission;
mod cluster;
mod cron;
pub(crate) mod health;
pub mod queues;
mod work;

use std::sync::Arc;
use std::time::Duration;

use kairos_layer::kv::StoreHealth;
use kairos_layer::ops::control::Cancelled;
use kairos_layer::ops::{self, Scheduler};
use kairos_proto::storage::v1::Execution;
use ractor::ActorRef;
use tokio::task::JoinHandle;

use crate::runtime::context::Ctx;
use crate::runtime::effects;
use crate::runtime::messages::SupervisorMsg;
pub use crate::runtime::messages::{WorkerPoll, WorkerStream};
use crate::server::auth::Auth;
use crate::server::config::{ConfigError, NodeConfig};
use crate::server::metrics::Metrics;
use crate::server::quota::Quotas;
pub use cluster::NodeView;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The cluster could not be opened.
    #[error("opening the cluster: {0}")]
    Cluster(#[from] ops::Error),
    /// The actors could not start.
    #[error("starting the actors: {0}")]
    Actors(String),
}

/// What a node holds (built by `Node::start`).
pub(crate) struct Inner {
    pub(crate) ctx: Ctx,
    /// API keys: who is calling and what they may do.
    pub(crate) auth: Arc<Auth>,
    /// Per-namespace quotas and their state on this node.
    pub(crate) quotas: Arc<Quotas>,
    /// The store's health, as last seen by the health watch (see [`Node::store_health`]).
    pub(crate) health: tokio::sync::watch::Receiver<StoreHealth>,
    pub(crate) supervisor: ActorRef<SupervisorMsg>,
    pub(crate) join: std::sync::Mutex<Option<JoinHandle<()>>>,
    /// Why the store's bytes were not verified when it was opened (an embedded store after a
    /// crash, too large to verify at start-up); `None` when they were, or need not be.
    pub(crate) store_doubt: std::sync::Mutex<Option<String>>,
}

/// A running node. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    pub(crate) inner: Arc<Inner>,
}

impl Node {
    pub(crate) fn ctx(&self) -> &Ctx {
        &self.inner.ctx
    }

    /// The scheduler operations (reads, definitions, leases).
    pub fn scheduler(&self) -> &Scheduler {
        &self.ctx().sched
    }

    /// The node's configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.ctx().config
    }

    /// API keys: who is calling and what they may do.
    pub fn auth(&self) -> &Auth {
        &self.inner.auth
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.ctx().node_id
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.ctx().metrics
    }

    /// The store's health now: healthy, refusing writes for now (a full disk), or failed for
    /// good.
    pub fn store_health(&self) -> StoreHealth {
        self.ctx().sched.database().health()
    }

    /// A receiver of the store's health changes (the command line stops the node when the
    /// store fails).
    pub fn watch_store_health(&self) -> tokio::sync::watch::Receiver<StoreHealth> {
        self.inner.health.clone()
    }

    /// Records why the store was opened without verifying its bytes: `/healthz` says so
    /// instead of `ok` (nothing shows the store damaged, nothing showed it sound).
    pub fn note_store_unverified(&self, why: String) {
        *self.inner.store_doubt.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }

    /// Why the store was opened unverified, if it was.
    pub fn store_doubt(&self) -> Option<String> {
        self.inner.store_doubt.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The workers waiting on this node, with their credits (the console's overview).
    pub fn workers(&self) -> Vec<crate::runtime::matchmaker::WaitingWorker> {
        self.ctx().matchmaker.waiting_workers()
    }

    /// This node's last hour, minute by minute (`server::recent`), by its clock.
    pub fn last_hour(&self) -> Vec<crate::server::recent::MinuteView> {
        self.ctx().metrics.last_hour.minutes(self.ctx().now_ms())
    }

    /// Shards this node currently owns.
    pub fn owned_shards(&self) -> Vec<u32> {
        self.ctx().routes.owned_shards()
    }

    /// Cancels an execution: a pending one at once, a running one through its worker.
    pub async fn cancel(&self, ns: &str, id: &str, who: &str) -> ops::Result<Cancelled> {
        self.ctx().sched.cancel(ns, id, who).await
    }

    /// Replays a failed execution.
    pub async fn replay(&self, ns: &str, id: &str, who: &str) -> ops::Result<Execution> {
        let e = self.ctx().sched.replay(ns, id, who).await?;
        effects::replayed(self.ctx(), &e);
        Ok(e)
    }

    /// The metrics in the Prometheus text format.
    pub async fn metrics_text(&self) -> String {
        let counts = self.ctx().sched.all_status_counts().await.unwrap_or_default();
        let states: Vec<(String, i64)> = counts
            .into_iter()
            .map(|(s, n)| (kairos_layer::state::status_name(s as i32).to_string(), n))
            .collect();
        let mut reg = prometheus_client::registry::Registry::default();
        self.ctx().metrics.register(&mut reg, &states);
        self.ctx().cron_metrics.register(&mut reg);
        // A store that cannot be read now leaves the per-queue series out of this scrape.
        if let Ok(q) = self.queues(None).await {
            queues::register(&mut reg, &q);
        }
        let shards = self.ctx().sched.partition_count(kairos_layer::keys::Space::Executions);
        let help = "Execution shards of the cluster (set at its creation): with sum(kairos_shards_owned), whether every one has an owner";
        let shards = prometheus_client::metrics::gauge::ConstGauge::new(i64::from(shards));
        reg.register("kairos_shards_configured", help, shards);
        let backend = format!("{:?}", self.config().backend).to_lowercase();
        crate::server::process::register_build_info(&mut reg, &backend);
        crate::server::process::register_process(&mut reg);
        crate::server::metrics::encode(&reg)
    }

    /// Drains: stops serving polls (waiting ones get no work), lets in-flight transactions
    /// finish, stops the shard owners and releases their leases so other nodes take over at
    /// once.
    pub async fn drain(&self) {
        let _ =
            self.inner.supervisor.call(SupervisorMsg::Drain, Some(Duration::from_secs(60))).await;
    }

    /// Drains, then stops every actor of the node.
    pub async fn stop(&self) {
        self.drain().await;
        self.inner.supervisor.stop(Some("node stopping".into()));
        self.join().await;
    }

    /// Stops every actor at once without draining or releasing leases (as a crash would;
    /// for failover tests).
    pub async fn kill(&self) {
        self.inner.supervisor.kill();
        self.join().await;
    }

    async fn join(&self) {
        let join = self.inner.join.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(j) = join {
            let _ = j.await;
        }
    }
}
