//! A running node: its actor tree and the operations clients and workers use. The API
//! server (gRPC/HTTP) and in-process users both go through [`Node`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kairos_layer::env::{Rng, SharedClock};
use kairos_layer::keys::Keyspace;
use kairos_layer::kv::Database;
use kairos_layer::ops::claim::Claimed;
use kairos_layer::ops::submit::{SubmitRequest, Submitted};
use kairos_layer::ops::worker::{Completion, HeartbeatOutcome};
use kairos_layer::ops::{self, ClusterParams, Error, Scheduler, timer_of};
use kairos_proto::storage::v1::{Execution, ExecutionError, ExecutionStatus};
use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use tokio::task::JoinHandle;

use crate::config::NodeConfig;
use crate::context::{Ctx, Routes};
use crate::dispatcher::{DispatcherMsg, PollRequest};
use crate::metrics::Metrics;
use crate::supervisor::{NodeMsg, NodeSupervisor};

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
    supervisor: ActorRef<NodeMsg>,
    join: std::sync::Mutex<Option<JoinHandle<()>>>,
}

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
        let db = db.with_observer(metrics.clone());
        let params = ClusterParams {
            shard_count: config.shard_count,
            bucket_width_ms: config.bucket_width_ms,
        };
        let sched =
            Scheduler::open(db, Keyspace::new(&config.cluster), clock.clone(), rng, params).await?;
        let ctx = Ctx {
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
        Ok(Node {
            inner: Arc::new(Inner { ctx, supervisor, join: std::sync::Mutex::new(Some(join)) }),
        })
    }

    fn ctx(&self) -> &Ctx {
        &self.inner.ctx
    }

    /// The scheduler operations (reads, definitions, leases).
    pub fn scheduler(&self) -> &Scheduler {
        &self.ctx().sched
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.ctx().node_id
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.ctx().metrics
    }

    /// Shards this node currently owns.
    pub fn owned_shards(&self) -> Vec<u32> {
        self.ctx().routes.owned_shards()
    }

    /// Submits an execution; its shard's local owner (if any) learns of the timer at once.
    pub async fn submit(&self, req: SubmitRequest) -> ops::Result<Submitted> {
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

    fn dispatcher_cast(&self, msg: DispatcherMsg) {
        if let Some(d) = self.ctx().routes.dispatcher() {
            let _ = d.send_message(msg);
        }
    }

    fn count_fenced<T>(&self, r: &ops::Result<T>) {
        if matches!(r, Err(Error::FencedOut { .. })) {
            self.ctx().metrics.attempt("fenced_out");
        }
    }

    /// Extends an attempt's lease (fenced).
    pub async fn heartbeat(&self, ns: &str, id: &str, token: u64) -> ops::Result<HeartbeatOutcome> {
        let r = self.ctx().sched.heartbeat(ns, id, token).await;
        self.count_fenced(&r);
        if let Ok(h) = &r {
            self.dispatcher_cast(DispatcherMsg::Extended(id.to_string(), h.lease_expires_at_ms));
        }
        r
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
        let r = self.ctx().sched.complete(ns, id, token, output_json, output_reference).await;
        self.count_fenced(&r);
        if r.is_ok() {
            self.ctx().metrics.attempt("succeeded");
            self.dispatcher_cast(DispatcherMsg::Released(id.to_string()));
        }
        r
    }

    /// Completes many attempts in one transaction (a worker flushing its finished slots).
    pub async fn complete_many(
        &self,
        items: Vec<Completion>,
    ) -> ops::Result<Vec<ops::Result<Execution>>> {
        let out = self.ctx().sched.complete_many(items).await?;
        for r in &out {
            self.count_fenced(r);
            if let Ok(e) = r {
                self.ctx().metrics.attempt("succeeded");
                self.dispatcher_cast(DispatcherMsg::Released(e.id.clone()));
            }
        }
        Ok(out)
    }

    /// Fails an attempt (fenced); retryable errors are retried per the retry policy.
    pub async fn fail(
        &self,
        ns: &str,
        id: &str,
        token: u64,
        error: ExecutionError,
    ) -> ops::Result<Execution> {
        let r = self.ctx().sched.fail(ns, id, token, error).await;
        self.count_fenced(&r);
        if let Ok(e) = &r {
            let m = &self.ctx().metrics;
            m.attempt("failed");
            if e.status() == ExecutionStatus::RetryWait {
                m.retries.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(t) = timer_of(e) {
                self.ctx().routes.timer_hint(t);
            }
            self.dispatcher_cast(DispatcherMsg::Released(id.to_string()));
        }
        r
    }

    /// Cancels an execution that has not started.
    pub async fn cancel(&self, ns: &str, id: &str) -> ops::Result<Execution> {
        self.ctx().sched.cancel(ns, id).await
    }

    /// Replays a failed execution.
    pub async fn replay(&self, ns: &str, id: &str) -> ops::Result<Execution> {
        let e = self.ctx().sched.replay(ns, id).await?;
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
        self.ctx().metrics.render(&states)
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
