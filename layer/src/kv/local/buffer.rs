//! A transaction's client side, shared by every backend that resolves conflicts itself (memory,
//! embedded, postgres): the write buffer (read-your-writes, including pending atomic adds and
//! cleared ranges), the mutations in order, the read and write conflict ranges, the watches
//! asked for, and the size counted toward [`TRANSACTION_BYTES_MAX`]. Every FoundationDB limit
//! is checked here, before a mutation is buffered.
//!
//! Reads are split so a backend can fetch stored data without holding the buffer's lock:
//! [`WriteBuffer::local_get`] answers from the buffer alone when it can, [`WriteBuffer::finish_get`]
//! combines a stored value with the buffer, and [`RangeMerge`] merges stored rows, fed in scan
//! order, with the buffered writes of a range.

use std::collections::BTreeMap;
use std::ops::Bound;

use bytes::Bytes;

use super::mutation::{Mutation, atomic_add};
use super::resolver::KeyRange;
use super::watch::WatchSender;
use crate::kv::error::{Error, Result};
use crate::kv::limits::{
    MUTATION_OVERHEAD_BYTES, TRANSACTION_BYTES_MAX, check_key, check_range, check_value,
    check_versionstamp_offset, key_after,
};
use crate::kv::{KeyValue, RangeOption};

/// What the transaction knows of a key it wrote.
#[derive(Debug, Clone)]
pub(crate) enum Pending {
    Value(Bytes),
    Cleared,
    /// Atomic adds on a value not yet read.
    Adds(Vec<Bytes>),
    /// Written with a versionstamped value: unknown until commit.
    Unreadable,
}

impl Pending {
    /// The value this write leaves over `stored` (`None`: absent).
    fn over(&self, stored: Option<&[u8]>) -> Option<Bytes> {
        match self {
            Pending::Value(v) => Some(v.clone()),
            Pending::Cleared | Pending::Unreadable => None,
            Pending::Adds(params) => {
                let mut v = stored.map(Bytes::copy_from_slice);
                for p in params {
                    v = Some(atomic_add(v.as_deref(), p));
                }
                v
            }
        }
    }
}

/// What a commit hands to its backend.
pub(crate) struct Buffered {
    pub read_conflicts: Vec<KeyRange>,
    pub write_conflicts: Vec<KeyRange>,
    pub mutations: Vec<Mutation>,
}

/// The client side of one transaction.
#[derive(Default)]
pub(crate) struct WriteBuffer {
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

impl WriteBuffer {
    /// `key` was written otherwise than by an add: a later add of it merges into nothing before.
    fn forget_add(&mut self, key: &[u8]) {
        if !self.last_add.is_empty() {
            self.last_add.remove(key);
        }
    }

    fn in_cleared(&self, key: &[u8]) -> bool {
        self.cleared.iter().any(|(b, e)| b.as_slice() <= key && key < e.as_slice())
    }

    /// Mutations and conflict ranges so far, as the size limit counts them.
    pub(crate) fn size_bytes(&self) -> usize {
        self.size_bytes
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

    /// The answer to a read of `key` when the buffer alone decides it (`Some`), or `None` when
    /// the stored value is needed ([`finish_get`](Self::finish_get)).
    pub(crate) fn local_get(&self, key: &[u8]) -> Option<Result<Option<Bytes>>> {
        match self.writes.get(key) {
            Some(Pending::Value(v)) => Some(Ok(Some(v.clone()))),
            Some(Pending::Cleared) => Some(Ok(None)),
            Some(Pending::Unreadable) => Some(Err(Error::AccessedUnreadable)),
            Some(Pending::Adds(_)) => None,
            None if self.in_cleared(key) => Some(Ok(None)),
            None => None,
        }
    }

    /// The read-your-writes value of `key` given its `stored` value; adds a read conflict on
    /// the key when `conflict` and the stored value mattered.
    pub(crate) fn finish_get(
        &mut self,
        key: &[u8],
        stored: Option<Bytes>,
        conflict: bool,
    ) -> Result<Option<Bytes>> {
        if let Some(answer) = self.local_get(key) {
            return answer; // written meanwhile by this transaction
        }
        if conflict {
            self.add_read_conflict(key.to_vec(), key_after(key))?;
        }
        match self.writes.get(key) {
            Some(p @ Pending::Adds(_)) => Ok(p.over(stored.as_deref())),
            _ => Ok(stored),
        }
    }

    /// Adds a range read's read conflict range: up to the last key returned when the limit cut
    /// the read short, the whole range otherwise (FoundationDB's rule).
    pub(crate) fn add_range_conflict(&mut self, r: &RangeOption, out: &[KeyValue]) -> Result<()> {
        let cut = r.limit != 0 && out.len() >= r.limit;
        let (b, e) = match (cut, out.last()) {
            (true, Some(last)) if r.reverse => (last.key.to_vec(), r.end.clone()),
            (true, Some(last)) => (r.begin.clone(), key_after(&last.key)),
            _ => (r.begin.clone(), r.end.clone()),
        };
        self.add_read_conflict(b, e)
    }

    pub(crate) fn set(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        check_key(key)?;
        check_value(value)?;
        let v = Bytes::copy_from_slice(value);
        let m = Mutation::Set(key.to_vec(), v.clone());
        self.add_write(key.to_vec(), key_after(key), m, value.len())?;
        self.writes.insert(key.to_vec(), Pending::Value(v));
        self.forget_add(key);
        Ok(())
    }

    pub(crate) fn clear(&mut self, key: &[u8]) -> Result<()> {
        check_key(key)?;
        self.add_write(key.to_vec(), key_after(key), Mutation::Clear(key.to_vec()), 0)?;
        self.writes.insert(key.to_vec(), Pending::Cleared);
        self.forget_add(key);
        Ok(())
    }

    pub(crate) fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> Result<()> {
        check_range(begin, end)?;
        if begin == end {
            return Ok(());
        }
        let m = Mutation::ClearRange(begin.to_vec(), end.to_vec());
        self.add_write(begin.to_vec(), end.to_vec(), m, 0)?;
        let bounds = (Bound::Included(begin), Bound::Excluded(end));
        let inside: Vec<Vec<u8>> =
            self.writes.range::<[u8], _>(bounds).map(|(k, _)| k.clone()).collect();
        for k in inside {
            self.writes.remove(&k);
        }
        let adds: Vec<Vec<u8>> =
            self.last_add.range::<[u8], _>(bounds).map(|(k, _)| k.clone()).collect();
        for k in adds {
            self.last_add.remove(&k);
        }
        self.cleared.push((begin.to_vec(), end.to_vec()));
        Ok(())
    }

    pub(crate) fn atomic_add(&mut self, key: &[u8], param: &[u8]) -> Result<()> {
        check_key(key)?;
        check_value(param)?;
        let p = Bytes::copy_from_slice(param);
        let merged = match self.last_add.get(key).copied() {
            Some(i) => match &mut self.mutations[i] {
                Mutation::Add(_, old) if old.len() == p.len() => {
                    *old = atomic_add(Some(old), &p);
                    true
                }
                _ => false,
            },
            None => false,
        };
        if !merged {
            let m = Mutation::Add(key.to_vec(), p.clone());
            self.add_write(key.to_vec(), key_after(key), m, param.len())?;
            let i = self.mutations.len() - 1;
            self.last_add.insert(key.to_vec(), i);
        }
        let cleared = self.in_cleared(key);
        let next = match self.writes.remove(key) {
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
        self.writes.insert(key.to_vec(), next);
        Ok(())
    }

    pub(crate) fn set_versionstamped_key(
        &mut self,
        key: &[u8],
        offset: usize,
        value: &[u8],
    ) -> Result<()> {
        check_key(key)?;
        check_value(value)?;
        check_versionstamp_offset(key, offset)?;
        let m = Mutation::VersionstampedKey {
            key: key.to_vec(),
            offset,
            value: Bytes::copy_from_slice(value),
        };
        // Its write conflict range is added at commit, once the versionstamp is known.
        self.grow(key.len() + value.len() + MUTATION_OVERHEAD_BYTES)?;
        self.mutations.push(m);
        self.last_add.clear(); // its final key is unknown: merge no add across it
        Ok(())
    }

    pub(crate) fn set_versionstamped_value(
        &mut self,
        key: &[u8],
        value: &[u8],
        offset: usize,
    ) -> Result<()> {
        check_key(key)?;
        check_value(value)?;
        check_versionstamp_offset(value, offset)?;
        let m = Mutation::VersionstampedValue {
            key: key.to_vec(),
            value: Bytes::copy_from_slice(value),
            offset,
        };
        self.add_write(key.to_vec(), key_after(key), m, value.len())?;
        self.writes.insert(key.to_vec(), Pending::Unreadable);
        self.forget_add(key);
        Ok(())
    }

    pub(crate) fn add_read_conflict_range(&mut self, begin: &[u8], end: &[u8]) -> Result<()> {
        check_range(begin, end)?;
        if begin != end {
            self.add_read_conflict(begin.to_vec(), end.to_vec())?;
        }
        Ok(())
    }

    pub(crate) fn watch(&mut self, key: &[u8], tx: WatchSender) -> Result<()> {
        check_key(key)?;
        self.watches.push((key.to_vec(), tx));
        Ok(())
    }

    /// The watches asked for (taken: at commit).
    pub(crate) fn take_watches(&mut self) -> Vec<(Vec<u8>, WatchSender)> {
        std::mem::take(&mut self.watches)
    }

    /// The conflict ranges and mutations (taken: at commit).
    pub(crate) fn take(&mut self) -> Buffered {
        Buffered {
            read_conflicts: std::mem::take(&mut self.read_conflicts),
            write_conflicts: std::mem::take(&mut self.write_conflicts),
            mutations: std::mem::take(&mut self.mutations),
        }
    }
}

/// The value a watch expects when its transaction's own value is unreadable (a versionstamped
/// value): any value stored later differs from it.
pub(crate) fn unreadable_watch_value() -> Option<Bytes> {
    Some(Bytes::from_static(b"\xff"))
}

/// A range read in progress: stored rows, fed in scan order with [`stored`](Self::stored),
/// merged with the transaction's buffered writes of the range.
pub(crate) struct RangeMerge {
    /// Buffered writes inside the range, in scan order.
    overlay: Vec<(Vec<u8>, Pending)>,
    next: usize,
    cleared: Vec<KeyRange>,
    reverse: bool,
    limit: usize,
    out: Vec<KeyValue>,
}

impl RangeMerge {
    /// Starts a read of `r` (already checked with `check_range`, `begin < end`). Fails if a
    /// versionstamped value of this transaction lies in the range (unreadable).
    pub(crate) fn new(buf: &WriteBuffer, r: &RangeOption) -> Result<Self> {
        let bounds = (Bound::Included(r.begin.as_slice()), Bound::Excluded(r.end.as_slice()));
        let mut overlay: Vec<(Vec<u8>, Pending)> =
            buf.writes.range::<[u8], _>(bounds).map(|(k, p)| (k.clone(), p.clone())).collect();
        if overlay.iter().any(|(_, p)| matches!(p, Pending::Unreadable)) {
            return Err(Error::AccessedUnreadable);
        }
        if r.reverse {
            overlay.reverse();
        }
        let cleared = buf
            .cleared
            .iter()
            .filter(|(b, e)| b.as_slice() < r.end.as_slice() && r.begin.as_slice() < e.as_slice())
            .cloned()
            .collect();
        let limit = if r.limit == 0 { usize::MAX } else { r.limit };
        Ok(RangeMerge { overlay, next: 0, cleared, reverse: r.reverse, limit, out: Vec::new() })
    }

    /// Buffered writes of the range not merged yet (each may stand for a stored row).
    pub(crate) fn pending(&self) -> usize {
        self.overlay.len() - self.next
    }

    /// Whether cleared ranges of this transaction overlap the read (they hide stored rows).
    pub(crate) fn hides_rows(&self) -> bool {
        !self.cleared.is_empty()
    }

    /// Whether the read is complete (the limit reached).
    pub(crate) fn full(&self) -> bool {
        self.out.len() >= self.limit
    }

    fn precedes(&self, a: &[u8], b: &[u8]) -> bool {
        if self.reverse { a > b } else { a < b }
    }

    fn push(&mut self, k: &[u8], v: Option<Bytes>) {
        if let Some(v) = v {
            self.out.push(KeyValue { key: Bytes::copy_from_slice(k), value: v });
        }
    }

    /// Feeds the next stored pair (in scan order); returns whether more are wanted.
    pub(crate) fn stored(&mut self, k: &[u8], v: &[u8]) -> bool {
        while self.next < self.overlay.len() && self.precedes(&self.overlay[self.next].0, k) {
            let (ok, p) =
                std::mem::replace(&mut self.overlay[self.next], (Vec::new(), Pending::Cleared));
            self.push(&ok, p.over(None));
            self.next += 1;
            if self.full() {
                return false;
            }
        }
        if self.next < self.overlay.len() && self.overlay[self.next].0.as_slice() == k {
            let value = self.overlay[self.next].1.over(Some(v));
            self.push(k, value);
            self.next += 1;
        } else if !self.cleared.iter().any(|(b, e)| b.as_slice() <= k && k < e.as_slice()) {
            self.push(k, Some(Bytes::copy_from_slice(v)));
        }
        !self.full()
    }

    /// Ends the read once the stored rows are exhausted (or the limit reached): the buffered
    /// writes past the last stored key follow.
    pub(crate) fn finish(mut self) -> Vec<KeyValue> {
        while !self.full() && self.next < self.overlay.len() {
            let (k, p) =
                std::mem::replace(&mut self.overlay[self.next], (Vec::new(), Pending::Cleared));
            self.push(&k, p.over(None));
            self.next += 1;
        }
        self.out
    }
}
