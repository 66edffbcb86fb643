//! Per queue: the READY work waiting in it (cluster-wide, from the layer's
//! [`ready_queues`](kairos_layer::ops::Scheduler::ready_queues)) beside the worker streams
//! connected to this node and their free credits (the matchmaker's ledger). What
//! `kairosctl queues` prints and the per-queue gauges of `/metrics` export; a queue with READY
//! work and no worker shows here with zero workers.

use std::collections::BTreeMap;

use kairos_layer::ops;

use super::Node;

/// One queue as an operator sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueView {
    /// Namespace.
    pub namespace: String,
    /// Queue.
    pub queue: String,
    /// READY executions, cluster-wide (capped, see `depth_capped`).
    pub depth: u64,
    /// The depth reached the layer's count bound: there may be more.
    pub depth_capped: bool,
    /// When the oldest READY execution became READY (ms); 0 when none is.
    pub oldest_ready_at_ms: i64,
    /// How long it has waited (ms), by the store's clock; 0 when none is READY.
    pub oldest_ready_age_ms: i64,
    /// Worker streams connected to this node for the queue.
    pub workers: u32,
    /// Their free credits.
    pub credits_free: u64,
}

/// Every queue with READY work or a connected worker.
#[derive(Debug, Clone, Default)]
pub struct Queues {
    /// In `(namespace, queue)` order.
    pub queues: Vec<QueueView>,
    /// The ready-index scan stopped at its bound: later queues' READY work is left out.
    pub truncated: bool,
}

impl Node {
    /// The queues of namespace `ns` (`None`: of every namespace).
    pub async fn queues(&self, ns: Option<&str>) -> ops::Result<Queues> {
        let ready = self.ctx().sched.ready_queues().await?;
        let keep = |n: &str| ns.is_none_or(|ns| ns == n);
        let mut by_key: BTreeMap<(String, String), QueueView> = BTreeMap::new();
        for r in ready.queues.into_iter().filter(|r| keep(&r.namespace)) {
            let v = QueueView {
                depth: r.depth,
                depth_capped: r.depth_capped,
                oldest_ready_at_ms: r.oldest_ready_at_ms,
                oldest_ready_age_ms: (ready.now_ms - r.oldest_ready_at_ms).max(0),
                ..QueueView::default()
            };
            by_key.insert((r.namespace, r.queue), v);
        }
        for ((n, q), (workers, credits)) in self.ctx().matchmaker.workers() {
            if keep(&n) {
                let v = by_key.entry((n, q)).or_default();
                (v.workers, v.credits_free) = (workers, credits);
            }
        }
        let queues = by_key
            .into_iter()
            .map(|((namespace, queue), v)| QueueView { namespace, queue, ..v })
            .collect();
        Ok(Queues { queues, truncated: ready.truncated })
    }
}
