//! The writes made durable by the commit log since the last checkpoint, kept in memory
//! (ADR 0012): a group commit appends its frame, syncs it, and puts its writes here, by version;
//! redb takes them at the next flush or checkpoint, in one commit, in key order.
//!
//! A snapshot reads the overlay's **generations** at its version first, newest first, then
//! redb. A flush *freezes* the current generation (a new, empty one takes the group commits)
//! and redb takes the frozen one on the flusher's thread, off the commit path (ADR 0013); once
//! redb holds it, it is dropped from the overlay. A snapshot taken before keeps the generations
//! it saw with the redb read transaction it opened, so its view never changes.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use bytes::Bytes;

use crate::kv::error::Result;
use crate::kv::local::mutation::ApplyTarget;

use super::log::FrameBody;

/// Versions of one key, oldest first; `None` is a deletion.
type Chain = Vec<(u64, Option<Bytes>)>;

/// A key and its value at a version (`None`: deleted, which hides what redb holds).
pub(crate) type Entry = (Vec<u8>, Option<Bytes>);

/// The generations: the current one takes the group commits; a frozen one is being written to
/// redb; a snapshot holds the ones it saw.
#[derive(Default)]
pub(crate) struct Overlay {
    layers: RwLock<Layers>,
}

/// The generations a reader sees, newest first: the current one, then the frozen one (if a
/// flush is under way or failed).
#[derive(Default, Clone)]
pub(crate) struct Layers {
    pub current: Arc<Generation>,
    pub frozen: Option<Arc<Generation>>,
}

impl Layers {
    /// The key at `version` in the newest generation that wrote it at or before then.
    pub(crate) fn get(&self, key: &[u8], version: u64) -> Option<Option<Bytes>> {
        self.current.get(key, version).or_else(|| self.frozen.as_ref()?.get(key, version))
    }

    /// The key's latest value in the overlay, if a generation wrote it.
    pub(crate) fn latest(&self, key: &[u8]) -> Option<Option<Bytes>> {
        self.current.latest(key).or_else(|| self.frozen.as_ref()?.latest(key))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.current.is_empty() && self.frozen.as_ref().is_none_or(|f| f.is_empty())
    }

    /// The live keys of `[begin, end)` as of now, the newer generation's state winning.
    pub(crate) fn live_keys(&self, begin: &[u8], end: &[u8]) -> BTreeMap<Vec<u8>, bool> {
        let mut live = BTreeMap::new();
        if let Some(f) = &self.frozen {
            live.extend(f.live_keys(begin, end));
        }
        live.extend(self.current.live_keys(begin, end));
        live
    }
}

impl Overlay {
    /// The generations, read under the overlay's lock while `open` opens what goes with them
    /// (redb's read transaction): dropping a frozen generation waits for it, so a reader never
    /// pairs "no frozen generation" with redb from before the flush that wrote it.
    pub(crate) fn with_layers<T>(&self, open: impl FnOnce(&Layers) -> T) -> T {
        let g = self.layers.read().unwrap_or_else(|e| e.into_inner());
        open(&g)
    }

    pub(crate) fn layers(&self) -> Layers {
        self.layers.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Freezes the current generation for a flush (a new one takes the group commits); `None`
    /// while one is frozen already or the current one is empty.
    pub(crate) fn freeze(&self) -> Option<Arc<Generation>> {
        let mut l = self.layers.write().unwrap_or_else(|e| e.into_inner());
        if l.frozen.is_some() || l.current.is_empty() {
            return None;
        }
        let frozen = std::mem::take(&mut l.current);
        l.frozen = Some(frozen.clone());
        Some(frozen)
    }

    /// redb holds every write of `frozen`: later snapshots read redb instead.
    pub(crate) fn flushed(&self, frozen: &Arc<Generation>) {
        let mut l = self.layers.write().unwrap_or_else(|e| e.into_inner());
        if l.frozen.as_ref().is_some_and(|f| Arc::ptr_eq(f, frozen)) {
            l.frozen = None;
        }
    }

    /// redb holds every write of the overlay durably (no flush under way): later snapshots
    /// read redb alone.
    pub(crate) fn clear(&self) {
        *self.layers.write().unwrap_or_else(|e| e.into_inner()) = Layers::default();
    }
}

/// The writes of the group commits since one checkpoint.
#[derive(Default)]
pub(crate) struct Generation {
    keys: RwLock<BTreeMap<Vec<u8>, Chain>>,
}

/// The newest version at or below `version` (`Some(None)` for a deletion); `None` when the key
/// has no version that old here.
fn visible(chain: &Chain, version: u64) -> Option<Option<Bytes>> {
    chain.iter().rev().find(|(v, _)| *v <= version).map(|(_, v)| v.clone())
}

impl Generation {
    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<Vec<u8>, Chain>> {
        self.keys.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// The key at `version`, if this generation wrote it at or before then.
    pub(crate) fn get(&self, key: &[u8], version: u64) -> Option<Option<Bytes>> {
        self.read().get(key).and_then(|c| visible(c, version))
    }

    /// The key's latest value here, if this generation wrote it.
    pub(crate) fn latest(&self, key: &[u8]) -> Option<Option<Bytes>> {
        self.read().get(key).and_then(|c| c.last()).map(|(_, v)| v.clone())
    }

    /// Up to `max` keys of the range at `version`, in order (descending if `reverse`),
    /// deletions included.
    pub(crate) fn chunk(
        &self,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        reverse: bool,
        version: u64,
        max: usize,
    ) -> Vec<Entry> {
        let keys = self.read();
        let mut out = Vec::new();
        let mut each = |(k, c): (&Vec<u8>, &Chain)| {
            if let Some(v) = visible(c, version) {
                out.push((k.clone(), v));
            }
            out.len() < max
        };
        let mut iter = keys.range::<[u8], _>(range);
        if reverse {
            while let Some(kv) = iter.next_back() {
                if !each(kv) {
                    break;
                }
            }
        } else {
            for kv in iter {
                if !each(kv) {
                    break;
                }
            }
        }
        out
    }

    /// The live keys of `[begin, end)` as of now.
    fn live_keys(&self, begin: &[u8], end: &[u8]) -> Vec<(Vec<u8>, bool)> {
        let keys = self.read();
        let range = keys.range::<[u8], _>((Bound::Included(begin), Bound::Excluded(end)));
        range.filter_map(|(k, c)| c.last().map(|(_, v)| (k.clone(), v.is_some()))).collect()
    }

    /// A durable group commit's writes, at its version. Versions no reader can see any more
    /// (all but the newest at or below `floor`, the oldest live snapshot's) are dropped.
    pub(crate) fn insert(&self, writes: Vec<Entry>, version: u64, floor: u64) {
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        for (k, v) in writes {
            let chain = keys.entry(k).or_default();
            match chain.last_mut() {
                Some((at, old)) if *at == version => *old = v,
                _ => chain.push((version, v)),
            }
            let older = chain.iter().take_while(|(at, _)| *at <= floor).count();
            if older > 1 {
                chain.drain(..older - 1);
            }
        }
    }

    /// Visits each key's latest value in key order (a checkpoint writing redb).
    pub(crate) fn each_latest(
        &self,
        mut visit: impl FnMut(&[u8], Option<&[u8]>) -> Result<()>,
    ) -> Result<()> {
        for (k, c) in self.read().iter() {
            if let Some((_, v)) = c.last() {
                visit(k, v.as_deref())?;
            }
        }
        Ok(())
    }
}

/// A batch made durable by the commit log: its writes encoded into the frame and kept for the
/// generation (put there once the frame is synced); reads see the generation, then redb.
pub(crate) struct StagedTarget<'a> {
    pub frame: &'a mut FrameBody,
    pub layers: &'a Layers,
    pub redb: &'a redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
    pub staged: Vec<Entry>,
    /// Keys this batch's range clears deleted (read back by a later atomic add on them).
    pub cleared: BTreeMap<Vec<u8>, ()>,
}

impl StagedTarget<'_> {
    fn redb_get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self
            .redb
            .get(key)
            .map_err(|e| super::errors::classify("write", e))?
            .map(|g| Bytes::copy_from_slice(g.value())))
    }
}

impl ApplyTarget for StagedTarget<'_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>> {
        if self.cleared.contains_key(key) {
            return Ok(None);
        }
        match self.layers.latest(key) {
            Some(v) => Ok(v),
            None => self.redb_get(key),
        }
    }

    fn put(&mut self, key: &[u8], value: Option<Bytes>) -> Result<()> {
        self.frame.put(key, value.as_deref());
        self.staged.push((key.to_vec(), value));
        Ok(())
    }

    /// The range clear goes into the frame as one; here, each key live in the generation or in
    /// redb gets a deletion.
    fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.frame.clear_range(begin, end);
        let mut live: BTreeMap<Vec<u8>, bool> = BTreeMap::new();
        for item in
            self.redb.range::<&[u8]>(begin..end).map_err(|e| super::errors::classify("write", e))?
        {
            let (k, _) = item.map_err(|e| super::errors::classify("write", e))?;
            live.insert(k.value().to_vec(), true);
        }
        // The overlay's latest state overrides redb's: a deletion there needs no other.
        live.extend(self.layers.live_keys(begin, end));
        for (k, is_live) in live {
            if is_live {
                self.cleared.insert(k.clone(), ());
                self.staged.push((k, None));
            }
        }
        Ok(())
    }
}

/// Reads a generation's range in chunks (never holding its lock while the caller works).
pub(crate) struct Cursor<'a> {
    generation: &'a Generation,
    begin: Vec<u8>,
    end: Vec<u8>,
    reverse: bool,
    version: u64,
    /// The next entries, in scan order.
    pending: std::collections::VecDeque<Entry>,
    /// The last key read (the next chunk starts past it); `None` before the first chunk.
    last: Option<Vec<u8>>,
    done: bool,
}

const CHUNK: usize = 256;

impl<'a> Cursor<'a> {
    pub(crate) fn new(
        generation: &'a Generation,
        (begin, end): (&[u8], &[u8]),
        reverse: bool,
        version: u64,
    ) -> Self {
        Cursor {
            generation,
            begin: begin.to_vec(),
            end: end.to_vec(),
            reverse,
            version,
            pending: Default::default(),
            last: None,
            done: generation.is_empty(),
        }
    }

    /// The next entry in scan order, without taking it.
    pub(crate) fn peek(&mut self) -> Option<&Entry> {
        if self.pending.is_empty() && !self.done {
            self.refill();
        }
        self.pending.front()
    }

    pub(crate) fn pop(&mut self) -> Option<Entry> {
        self.peek();
        self.pending.pop_front()
    }

    fn refill(&mut self) {
        let (lo, hi) = match (&self.last, self.reverse) {
            (None, _) => (Bound::Included(&self.begin[..]), Bound::Excluded(&self.end[..])),
            (Some(l), false) => (Bound::Excluded(&l[..]), Bound::Excluded(&self.end[..])),
            (Some(l), true) => (Bound::Included(&self.begin[..]), Bound::Excluded(&l[..])),
        };
        let chunk = self.generation.chunk((lo, hi), self.reverse, self.version, CHUNK);
        self.done = chunk.len() < CHUNK;
        if let Some((k, _)) = chunk.last() {
            self.last = Some(k.clone());
        }
        self.pending.extend(chunk);
    }
}

/// The overlay's range in scan order: the current generation's entries merged with the frozen
/// one's, the current one winning on a key both hold.
pub(crate) struct LayersCursor<'a> {
    newer: Cursor<'a>,
    older: Option<Cursor<'a>>,
    reverse: bool,
    head: Option<Entry>,
}

impl<'a> LayersCursor<'a> {
    pub(crate) fn new(
        layers: &'a Layers,
        range: (&[u8], &[u8]),
        reverse: bool,
        version: u64,
    ) -> Self {
        LayersCursor {
            newer: Cursor::new(&layers.current, range, reverse, version),
            older: layers.frozen.as_deref().map(|f| Cursor::new(f, range, reverse, version)),
            reverse,
            head: None,
        }
    }

    fn fill(&mut self) {
        if self.head.is_some() {
            return;
        }
        let Some(older) = self.older.as_mut() else {
            self.head = self.newer.pop();
            return;
        };
        let order = match (self.newer.peek(), older.peek()) {
            (None, None) => return,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((a, _)), Some((b, _))) if self.reverse => b.cmp(a),
            (Some((a, _)), Some((b, _))) => a.cmp(b),
        };
        self.head = match order {
            std::cmp::Ordering::Greater => older.pop(),
            std::cmp::Ordering::Equal => {
                older.pop(); // the newer generation's version of the key wins
                self.newer.pop()
            }
            std::cmp::Ordering::Less => self.newer.pop(),
        };
    }

    /// The next entry in scan order, without taking it.
    pub(crate) fn peek(&mut self) -> Option<&Entry> {
        self.fill();
        self.head.as_ref()
    }

    pub(crate) fn pop(&mut self) -> Option<Entry> {
        self.fill();
        self.head.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Option<Bytes> {
        Some(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn a_reader_sees_the_version_it_asked_for_and_a_deletion_as_one() {
        let g = Generation::default();
        g.insert(vec![(b"a".to_vec(), b("1"))], 5, 0);
        g.insert(vec![(b"a".to_vec(), None), (b"b".to_vec(), b("2"))], 7, 0);
        assert_eq!(g.get(b"a", 4), None);
        assert_eq!(g.get(b"a", 5), Some(b("1")));
        assert_eq!(g.get(b"a", 9), Some(None));
        assert_eq!(g.get(b"b", 6), None);
        assert_eq!(g.latest(b"a"), Some(None));
    }

    #[test]
    fn versions_below_the_oldest_reader_are_dropped_but_its_own() {
        let g = Generation::default();
        for v in 1..=5 {
            g.insert(vec![(b"k".to_vec(), b(&v.to_string()))], v, 3);
        }
        // The oldest reader is at 3: it still sees 3; 1 and 2 are gone.
        assert_eq!(g.get(b"k", 3), Some(b("3")));
        assert_eq!(g.get(b"k", 2), None);
        assert_eq!(g.read().get(&b"k"[..]).map(Vec::len), Some(3));
    }

    #[test]
    fn the_current_generation_wins_over_the_frozen_one_in_reads_and_scans() {
        let frozen = Generation::default();
        frozen.insert(vec![(b"a".to_vec(), b("old")), (b"b".to_vec(), b("kept"))], 3, 0);
        frozen.insert(vec![(b"d".to_vec(), b("gone-later")), (b"e".to_vec(), None)], 4, 0);
        let current = Generation::default();
        current.insert(vec![(b"a".to_vec(), b("new")), (b"c".to_vec(), b("fresh"))], 6, 0);
        current.insert(vec![(b"d".to_vec(), None)], 7, 0);
        let layers = Layers { current: Arc::new(current), frozen: Some(Arc::new(frozen)) };
        assert_eq!(layers.get(b"a", 9), Some(b("new")));
        assert_eq!(layers.get(b"a", 5), Some(b("old")), "an older snapshot reads the frozen one");
        assert_eq!(layers.get(b"b", 9), Some(b("kept")));
        assert_eq!(layers.get(b"d", 9), Some(None));
        assert_eq!(layers.get(b"d", 6), Some(b("gone-later")));
        assert_eq!(layers.get(b"z", 9), None, "neither wrote it: redb answers");
        assert_eq!(layers.latest(b"e"), Some(None));
        for reverse in [false, true] {
            let mut c = LayersCursor::new(&layers, (b"a", b"z"), reverse, 9);
            let mut seen = Vec::new();
            while let Some((k, v)) = c.pop() {
                seen.push((String::from_utf8(k).unwrap(), v));
            }
            let mut want = vec![
                ("a".to_string(), b("new")),
                ("b".to_string(), b("kept")),
                ("c".to_string(), b("fresh")),
                ("d".to_string(), None),
                ("e".to_string(), None),
            ];
            if reverse {
                want.reverse();
            }
            assert_eq!(seen, want, "reverse: {reverse}");
        }
        let live = layers.live_keys(b"a", b"z");
        let want: BTreeMap<Vec<u8>, bool> = [("a", true), ("b", true), ("c", true)]
            .into_iter()
            .map(|(k, l)| (k.as_bytes().to_vec(), l))
            .chain([(b"d".to_vec(), false), (b"e".to_vec(), false)])
            .collect();
        assert_eq!(live, want);
    }

    #[test]
    fn a_generation_freezes_once_and_leaves_when_flushed() {
        let overlay = Overlay::default();
        assert!(overlay.freeze().is_none(), "nothing to flush");
        overlay.layers().current.insert(vec![(b"k".to_vec(), b("1"))], 1, 0);
        let frozen = overlay.freeze().expect("frozen");
        overlay.layers().current.insert(vec![(b"j".to_vec(), b("2"))], 2, 0);
        assert!(overlay.freeze().is_none(), "one frozen generation at a time");
        assert_eq!(overlay.layers().get(b"k", 2), Some(b("1")));
        overlay.flushed(&frozen);
        assert!(overlay.layers().frozen.is_none());
        assert_eq!(overlay.layers().get(b"k", 2), None, "redb holds it now");
        assert_eq!(overlay.layers().get(b"j", 2), Some(b("2")));
    }

    #[test]
    fn a_cursor_reads_every_key_in_order_across_chunks_both_ways() {
        let g = Generation::default();
        let n = CHUNK * 2 + 200; // 712: the range below spans three chunks
        let writes = (0..n).map(|i| (format!("k{i:05}").into_bytes(), b("v"))).collect();
        g.insert(writes, 1, 0);
        for reverse in [false, true] {
            let mut c = Cursor::new(&g, (b"k00010", b"k00600"), reverse, 1);
            let mut seen = Vec::new();
            while let Some((k, _)) = c.pop() {
                seen.push(String::from_utf8(k).unwrap());
            }
            let mut want: Vec<String> = (10..600).map(|i| format!("k{i:05}")).collect();
            if reverse {
                want.reverse();
            }
            assert_eq!(seen, want, "reverse: {reverse}");
        }
    }
}
