//! The group committer: one thread that resolves queued commits in order and writes each
//! batch in one redb transaction with one fsync.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;

use bytes::Bytes;
use redb::{ReadableDatabase, ReadableTable};
use tokio::sync::oneshot;

use super::{DATA, EmbeddedStats, GROUP_COMMIT_TRANSACTIONS_MAX, META, META_VERSION};
use crate::env::SharedClock;
use crate::kv::error::{Error, Result};
use crate::kv::local::mutation::{
    ApplyTarget, Change, Mutation, apply_batch, stamped_write_ranges,
};
use crate::kv::local::resolver::Resolver;
use crate::kv::local::watch::Watches;
use crate::kv::local::{ActiveReads, CommitRequest};
use crate::kv::{CommitInfo, Versionstamp};

pub(crate) struct Job {
    pub req: CommitRequest,
    pub reply: oneshot::Sender<Result<CommitInfo>>,
}

pub(crate) struct Committer {
    db: Arc<redb::Database>,
    clock: SharedClock,
    watches: Arc<Watches>,
    stats: Arc<EmbeddedStats>,
    resolver: Resolver,
    active: Arc<ActiveReads>,
    /// The last version made durable (and visible to new snapshots).
    published: Arc<AtomicU64>,
}

struct TableTarget<'a, 't> {
    table: &'a mut redb::Table<'t, &'static [u8], &'static [u8]>,
}

/// The committer has no logger: a failed re-check leaves the watches as they are (they fire on
/// the next change of their keys).
fn tracing_free_warn(_: &Error) {}

fn storage(e: impl std::fmt::Display) -> Error {
    Error::Storage(format!("write: {e}"))
}

impl ApplyTarget for TableTarget<'_, '_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.table.get(key).map_err(storage)?.map(|g| Bytes::copy_from_slice(g.value())))
    }
    fn put(&mut self, key: &[u8], value: Option<Bytes>) -> Result<()> {
        match value {
            Some(v) => self.table.insert(key, v.as_ref()).map(|_| ()),
            None => self.table.remove(key).map(|_| ()),
        }
        .map_err(storage)
    }
    fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.table.retain_in::<&[u8], _>(begin..end, |_, _| false).map_err(storage)
    }
}

impl Committer {
    fn revalidate_watches(&self) {
        let read = || -> Result<redb::ReadOnlyTable<&'static [u8], &'static [u8]>> {
            let r = self.db.begin_read().map_err(storage)?;
            r.open_table(DATA).map_err(storage)
        };
        match read() {
            Ok(table) => self.watches.revalidate(|k| {
                table.get(k).ok().flatten().map(|g| Bytes::copy_from_slice(g.value()))
            }),
            Err(e) => tracing_free_warn(&e),
        }
    }

    pub(crate) fn new(
        db: Arc<redb::Database>,
        clock: SharedClock,
        watches: Arc<Watches>,
        stats: Arc<EmbeddedStats>,
        version: u64,
        (active, published): (Arc<ActiveReads>, Arc<AtomicU64>),
    ) -> Self {
        Committer { db, clock, watches, stats, resolver: Resolver::new(version), active, published }
    }

    /// Serves commits until every sender is dropped.
    pub(crate) fn run(mut self, jobs: Receiver<Job>) {
        while let Ok(first) = jobs.recv() {
            let mut batch = vec![first];
            while batch.len() < GROUP_COMMIT_TRANSACTIONS_MAX {
                match jobs.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            self.commit_batch(batch);
        }
    }

    fn commit_batch(&mut self, batch: Vec<Job>) {
        let mut accepted: Vec<(oneshot::Sender<Result<CommitInfo>>, CommitInfo)> = Vec::new();
        let mut changes: Vec<Change> = Vec::new();
        let collected = self.watches.any();
        let outcome = (|| -> Result<()> {
            let mut w = self.db.begin_write().map_err(storage)?;
            // Quick repair: a crash costs an O(1) recovery at the next open, not a repair pass
            // over the whole file (redb then writes its allocator state with each commit).
            w.set_quick_repair(true);
            {
                let mut table = w.open_table(DATA).map_err(storage)?;
                let mut meta = w.open_table(META).map_err(storage)?;
                let now = self.clock.now();
                let collect = collected;
                // Versions above the published one are not durable yet, so no snapshot holds
                // them: the floor stays at or below what snapshots can see.
                let floor = self.active.floor(self.published.load(Ordering::Acquire));
                let mut resolved: Vec<(Vec<Mutation>, Versionstamp)> = Vec::new();
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
                    let info = CommitInfo { version: Some(version), versionstamp: Some(stamp) };
                    accepted.push((job.reply, info));
                }
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
            Ok(())
        })();
        match outcome {
            Ok(()) => {
                self.published.store(self.resolver.version(), Ordering::SeqCst);
                if !accepted.is_empty() {
                    self.stats.engine_commits.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .transactions_committed
                        .fetch_add(accepted.len() as u64, Ordering::Relaxed);
                }
                if collected {
                    self.watches.notify(&changes);
                } else if self.watches.any() {
                    // A watch registered while this batch ran, after the batch decided not to
                    // collect its changes: check it against the values now durable.
                    self.revalidate_watches();
                }
                for (reply, info) in accepted {
                    let _ = reply.send(Ok(info));
                }
            }
            Err(e) => {
                // Nothing of this batch is durable: the redb transaction was not committed.
                // Its writes stay in the conflict history, which only costs spurious conflicts.
                for (reply, _) in accepted {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}
