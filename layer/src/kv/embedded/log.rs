//! The commit log: what makes a group commit durable between two engine checkpoints.
//!
//! A group commit appends one **frame** — the store writes the batch makes, after folding
//! (each key's final value or its removal, each cleared range) — to `<store>.log`, syncs it
//! (`fdatasync`), then commits the same writes to redb **without** syncing
//! (`Durability::None`: redb keeps the pages in memory and makes the commit visible to new
//! read transactions). Only then are the batch's transactions acknowledged and published: a
//! reader never sees a write that is not on disk. Every `checkpoint_interval_ms`, or when the
//! log passes `checkpoint_log_bytes`, a batch is instead committed durably by redb (two-phase,
//! quick repair, as before) and the log is emptied: every page the commits in between rewrote is
//! written once, not once per commit.
//!
//! **Recovery**: the open (and a re-open after an I/O error, which loses redb's unsynced
//! commits) reads redb's last durable version, then re-applies, in order, every whole frame of
//! the log above it, commits that durably and empties the log. Frames carry their commit
//! version: frames at or below the durable version (a checkpoint that did not get to empty
//! the log) are skipped, and re-applying a frame is idempotent (final values, not deltas).
//! A frame cut short by a crash was never acknowledged (its sync did not return): it is
//! dropped. Anything readable as a whole frame *after* an invalid one means the log was
//! damaged, not cut: the store is then refused as damaged rather than served without it.
//!
//! Frame: `KLG1` · version (u64 LE) · body length (u32 LE) · CRC-32 of version, length and
//! body (u32 LE) · body. Body: operations, each a tag — 0 remove (key), 1 set (key, value),
//! 2 clear range (begin, end) — and its byte strings, each as a u32 LE length and the bytes.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use redb::ReadableTable;

use super::errors::classify;
use crate::kv::error::{Error, Result};
use crate::kv::local::mutation::ApplyTarget;

const MAGIC: &[u8; 4] = b"KLG1";
/// Magic, version, body length, CRC.
pub(crate) const FRAME_HEADER_BYTES: usize = 4 + 8 + 4 + 4;

const REMOVE: u8 = 0;
const SET: u8 = 1;
const CLEAR_RANGE: u8 = 2;

/// The log of `store` (`kv.redb` → `kv.redb.log`).
pub(crate) fn log_path(store: &Path) -> PathBuf {
    let mut p = store.as_os_str().to_owned();
    p.push(".log");
    PathBuf::from(p)
}

/// One batch's store writes, encoded as they are made (the body of its frame).
#[derive(Default)]
pub(crate) struct FrameBody(Vec<u8>);

impl FrameBody {
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.0.extend_from_slice(b);
    }

    /// A key set to `value`, or removed (`None`).
    pub(crate) fn put(&mut self, key: &[u8], value: Option<&[u8]>) {
        match value {
            Some(v) => {
                self.0.push(SET);
                self.bytes(key);
                self.bytes(v);
            }
            None => {
                self.0.push(REMOVE);
                self.bytes(key);
            }
        }
    }

    /// Every key in `[begin, end)` removed.
    pub(crate) fn clear_range(&mut self, begin: &[u8], end: &[u8]) {
        self.0.push(CLEAR_RANGE);
        self.bytes(begin);
        self.bytes(end);
    }
}

/// Writes going straight to the redb table: a batch without the commit log, and the replay.
/// (With the log, a batch goes to its frame and the overlay: [`StagedTarget`](super::overlay).)
pub(crate) struct TableTarget<'a, 't> {
    pub table: &'a mut redb::Table<'t, &'static [u8], &'static [u8]>,
}

impl ApplyTarget for TableTarget<'_, '_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self
            .table
            .get(key)
            .map_err(|e| classify("write", e))?
            .map(|g| Bytes::copy_from_slice(g.value())))
    }
    fn put(&mut self, key: &[u8], value: Option<Bytes>) -> Result<()> {
        match value {
            Some(v) => self.table.insert(key, v.as_ref()).map(|_| ()),
            None => self.table.remove(key).map(|_| ()),
        }
        .map_err(|e| classify("write", e))
    }
    fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.table.retain_in::<&[u8], _>(begin..end, |_, _| false).map_err(|e| classify("write", e))
    }
}

fn frame_crc(version: u64, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&version.to_le_bytes());
    h.update(&(body.len() as u32).to_le_bytes());
    h.update(body);
    h.finalize()
}

/// The open log file, appended to by the group committer only.
pub(crate) struct CommitLog {
    path: PathBuf,
    file: File,
    /// Bytes of whole frames in the file (all synced).
    len: u64,
    /// A failed append could not be cut back off: the next append cuts it first.
    cut_pending: bool,
    /// The frame being written (header and body), kept to spare an allocation per batch.
    scratch: Vec<u8>,
    /// The tests' injected faults, as the engine's file sees them: writes failing with ENOSPC,
    /// and a panic at a write.
    faults: Faults,
}

/// Faults injected by tests (`EmbeddedOptions::disk_writes_fail`, `engine_panics`).
#[derive(Clone, Default)]
pub(crate) struct Faults {
    pub full: Option<Arc<AtomicBool>>,
    pub panics: Option<Arc<AtomicBool>>,
}

impl Faults {
    fn check(&self) -> std::io::Result<()> {
        if self.panics.as_ref().is_some_and(|p| p.load(Ordering::SeqCst)) {
            panic!("injected engine panic (a damaged page)");
        }
        if self.full.as_ref().is_some_and(|f| f.load(Ordering::SeqCst)) {
            return Err(std::io::Error::from_raw_os_error(28));
        }
        Ok(())
    }
}

impl CommitLog {
    /// Opens (creating) the log of `store`, to append after `len` bytes of whole frames.
    fn open_at(store: &Path, len: u64, faults: Faults) -> Result<CommitLog> {
        let path = log_path(store);
        // Private like the store (the node makes its data directory's files 0600).
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_error(&path, "open", &e))?;
        let mut log =
            CommitLog { path, file, len, cut_pending: false, scratch: Vec::new(), faults };
        log.cut_pending = log.file.metadata().map(|m| m.len() != len).unwrap_or(true);
        Ok(log)
    }

    /// Bytes of whole frames written since the last checkpoint.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Appends one frame and syncs it. On failure the log is cut back to its whole frames (or
    /// will be, before the next append), so a failed batch never comes back at a replay.
    pub(crate) fn append(&mut self, version: u64, body: &FrameBody) -> Result<()> {
        self.cut_back()?;
        let body = &body.0;
        self.scratch.clear();
        self.scratch.extend_from_slice(MAGIC);
        self.scratch.extend_from_slice(&version.to_le_bytes());
        self.scratch.extend_from_slice(&(body.len() as u32).to_le_bytes());
        self.scratch.extend_from_slice(&frame_crc(version, body).to_le_bytes());
        self.scratch.extend_from_slice(body);
        let written = self
            .faults
            .check()
            .and_then(|()| self.file.write_all(&self.scratch))
            .and_then(|()| self.file.sync_data());
        match written {
            Ok(()) => {
                self.len += self.scratch.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.cut_pending = true;
                let _ = self.cut_back();
                Err(io_error(&self.path, "write", &e))
            }
        }
    }

    /// Cuts anything after the whole frames off (a failed append's bytes).
    fn cut_back(&mut self) -> Result<()> {
        if !self.cut_pending {
            return Ok(());
        }
        self.file
            .set_len(self.len)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| io_error(&self.path, "cut back", &e))?;
        self.cut_pending = false;
        Ok(())
    }

    /// Empties the log: everything in it is in the engine's last durable commit.
    pub(crate) fn reset(&mut self) -> Result<()> {
        // Not synced: frames that survive a crash are at or below the durable version and
        // skipped at the replay.
        self.file.set_len(0).map_err(|e| io_error(&self.path, "empty", &e))?;
        self.len = 0;
        self.cut_pending = false;
        Ok(())
    }
}

fn io_error(path: &Path, what: &str, e: &std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::StorageFull || e.raw_os_error() == Some(28) {
        Error::StorageFull(format!(
            "cannot {what} the commit log {}: the disk is full",
            path.display()
        ))
    } else {
        Error::Storage(format!("cannot {what} the commit log {}: {e}", path.display()))
    }
}

/// A whole frame read back.
#[derive(Debug)]
pub(crate) struct Frame<'a> {
    pub version: u64,
    pub body: &'a [u8],
}

/// The log's whole frames, and how many bytes after them were dropped (a frame cut short).
#[derive(Debug)]
pub(crate) struct LogRead<'a> {
    pub frames: Vec<Frame<'a>>,
    pub dropped_bytes: usize,
}

/// The whole frame at `at`, if one is there.
fn frame_at(bytes: &[u8], at: usize) -> Option<(Frame<'_>, usize)> {
    let head = bytes.get(at..at + FRAME_HEADER_BYTES)?;
    if &head[..4] != MAGIC {
        return None;
    }
    let version = u64::from_le_bytes(head[4..12].try_into().ok()?);
    let len = u32::from_le_bytes(head[12..16].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(head[16..20].try_into().ok()?);
    let start = at + FRAME_HEADER_BYTES;
    let body = bytes.get(start..start.checked_add(len)?)?;
    (frame_crc(version, body) == crc).then_some((Frame { version, body }, start + len))
}

/// Reads the log's frames. A frame cut short (or unreadable) ends the log; a whole frame
/// found after it, or versions that do not rise, mean damage.
pub(crate) fn read_frames(bytes: &[u8]) -> std::result::Result<LogRead<'_>, String> {
    let mut frames: Vec<Frame<'_>> = Vec::new();
    let mut at = 0;
    while let Some((frame, next)) = frame_at(bytes, at) {
        if frames.last().is_some_and(|l| l.version >= frame.version) {
            return Err(format!(
                "the commit log's versions do not rise at byte {at} ({} after {})",
                frame.version,
                frames.last().map_or(0, |l| l.version)
            ));
        }
        frames.push(frame);
        at = next;
    }
    // A crash cuts the last frame short; a whole frame beyond the cut is damage.
    if let Some(later) = (at + 1..bytes.len()).find(|&i| frame_at(bytes, i).is_some()) {
        return Err(format!(
            "the commit log is damaged at byte {at}: a whole frame follows at byte {later}"
        ));
    }
    Ok(LogRead { frames, dropped_bytes: bytes.len() - at })
}

fn take<'a>(body: &mut &'a [u8]) -> std::result::Result<&'a [u8], String> {
    let bad = || "a commit log frame's operation is cut short".to_string();
    let len = body.get(..4).ok_or_else(bad)?;
    let len = u32::from_le_bytes(len.try_into().map_err(|_| bad())?) as usize;
    let bytes = body.get(4..4 + len).ok_or_else(bad)?;
    *body = &body[4 + len..];
    Ok(bytes)
}

/// Applies one frame's operations to `target`, in order.
pub(crate) fn apply_frame(frame: &Frame<'_>, target: &mut dyn ApplyTarget) -> Result<()> {
    let damaged = |why: String| Error::Storage(format!("the commit log is damaged: {why}"));
    let mut body = frame.body;
    while let Some((&tag, rest)) = body.split_first() {
        body = rest;
        match tag {
            SET => {
                let key = take(&mut body).map_err(damaged)?;
                let value = take(&mut body).map_err(damaged)?;
                target.put(key, Some(bytes::Bytes::copy_from_slice(value)))?;
            }
            REMOVE => target.put(take(&mut body).map_err(damaged)?, None)?,
            CLEAR_RANGE => {
                let begin = take(&mut body).map_err(damaged)?;
                let end = take(&mut body).map_err(damaged)?;
                target.clear_range(begin, end)?;
            }
            other => return Err(damaged(format!("unknown operation {other}"))),
        }
    }
    Ok(())
}

/// The log of `store` as it is on disk (empty if there is none).
pub(crate) fn read_file(store: &Path) -> Result<Vec<u8>> {
    let path = log_path(store);
    let mut bytes = Vec::new();
    match File::open(&path) {
        Ok(mut f) => {
            f.read_to_end(&mut bytes).map_err(|e| io_error(&path, "read", &e))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(&path, "open", &e)),
    }
    Ok(bytes)
}

/// What a store whose log is damaged (`why`) reports, with the way out.
pub(crate) fn damaged_reason(store: &Path, why: &str) -> String {
    format!(
        "{why}; to open the store without the commits after that point, move {} away",
        log_path(store).display()
    )
}

/// Refuses a log whose store is missing: replayed onto a new, empty store it would make a
/// store of the log's last second alone.
pub(crate) fn refuse_without_store(store: &Path) -> Result<()> {
    if read_file(store)?.is_empty() {
        return Ok(());
    }
    Err(Error::Storage(format!(
        "{} holds commits of a store that is not there ({} is missing): restore the store, or \
         move the log away to start a new one",
        log_path(store).display(),
        store.display()
    )))
}

/// Opens the log of `store` for appending, empty (call once its frames are in a durable
/// engine commit).
pub(crate) fn open_empty(store: &Path, faults: Faults) -> Result<CommitLog> {
    let mut log = CommitLog::open_at(store, 0, faults)?;
    log.cut_back()?;
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn frame(version: u64, body: &FrameBody) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&(body.0.len() as u32).to_le_bytes());
        out.extend_from_slice(&frame_crc(version, &body.0).to_le_bytes());
        out.extend_from_slice(&body.0);
        out
    }

    #[derive(Default)]
    struct Map(BTreeMap<Vec<u8>, Vec<u8>>);
    impl ApplyTarget for Map {
        fn get(&mut self, key: &[u8]) -> Result<Option<bytes::Bytes>> {
            Ok(self.0.get(key).map(|v| bytes::Bytes::copy_from_slice(v)))
        }
        fn put(&mut self, key: &[u8], value: Option<bytes::Bytes>) -> Result<()> {
            match value {
                Some(v) => self.0.insert(key.to_vec(), v.to_vec()),
                None => self.0.remove(key),
            };
            Ok(())
        }
        fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> Result<()> {
            self.0.retain(|k, _| !(begin <= k.as_slice() && k.as_slice() < end));
            Ok(())
        }
    }

    fn bodies() -> (FrameBody, FrameBody) {
        let mut a = FrameBody::default();
        a.put(b"a1", Some(b"one"));
        a.put(b"a2", Some(b""));
        a.put(b"b1", Some(b"x"));
        let mut b = FrameBody::default();
        b.clear_range(b"a", b"a2");
        b.put(b"b1", None);
        b.put(b"c", Some(&[7u8; 300]));
        (a, b)
    }

    #[test]
    fn frames_read_back_and_replay_to_the_same_store() {
        let (a, b) = bodies();
        let mut log = frame(5, &a);
        log.extend(frame(9, &b));
        let read = read_frames(&log).unwrap();
        assert_eq!(read.dropped_bytes, 0);
        assert_eq!(read.frames.iter().map(|f| f.version).collect::<Vec<_>>(), vec![5, 9]);
        let mut map = Map::default();
        for f in &read.frames {
            apply_frame(f, &mut map).unwrap();
        }
        let keys: Vec<&[u8]> = map.0.keys().map(|k| k.as_slice()).collect();
        assert_eq!(keys, vec![b"a2".as_slice(), b"c".as_slice()]);
        // Replaying again changes nothing (a replay interrupted by a crash runs again).
        for f in &read.frames {
            apply_frame(f, &mut map).unwrap();
        }
        assert_eq!(map.0.len(), 2);
    }

    #[test]
    fn a_frame_cut_short_is_dropped_at_every_length() {
        let (a, b) = bodies();
        let first = frame(5, &a);
        let second = frame(9, &b);
        for cut in 0..second.len() {
            let mut log = first.clone();
            log.extend_from_slice(&second[..cut]);
            let read = read_frames(&log).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            assert_eq!(read.frames.len(), 1, "cut at {cut}");
            assert_eq!(read.dropped_bytes, cut);
        }
    }

    #[test]
    fn a_damaged_frame_with_whole_frames_after_it_is_damage_not_a_cut() {
        let (a, b) = bodies();
        let mut log = frame(5, &a);
        log.extend(frame(9, &b));
        log.extend(frame(12, &a));
        let flip = FRAME_HEADER_BYTES + 3;
        log[flip] ^= 0x40;
        let err = read_frames(&log).unwrap_err();
        assert!(err.contains("damaged at byte 0"), "{err}");
        // Versions that fall back are damage too.
        let mut log = frame(9, &a);
        log.extend(frame(5, &b));
        assert!(read_frames(&log).unwrap_err().contains("do not rise"));
    }

    #[test]
    fn a_failed_append_never_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("kv.redb");
        let (a, b) = bodies();
        let mut log = open_empty(&store, Faults::default()).unwrap();
        log.append(3, &a).unwrap();
        let len = log.len();
        // A failed append's bytes (written, its sync failed): cut back before the next one.
        std::fs::OpenOptions::new()
            .append(true)
            .open(log_path(&store))
            .unwrap()
            .write_all(&frame(4, &b))
            .unwrap();
        log.cut_pending = true;
        log.append(5, &b).unwrap();
        let bytes = read_file(&store).unwrap();
        let read = read_frames(&bytes).unwrap();
        assert_eq!(read.frames.iter().map(|f| f.version).collect::<Vec<_>>(), vec![3, 5]);
        assert_eq!(log.len() as usize, bytes.len());
        assert!(len < log.len());
        log.reset().unwrap();
        assert!(read_file(&store).unwrap().is_empty());
    }
}
