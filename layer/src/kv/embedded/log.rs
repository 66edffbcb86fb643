//! The commit log: what makes a group commit durable between two engine checkpoints.
//!
//! A group commit appends one **frame** — the store writes the batch makes, after folding
//! (each key's final value or its removal, each cleared range) — to `<store>.log` and syncs it
//! (`fdatasync`); the same writes go to the in-memory overlay ([`overlay`](super::overlay)),
//! and only then are the batch's transactions acknowledged and published: a reader never sees a
//! write that is not on disk. Every `checkpoint_interval_ms`, or when the log passes
//! `checkpoint_log_bytes`, redb takes the overlay in one durable commit (two-phase, quick
//! repair) and the log starts again from its first byte: every page the commits in between
//! rewrote is written once, not once per commit.
//!
//! **The file is reused, not emptied**: it grows (by zero-filled steps of
//! [`LOG_GROWTH_BYTES`]) to what one checkpoint interval needs and keeps that size, so an append
//! overwrites bytes already allocated and its `fdatasync` writes data alone, with no file-size
//! or extent change for the file system's journal to commit. After the frames of the current
//! interval come zeros or an earlier interval's frames, whose versions are lower. A clean close
//! truncates it to nothing.
//!
//! **Recovery**: the open (and a re-open after an I/O error) reads redb's last durable version,
//! then re-applies, in order, the log's frames above it — the run of whole frames from the
//! first byte while their versions rise — commits that durably and starts the log again.
//! Frames at or below the durable version (a checkpoint that did not get to restart the log)
//! are skipped, and re-applying a frame is idempotent (final values, not deltas). A frame cut
//! short by a crash was never acknowledged (its sync did not return): it ends the run. A whole
//! frame *after* the end of the run, newer than every frame in it and than redb, means the log
//! was damaged, not cut: the store is then refused as damaged rather than served without it.
//!
//! Frame: `KLG1` · version (u64 LE) · body length (u32 LE) · CRC-32 of version, length and
//! body (u32 LE) · body. Body: operations, each a tag — 0 remove (key), 1 set (key, value),
//! 2 clear range (begin, end) — and its byte strings, each as a u32 LE length and the bytes.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
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

/// How much the log file grows at a time, zero-filled (allocated before it is appended to).
pub const LOG_GROWTH_BYTES: u64 = 4 * 1024 * 1024;

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
    /// Bytes of whole frames since the last checkpoint (all synced), from the file's start.
    len: u64,
    /// The file's size: bytes past `len` are zeros or frames of earlier intervals.
    allocated: u64,
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
            .truncate(false) // the file is reused: its frames are read at the open
            .read(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_error(&path, "open", &e))?;
        let allocated = file.metadata().map_err(|e| io_error(&path, "open", &e))?.len();
        let log = CommitLog {
            path,
            file,
            len,
            allocated,
            cut_pending: false,
            scratch: Vec::new(),
            faults,
        };
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
        let end = self.len + self.scratch.len() as u64;
        let written = self
            .faults
            .check()
            .and_then(|()| self.grow_to(end))
            .and_then(|()| self.file.write_all_at(&self.scratch, self.len))
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

    /// Zero-fills the file up to at least `end` (in steps of [`LOG_GROWTH_BYTES`]); synced
    /// with the frame written into it.
    fn grow_to(&mut self, end: u64) -> std::io::Result<()> {
        static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
        while self.allocated < end {
            let step = (LOG_GROWTH_BYTES - self.allocated % LOG_GROWTH_BYTES) as usize;
            let mut at = self.allocated;
            let stop = self.allocated + step as u64;
            while at < stop {
                let n = ZEROS.len().min((stop - at) as usize);
                self.file.write_all_at(&ZEROS[..n], at)?;
                at += n as u64;
            }
            self.allocated = stop;
        }
        Ok(())
    }

    /// Wipes a failed append's frame (its header zeroed and synced), so it never reads back.
    fn cut_back(&mut self) -> Result<()> {
        if !self.cut_pending {
            return Ok(());
        }
        let end = self.allocated.min(self.len + FRAME_HEADER_BYTES as u64);
        let zeros = [0u8; FRAME_HEADER_BYTES];
        let n = end.saturating_sub(self.len) as usize;
        self.file
            .write_all_at(&zeros[..n], self.len)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| io_error(&self.path, "cut back", &e))?;
        self.cut_pending = false;
        Ok(())
    }

    /// Starts the log again from its first byte: everything in it is in the engine's last
    /// durable commit.
    pub(crate) fn reset(&mut self) -> Result<()> {
        // Nothing to write: the frames left are at or below the durable version, skipped at
        // the replay, and the next frame's higher version ends their run.
        self.len = 0;
        self.cut_pending = false;
        Ok(())
    }

    /// Empties the file (a clean close: a stopped store keeps no allocated log).
    pub(crate) fn truncate(&mut self) -> Result<()> {
        self.file
            .set_len(0)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| io_error(&self.path, "empty", &e))?;
        self.len = 0;
        self.allocated = 0;
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

/// The log's whole frames, and how many bytes after them were not zeros (a frame cut short,
/// or an earlier interval's frames).
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

/// Reads the log's frames: the run of whole frames from the first byte while their versions
/// rise (a frame cut short, zeros, or an earlier interval's older frame ends it). A whole frame
/// after the run newer than every version read and than `durable` (redb's) means damage.
pub(crate) fn read_frames(bytes: &[u8], durable: u64) -> std::result::Result<LogRead<'_>, String> {
    let mut frames: Vec<Frame<'_>> = Vec::new();
    let mut at = 0;
    while let Some((frame, next)) = frame_at(bytes, at) {
        if frames.last().is_some_and(|l| l.version >= frame.version) {
            break;
        }
        frames.push(frame);
        at = next;
    }
    let newest = frames.last().map_or(durable, |l| l.version.max(durable));
    let mut from = at + 1;
    while let Some(i) = bytes.get(from..).and_then(|b| b.iter().position(|&x| x == MAGIC[0])) {
        let i = from + i;
        if let Some((later, _)) = frame_at(bytes, i)
            && later.version > newest
        {
            return Err(format!(
                "the commit log is damaged at byte {at}: a whole newer frame (version {}) \
                 follows at byte {i}",
                later.version
            ));
        }
        from = i + 1;
    }
    let rest = &bytes[at.min(bytes.len())..];
    let dropped_bytes = rest.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    Ok(LogRead { frames, dropped_bytes })
}

/// The version of redb's last durable commit (0 for a new store).
pub(crate) fn durable_version(db: &redb::Database) -> std::result::Result<u64, redb::Error> {
    use redb::ReadableDatabase;
    let r = db.begin_read()?;
    match r.open_table(super::META) {
        Ok(meta) => Ok(meta.get(super::META_VERSION)?.map_or(0, |g| g.value())),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
        Err(e) => Err(e.into()),
    }
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
    if frame_at(&read_file(store)?, 0).is_none() {
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
    CommitLog::open_at(store, 0, faults)
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
        log.extend([0u8; 100]);
        let read = read_frames(&log, 0).unwrap();
        assert_eq!(read.dropped_bytes, 0, "zero-filled space is not dropped data");
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
            log.extend([0u8; 64]);
            let read = read_frames(&log, 0).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            assert_eq!(read.frames.len(), 1, "cut at {cut}");
            assert!(read.dropped_bytes <= cut, "cut at {cut}");
        }
    }

    #[test]
    fn a_damaged_frame_with_newer_whole_frames_after_it_is_damage_not_a_cut() {
        let (a, b) = bodies();
        let mut log = frame(5, &a);
        log.extend(frame(9, &b));
        log.extend(frame(12, &a));
        let flip = FRAME_HEADER_BYTES + 3;
        log[flip] ^= 0x40;
        let err = read_frames(&log, 0).unwrap_err();
        assert!(err.contains("damaged at byte 0"), "{err}");
        // Newer than redb's durable version, too: an earlier interval's frames are not.
        assert!(read_frames(&log, 12).is_ok());
        // An older frame after the run is an earlier interval's, left behind: the run ends.
        let mut log = frame(9, &a);
        log.extend(frame(5, &b));
        let read = read_frames(&log, 0).unwrap();
        assert_eq!(read.frames.iter().map(|f| f.version).collect::<Vec<_>>(), vec![9]);
    }

    #[test]
    fn a_failed_append_never_comes_back_and_a_restarted_log_ends_at_its_newest_frame() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("kv.redb");
        let (a, b) = bodies();
        let mut log = open_empty(&store, Faults::default()).unwrap();
        log.append(3, &a).unwrap();
        let len = log.len();
        // A failed append's frame (written whole, its sync failed): wiped before anything else.
        let file = OpenOptions::new().write(true).open(log_path(&store)).unwrap();
        file.write_all_at(&frame(4, &b), len).unwrap();
        log.cut_pending = true;
        log.cut_back().unwrap();
        let versions = |durable| {
            let bytes = read_file(&store).unwrap();
            read_frames(&bytes, durable)
                .unwrap()
                .frames
                .iter()
                .map(|f| f.version)
                .collect::<Vec<_>>()
        };
        assert_eq!(versions(0), vec![3]);
        log.append(5, &b).unwrap();
        assert_eq!(versions(0), vec![3, 5]);
        // The file grew by one zero-filled step and holds nothing past the frames.
        let bytes = read_file(&store).unwrap();
        assert_eq!(bytes.len() as u64, LOG_GROWTH_BYTES);
        assert!(bytes[log.len() as usize..].iter().all(|&x| x == 0));
        assert!(len < log.len());
        // Restarted after a checkpoint at 5: the old frames stay until overwritten; the next
        // frame's run ends before them.
        log.reset().unwrap();
        assert_eq!(versions(5), vec![3, 5], "skipped at a replay: at or below the durable 5");
        log.append(7, &a).unwrap();
        assert_eq!(versions(5), vec![7]);
        log.truncate().unwrap();
        assert!(read_file(&store).unwrap().is_empty());
    }
}
