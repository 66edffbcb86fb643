//! Dispatch buffers in the dispatcher's core (queues served by worker streams, without a
//! concurrency limit): the node claims a little ahead of demand — 4 per slot of the streams,
//! at most 2,048 — *unassigned* (no worker named yet), so a credit coming back with a result is
//! answered with a task at once instead of after a claim transaction. A buffered attempt is
//! named by its worker's first heartbeat or result; if the node dies holding it, the node
//! releases it when it restarts (`release_orphaned_claims`, started in `boot.rs`), or the live
//! nodes do once it counts as dead (`lease_manager.rs`); it is released uncounted (it never
//! ran). Items older than half their lease are released, and a queue whose streams all closed
//! gives its buffer back. The buffer is also a slot in the ledger, so fires fill it when no
//! worker waits.

use std::collections::BTreeMap;

use kairos_layer::limits::{CLAIM_BATCH_MAX, CLAIM_EXECUTIONS_MAX};
use kairos_layer::ops::Error;
use kairos_layer::ops::claim::{ClaimOutcome, ClaimSlot, Claimed};

use super::state::{Action, Apply, BUFFER_AGE_CHECK, Timer, fresh};
use crate::limits::{DISPATCH_BUFFER_MAX, DISPATCH_BUFFER_PER_SLOT};
use crate::runtime::messages::QueueKey;

impl Apply<'_> {
    /// Whether `q` is served through a dispatch buffer: worker streams wait on it and it has
    /// no concurrency limit (a buffer would hold work beyond the limit).
    pub(super) fn is_buffered(&self, q: &QueueKey) -> bool {
        !self.ledger.is_limited(q) && self.core.streams.values().any(|s| &s.queue == q)
    }

    /// How much `q`'s buffer aims to hold: [`DISPATCH_BUFFER_PER_SLOT`] per slot of its
    /// streams, bounded. At least the credits they hold (a stream's capacity never falls below
    /// them): a target of 0 with credits waiting would have the queue never claimed.
    fn buffer_target(&self, q: &QueueKey) -> usize {
        let slots: usize =
            self.core.streams.values().filter(|s| &s.queue == q).map(|s| s.capacity).sum();
        (slots * DISPATCH_BUFFER_PER_SLOT).min(DISPATCH_BUFFER_MAX)
    }

    /// Whether shard owners holding due work for `q` should be woken now ([`Action::Room`]):
    /// its workers have room and, for a buffered queue, the buffer (with what fires are
    /// filling it with) is down to half its target — so a woken fire fills half a buffer at
    /// once instead of starting the one or two executions a single credit makes room for.
    pub(super) fn wants_room(&self, q: &QueueKey) -> bool {
        if !self.ledger.has_room_for(q) {
            return false;
        }
        if !self.is_buffered(q) {
            return true;
        }
        let Some(b) = self.core.buffers.get(q) else { return true };
        let pending = b.slot.map_or(0, |slot| self.ledger.pending(q, slot));
        (b.items.len() + b.refilling + pending) * 2 <= self.buffer_target(q)
    }

    /// Hands buffered executions to the waiting workers of `q` with credits.
    pub(super) fn serve_buffer(&mut self, q: &QueueKey) {
        let n = self.core.buffers.get(q).map_or(0, |b| b.items.len());
        if n == 0 {
            return;
        }
        let grants = self.ledger.take(q, n);
        if grants.is_empty() {
            return;
        }
        let (mut items, mut stale, mut unused) = (Vec::new(), Vec::new(), Vec::new());
        let buffer = self.core.buffers.get_mut(q).expect("checked above");
        for g in grants {
            loop {
                match buffer.items.pop_front() {
                    Some(c) if fresh(&c, self.now) => {
                        items.push((c, g.slot));
                        break;
                    }
                    Some(c) => stale.push(c),
                    None => {
                        unused.push(g);
                        break;
                    }
                }
            }
        }
        let mut used: BTreeMap<u64, usize> = BTreeMap::new();
        for (_, slot) in &items {
            *used.entry(*slot).or_default() += 1;
        }
        self.ledger.used(q, &used.into_iter().collect::<Vec<_>>());
        self.ledger.give_back(q, unused);
        let mut back = self.deliver_granted(items);
        back.extend(stale);
        self.release(back);
        self.sync_buffer_slot(q);
    }

    /// Claims ahead for `q`'s buffer when it runs below half its target and the queue may
    /// hold READY work.
    pub(super) fn refill(&mut self, q: &QueueKey) {
        if self.core.draining || !self.is_buffered(q) || !self.core.maybe_ready.contains(q) {
            return;
        }
        let target = self.buffer_target(q);
        let b = self.core.buffers.entry(q.clone()).or_default();
        if b.refilling > 0 {
            b.again = true;
            return;
        }
        if b.items.len() * 2 > target {
            return;
        }
        let want = (target - b.items.len()).min(CLAIM_EXECUTIONS_MAX);
        if want == 0 {
            return;
        }
        b.refilling = want;
        b.again = false;
        // Unassigned: the worker is named by its first heartbeat or result.
        let slots = (0..want)
            .step_by(CLAIM_BATCH_MAX)
            .map(|from| ClaimSlot {
                worker_id: String::new(),
                max: (want - from).min(CLAIM_BATCH_MAX),
                lease_ms: None,
            })
            .collect();
        self.out.push(Action::Refill(q.clone(), slots));
        self.sync_buffer_slot(q);
    }

    /// A claim for `q`'s buffer finished.
    pub(super) fn buffered_claimed(&mut self, q: QueueKey, r: Result<ClaimOutcome, Error>) {
        let again = self.core.buffers.get_mut(&q).is_some_and(|b| {
            b.refilling = 0;
            std::mem::take(&mut b.again)
        });
        let out = match r {
            Ok(out) => out,
            Err(e) => return self.claim_failed(q, e),
        };
        self.core.claim_failures = 0;
        if !out.more && !again {
            self.core.maybe_ready.remove(&q); // the queue ran dry
        }
        let claimed: Vec<Claimed> = out.per_slot.concat();
        if self.is_buffered(&q) && !self.core.draining {
            self.core.buffers.entry(q.clone()).or_default().items.extend(claimed);
            self.serve_buffer(&q);
        } else {
            self.release(claimed);
        }
        self.sync_buffer_slot(&q);
        if self.has_demand(&q) {
            self.demand(&q);
        }
    }

    /// Sets the room fire transactions may fill in `q`'s buffer: its target less what it holds,
    /// what a refill is claiming, and what fires already reserved.
    fn sync_buffer_slot(&mut self, q: &QueueKey) {
        if !self.is_buffered(q) || self.core.draining {
            return;
        }
        let target = self.buffer_target(q);
        // Ids are taken as streams and polls take theirs: a buffer given the id of the next
        // stream to open had work reserved for it go to a stream of another queue.
        let slot = match self.core.buffers.get(q).and_then(|b| b.slot) {
            Some(slot) => slot,
            None => self.core.new_id(),
        };
        let b = self.core.buffers.entry(q.clone()).or_default();
        b.slot = Some(slot);
        let pending = self.ledger.pending(q, slot);
        let room = target.saturating_sub(b.items.len() + b.refilling + pending);
        self.ledger.set_buffer_room(q, slot, room);
    }

    /// Drops `q`'s buffer (no stream left, or draining): its slot leaves the ledger and its
    /// executions are given back.
    pub(super) fn drop_buffer(&mut self, q: &QueueKey) {
        if let Some(b) = self.core.buffers.remove(q) {
            if let Some(slot) = b.slot {
                self.ledger.remove(q, slot);
            }
            self.release(b.items.into());
        }
    }

    /// Releases buffered executions that waited too long (under half their lease left).
    pub(super) fn age_buffers(&mut self) {
        let mut stale = Vec::new();
        for b in self.core.buffers.values_mut() {
            let (keep, old): (Vec<Claimed>, Vec<Claimed>) =
                b.items.drain(..).partition(|c| fresh(c, self.now));
            b.items = keep.into();
            stale.extend(old);
        }
        self.release(stale);
        if !self.core.draining {
            self.later(BUFFER_AGE_CHECK, Timer::AgeBuffers);
        }
    }
}
