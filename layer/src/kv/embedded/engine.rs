//! The redb engine under the embedded backend, and what happens when its disk fails it.
//!
//! **A full disk** is caught before it reaches the engine: each group commit first checks the
//! file system's free space, and below a reserve (64 MiB) the batch is refused with
//! `StorageFull` — the engine is untouched, reads go on, and the first batch after space returns
//! commits, with no restart. If an I/O error reaches redb anyway (space gone between the check
//! and the write, a quota, a failing device), redb refuses every later operation until it is
//! re-opened ("previous I/O error"), so the handle is swappable: the committer answers the
//! batch with the error, marks the store as refusing writes and re-opens the engine (at once,
//! or with the next batch if opening needs space too). **A panic inside the engine** (a damaged
//! file) marks the store failed for good: every later operation fails with the reason, and the
//! node reports it and stops.

// The engine waits on the operating system (file locks held by the last readers of a closed
// handle), not on scheduling time: real time, outside the simulation (which runs on the memory
// backend).
#![allow(clippy::disallowed_methods)]

use std::io;
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use redb::StorageBackend;

use super::EmbeddedOptions;
use super::contain::contain;
use super::errors::{classify, is_disk_full, is_read_past_end};
use super::log::{self, CommitLog, TableTarget};
use super::{DATA, META, META_VERSION};
use crate::kv::StoreHealth;
use crate::kv::error::{Error, Result};

/// The swappable engine handle, its settings and its health.
pub(crate) struct Engine {
    db: RwLock<Option<Arc<Redb>>>,
    /// Set by [`shut`](Engine::shut): no re-open after it.
    shut: std::sync::atomic::AtomicBool,
    /// Signalled when a re-open finishes (readers wait for it briefly instead of failing).
    reopened: (Mutex<()>, std::sync::Condvar),
    /// Held by whoever is re-opening the engine.
    reopening: Mutex<()>,
    path: PathBuf,
    options: EmbeddedOptions,
    health: Mutex<StoreHealth>,
    /// What the open found damaged, if it did.
    damaged: Mutex<Option<String>>,
    /// The commit log, emptied at each open (its frames re-applied) and at each checkpoint.
    log: Mutex<Option<CommitLog>>,
}

/// Why an open did not give an engine.
enum Opened {
    /// The engine found the file damaged (what it found).
    Damaged(String),
    /// Any other reason (missing directory, disk full, file in use).
    Failed(Error),
}

/// How the reason of a damaged store starts.
pub(crate) const DAMAGED: &str = "the store is damaged:";

/// How long a reader waits for a re-open in progress before failing.
const REOPEN_WAIT: Duration = Duration::from_secs(2);

/// Free space the store keeps in reserve: below it, commits are refused as if the disk were
/// full (a commit may need several times its own size: copy-on-write pages, allocator state).
pub const FREE_SPACE_RESERVE_BYTES: u64 = 64 * 1024 * 1024;

impl Engine {
    /// Opens the engine at `path`; with `verify`, redb checks every page's checksum first (the
    /// reason is logged). A store the engine finds damaged is not an error here: the engine is
    /// left closed and the store `Failed`, with what was found ([`Engine::damaged`]).
    pub(crate) fn open(
        path: PathBuf,
        options: EmbeddedOptions,
        verify: Option<&str>,
    ) -> Result<Engine> {
        let engine = Engine {
            db: RwLock::new(None),
            shut: std::sync::atomic::AtomicBool::new(false),
            reopened: (Mutex::new(()), std::sync::Condvar::new()),
            reopening: Mutex::new(()),
            path,
            options,
            health: Mutex::new(StoreHealth::Healthy),
            damaged: Mutex::new(None),
            log: Mutex::new(None),
        };
        match engine.open_db(verify) {
            Ok(db) => {
                *engine.db.write().unwrap_or_else(|e| e.into_inner()) =
                    Some(Arc::new(Redb(Some(db))));
            }
            Err(Opened::Damaged(what)) => {
                let reason = format!(
                    "{DAMAGED} {}: {what}; stop the node and run `kairos check` (restore from a \
                     backup if it confirms the damage)",
                    engine.path.display()
                );
                *engine.damaged.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.clone());
                engine.set_health(StoreHealth::Failed { reason });
            }
            Err(Opened::Failed(e)) => return Err(e),
        }
        Ok(engine)
    }

    /// What the open found damaged, if it did.
    pub(crate) fn damaged(&self) -> Option<String> {
        self.damaged.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn open_db(&self, verify: Option<&str>) -> std::result::Result<redb::Database, Opened> {
        let mut builder = redb::Builder::new();
        builder.set_cache_size(self.options.cache_bytes);
        if let Some(why) = verify {
            tracing::info!(store = %self.path.display(), why, "verifying every page of the store");
            builder.set_check_integrity_on_open(true);
        }
        // A full repair (after a crash without quick repair) verifies every page too: its
        // progress is logged, a tenth at a time.
        let shown = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let store = self.path.display().to_string();
        builder.set_repair_callback(move |s: &mut redb::RepairSession| {
            let tenth = (s.progress() * 10.0) as u32;
            if shown.fetch_max(tenth + 1, Ordering::Relaxed) <= tenth {
                tracing::info!(store, percent = tenth * 10, "repairing and verifying the store");
            }
        });
        let started = std::time::Instant::now();
        let injected = (&self.options.disk_writes_fail, &self.options.engine_panics);
        let opened = contain(|| match injected {
            (None, None) => builder.create(&self.path),
            (full, panics) => {
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&self.path)
                    .map_err(redb::StorageError::from)?;
                let inner = redb::backends::FileBackend::new(file)?;
                let off = || Arc::new(AtomicBool::new(false));
                builder.create_with_backend(FaultyDisk {
                    inner,
                    full: full.clone().unwrap_or_else(off),
                    panics: panics.clone().unwrap_or_else(off),
                })
            }
        });
        let opened = match opened {
            Ok(r) => r,
            Err(panic) => {
                return Err(Opened::Damaged(format!("the engine failed reading it ({panic})")));
            }
        };
        let db = opened.map_err(|e| self.open_failed(e))?;
        if verify.is_some() {
            tracing::info!(
                store = %self.path.display(),
                seconds = started.elapsed().as_secs_f64(),
                "every page of the store verified"
            );
        }
        match contain(|| self.recover(&db)) {
            Ok(recovered) => recovered?,
            Err(panic) => {
                return Err(Opened::Damaged(format!(
                    "the engine failed replaying the log ({panic})"
                )));
            }
        }
        Ok(db)
    }

    /// Why redb did not open the file.
    fn open_failed(&self, e: redb::DatabaseError) -> Opened {
        match &e {
            redb::DatabaseError::Storage(redb::StorageError::Io(io)) if is_disk_full(io) => {
                Opened::Failed(Error::StorageFull(format!(
                    "cannot open {}: the disk is full ({io})",
                    self.path.display()
                )))
            }
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(why)) => {
                Opened::Damaged(why.clone())
            }
            redb::DatabaseError::Storage(redb::StorageError::Io(io)) if is_read_past_end(io) => {
                Opened::Damaged(format!("a read past the end of the file ({io})"))
            }
            _ => {
                Opened::Failed(Error::Storage(format!("cannot open {}: {e}", self.path.display())))
            }
        }
    }

    /// Re-applies the commit log's frames above the engine's durable version in one durable
    /// commit, then empties the log (module [`log`]). Run by every open: a re-open after an
    /// I/O error loses redb's unsynced commits, which the log holds.
    fn recover(&self, db: &redb::Database) -> std::result::Result<(), Opened> {
        let mut slot = self.log.lock().unwrap_or_else(|e| e.into_inner());
        *slot = None;
        let bytes = log::read_file(&self.path).map_err(Opened::Failed)?;
        let failed = |e: redb::Error| Opened::Failed(classify("replay the commit log", e));
        let durable = log::durable_version(db).map_err(failed)?;
        let read = log::read_frames(&bytes, durable)
            .map_err(|why| Opened::Damaged(log::damaged_reason(&self.path, &why)))?;
        let frames: Vec<&log::Frame<'_>> =
            read.frames.iter().filter(|f| f.version > durable).collect();
        if let Some(last) = frames.last() {
            let mut w = db.begin_write().map_err(|e| failed(e.into()))?;
            w.set_quick_repair(true);
            {
                let mut table = w.open_table(DATA).map_err(|e| failed(e.into()))?;
                let mut target = TableTarget { table: &mut table };
                for f in &frames {
                    log::apply_frame(f, &mut target).map_err(|e| match e {
                        Error::Storage(m) if m.starts_with("the commit log") => Opened::Damaged(m),
                        other => Opened::Failed(other),
                    })?;
                }
                let mut meta = w.open_table(META).map_err(|e| failed(e.into()))?;
                meta.insert(META_VERSION, last.version).map_err(|e| failed(e.into()))?;
            }
            w.commit().map_err(|e| failed(e.into()))?;
        }
        if !read.frames.is_empty() || read.dropped_bytes > 0 {
            tracing::info!(
                store = %self.path.display(),
                replayed = frames.len(),
                skipped = read.frames.len() - frames.len(),
                dropped_bytes = read.dropped_bytes,
                "commit log recovered"
            );
        }
        let faults = log::Faults {
            full: self.options.disk_writes_fail.clone(),
            panics: self.options.engine_panics.clone(),
        };
        *slot = Some(log::open_empty(&self.path, faults).map_err(Opened::Failed)?);
        Ok(())
    }

    /// The commit log (`None` while the engine is closed).
    pub(crate) fn log(&self) -> std::sync::MutexGuard<'_, Option<CommitLog>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The store's settings.
    pub(crate) fn options(&self) -> &EmbeddedOptions {
        &self.options
    }

    /// The engine, or why it is not available now. While a re-open is under way (milliseconds,
    /// once the last transactions of the failed batch let go), waits for it up to 2 s.
    pub(crate) fn current(&self) -> Result<Arc<Redb>> {
        let deadline = std::time::Instant::now() + REOPEN_WAIT;
        loop {
            if self.shut.load(Ordering::Acquire) {
                return Err(Error::DatabaseClosed);
            }
            if let StoreHealth::Failed { reason } = self.health() {
                return Err(Error::Storage(reason));
            }
            if let Some(db) = &*self.db.read().unwrap_or_else(|e| e.into_inner()) {
                return Ok(db.clone());
            }
            // Closed after an I/O error and not re-opened yet (opening needed space too): try
            // once more now, so reads and the next commit find it open when space is back.
            if let Ok(_only_one) = self.reopening.try_lock()
                && self.db.read().unwrap_or_else(|e| e.into_inner()).is_none()
            {
                match self.open_db(None) {
                    Ok(db) => {
                        *self.db.write().unwrap_or_else(|e| e.into_inner()) =
                            Some(Arc::new(Redb(Some(db))));
                        continue;
                    }
                    // Still no room to open: say so now rather than wait.
                    Err(Opened::Failed(e @ Error::StorageFull(_))) => return Err(e),
                    Err(Opened::Damaged(what)) => return Err(self.fail_damaged(&what)),
                    Err(_) => {}
                }
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(Error::Storage("the store is re-opening after a write error".into()));
            }
            let guard = self.reopened.0.lock().unwrap_or_else(|e| e.into_inner());
            let _ = self
                .reopened
                .1
                .wait_timeout(guard, (deadline - now).min(Duration::from_millis(50)));
        }
    }

    /// Whether the file system has room for a commit: `StorageFull` below the reserve (or while
    /// the test fault is set).
    pub(crate) fn check_space(&self) -> Result<()> {
        if self.options.disk_full.as_ref().is_some_and(|f| f.load(Ordering::SeqCst)) {
            return Err(Error::StorageFull(format!(
                "the disk holding {} is full (injected fault)",
                self.path.display()
            )));
        }
        match free_bytes(&self.path) {
            Some(free) if free < FREE_SPACE_RESERVE_BYTES => Err(Error::StorageFull(format!(
                "the disk holding {} is full: {} MiB free, the store keeps {} MiB in reserve",
                self.path.display(),
                free / (1024 * 1024),
                FREE_SPACE_RESERVE_BYTES / (1024 * 1024)
            ))),
            _ => Ok(()),
        }
    }

    /// Marks the store failed because the engine found it damaged; the error to answer with.
    pub(crate) fn fail_damaged(&self, what: &str) -> Error {
        let reason = format!(
            "{DAMAGED} {}: {what}; stop the node and run `kairos check`",
            self.path.display()
        );
        self.set_health(StoreHealth::Failed { reason: reason.clone() });
        Error::Storage(reason)
    }

    /// Lets go of the engine for good (the store is closing). Returns whether the engine is
    /// closed (its last user let go within a second) and healthy, so that a clean shutdown can
    /// be recorded; if readers still hold it, redb closes the file when the last one lets go.
    pub(crate) fn shut(&self) -> bool {
        self.shut.store(true, Ordering::Release);
        let mut db = self.db.write().unwrap_or_else(|e| e.into_inner()).take();
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        let closed = loop {
            match db.map(Arc::try_unwrap) {
                None => break false,
                Some(Ok(redb)) => break redb.close(),
                Some(Err(shared)) if std::time::Instant::now() < deadline => {
                    db = Some(shared);
                    std::thread::sleep(Duration::from_millis(10));
                }
                Some(Err(_)) => break false,
            }
        };
        closed && matches!(self.health(), StoreHealth::Healthy)
    }

    /// Whether the engine is open (not waiting for a re-open).
    pub(crate) fn is_open(&self) -> bool {
        self.db.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// The store's health.
    pub(crate) fn health(&self) -> StoreHealth {
        self.health.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn set_health(&self, h: StoreHealth) {
        let mut cur = self.health.lock().unwrap_or_else(|e| e.into_inner());
        // Failed is final.
        if !matches!(*cur, StoreHealth::Failed { .. }) {
            *cur = h;
        }
    }

    /// Re-opens the engine after an I/O error: lets go of the handle, waits (about a second at
    /// most) for the file to be released by the last readers, and opens it again. Nothing was
    /// committed since the last published version, so the store is where it was. On failure
    /// the engine stays closed and the next reader or batch tries again.
    pub(crate) fn reopen(&self) -> Result<()> {
        let _only_one = self.reopening.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.db.write().unwrap_or_else(|e| e.into_inner()).take();
        drop(old);
        let mut pause = Duration::from_millis(5);
        let mut last = None;
        for _ in 0..12 {
            match self.open_db(None) {
                Ok(db) => {
                    *self.db.write().unwrap_or_else(|e| e.into_inner()) =
                        Some(Arc::new(Redb(Some(db))));
                    let _guard = self.reopened.0.lock().unwrap_or_else(|e| e.into_inner());
                    self.reopened.1.notify_all();
                    return Ok(());
                }
                // Opening needs space too: no use waiting here, the next batch tries again.
                Err(Opened::Failed(e @ Error::StorageFull(_))) => return Err(e),
                Err(Opened::Damaged(what)) => return Err(self.fail_damaged(&what)),
                // Most likely the last readers of the old handle still hold the file.
                Err(Opened::Failed(e)) => last = Some(e),
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(200));
        }
        Err(last.unwrap_or_else(|| Error::Storage("the store could not be re-opened".into())))
    }
}

/// Bytes available to the store's user on the file system holding `path` (its directory when
/// the file does not exist yet); `None` if the system does not say.
fn free_bytes(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let dir = if path.exists() { path } else { path.parent()? };
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter that
    // statvfs fills on success; nothing is read from it on failure.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| (st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// The redb handle. Dropping redb after a panic inside it panics again (poisoned locks): the
/// drop is contained, so closing a failed store releases its file instead of aborting.
pub(crate) struct Redb(Option<redb::Database>);

impl std::ops::Deref for Redb {
    type Target = redb::Database;
    fn deref(&self) -> &redb::Database {
        self.0.as_ref().expect("present until dropped")
    }
}

impl Redb {
    /// Closes the database now; whether it closed cleanly (no panic, no error, nothing left for
    /// the next open to repair).
    fn close(mut self) -> bool {
        let Some(db) = self.0.take() else { return false };
        matches!(contain(move || db.close()), Ok(Ok(())))
    }
}

impl Drop for Redb {
    fn drop(&mut self) {
        if let Some(db) = self.0.take() {
            let _ = contain(move || drop(db));
        }
    }
}

/// A file backend whose writes fail with ENOSPC while `full` is set: the disk-full fault the
/// tests inject (the real thing needs a small file system the test cannot always mount).
#[derive(Debug)]
struct FaultyDisk {
    inner: redb::backends::FileBackend,
    full: Arc<AtomicBool>,
    panics: Arc<AtomicBool>,
}

impl FaultyDisk {
    fn check(&self) -> io::Result<()> {
        if self.panics.load(Ordering::SeqCst) {
            // What a damaged file did to redb in the field: a panic deep in the engine.
            panic!("injected engine panic (a damaged page)");
        }
        if self.full.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(28));
        }
        Ok(())
    }
}

impl StorageBackend for FaultyDisk {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        if len > self.inner.len()? {
            self.check()?;
        }
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.check()?;
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check()?;
        self.inner.write(offset, data)
    }
    fn close(&self) -> io::Result<()> {
        self.inner.close()
    }
    fn try_lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_range(s, e)
    }
    fn try_lock_shared_range(
        &self,
        s: Bound<u64>,
        e: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_shared_range(s, e)
    }
    fn lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.lock_range(s, e)
    }
    fn lock_shared_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.lock_shared_range(s, e)
    }
    fn unlock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.unlock_range(s, e)
    }
    fn query_lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.inner.query_lock_range(s, e)
    }
}
