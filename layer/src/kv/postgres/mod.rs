//! The `postgres` backend: FoundationDB's commit protocol with PostgreSQL as its storage, so
//! several Kairos nodes can share one database that teams already run (ADR 0008).
//!
//! # How it works
//! - **Versions.** One row of the `meta` table holds the latest commit version. A commit takes
//!   that row's lock (`SELECT … FOR UPDATE`), so commits are sequenced cluster-wide, exactly
//!   like FoundationDB's sequencer: versions are unique and increase in commit order.
//! - **Multi-version rows.** `kv` holds the latest version of each key (a cleared key keeps a
//!   row with a `NULL` value until garbage collection); `history` keeps the versions a commit
//!   replaced, each with the version that replaced it. A read *as of* version `rv` takes the
//!   `kv` row if it is not newer than `rv`, else the `history` row that was current at `rv`.
//!   So reads need no long-lived PostgreSQL transaction: each is one statement on any pooled
//!   connection, and a transaction holds no connection while its closure runs. Point reads the
//!   cache misses are gathered: those waiting together go in one statement (see `reads`).
//! - **Read cache.** Point reads of keys whose value the process knows is current through
//!   the read version are served without a statement (see `cache`, ADR 0015): every commit
//!   batch is applied to the cache in commit order — the process's own by its committer, with
//!   the values written; other processes' from their notifications, which evict what they name.
//! - **Read version.** Requested at the first read (or at commit, or by `read_version`): the
//!   database's latest version, but never a version this process acknowledged after the
//!   transaction began (so commits that finished after `begin` are not seen, as on the local
//!   backends) and never below what this process knew at `begin`.
//! - **Conflicts, FoundationDB's rule.** Under the lock, a commit fails with `not_committed` if
//!   any key in one of its read conflict ranges has a version newer than its read version
//!   (cleared keys included, through their `NULL` rows). This is exactly the contract of
//!   [`KvDatabase`]; PostgreSQL's own SERIALIZABLE isolation (SSI) is not used, because it
//!   aborts only on dangerous cycles: a transaction that read a range another transaction
//!   wrote and committed meanwhile still commits under SSI (serialized before it), where
//!   FoundationDB — and every other backend — refuses it. See ADR 0008.
//! - **Group commit.** Each process has one committer task: it takes every commit waiting (up
//!   to [`COMMIT_BATCH_TRANSACTIONS_MAX`]), resolves them in order (against the database and
//!   against each other), and writes those that pass in one PostgreSQL transaction: one lock,
//!   one WAL flush. Each transaction of the batch gets its own version and versionstamp.
//! - **Watches** use `LISTEN`/`NOTIFY`: every commit notifies the keys it changed (hashed) on
//!   the schema's channel; a watch is registered before the key's value is read, so a change
//!   between the read and the registration is never missed (see `listener`).
//! - **Garbage collection.** The committer forgets versions older than
//!   [`HISTORY_RETENTION_MS`] (twice the 5 s transaction age limit): it raises `gc_version`, and
//!   any read or commit at an older read version fails with `transaction_too_old`.
//!
//! # Errors
//! SQLSTATE `40001` / `40P01` are conflicts (`not_committed`); a connection lost while
//! `COMMIT` was in flight is `commit_unknown_result` (maybe committed); a connection lost
//! before `COMMIT` was sent is `not_committed` (PostgreSQL rolled it back); a statement that
//! hit the statement timeout (`57014`) is `transaction_too_old`; a disk-full error (`53100`)
//! is `storage_full`; an unreachable database is 9004 (retryable, see [`unavailable`]).
//! PostgreSQL cannot index a key whose B-tree entry exceeds about 2,700 bytes after its own
//! compression: such a commit fails with `key_too_large` (limit [`PG_KEY_INDEX_BYTES_MAX`]),
//! and only that transaction of its batch fails.

use super::limits::ACK_LOG_BATCHES_MAX;
pub use super::limits::{COMMIT_BATCH_TRANSACTIONS_MAX, PG_KEY_INDEX_BYTES_MAX};

mod cache;
mod committer;
mod listener;
mod reads;
mod sql;
pub mod testing;
mod transaction;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use self::committer::Job;
use self::sql::Sql;
use self::transaction::PgTransaction;
use super::error::{Error, Result};
use super::local::watch::Watches;
use super::{Database, KvDatabase, KvTransaction, StoreHealth};
use crate::env::{BoxFuture, Rng, SharedClock};

/// The format of the tables this build reads and writes; a store of another format is refused
/// with a message naming both.
pub const SCHEMA_FORMAT: i32 = 1;
/// How long replaced versions are kept (twice the transaction age limit).
pub const HISTORY_RETENTION_MS: u64 = 2 * super::limits::TRANSACTION_AGE_MAX_MS;
/// Kairos's code for "the database cannot be reached" (retryable: a connection attempt or a
/// read failed before anything was applied).
pub const UNAVAILABLE_CODE: i32 = 9004;
/// Idle time before a connection's first TCP keepalive probe.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(2);
/// Time between keepalive probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Unanswered probes before the connection is dropped.
const KEEPALIVE_RETRIES: u32 = 3;

const _: () = assert!(COMMIT_BATCH_TRANSACTIONS_MAX <= u16::MAX as usize);
const _: () = assert!(HISTORY_RETENTION_MS > super::limits::TRANSACTION_AGE_MAX_MS);

/// Settings of the postgres backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    /// A libpq-style URL, e.g. `postgresql://kairos@db1:5432,db2:5432/kairos?target_session_attrs=read-write`
    /// (several hosts: the first that accepts and, with `target_session_attrs=read-write`,
    /// is writable — the primary after a failover).
    pub url: String,
    /// The PostgreSQL schema holding the tables (created when absent): lower-case letters,
    /// digits and `_`, starting with a letter or `_`, at most 40 characters.
    pub schema: String,
    /// Pooled connections for reads (each read is one statement); the committer and the
    /// listener have one connection each on top.
    pub pool_size: usize,
    /// PostgreSQL's `statement_timeout` (and `idle_in_transaction_session_timeout`) for every
    /// connection: a statement running longer fails with `transaction_too_old`.
    pub statement_timeout: Duration,
    /// How long connecting to a host may take before the next host is tried.
    pub connect_timeout: Duration,
}

impl PostgresOptions {
    /// Default settings for `url`: schema `kairos`, 16 pooled connections, 5 s statement and
    /// connect timeouts.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresOptions {
            url: url.into(),
            schema: "kairos".into(),
            pool_size: 16,
            statement_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// Where the data lives, for messages: `host:port,…/database, schema S` (no user, no
    /// password); `None` when the URL cannot be parsed.
    pub fn describe(&self) -> Option<String> {
        let config: tokio_postgres::Config = self.url.parse().ok()?;
        let ports = config.get_ports();
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let host = match h {
                    tokio_postgres::config::Host::Tcp(h) => h.clone(),
                    tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
                };
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                format!("{host}:{port}")
            })
            .collect();
        let db = config.get_dbname().or(config.get_user()).unwrap_or("postgres");
        Some(format!("{}/{db}, schema {}", hosts.join(","), self.schema))
    }

    /// Checks the settings without connecting: `Err` names the field and the reason.
    pub fn check(&self) -> std::result::Result<(), InvalidOption> {
        self.config().map(|_| ())
    }

    fn validate(&self) -> Result<tokio_postgres::Config> {
        self.config().map_err(|e| Error::InvalidOperation(e.to_string()))
    }

    /// The client's settings: the URL's, with the timeouts, keepalives and a TCP user timeout
    /// that notice a database gone silent (a dead link sends no reset) within seconds.
    fn config(&self) -> std::result::Result<tokio_postgres::Config, InvalidOption> {
        let bad = |field: &'static str, reason: String| InvalidOption { field, reason };
        let s = &self.schema;
        let first_ok = s.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let rest_ok = s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !first_ok || !rest_ok || s.len() > 40 {
            return Err(bad(
                "schema",
                format!(
                    "{s:?} is not a plain name (lower-case letters, digits and _, starting with a \
                     letter or _, at most 40 characters)"
                ),
            ));
        }
        if self.pool_size == 0 || self.pool_size > 1_000 {
            return Err(bad("pool size", format!("{} is outside 1..=1000", self.pool_size)));
        }
        let ms = self.statement_timeout.as_millis();
        if ms == 0 || ms > 3_600_000 {
            return Err(bad("statement timeout", format!("{ms} ms is outside 1 ms..=1 h")));
        }
        let mut config: tokio_postgres::Config =
            self.url.parse().map_err(|e| bad("url", format!("cannot be parsed ({e})")))?;
        if config.get_hosts().is_empty() {
            return Err(bad("url", "names no host".into()));
        }
        // The URL's own `options` (e.g. a search_path) are kept; ours come after them. JIT off:
        // the backend's statements run in well under a millisecond, and on tables without
        // statistics yet (a new store, a just-promoted standby) PostgreSQL's cost estimates
        // passed `jit_above_cost`, so every read was JIT-compiled first — ~0.4 s of CPU each,
        // which saturated the server after a failover (tests/tests/cluster.rs).
        let own = config.get_options().map(|o| format!("{o} ")).unwrap_or_default();
        config.options(format!(
            "{own}-c statement_timeout={ms} -c idle_in_transaction_session_timeout={ms} -c jit=off"
        ));
        config.connect_timeout(self.connect_timeout);
        config.keepalives(true);
        config.keepalives_idle(KEEPALIVE_IDLE);
        config.keepalives_interval(KEEPALIVE_INTERVAL);
        config.keepalives_retries(KEEPALIVE_RETRIES);
        // Sent data unacknowledged this long (or keepalives unanswered) breaks the connection.
        config.tcp_user_timeout(self.connect_timeout);
        if config.get_application_name().is_none() {
            config.application_name("kairos");
        }
        Ok(config)
    }
}

/// A setting of [`PostgresOptions`] that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("postgres {field}: {reason}")]
pub struct InvalidOption {
    /// The field: `url`, `schema`, `pool size` or `statement timeout`.
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

/// Commit batches this process acknowledged recently, in order: a transaction's read version
/// stays below the first batch acknowledged after it began.
#[derive(Default)]
struct AckLog {
    /// Batches acknowledged so far.
    seq: AtomicU64,
    /// (sequence number, version before the batch) of the latest batches.
    recent: Mutex<VecDeque<(u64, u64)>>,
}

impl AckLog {
    fn push(&self, base: u64) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let seq = self.seq.load(Ordering::Acquire) + 1;
        recent.push_back((seq, base));
        if recent.len() > ACK_LOG_BATCHES_MAX {
            recent.pop_front();
        }
        self.seq.store(seq, Ordering::Release);
    }

    /// The highest version a transaction begun at sequence `begun` may read: `Some(v)` below
    /// the first batch acknowledged after it began, `None` when none was, and `Some(0)` when
    /// that batch is forgotten (the caller then keeps what it knew at `begin`).
    fn cap(&self, begun: u64) -> Option<u64> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        match recent.iter().find(|(seq, _)| *seq > begun) {
            Some((seq, base)) if *seq == begun + 1 => Some(*base),
            Some(_) => Some(0),
            None => None,
        }
    }
}

struct Shared {
    config: tokio_postgres::Config,
    pool: deadpool_postgres::Pool,
    sql: Sql,
    clock: SharedClock,
    /// The latest version this process knows committed (its own commits, notifications,
    /// reads): a lower bound of every later read version.
    known: AtomicU64,
    acks: AckLog,
    jobs: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    /// Point reads the cache missed, for the task that gathers them into statements.
    reads: reads::Reads,
    watches: Arc<Watches>,
    closed: AtomicBool,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    stats: Arc<PostgresStats>,
    /// Why the database could not be reached at the last try (`None`: it could), for
    /// [`KvDatabase::health`].
    unreachable: Mutex<Option<String>>,
    /// Point reads served without a statement (see `cache`).
    cache: cache::ReadCache,
    /// The backend pid of the committer's connection (0: none yet): the listener leaves the
    /// notifications of this process's own batches to the committer.
    committer_pid: AtomicI32,
}

impl Shared {
    fn learn(&self, version: u64) {
        self.known.fetch_max(version, Ordering::AcqRel);
    }

    /// Notes how the last round trip that needed the database went: reached, or failed with
    /// `e` (only an unreachable database changes the health).
    fn reached(&self, outcome: std::result::Result<(), &Error>) {
        let mut u = self.unreachable.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Ok(()) => *u = None,
            Err(e) if is_unavailable(e) => *u = Some(e.to_string()),
            Err(Error::CommitUnknownResult) => {
                *u = Some("the connection failed while a commit was in flight".into())
            }
            Err(_) => {}
        }
    }

    /// A pooled connection.
    async fn conn(&self) -> Result<deadpool_postgres::Object> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::DatabaseClosed);
        }
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => unavailable(&e),
            other => unavailable_msg(format!("no pooled connection: {other}")),
        })
    }
}

/// Counters of the committer.
#[derive(Debug, Default)]
pub struct PostgresStats {
    /// Transactions committed (acknowledged).
    pub transactions_committed: AtomicU64,
    /// Transactions rejected (conflicts, too old).
    pub transactions_rejected: AtomicU64,
    /// PostgreSQL transactions that committed a batch.
    pub batches_committed: AtomicU64,
    /// Point reads the read cache missed, sent to the database.
    pub point_reads: AtomicU64,
    /// Statements that carried them (see `reads`: the misses waiting together share one).
    pub point_read_statements: AtomicU64,
}

impl PostgresStats {
    /// Mean acknowledged transactions per committed batch so far.
    pub fn transactions_per_batch(&self) -> f64 {
        let c = self.transactions_committed.load(Ordering::Relaxed) as f64;
        let b = self.batches_committed.load(Ordering::Relaxed).max(1) as f64;
        c / b
    }
}

/// The postgres backend. Clone it to share one pool, committer and listener.
#[derive(Clone)]
pub struct PostgresDatabase {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PostgresDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresDatabase").field("schema", &self.shared.sql.schema).finish()
    }
}

impl PostgresDatabase {
    /// Connects to the database of `options.url`, creates the schema's tables when absent
    /// (refusing tables of another [`SCHEMA_FORMAT`]), and starts the committer and the
    /// listener. Must be called inside a tokio runtime; `clock` measures transaction ages and
    /// paces the background tasks.
    pub async fn connect(options: PostgresOptions, clock: SharedClock) -> Result<Self> {
        let config = options.validate()?;
        let manager = deadpool_postgres::Manager::from_config(
            config.clone(),
            tokio_postgres::NoTls,
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(options.pool_size)
            .build()
            .map_err(|e| Error::Storage(format!("cannot build the PostgreSQL pool: {e}")))?;
        let sql = Sql::new(&options.schema);
        let version = {
            let mut client = pool.get().await.map_err(|e| match e {
                deadpool_postgres::PoolError::Backend(e) => unavailable(&e),
                other => unavailable_msg(other.to_string()),
            })?;
            sql::ensure_schema(&mut client, &sql).await?
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let (reads, read_queue) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            config,
            pool,
            sql,
            clock,
            known: AtomicU64::new(version),
            acks: AckLog::default(),
            jobs: Mutex::new(Some(tx)),
            reads,
            watches: Arc::new(Watches::default()),
            closed: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
            stats: Arc::new(PostgresStats::default()),
            unreachable: Mutex::new(None),
            cache: cache::ReadCache::default(),
            committer_pid: AtomicI32::new(0),
        });
        let committer = tokio::spawn(committer::run(shared.clone(), rx));
        let reader = tokio::spawn(reads::run(shared.clone(), read_queue));
        let listener = listener::start(shared.clone()).await?;
        let mut tasks = shared.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.extend([committer, reader, listener]);
        drop(tasks);
        Ok(PostgresDatabase { shared })
    }

    /// [`connect`](Self::connect), wrapped in a [`Database`] handle whose retry loop backs off
    /// on `clock` with `rng`.
    pub async fn connect_database(
        options: PostgresOptions,
        clock: SharedClock,
        rng: Rng,
    ) -> Result<Database> {
        let db = PostgresDatabase::connect(options, clock.clone()).await?;
        Ok(Database::new(Arc::new(db), clock, rng))
    }

    /// The committer's counters.
    pub fn stats(&self) -> Arc<PostgresStats> {
        self.shared.stats.clone()
    }

    /// The read cache's counters: (hits, misses, resets).
    pub fn cache_stats(&self) -> (u64, u64, u64) {
        let s = &self.shared.cache.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (get(&s.hits), get(&s.misses), get(&s.resets))
    }
}

impl KvDatabase for PostgresDatabase {
    fn begin(&self) -> Result<Arc<dyn KvTransaction>> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(Error::DatabaseClosed);
        }
        Ok(Arc::new(PgTransaction::begin(self.shared.clone())))
    }

    fn backend_name(&self) -> &'static str {
        "postgres"
    }

    /// `Unavailable` while the last commit batch (or the listening connection) could not
    /// reach the database; `Healthy` once one did. A node commits its lease renewals every
    /// few seconds, so this follows the database closely.
    fn health(&self) -> StoreHealth {
        let u = self.shared.unreachable.lock().unwrap_or_else(|e| e.into_inner());
        match &*u {
            Some(reason) => StoreHealth::Unavailable { reason: reason.clone() },
            None => StoreHealth::Healthy,
        }
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.shared.closed.store(true, Ordering::Release);
            // Dropping the sender lets the committer finish what is queued, then end.
            self.shared.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
            let tasks: Vec<_> =
                std::mem::take(&mut *self.shared.tasks.lock().unwrap_or_else(|e| e.into_inner()));
            let mut tasks = tasks.into_iter();
            if let Some(committer) = tasks.next() {
                let _ = committer.await;
            }
            for t in tasks {
                t.abort();
            }
            self.shared.watches.close();
            self.shared.pool.close();
        })
    }
}

/// The retryable error of an unreachable database (code [`UNAVAILABLE_CODE`]).
pub fn unavailable_msg(message: String) -> Error {
    Error::Other {
        code: UNAVAILABLE_CODE,
        message: format!("database_unavailable: {message}"),
        retryable: true,
        maybe_committed: false,
    }
}

/// Whether `e` says the database could not be reached (code [`UNAVAILABLE_CODE`]).
pub fn is_unavailable(e: &Error) -> bool {
    matches!(e, Error::Other { code, .. } if *code == UNAVAILABLE_CODE)
}

/// Maps a PostgreSQL error of a read or of a statement before `COMMIT` (nothing applied).
pub(crate) fn classify(e: &tokio_postgres::Error) -> Error {
    let Some(db) = e.as_db_error() else { return unavailable(e) };
    let code = db.code().code();
    match code {
        // serialization_failure, deadlock_detected; read_only_sql_transaction (a standby, e.g.
        // just after a failover: the connection is dropped and the retry finds the primary).
        "40001" | "40P01" | "25006" => Error::NotCommitted,
        // query_canceled: the statement timeout (the transaction's time is up).
        "57014" => Error::TransactionTooOld { window_ms: super::limits::TRANSACTION_AGE_MAX_MS },
        "53100" => Error::StorageFull(format!("PostgreSQL: {}", db.message())),
        // admin_shutdown, crash_shutdown, cannot_connect_now: the server is going away.
        c if c.starts_with("08") || c == "57P01" || c == "57P02" || c == "57P03" => {
            unavailable_msg(format!("PostgreSQL {c}: {}", db.message()))
        }
        c => Error::Storage(format!("PostgreSQL {c}: {}", db.message())),
    }
}

/// The retryable error of a connection that failed (no server answer).
pub(crate) fn unavailable(e: &tokio_postgres::Error) -> Error {
    unavailable_msg(format!("PostgreSQL connection failed: {e}"))
}
