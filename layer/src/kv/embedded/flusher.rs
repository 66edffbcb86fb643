//! The flusher (ADR 0013): a thread that writes a frozen generation of the overlay into redb,
//! without a sync, while the group committer goes on resolving, logging and publishing the
//! batches after it. A flush is a redb write transaction of the generation's latest values in
//! key order; once it commits, the generation leaves the overlay and snapshots read redb
//! instead. The group committer freezes a generation every `flush_interval_ms` when no flush is
//! under way, and waits for the one under way before a durable checkpoint (which then writes
//! the rest, synced, and empties the log) and before re-opening the engine.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;

use super::contain::contain;
use super::engine::Engine;
use super::errors::classify;
use super::overlay::{Generation, Overlay};
use super::{DATA, META, META_VERSION};
use crate::kv::error::{Error, Result};

/// How a flush ended: its result, or the message of a panic of the engine (a damaged file).
pub(crate) type Outcome = std::result::Result<Result<()>, String>;

struct Flush {
    generation: Arc<Generation>,
    version: u64,
    done: Sender<Outcome>,
}

/// The flusher's thread and the flush under way, if any.
pub(crate) struct Flusher {
    jobs: Option<Sender<Flush>>,
    thread: Option<JoinHandle<()>>,
    /// The flush under way: its outcome arrives here.
    pending: Option<Receiver<Outcome>>,
}

fn storage(e: impl Into<redb::Error>) -> Error {
    classify("write", e)
}

/// redb takes `generations` (oldest first: a later one's value of a key wins) in one write
/// transaction, in key order, its version recorded as `version`; synced if `durable`.
pub(crate) fn write_generations(
    engine: &Engine,
    generations: &[&Generation],
    version: u64,
    durable: bool,
) -> Result<()> {
    let db = engine.current()?;
    let mut w = db.begin_write().map_err(storage)?;
    if !durable {
        w.set_durability(redb::Durability::None)
            .map_err(|e| Error::Storage(format!("write: {e}")))?;
    }
    w.set_quick_repair(true);
    {
        let mut table = w.open_table(DATA).map_err(storage)?;
        let mut meta = w.open_table(META).map_err(storage)?;
        for generation in generations {
            generation.each_latest(|k, v| {
                match v {
                    Some(v) => table.insert(k, v).map(|_| ()),
                    None => table.remove(k).map(|_| ()),
                }
                .map_err(storage)
            })?;
        }
        meta.insert(META_VERSION, version).map_err(storage)?;
    }
    w.commit().map_err(storage)
}

impl Flusher {
    pub(crate) fn start(engine: Arc<Engine>, overlay: Arc<Overlay>) -> Result<Flusher> {
        let (jobs, rx) = std::sync::mpsc::channel::<Flush>();
        let thread = std::thread::Builder::new()
            .name("kairos-flusher".into())
            .spawn(move || {
                while let Ok(f) = rx.recv() {
                    let outcome =
                        contain(|| write_generations(&engine, &[&f.generation], f.version, false));
                    if matches!(outcome, Ok(Ok(()))) {
                        overlay.flushed(&f.generation);
                    }
                    let _ = f.done.send(outcome);
                }
            })
            .map_err(|e| Error::Storage(format!("cannot start the flusher thread: {e}")))?;
        Ok(Flusher { jobs: Some(jobs), thread: Some(thread), pending: None })
    }

    /// Whether a flush is under way (its outcome not yet taken).
    pub(crate) fn busy(&self) -> bool {
        self.pending.is_some()
    }

    /// Hands `generation` (frozen, every write at or below `version`) to the flusher.
    pub(crate) fn start_flush(&mut self, generation: Arc<Generation>, version: u64) {
        assert!(self.pending.is_none(), "one flush at a time");
        let (done, rx) = std::sync::mpsc::channel();
        if let Some(jobs) = &self.jobs {
            // If the thread is gone, the job is dropped with its sender: `finished` reports it.
            let _ = jobs.send(Flush { generation, version, done });
        }
        self.pending = Some(rx);
    }

    /// The outcome of the flush under way if it has ended (`None` while it runs or when there
    /// is none).
    pub(crate) fn finished(&mut self) -> Option<Outcome> {
        let rx = self.pending.as_ref()?;
        let outcome = match rx.try_recv() {
            Ok(o) => o,
            Err(TryRecvError::Empty) => return None,
            Err(TryRecvError::Disconnected) => Err("the flusher thread stopped".into()),
        };
        self.pending = None;
        Some(outcome)
    }

    /// Waits for the flush under way, if any, and returns its outcome.
    pub(crate) fn wait(&mut self) -> Option<Outcome> {
        let rx = self.pending.take()?;
        Some(rx.recv().unwrap_or_else(|_| Err("the flusher thread stopped".into())))
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        let _ = self.wait();
        self.jobs = None; // the thread's loop ends
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
