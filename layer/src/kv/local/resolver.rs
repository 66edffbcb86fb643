//! The optimistic-concurrency resolver shared by the memory and embedded backends.
//!
//! It remembers, for the MVCC window, which key ranges were written at which commit version
//! (an interval map of non-overlapping ranges, each with the latest version that wrote it),
//! and rejects a transaction if any of its read conflict ranges was written after its read
//! version — FoundationDB's resolver rule, which makes commits serializable.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::time::Duration;

use crate::env::Timestamp;
use crate::kv::error::{Error, Result};
use crate::kv::limits::TRANSACTION_AGE_MAX_MS;

/// Extra time history is kept past the MVCC window, so a transaction that passes its own age
/// check never finds its history gone.
const HISTORY_SLACK: Duration = Duration::from_millis(1_000);

/// A key range `[begin, end)`.
pub(crate) type KeyRange = (Vec<u8>, Vec<u8>);

#[derive(Debug)]
pub(crate) struct Resolver {
    /// begin → (end, version): non-overlapping written ranges (from clear_range) and the last
    /// version writing them.
    history: BTreeMap<Vec<u8>, (Vec<u8>, u64)>,
    /// Single written keys (most writes) and the last version writing each: one map entry
    /// per key, no end key kept.
    points: BTreeMap<Vec<u8>, u64>,
    history_len_after_gc: usize,
    /// Latest assigned commit version.
    version: u64,
    /// (version, commit time) of recent commits, oldest first.
    horizon: VecDeque<(u64, Timestamp)>,
    /// History for versions `<= oldest_readable` is gone: reads at older versions are too old.
    oldest_readable: u64,
}

impl Resolver {
    /// A resolver whose latest committed version is `version`.
    pub(crate) fn new(version: u64) -> Self {
        Resolver {
            history: BTreeMap::new(),
            points: BTreeMap::new(),
            history_len_after_gc: 0,
            version,
            horizon: VecDeque::new(),
            oldest_readable: version,
        }
    }

    /// The latest committed version.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// The oldest read version still resolvable (older ones are too old).
    pub(crate) fn oldest_readable(&self) -> u64 {
        self.oldest_readable
    }

    /// Number of remembered write ranges (for tests).
    #[cfg(test)]
    pub(crate) fn history_len(&self) -> usize {
        self.history.len() + self.points.len()
    }

    /// Checks a transaction read at `read_version` with `reads` as read conflict ranges.
    pub(crate) fn check(&self, read_version: u64, reads: &[KeyRange]) -> Result<()> {
        if read_version < self.oldest_readable {
            return Err(Error::TransactionTooOld { window_ms: TRANSACTION_AGE_MAX_MS });
        }
        if read_version >= self.version {
            return Ok(()); // nothing committed since it read
        }
        for (b, e) in reads {
            if self.written_after(b, e, read_version) {
                return Err(Error::NotCommitted);
            }
        }
        Ok(())
    }

    fn written_after(&self, b: &[u8], e: &[u8], read_version: u64) -> bool {
        if b >= e {
            return false;
        }
        let point_written = self
            .points
            .range::<[u8], _>((Bound::Included(b), Bound::Excluded(e)))
            .any(|(_, v)| *v > read_version);
        if point_written {
            return true;
        }
        let mut before = self.history.range::<[u8], _>((Bound::Unbounded, Bound::Excluded(b)));
        if let Some((_, (pe, pv))) = before.next_back()
            && pe.as_slice() > b
            && *pv > read_version
        {
            return true;
        }
        self.history
            .range::<[u8], _>((Bound::Included(b), Bound::Excluded(e)))
            .any(|(_, (_, v))| *v > read_version)
    }

    /// Assigns the next commit version.
    pub(crate) fn next_version(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    /// Records the write conflict ranges of the commit at `version` (the latest assigned),
    /// committed at `now`, and forgets history at or below `floor` (no live transaction reads
    /// that old) or past the MVCC window.
    pub(crate) fn record(
        &mut self,
        version: u64,
        writes: Vec<KeyRange>,
        now: Timestamp,
        floor: u64,
    ) {
        debug_assert_eq!(version, self.version, "record the version just assigned");
        for (b, e) in writes {
            if is_point(&b, &e) {
                self.points.insert(b, version);
            } else if b < e {
                self.insert(b, e, version);
            }
        }
        self.horizon.push_back((version, now));
        let window = Duration::from_millis(TRANSACTION_AGE_MAX_MS) + HISTORY_SLACK;
        while let Some(&(v, t)) = self.horizon.front() {
            if now.since(t) <= window {
                break;
            }
            self.oldest_readable = v;
            self.horizon.pop_front();
        }
        let len = self.history.len() + self.points.len();
        if len > 2 * self.history_len_after_gc + 1_024 {
            let floor = floor.max(self.oldest_readable);
            self.history.retain(|_, (_, v)| *v > floor);
            self.points.retain(|_, v| *v > floor);
            self.history_len_after_gc = self.history.len() + self.points.len();
        }
    }

    fn insert(&mut self, b: Vec<u8>, e: Vec<u8>, version: u64) {
        // A range starting before `b` that reaches into [b, e): keep its parts outside.
        let pred = self
            .history
            .range::<[u8], _>((Bound::Unbounded, Bound::Excluded(b.as_slice())))
            .next_back()
            .filter(|(_, (pe, _))| pe.as_slice() > b.as_slice())
            .map(|(pb, _)| pb.clone());
        if let Some(pb) = pred
            && let Some((pe, pv)) = self.history.remove(&pb)
        {
            if pe > e {
                self.history.insert(e.clone(), (pe, pv));
            }
            self.history.insert(pb, (b.clone(), pv));
        }
        // Ranges starting inside [b, e): drop them, keeping any tail past `e`.
        let inside: Vec<Vec<u8>> = self
            .history
            .range::<[u8], _>((Bound::Included(b.as_slice()), Bound::Excluded(e.as_slice())))
            .map(|(k, _)| k.clone())
            .collect();
        for k in inside {
            if let Some((ke, kv)) = self.history.remove(&k)
                && ke > e
            {
                self.history.insert(e.clone(), (ke, kv));
            }
        }
        self.history.insert(b, (e, version));
    }
}

/// Whether `[b, e)` holds exactly the key `b` (`e == b + "\0"`).
fn is_point(b: &[u8], e: &[u8]) -> bool {
    e.len() == b.len() + 1 && e.last() == Some(&0) && e.starts_with(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(b: &str, e: &str) -> KeyRange {
        (b.as_bytes().to_vec(), e.as_bytes().to_vec())
    }

    #[test]
    fn conflicts_only_with_writes_after_the_read_version() {
        let mut res = Resolver::new(0);
        let now = Timestamp::from_millis(0);
        let v1 = res.next_version();
        res.record(v1, vec![r("b", "c")], now, 0);
        assert_eq!(res.check(0, &[r("a", "z")]), Err(Error::NotCommitted));
        assert_eq!(res.check(0, &[r("c", "z")]), Ok(()), "end is exclusive");
        assert_eq!(res.check(0, &[r("a", "b")]), Ok(()));
        assert_eq!(res.check(1, &[r("a", "z")]), Ok(()), "read after the write");
    }

    #[test]
    fn overlapping_writes_split_and_keep_latest_versions() {
        let mut res = Resolver::new(0);
        let now = Timestamp::from_millis(0);
        let v1 = res.next_version();
        res.record(v1, vec![r("a", "m")], now, 0);
        let v2 = res.next_version();
        res.record(v2, vec![r("d", "f")], now, 0);
        // [a,d)@1 [d,f)@2 [f,m)@1
        assert_eq!(res.check(1, &[r("a", "d")]), Ok(()));
        assert_eq!(res.check(1, &[r("e", "e\0")]), Err(Error::NotCommitted));
        assert_eq!(res.check(1, &[r("f", "z")]), Ok(()));
        assert_eq!(res.check(0, &[r("l", "z")]), Err(Error::NotCommitted));
        let v3 = res.next_version();
        res.record(v3, vec![r("0", "z")], now, 0);
        assert_eq!(res.history.len(), 1);
        // Points and ranges together: a point written after the read conflicts.
        let v4 = res.next_version();
        res.record(v4, vec![r("p", "p\0")], now, 0);
        assert_eq!(res.points.len(), 1);
        assert_eq!(res.check(3, &[r("o", "q")]), Err(Error::NotCommitted));
        assert_eq!(res.check(4, &[r("o", "q")]), Ok(()));
        assert_eq!(res.check(2, &[r("x", "y")]), Err(Error::NotCommitted));
    }

    #[test]
    fn history_no_live_transaction_needs_is_forgotten() {
        let mut res = Resolver::new(0);
        let now = Timestamp::from_millis(0);
        for i in 0..5_000u32 {
            let v = res.next_version();
            let k = format!("k{i:05}");
            // A live transaction reads at version 100: everything newer is kept.
            res.record(
                v,
                vec![(k.clone().into_bytes(), format!("{k}\0").into_bytes())],
                now,
                v.min(100),
            );
        }
        assert!(res.history_len() < 5_000 && res.history_len() >= 4_900, "{}", res.history_len());
        assert_eq!(res.check(100, &[r("k00150", "k00151")]), Err(Error::NotCommitted));
    }

    #[test]
    fn history_past_the_window_is_too_old() {
        let mut res = Resolver::new(0);
        let v1 = res.next_version();
        res.record(v1, vec![r("a", "b")], Timestamp::from_millis(0), 0);
        let v2 = res.next_version();
        res.record(v2, vec![r("a", "b")], Timestamp::from_millis(10_000), 0);
        assert!(matches!(res.check(0, &[]), Err(Error::TransactionTooOld { .. })));
        assert_eq!(res.check(1, &[r("c", "d")]), Ok(()));
    }
}
