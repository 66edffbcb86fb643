//! `ready_queues`: how much READY work waits in each queue, and since when — what an operator
//! looks at when a queue has no worker (issue 36). Read from the ready index (tag 21,
//! `(ns, queue, partition, ready_at_ms, execution_id)`), never from a counter the hot path
//! would have to maintain: the first key of each partition is its oldest entry, and the
//! partition's entries are counted up to a bound. The scan skips from one
//! `(ns, queue, partition)` to the next, so it reads at most
//! [`READY_QUEUES_PARTITIONS_MAX`] partition heads plus [`READY_QUEUE_COUNT_MAX`] keys per
//! queue, whatever the store holds; snapshot reads, so it never conflicts with claims.

use std::collections::BTreeMap;

use super::Scheduler;
use super::error::{Error, Result};
use crate::keys::Tag;
use crate::kv::RangeOption;
pub use crate::limits::{READY_QUEUE_COUNT_MAX, READY_QUEUES_PARTITIONS_MAX};

/// One queue's READY work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyQueue {
    /// Namespace.
    pub namespace: String,
    /// Queue.
    pub queue: String,
    /// READY executions (at most [`READY_QUEUE_COUNT_MAX`]).
    pub depth: u64,
    /// The depth reached [`READY_QUEUE_COUNT_MAX`]: there may be more.
    pub depth_capped: bool,
    /// When the oldest READY execution became READY (ms since the epoch).
    pub oldest_ready_at_ms: i64,
}

/// Every queue with READY work, in `(namespace, queue)` order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadyQueues {
    /// The queues.
    pub queues: Vec<ReadyQueue>,
    /// The scan stopped at [`READY_QUEUES_PARTITIONS_MAX`] partitions: later queues are left
    /// out.
    pub truncated: bool,
    /// The store's clock when it was read (ms), to turn `oldest_ready_at_ms` into an age.
    pub now_ms: i64,
}

impl Scheduler {
    /// The READY work of every queue (see the module docs for the bounds).
    pub async fn ready_queues(&self) -> Result<ReadyQueues> {
        let now_ms = self.clock.now().as_millis();
        let (queues, truncated) = self
            .db
            .run(|tx| async move {
                let all = self.ks.subspace_range(Tag::Ready);
                let mut begin = all.begin.clone();
                let mut found: BTreeMap<(String, String), ReadyQueue> = BTreeMap::new();
                let mut visited = 0;
                loop {
                    if visited == READY_QUEUES_PARTITIONS_MAX {
                        return Ok::<_, Error>((found, true));
                    }
                    let head = RangeOption::new(begin.clone(), all.end.clone()).limit(1);
                    let Some(first) = tx.get_range(&head, true).await?.into_iter().next() else {
                        return Ok((found, false));
                    };
                    visited += 1;
                    let k = self.ks.parse_ready(&first.key)?;
                    let part = self.ks.ready_queue(&k.namespace, &k.queue, k.partition);
                    let q =
                        found.entry((k.namespace.clone(), k.queue.clone())).or_insert_with(|| {
                            ReadyQueue {
                                namespace: k.namespace.clone(),
                                queue: k.queue.clone(),
                                depth: 0,
                                depth_capped: false,
                                oldest_ready_at_ms: k.ready_at_ms,
                            }
                        });
                    q.oldest_ready_at_ms = q.oldest_ready_at_ms.min(k.ready_at_ms);
                    let room = READY_QUEUE_COUNT_MAX.saturating_sub(q.depth as usize);
                    if room == 0 {
                        q.depth_capped = true;
                    } else {
                        let counted = tx.get_range(&part.clone().limit(room), true).await?.len();
                        q.depth += counted as u64;
                        q.depth_capped = q.depth as usize >= READY_QUEUE_COUNT_MAX;
                    }
                    begin = part.end;
                }
            })
            .await?;
        Ok(ReadyQueues { queues: queues.into_values().collect(), truncated, now_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::env::{Rng, SharedClock, Timestamp, TokioClock};
    use crate::keys::{Keyspace, ReadyKey};
    use crate::kv::memory::{FaultConfig, MemoryDatabase};
    use crate::ops::ClusterParams;

    #[tokio::test]
    async fn counts_each_queue_and_finds_its_oldest_entry() {
        let clock: SharedClock =
            Arc::new(TokioClock::starting_at(Timestamp::from_millis(1_790_000_000_000)));
        let db = MemoryDatabase::open(clock.clone(), Rng::seeded(3), FaultConfig::none());
        let params = ClusterParams { shard_count: 4, bucket_width_ms: 60_000, ready_partitions: 4 };
        let sched =
            Scheduler::open(db, Keyspace::new("q"), clock, Rng::seeded(4), params).await.unwrap();
        let sched = &sched;
        assert_eq!(sched.ready_queues().await.unwrap().queues, vec![]);
        let entries = [
            ("a", "q1", 0, 500),
            ("a", "q1", 3, 200),
            ("a", "q1", 3, 900),
            ("a", "q2", 1, 700),
            ("b", "q1", 0, 100),
        ];
        sched
            .db
            .run(|tx| async move {
                for (i, (ns, queue, partition, at)) in entries.iter().enumerate() {
                    let key = sched.ks.ready(&ReadyKey {
                        namespace: ns.to_string(),
                        queue: queue.to_string(),
                        partition: *partition,
                        ready_at_ms: *at,
                        execution_id: format!("e{i}"),
                    });
                    tx.set(&key, b"")?;
                }
                Ok::<_, Error>(())
            })
            .await
            .unwrap();
        let got = sched.ready_queues().await.unwrap();
        assert!(!got.truncated);
        let rows: Vec<_> = got
            .queues
            .iter()
            .map(|q| (q.namespace.as_str(), q.queue.as_str(), q.depth, q.oldest_ready_at_ms))
            .collect();
        assert_eq!(rows, vec![("a", "q1", 3, 200), ("a", "q2", 1, 700), ("b", "q1", 1, 100)]);
    }
}
