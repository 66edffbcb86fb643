//! The transaction engine shared by the memory and embedded backends: read-your-writes over a
//! read snapshot, buffered mutations, conflict ranges, size and age limits. A backend supplies
//! snapshots and a commit path ([`LocalStore`]); both use the same [`resolver::Resolver`].
//! The postgres backend shares the client side ([`buffer`]), the mutations, the resolver (for
//! conflicts inside one commit batch) and the watch registry.

pub(crate) mod buffer;
pub(crate) mod counts;
pub(crate) mod mutation;
pub(crate) mod resolver;
pub(crate) mod watch;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;

use self::buffer::{RangeMerge, WriteBuffer, unreadable_watch_value};
use self::mutation::Mutation;
use self::resolver::KeyRange;
use self::watch::{WatchSender, watch_pair};
use super::error::{Error, Result};
use super::limits::{TRANSACTION_AGE_MAX_MS, check_key, check_range};
use super::{CommitInfo, KeyValue, KvTransaction, RangeOption, Watch};
use crate::env::{BoxFuture, SharedClock, Timestamp};

/// A consistent read view at one version.
pub(crate) trait Snapshot: Send + Sync {
    fn version(&self) -> u64;
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>>;
    /// Visits the pairs of `[begin, end)` in order (descending if `reverse`) until `visit`
    /// returns false.
    fn scan(
        &self,
        begin: &[u8],
        end: &[u8],
        reverse: bool,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()>;
}

/// Read versions of live transactions (a lower bound each), so the resolver and the MVCC
/// store forget history no live transaction can need — in practice milliseconds of it, not
/// the whole 5 s window.
#[derive(Debug, Default)]
pub(crate) struct ActiveReads {
    versions: Mutex<BTreeMap<u64, usize>>,
}

impl ActiveReads {
    pub(crate) fn enter(&self, v: u64) {
        *self.versions.lock().unwrap_or_else(|e| e.into_inner()).entry(v).or_default() += 1;
    }

    pub(crate) fn exit(&self, v: u64) {
        let mut m = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = m.get_mut(&v) {
            *c -= 1;
            if *c == 0 {
                m.remove(&v);
            }
        }
    }

    /// History at or below this version is needed by no live transaction (and by no later
    /// one, whose snapshot is at least `current`).
    pub(crate) fn floor(&self, current: u64) -> u64 {
        let m = self.versions.lock().unwrap_or_else(|e| e.into_inner());
        m.first_key_value().map_or(current, |(v, _)| (*v).min(current))
    }
}

/// What the memory and embedded backends provide to the shared transaction engine.
pub(crate) trait LocalStore: Send + Sync + 'static {
    fn clock(&self) -> &SharedClock;
    /// Live transactions' read versions.
    fn active(&self) -> &ActiveReads;
    /// A version no higher than the next snapshot's (the last one published as committed).
    fn published_version(&self) -> u64;
    /// A snapshot at the latest committed (and, for embedded, durable) version.
    fn snapshot(&self) -> Result<Arc<dyn Snapshot>>;
    /// Resolves and applies a commit with at least one mutation.
    fn commit(&self, req: CommitRequest) -> BoxFuture<'static, Result<CommitInfo>>;
    /// Registers a watch expecting `expected` against the latest committed value.
    fn register_watch(&self, key: Vec<u8>, expected: Option<Bytes>, tx: WatchSender);
    /// A fault to inject before a read, if any (memory backend's simulation faults).
    fn read_fault(&self) -> Option<BoxFuture<'static, Result<()>>> {
        None
    }
}

/// A commit handed to the backend.
pub(crate) struct CommitRequest {
    pub read_version: u64,
    pub read_conflicts: Vec<KeyRange>,
    pub write_conflicts: Vec<KeyRange>,
    pub mutations: Vec<Mutation>,
}

#[derive(Debug, PartialEq, Eq)]
enum Status {
    Open,
    Done,
}

struct State {
    status: Status,
    buf: WriteBuffer,
}

/// A transaction of a local backend.
pub(crate) struct LocalTransaction {
    store: Arc<dyn LocalStore>,
    snapshot: Arc<dyn Snapshot>,
    started: Timestamp,
    /// Registered in `ActiveReads` before the snapshot was taken (≤ its version).
    registered: u64,
    state: Mutex<State>,
}

impl Drop for LocalTransaction {
    fn drop(&mut self) {
        self.store.active().exit(self.registered);
    }
}

impl LocalTransaction {
    pub(crate) fn begin(store: Arc<dyn LocalStore>) -> Result<Self> {
        // Register first, then take the snapshot: history newer than `registered` is kept
        // for as long as this transaction lives.
        let registered = store.published_version();
        store.active().enter(registered);
        let snapshot = match store.snapshot() {
            Ok(s) => s,
            Err(e) => {
                store.active().exit(registered);
                return Err(e);
            }
        };
        let started = store.clock().now();
        Ok(LocalTransaction {
            store,
            snapshot,
            started,
            registered,
            state: Mutex::new(State { status: Status::Open, buf: WriteBuffer::default() }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The open state, or an error if the transaction is finished or too old.
    fn open(&self) -> Result<MutexGuard<'_, State>> {
        let st = self.lock();
        if st.status != Status::Open {
            return Err(Error::TransactionCancelled("transaction used after commit"));
        }
        let age = self.store.clock().now().since(self.started);
        if age > Duration::from_millis(TRANSACTION_AGE_MAX_MS) {
            return Err(Error::TransactionTooOld { window_ms: TRANSACTION_AGE_MAX_MS });
        }
        Ok(st)
    }

    async fn fault(&self) -> Result<()> {
        match self.store.read_fault() {
            Some(f) => f.await,
            None => Ok(()),
        }
    }

    /// Read-your-writes value of `key`; adds a read conflict when it reads the snapshot and
    /// `conflict` is set.
    fn get_locked(&self, st: &mut State, key: &[u8], conflict: bool) -> Result<Option<Bytes>> {
        if let Some(answer) = st.buf.local_get(key) {
            return answer;
        }
        let stored = self.snapshot.get(key)?;
        st.buf.finish_get(key, stored, conflict)
    }

    fn get_range_locked(
        &self,
        st: &mut State,
        r: &RangeOption,
        snapshot: bool,
    ) -> Result<Vec<KeyValue>> {
        check_range(&r.begin, &r.end)?;
        if r.begin == r.end {
            return Ok(Vec::new());
        }
        let mut merge = RangeMerge::new(&st.buf, r)?;
        self.snapshot.scan(&r.begin, &r.end, r.reverse, &mut |k, v| merge.stored(k, v))?;
        let out = merge.finish();
        if !snapshot {
            st.buf.add_range_conflict(r, &out)?;
        }
        Ok(out)
    }
}

impl KvTransaction for LocalTransaction {
    fn read_version(&self) -> BoxFuture<'_, Result<u64>> {
        Box::pin(async move {
            drop(self.open()?);
            Ok(self.snapshot.version())
        })
    }

    fn get<'a>(&'a self, key: &'a [u8], snapshot: bool) -> BoxFuture<'a, Result<Option<Bytes>>> {
        Box::pin(async move {
            check_key(key)?;
            self.fault().await?;
            // Inline on the calling thread: redb's pages are mostly cached, and a hop to the
            // blocking pool per read cost 3x the node's CPU in a burst (docs/benchmarks.md).
            let mut st = self.open()?;
            self.get_locked(&mut st, key, !snapshot)
        })
    }

    fn get_range<'a>(
        &'a self,
        range: &'a RangeOption,
        snapshot: bool,
    ) -> BoxFuture<'a, Result<Vec<KeyValue>>> {
        Box::pin(async move {
            self.fault().await?;
            let mut st = self.open()?;
            self.get_range_locked(&mut st, range, snapshot)
        })
    }

    fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.open()?.buf.set(key, value)
    }

    fn clear(&self, key: &[u8]) -> Result<()> {
        self.open()?.buf.clear(key)
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.open()?.buf.clear_range(begin, end)
    }

    fn atomic_add(&self, key: &[u8], param: &[u8]) -> Result<()> {
        self.open()?.buf.atomic_add(key, param)
    }

    fn set_versionstamped_key(&self, key: &[u8], offset: usize, value: &[u8]) -> Result<()> {
        self.open()?.buf.set_versionstamped_key(key, offset, value)
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8], offset: usize) -> Result<()> {
        self.open()?.buf.set_versionstamped_value(key, value, offset)
    }

    fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.open()?.buf.add_read_conflict_range(begin, end)
    }

    fn watch(&self, key: &[u8]) -> Result<Watch> {
        let mut st = self.open()?;
        let (tx, watch) = watch_pair();
        st.buf.watch(key, tx)?;
        Ok(watch)
    }

    fn approximate_size(&self) -> usize {
        self.lock().buf.size_bytes()
    }

    fn commit(&self) -> BoxFuture<'_, Result<CommitInfo>> {
        Box::pin(async move {
            let (req, watches) = {
                let mut st = self.open()?;
                st.status = Status::Done;
                // What each watch expects: the value this transaction leaves behind.
                let mut watches = Vec::new();
                for (key, tx) in st.buf.take_watches() {
                    match self.get_locked(&mut st, &key, false) {
                        Ok(expected) => watches.push((key, expected, tx)),
                        // Unreadable (versionstamped value): any later value differs.
                        Err(_) => watches.push((key, unreadable_watch_value(), tx)),
                    }
                }
                let b = st.buf.take();
                let req = CommitRequest {
                    read_version: self.snapshot.version(),
                    read_conflicts: b.read_conflicts,
                    write_conflicts: b.write_conflicts,
                    mutations: b.mutations,
                };
                (req, watches)
            };
            let result = if req.mutations.is_empty() {
                Ok(CommitInfo::default())
            } else {
                self.store.commit(req).await
            };
            for (key, expected, tx) in watches {
                match &result {
                    Ok(_) => self.store.register_watch(key, expected, tx),
                    Err(e) => {
                        let _ = tx.send(Err(e.clone()));
                    }
                }
            }
            result
        })
    }
}
