//! The transaction engine shared by the memory and embedded backends: read-your-writes over a
//! read snapshot, buffered mutations, conflict ranges, size and age limits. A backend supplies
//! snapshots and a commit path ([`LocalStore`]); both use the same [`resolver::Resolver`].

pub(crate) mod mutation;
pub(crate) mod resolver;
pub(crate) mod watch;

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;

use self::mutation::{Mutation, atomic_add};
use self::resolver::KeyRange;
use self::watch::{WatchSender, watch_pair};
use super::error::{Error, Result};
use super::limits::{
    MUTATION_OVERHEAD_BYTES, TRANSACTION_AGE_MAX_MS, TRANSACTION_BYTES_MAX, check_key, check_range,
    check_value, check_versionstamp_offset, key_after,
};
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
    fn enter(&self, v: u64) {
        *self.versions.lock().unwrap_or_else(|e| e.into_inner()).entry(v).or_default() += 1;
    }

    fn exit(&self, v: u64) {
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

/// What the transaction knows of a key it wrote.
#[derive(Debug, Clone)]
enum Pending {
    Value(Bytes),
    Cleared,
    /// Atomic adds on a value not yet read.
    Adds(Vec<Bytes>),
    /// Written with a versionstamped value: unknown until commit.
    Unreadable,
}

impl Pending {
    /// The value the transaction reads over `base`, the stored value.
    fn over(&self, base: Option<Bytes>) -> Option<Bytes> {
        match self {
            Pending::Value(v) => Some(v.clone()),
            Pending::Cleared | Pending::Unreadable => None,
            Pending::Adds(params) => {
                let mut v = base;
                for p in params {
                    v = Some(atomic_add(v.as_deref(), p));
                }
                v
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Status {
    Open,
    Done,
}

struct State {
    status: Status,
    writes: BTreeMap<Vec<u8>, Pending>,
    cleared: Vec<KeyRange>,
    mutations: Vec<Mutation>,
    read_conflicts: Vec<KeyRange>,
    write_conflicts: Vec<KeyRange>,
    watches: Vec<(Vec<u8>, WatchSender)>,
    size_bytes: usize,
    /// Index in `mutations` of the latest `Add` of a key with nothing else touching the key
    /// since: another add of the same width merges into it (a counter bumped by every
    /// execution of a batch costs one read-modify-write at commit, not one each).
    last_add: BTreeMap<Vec<u8>, usize>,
}

impl State {
    fn in_cleared(&self, key: &[u8]) -> bool {
        self.cleared.iter().any(|(b, e)| b.as_slice() <= key && key < e.as_slice())
    }

    fn grow(&mut self, bytes: usize) -> Result<()> {
        let size = self.size_bytes + bytes;
        if size > TRANSACTION_BYTES_MAX {
            return Err(Error::TransactionTooLarge { size, limit: TRANSACTION_BYTES_MAX });
        }
        self.size_bytes = size;
        Ok(())
    }

    fn add_read_conflict(&mut self, b: Vec<u8>, e: Vec<u8>) -> Result<()> {
        self.grow(b.len() + e.len())?;
        self.read_conflicts.push((b, e));
        Ok(())
    }

    fn add_write(&mut self, b: Vec<u8>, e: Vec<u8>, m: Mutation, payload: usize) -> Result<()> {
        self.grow(b.len() + e.len() + payload + MUTATION_OVERHEAD_BYTES)?;
        self.write_conflicts.push((b, e));
        self.mutations.push(m);
        Ok(())
    }
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
            state: Mutex::new(State {
                status: Status::Open,
                writes: BTreeMap::new(),
                cleared: Vec::new(),
                mutations: Vec::new(),
                read_conflicts: Vec::new(),
                write_conflicts: Vec::new(),
                watches: Vec::new(),
                size_bytes: 0,
                last_add: BTreeMap::new(),
            }),
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
        match st.writes.get(key) {
            Some(Pending::Value(v)) => return Ok(Some(v.clone())),
            Some(Pending::Cleared) => return Ok(None),
            Some(Pending::Unreadable) => return Err(Error::AccessedUnreadable),
            Some(Pending::Adds(_)) => {}
            None if st.in_cleared(key) => return Ok(None),
            None => {}
        }
        let stored = self.snapshot.get(key)?;
        if conflict {
            st.add_read_conflict(key.to_vec(), key_after(key))?;
        }
        match st.writes.get(key) {
            Some(p @ Pending::Adds(_)) => Ok(p.over(stored)),
            _ => Ok(stored),
        }
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
        let limit = if r.limit == 0 { usize::MAX } else { r.limit };
        let bounds = (Bound::Included(r.begin.as_slice()), Bound::Excluded(r.end.as_slice()));
        let mut overlay: Vec<(&Vec<u8>, &Pending)> = st.writes.range::<[u8], _>(bounds).collect();
        if overlay.iter().any(|(_, p)| matches!(p, Pending::Unreadable)) {
            return Err(Error::AccessedUnreadable);
        }
        if r.reverse {
            overlay.reverse();
        }
        let precedes = |a: &[u8], b: &[u8]| if r.reverse { a > b } else { a < b };
        let resolve = |p: &Pending, base: Option<&[u8]>| p.over(base.map(Bytes::copy_from_slice));
        let mut out: Vec<KeyValue> = Vec::new();
        let mut next = 0;
        let push = |out: &mut Vec<KeyValue>, k: &[u8], v: Option<Bytes>| {
            if let Some(v) = v {
                out.push(KeyValue { key: Bytes::copy_from_slice(k), value: v });
            }
        };
        let cleared = &st.cleared;
        let in_cleared =
            |k: &[u8]| cleared.iter().any(|(b, e)| b.as_slice() <= k && k < e.as_slice());
        self.snapshot.scan(&r.begin, &r.end, r.reverse, &mut |k, v| {
            while next < overlay.len() && precedes(overlay[next].0, k) {
                let (ok, p) = overlay[next];
                push(&mut out, ok, resolve(p, None));
                next += 1;
                if out.len() >= limit {
                    return false;
                }
            }
            if next < overlay.len() && overlay[next].0.as_slice() == k {
                push(&mut out, k, resolve(overlay[next].1, Some(v)));
                next += 1;
            } else if !in_cleared(k) {
                push(&mut out, k, Some(Bytes::copy_from_slice(v)));
            }
            out.len() < limit
        })?;
        while out.len() < limit && next < overlay.len() {
            let (ok, p) = overlay[next];
            push(&mut out, ok, resolve(p, None));
            next += 1;
        }
        if !snapshot {
            let (b, e) = read_range_of(r, &out, limit);
            st.add_read_conflict(b, e)?;
        }
        Ok(out)
    }
}

/// What a range read read, for its conflict: all of the range, or up to the last key when
/// its limit cut it short.
fn read_range_of(r: &RangeOption, out: &[KeyValue], limit: usize) -> (Vec<u8>, Vec<u8>) {
    let cut = r.limit != 0 && out.len() >= limit;
    match (cut, out.last()) {
        (true, Some(last)) if r.reverse => (last.key.to_vec(), r.end.clone()),
        (true, Some(last)) => (r.begin.clone(), key_after(&last.key)),
        _ => (r.begin.clone(), r.end.clone()),
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
        check_key(key)?;
        check_value(value)?;
        let mut st = self.open()?;
        let v = Bytes::copy_from_slice(value);
        st.add_write(
            key.to_vec(),
            key_after(key),
            Mutation::Set(key.to_vec(), v.clone()),
            value.len(),
        )?;
        st.writes.insert(key.to_vec(), Pending::Value(v));
        st.last_add.remove(key);
        Ok(())
    }

    fn clear(&self, key: &[u8]) -> Result<()> {
        check_key(key)?;
        let mut st = self.open()?;
        st.add_write(key.to_vec(), key_after(key), Mutation::Clear(key.to_vec()), 0)?;
        st.writes.insert(key.to_vec(), Pending::Cleared);
        st.last_add.remove(key);
        Ok(())
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        check_range(begin, end)?;
        if begin == end {
            return Ok(());
        }
        let mut st = self.open()?;
        let m = Mutation::ClearRange(begin.to_vec(), end.to_vec());
        st.add_write(begin.to_vec(), end.to_vec(), m, 0)?;
        let inside: Vec<Vec<u8>> = st
            .writes
            .range::<[u8], _>((Bound::Included(begin), Bound::Excluded(end)))
            .map(|(k, _)| k.clone())
            .collect();
        for k in inside {
            st.writes.remove(&k);
        }
        let adds: Vec<Vec<u8>> = st
            .last_add
            .range::<[u8], _>((Bound::Included(begin), Bound::Excluded(end)))
            .map(|(k, _)| k.clone())
            .collect();
        for k in adds {
            st.last_add.remove(&k);
        }
        st.cleared.push((begin.to_vec(), end.to_vec()));
        Ok(())
    }

    fn atomic_add(&self, key: &[u8], param: &[u8]) -> Result<()> {
        check_key(key)?;
        check_value(param)?;
        let mut st = self.open()?;
        let p = Bytes::copy_from_slice(param);
        let merged = match st.last_add.get(key).copied() {
            Some(i) => match &mut st.mutations[i] {
                Mutation::Add(_, old) if old.len() == p.len() => {
                    *old = atomic_add(Some(old), &p);
                    true
                }
                _ => false,
            },
            None => false,
        };
        if !merged {
            st.add_write(
                key.to_vec(),
                key_after(key),
                Mutation::Add(key.to_vec(), p.clone()),
                param.len(),
            )?;
            let i = st.mutations.len() - 1;
            st.last_add.insert(key.to_vec(), i);
        }
        let cleared = st.in_cleared(key);
        let next = match st.writes.remove(key) {
            Some(Pending::Value(v)) => Pending::Value(atomic_add(Some(&v), &p)),
            Some(Pending::Cleared) => Pending::Value(atomic_add(None, &p)),
            Some(Pending::Adds(mut ps)) => {
                ps.push(p);
                Pending::Adds(ps)
            }
            Some(Pending::Unreadable) => Pending::Unreadable,
            None if cleared => Pending::Value(atomic_add(None, &p)),
            None => Pending::Adds(vec![p]),
        };
        st.writes.insert(key.to_vec(), next);
        Ok(())
    }

    fn set_versionstamped_key(&self, key: &[u8], offset: usize, value: &[u8]) -> Result<()> {
        check_key(key)?;
        check_value(value)?;
        check_versionstamp_offset(key, offset)?;
        let mut st = self.open()?;
        let m = Mutation::VersionstampedKey {
            key: key.to_vec(),
            offset,
            value: Bytes::copy_from_slice(value),
        };
        // Its write conflict range is added at commit, once the versionstamp is known.
        st.grow(key.len() + value.len() + MUTATION_OVERHEAD_BYTES)?;
        st.mutations.push(m);
        st.last_add.clear(); // its final key is unknown: merge no add across it
        Ok(())
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8], offset: usize) -> Result<()> {
        check_key(key)?;
        check_value(value)?;
        check_versionstamp_offset(value, offset)?;
        let mut st = self.open()?;
        let m = Mutation::VersionstampedValue {
            key: key.to_vec(),
            value: Bytes::copy_from_slice(value),
            offset,
        };
        st.add_write(key.to_vec(), key_after(key), m, value.len())?;
        st.writes.insert(key.to_vec(), Pending::Unreadable);
        st.last_add.remove(key);
        Ok(())
    }

    fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        check_range(begin, end)?;
        let mut st = self.open()?;
        if begin != end {
            st.add_read_conflict(begin.to_vec(), end.to_vec())?;
        }
        Ok(())
    }

    fn watch(&self, key: &[u8]) -> Result<Watch> {
        check_key(key)?;
        let mut st = self.open()?;
        let (tx, watch) = watch_pair();
        st.watches.push((key.to_vec(), tx));
        Ok(watch)
    }

    fn commit(&self) -> BoxFuture<'_, Result<CommitInfo>> {
        Box::pin(async move {
            let (req, watches) = {
                let mut st = self.open()?;
                st.status = Status::Done;
                // What each watch expects: the value this transaction leaves behind.
                let mut watches = Vec::new();
                for (key, tx) in std::mem::take(&mut st.watches) {
                    match self.get_locked(&mut st, &key, false) {
                        Ok(expected) => watches.push((key, expected, tx)),
                        // Unreadable (versionstamped value): any later value differs.
                        Err(_) => watches.push((key, Some(Bytes::from_static(b"\xff")), tx)),
                    }
                }
                let req = CommitRequest {
                    read_version: self.snapshot.version(),
                    read_conflicts: std::mem::take(&mut st.read_conflicts),
                    write_conflicts: std::mem::take(&mut st.write_conflicts),
                    mutations: std::mem::take(&mut st.mutations),
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
