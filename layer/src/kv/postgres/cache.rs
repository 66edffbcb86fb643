//! The read cache of the postgres backend: point reads served in the process, without a
//! statement, when the process knows no commit changed the key between the value it holds and
//! the read version (ADR 0015).
//!
//! The cache is valid through a version, its **horizon**: every commit batch up to the
//! horizon has been applied to it, in commit order, so each entry (a value and the version
//! `written` that set it) is the key's value at every version from `written` to the horizon.
//! A read at `rv` is served when `written <= rv <= horizon`; any other read goes to the
//! database, as before.
//!
//! Batches reach the cache in commit order from two sources:
//! - **this process's committer**, after its `COMMIT` and before it acknowledges: the exact
//!   values it wrote (write-through) — the notification of its own batch is then ignored;
//! - **the listener**, for every other process's batch: the keys it may have changed (hashed)
//!   and its cleared ranges, which are evicted.
//!
//! A batch that does not follow the horizon (`base > horizon`) waits until the ones before it
//! arrive. When the order cannot be known — the listener reconnected (notifications were lost),
//! a commit's outcome is unknown, a notification is not ours, or too many batches wait — the
//! cache empties and stops serving until the next notification sets a new horizon. Emptying is
//! always safe: the cache only ever saves a statement.
//!
//! A value read from the database fills the cache only if the statement saw a version at or
//! above the horizon (so every batch after what it saw is still to be applied), and only as of
//! the version that wrote it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::sql::fnv1a;
use crate::kv::local::resolver::KeyRange;

use crate::kv::limits::{
    PG_READ_CACHE_BYTES_MAX as BYTES_MAX, PG_READ_CACHE_VALUE_BYTES_MAX as VALUE_BYTES_MAX,
    PG_READ_CACHE_WAITING_MAX as WAITING_MAX,
};
/// What an entry costs beyond its key (held twice: by key and by hash) and value: the nodes
/// of the two maps and the value's handle, approximately.
const ENTRY_OVERHEAD_BYTES: usize = 160;

/// What a batch changed, as its source knows it.
pub(crate) enum Changed {
    /// Exactly: the ranges it cleared, then the final value of each key it wrote.
    Exact { cleared: Vec<KeyRange>, puts: Vec<(Vec<u8>, Option<Bytes>)> },
    /// At most these: hashes of the keys set or cleared, and cleared ranges.
    Touched { hashes: Vec<u64>, ranges: Vec<KeyRange> },
}

struct Entry {
    value: Option<Bytes>,
    written: u64,
}

#[derive(Default)]
struct Inner {
    /// `None`: not serving (no order known yet).
    horizon: Option<u64>,
    entries: BTreeMap<Vec<u8>, Entry>,
    /// Cached keys by hash (for notifications that name keys by hash).
    by_hash: HashMap<u64, Vec<Vec<u8>>>,
    bytes: usize,
    /// Batches ahead of the horizon, by their base version: (top, what changed).
    waiting: BTreeMap<u64, (u64, Changed)>,
}

/// Counters of the read cache.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Point reads served by the cache.
    pub hits: AtomicU64,
    /// Point reads that went to the database.
    pub misses: AtomicU64,
    /// Times the cache emptied (lost order).
    pub resets: AtomicU64,
    /// Times it evicted about half of its entries (over its size).
    pub evictions: AtomicU64,
}

#[derive(Default)]
pub(crate) struct ReadCache {
    inner: Mutex<Inner>,
    pub(crate) stats: CacheStats,
}

impl ReadCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The value of `key` at `rv`, when the cache knows it.
    pub(crate) fn get(&self, key: &[u8], rv: u64) -> Option<Option<Bytes>> {
        let inner = self.lock();
        let hit = inner
            .horizon
            .filter(|h| rv <= *h)
            .and_then(|_| inner.entries.get(key))
            .filter(|e| e.written <= rv)
            .map(|e| e.value.clone());
        let counter = if hit.is_some() { &self.stats.hits } else { &self.stats.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        hit
    }

    /// Notes what a statement that saw version `seen` read: `key` has held `value` since
    /// `written`.
    pub(crate) fn fill(&self, key: &[u8], value: Option<Bytes>, written: u64, seen: u64) {
        let mut inner = self.lock();
        if inner.horizon.is_some_and(|h| seen >= h) {
            inner.insert(key.to_vec(), value, written);
            self.trim(&mut inner);
        }
    }

    /// Applies the batch `(base, top]`, or keeps it until the batches before it arrive.
    pub(crate) fn batch(&self, base: u64, top: u64, changed: Changed) {
        let mut inner = self.lock();
        let Some(h) = inner.horizon else { return };
        if top <= h {
            return;
        }
        if base < h {
            // Overlaps what was applied: not a batch of this store's order.
            return self.reset(&mut inner, Some(top));
        }
        match inner.waiting.get(&base) {
            // The committer's exact changes win over the listener's hashes of the same batch.
            Some((_, Changed::Exact { .. })) if matches!(changed, Changed::Touched { .. }) => {}
            _ => {
                inner.waiting.insert(base, (top, changed));
            }
        }
        loop {
            let h = inner.horizon.unwrap_or(0);
            let Some(entry) = inner.waiting.first_entry() else { break };
            if *entry.key() > h {
                break;
            }
            let (top, changed) = entry.remove();
            if top > h {
                inner.apply(top, changed);
                inner.horizon = Some(top);
            }
        }
        if inner.waiting.len() > WAITING_MAX {
            let top = inner.waiting.values().map(|(t, _)| *t).max();
            self.reset(&mut inner, top);
        }
        self.trim(&mut inner);
    }

    /// A notification of the batch `(base, top]`: while no order is known, starts serving from
    /// `top` on; else applies another process's batch (`own`: this process's committer applies
    /// its own). `base` or `changed` unknown: empties the cache, serving from `top` on.
    pub(crate) fn notified(
        &self,
        own: bool,
        base: Option<u64>,
        top: u64,
        changed: Option<Changed>,
    ) {
        {
            let mut inner = self.lock();
            match (inner.horizon, base, &changed) {
                (None, ..) => {
                    self.reset(&mut inner, Some(top));
                    return;
                }
                (Some(h), _, _) if top <= h || own => return,
                (Some(_), Some(_), Some(_)) => {}
                // No base (an older node's notification) or everything changed.
                _ => {
                    self.reset(&mut inner, Some(top));
                    return;
                }
            }
        }
        if let (Some(base), Some(changed)) = (base, changed) {
            self.batch(base, top, changed);
        }
    }

    /// Empties the cache and stops serving until the next notification (the order of commits
    /// is unknown: lost notifications, a commit of unknown outcome).
    pub(crate) fn suspend(&self) {
        let mut inner = self.lock();
        self.reset(&mut inner, None);
    }

    /// Empties the cache. A new horizon is never below a batch that was waiting (its changes
    /// are dropped with it).
    fn reset(&self, inner: &mut Inner, horizon: Option<u64>) {
        self.stats.resets.fetch_add(1, Ordering::Relaxed);
        let waited = inner.waiting.values().map(|(top, _)| *top).max();
        let horizon = horizon.map(|h| waited.map_or(h, |w| w.max(h)));
        *inner = Inner { horizon, ..Inner::default() };
    }

    /// Over its size: evicts about half of the entries, chosen by one bit of their key's hash
    /// (another bit each time). Which keys a workload reads next is not known here: keys
    /// written long ago (submitted executions) are read as often as fresh ones.
    fn trim(&self, inner: &mut Inner) {
        if inner.bytes <= BYTES_MAX {
            return;
        }
        let round = self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        let bit = 1u64 << (round % 64);
        let mut freed = 0;
        inner.by_hash.retain(|h, _| h & bit == 0);
        inner.entries.retain(|k, e| {
            let keep = fnv1a(k) & bit == 0;
            if !keep {
                freed += cost(k, &e.value);
            }
            keep
        });
        inner.bytes -= freed;
    }
}

/// What an entry of `key` holding `value` costs the cache.
fn cost(key: &[u8], value: &Option<Bytes>) -> usize {
    2 * key.len() + value.as_ref().map_or(0, Bytes::len) + ENTRY_OVERHEAD_BYTES
}

impl ReadCache {
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

impl Inner {
    fn insert(&mut self, key: Vec<u8>, value: Option<Bytes>, written: u64) {
        if value.as_ref().is_some_and(|v| v.len() > VALUE_BYTES_MAX) {
            self.remove(&key);
            return;
        }
        let size = cost(&key, &value);
        match self.entries.get_mut(&key) {
            Some(e) => {
                self.bytes -= cost(&key, &e.value);
                *e = Entry { value, written };
            }
            None => {
                self.by_hash.entry(fnv1a(&key)).or_default().push(key.clone());
                self.entries.insert(key, Entry { value, written });
            }
        }
        self.bytes += size;
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some(e) = self.entries.remove(key) {
            self.bytes -= cost(key, &e.value);
            let h = fnv1a(key);
            if let Some(keys) = self.by_hash.get_mut(&h) {
                keys.retain(|k| k.as_slice() != key);
                if keys.is_empty() {
                    self.by_hash.remove(&h);
                }
            }
        }
    }

    fn remove_range(&mut self, begin: &[u8], end: &[u8]) {
        if begin >= end {
            return;
        }
        let keys: Vec<Vec<u8>> =
            self.entries.range(begin.to_vec()..end.to_vec()).map(|(k, _)| k.clone()).collect();
        for k in keys {
            self.remove(&k);
        }
    }

    fn apply(&mut self, top: u64, changed: Changed) {
        match changed {
            Changed::Exact { cleared, puts } => {
                for (b, e) in &cleared {
                    self.remove_range(b, e);
                }
                for (k, v) in puts {
                    self.insert(k, v, top);
                }
            }
            Changed::Touched { hashes, ranges } => {
                for h in hashes {
                    for k in self.by_hash.remove(&h).unwrap_or_default() {
                        if let Some(e) = self.entries.remove(&k) {
                            self.bytes -= cost(&k, &e.value);
                        }
                    }
                }
                for (b, e) in &ranges {
                    self.remove_range(b, e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Option<Bytes> {
        Some(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn exact(puts: &[(&str, Option<&str>)]) -> Changed {
        let puts = puts.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.and_then(b))).collect();
        Changed::Exact { cleared: vec![], puts }
    }

    #[test]
    fn serves_only_between_the_writing_version_and_the_horizon() {
        let c = ReadCache::default();
        c.batch(0, 1, exact(&[("a", Some("1"))]));
        assert_eq!(c.get(b"a", 1), None, "not serving before the first notification");
        c.notified(false, None, 1, None);
        c.batch(1, 3, exact(&[("a", Some("2"))]));
        assert_eq!(c.get(b"a", 3), Some(b("2")));
        assert_eq!(c.get(b"a", 2), None, "older than the write: the database's history");
        assert_eq!(c.get(b"a", 4), None, "beyond the horizon");
        c.notified(
            false,
            Some(3),
            5,
            Some(Changed::Touched { hashes: vec![fnv1a(b"a")], ranges: vec![] }),
        );
        assert_eq!(c.get(b"a", 5), None, "another process changed it");
    }

    #[test]
    fn a_batch_ahead_waits_for_the_ones_before_it() {
        let c = ReadCache::default();
        c.notified(false, None, 10, None);
        c.batch(12, 13, exact(&[("k", Some("mine"))]));
        assert_eq!(c.get(b"k", 13), None);
        let range = (b"j".to_vec(), b"l".to_vec());
        c.notified(
            false,
            Some(10),
            12,
            Some(Changed::Touched { hashes: vec![], ranges: vec![range] }),
        );
        assert_eq!(c.get(b"k", 13), Some(b("mine")));
        // The listener's copy of the committer's own batch changes nothing.
        c.notified(
            true,
            Some(12),
            13,
            Some(Changed::Touched { hashes: vec![fnv1a(b"k")], ranges: vec![] }),
        );
        assert_eq!(c.get(b"k", 13), Some(b("mine")));
    }

    #[test]
    fn fills_only_from_statements_at_or_past_the_horizon_and_resets_on_lost_order() {
        let c = ReadCache::default();
        c.notified(false, None, 20, None);
        c.fill(b"x", b("old"), 5, 19);
        assert_eq!(c.get(b"x", 20), None, "saw less than the horizon: maybe stale");
        c.fill(b"x", b("v"), 5, 20);
        c.fill(b"gone", None, 0, 20);
        assert_eq!(c.get(b"x", 7), Some(b("v")));
        assert_eq!(c.get(b"gone", 20), Some(None));
        c.notified(
            false,
            Some(20),
            22,
            Some(Changed::Touched { hashes: vec![], ranges: vec![(b"a".to_vec(), b"z".to_vec())] }),
        );
        assert_eq!(c.get(b"x", 22), None);
        c.fill(b"y", b("1"), 21, 22);
        c.suspend();
        assert_eq!(c.get(b"y", 22), None);
        c.notified(false, Some(30), 31, None);
        assert_eq!(c.get(b"y", 31), None);
        assert!(c.stats.resets.load(Ordering::Relaxed) >= 2);
    }

    #[test]
    fn over_its_size_it_keeps_about_half() {
        let c = ReadCache::default();
        c.notified(false, None, 0, None);
        let value = Some(Bytes::from(vec![7u8; 8 << 10]));
        let n = (BYTES_MAX / (8 << 10)) as u64 + 10;
        for v in 1..=n {
            let puts = vec![(v.to_be_bytes().to_vec(), value.clone())];
            c.batch(v - 1, v, Changed::Exact { cleared: vec![], puts });
        }
        assert!(c.bytes() <= BYTES_MAX);
        assert_eq!(c.stats.evictions.load(Ordering::Relaxed), 1);
        let kept: Vec<u64> = (1..=n).filter(|v| c.get(&v.to_be_bytes(), n).is_some()).collect();
        assert!(kept.len() as u64 > n / 3 && (kept.len() as u64) < n * 2 / 3, "{}", kept.len());
        assert_eq!(c.get(&n.to_be_bytes(), n), Some(value.clone()), "written after: kept");
        // Eviction by hash still finds the kept keys.
        let k = kept[0].to_be_bytes();
        let hashes = vec![fnv1a(&k)];
        c.notified(false, Some(n), n + 1, Some(Changed::Touched { hashes, ranges: vec![] }));
        assert_eq!(c.get(&k, n + 1), None);
        assert_eq!(c.get(&kept[1].to_be_bytes(), n + 1), Some(value));
    }
}
