//! Per queue: the READY work waiting in it (cluster-wide, from the layer's
//! [`ready_queues`](kairos_layer::ops::Scheduler::ready_queues)) beside the worker streams
//! connected to this node and their free credits (the matchmaker's ledger). What
//! `kairosctl queues` prints and the per-queue gauges of `/metrics` export; a queue with READY
//! work and no worker shows here with zero workers.

use std::collections::BTreeMap;

use kairos_layer::ops;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::limits::METRICS_QUEUES_MAX;

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

/// The label of queues past [`METRICS_QUEUES_MAX`].
const OTHER: &str = "_other";

type Labels = Vec<(&'static str, String)>;

/// The first [`METRICS_QUEUES_MAX`] queues as they are, the rest summed into one `_other`
/// (depths, workers and credits added up; the oldest age the largest).
fn bounded(queues: &[QueueView]) -> Vec<QueueView> {
    let mut out: Vec<QueueView> = queues.iter().take(METRICS_QUEUES_MAX).cloned().collect();
    let rest = queues.get(METRICS_QUEUES_MAX..).unwrap_or_default();
    if !rest.is_empty() {
        let mut o =
            QueueView { namespace: OTHER.into(), queue: OTHER.into(), ..QueueView::default() };
        for q in rest {
            o.depth += q.depth;
            o.workers += q.workers;
            o.credits_free += q.credits_free;
            o.oldest_ready_age_ms = o.oldest_ready_age_ms.max(q.oldest_ready_age_ms);
        }
        out.push(o);
    }
    out
}

/// Registers the per-queue gauges: `kairos_queue_depth`, `kairos_queue_oldest_ready_age_seconds`,
/// `kairos_workers_connected`, `kairos_worker_credits_free`, each by `namespace` and `queue`.
pub fn register(reg: &mut Registry, queues: &Queues) {
    let families: [(Family<Labels, Gauge>, &str, &str); 3] = [
        (
            Family::default(),
            "kairos_queue_depth",
            "READY executions per queue, cluster-wide (each counted up to 10,000)",
        ),
        (
            Family::default(),
            "kairos_workers_connected",
            "Worker streams connected to this node, per queue",
        ),
        (
            Family::default(),
            "kairos_worker_credits_free",
            "Free credits of the worker streams connected to this node, per queue",
        ),
    ];
    let age = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    for q in bounded(&queues.queues) {
        let l = vec![("namespace", q.namespace.clone()), ("queue", q.queue.clone())];
        families[0].0.get_or_create(&l).set(q.depth as i64);
        families[1].0.get_or_create(&l).set(i64::from(q.workers));
        families[2].0.get_or_create(&l).set(q.credits_free as i64);
        age.get_or_create(&l).set(q.oldest_ready_age_ms as f64 / 1000.0);
    }
    for (f, name, help) in families {
        reg.register(name, help, f);
    }
    reg.register_with_unit(
        "kairos_queue_oldest_ready_age",
        "How long the oldest READY execution of each queue has waited (0 when none is READY)",
        prometheus_client::registry::Unit::Seconds,
        age,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_past_the_bound_are_summed_into_other() {
        let q = |i: usize| QueueView {
            namespace: "ns".into(),
            queue: format!("q{i:04}"),
            depth: 2,
            oldest_ready_age_ms: i as i64,
            workers: 1,
            credits_free: 3,
            ..QueueView::default()
        };
        let all: Vec<QueueView> = (0..METRICS_QUEUES_MAX + 5).map(q).collect();
        let b = bounded(&all);
        assert_eq!(b.len(), METRICS_QUEUES_MAX + 1);
        let o = b.last().unwrap();
        assert_eq!((o.namespace.as_str(), o.queue.as_str()), (OTHER, OTHER));
        assert_eq!((o.depth, o.workers, o.credits_free), (10, 5, 15));
        assert_eq!(o.oldest_ready_age_ms, (METRICS_QUEUES_MAX + 4) as i64);
        assert_eq!(bounded(&all[..3]).len(), 3, "under the bound: as they are");
    }
}
