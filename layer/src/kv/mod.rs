//! The KV layer: a small trait mirroring the subset of FoundationDB that Kairos needs, with
//! FoundationDB's semantics, and the [`Database`] / [`Transaction`] handles the rest of the
//! code uses.
//!
//! Backends: [`memory`] (MVCC + OCC resolver, seeded fault injection, for tests and the
//! simulation), [`embedded`] (the same resolver over redb with group commit: the zero-set-up
//! default), [`postgres`] (FoundationDB's commit protocol over a PostgreSQL database shared by
//! several nodes) and, behind the `fdb` cargo feature, `fdb` (a thin adapter over
//! FoundationDB).

pub mod embedded;
pub mod error;
#[cfg(feature = "fdb")]
pub mod fdb;
pub mod limits;
mod local;
pub mod memory;
pub mod postgres;
mod run;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;

pub use error::{Error, Result, TxnError};
pub use local::counts::WriteCounts;
pub use run::{RunObserver, RunOptions};

use crate::env::{BoxFuture, Rng, SharedClock};

/// A key-value pair returned by a range read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Bytes,
    /// The value.
    pub value: Bytes,
}

/// A range read: keys in `[begin, end)`, at most `limit` of them (0 = no limit), in
/// ascending order or, with `reverse`, descending from `end`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeOption {
    /// First key of the range (inclusive).
    pub begin: Vec<u8>,
    /// End of the range (exclusive).
    pub end: Vec<u8>,
    /// Maximum number of pairs returned; 0 means no limit.
    pub limit: usize,
    /// Read from the end of the range backwards.
    pub reverse: bool,
}

impl RangeOption {
    /// All keys in `[begin, end)`, ascending, no limit.
    pub fn new(begin: impl Into<Vec<u8>>, end: impl Into<Vec<u8>>) -> Self {
        RangeOption { begin: begin.into(), end: end.into(), limit: 0, reverse: false }
    }
    /// All keys starting with `prefix`.
    pub fn prefix(prefix: &[u8]) -> Self {
        let end = limits::strinc(prefix).unwrap_or_else(|| vec![0xff]);
        RangeOption::new(prefix.to_vec(), end)
    }
    /// With a limit (0 = none).
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
    /// Reversed.
    pub fn reverse(mut self, reverse: bool) -> Self {
        self.reverse = reverse;
        self
    }
}

/// A 10-byte versionstamp: the 8-byte big-endian commit version and a 2-byte big-endian batch
/// order. Unique per committed transaction and increasing in commit order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Versionstamp(pub [u8; limits::VERSIONSTAMP_BYTES]);

impl Versionstamp {
    /// The versionstamp of commit `version`, `batch_order` within its batch.
    pub fn new(version: u64, batch_order: u16) -> Self {
        let mut b = [0u8; limits::VERSIONSTAMP_BYTES];
        b[..8].copy_from_slice(&version.to_be_bytes());
        b[8..].copy_from_slice(&batch_order.to_be_bytes());
        Versionstamp(b)
    }
    /// The commit version part.
    pub fn version(&self) -> u64 {
        let mut v = [0u8; 8];
        v.copy_from_slice(&self.0[..8]);
        u64::from_be_bytes(v)
    }
}

/// What a successful commit reports. Read-only transactions commit trivially and report
/// neither a version nor a versionstamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommitInfo {
    /// The commit version, if the transaction wrote anything.
    pub version: Option<u64>,
    /// The transaction's versionstamp, if it wrote anything.
    pub versionstamp: Option<Versionstamp>,
}

/// A watch on a key: resolves once the key's value differs from the value the watching
/// transaction saw. Active only after that transaction commits; fails with the commit's
/// error if it does not, and with `DatabaseClosed` when the database closes.
pub struct Watch(BoxFuture<'static, Result<()>>);

impl Watch {
    /// Wraps a backend's watch future.
    pub fn new(fut: BoxFuture<'static, Result<()>>) -> Self {
        Watch(fut)
    }
}

impl Future for Watch {
    type Output = Result<()>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watch")
    }
}

/// Whether a store can do its work, as its backend sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StoreHealth {
    /// Reads and writes work.
    #[default]
    Healthy,
    /// Writes are refused for now (e.g. the disk is full); reads work; writes resume by
    /// themselves when the cause goes away.
    WritesRefused {
        /// Why.
        reason: String,
    },
    /// The store cannot be reached for now (a database server down, failing over, or cut off
    /// from this node): operations fail with retryable errors and work again by themselves
    /// once it is reachable.
    Unavailable {
        /// Why (the last connection error).
        reason: String,
    },
    /// The store failed for good (e.g. the engine found its file damaged): every operation
    /// fails; the node must stop and an operator look (`kairos check`).
    Failed {
        /// Why.
        reason: String,
    },
}

/// A database backend.
///
/// # Contract
/// Transactions are serializable: a transaction commits only if no key in its read conflict
/// ranges was written by a transaction that committed after its read version; otherwise the
/// commit fails with [`Error::NotCommitted`]. A commit that returns `Ok` is durable to the
/// backend's standard (memory: for the life of the process; embedded: fsynced; fdb: replicated).
/// Every backend enforces the limits in [`limits`].
pub trait KvDatabase: Send + Sync + 'static {
    /// Starts a transaction. Fails with `DatabaseClosed` after `close`.
    fn begin(&self) -> Result<Arc<dyn KvTransaction>>;
    /// A short name of the backend (`memory`, `embedded`, `postgres`, `fdb`).
    fn backend_name(&self) -> &'static str;
    /// Closes the database: new transactions fail, pending watches fail with `DatabaseClosed`,
    /// commits already acknowledged stay durable.
    fn close(&self) -> BoxFuture<'_, ()>;
    /// Whether the store can do its work now.
    fn health(&self) -> StoreHealth {
        StoreHealth::Healthy
    }
    /// The writes committed so far, where the backend counts them (memory, embedded).
    fn write_counts(&self) -> Option<WriteCounts> {
        None
    }
    /// Copies one consistent snapshot of the store into a new store file at `to` while the
    /// store serves (the embedded backend; others refuse: their own tools back them up).
    fn backup_to<'a>(&'a self, to: &'a std::path::Path) -> BoxFuture<'a, Result<BackupReport>> {
        let _ = to;
        let backend = self.backend_name();
        Box::pin(async move {
            Err(Error::InvalidOperation(format!(
                "backup: the {backend} backend has no online backup through the node"
            )))
        })
    }
}

/// What an online backup ([`KvDatabase::backup_to`]) copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupReport {
    /// The snapshot's version: every commit acknowledged before the backup began is in it.
    pub version: u64,
    /// Keys copied.
    pub keys: u64,
    /// Bytes of keys and values copied.
    pub bytes: u64,
}

/// One transaction of a [`KvDatabase`].
///
/// # Contract
/// Reads see the database at the transaction's read version plus the transaction's own
/// writes. Non-snapshot reads add read conflict ranges; snapshot reads do not. Mutations are
/// buffered until `commit`. After `commit` (successful or not) the transaction cannot be used
/// again. Transactions older than [`limits::TRANSACTION_AGE_MAX_MS`] fail with
/// `TransactionTooOld`.
pub trait KvTransaction: Send + Sync {
    /// The transaction's read version.
    fn read_version(&self) -> BoxFuture<'_, Result<u64>>;
    /// Reads one key.
    fn get<'a>(&'a self, key: &'a [u8], snapshot: bool) -> BoxFuture<'a, Result<Option<Bytes>>>;
    /// Reads a range.
    fn get_range<'a>(
        &'a self,
        range: &'a RangeOption,
        snapshot: bool,
    ) -> BoxFuture<'a, Result<Vec<KeyValue>>>;
    /// Sets a key.
    fn set(&self, key: &[u8], value: &[u8]) -> Result<()>;
    /// Clears a key.
    fn clear(&self, key: &[u8]) -> Result<()>;
    /// Clears every key in `[begin, end)`.
    fn clear_range(&self, begin: &[u8], end: &[u8]) -> Result<()>;
    /// Adds `param` to the key's value as little-endian integers (FoundationDB `ADD`): a
    /// missing value counts as zero; the result has `param`'s length. Adds no read conflict.
    fn atomic_add(&self, key: &[u8], param: &[u8]) -> Result<()>;
    /// Sets a key whose bytes `[offset, offset + 10)` are replaced at commit by the
    /// transaction's versionstamp.
    fn set_versionstamped_key(&self, key: &[u8], offset: usize, value: &[u8]) -> Result<()>;
    /// Sets a value whose bytes `[offset, offset + 10)` are replaced at commit by the
    /// transaction's versionstamp.
    fn set_versionstamped_value(&self, key: &[u8], value: &[u8], offset: usize) -> Result<()>;
    /// Adds `[begin, end)` to the read conflict ranges without reading it.
    fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]) -> Result<()>;
    /// Watches `key`; see [`Watch`].
    fn watch(&self, key: &[u8]) -> Result<Watch>;
    /// Commits.
    fn commit(&self) -> BoxFuture<'_, Result<CommitInfo>>;
    /// The transaction's size so far as [`limits::TRANSACTION_BYTES_MAX`] counts it
    /// (mutations and conflict ranges; FoundationDB's `get_approximate_size`): batches stop
    /// taking items before it passes their budget.
    fn approximate_size(&self) -> usize;
    /// The backend's own handling of a retryable `error` this transaction failed with
    /// (FoundationDB's `on_error`: its back-off for conflicts, `future_version`,
    /// `process_behind`, throttling). `None` when the backend has none: the retry loop then
    /// sleeps its own full-jitter back-off. When `Some`, the future resolves once the caller may
    /// retry with a new transaction, or fails with the error to give up with.
    fn on_error<'a>(&'a self, error: &'a Error) -> Option<BoxFuture<'a, Result<()>>> {
        let _ = error;
        None
    }
}

/// A handle on a database: cheap to clone, shared by every task of a node.
#[derive(Clone)]
pub struct Database {
    inner: Arc<dyn KvDatabase>,
    clock: SharedClock,
    rng: Rng,
    options: RunOptions,
    observer: Option<Arc<dyn RunObserver>>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database").field("backend", &self.inner.backend_name()).finish()
    }
}

impl Database {
    /// Wraps a backend. `clock` and `rng` drive the retry loop's back-off.
    pub fn new(inner: Arc<dyn KvDatabase>, clock: SharedClock, rng: Rng) -> Self {
        Database { inner, clock, rng, options: RunOptions::default(), observer: None }
    }

    /// The same database reporting every `run`'s commit latency and retries to `observer`
    /// (metrics).
    pub fn with_observer(mut self, observer: Arc<dyn RunObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The same database with other retry-loop options.
    pub fn with_options(mut self, options: RunOptions) -> Self {
        self.options = options;
        self
    }

    /// The backend's name.
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    /// The injected clock.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Starts a transaction (for callers that manage retries themselves; prefer [`run`]).
    ///
    /// [`run`]: Database::run
    pub fn begin(&self) -> Result<Transaction> {
        Ok(Transaction { inner: self.inner.begin()? })
    }

    /// Closes the database; see [`KvDatabase::close`].
    pub async fn close(&self) {
        self.inner.close().await
    }

    /// Whether the store can do its work now; see [`StoreHealth`].
    pub fn health(&self) -> StoreHealth {
        self.inner.health()
    }

    /// The writes committed so far, by kind and bytes, where the backend counts them
    /// (memory, embedded); see [`KvDatabase::write_counts`].
    pub fn write_counts(&self) -> Option<WriteCounts> {
        self.inner.write_counts()
    }

    /// An online backup into a new store file; see [`KvDatabase::backup_to`].
    pub async fn backup_to(&self, to: &std::path::Path) -> Result<BackupReport> {
        self.inner.backup_to(to).await
    }
}

/// A transaction handle: cheap to clone (clones share the transaction).
#[derive(Clone)]
pub struct Transaction {
    inner: Arc<dyn KvTransaction>,
}

impl Transaction {
    /// The read version.
    pub async fn read_version(&self) -> Result<u64> {
        self.inner.read_version().await
    }
    /// Reads a key, adding it to the read conflict ranges.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        self.inner.get(key, false).await
    }
    /// Reads a key without adding a read conflict.
    pub async fn snapshot_get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        self.inner.get(key, true).await
    }
    /// Reads an owned key without a read conflict (for concurrent reads of keys built on the
    /// fly).
    pub async fn snapshot_get_owned(&self, key: Vec<u8>) -> Result<Option<Bytes>> {
        self.inner.get(&key, true).await
    }
    /// Reads a key, snapshot or not.
    pub async fn get_with(&self, key: &[u8], snapshot: bool) -> Result<Option<Bytes>> {
        self.inner.get(key, snapshot).await
    }
    /// Reads a range, adding it (up to the last key returned when the limit cut it short) to
    /// the read conflict ranges unless `snapshot`.
    pub async fn get_range(&self, range: &RangeOption, snapshot: bool) -> Result<Vec<KeyValue>> {
        self.inner.get_range(range, snapshot).await
    }
    /// Sets a key.
    pub fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.inner.set(key, value)
    }
    /// Clears a key.
    pub fn clear(&self, key: &[u8]) -> Result<()> {
        self.inner.clear(key)
    }
    /// Clears `[begin, end)`.
    pub fn clear_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.inner.clear_range(begin, end)
    }
    /// Atomic little-endian add; see [`KvTransaction::atomic_add`].
    pub fn atomic_add(&self, key: &[u8], param: &[u8]) -> Result<()> {
        self.inner.atomic_add(key, param)
    }
    /// Atomic add of a signed 64-bit integer.
    pub fn add_i64(&self, key: &[u8], delta: i64) -> Result<()> {
        self.inner.atomic_add(key, &delta.to_le_bytes())
    }
    /// Sets a versionstamped key; see [`KvTransaction::set_versionstamped_key`].
    pub fn set_versionstamped_key(&self, key: &[u8], offset: usize, value: &[u8]) -> Result<()> {
        self.inner.set_versionstamped_key(key, offset, value)
    }
    /// Sets a versionstamped value; see [`KvTransaction::set_versionstamped_value`].
    pub fn set_versionstamped_value(&self, key: &[u8], value: &[u8], offset: usize) -> Result<()> {
        self.inner.set_versionstamped_value(key, value, offset)
    }
    /// Adds a read conflict range.
    pub fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.inner.add_read_conflict_range(begin, end)
    }
    /// Adds a read conflict on one key.
    pub fn add_read_conflict_key(&self, key: &[u8]) -> Result<()> {
        self.inner.add_read_conflict_range(key, &limits::key_after(key))
    }
    /// Watches a key; see [`Watch`].
    pub fn watch(&self, key: &[u8]) -> Result<Watch> {
        self.inner.watch(key)
    }
    /// Commits the transaction.
    pub async fn commit(&self) -> Result<CommitInfo> {
        self.inner.commit().await
    }
    /// The size so far; see [`KvTransaction::approximate_size`].
    pub fn approximate_size(&self) -> usize {
        self.inner.approximate_size()
    }
    /// The backend's own back-off after `error`; see [`KvTransaction::on_error`].
    pub(crate) fn on_error<'a>(&'a self, error: &'a Error) -> Option<BoxFuture<'a, Result<()>>> {
        self.inner.on_error(error)
    }
}

/// Decodes a little-endian signed counter as written by [`Transaction::add_i64`]; missing or
/// short values read as zero-extended.
pub fn decode_i64(value: Option<&[u8]>) -> i64 {
    let mut b = [0u8; 8];
    if let Some(v) = value {
        let n = v.len().min(8);
        b[..n].copy_from_slice(&v[..n]);
    }
    i64::from_le_bytes(b)
}
