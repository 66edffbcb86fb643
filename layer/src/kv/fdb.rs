//! The `fdb` backend: a thin adapter from [`KvDatabase`] / [`KvTransaction`] to FoundationDB
//! through the `foundationdb` crate (client API version 730, FoundationDB 7.3).
//!
//! FoundationDB already has the semantics the trait describes (serializable OCC, snapshot
//! reads, read-your-writes, atomic ops, versionstamps, watches, the 5 s window), so this file
//! mostly forwards calls. What it adds:
//!
//! - **Limits checked up front** with [`limits`](super::limits) (key, value, range, versionstamp
//!   offset, and the transaction size counted exactly as the local backends count it), so every
//!   backend rejects the same input with the same error, synchronously. FoundationDB's own
//!   checks stay behind as a backstop (it would report most of them only at commit).
//! - **The read version is requested at [`begin`](KvDatabase::begin)** (without waiting for it),
//!   as the local backends take their snapshot there; FoundationDB would otherwise fetch it
//!   lazily at the first read or at commit.
//! - **Use after commit** fails with `TransactionCancelled`, as on the local backends
//!   (`foundationdb::Transaction::commit` consumes the transaction); so does use after
//!   `on_error`, which hands the transaction to FoundationDB's own `on_error`.
//! - **`close`**: new transactions and commits fail with `DatabaseClosed` and pending watches
//!   resolve with `DatabaseClosed` (FoundationDB has no notion of closing a database handle).
//! - **Errors** are mapped from FoundationDB codes to [`Error`] (see [`fdb_error`]).
//! - **Retries back off the FoundationDB way**: [`KvTransaction::on_error`] hands a retryable
//!   error to FoundationDB's own `on_error` (its delays for `not_committed`,
//!   `commit_unknown_result`, `transaction_too_old`, `future_version`, `process_behind`,
//!   throttling...), so [`Database::run`] waits for it instead of its generic back-off.
//!
//! # Linking and the network thread
//! Building with `--features fdb` links **`libfdb_c`** (the FoundationDB client library,
//! package `foundationdb-clients` 7.3 or newer); `cargo check` only needs libclang (bindgen),
//! linking and running need the library. The FoundationDB network thread is started the
//! first time a database is opened. FoundationDB allows selecting the API version once per
//! process, so nothing else in the process may boot the `foundationdb` crate.
//!
//! **Stop the network before the process exits**: call [`shutdown_network`] once the process is
//! done with FoundationDB, or keep a [`NetworkGuard`] in `main` (it calls it when dropped, on
//! every way out, errors and panics included). A network thread still running while the
//! process exits races libfdb_c's static destructors and can crash the process at exit.
//!
//! `shutdown_network` closes every database still open (new transactions, commits and reads
//! fail with `DatabaseClosed`, pending watches resolve with it), then stops and joins the
//! network thread. **It is final**: FoundationDB cannot start its network twice in a process,
//! so [`FdbDatabase::open`] fails from then on (`network_cannot_be_restarted`, 2025). Call it
//! after the work is drained: an FDB operation already in flight when the network stops never
//! completes.
//!
//! As a safety net, booting the network also registers `shutdown_network` with the C
//! library's `atexit`, so a process that exits normally without calling it (a test binary:
//! libtest has no end-of-run hook) still stops the thread before those destructors. Prefer the
//! explicit call all the same: it runs where the program chooses, after draining its work, not
//! while other threads may still be using FoundationDB. (An abort or a kill runs neither, and
//! needs neither: no destructor runs.)
//!
//! # Tests
//! The fdb tests of the KV conformance suite (compiled with `--features fdb`) are `#[ignore]`d,
//! so `cargo test` reports them as ignored, not passed (they need `libfdb_c` and a cluster). They **clear the whole normal keyspace**
//! before each test, so point them at a throwaway cluster only, and run them with `--ignored`:
//!
//! ```text
//! FDB_CLUSTER_FILE=/path/to/throwaway/fdb.cluster \
//!     cargo test -p kairos-layer --features fdb --test conformance -- --ignored
//! ```
//!
//! Run that way without `FDB_CLUSTER_FILE`, they fail (they do not pass silently).
//!
//! # Differences from the local backends
//! - Once a transaction is older than 5 s, FoundationDB fails its reads and its commit with
//!   `TransactionTooOld`, but writes (`set`, `clear`, ...) are buffered client-side and do
//!   not fail; the local backends fail every operation. The window is FoundationDB's own
//!   (measured in versions, about 5 s of real time), not the injected clock.
//! - Keys from `\xff` (the system keyspace) are refused by FoundationDB (`key_outside_legal_range`,
//!   2004, passed through as [`Error::Other`]); the local backends accept them.
//! - A watch whose transaction is dropped without committing fails with `TransactionCancelled`
//!   (FoundationDB's behaviour), where the local backends report `DatabaseClosed`.
//! - When FoundationDB itself reports a key, value or transaction size error, it does not say
//!   the size: `size` is then this adapter's running count (transaction) or 0 (key, value).
//! - FoundationDB grows its conflict back-off per transaction object, across the resets its
//!   `on_error` does. [`Database::run`] begins a new transaction for each retry, so each
//!   `on_error` waits FoundationDB's *initial* (jittered) delay for the error rather than a
//!   growing one; the loop stays bounded by `RunOptions::retry_limit` and `deadline`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;
use foundationdb::api::{FdbApiBuilder, NetworkAutoStop};
use foundationdb::options::{ConflictRangeType, MutationType, StreamingMode};
use foundationdb::{FdbError, FdbResult, KeySelector, TransactionCommitError};

use super::error::{Error, Result};
use super::limits::{
    KEY_BYTES_MAX, MUTATION_OVERHEAD_BYTES, TRANSACTION_AGE_MAX_MS, TRANSACTION_BYTES_MAX,
    VALUE_BYTES_MAX, VERSIONSTAMP_BYTES, check_key, check_range, check_value,
    check_versionstamp_offset,
};
use super::{
    CommitInfo, Database, KeyValue, KvDatabase, KvTransaction, RangeOption, Versionstamp, Watch,
};
use crate::env::{BoxFuture, Rng, SharedClock};

/// The FoundationDB network of this process. FoundationDB can select its API version and
/// start its network once per process, so the states only move forward: `NotBooted` to
/// `Running` or `Failed` (first open), `NotBooted` or `Running` to `Stopped` (shutdown).
enum Network {
    /// No database opened yet.
    NotBooted,
    /// The network thread runs. `stop` stops and joins it when dropped; `databases` are the
    /// handles opened on it, so `shutdown_network` can close those still alive.
    Running { stop: NetworkAutoStop, databases: Vec<Weak<Shared>> },
    /// The client library refused to start; it cannot be asked again.
    Failed(FdbError),
    /// `shutdown_network` ran: the network cannot be restarted in this process.
    Stopped,
}

static NETWORK: Mutex<Network> = Mutex::new(Network::NotBooted);

/// Set (for good) by `shutdown_network`, before it stops the network: operations on
/// transactions still alive then fail with `DatabaseClosed` instead of waiting forever for a
/// network thread that is gone.
static NETWORK_STOPPED: AtomicBool = AtomicBool::new(false);

/// FoundationDB's `network_cannot_be_restarted`.
const NETWORK_CANNOT_BE_RESTARTED: i32 = 2025;

fn lock_network() -> MutexGuard<'static, Network> {
    // A panic while holding the lock leaves a consistent state (each transition is one
    // assignment), so a poisoned lock is still usable.
    NETWORK.lock().unwrap_or_else(|e| e.into_inner())
}

impl Network {
    /// The running network's list of databases, booting the network on first use.
    fn running(&mut self) -> Result<&mut Vec<Weak<Shared>>> {
        if let Network::NotBooted = self {
            *self = match boot() {
                Ok(stop) => {
                    // SAFETY: `atexit` only records the pointer of a plain `extern "C"` function
                    // that takes no argument and lets no panic unwind out of it. Registered
                    // after libfdb_c was loaded, so it runs before the library's destructors.
                    // Failing to register (out of slots) leaves the explicit call as the way.
                    let _ = unsafe { atexit(shutdown_network_at_exit) };
                    Network::Running { stop, databases: Vec::new() }
                }
                Err(e) => Network::Failed(e),
            };
        }
        match self {
            Network::Running { databases, .. } => Ok(databases),
            Network::Failed(e) => Err(fdb_error(*e)),
            // (`NotBooted` cannot be left here: it was replaced above.)
            Network::Stopped | Network::NotBooted => Err(Error::Other {
                code: NETWORK_CANNOT_BE_RESTARTED,
                message: "network_cannot_be_restarted: the FoundationDB network was stopped \
                          (fdb::shutdown_network) and cannot be started again in this process"
                    .into(),
                retryable: false,
                maybe_committed: false,
            }),
        }
    }
}

/// Selects the API version and starts the network thread.
fn boot() -> FdbResult<NetworkAutoStop> {
    let builder = FdbApiBuilder::default().build()?;
    // SAFETY: `boot` is unsafe because the returned guard must be dropped (stopping and
    // joining the network thread) before the process exits; an abort needs nothing. It is
    // kept in `NETWORK` and dropped by `shutdown_network`: called by the program (the
    // `kairos` binary holds a `NetworkGuard`) or, failing that, by the `atexit` handler
    // `running` registers right after this boot.
    unsafe { builder.boot() }
}

/// Stops the FoundationDB network thread for good; call it once the process is done with
/// FoundationDB, before it exits (or keep a [`NetworkGuard`]).
///
/// Closes every [`FdbDatabase`] still open (see [`KvDatabase::close`]; operations on their
/// remaining transactions fail with `DatabaseClosed` too), then stops the network thread and
/// waits for it to end. Afterwards [`FdbDatabase::open`] fails: FoundationDB cannot restart its
/// network in a process. FDB operations already in flight never complete, so drain the work
/// first. Idempotent; a no-op apart from refusing later opens if FoundationDB was never
/// booted. Blocks for as long as the network thread takes to wind down (it does not wait
/// for the cluster); do not call it from a FoundationDB callback.
pub fn shutdown_network() {
    let mut network = lock_network();
    match std::mem::replace(&mut *network, Network::Stopped) {
        Network::Running { stop, databases } => {
            NETWORK_STOPPED.store(true, Ordering::Release);
            for shared in databases.iter().filter_map(Weak::upgrade) {
                shared.close();
            }
            // `NetworkAutoStop::drop`: `fdb_stop_network`, then joins the network thread. The
            // lock stays held, so a concurrent `open` waits and then sees `Stopped`.
            drop(stop);
        }
        // The boot error stays the answer to later opens.
        failed @ Network::Failed(_) => *network = failed,
        Network::NotBooted | Network::Stopped => {}
    }
}

unsafe extern "C" {
    /// The C library's `atexit` (C99): `exit` runs the registered functions in reverse order
    /// of registration, interleaved with C++ static destructors (`__cxa_atexit`), and before
    /// the destructors of shared libraries loaded earlier.
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

/// The safety net for processes that never call [`shutdown_network`]: registered with
/// `atexit` when the network boots, so `exit` (return from `main`, `std::process::exit`,
/// the end of a test binary) stops the network thread before libfdb_c's static destructors
/// run. A no-op when the program already stopped it.
extern "C" fn shutdown_network_at_exit() {
    // A panic must not unwind into the C library (it would abort anyway).
    let _ = std::panic::catch_unwind(shutdown_network);
}

/// Calls [`shutdown_network`] when dropped. Keep one alive in `main` (or whatever owns the
/// program's lifetime), declared before any database is opened, so the network thread is
/// stopped on every way out: normal return, early error return, or panic.
#[must_use = "the network is stopped when the guard is dropped"]
#[derive(Debug, Default)]
pub struct NetworkGuard {
    _private: (),
}

impl NetworkGuard {
    /// A guard; creating it does not boot anything.
    pub fn new() -> Self {
        NetworkGuard::default()
    }
}

impl Drop for NetworkGuard {
    fn drop(&mut self) {
        shutdown_network();
    }
}

/// Maps a FoundationDB error to the KV layer's [`Error`] (same codes; sizes FoundationDB does
/// not report are 0).
pub fn fdb_error(e: FdbError) -> Error {
    match e.code() {
        1007 => Error::TransactionTooOld { window_ms: TRANSACTION_AGE_MAX_MS },
        1020 => Error::NotCommitted,
        1021 => Error::CommitUnknownResult,
        1025 => Error::TransactionCancelled("transaction cancelled by FoundationDB"),
        1031 => Error::TimedOut,
        1036 => Error::AccessedUnreadable,
        2000 => Error::InvalidOperation(e.message().to_string()),
        2005 => Error::InvertedRange,
        2101 => Error::TransactionTooLarge { size: 0, limit: TRANSACTION_BYTES_MAX },
        2102 => Error::KeyTooLarge { size: 0, limit: KEY_BYTES_MAX },
        2103 => Error::ValueTooLarge { size: 0, limit: VALUE_BYTES_MAX },
        code => Error::Other {
            code,
            message: e.message().to_string(),
            retryable: e.is_retryable(),
            maybe_committed: e.is_maybe_committed(),
        },
    }
}

const USED_AFTER_COMMIT: &str = "transaction used after commit";
const USED_AFTER_ON_ERROR: &str = "transaction used after on_error";

/// Codes from here on are Kairos's own (see [`super::error`]); FoundationDB knows none.
const KAIROS_CODES_FROM: i32 = 9000;

struct Shared {
    db: foundationdb::Database,
    cluster_file: Option<String>,
    closed: AtomicBool,
    /// Flips to `true` on `close`; pending watches and `on_error` back-offs listen to it.
    close_signal: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.close_signal.send_replace(true);
    }
}

/// The FoundationDB backend. Clone it to share one database handle.
#[derive(Clone)]
pub struct FdbDatabase {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FdbDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdbDatabase").field("cluster_file", &self.shared.cluster_file).finish()
    }
}

impl FdbDatabase {
    /// Opens the database of the cluster file `cluster_file` (`None`: FoundationDB's default,
    /// `FDB_CLUSTER_FILE` or the platform's default path), booting the network thread on first
    /// use. Does not wait for the cluster to be reachable: the first transaction does.
    pub fn open(cluster_file: Option<&str>) -> Result<Self> {
        if cluster_file.is_some_and(|p| p.contains('\0')) {
            return Err(Error::InvalidOperation("cluster file path contains a NUL byte".into()));
        }
        // Held until the database is registered, so `shutdown_network` cannot stop the
        // network between the check and the registration (and miss closing this database).
        let mut network = lock_network();
        let databases = network.running()?;
        let db = foundationdb::Database::new(cluster_file).map_err(fdb_error)?;
        let (close_signal, _) = tokio::sync::watch::channel(false);
        let shared = Arc::new(Shared {
            db,
            cluster_file: cluster_file.map(str::to_owned),
            closed: AtomicBool::new(false),
            close_signal,
        });
        databases.retain(|w| w.strong_count() > 0);
        databases.push(Arc::downgrade(&shared));
        Ok(FdbDatabase { shared })
    }

    /// Opens the database of `cluster_file` and wraps it in a [`Database`] handle; `clock`
    /// and `rng` drive the retry loop's back-off.
    pub fn open_database(
        cluster_file: Option<&str>,
        clock: SharedClock,
        rng: Rng,
    ) -> Result<Database> {
        let db = FdbDatabase::open(cluster_file)?;
        Ok(Database::new(Arc::new(db), clock, rng))
    }

    /// The cluster file this database was opened with (`None`: FoundationDB's default).
    pub fn cluster_file(&self) -> Option<&str> {
        self.shared.cluster_file.as_deref()
    }
}

impl KvDatabase for FdbDatabase {
    fn begin(&self) -> Result<Arc<dyn KvTransaction>> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(Error::DatabaseClosed);
        }
        let trx = self.shared.db.create_trx().map_err(fdb_error)?;
        // Start fetching the read version now, so the transaction reads the database as of
        // `begin` (like the local backends' snapshot), not as of its first read. Reads and
        // the commit use the same version; the future is only kept so the request stays alive.
        let read_version: BoxFuture<'static, _> = Box::pin(trx.get_read_version());
        Ok(Arc::new(FdbTransaction {
            state: Mutex::new(State {
                read_version: Some(read_version),
                trx: Some(trx),
                failed_commit: None,
                retried: false,
                size_bytes: 0,
                wrote: false,
            }),
            shared: self.shared.clone(),
        }))
    }

    fn backend_name(&self) -> &'static str {
        "fdb"
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move { self.shared.close() })
    }
}

struct State {
    /// The read version requested at `begin` (dropped before the transaction).
    read_version: Option<BoxFuture<'static, std::result::Result<i64, FdbError>>>,
    /// `None` once committed (or handed to `on_error`).
    trx: Option<foundationdb::Transaction>,
    /// A failed commit, which holds the transaction `commit` consumed: `on_error` needs it
    /// for FoundationDB's back-off.
    failed_commit: Option<TransactionCommitError>,
    /// Whether `on_error` took the transaction (for the use-after error's message).
    retried: bool,
    /// Mutations and conflict ranges so far, counted as the local backends count them.
    size_bytes: usize,
    /// Whether any mutation was issued (a versionstamp is then requested at commit).
    wrote: bool,
}

/// A transaction of the [`FdbDatabase`] backend: a `foundationdb::Transaction` behind a mutex
/// (the trait's methods take `&self`; FoundationDB's commit consumes the transaction).
pub struct FdbTransaction {
    // Dropped before `shared`, so the transaction goes before its database handle.
    state: Mutex<State>,
    shared: Arc<Shared>,
}

impl FdbTransaction {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the open transaction after counting `grow` bytes toward the transaction
    /// size; fails if the transaction was committed or would exceed the size limit.
    fn with_trx<T>(
        &self,
        grow: usize,
        write: bool,
        f: impl FnOnce(&foundationdb::Transaction) -> T,
    ) -> Result<T> {
        if NETWORK_STOPPED.load(Ordering::Acquire) {
            // The network thread is gone: an FDB call would never complete.
            return Err(Error::DatabaseClosed);
        }
        let mut st = self.lock();
        let State { trx, size_bytes, wrote, retried, .. } = &mut *st;
        let used_after = if *retried { USED_AFTER_ON_ERROR } else { USED_AFTER_COMMIT };
        let trx = trx.as_ref().ok_or(Error::TransactionCancelled(used_after))?;
        let size = *size_bytes + grow;
        if size > TRANSACTION_BYTES_MAX {
            return Err(Error::TransactionTooLarge { size, limit: TRANSACTION_BYTES_MAX });
        }
        *size_bytes = size;
        *wrote |= write;
        Ok(f(trx))
    }

    /// Counts a range read's conflict range toward the transaction size.
    fn grow(&self, bytes: usize) -> Result<()> {
        let mut st = self.lock();
        let size = st.size_bytes + bytes;
        if size > TRANSACTION_BYTES_MAX {
            return Err(Error::TransactionTooLarge { size, limit: TRANSACTION_BYTES_MAX });
        }
        st.size_bytes = size;
        Ok(())
    }

    /// Buffers a mutation on `key` (write conflict `[key, key\0)`) carrying `payload` bytes.
    fn mutate(
        &self,
        key: &[u8],
        payload: usize,
        f: impl FnOnce(&foundationdb::Transaction),
    ) -> Result<()> {
        let grow = 2 * key.len() + 1 + payload + MUTATION_OVERHEAD_BYTES;
        self.with_trx(grow, true, f)
    }
}

/// `bytes` followed by `offset` as 4 little-endian bytes: FoundationDB's (API >= 520)
/// encoding of a versionstamp position in a versionstamped key or value.
fn with_offset(bytes: &[u8], offset: usize) -> Result<Vec<u8>> {
    let offset = u32::try_from(offset)
        .map_err(|_| Error::InvalidOperation(format!("versionstamp offset {offset} too large")))?;
    let mut out = Vec::with_capacity(bytes.len() + 4);
    out.extend_from_slice(bytes);
    out.extend_from_slice(&offset.to_le_bytes());
    Ok(out)
}

impl KvTransaction for FdbTransaction {
    fn read_version(&self) -> BoxFuture<'_, Result<u64>> {
        Box::pin(async move {
            let fut = self.with_trx(0, false, |t| t.get_read_version())?;
            let v = fut.await.map_err(fdb_error)?;
            u64::try_from(v).map_err(|_| Error::Storage(format!("negative read version {v}")))
        })
    }

    fn get<'a>(&'a self, key: &'a [u8], snapshot: bool) -> BoxFuture<'a, Result<Option<Bytes>>> {
        Box::pin(async move {
            check_key(key)?;
            let conflict = if snapshot { 0 } else { 2 * key.len() + 1 };
            let fut = self.with_trx(conflict, false, |t| t.get(key, snapshot))?;
            let v = fut.await.map_err(fdb_error)?;
            Ok(v.map(|s| Bytes::copy_from_slice(&s)))
        })
    }

    fn get_range<'a>(
        &'a self,
        range: &'a RangeOption,
        snapshot: bool,
    ) -> BoxFuture<'a, Result<Vec<KeyValue>>> {
        Box::pin(async move {
            check_range(&range.begin, &range.end)?;
            self.with_trx(0, false, |_| ())?;
            if range.begin == range.end {
                return Ok(Vec::new());
            }
            let mut opt = foundationdb::RangeOption {
                begin: KeySelector::first_greater_or_equal(range.begin.as_slice()),
                end: KeySelector::first_greater_or_equal(range.end.as_slice()),
                limit: (range.limit != 0).then_some(range.limit),
                mode: StreamingMode::WantAll,
                reverse: range.reverse,
                ..Default::default()
            };
            let mut out: Vec<KeyValue> = Vec::new();
            // Fetch page after page until FoundationDB reports no more or the limit is reached.
            let mut iteration = 1;
            loop {
                let fut = self.with_trx(0, false, |t| t.get_range(&opt, iteration, snapshot))?;
                let page = fut.await.map_err(fdb_error)?;
                out.extend(page.iter().map(|kv| KeyValue {
                    key: Bytes::copy_from_slice(kv.key()),
                    value: Bytes::copy_from_slice(kv.value()),
                }));
                let Some(next) = opt.next_range(&page) else { break };
                opt = next;
                iteration += 1;
            }
            if range.limit != 0 {
                out.truncate(range.limit);
            }
            if !snapshot {
                // The conflict range FoundationDB adds: up to the last key returned when the
                // limit cut the read short, the whole range otherwise.
                let cut = range.limit != 0 && out.len() >= range.limit;
                let bytes = match (cut, out.last()) {
                    (true, Some(last)) if range.reverse => last.key.len() + range.end.len(),
                    (true, Some(last)) => range.begin.len() + last.key.len() + 1,
                    _ => range.begin.len() + range.end.len(),
                };
                self.grow(bytes)?;
            }
            Ok(out)
        })
    }

    fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        check_key(key)?;
        check_value(value)?;
        self.mutate(key, value.len(), |t| t.set(key, value))
    }

    fn clear(&self, key: &[u8]) -> Result<()> {
        check_key(key)?;
        self.mutate(key, 0, |t| t.clear(key))
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        check_range(begin, end)?;
        if begin == end {
            return self.with_trx(0, false, |_| ());
        }
        let grow = begin.len() + end.len() + MUTATION_OVERHEAD_BYTES;
        self.with_trx(grow, true, |t| t.clear_range(begin, end))
    }

    fn atomic_add(&self, key: &[u8], param: &[u8]) -> Result<()> {
        check_key(key)?;
        check_value(param)?;
        self.mutate(key, param.len(), |t| t.atomic_op(key, param, MutationType::Add))
    }

    fn set_versionstamped_key(&self, key: &[u8], offset: usize, value: &[u8]) -> Result<()> {
        check_key(key)?;
        check_value(value)?;
        check_versionstamp_offset(key, offset)?;
        let stamped = with_offset(key, offset)?;
        // No write conflict range is known before commit; counted as the local backends do.
        let grow = key.len() + value.len() + MUTATION_OVERHEAD_BYTES;
        self.with_trx(grow, true, |t| {
            t.atomic_op(&stamped, value, MutationType::SetVersionstampedKey)
        })
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8], offset: usize) -> Result<()> {
        check_key(key)?;
        check_value(value)?;
        check_versionstamp_offset(value, offset)?;
        let param = with_offset(value, offset)?;
        self.mutate(key, value.len(), |t| {
            t.atomic_op(key, &param, MutationType::SetVersionstampedValue)
        })
    }

    fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        check_range(begin, end)?;
        if begin == end {
            return self.with_trx(0, false, |_| ());
        }
        self.with_trx(begin.len() + end.len(), false, |t| {
            t.add_conflict_range(begin, end, ConflictRangeType::Read)
        })?
        .map_err(fdb_error)
    }

    fn watch(&self, key: &[u8]) -> Result<Watch> {
        check_key(key)?;
        let fut = self.with_trx(0, false, |t| t.watch(key))?;
        let mut closed = self.shared.close_signal.subscribe();
        Ok(Watch::new(Box::pin(async move {
            tokio::select! {
                biased;
                // Disabled (never fires) if the database handle is dropped without `close`.
                Ok(_) = closed.wait_for(|closed| *closed) => Err(Error::DatabaseClosed),
                r = fut => r.map_err(fdb_error),
            }
        })))
    }

    fn approximate_size(&self) -> usize {
        self.lock().size_bytes
    }

    fn commit(&self) -> BoxFuture<'_, Result<CommitInfo>> {
        Box::pin(async move {
            let (trx, size, wrote) = {
                let mut st = self.lock();
                let trx = st.trx.take().ok_or(Error::TransactionCancelled(USED_AFTER_COMMIT))?;
                st.read_version = None;
                (trx, st.size_bytes, st.wrote)
            };
            if self.shared.closed.load(Ordering::Acquire) {
                return Err(Error::DatabaseClosed);
            }
            // Must be requested before the commit; resolves once the commit succeeds.
            let stamp = wrote.then(|| trx.get_versionstamp());
            let committed = match trx.commit().await {
                Ok(committed) => committed,
                Err(failed) => {
                    let e = match fdb_error(*failed) {
                        Error::TransactionTooLarge { limit, .. } => {
                            Error::TransactionTooLarge { size, limit }
                        }
                        other => other,
                    };
                    // Keep the consumed transaction with its error for `on_error`.
                    self.lock().failed_commit = Some(failed);
                    return Err(e);
                }
            };
            let version = committed.committed_version().map_err(fdb_error)?;
            // -1: nothing was written (read-only), so no version and no versionstamp.
            let Ok(version) = u64::try_from(version) else {
                return Ok(CommitInfo::default());
            };
            let versionstamp = match stamp {
                Some(fut) => {
                    let s = fut.await.map_err(fdb_error)?;
                    let b = <[u8; VERSIONSTAMP_BYTES]>::try_from(&s[..]).map_err(|_| {
                        Error::Storage(format!(
                            "FoundationDB returned a {}-byte versionstamp",
                            s.len()
                        ))
                    })?;
                    Some(Versionstamp(b))
                }
                None => None,
            };
            drop(committed);
            Ok(CommitInfo { version: Some(version), versionstamp })
        })
    }

    /// FoundationDB's `on_error` on this transaction: its back-off for `error` (or its verdict
    /// that `error` is not retryable, returned as the error to give up with).
    ///
    /// `None` (the retry loop's own back-off) for Kairos-only errors (codes from 9000) and
    /// when there is no FoundationDB transaction left to ask (committed successfully, or
    /// already handed to `on_error`). Takes the transaction: using this one afterwards fails
    /// with `TransactionCancelled`; the caller retries with a new one.
    fn on_error<'a>(&'a self, error: &'a Error) -> Option<BoxFuture<'a, Result<()>>> {
        let code = error.code();
        if code >= KAIROS_CODES_FROM {
            return None;
        }
        // `FdbError` is nothing but its code and `fdb_error` keeps codes, so this is exactly
        // the error FoundationDB reported when `error` came from this transaction.
        let fdb_err = FdbError::from_code(code);
        let backoff: BoxFuture<'static, FdbResult<foundationdb::Transaction>> = {
            let mut st = self.lock();
            // The pending read-version request goes before its transaction.
            st.read_version = None;
            if let Some(trx) = st.trx.take() {
                // Failed before the commit (a read, or the closure's own error).
                st.retried = true;
                Box::pin(trx.on_error(fdb_err))
            } else if let Some(failed) = st.failed_commit.take() {
                st.retried = true;
                if failed.code() == code {
                    // The commit's own error: FoundationDB's intended path.
                    Box::pin(failed.on_error())
                } else {
                    // The loop is handling another error than the commit's (the closure
                    // committed itself and then failed otherwise): back off for that one.
                    Box::pin(failed.reset().on_error(fdb_err))
                }
            } else {
                return None;
            }
        };
        let mut closed = self.shared.close_signal.subscribe();
        Some(Box::pin(async move {
            tokio::select! {
                biased;
                // Closing the database ends the wait: the retry would fail anyway.
                Ok(_) = closed.wait_for(|closed| *closed) => Err(Error::DatabaseClosed),
                // `Ok` carries the reset transaction; the retry loop begins a new one, so it
                // is dropped. `Err` is FoundationDB's "not retryable" (usually `error` again).
                r = backoff => r.map(drop).map_err(fdb_error),
            }
        }))
    }
}
