//! `prefire`: a shard owner starts, for workers waiting now, executions that fall due within
//! the next few milliseconds — committed before their `execute_at`, handed to the workers at
//! it. A fire at the due time first has to commit (a read, a write, a sync: a millisecond or
//! more on an idle node, more in a burst) before the worker hears of its task; a pre-fire
//! takes that out of the path from `execute_at` to the start.
//!
//! It touches only what it starts: a DUE timer of a SCHEDULED execution in the window, for a
//! slot of the offer. Everything else in the window — a retry's back-off, a lease check, an
//! execution no slot is left for, a timer that cannot be processed — stays as it is for the
//! fire at its due time. A started execution is exactly what that fire would have made of it
//! at its due time: RUNNING for the slot's worker, its attempt started at its timer's time
//! (never before `execute_at`), its lease counted from then. The caller must not hand it over
//! earlier (the node's dispatch holds it until then).

use std::collections::BTreeMap;

use kairos_proto::storage::v1::{Execution, TimerKind};

use super::Scheduler;
use super::budget;
use super::claim::{Claimed, Receipt, SlotFiller};
use super::error::Result;
use super::fire::{FireOutcome, Match, Offer, Step, fire_event, fired, replayed};
use super::lease_checks::LeaseChecks;
use super::leases::check_epoch;
use super::records::watermark;
use crate::ids::bucket_of;
use crate::keys::{Space, TimerKey};
use crate::kv::Transaction;
use crate::limits::{FIRE_BATCH_MAX, PREFIRE_AHEAD_MS_MAX};
use crate::state::execution_transition;

/// Executions of one queue a pre-fire may start, with their timers.
type ByQueue = BTreeMap<(String, String), Vec<(Execution, TimerKey)>>;

impl Scheduler {
    /// Starts, for the slots of `offer` and in due order, executions of `shard` whose DUE
    /// timers fall due after `now_ms` and at most at `until_ms` (no further ahead than
    /// [`PREFIRE_AHEAD_MS_MAX`]), fenced by `epoch` as `fire_due` is. Each one is RUNNING for
    /// its slot, its attempt started at its timer's time; the outcome lists them in
    /// [`FireOutcome::matched`] (and [`FireOutcome::fired`]), to be handed to their workers at
    /// their `execute_at`, not before. Nothing else changes: the watermark stays, and what is
    /// not started waits for its fire.
    pub async fn prefire(
        &self,
        shard: u32,
        epoch: u64,
        now_ms: i64,
        until_ms: i64,
        offer: &Offer,
    ) -> Result<FireOutcome> {
        let until_ms = until_ms.min(now_ms.saturating_add(PREFIRE_AHEAD_MS_MAX));
        let room: usize = offer.values().flatten().map(|s| s.max).sum();
        let room = room.min(FIRE_BATCH_MAX);
        if room == 0 || until_ms <= now_ms {
            return Ok(FireOutcome::default());
        }
        let receipt = &self.ks.claim_receipt(now_ms, self.rng.next_u64(), &self.holder);
        self.db
            .run(|tx| async move {
                if let Some(v) = tx.get(receipt).await? {
                    return replayed(&tx, self, &v, false).await;
                }
                let (owner, wm) = futures_util::future::try_join(
                    check_epoch(&tx, self, Space::Executions, shard, epoch),
                    watermark(&tx, &self.ks, shard),
                )
                .await?;
                let () = owner;
                let by_queue =
                    self.prefire_candidates(&tx, shard, (now_ms, until_ms), room).await?;
                let mut out = FireOutcome { watermark: wm, ..FireOutcome::default() };
                let mut taken = Receipt::new();
                let mut checks = LeaseChecks::default();
                for ((ns, queue), items) in by_queue {
                    let Some(slots) = offer.get(&(ns, queue)) else { continue };
                    let mut filler = SlotFiller::new(slots);
                    for (mut e, t) in items {
                        if !budget::has_room(&tx, taken.len(), budget::execution_bytes(&e)) {
                            break;
                        }
                        let Some((i, slot)) = filler.take() else { break };
                        tx.clear(&self.ks.timer(&t))?;
                        let (before, at) = (e.status, t.fire_at_ms.max(e.execute_at_ms));
                        e.status = execution_transition(e.status(), fire_event(&t))? as i32;
                        let started = (slot, &mut checks);
                        self.start_attempt(&tx, &mut e, Some(before), started, at, wm)?;
                        taken.push((e.namespace.clone(), e.id.clone(), e.fencing_token, i as u32));
                        out.fired.push(fired(&e, &t, false));
                        out.matched.push(Match { claim: Claimed::of(e), slot: i });
                    }
                }
                self.write_lease_checks(&tx, checks)?;
                if !taken.is_empty() {
                    tx.set(receipt, &crate::tuple::pack(&taken))?;
                }
                Ok(out)
            })
            .await
    }

    /// The SCHEDULED executions whose current DUE timers fall in `(after, until]`, at most
    /// `room + 16` timers read per bucket, by queue in due order; each with a read conflict on
    /// its timer (a fire or another pre-fire taking it first makes this one retry).
    async fn prefire_candidates(
        &self,
        tx: &Transaction,
        shard: u32,
        (after, until): (i64, i64),
        room: usize,
    ) -> Result<ByQueue> {
        let width = self.config.bucket_width_ms;
        let mut rows = Vec::new();
        for bucket in bucket_of(after.saturating_add(1), width)..=bucket_of(until, width) {
            let range = self.ks.timers_between(bucket, shard, after, until).limit(room + 16);
            for kv in tx.get_range(&range, true).await? {
                let due =
                    self.ks.parse_timer(&kv.key).is_ok_and(|t| t.kind == TimerKind::Due as i32);
                if due {
                    tx.add_read_conflict_key(&kv.key)?;
                    rows.push(kv);
                }
            }
        }
        let mut by_queue = ByQueue::new();
        for step in self.steps(tx, rows).await? {
            // Anything but a due execution waiting for its fire is left to that fire.
            if let Step::Ready(e, t) = step
                && t.kind == TimerKind::Due as i32
            {
                by_queue.entry((e.namespace.clone(), e.queue.clone())).or_default().push((e, t));
            }
        }
        Ok(by_queue)
    }
}
