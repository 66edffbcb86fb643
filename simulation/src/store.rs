//! Each node's view of the one shared `memory` store (standing for FoundationDB), with the
//! faults that sit between a node and its cluster: the node cut off from the store (its
//! operations wait until the link heals, as an FDB client's do), its commits stalled (a
//! process paused between reading and committing: a CPU-starved node), and a region failover
//! of the store during which commits in flight come back `commit_unknown_result`, applied or
//! not.
#![allow(clippy::disallowed_methods)] // tokio's timer is turmoil's simulated clock here

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use kairos_layer::env::{BoxFuture, Rng};
use kairos_layer::kv::{
    CommitInfo, Error, KeyValue, KvDatabase, KvTransaction, RangeOption, Result, StoreHealth, Watch,
};

/// Store faults aimed at one node, switched by the fault schedule between steps.
#[derive(Debug, Default)]
pub struct NodeGate {
    /// The node cannot reach the store: its reads and commits wait.
    pub cut: AtomicBool,
    /// Each commit waits this long first (0 = none).
    pub commit_delay_ms: AtomicU64,
}

/// Store faults for everyone.
#[derive(Debug)]
pub struct StoreGate {
    /// The store is failing over to the other region: commits come back unknown-result.
    pub failover: AtomicBool,
    /// Commits answered unknown-result by a failover (applied or not).
    pub failover_unknown: AtomicU64,
    /// Commits that waited out a stall.
    pub stalled_commits: AtomicU64,
    rng: Rng,
}

impl StoreGate {
    /// A gate drawing from `rng`.
    pub fn new(rng: Rng) -> Self {
        StoreGate {
            failover: AtomicBool::new(false),
            failover_unknown: AtomicU64::new(0),
            stalled_commits: AtomicU64::new(0),
            rng,
        }
    }
}

/// One node's handle on the shared store.
pub struct GatedStore {
    inner: Arc<dyn KvDatabase>,
    node: Arc<NodeGate>,
    all: Arc<StoreGate>,
}

impl GatedStore {
    /// `node`'s view of `inner`.
    pub fn new(inner: Arc<dyn KvDatabase>, node: Arc<NodeGate>, all: Arc<StoreGate>) -> Self {
        GatedStore { inner, node, all }
    }
}

impl KvDatabase for GatedStore {
    fn begin(&self) -> Result<Arc<dyn KvTransaction>> {
        Ok(Arc::new(GatedTxn {
            inner: self.inner.begin()?,
            node: self.node.clone(),
            all: self.all.clone(),
        }))
    }
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    fn close(&self) -> BoxFuture<'_, ()> {
        // The store outlives every node: a node closing its handle leaves it open.
        Box::pin(async {})
    }
    fn health(&self) -> StoreHealth {
        self.inner.health()
    }
}

struct GatedTxn {
    inner: Arc<dyn KvTransaction>,
    node: Arc<NodeGate>,
    all: Arc<StoreGate>,
}

async fn reachable(node: &NodeGate) {
    while node.cut.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl KvTransaction for GatedTxn {
    fn read_version(&self) -> BoxFuture<'_, Result<u64>> {
        Box::pin(async move {
            reachable(&self.node).await;
            self.inner.read_version().await
        })
    }
    fn get<'a>(&'a self, key: &'a [u8], snapshot: bool) -> BoxFuture<'a, Result<Option<Bytes>>> {
        Box::pin(async move {
            reachable(&self.node).await;
            self.inner.get(key, snapshot).await
        })
    }
    fn get_range<'a>(
        &'a self,
        range: &'a RangeOption,
        snapshot: bool,
    ) -> BoxFuture<'a, Result<Vec<KeyValue>>> {
        Box::pin(async move {
            reachable(&self.node).await;
            self.inner.get_range(range, snapshot).await
        })
    }
    fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.inner.set(key, value)
    }
    fn clear(&self, key: &[u8]) -> Result<()> {
        self.inner.clear(key)
    }
    fn clear_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.inner.clear_range(begin, end)
    }
    fn atomic_add(&self, key: &[u8], param: &[u8]) -> Result<()> {
        self.inner.atomic_add(key, param)
    }
    fn set_versionstamped_key(&self, key: &[u8], offset: usize, value: &[u8]) -> Result<()> {
        self.inner.set_versionstamped_key(key, offset, value)
    }
    fn set_versionstamped_value(&self, key: &[u8], value: &[u8], offset: usize) -> Result<()> {
        self.inner.set_versionstamped_value(key, value, offset)
    }
    fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.inner.add_read_conflict_range(begin, end)
    }
    fn watch(&self, key: &[u8]) -> Result<Watch> {
        self.inner.watch(key)
    }
    fn approximate_size(&self) -> usize {
        self.inner.approximate_size()
    }
    fn commit(&self) -> BoxFuture<'_, Result<CommitInfo>> {
        Box::pin(async move {
            let delay = self.node.commit_delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                self.all.stalled_commits.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            reachable(&self.node).await;
            if self.all.failover.load(Ordering::SeqCst) {
                self.all.failover_unknown.fetch_add(1, Ordering::SeqCst);
                if self.all.rng.chance(0.5) {
                    let _ = self.inner.commit().await;
                }
                return Err(Error::CommitUnknownResult);
            }
            self.inner.commit().await
        })
    }
    fn on_error<'a>(&'a self, error: &'a Error) -> Option<BoxFuture<'a, Result<()>>> {
        self.inner.on_error(error)
    }
}
