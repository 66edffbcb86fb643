//! The `memory` backend: an MVCC map with the shared OCC resolver, deterministic (clock and
//! randomness injected) and with seeded fault injection. For unit tests and the simulation.

mod faults;

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use bytes::Bytes;

pub use self::faults::FaultConfig;
use self::faults::fires;
use super::error::{Error, Result};
use super::limits::TRANSACTION_AGE_MAX_MS;
use super::local::counts::WriteCounter;
use super::local::mutation::{ApplyTarget, apply, stamped_write_ranges};
use super::local::resolver::Resolver;
use super::local::watch::{WatchSender, Watches};
use super::local::{ActiveReads, CommitRequest, LocalStore, LocalTransaction, Snapshot};
use super::{CommitInfo, Database, KvDatabase, KvTransaction, Versionstamp};
use crate::env::{BoxFuture, Rng, SharedClock};

/// Versions of one key, oldest first; `None` is a deletion.
type Chain = Vec<(u64, Option<Bytes>)>;

struct Inner {
    data: BTreeMap<Vec<u8>, Chain>,
    resolver: Resolver,
    versions_after_gc: usize,
    versions: usize,
    closed: bool,
}

struct Shared {
    inner: RwLock<Inner>,
    clock: SharedClock,
    rng: Rng,
    faults: FaultConfig,
    watches: Watches,
    active: ActiveReads,
    published: std::sync::atomic::AtomicU64,
    writes: WriteCounter,
}

/// The in-memory backend. Clone it to share one store.
#[derive(Clone)]
pub struct MemoryDatabase {
    shared: Arc<Shared>,
    store: Arc<dyn LocalStore>,
}

impl MemoryDatabase {
    /// An empty store with no faults.
    pub fn new(clock: SharedClock, rng: Rng) -> Self {
        Self::with_faults(clock, rng, FaultConfig::none())
    }

    /// An empty store injecting `faults`, drawing from `rng`.
    pub fn with_faults(clock: SharedClock, rng: Rng, faults: FaultConfig) -> Self {
        let shared = Arc::new(Shared {
            inner: RwLock::new(Inner {
                data: BTreeMap::new(),
                resolver: Resolver::new(0),
                versions_after_gc: 0,
                versions: 0,
                closed: false,
            }),
            clock,
            rng,
            faults,
            watches: Watches::default(),
            active: ActiveReads::default(),
            published: std::sync::atomic::AtomicU64::new(0),
            writes: WriteCounter::default(),
        });
        MemoryDatabase { store: Arc::new(Store(shared.clone())), shared }
    }

    /// A [`Database`] handle over a new memory store.
    pub fn open(clock: SharedClock, rng: Rng, faults: FaultConfig) -> Database {
        let db = MemoryDatabase::with_faults(clock.clone(), rng.fork(), faults);
        Database::new(Arc::new(db), clock, rng)
    }
}

impl Shared {
    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    fn latency(&self) -> Option<BoxFuture<'static, ()>> {
        if fires(&self.rng, self.faults.latency) {
            let max = u64::try_from(self.faults.latency_max.as_micros()).unwrap_or(u64::MAX);
            let d = Duration::from_micros(self.rng.between(0, max));
            return Some(self.clock.sleep(d));
        }
        None
    }

    fn commit_now(&self, req: CommitRequest) -> Result<CommitInfo> {
        let mut inner = self.write();
        if inner.closed {
            return Err(Error::DatabaseClosed);
        }
        if fires(&self.rng, self.faults.spurious_conflict) {
            return Err(Error::NotCommitted);
        }
        if fires(&self.rng, self.faults.unknown_result_not_applied) {
            return Err(Error::CommitUnknownResult);
        }
        inner.resolver.check(req.read_version, &req.read_conflicts)?;
        let version = inner.resolver.next_version();
        let stamp = Versionstamp::new(version, 0);
        let mut writes = req.write_conflicts;
        writes.extend(stamped_write_ranges(&req.mutations, &stamp));
        let collected = self.watches.any();
        let changes = {
            let mut target = MvccTarget { inner: &mut inner, version };
            apply(&mut target, &req.mutations, &stamp, collected)?
        };
        self.writes.committed(&req.mutations);
        let floor = self.active.floor(version);
        inner.resolver.record(version, writes, self.clock.now(), floor);
        inner.gc(floor);
        self.published.store(version, std::sync::atomic::Ordering::Release);
        drop(inner);
        if collected {
            self.watches.notify(&changes);
        } else if self.watches.any() {
            // A watch registered while this commit ran, after it decided not to collect its
            // changes: check it against the values now committed.
            self.watches.revalidate(|k| self.read().latest(k));
        }
        if fires(&self.rng, self.faults.unknown_result_applied) {
            return Err(Error::CommitUnknownResult);
        }
        Ok(CommitInfo { version: Some(version), versionstamp: Some(stamp) })
    }
}

impl Inner {
    fn latest(&self, key: &[u8]) -> Option<Bytes> {
        self.data.get(key).and_then(|c| c.last()).and_then(|(_, v)| v.clone())
    }

    /// Drops versions no reader can see any more: per key, everything older than the newest
    /// version at or below the oldest readable version. Amortized over commits.
    fn gc(&mut self, floor: u64) {
        if self.versions <= 2 * self.versions_after_gc + 4_096 {
            return;
        }
        let oldest = floor.max(self.resolver.oldest_readable());
        let mut count = 0;
        self.data.retain(|_, chain| {
            let keep_from = chain.iter().rposition(|(v, _)| *v <= oldest).unwrap_or(0);
            chain.drain(..keep_from);
            let dead = chain.len() == 1 && chain[0].1.is_none() && chain[0].0 <= oldest;
            count += chain.len();
            !dead
        });
        self.versions = count;
        self.versions_after_gc = count;
    }
}

fn visible(chain: &Chain, version: u64) -> Option<&Bytes> {
    chain.iter().rev().find(|(v, _)| *v <= version).and_then(|(_, v)| v.as_ref())
}

/// Writes a commit into the MVCC map at its version.
struct MvccTarget<'a> {
    inner: &'a mut Inner,
    version: u64,
}

impl ApplyTarget for MvccTarget<'_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.inner.latest(key))
    }
    fn put(&mut self, key: &[u8], value: Option<Bytes>) -> Result<()> {
        let version = self.version;
        let chain = self.inner.data.entry(key.to_vec()).or_default();
        match chain.last_mut() {
            Some((v, old)) if *v == version => *old = value,
            _ => {
                chain.push((version, value));
                self.inner.versions += 1;
            }
        }
        Ok(())
    }
    fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> Result<()> {
        let keys: Vec<Vec<u8>> = self
            .inner
            .data
            .range::<[u8], _>((Bound::Included(begin), Bound::Excluded(end)))
            .filter(|(_, c)| c.last().is_some_and(|(_, v)| v.is_some()))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.put(&k, None)?;
        }
        Ok(())
    }
}

struct MemSnapshot {
    shared: Arc<Shared>,
    version: u64,
}

impl Snapshot for MemSnapshot {
    fn version(&self) -> u64 {
        self.version
    }
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        let inner = self.shared.read();
        Ok(inner.data.get(key).and_then(|c| visible(c, self.version)).cloned())
    }
    fn scan(
        &self,
        begin: &[u8],
        end: &[u8],
        reverse: bool,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        let inner = self.shared.read();
        let range = inner.data.range::<[u8], _>((Bound::Included(begin), Bound::Excluded(end)));
        let mut each = |(k, c): (&Vec<u8>, &Chain)| match visible(c, self.version) {
            Some(v) => visit(k, v),
            None => true,
        };
        if reverse {
            for kv in range.rev() {
                if !each(kv) {
                    break;
                }
            }
        } else {
            for kv in range {
                if !each(kv) {
                    break;
                }
            }
        }
        Ok(())
    }
}

impl Shared {
    fn register_watch(&self, key: Vec<u8>, expected: Option<Bytes>, tx: WatchSender) {
        self.watches.register(key, expected, |k| Ok(self.read().latest(k)), tx);
    }
}

/// The store as the transaction engine sees it (needs the `Arc` for snapshots).
struct Store(Arc<Shared>);

impl LocalStore for Store {
    fn clock(&self) -> &SharedClock {
        &self.0.clock
    }

    fn active(&self) -> &ActiveReads {
        &self.0.active
    }

    fn published_version(&self) -> u64 {
        self.0.published.load(std::sync::atomic::Ordering::Acquire)
    }

    fn snapshot(&self) -> Result<Arc<dyn Snapshot>> {
        let inner = self.0.read();
        if inner.closed {
            return Err(Error::DatabaseClosed);
        }
        let version = inner.resolver.version();
        Ok(Arc::new(MemSnapshot { shared: self.0.clone(), version }))
    }

    fn commit(&self, req: CommitRequest) -> BoxFuture<'static, Result<CommitInfo>> {
        let shared = self.0.clone();
        Box::pin(async move {
            if let Some(delay) = shared.latency() {
                delay.await;
            }
            shared.commit_now(req)
        })
    }

    fn register_watch(&self, key: Vec<u8>, expected: Option<Bytes>, tx: WatchSender) {
        self.0.register_watch(key, expected, tx)
    }

    fn read_fault(&self) -> Option<BoxFuture<'static, Result<()>>> {
        let shared = &self.0;
        if fires(&shared.rng, shared.faults.too_old) {
            let err = Error::TransactionTooOld { window_ms: TRANSACTION_AGE_MAX_MS };
            return Some(Box::pin(async move { Err(err) }));
        }
        let round_trip = shared.faults.read_round_trip;
        let round_trip = (!round_trip.is_zero()).then(|| shared.clock.sleep(round_trip));
        match (shared.latency(), round_trip) {
            (None, None) => None,
            (a, b) => Some(Box::pin(async move {
                if let Some(b) = b {
                    b.await;
                }
                if let Some(a) = a {
                    a.await;
                }
                Ok(())
            })),
        }
    }
}

impl KvDatabase for MemoryDatabase {
    fn begin(&self) -> Result<Arc<dyn KvTransaction>> {
        Ok(Arc::new(LocalTransaction::begin(self.store.clone())?))
    }

    fn backend_name(&self) -> &'static str {
        "memory"
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.shared.write().closed = true;
            self.shared.watches.close();
        })
    }

    fn write_counts(&self) -> Option<crate::kv::WriteCounts> {
        Some(self.shared.writes.snapshot())
    }
}
