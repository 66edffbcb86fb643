//! Boot: [`Node::start`], where a node is put together — the cluster opened, the shared context
//! built, the actor tree started, the store's health watched, the retention sweeper run — and
//! where the cron service gets its executions client, the SDK over an in-process channel to
//! this node's own API. It sits above every other room: `node` and `runtime` know nothing of
//! the API that is wired into them here.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kairos_layer::env::{Rng, SharedClock};
use kairos_layer::keys::Keyspace;
use kairos_layer::kv::Database;
use kairos_layer::ops::{ClusterParams, Scheduler};
use ractor::Actor;

use crate::api::in_process::{NodeSlot, in_process_client};
use crate::limits::ORPHAN_RELEASE_AFTER_MS;
use crate::node::{Inner, Node, StartError, health};
use crate::runtime::batcher::Batcher;
use crate::runtime::context::{Ctx, Routes};
use crate::runtime::cron_api::SdkExecutions;
use crate::runtime::matchmaker::Matchmaker;
use crate::runtime::supervisor::NodeSupervisor;
use crate::runtime::{effects, retention};
use crate::server::auth::{Auth, AuthMode};
use crate::server::config::{Backend, ConfigError, NodeConfig};
use crate::server::metrics::Metrics;
use crate::server::quota::Quotas;

impl Node {
    /// Starts a node over `db`. `config.node_id` must be set.
    pub async fn start(
        config: NodeConfig,
        db: Database,
        clock: SharedClock,
        rng: Rng,
    ) -> Result<Node, StartError> {
        config.validate()?;
        let node_id = config.node_id.clone().ok_or_else(|| ConfigError {
            setting: "node_id".into(),
            reason: "must be set to start a node".into(),
        })?;
        let metrics = Arc::new(Metrics::default());
        if config.backend == Backend::Embedded {
            let cache = i64::try_from(config.store_cache_mib * 1024 * 1024).unwrap_or(i64::MAX);
            metrics.store_cache_bytes.store(cache, Ordering::Relaxed);
        }
        metrics.store_health.store(1, Ordering::Relaxed);
        let db = db.with_observer(metrics.clone());
        let sched = open_cluster(&config, db, clock.clone(), rng).await?;
        // Claims made before this instant are a previous run's (see spawn_orphan_release).
        let started_ms = clock.now().as_millis();
        let slot: NodeSlot = Arc::default();
        let ctx = Ctx {
            cron_api: SdkExecutions(in_process_client(slot.clone())),
            cron_metrics: Arc::default(),
            batcher: Batcher::start(sched.clone()),
            matchmaker: Arc::new(Matchmaker::new(config.queue_concurrency.clone())),
            held: Arc::default(),
            fire_gate: Arc::default(),
            sched,
            clock,
            metrics,
            config: Arc::new(config),
            node_id,
            routes: Arc::new(Routes::default()),
        };
        let node = start_actors(ctx).await?;
        // The cron service's in-process API client finds the node through a weak reference.
        let weak = Arc::downgrade(&node.inner);
        let _ = slot.set(Box::new(move || weak.upgrade().map(|inner| Node { inner })));
        spawn_retention(Arc::downgrade(&node.inner));
        spawn_orphan_release(Arc::downgrade(&node.inner), started_ms);
        Ok(node)
    }
}

/// Opens (or creates) the cluster the configuration names.
async fn open_cluster(
    config: &NodeConfig,
    db: Database,
    clock: SharedClock,
    rng: Rng,
) -> Result<Scheduler, StartError> {
    let params = ClusterParams {
        shard_count: config.shard_count,
        bucket_width_ms: config.bucket_width_ms,
        ready_partitions: config.ready_partitions(),
    };
    Ok(Scheduler::open(db, Keyspace::new(&config.cluster), clock, rng, params)
        .await?
        .with_namespace_weights(config.namespace_weights.clone())
        .with_fair_scan(config.fair_scan_rows)
        .with_holder(config.node_id.as_deref().unwrap_or_default()))
}

/// Starts the actor tree and the health watch: the node, running.
async fn start_actors(ctx: Ctx) -> Result<Node, StartError> {
    let (supervisor, join) = Actor::spawn(None, NodeSupervisor, ctx.clone())
        .await
        .map_err(|e| StartError::Actors(e.to_string()))?;
    let (c, cluster) = (&ctx.config, ctx.sched.config());
    tracing::info!(
        node = %ctx.node_id,
        region = %c.region,
        backend = ?c.backend,
        database = %c.database_label(),
        keyspace_format = cluster.format_version,
        shards = cluster.shard_count,
        "node started"
    );
    let health = health::watch_store_health(&ctx);
    let config = &ctx.config;
    let auth = Arc::new(Auth::new(config.auth.unwrap_or(AuthMode::Off), ctx.sched.clone()));
    let quotas = Arc::new(Quotas::new(config.quotas.clone()));
    let join = std::sync::Mutex::new(Some(join));
    Ok(Node {
        inner: Arc::new(Inner {
            ctx,
            auth,
            quotas,
            health,
            supervisor,
            join,
            store_doubt: std::sync::Mutex::new(None),
        }),
    })
}

/// [`ORPHAN_RELEASE_AFTER_MS`] after the start, releases what this node's previous run
/// claimed and never handed over — its dispatch buffers when it was killed, attempts started
/// for workers it never reached — unless a worker was heard from for them meanwhile: READY again
/// at once instead of a whole lease later. On failure their lease checks release them, as
/// before.
fn spawn_orphan_release(node: std::sync::Weak<Inner>, started_ms: i64) {
    let Some(inner) = node.upgrade() else { return };
    let clock = inner.ctx.clock.clone();
    drop(inner);
    tokio::spawn(async move {
        clock.sleep(Duration::from_millis(ORPHAN_RELEASE_AFTER_MS)).await;
        let Some(inner) = node.upgrade() else { return };
        let ctx = inner.ctx.clone();
        drop(inner);
        match ctx.sched.release_orphaned_claims(&ctx.node_id, started_ms).await {
            Ok(released) if released.is_empty() => {}
            Ok(released) => {
                tracing::info!(
                    released = released.len(),
                    "released the attempts this node's previous run claimed and never handed over"
                );
                effects::orphans_released(&ctx, &released);
            }
            Err(e) => tracing::warn!(
                error = %e,
                "releasing the previous run's unconfirmed claims failed; their lease checks will"
            ),
        }
    });
}

/// Runs the retention sweeper every `retention_sweep_ms` while the node lives.
fn spawn_retention(node: std::sync::Weak<Inner>) {
    let Some(inner) = node.upgrade() else { return };
    let (clock, period) =
        (inner.ctx.clock.clone(), Duration::from_millis(inner.ctx.config.retention_sweep_ms));
    drop(inner);
    tokio::spawn(async move {
        let mut cursors = retention::Cursors::new();
        loop {
            clock.sleep(period).await;
            let Some(inner) = node.upgrade() else { return };
            let ctx = inner.ctx.clone();
            drop(inner); // a stopping node is not kept alive by its sweeper
            retention::sweep(&ctx, &mut cursors).await;
        }
    });
}
