//! The writes made durable by the commit log since the last checkpoint, kept in memory
//! (ADR 0012): a group commit appends its frame, syncs it, and puts its writes here, by version;
//! redb takes them all at the next checkpoint, in one durable commit, in key order.
//!
//! A snapshot reads this **generation** at its version first, then redb. A checkpoint starts a
//! new, empty generation once redb holds the old one; a snapshot taken before keeps the old one
//! with the redb read transaction it opened, so its view never changes.

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

/// The generations: the current one takes the group commits; a snapshot holds the one it saw.
#[derive(Default)]
pub(crate) struct Overlay {
    current: RwLock<Arc<Generation>>,
}

impl Overlay {
    /// The current generation, read under the overlay's lock while `open` opens what goes with
    /// it (redb's read transaction): a checkpoint's swap waits for it, so a snapshot never pairs
    /// a new generation with redb from before the checkpoint.
    pub(crate) fn with_current<T>(&self, open: impl FnOnce(&Arc<Generation>) -> T) -> T {
        let g = self.current.read().unwrap_or_else(|e| e.into_inner());
        open(&g)
    }

    pub(crate) fn current(&self) -> Arc<Generation> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// redb holds every write of the current generation durably: later snapshots read redb.
    pub(crate) fn swap(&self) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::default();
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
    pub(crate) fn live_keys(&self, begin: &[u8], end: &[u8]) -> Vec<(Vec<u8>, bool)> {
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
    pub generation: &'a Generation,
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
        match self.generation.latest(key) {
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
        // The generation's latest state overrides redb's: a deletion there needs no other.
        live.extend(self.generation.live_keys(begin, end));
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
