//! The group committer: one thread that resolves queued commits in order and makes each batch
//! durable with one fsync — of the batch's frame in the commit log (module [`log`](super::log)),
//! its writes then kept in the overlay (module [`overlay`](super::overlay)) until redb takes them
//! at a flush or a checkpoint; without the log, of one durable redb commit per batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;

use bytes::Bytes;
use redb::ReadableDatabase;
use tokio::sync::oneshot;

use super::contain::contain;
use super::engine::Engine;
use super::errors::{classify, needs_reopen};
use super::log::{FrameBody, TableTarget};
use super::overlay::{Overlay, StagedTarget};
use super::{DATA, EmbeddedStats, META, META_VERSION};
use crate::env::SharedClock;
use crate::kv::error::{Error, Result};
use crate::kv::limits::GROUP_COMMIT_TRANSACTIONS_MAX;
use crate::kv::local::mutation::{Change, Mutation, apply_batch, stamped_write_ranges};
use crate::kv::local::resolver::Resolver;
use crate::kv::local::watch::Watches;
use crate::kv::local::{ActiveReads, CommitRequest};
use crate::kv::{CommitInfo, StoreHealth, Versionstamp};

/// A job accepted into a batch: where its result goes, and what it will be.
type Accepted = (oneshot::Sender<Result<CommitInfo>>, CommitInfo);

pub(crate) struct Job {
    pub req: CommitRequest,
    pub reply: oneshot::Sender<Result<CommitInfo>>,
}

pub(crate) struct Committer {
    engine: Arc<Engine>,
    clock: SharedClock,
    watches: Arc<Watches>,
    stats: Arc<EmbeddedStats>,
    resolver: Resolver,
    active: Arc<ActiveReads>,
    /// The last version made durable (and visible to new snapshots).
    published: Arc<AtomicU64>,
    /// The store writes of the batch being committed, as its commit log frame.
    frame: FrameBody,
    /// When redb last committed durably (the log was emptied).
    last_checkpoint: crate::env::Timestamp,
    /// When redb last took the overlay (durably or not).
    last_flush: crate::env::Timestamp,
    /// The last batch failed writing the commit log (the engine itself is sound).
    log_failed: bool,
    /// The writes the log holds and redb does not yet (module [`overlay`](super::overlay)).
    overlay: Arc<Overlay>,
}

/// The committer has no logger: a failed re-check leaves the watches as they are (they fire on
/// the next change of their keys).
fn tracing_free_warn(_: &Error) {}

fn storage(e: impl Into<redb::Error>) -> Error {
    classify("write", e)
}

impl Committer {
    fn revalidate_watches(&self) {
        let read = || -> Result<redb::ReadOnlyTable<&'static [u8], &'static [u8]>> {
            let r = self.engine.current()?.begin_read().map_err(storage)?;
            r.open_table(DATA).map_err(storage)
        };
        match read() {
            Ok(table) => {
                let generation = self.overlay.current();
                self.watches.revalidate(|k| match generation.latest(k) {
                    Some(v) => v,
                    None => table.get(k).ok().flatten().map(|g| Bytes::copy_from_slice(g.value())),
                })
            }
            Err(e) => tracing_free_warn(&e),
        }
    }

    pub(crate) fn new(
        engine: Arc<Engine>,
        clock: SharedClock,
        (watches, stats, overlay): (Arc<Watches>, Arc<EmbeddedStats>, Arc<Overlay>),
        version: u64,
        (active, published): (Arc<ActiveReads>, Arc<AtomicU64>),
    ) -> Self {
        let last_checkpoint = clock.now();
        Committer {
            engine,
            clock,
            watches,
            stats,
            resolver: Resolver::new(version),
            active,
            published,
            frame: FrameBody::default(),
            last_checkpoint,
            last_flush: last_checkpoint,
            log_failed: false,
            overlay,
        }
    }

    /// Serves commits until every sender is dropped. A panic inside the engine (a damaged
    /// file) is contained: the store is marked failed, and every later commit is refused with
    /// the reason instead of hanging.
    pub(crate) fn run(mut self, jobs: Receiver<Job>) {
        while let Ok(first) = jobs.recv() {
            let mut batch = vec![first];
            while batch.len() < GROUP_COMMIT_TRANSACTIONS_MAX {
                match jobs.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            if let StoreHealth::Failed { reason } = self.engine.health() {
                for job in batch {
                    let _ = job.reply.send(Err(Error::Storage(reason.clone())));
                }
                continue;
            }
            let outcome = contain(|| self.commit_batch(batch));
            if let Err(panic) = outcome {
                // The batch's replies were dropped with the unwinding: their callers see an
                // unknown result and retry, and get the reason below.
                let what = panic;
                self.engine.set_health(StoreHealth::Failed {
                    reason: format!(
                        "the storage engine failed ({what}): the store may be damaged; stop the \
                         node and run `kairos check`"
                    ),
                });
            }
        }
        self.checkpoint_at_close();
    }

    /// The store is closing: one durable engine commit takes in every commit the log holds, and
    /// the log is emptied (a clean close leaves nothing to replay).
    fn checkpoint_at_close(&mut self) {
        if matches!(self.engine.health(), StoreHealth::Failed { .. }) {
            return;
        }
        if self.engine.log().as_ref().is_some_and(|l| l.len() > 0)
            || !self.overlay.current().is_empty()
        {
            let _ = contain(|| self.checkpoint(true));
        }
        // Everything is in redb: a stopped store keeps no log file's worth of space.
        if let Some(log) = self.engine.log().as_mut().filter(|l| l.len() == 0) {
            let _ = log.truncate();
        }
    }

    /// Whether redb should take the generation now: durably, the log emptied.
    fn checkpoint_due(&self) -> bool {
        let options = self.engine.options();
        let log_bytes = self.engine.log().as_ref().map_or(0, |l| l.len());
        log_bytes > 0
            && (log_bytes >= options.checkpoint_log_bytes
                || self.clock.now().since(self.last_checkpoint).as_millis()
                    >= u128::from(options.checkpoint_interval_ms))
    }

    /// Whether redb should take the generation now, without a sync: the log keeps it durable,
    /// and the reads stop meeting its deletions (a scan steps over each deleted key redb still
    /// holds).
    fn flush_due(&self) -> bool {
        self.clock.now().since(self.last_flush).as_millis()
            >= u128::from(self.engine.options().flush_interval_ms)
            && !self.overlay.current().is_empty()
    }

    fn commit_batch(&mut self, batch: Vec<Job>) {
        let Some(batch) = self.ready_for(batch) else { return };
        let mut accepted: Vec<Accepted> = Vec::new();
        let mut changes: Vec<Change> = Vec::new();
        let collected = self.watches.any();
        let logged = self.engine.options().commit_log;
        let outcome = if logged {
            self.write_logged(batch, collected, &mut accepted, &mut changes)
        } else {
            self.write(batch, collected, &mut accepted, &mut changes)
        };
        match outcome {
            Ok(()) => self.published(accepted, &changes, collected),
            Err(e) => self.failed(&e, accepted),
        }
        if logged {
            if self.checkpoint_due() {
                self.checkpoint(true);
            } else if self.flush_due() {
                self.checkpoint(false);
            }
        }
    }

    /// The batch made durable by the commit log alone: resolved, its writes encoded into one
    /// frame, appended and synced, then put into the overlay's generation (visible once
    /// published). redb takes them at the next flush or checkpoint.
    fn write_logged(
        &mut self,
        batch: Vec<Job>,
        collect: bool,
        accepted: &mut Vec<Accepted>,
        changes: &mut Vec<Change>,
    ) -> Result<()> {
        let db = self.engine.current()?;
        let generation = self.overlay.current();
        let r = db.begin_read().map_err(storage)?;
        let redb = r.open_table(DATA).map_err(storage)?;
        let resolved = self.resolve(batch, accepted);
        if accepted.is_empty() {
            return Ok(());
        }
        let folded: Vec<(&[Mutation], Versionstamp)> =
            resolved.iter().map(|(m, s)| (m.as_slice(), *s)).collect();
        self.frame.clear();
        let mut target = StagedTarget {
            frame: &mut self.frame,
            generation: &generation,
            redb: &redb,
            staged: Vec::new(),
            cleared: Default::default(),
        };
        changes.extend(apply_batch(&mut target, &folded, collect)?);
        let staged = std::mem::take(&mut target.staged);
        let appended = match self.engine.log().as_mut() {
            Some(log) => log.append(self.resolver.version(), &self.frame),
            None => Err(Error::Storage("the commit log is not open".into())),
        };
        if let Err(e) = appended {
            self.log_failed = true;
            return Err(e);
        }
        let floor = self.active.floor(self.published.load(Ordering::Acquire));
        generation.insert(staged, self.resolver.version(), floor);
        for (m, _) in &resolved {
            self.stats.writes.committed(m);
        }
        Ok(())
    }

    /// redb takes the generation in one commit, in key order, and later snapshots read redb
    /// alone. `durable`: a checkpoint, synced, after which the log starts again; otherwise a
    /// flush, not synced (redb keeps the pages in memory; a re-open replays the log). On
    /// failure the generation and the log stay (the next one tries again); an I/O error
    /// re-opens the engine, which replays the log.
    fn checkpoint(&mut self, durable: bool) {
        let generation = self.overlay.current();
        let version = self.published.load(Ordering::Acquire);
        let written = (|| -> Result<()> {
            let db = self.engine.current()?;
            let mut w = db.begin_write().map_err(storage)?;
            if !durable {
                w.set_durability(redb::Durability::None)
                    .map_err(|e| Error::Storage(format!("write: {e}")))?;
            }
            w.set_quick_repair(true);
            {
                let mut table = w.open_table(DATA).map_err(storage)?;
                let mut meta = w.open_table(META).map_err(storage)?;
                generation.each_latest(|k, v| {
                    match v {
                        Some(v) => table.insert(k, v).map(|_| ()),
                        None => table.remove(k).map(|_| ()),
                    }
                    .map_err(storage)
                })?;
                meta.insert(META_VERSION, version).map_err(storage)?;
            }
            w.commit().map_err(storage)
        })();
        self.last_flush = self.clock.now();
        if durable {
            self.last_checkpoint = self.last_flush;
        }
        match written {
            Ok(()) => {
                self.overlay.swap();
                if durable {
                    self.checkpointed();
                }
            }
            Err(e) if needs_reopen(&e) => {
                self.refuse_writes(&e);
                let _ = self.engine.reopen();
            }
            Err(_) => {}
        }
    }

    /// The batch if the engine can take writes: a full disk is refused before the engine sees
    /// it (the engine stays usable for reads); an engine closed by an earlier I/O error is
    /// re-opened first. Otherwise every job hears why.
    fn ready_for(&mut self, batch: Vec<Job>) -> Option<Vec<Job>> {
        let ready = self
            .engine
            .check_space()
            .and_then(|()| if self.engine.is_open() { Ok(()) } else { self.engine.reopen() });
        let Err(e) = ready else { return Some(batch) };
        let reason = format!("writes refused: {e}");
        self.engine.set_health(StoreHealth::WritesRefused { reason });
        for job in batch {
            let _ = job.reply.send(Err(e.clone()));
        }
        None
    }

    /// Without the commit log: one durable engine transaction for the whole batch, each job
    /// resolved against the conflict history (refused ones hear so at once), the accepted
    /// ones' mutations folded into one store write per distinct key.
    fn write(
        &mut self,
        batch: Vec<Job>,
        collect: bool,
        accepted: &mut Vec<Accepted>,
        changes: &mut Vec<Change>,
    ) -> Result<()> {
        let db = self.engine.current()?;
        let mut w = db.begin_write().map_err(storage)?;
        // Quick repair: a crash costs an O(1) recovery at the next open, not a repair pass
        // over the whole file (redb then writes its allocator state with each commit, and
        // commits in two phases, so a damaged primary is reported, never rolled back to the
        // previous commit). ADR 0009 measured the alternatives.
        w.set_quick_repair(true);
        let resolved;
        {
            let mut table = w.open_table(DATA).map_err(storage)?;
            let mut meta = w.open_table(META).map_err(storage)?;
            resolved = self.resolve(batch, accepted);
            // The whole batch folded: one store write per distinct key, in key order.
            let folded: Vec<(&[Mutation], Versionstamp)> =
                resolved.iter().map(|(m, s)| (m.as_slice(), *s)).collect();
            let mut target = TableTarget { table: &mut table };
            changes.extend(apply_batch(&mut target, &folded, collect)?);
            meta.insert(META_VERSION, self.resolver.version()).map_err(storage)?;
        }
        if accepted.is_empty() {
            w.abort().map_err(storage)?;
            return Ok(());
        }
        w.commit().map_err(storage)?;
        for (m, _) in &resolved {
            self.stats.writes.committed(m);
        }
        Ok(())
    }

    /// A durable engine commit happened: the log's frames are all in it.
    fn checkpointed(&mut self) {
        self.last_checkpoint = self.clock.now();
        if let Some(log) = self.engine.log().as_mut() {
            // If emptying fails, the frames left are at or below the durable version: a replay
            // skips them, and the next checkpoint tries again.
            let _ = log.reset();
        }
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
    }

    /// Resolves each job's conflicts: a refused one hears so at once; an accepted one gets the
    /// next version and its writes join the history.
    fn resolve(
        &mut self,
        batch: Vec<Job>,
        accepted: &mut Vec<Accepted>,
    ) -> Vec<(Vec<Mutation>, Versionstamp)> {
        let now = self.clock.now();
        // Versions above the published one are not durable yet, so no snapshot holds them: the
        // floor stays at or below what snapshots can see.
        let floor = self.active.floor(self.published.load(Ordering::Acquire));
        let mut resolved = Vec::new();
        for job in batch {
            let req = job.req;
            if let Err(e) = self.resolver.check(req.read_version, &req.read_conflicts) {
                self.stats.transactions_rejected.fetch_add(1, Ordering::Relaxed);
                let _ = job.reply.send(Err(e));
                continue;
            }
            let version = self.resolver.next_version();
            let stamp = Versionstamp::new(version, 0);
            let mut writes = req.write_conflicts;
            writes.extend(stamped_write_ranges(&req.mutations, &stamp));
            self.resolver.record(version, writes, now, floor);
            resolved.push((req.mutations, stamp));
            accepted.push((
                job.reply,
                CommitInfo { version: Some(version), versionstamp: Some(stamp) },
            ));
        }
        resolved
    }

    /// The batch is durable: published to readers, watches told, every job answered.
    fn published(&mut self, accepted: Vec<Accepted>, changes: &[Change], collected: bool) {
        if !accepted.is_empty() {
            self.engine.set_health(StoreHealth::Healthy);
        }
        let version = self.resolver.version();
        debug_assert!(version >= self.published.load(Ordering::Acquire), "versions only rise");
        self.published.store(version, Ordering::SeqCst);
        if !accepted.is_empty() {
            self.stats.engine_commits.fetch_add(1, Ordering::Relaxed);
            self.stats.transactions_committed.fetch_add(accepted.len() as u64, Ordering::Relaxed);
        }
        if collected {
            self.watches.notify(changes);
        } else if self.watches.any() {
            // A watch registered while this batch ran, after the batch decided not to collect
            // its changes: check it against the values now durable.
            self.revalidate_watches();
        }
        for (reply, info) in accepted {
            let _ = reply.send(Ok(info));
        }
    }

    /// Nothing of this batch is durable: the redb transaction was not committed. Its writes
    /// stay in the conflict history, which only costs spurious conflicts. The health is set
    /// before anyone hears of the failure (a caller that sees the error and asks for the health
    /// finds the reason).
    fn failed(&mut self, e: &Error, accepted: Vec<Accepted>) {
        // A failed append to the commit log leaves the engine sound: no re-open (which would
        // need space to replay the log while the disk is full).
        let log_failed = std::mem::take(&mut self.log_failed);
        let reopen = needs_reopen(e) && !log_failed;
        if reopen || log_failed {
            self.refuse_writes(e);
        }
        for (reply, _) in accepted {
            let _ = reply.send(Err(e.clone()));
        }
        if reopen {
            // Nothing of the failed batch was made durable: the store is where it was. If it
            // cannot be opened now (opening writes too), the next reader or batch tries again.
            let _ = self.engine.reopen();
        }
    }

    /// After an I/O error: writes are refused (with the reason) until a commit succeeds again.
    fn refuse_writes(&self, e: &Error) {
        let reason = match e {
            Error::StorageFull(m) => format!("writes refused: {m}"),
            other => format!("writes refused: {other}"),
        };
        self.engine.set_health(StoreHealth::WritesRefused { reason });
    }
}
