//! `claim`: waiting workers take READY executions of a queue. No hot key: a queue is split in
//! `ready_partitions` partitions; a claim reads the heads of the partitions as snapshots
//! (concurrently), takes entries from them starting at a random partition, and puts an
//! explicit read conflict on the taken keys only (the couch_jobs / QuiCK pattern), so
//! concurrent claimers rarely collide and a collision only retries one of them.
//!
//! A claim, like a fire matched to waiting workers ([`super::fire`]), leaves a *receipt*
//! (tag 23, [`Receipt`]): the same transaction retried after an unknown commit result finds it
//! and hands out exactly what the committed try started, to the same slots.

use std::collections::BTreeSet;

use kairos_proto::storage::v1::{Attempt, Execution, ExecutionStatus};

use super::Scheduler;
use super::budget;
use super::error::{Error, Result, invalid};
use super::lease_checks::LeaseChecks;
use super::records::{load_execution, running_attempt};
use super::validate::{check_lease_ms, check_name};
use crate::kv::Watch;
use crate::kv::{KeyValue, Transaction};
use crate::limits::{CLAIM_BATCH_MAX, CLAIM_EXECUTIONS_MAX, CLAIM_SCAN_MAX};

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
        assert_eq!(execution.status, ExecutionStatus::Running as i32, "a claim is RUNNING");
        let attempt = running_attempt(&execution);
        Claimed { execution, attempt }
    }
}

/// A ready entry a claim picked, and its execution (`None`: gone).
type Picked = (KeyValue, Option<Execution>);

/// How long receipts are kept (a retried claim or fire comes back within seconds).
pub(crate) const RECEIPT_KEEP_MS: i64 = 60_000;

/// One waiting worker's share of a claim (or of a fire's offer): slots are filled in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSlot {
    /// The worker; empty for a node's dispatch buffer: the attempts are then *unassigned*
    /// until a worker's heartbeat or result names it, and an unassigned attempt whose lease
    /// runs out is released (READY again, not counted) instead of timed out.
    pub worker_id: String,
    /// Most executions for it (at most [`CLAIM_BATCH_MAX`]).
    pub max: usize,
    /// The lease of each execution it gets (the definition's when `None`).
    pub lease_ms: Option<u64>,
}

/// What one claim took.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClaimOutcome {
    /// What each slot got, in slot order.
    pub per_slot: Vec<Vec<Claimed>>,
    /// The queue may hold more READY work than this claim took (a partition's head was read
    /// to its limit, or more was read than taken): fewer than asked does not mean empty.
    pub more: bool,
}

/// Checks claim slots: names, leases, at most [`CLAIM_BATCH_MAX`] each and
/// [`CLAIM_EXECUTIONS_MAX`] in all.
pub fn check_slots(slots: &[ClaimSlot]) -> Result<usize> {
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
    if slots.is_empty() || total > CLAIM_EXECUTIONS_MAX {
        return Err(invalid("slots", format!("1 to {CLAIM_EXECUTIONS_MAX} executions per claim")));
    }
    Ok(total)
}

/// Hands out slot indexes in order: slot 0 until it has its `max`, then slot 1, …
#[derive(Debug)]
pub(crate) struct SlotFiller<'a> {
    slots: &'a [ClaimSlot],
    next: usize,
    used: usize,
}

impl<'a> SlotFiller<'a> {
    pub(crate) fn new(slots: &'a [ClaimSlot]) -> Self {
        SlotFiller { slots, next: 0, used: 0 }
    }

    /// A filler that goes on where one left off ([`SlotFiller::position`]).
    pub(crate) fn resume(slots: &'a [ClaimSlot], (next, used): (usize, usize)) -> Self {
        SlotFiller { slots, next, used }
    }

    /// Where the filler is: the slot it fills and how many it gave that slot.
    pub(crate) fn position(&self) -> (usize, usize) {
        (self.next, self.used)
    }

    /// The slot the next execution goes to, if any has room.
    pub(crate) fn take(&mut self) -> Option<(usize, &'a ClaimSlot)> {
        while self.next < self.slots.len() && self.used >= self.slots[self.next].max {
            self.next += 1;
            self.used = 0;
        }
        let slot = self.slots.get(self.next)?;
        self.used += 1;
        Some((self.next, slot))
    }
}

/// The value of a receipt (tag 23): the `(namespace, execution id, fencing token, slot)` of
/// every attempt one claim — or one fire, for its offer's slots — started.
pub(crate) type Receipt = Vec<(String, String, u64, u32)>;

/// What a receipt's attempts are now: those still RUNNING under their token, with their slot
/// (an attempt may have ended since).
pub(crate) async fn load_receipt(
    tx: &Transaction,
    sched: &Scheduler,
    value: &[u8],
) -> Result<Vec<(Claimed, usize)>> {
    let taken: Receipt =
        crate::tuple::unpack(value).map_err(|e| Error::Corrupt(format!("claim receipt: {e}")))?;
    let loads = taken.iter().map(|(ns, id, _, _)| load_execution(tx, &sched.ks, ns, id));
    let found = crate::ops::join::join_in_order(loads).await?;
    Ok(taken
        .into_iter()
        .zip(found)
        .filter_map(|((_, _, token, slot), e)| {
            let e = e?;
            let live = e.fencing_token == token && e.status == ExecutionStatus::Running as i32;
            live.then(|| (Claimed::of(e), slot as usize))
        })
        .collect())
}

impl Scheduler {
    /// Claims READY executions of `queue` for its waiting workers in one transaction (a
    /// node's dispatcher batches its waiting workers this way): slot `i` gets up to
    /// `slots[i].max` executions, earlier slots first, each with the slot's own lease.
    pub async fn claim(&self, ns: &str, queue: &str, slots: &[ClaimSlot]) -> Result<ClaimOutcome> {
        check_name("namespace", ns)?;
        check_name("queue", queue)?;
        let total = check_slots(slots)?;
        let now_ms = self.clock.now().as_millis();
        // Chosen outside the retry loop: a retry after an unknown commit result finds the
        // receipt of the claim that did commit and returns what it took.
        let receipt = &self.ks.claim_receipt(now_ms, self.rng.next_u64(), &self.holder);
        let parts = self.config.ready_partitions.max(1);
        // Partitions in a random order, so claimers spread over them.
        let start = self.rng.below(u64::from(parts)) as u32;
        self.db
            .run(|tx| async move {
                // Read here, not before the loop: a retried claim starts attempts now, never
                // before the executions it takes became READY.
                let now_ms = self.clock.now().as_millis().max(now_ms);
                let mut out = ClaimOutcome { per_slot: vec![Vec::new(); slots.len()], more: true };
                if let Some(v) = tx.get(receipt).await? {
                    for (c, slot) in load_receipt(&tx, self, &v).await? {
                        out.per_slot[slot].push(c);
                    }
                    return Ok(out);
                }
                let expired = self.ks.claim_receipts_before(now_ms - RECEIPT_KEEP_MS);
                tx.clear_range(&expired.begin, &expired.end)?;
                let (picked, more) = self.take_ready(&tx, ns, queue, parts, start, total).await?;
                out.more = more;
                let taken = self.start_claimed(&tx, picked, slots, now_ms, &mut out).await?;
                tx.set(receipt, &crate::tuple::pack(&taken))?;
                Ok(out)
            })
            .await
    }

    /// Picks up to `total` entries of the queue's ready partitions and loads their executions
    /// (nothing cleared yet); `true` if the queue may hold more.
    async fn take_ready(
        &self,
        tx: &Transaction,
        ns: &str,
        queue: &str,
        parts: u32,
        start: u32,
        total: usize,
    ) -> Result<(Vec<Picked>, bool)> {
        let (head, full) = self.ready_heads(tx, ns, queue, parts, start, total).await?;
        let picked = self.pick(&head, total);
        let more = full || picked.len() < head.len();
        let ids: Vec<String> = picked
            .iter()
            .map(|kv| self.ks.parse_ready(&kv.key).map(|r| r.execution_id))
            .collect::<std::result::Result<_, _>>()?;
        let loads = ids.iter().map(|id| load_execution(tx, &self.ks, ns, id));
        let found = crate::ops::join::join_in_order(loads).await?;
        Ok((picked.into_iter().zip(found).collect(), more))
    }

    /// Starts an attempt for each picked execution still READY, in slot order, while the
    /// transaction has room (each taken entry cleared with a read conflict; a stale one — its
    /// execution gone or no longer READY — just cleared); an entry left for lack of room stays
    /// for the next claim (`out.more`). Returns the receipt of what it started.
    async fn start_claimed(
        &self,
        tx: &Transaction,
        picked: Vec<Picked>,
        slots: &[ClaimSlot],
        now_ms: i64,
        out: &mut ClaimOutcome,
    ) -> Result<Receipt> {
        let is_ready = |e: &Execution| e.status == ExecutionStatus::Ready as i32;
        let shards: BTreeSet<u32> = picked
            .iter()
            .filter_map(|(_, e)| e.as_ref())
            .filter(|e| is_ready(e))
            .map(|e| e.shard)
            .collect();
        let wms = self.watermarks(tx, shards).await?;
        let mut filler = SlotFiller::new(slots);
        let mut taken = Receipt::new();
        let mut checks = LeaseChecks::default();
        for (kv, e) in picked {
            let Some(mut e) = e.filter(is_ready) else {
                tx.add_read_conflict_key(&kv.key)?;
                tx.clear(&kv.key)?; // a stale entry
                continue;
            };
            if !budget::has_room(tx, taken.len(), budget::execution_bytes(&e)) {
                out.more = true;
                break;
            }
            let Some((i, slot)) = filler.take() else { break };
            tx.add_read_conflict_key(&kv.key)?;
            tx.clear(&kv.key)?;
            let (stored, wm) = (e.status, wms[&e.shard]);
            self.start_attempt(tx, &mut e, Some(stored), (slot, &mut checks), now_ms, wm)?;
            taken.push((e.namespace.clone(), e.id.clone(), e.fencing_token, i as u32));
            out.per_slot[i].push(Claimed::of(e));
        }
        self.write_lease_checks(tx, checks)?;
        Ok(taken)
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
        let heads = crate::ops::join::join_in_order(reads).await?;
        let full = heads.iter().any(|h| h.len() >= per);
        Ok((heads.into_iter().flatten().collect(), full))
    }

    /// Watches a queue's ready signals (every partition) in a transaction that also reads
    /// whether any partition holds ready work: `None` if one does (claim now), else the
    /// watches. Work made ready after an empty claim and before the watches are set is seen by
    /// that read; work made ready after it changes a watched signal: no wake-up is lost.
    pub async fn watch_ready(&self, ns: &str, queue: &str) -> Result<Option<Vec<Watch>>> {
        let parts = self.config.ready_partitions.max(1);
        let tx = self.db.begin()?;
        let mut watches = Vec::with_capacity(parts as usize);
        for p in 0..parts {
            watches.push(tx.watch(&self.ks.ready_signal(ns, queue, p))?);
        }
        let reads = (0..parts).map(|p| {
            let range = self.ks.ready_queue(ns, queue, p).limit(1);
            let tx = &tx;
            async move { tx.get_range(&range, true).await }
        });
        let heads = crate::ops::join::join_in_order(reads).await?;
        if heads.iter().any(|h| !h.is_empty()) {
            return Ok(None);
        }
        tx.commit().await?;
        Ok(Some(watches))
    }

    /// Up to `n` entries of `head`, in order: each partition's oldest first, the partitions
    /// from the random start this claim drew. Contiguous runs of a partition's head are
    /// executions fired together, whose records are neighbours in the store (fewer pages to
    /// rewrite); claimers on different nodes start at different partitions, and two that meet
    /// on one conflict only on the keys both picked (one retries).
    fn pick(&self, head: &[KeyValue], n: usize) -> Vec<KeyValue> {
        head.iter().take(n).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(max: usize) -> ClaimSlot {
        ClaimSlot { worker_id: "w".into(), max, lease_ms: None }
    }

    #[test]
    fn slots_fill_in_order() {
        let slots = [slot(2), slot(1)];
        let mut f = SlotFiller::new(&slots);
        let got: Vec<usize> = std::iter::from_fn(|| f.take().map(|(i, _)| i)).collect();
        assert_eq!(got, [0, 0, 1]);
        assert!(SlotFiller::new(&[]).take().is_none());
    }

    #[test]
    fn slots_are_checked_naming_the_field() {
        assert_eq!(check_slots(&[slot(2), slot(3)]).unwrap(), 5);
        assert!(check_slots(&[]).is_err());
        let e = check_slots(&[slot(CLAIM_BATCH_MAX + 1)]).unwrap_err().to_string();
        assert!(e.contains("maxExecutions"), "{e}");
    }
}
