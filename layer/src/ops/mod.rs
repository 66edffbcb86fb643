//! The scheduler's transactional operations. Each is one idempotent transaction run through
//! [`Database::run`]: ids and times are chosen outside the retry loop, state is re-read and
//! re-checked inside, so running it twice after `commit_unknown_result` changes nothing more.
//!
//! | operation | file |
//! |---|---|
//! | open / create the cluster | here; changes to older stores: [`migrate`] |
//! | `submit` | [`submit`] |
//! | `get`, `attempts`, `list` | [`query`] |
//! | `get_by_idempotency_key`, `quarantined` | [`query`] |
//! | `cancel` (pending or running), `replay` | [`control`] |
//! | `fire_due` (with an offer of waiting workers: sync match), `fire_timer`, `load_timers` | [`fire`] |
//! | `claim` (for several waiting workers at once) | [`claim`] |
//! | `release_orphaned_claims` (a restarted node's unconfirmed claims) | [`orphans`] |
//! | attempts: `heartbeat`, `report` (success, failure, release), many per transaction | [`worker`] |
//! | back-off (attempts' retry policy; every retry loop's doubling pause) | [`retry`] |
//! | checks of the values clients name | [`validate`] |
//! | definitions | [`definitions`] |
//! | API keys, the audit log | [`access`] |
//! | leased partitions, nodes | [`leases`] |
//! | cron jobs (clients), cron rounds (owners) | [`cron`], [`cron::owner`] |

pub mod access;
pub(crate) mod budget;
pub mod check;
pub mod claim;
pub mod control;
pub mod cron;
pub mod cursor;
pub mod definitions;
pub mod error;
pub mod fire;
pub mod hold;
pub(crate) mod join;
pub(crate) mod lease_checks;
pub mod leases;
pub mod migrate;
pub mod orphans;
pub mod prefire;
pub mod query;
pub mod queues;
pub mod records;
pub mod retention;
pub mod retry;
pub mod submit;
pub mod validate;
pub mod worker;

use kairos_proto::storage::v1::ClusterConfig;

pub use self::error::{Error, Result};
use self::records::{decode, encode};
use crate::env::{Rng, SharedClock};
use crate::ids::bucket_of;
use crate::keys::Keyspace;
use crate::kv::Database;

/// The key of an execution's pending timer, if it has one (for shard owners' windows).
pub fn timer_of(e: &kairos_proto::storage::v1::Execution) -> Option<crate::keys::TimerKey> {
    e.timer.as_ref().map(|t| records::timer_key(e, t))
}

/// Parameters fixed when a cluster is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterParams {
    /// Number of logical shards (1024 on a cluster; fewer is fine for one embedded node).
    pub shard_count: u32,
    /// Width of a timer bucket, in milliseconds (1 minute by default).
    pub bucket_width_ms: i64,
    /// Partitions of every ready queue and status count (at most `shard_count`).
    pub ready_partitions: u32,
}

impl Default for ClusterParams {
    fn default() -> Self {
        ClusterParams { shard_count: 1024, bucket_width_ms: 60_000, ready_partitions: 16 }
    }
}

/// The scheduler's operations over one cluster's keyspace.
#[derive(Clone)]
pub struct Scheduler {
    pub(crate) db: Database,
    pub(crate) ks: Keyspace,
    pub(crate) config: ClusterConfig,
    pub(crate) clock: SharedClock,
    pub(crate) rng: Rng,
    /// This process's key for fencing tokens ([`worker::fencing_token`]): drawn at open from
    /// the OS's random source (the seeded sequence in tests and the simulation), never stored
    /// or sent anywhere.
    pub(crate) token_key: [u8; 32],
    /// Weights of namespaces sharing a fire batch (absent: 1); see [`fire`].
    pub(crate) fire_weights: std::sync::Arc<std::collections::BTreeMap<String, u32>>,
    /// Due timers a fire transaction looks at to share its batch (0: time order only).
    pub(crate) fair_scan_rows: usize,
    /// The node this scheduler claims for, named in its claim receipts (empty: none), so that
    /// node, restarted, finds the attempts it claimed and never handed over
    /// ([`Scheduler::release_orphaned_claims`]).
    pub(crate) holder: String,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").field("config", &self.config).finish()
    }
}

/// The keyspace format this binary writes (see [`migrate::FORMAT_VERSION`]).
pub use self::migrate::FORMAT_VERSION;

/// Refuses cluster parameters out of their ranges, naming the setting.
fn check_params(params: &ClusterParams) -> Result<()> {
    if params.shard_count == 0 || params.shard_count > crate::limits::SHARD_COUNT_MAX {
        return Err(error::invalid(
            "shard_count",
            format!("must be between 1 and {}", crate::limits::SHARD_COUNT_MAX),
        ));
    }
    if params.bucket_width_ms < 1_000 {
        return Err(error::invalid("bucket_width_ms", "must be at least 1000"));
    }
    if params.ready_partitions == 0 || params.ready_partitions > params.shard_count {
        return Err(error::invalid("ready_partitions", "must be between 1 and shard_count"));
    }
    Ok(())
}

impl Scheduler {
    /// Opens the cluster stored in `db` under `ks`, creating it with `params` if it does not
    /// exist. An existing cluster keeps the shard count and bucket width it was created with.
    pub async fn open(
        db: Database,
        ks: Keyspace,
        clock: SharedClock,
        rng: Rng,
        params: ClusterParams,
    ) -> Result<Scheduler> {
        check_params(&params)?;
        let now_ms = clock.now().as_millis();
        let config = db
            .run(|tx| {
                let (ks, rng) = (ks.clone(), rng.clone());
                async move {
                    let secret = || rng.secret(32);
                    if let Some(v) = tx.get(&ks.cluster()).await? {
                        let mut config = decode::<ClusterConfig>("cluster config", &v)?;
                        if config.cursor_secret.is_empty() {
                            config.cursor_secret = secret();
                            tx.set(&ks.cluster(), &encode(&config))?;
                        }
                        return Ok::<_, Error>(config);
                    }
                    let config = ClusterConfig {
                        shard_count: params.shard_count,
                        bucket_width_ms: params.bucket_width_ms,
                        created_at_ms: now_ms,
                        format_version: FORMAT_VERSION,
                        ready_partitions: params.ready_partitions,
                        cursor_secret: secret(),
                        status_index: migrate::STATUS_INDEX,
                    };
                    tx.set(&ks.cluster(), &encode(&config))?;
                    // Every shard starts with a watermark, so submits always clamp against one.
                    let start = bucket_of(now_ms, params.bucket_width_ms);
                    for shard in 0..params.shard_count {
                        tx.set(&ks.watermark(shard), &start.to_be_bytes())?;
                    }
                    Ok(config)
                }
            })
            .await?;
        // Every format step the store needs, in order; a downgrade is refused here.
        let config = migrate::upgrade(&db, &ks, config).await?;
        let ks = ks.with_shards(config.shard_count);
        let mut token_key = [0u8; 32];
        token_key.copy_from_slice(&rng.secret(32));
        Ok(Scheduler {
            db,
            ks,
            config,
            clock,
            rng,
            token_key,
            fire_weights: Default::default(),
            fair_scan_rows: fire::FAIR_SCAN_ROWS,
            holder: String::new(),
        })
    }

    /// The same scheduler, sharing each fire batch between namespaces by these weights (a
    /// namespace not named weighs 1).
    pub fn with_namespace_weights(
        mut self,
        weights: std::collections::BTreeMap<String, u32>,
    ) -> Self {
        self.fire_weights = std::sync::Arc::new(weights);
        self
    }

    /// The same scheduler looking at up to `rows` due timers per fire transaction to share its
    /// batch between namespaces (0: fire in time order only).
    pub fn with_fair_scan(mut self, rows: usize) -> Self {
        self.fair_scan_rows = rows.min(crate::limits::FAIR_SCAN_ROWS_MAX);
        self
    }

    /// The same scheduler naming `node_id` in the receipts of its claims and matched fires
    /// (see [`Scheduler::release_orphaned_claims`]).
    pub fn with_holder(mut self, node_id: &str) -> Self {
        self.holder = node_id.to_string();
        self
    }

    /// The cluster's fixed configuration.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// The keyspace.
    pub fn keyspace(&self) -> &Keyspace {
        &self.ks
    }

    /// The database.
    pub fn database(&self) -> &Database {
        &self.db
    }

    /// The injected clock.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }
}
