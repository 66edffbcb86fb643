//! A running node: its actor tree and the operations clients and workers use. The API
//! server (gRPC/HTTP) and in-process users both go through [`Node`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kairos_layer::env::{Rng, SharedClock};
use kairos_layer::keys::Keyspace;
use kairos_layer::kv::{Database, StoreHealth};
use std::collections::BTreeMap;

use kairos_layer::ops::claim::Claimed;
use kairos_layer::ops::control::Cancelled;
use kairos_layer::ops::submit::{SubmitRequest, Submitted};
use kairos_layer::ops::worker::{Beat, Completion, HeartbeatOutcome, Outcome, Report};
use kairos_layer::ops::{self, ClusterParams, Error, Scheduler, timer_of};
use kairos_proto::storage::v1::{Execution, ExecutionError, ExecutionStatus};
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use tokio::task::JoinHandle;

use crate::batcher::Batcher;
use crate::config::NodeConfig;
use crate::context::{Ctx, Routes};
use crate::dispatcher::{DispatcherMsg, PollRequest, SessionOpen};
use crate::matchmaker::Matchmaker;
use crate::metrics::Metrics;
use crate::node_supervisor::{NodeMsg, NodeSupervisor};

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The cluster could not be opened.
    #[error("opening the cluster: {0}")]
    Cluster(#[from] Error),
    /// The actors could not start.
    #[error("starting the actors: {0}")]
    Actors(String),
}

struct Inner {
    ctx: Ctx,
    /// The store's health, as last seen by the health watch (see [`Node::store_health`]).
    health: tokio::sync::watch::Receiver<StoreHealth>,
    supervisor: ActorRef<NodeMsg>,
    join: std::sync::Mutex<Option<JoinHandle<()>>>,
}

mod cron;

/// A running node. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

const CALL_SLACK: Duration = Duration::from_secs(10);

impl Node {
    /// Starts a node over `db`. `config.node_id` must be set.
    pub async fn start(
        config: NodeConfig,
        db: Database,
        clock: SharedClock,
        rng: Rng,
    ) -> Result<Node, StartError> {
        config.validate()?;
        let node_id = config.node_id.clone().ok_or_else(|| crate::config::ConfigError {
            setting: "node_id".into(),
            reason: "must be set to start a node".into(),
        })?;
        let metrics = Arc::new(Metrics::default());
        if config.backend == crate::config::Backend::Embedded {
            let cache = i64::try_from(config.store_cache_mib * 1024 * 1024).unwrap_or(i64::MAX);
            metrics.store_cache_bytes.store(cache, Ordering::Relaxed);
        }
        metrics.store_health.store(1, Ordering::Relaxed);
        let db = db.with_observer(metrics.clone());
        let params = ClusterParams {
            shard_count: config.shard_count,
            bucket_width_ms: config.bucket_width_ms,
            ready_partitions: config.ready_partitions(),
        };
        let sched = Scheduler::open(db, Keyspace::new(&config.cluster), clock.clone(), rng, params)
            .await?
            .with_namespace_weights(config.namespace_weights.clone())
            .with_fair_scan(config.fair_scan_rows);
        let slot: crate::cron_client::NodeSlot = Arc::default();
        let cron = crate::cron_owner::CronCtx {
            executions: crate::cron_client::SdkExecutions(crate::cron_client::in_process_client(
                slot.clone(),
            )),
            metrics: Arc::default(),
        };
        let ctx = Ctx {
            cron,
            batcher: Batcher::start(sched.clone()),
            matchmaker: Arc::new(Matchmaker::new(config.queue_concurrency.clone())),
            quotas: Arc::new(crate::quota::Quotas::new(config.quotas.clone())),
            auth: Arc::new(crate::auth::Auth::new(
                config.auth.unwrap_or(crate::auth::AuthMode::Off),
                sched.clone(),
            )),
            sched,
            clock,
            metrics,
            config: Arc::new(config),
            node_id,
            routes: Arc::new(Routes::default()),
        };
        let (supervisor, join) = Actor::spawn(None, NodeSupervisor, ctx.clone())
            .await
            .map_err(|e| StartError::Actors(e.to_string()))?;
        tracing::info!(node = %ctx.node_id, shards = ctx.sched.config().shard_count, "node started");
        let health = watch_store_health(&ctx);
        let inner =
            Arc::new(Inner { ctx, health, supervisor, join: std::sync::Mutex::new(Some(join)) });
        // The cron service's in-process API client finds the node through a weak reference.
        let weak = Arc::downgrade(&inner);
        let _ = slot.set(Box::new(move || weak.upgrade().map(|inner| Node { inner })));
        spawn_retention(Arc::downgrade(&inner));
        Ok(Node { inner })
    }

    fn ctx(&self) -> &Ctx {
        &self.inner.ctx
    }

    /// The scheduler operations (reads, definitions, leases).
    pub fn scheduler(&self) -> &Scheduler {
        &self.ctx().sched
    }

    /// The node's configuration.
    pub fn config(&self) -> &crate::config::NodeConfig {
        &self.ctx().config
    }

    /// API keys: who is calling and what they may do.
    pub fn auth(&self) -> &crate::auth::Auth {
        &self.ctx().auth
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

    /// Shards this node currently owns.
    pub fn owned_shards(&self) -> Vec<u32> {
        self.ctx().routes.owned_shards()
    }

    /// Submits an execution; its shard's local owner (if any) learns of the timer at once.
    pub async fn submit(&self, req: SubmitRequest) -> ops::Result<Submitted> {
        self.check_inputs_size(&req)?;
        self.admit(&req.namespace, 1).await?;
        let s = self.ctx().sched.submit(req).await?;
        if s.created {
            self.ctx().metrics.submitted.fetch_add(1, Ordering::Relaxed);
            if let Some(t) = timer_of(&s.execution) {
                self.ctx().routes.timer_hint(t);
            }
        }
        Ok(s)
    }

    /// Submits up to 1,000 executions in one transaction; each gets its own result.
    pub async fn submit_batch(
        &self,
        reqs: Vec<SubmitRequest>,
    ) -> ops::Result<Vec<ops::Result<Submitted>>> {
        // Items over their namespace's size limit fail alone.
        let mut too_big: Vec<Option<ops::Error>> =
            reqs.iter().map(|r| self.check_inputs_size(r).err()).collect();
        // Quotas per namespace: a refused namespace's items fail alone, nothing of theirs stored.
        let mut per_ns: BTreeMap<&str, usize> = BTreeMap::new();
        for (r, big) in reqs.iter().zip(&too_big) {
            if big.is_none() {
                *per_ns.entry(r.namespace.as_str()).or_default() += 1;
            }
        }
        let mut refused: BTreeMap<String, ops::Error> = BTreeMap::new();
        for (ns, n) in per_ns {
            if let Err(e) = self.admit(ns, n).await {
                refused.insert(ns.to_string(), e);
            }
        }
        if !refused.is_empty() || too_big.iter().any(Option::is_some) {
            let (mut admitted, mut order) = (Vec::new(), Vec::new());
            for (i, r) in reqs.into_iter().enumerate() {
                if let Some(e) = too_big[i].take() {
                    order.push(Some(e));
                    continue;
                }
                match refused.get(&r.namespace) {
                    Some(e) => order.push(Some(quota_error(e))),
                    None => {
                        admitted.push(r);
                        order.push(None);
                    }
                }
            }
            let mut done = if admitted.is_empty() {
                Vec::new().into_iter()
            } else {
                self.submit_admitted(admitted).await?.into_iter()
            };
            return Ok(order
                .into_iter()
                .map(|o| o.map_or_else(|| done.next().expect("one result per admitted"), Err))
                .collect());
        }
        self.submit_admitted(reqs).await
    }

    /// Refuses inputs over their namespace's `inputs_bytes_max` (a size is no reason to retry:
    /// INVALID_ARGUMENT naming `inputs`, not RESOURCE_EXHAUSTED).
    fn check_inputs_size(&self, req: &SubmitRequest) -> ops::Result<()> {
        let max = self.ctx().config.quotas.of(&req.namespace).inputs_bytes_max as usize;
        if max == 0 {
            return Ok(());
        }
        let size = serde_json::to_vec(&req.inputs).map_or(0, |v| v.len());
        if size > max {
            return Err(ops::error::invalid(
                "inputs",
                format!(
                    "{size} bytes of JSON, over the limit of {max} for namespace {}",
                    req.namespace
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a definition source over its namespace's `definition_bytes_max`.
    pub fn check_definition_size(&self, ns: &str, bytes: usize) -> ops::Result<()> {
        let max = self.ctx().config.quotas.of(ns).definition_bytes_max as usize;
        if max > 0 && bytes > max {
            return Err(ops::error::invalid(
                "definition",
                format!("{bytes} bytes, over the limit of {max} for namespace {ns}"),
            ));
        }
        Ok(())
    }

    /// Checks `n` new executions of `ns` against the namespace's quotas.
    async fn admit(&self, ns: &str, n: usize) -> ops::Result<()> {
        let ctx = self.ctx();
        match ctx.quotas.admit(&ctx.sched, ns, n, ctx.now_ms()).await {
            Ok(()) => Ok(()),
            Err((which, e)) => {
                let c = match which {
                    crate::quota::Refused::Rate => &ctx.metrics.quota_refused_rate,
                    crate::quota::Refused::Pending => &ctx.metrics.quota_refused_pending,
                };
                c.fetch_add(n as u64, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    async fn submit_admitted(
        &self,
        reqs: Vec<SubmitRequest>,
    ) -> ops::Result<Vec<ops::Result<Submitted>>> {
        let out = self.ctx().sched.submit_batch(reqs).await?;
        for s in out.iter().flatten().filter(|s| s.created) {
            self.ctx().metrics.submitted.fetch_add(1, Ordering::Relaxed);
            if let Some(t) = timer_of(&s.execution) {
                self.ctx().routes.timer_hint(t);
            }
        }
        Ok(out)
    }

    /// A worker's long poll: READY executions of the queue, waiting up to `wait_ms` for some.
    pub async fn poll(&self, req: PollRequest) -> ops::Result<Vec<Claimed>> {
        let Some(d) = self.ctx().routes.dispatcher() else {
            return Err(Error::FailedPrecondition(
                "the node is not serving polls (draining or restarting)".into(),
            ));
        };
        let timeout =
            Duration::from_millis(req.wait_ms.min(self.ctx().config.poll_wait_max_ms)) + CALL_SLACK;
        match d.call(|r| DispatcherMsg::Poll(req, r), Some(timeout)).await {
            Ok(CallResult::Success(r)) => r,
            Ok(CallResult::Timeout) => Ok(Vec::new()),
            Ok(CallResult::SenderError) | Err(_) => Err(Error::FailedPrecondition(
                "the dispatcher stopped while polling; poll again".into(),
            )),
        }
    }

    /// Opens a worker stream's slot in the dispatcher; tasks for it go to `open.tasks`.
    pub async fn open_session(&self, open: SessionOpen) -> ops::Result<u64> {
        let Some(d) = self.ctx().routes.dispatcher() else {
            return Err(Error::FailedPrecondition(
                "the node is not serving workers (draining or restarting)".into(),
            ));
        };
        match d.call(|r| DispatcherMsg::Open(open, r), Some(CALL_SLACK)).await {
            Ok(CallResult::Success(id)) => Ok(id),
            _ => Err(Error::FailedPrecondition("the dispatcher stopped; reconnect".into())),
        }
    }

    /// A worker stream has `n` more free slots.
    pub fn session_credits(&self, id: u64, n: usize) {
        self.dispatcher_cast(DispatcherMsg::Credits(id, n));
    }

    /// A worker stream closed.
    pub fn close_session(&self, id: u64) {
        self.dispatcher_cast(DispatcherMsg::Close(id));
    }

    /// Claimed executions whose worker vanished before getting them.
    pub fn orphans(&self, claimed: Vec<Claimed>) {
        if claimed.is_empty() {
            return;
        }
        match self.ctx().routes.dispatcher() {
            Some(d) => {
                let _ = d.send_message(DispatcherMsg::Orphans(claimed));
            }
            None => {
                tracing::warn!(n = claimed.len(), "undelivered executions wait for their lease")
            }
        }
    }

    fn dispatcher_cast(&self, msg: DispatcherMsg) {
        if let Some(d) = self.ctx().routes.dispatcher() {
            let _ = d.send_message(msg);
        }
    }

    /// Extends attempts' leases (fenced), batched with other heartbeats arriving meanwhile.
    pub async fn heartbeat_many(
        &self,
        beats: Vec<Beat>,
    ) -> ops::Result<Vec<ops::Result<HeartbeatOutcome>>> {
        let out = self.ctx().batcher.heartbeat(beats).await?;
        for r in &out {
            if matches!(r, Err(Error::FencedOut { .. })) {
                self.ctx().metrics.attempt("fenced_out");
            }
        }
        Ok(out)
    }

    /// Extends an attempt's lease (fenced).
    pub async fn heartbeat(&self, ns: &str, id: &str, token: u64) -> ops::Result<HeartbeatOutcome> {
        let beat = Beat { namespace: ns.into(), execution_id: id.into(), token, worker_id: None };
        self.heartbeat_many(vec![beat])
            .await?
            .pop()
            .unwrap_or_else(|| Err(Error::Corrupt("heartbeat result missing".into())))
    }

    /// Applies workers' results (fenced), batched with other results arriving meanwhile into
    /// one transaction; each gets its own result.
    pub async fn report(&self, items: Vec<Report>) -> ops::Result<Vec<ops::Result<Execution>>> {
        let kinds: Vec<&'static str> = items
            .iter()
            .map(|r| match r.outcome {
                Outcome::Success { .. } => "succeeded",
                Outcome::Failure(_) => "failed",
                Outcome::Release => "released",
            })
            .collect();
        let out = self.ctx().batcher.report(items).await?;
        let m = &self.ctx().metrics;
        let mut finished: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (r, kind) in out.iter().zip(kinds) {
            match r {
                Err(Error::FencedOut { .. }) => m.attempt("fenced_out"),
                Err(_) => {}
                Ok(e) => {
                    m.attempt(if e.status() == ExecutionStatus::Cancelled {
                        "cancelled"
                    } else {
                        kind
                    });
                    match e.status() {
                        ExecutionStatus::RetryWait => {
                            m.retries.fetch_add(1, Ordering::Relaxed);
                        }
                        ExecutionStatus::Ready => {
                            self.ctx().routes.ready_hint(&e.namespace, &e.queue)
                        }
                        _ => {}
                    }
                    if let Some(t) = timer_of(e) {
                        self.ctx().routes.timer_hint(t);
                    }
                    let q = (e.namespace.clone(), e.queue.clone());
                    if self.ctx().matchmaker.is_limited(&q) {
                        *finished.entry(q).or_default() += 1;
                    }
                }
            }
        }
        for (q, n) in finished {
            self.dispatcher_cast(DispatcherMsg::Finished(q, n));
        }
        Ok(out)
    }

    /// Applies one worker's result (see [`report`](Self::report)).
    pub async fn report_one(&self, r: Report) -> ops::Result<Execution> {
        self.report(vec![r])
            .await?
            .pop()
            .unwrap_or_else(|| Err(Error::Corrupt("result missing".into())))
    }

    /// Completes an attempt (fenced).
    pub async fn complete(
        &self,
        ns: &str,
        id: &str,
        token: u64,
        output_json: Vec<u8>,
        output_reference: String,
    ) -> ops::Result<Execution> {
        self.report_one(Report {
            namespace: ns.into(),
            execution_id: id.into(),
            token,
            outcome: Outcome::Success { output_json, output_reference },
            worker_id: None,
        })
        .await
    }

    /// Completes many attempts in one transaction (a worker flushing its finished slots).
    pub async fn complete_many(
        &self,
        items: Vec<Completion>,
    ) -> ops::Result<Vec<ops::Result<Execution>>> {
        self.report(items.into_iter().map(Report::from).collect()).await
    }

    /// Fails an attempt (fenced); retryable errors are retried per the retry policy.
    pub async fn fail(
        &self,
        ns: &str,
        id: &str,
        token: u64,
        error: ExecutionError,
    ) -> ops::Result<Execution> {
        self.report_one(Report {
            namespace: ns.into(),
            execution_id: id.into(),
            token,
            outcome: Outcome::Failure(error),
            worker_id: None,
        })
        .await
    }

    /// Cancels an execution: a pending one at once, a running one through its worker.
    pub async fn cancel(&self, ns: &str, id: &str, who: &str) -> ops::Result<Cancelled> {
        self.ctx().sched.cancel_by(ns, id, who).await
    }

    /// Replays a failed execution.
    pub async fn replay(&self, ns: &str, id: &str, who: &str) -> ops::Result<Execution> {
        let e = self.ctx().sched.replay_by(ns, id, who).await?;
        self.ctx().routes.ready_hint(&e.namespace, &e.queue);
        Ok(e)
    }

    /// The metrics in the Prometheus text format.
    pub async fn metrics_text(&self) -> String {
        let counts = self.ctx().sched.all_status_counts().await.unwrap_or_default();
        let states: Vec<(String, i64)> = counts
            .into_iter()
            .map(|(s, n)| (s.as_str_name().trim_start_matches("EXECUTION_STATUS_").to_string(), n))
            .collect();
        let mut reg = prometheus_client::registry::Registry::default();
        self.ctx().metrics.register(&mut reg, &states);
        self.ctx().cron.metrics.register(&mut reg);
        crate::metrics::encode(&reg)
    }

    /// Drains: stops serving polls (waiting ones get no work), lets in-flight transactions
    /// finish, stops the shard owners and releases their leases so other nodes take over at
    /// once.
    pub async fn drain(&self) {
        let _ = self.inner.supervisor.call(NodeMsg::Drain, Some(Duration::from_secs(60))).await;
    }

    /// Drains, then stops every actor of the node.
    pub async fn stop(&self) {
        self.drain().await;
        self.inner.supervisor.stop(Some("node stopping".into()));
        let join = self.inner.join.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(j) = join {
            let _ = j.await;
        }
    }

    /// Stops every actor at once without draining or releasing leases (as a crash would;
    /// for failover tests).
    pub async fn kill(&self) {
        self.inner.supervisor.kill();
        let join = self.inner.join.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(j) = join {
            let _ = j.await;
        }
    }
}

/// How often the node looks at its store's health.
const HEALTH_PERIOD: Duration = Duration::from_millis(250);

/// A quota error for one batch item (the same for every item of its namespace).
fn quota_error(e: &ops::Error) -> ops::Error {
    match e {
        ops::Error::QuotaExceeded { namespace, what, retry_after_ms } => {
            ops::Error::QuotaExceeded {
                namespace: namespace.clone(),
                what: what.clone(),
                retry_after_ms: *retry_after_ms,
            }
        }
        other => ops::Error::FailedPrecondition(other.to_string()),
    }
}

/// Runs the retention sweeper every `retention_sweep_ms` while the node lives.
fn spawn_retention(node: std::sync::Weak<Inner>) {
    let Some(inner) = node.upgrade() else { return };
    let (clock, period) =
        (inner.ctx.clock.clone(), Duration::from_millis(inner.ctx.config.retention_sweep_ms));
    drop(inner);
    tokio::spawn(async move {
        loop {
            clock.sleep(period).await;
            let Some(inner) = node.upgrade() else { return };
            let ctx = inner.ctx.clone();
            drop(inner); // a stopping node is not kept alive by its sweeper
            crate::retention::sweep(&ctx).await;
        }
    });
}

/// Watches the store's health for as long as the node lives: each change is logged once (a
/// warning when writes are refused, an error when the store failed, info when it recovers)
/// and shown in the `kairos_store_healthy` gauge.
fn watch_store_health(ctx: &Ctx) -> tokio::sync::watch::Receiver<StoreHealth> {
    let db = ctx.sched.database().clone();
    let (tx, rx) = tokio::sync::watch::channel(db.health());
    let (clock, metrics) = (ctx.clock.clone(), ctx.metrics.clone());
    tokio::spawn(async move {
        loop {
            clock.sleep(HEALTH_PERIOD).await;
            if tx.is_closed() {
                return; // the node is gone
            }
            let now = db.health();
            if *tx.borrow() == now {
                continue;
            }
            let gauge = match &now {
                StoreHealth::Healthy => {
                    tracing::info!("the store takes writes again");
                    1
                }
                StoreHealth::WritesRefused { reason } => {
                    tracing::warn!(%reason, "the store refuses writes; reads go on");
                    0
                }
                StoreHealth::Unavailable { reason } => {
                    tracing::warn!(%reason, "the store cannot be reached; retrying");
                    -2
                }
                StoreHealth::Failed { reason } => {
                    tracing::error!(%reason, "the store failed");
                    -1
                }
            };
            metrics.store_health.store(gauge, Ordering::Relaxed);
            let _ = tx.send(now);
        }
    });
    rx
}
