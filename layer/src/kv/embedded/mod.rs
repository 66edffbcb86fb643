//! The `embedded` backend — the zero-set-up default: the shared OCC resolver over a redb file,
//! with **group commit**.
//!
//! Concurrent commits queue for one committer thread, which takes every commit waiting,
//! resolves them in order against the conflict history and makes all that pass durable with
//! **one** fsync: of the batch's frame in the commit log (module [`log`], ADR 0011), after which
//! its writes join the in-memory overlay of what redb does not hold yet (module [`overlay`],
//! ADR 0012); redb takes the overlay every 100 ms unsynced and each second durably. Only then is
//! each commit acknowledged and visible. Without the log, each batch is one durable redb commit.
//! A snapshot is a redb read transaction with the overlay's generation of the same moment, at
//! the published version. A crash loses nothing acknowledged: reopening recovers redb's last
//! durable commit and re-applies the log's frames above it.
//!
//! **A damaged store is not served** (ADR 0009): when the file changed since it was closed
//! cleanly, or after a run that did not close it cleanly (up to a size bound), the open runs
//! redb's integrity check — every page's checksum — before anything is served
//! ([`integrity`]). A store found damaged opens `Failed`
//! ([`Integrity::Damaged`]): every operation fails with what was found. A panic of the engine
//! (what redb does on some damaged pages it was not asked to verify) is contained in every
//! path, and a range read that meets keys out of order fails instead of returning rows short.

pub use super::limits::VERIFY_AFTER_CRASH_BYTES_MAX;

mod backup;
mod check;
mod committer;
mod contain;
mod engine;
mod errors;
mod integrity;
mod log;
mod overlay;
#[cfg(test)]
mod snapshot_race;

pub use self::check::{EngineCheck, check_file};
pub use self::integrity::Integrity;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

pub use self::backup::BackupReport;
use self::committer::{Committer, Job};
use self::engine::Engine;
use self::overlay::{Cursor, Generation, Overlay};
use super::error::{Error, Result};
use super::local::watch::{WatchSender, Watches};
use super::local::{ActiveReads, CommitRequest, LocalStore, LocalTransaction, Snapshot};
use super::{CommitInfo, Database, KvDatabase, KvTransaction};
use crate::env::{BoxFuture, Rng, SharedClock};

pub(crate) const DATA: TableDefinition<'static, &'static [u8], &'static [u8]> =
    TableDefinition::new("kv");
pub(crate) const META: TableDefinition<'static, &'static str, u64> = TableDefinition::new("meta");
pub(crate) const META_VERSION: &str = "version";

/// redb's page cache by default (redb's own default, 1 GiB, is more than a node should take).
pub const CACHE_BYTES: usize = 128 * 1024 * 1024;

/// Settings of the embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// redb's page cache, in bytes: what the store may keep in memory beyond the node itself.
    pub cache_bytes: usize,
    /// Fault injection for tests: while set, the file system reports no free space (the
    /// ordinary full disk, caught before the engine). `None` in production.
    pub disk_full: Option<Arc<AtomicBool>>,
    /// Fault injection for tests: while set, every write to the file fails with ENOSPC although
    /// the space check saw room (space gone between the check and the write). `None` in
    /// production.
    pub disk_writes_fail: Option<Arc<AtomicBool>>,
    /// Fault injection for tests: while set, the engine panics when it writes (as redb did on
    /// a damaged file). `None` in production.
    pub engine_panics: Option<Arc<AtomicBool>>,
    /// When the open verifies every page of the store.
    pub verify_at_open: VerifyAtOpen,
    /// The largest store verified at the open after a run that did not close it cleanly: the
    /// check reads every page (seconds per GiB, ADR 0009), and a crash alone does not damage
    /// the file, so a larger store opens at once, [`Integrity::Unverified`]. A file that
    /// changed since its clean close is verified whatever its size.
    pub verify_after_crash_bytes_max: u64,
    /// Whether group commits are made durable by the commit log (`<store>.log`, one sync of an
    /// append) with redb checkpointing at intervals, rather than by a durable redb commit each
    /// (ADR 0011). On by default; off, every batch is a checkpoint.
    pub commit_log: bool,
    /// The longest time between two durable redb commits while the log is in use.
    pub checkpoint_interval_ms: u64,
    /// The log size that brings the next checkpoint forward (the most a crash leaves to
    /// replay at the next open).
    pub checkpoint_log_bytes: u64,
    /// How often redb takes the recent commits from memory between checkpoints, without a
    /// sync (the log keeps them durable); reads then stop stepping over their deletions.
    pub flush_interval_ms: u64,
}

/// [`EmbeddedOptions::checkpoint_interval_ms`] by default.
pub const CHECKPOINT_INTERVAL_MS: u64 = 1_000;
/// [`EmbeddedOptions::flush_interval_ms`] by default.
pub const FLUSH_INTERVAL_MS: u64 = 100;
/// [`EmbeddedOptions::checkpoint_log_bytes`] by default.
pub const CHECKPOINT_LOG_BYTES: u64 = 64 * 1024 * 1024;

/// When [`EmbeddedDatabase::open`] verifies the whole store before serving it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VerifyAtOpen {
    /// When the file changed since it was closed cleanly, and after a run that did not close
    /// it cleanly if it is no larger than [`EmbeddedOptions::verify_after_crash_bytes_max`]
    /// (the default).
    #[default]
    WhenInDoubt,
    /// Every time.
    Always,
    /// Never (`kairos check`, which verifies with the engine's own check first, then reads
    /// every record of whatever the engine can still read).
    Never,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            cache_bytes: CACHE_BYTES,
            disk_full: None,
            disk_writes_fail: None,
            engine_panics: None,
            verify_at_open: VerifyAtOpen::WhenInDoubt,
            verify_after_crash_bytes_max: VERIFY_AFTER_CRASH_BYTES_MAX,
            commit_log: true,
            checkpoint_interval_ms: CHECKPOINT_INTERVAL_MS,
            checkpoint_log_bytes: CHECKPOINT_LOG_BYTES,
            flush_interval_ms: FLUSH_INTERVAL_MS,
        }
    }
}

/// Counters of the group committer.
#[derive(Debug, Default)]
pub struct EmbeddedStats {
    /// Transactions committed (acknowledged).
    pub transactions_committed: AtomicU64,
    /// Transactions rejected by the resolver (conflicts, too old).
    pub transactions_rejected: AtomicU64,
    /// Engine commits, i.e. fsyncs (of the commit log, or of redb at a checkpoint).
    pub engine_commits: AtomicU64,
    /// Durable redb commits (checkpoints), which empty the commit log.
    pub checkpoints: AtomicU64,
    /// The committed transactions' writes, before the group commit folds them.
    pub(crate) writes: crate::kv::local::counts::WriteCounter,
}

impl EmbeddedStats {
    /// Mean acknowledged transactions per fsync so far.
    pub fn transactions_per_fsync(&self) -> f64 {
        let c = self.transactions_committed.load(Ordering::Relaxed) as f64;
        let f = self.engine_commits.load(Ordering::Relaxed).max(1) as f64;
        c / f
    }
}

struct Shared {
    engine: Arc<Engine>,
    clock: SharedClock,
    watches: Arc<Watches>,
    jobs: Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    committer: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
    stats: Arc<EmbeddedStats>,
    active: Arc<ActiveReads>,
    published: Arc<AtomicU64>,
    path: PathBuf,
    integrity: Integrity,
    overlay: Arc<Overlay>,
}

/// The embedded backend. Clone it to share one open file.
#[derive(Clone)]
pub struct EmbeddedDatabase {
    shared: Arc<Shared>,
    store: Arc<dyn LocalStore>,
}

impl std::fmt::Debug for EmbeddedDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedDatabase").field("path", &self.shared.path).finish()
    }
}

fn storage<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> Error {
    move |e| Error::Storage(format!("{what}: {e}"))
}

impl EmbeddedDatabase {
    /// Opens (or creates) the store at `path` (a file), recovering the last durable commit.
    pub fn open(path: impl AsRef<Path>, clock: SharedClock) -> Result<Self> {
        Self::open_with(path, clock, EmbeddedOptions::default())
    }

    /// [`open`](Self::open) with settings.
    pub fn open_with(
        path: impl AsRef<Path>,
        clock: SharedClock,
        options: EmbeddedOptions,
    ) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                Error::Storage(format!("cannot create directory {}: {e}", dir.display()))
            })?;
        }
        let (why, unverified) = integrity::decide(&path, &options)?;
        if matches!(unverified, Some(Integrity::New)) {
            log::refuse_without_store(&path)?;
        }
        let engine = Arc::new(Engine::open(path.clone(), options, why.as_deref())?);
        let integrity = match (engine.damaged(), why, unverified) {
            (Some(reason), _, _) => Integrity::Damaged { reason },
            (None, Some(why), _) => Integrity::Verified { why },
            (None, None, Some(integrity)) => integrity,
            (None, None, None) => Integrity::Trusted,
        };
        if let Integrity::Unverified { why } = &integrity {
            tracing::warn!(store = %path.display(), why, "the store opens without being verified");
        }
        let version = if engine.damaged().is_some() {
            0
        } else {
            let db = engine.current()?;
            let w = db.begin_write().map_err(storage("begin write"))?;
            let version = {
                w.open_table(DATA).map_err(storage("open table"))?;
                let meta = w.open_table(META).map_err(storage("open table"))?;
                meta.get(META_VERSION).map_err(storage("read version"))?.map_or(0, |g| g.value())
            };
            w.commit().map_err(storage("commit"))?;
            version
        };
        let (watches, stats) = (Arc::new(Watches::default()), Arc::new(EmbeddedStats::default()));
        let (tx, rx) = std::sync::mpsc::channel();
        let active = Arc::new(ActiveReads::default());
        let published = Arc::new(AtomicU64::new(version));
        let overlay = Arc::new(Overlay::default());
        let committer = Committer::new(
            engine.clone(),
            clock.clone(),
            (watches.clone(), stats.clone(), overlay.clone()),
            version,
            (active.clone(), published.clone()),
        );
        let handle = std::thread::Builder::new()
            .name("kairos-group-commit".into())
            .spawn(move || committer.run(rx))
            .map_err(|e| Error::Storage(format!("cannot start the committer thread: {e}")))?;
        let shared = Arc::new(Shared {
            engine,
            clock,
            watches,
            jobs: Mutex::new(Some(tx)),
            committer: Mutex::new(Some(handle)),
            closed: AtomicBool::new(false),
            stats,
            active,
            published,
            path,
            integrity,
            overlay,
        });
        Ok(EmbeddedDatabase { store: Arc::new(Store(shared.clone())), shared })
    }

    /// Opens the store at `path` and wraps it in a [`Database`] handle.
    pub fn open_database(path: impl AsRef<Path>, clock: SharedClock, rng: Rng) -> Result<Database> {
        Self::open_database_with(path, clock, rng, EmbeddedOptions::default())
    }

    /// [`open_database`](Self::open_database) with settings.
    pub fn open_database_with(
        path: impl AsRef<Path>,
        clock: SharedClock,
        rng: Rng,
        options: EmbeddedOptions,
    ) -> Result<Database> {
        let edb = EmbeddedDatabase::open_with(path, clock.clone(), options)?;
        Ok(Database::new(Arc::new(edb), clock, rng))
    }

    /// The group committer's counters.
    pub fn stats(&self) -> Arc<EmbeddedStats> {
        self.shared.stats.clone()
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// What the open knew or found of the store's bytes (whether it verified them, and what
    /// it found damaged).
    pub fn integrity(&self) -> &Integrity {
        &self.shared.integrity
    }
}

struct Store(Arc<Shared>);

impl Store {
    /// A snapshot; `opened` runs once redb's read transaction is open (a test commits there,
    /// the moment a concurrent batch can land).
    fn snapshot_with(&self, opened: impl FnOnce()) -> Result<Arc<dyn Snapshot>> {
        if self.0.closed.load(Ordering::Acquire) {
            return Err(Error::DatabaseClosed);
        }
        let db = self.0.engine.current()?;
        self.0.overlay.with_current(|generation| {
            // The published version is read before redb: every write up to it is then in the
            // redb read below or in the generation. Read after, it could name a batch that
            // landed after redb's read opened: the snapshot would claim a version whose writes
            // it does not see, and a read-modify-write at it would pass the resolver (a lost
            // update: issue 34, the no-log store under load).
            let published = self.0.published.load(Ordering::Acquire);
            let r = db.begin_read().map_err(storage("begin read"))?;
            opened();
            let table = r.open_table(DATA).map_err(storage("open table"))?;
            let meta = r.open_table(META).map_err(storage("open table"))?;
            let checkpoint =
                meta.get(META_VERSION).map_err(storage("read version"))?.map_or(0, |g| g.value());
            // Without the log, redb may hold a batch not yet published (then its version,
            // written in the same redb commit, is the snapshot's).
            let version = checkpoint.max(published);
            let generation = generation.clone();
            Ok(Arc::new(RedbSnapshot { table, version, engine: self.0.engine.clone(), generation })
                as Arc<dyn Snapshot>)
        })
    }
}

struct RedbSnapshot {
    table: redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
    version: u64,
    engine: Arc<Engine>,
    /// The writes since the checkpoint `table` was read at, which it does not hold.
    generation: Arc<Generation>,
}

impl RedbSnapshot {
    /// Runs a read of the engine, containing a panic (a damaged file): the store is marked
    /// failed and the read fails with the reason, instead of the panic killing the caller.
    fn guarded<T>(&self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        match contain::contain(f) {
            Ok(r) => r,
            Err(panic) => {
                Err(self.engine.fail_damaged(&format!("the engine failed in a {what} ({panic})")))
            }
        }
    }
}

impl Snapshot for RedbSnapshot {
    fn version(&self) -> u64 {
        self.version
    }

    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        if let Some(v) = self.generation.get(key, self.version) {
            return Ok(v);
        }
        self.guarded("read", || {
            let v = self.table.get(key).map_err(storage("read"))?;
            Ok(v.map(|g| Bytes::copy_from_slice(g.value())))
        })
    }

    fn scan(
        &self,
        begin: &[u8],
        end: &[u8],
        reverse: bool,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        let mut newer = Cursor::new(&self.generation, (begin, end), reverse, self.version);
        if newer.peek().is_none() {
            return self.guarded("range read", || self.scan_unguarded(begin, end, reverse, visit));
        }
        // The generation's keys merged with redb's, the generation's version winning; a
        // deletion there hides redb's key.
        let mut stopped = false;
        let before = |a: &[u8], b: &[u8]| if reverse { a > b } else { a < b };
        let mut merged = |key: &[u8], value: &[u8]| -> bool {
            while let Some((k, _)) = newer.peek() {
                if !before(k, key) {
                    break;
                }
                let Some((k, v)) = newer.pop() else { break };
                if let Some(v) = v
                    && !visit(&k, &v)
                {
                    stopped = true;
                    return false;
                }
            }
            if newer.peek().is_some_and(|(k, _)| k.as_slice() == key) {
                let Some((k, v)) = newer.pop() else { return true };
                let go = v.is_none_or(|v| visit(&k, &v));
                stopped = !go;
                return go;
            }
            let go = visit(key, value);
            stopped = !go;
            go
        };
        self.guarded("range read", || self.scan_unguarded(begin, end, reverse, &mut merged))?;
        while !stopped && let Some((k, v)) = newer.pop() {
            if let Some(v) = v {
                stopped = !visit(&k, &v);
            }
        }
        Ok(())
    }
}

impl RedbSnapshot {
    fn scan_unguarded(
        &self,
        begin: &[u8],
        end: &[u8],
        reverse: bool,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        let range = self.table.range::<&[u8]>(begin..end).map_err(storage("range read"))?;
        // redb does not verify checksums on reads: a damaged page can lead a scan astray. Keys
        // that leave the range or its order are damage, never a short answer.
        // The previous key (one buffer for the whole scan), `None` before the first.
        let mut last: Option<Vec<u8>> = None;
        let mut each = |item: std::result::Result<_, redb::StorageError>| -> Result<bool> {
            let (k, v): (redb::AccessGuard<&[u8]>, redb::AccessGuard<&[u8]>) =
                item.map_err(storage("range read"))?;
            let key = k.value();
            let ordered = last.as_deref().is_none_or(|l| if reverse { key < l } else { key > l });
            if !ordered || key < begin || key >= end {
                let last = last.as_deref().map(|l| l.escape_ascii().to_string());
                return Err(self.engine.fail_damaged(&format!(
                    "a range read met key \"{}\" out of order (after {last:?}) or outside its \
                     range",
                    key.escape_ascii()
                )));
            }
            let buf = last.get_or_insert_with(Vec::new);
            buf.clear();
            buf.extend_from_slice(key);
            Ok(visit(key, v.value()))
        };
        if reverse {
            for item in range.rev() {
                if !each(item)? {
                    break;
                }
            }
        } else {
            for item in range {
                if !each(item)? {
                    break;
                }
            }
        }
        Ok(())
    }
}

impl LocalStore for Store {
    fn clock(&self) -> &SharedClock {
        &self.0.clock
    }

    fn active(&self) -> &ActiveReads {
        &self.0.active
    }

    fn published_version(&self) -> u64 {
        self.0.published.load(Ordering::Acquire)
    }

    fn snapshot(&self) -> Result<Arc<dyn Snapshot>> {
        self.snapshot_with(|| {})
    }

    fn commit(&self, req: CommitRequest) -> BoxFuture<'static, Result<CommitInfo>> {
        let (reply, rx) = oneshot::channel();
        let sent = {
            let jobs = self.0.jobs.lock().unwrap_or_else(|e| e.into_inner());
            match jobs.as_ref() {
                Some(tx) => tx.send(Job { req, reply }).is_ok(),
                None => false,
            }
        };
        Box::pin(async move {
            if !sent {
                return Err(Error::DatabaseClosed);
            }
            // A dropped reply means the committer stopped mid-batch: the outcome is unknown.
            rx.await.unwrap_or(Err(Error::CommitUnknownResult))
        })
    }

    fn register_watch(&self, key: Vec<u8>, expected: Option<Bytes>, tx: WatchSender) {
        self.0.watches.register(key, expected, |k| self.snapshot().and_then(|s| s.get(k)), tx);
    }
}

impl KvDatabase for EmbeddedDatabase {
    fn begin(&self) -> Result<Arc<dyn KvTransaction>> {
        Ok(Arc::new(LocalTransaction::begin(self.store.clone())?))
    }

    fn backend_name(&self) -> &'static str {
        "embedded"
    }

    fn write_counts(&self) -> Option<crate::kv::WriteCounts> {
        Some(self.shared.stats.writes.snapshot())
    }

    fn health(&self) -> crate::kv::StoreHealth {
        self.shared.engine.health()
    }

    fn backup_to<'a>(&'a self, to: &'a Path) -> BoxFuture<'a, Result<BackupReport>> {
        Box::pin(EmbeddedDatabase::backup_to(self, to))
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.shared.closed.store(true, Ordering::Release);
            // Dropping the sender lets the committer finish what is queued, then exit.
            self.shared.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
            let handle = self.shared.committer.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(h) = handle {
                let _ = tokio::task::spawn_blocking(move || h.join()).await;
            }
            let closed = self.shared.engine.shut();
            self.shared.watches.close();
            // A clean close is recorded, so the next open can trust the file as it is now.
            // An unverified store stays in doubt until it is verified.
            if closed
                && integrity::may_record_clean_close(&self.shared.integrity)
                && let Err(e) = integrity::write_marker(&self.shared.path)
            {
                tracing::warn!(error = %e, "the clean shutdown of the store was not recorded");
            }
        })
    }
}
