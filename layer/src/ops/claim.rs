//! `claim`: waiting workers take READY executions of a queue. No hot key: a queue is split in
//! `ready_partitions` partitions; a claim reads the heads of the partitions as snapshots
//! (concurrently), takes entries from them starting at a random partition, and puts an
//! explicit read conflict on the taken keys only (the couch_jobs / QuiCK pattern), so
//! concurrent claimers rarely collide and a collision only retries one of them.

use std::collections::BTreeSet;

use kairos_proto::storage::v1::{Attempt, Execution, ExecutionStatus};

use super::Scheduler;
use super::error::{Error, Result, invalid};
use super::records::{load_execution, running_attempt};
use super::submit::check_name;
use super::worker::check_lease_ms;
use crate::kv::{KeyValue, Transaction};
use crate::limits::{CLAIM_BATCH_MAX, CLAIM_SCAN_MAX};

/// An execution handed to a worker: the attempt carries the fencing token its results must
/// present.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The execution, now RUNNING.
    pub execution: Execution,
    /// The new attempt.
    pub attempt: Attempt,
}

impl Claimed {
    /// The claim of a RUNNING execution, as the execution record carries it.
    pub(crate) fn of(execution: Execution) -> Claimed {
        let attempt = running_attempt(&execution);
        Claimed { execution, attempt }
    }
}

/// One waiting worker's share of a `claim_many`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSlot {
    /// The worker; empty for a node's dispatch buffer: the attempts are then *unassigned*
    /// until a worker's heartbeat or result names it, and an unassigned attempt whose lease
    /// runs out is released (READY again, not counted) instead of timed out.
    pub worker_id: String,
    /// Most executions for it.
    pub max: usize,
    /// The lease of each execution it gets (the definition's when `None`).
    pub lease_ms: Option<u64>,
}

/// Most executions one `claim_many` takes over all its slots.
pub const CLAIM_MANY_MAX: usize = CLAIM_SCAN_MAX;

/// How long claim receipts are kept (a retried claim comes back within seconds).
pub(crate) const RECEIPT_KEEP_MS: i64 = 60_000;

impl Scheduler {
    /// Claims up to `max` READY executions of `queue` for `worker_id`, each with a lease of
    /// `lease_ms` (the definition's lease when `None`).
    pub async fn claim(
        &self,
        ns: &str,
        queue: &str,
        worker_id: &str,
        max: usize,
        lease_ms: Option<u64>,
    ) -> Result<Vec<Claimed>> {
        if max == 0 || max > CLAIM_BATCH_MAX {
            return Err(invalid(
                "maxExecutions",
                format!("must be between 1 and {CLAIM_BATCH_MAX}"),
            ));
        }
        let slots = [ClaimSlot { worker_id: worker_id.to_string(), max, lease_ms }];
        let mut out = self.claim_many(ns, queue, &slots).await?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Claims for several waiting workers of one queue in one transaction (a node's
    /// dispatcher batches its waiting workers this way): slot `i` gets up to `slots[i].max`
    /// executions, earlier slots first, each with the slot's own lease.
    pub async fn claim_many(
        &self,
        ns: &str,
        queue: &str,
        slots: &[ClaimSlot],
    ) -> Result<Vec<Vec<Claimed>>> {
        Ok(self.claim_many_more(ns, queue, slots).await?.0)
    }

    /// [`claim_many`](Self::claim_many), also telling whether the queue may hold more READY
    /// work than this claim took (a partition's head was read to its limit, or more was read
    /// than taken): fewer executions than asked does not mean the queue is empty.
    pub async fn claim_many_more(
        &self,
        ns: &str,
        queue: &str,
        slots: &[ClaimSlot],
    ) -> Result<(Vec<Vec<Claimed>>, bool)> {
        check_name("namespace", ns)?;
        check_name("queue", queue)?;
        for s in slots {
            if !s.worker_id.is_empty() {
                check_name("workerId", &s.worker_id)?;
            }
            if s.max == 0 || s.max > CLAIM_BATCH_MAX {
                return Err(invalid(
                    "maxExecutions",
                    format!("must be between 1 and {CLAIM_BATCH_MAX}"),
                ));
            }
            check_lease_ms(s.lease_ms)?;
        }
        let total: usize = slots.iter().map(|s| s.max).sum();
        if slots.is_empty() || total > CLAIM_MANY_MAX {
            return Err(invalid("slots", format!("1 to {CLAIM_MANY_MAX} executions per claim")));
        }
        let now_ms = self.clock.now().as_millis();
        // Chosen outside the retry loop: a retry after an unknown commit result finds the
        // receipt of the claim that did commit and returns what it took.
        let receipt = &self.ks.claim_receipt(now_ms, self.rng.next_u64());
        let parts = self.config.ready_partitions.max(1);
        // Partitions in a random order, so claimers spread over them.
        let start = self.rng.below(u64::from(parts)) as u32;
        self.db
            .run(|tx| async move {
                // Read here, not before the loop: a retried claim starts attempts now, never
                // before the executions it takes became READY.
                let now_ms = self.clock.now().as_millis().max(now_ms);
                if let Some(v) = tx.get(receipt).await? {
                    let out = self.claimed_by_receipt(&tx, &v, slots.len()).await?;
                    return Ok((out, true));
                }
                let expired = self.ks.claim_receipts_before(now_ms - RECEIPT_KEEP_MS);
                tx.clear_range(&expired.begin, &expired.end)?;
                let (head, full) = self.ready_heads(&tx, ns, queue, parts, start, total).await?;
                let picked = self.pick(&head, total);
                let more = full || picked.len() < head.len();
                for kv in &picked {
                    tx.add_read_conflict_key(&kv.key)?;
                    tx.clear(&kv.key)?;
                }
                let ids: Vec<String> = picked
                    .iter()
                    .map(|kv| self.ks.parse_ready(&kv.key).map(|r| r.execution_id))
                    .collect::<std::result::Result<_, _>>()?;
                let loads = ids.iter().map(|id| load_execution(&tx, &self.ks, ns, id));
                let found = futures_util::future::try_join_all(loads).await?;
                let ready: Vec<Execution> = found
                    .into_iter()
                    .flatten() // a stale entry (execution gone): cleared above
                    .filter(|e| e.status == ExecutionStatus::Ready as i32)
                    .collect();
                let shards: BTreeSet<u32> = ready.iter().map(|e| e.shard).collect();
                let wms = self.watermarks(&tx, shards).await?;
                let mut out: Vec<Vec<Claimed>> = vec![Vec::new(); slots.len()];
                let mut taken: Vec<(String, u64, u32)> = Vec::new();
                let mut slot = 0;
                for mut e in ready {
                    while slot < slots.len() && out[slot].len() >= slots[slot].max {
                        slot += 1;
                    }
                    if slot == slots.len() {
                        break;
                    }
                    let s = &slots[slot];
                    let (stored, wm) = (e.status, wms[&e.shard]);
                    self.start_attempt(&tx, &mut e, stored, &s.worker_id, s.lease_ms, now_ms, wm)?;
                    taken.push((e.id.clone(), e.fencing_token, slot as u32));
                    out[slot].push(Claimed::of(e));
                }
                tx.set(receipt, &crate::tuple::pack(&(ns, &taken)))?;
                Ok((out, more))
            })
            .await
    }

    /// The heads of a queue's partitions (snapshot reads, issued concurrently), enough to pick
    /// `want` entries from; `true` if a partition's head was read to its limit (it may hold
    /// more).
    async fn ready_heads(
        &self,
        tx: &Transaction,
        ns: &str,
        queue: &str,
        parts: u32,
        start: u32,
        want: usize,
    ) -> Result<(Vec<KeyValue>, bool)> {
        // Twice the share of each partition, at least a few: random picks among a head a bit
        // larger than needed keep concurrent claimers apart.
        let per = (want * 2).div_ceil(parts as usize).clamp(8, CLAIM_SCAN_MAX);
        let reads = (0..parts).map(|i| {
            let p = (start + i) % parts;
            let range = self.ks.ready_queue(ns, queue, p).limit(per);
            async move { tx.get_range(&range, true).await }
        });
        let heads = futures_util::future::try_join_all(reads).await?;
        let full = heads.iter().any(|h| h.len() >= per);
        Ok((heads.into_iter().flatten().collect(), full))
    }

    /// Up to `n` entries of `head`, in order: each partition's oldest first, the partitions
    /// from the random start this claim drew. Contiguous runs of a partition's head are
    /// executions fired together, whose records are neighbours in the store (fewer pages to
    /// rewrite); claimers on different nodes start at different partitions, and two that meet
    /// on one conflict only on the keys both picked (one retries).
    fn pick(&self, head: &[KeyValue], n: usize) -> Vec<KeyValue> {
        head.iter().take(n).cloned().collect()
    }

    async fn claimed_by_receipt(
        &self,
        tx: &Transaction,
        receipt: &[u8],
        slots: usize,
    ) -> Result<Vec<Vec<Claimed>>> {
        let (ns, taken): (String, Vec<(String, u64, u32)>) = crate::tuple::unpack(receipt)
            .map_err(|e| Error::Corrupt(format!("claim receipt: {e}")))?;
        let loads = taken.iter().map(|(id, _, _)| load_execution(tx, &self.ks, &ns, id));
        let found = futures_util::future::try_join_all(loads).await?;
        let mut out: Vec<Vec<Claimed>> = vec![Vec::new(); slots];
        for ((_, token, slot), e) in taken.into_iter().zip(found) {
            let Some(e) = e else { continue };
            // Only what this claim still holds: the attempt may have ended meanwhile.
            if e.fencing_token != token || e.status != ExecutionStatus::Running as i32 {
                continue;
            }
            if let Some(v) = out.get_mut(slot as usize) {
                v.push(Claimed::of(e));
            }
        }
        Ok(out)
    }
}
