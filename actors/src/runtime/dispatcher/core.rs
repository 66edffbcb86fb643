//! The dispatcher's pure core: every decision — which waiting worker gets what, when to claim,
//! when to answer a poll, what goes back — as `apply(event) -> Vec<Action>` over its state and
//! the node's credit ledger ([`Matchmaker`], a pure data structure). No I/O: the actor
//! ([`super::Dispatcher`]) performs the actions and feeds back what it learns (a transaction's
//! result, a worker gone) as events. The decisions are split by what they serve: polls
//! ([`super::polls`]), worker streams ([`super::streams`]), dispatch buffers
//! ([`super::buffer`]); claims, deliveries and orphans are here.
//!
//! [`Matchmaker`]: crate::runtime::matchmaker::Matchmaker

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kairos_layer::limits::CLAIM_EXECUTIONS_MAX;

use crate::limits::{UNWATCHED_RECLAIM_MS, WATCHES_MAX};
use kairos_layer::ops::Error;
use kairos_layer::ops::claim::{ClaimOutcome, Claimed};

use super::state::{Action, Apply, Core, Event, Timer, claim_retry_pause, fresh};
use crate::runtime::effects::queue_of;
use crate::runtime::matchmaker::Matchmaker;
use crate::runtime::matchmaker::Reserved;
use crate::runtime::messages::{Grant, QueueKey};

impl Core {
    /// A dispatcher that caps polls' waits at `poll_wait_max_ms`, with 16 ready partitions.
    pub fn new(poll_wait_max_ms: u64) -> Self {
        Core { next_id: 1, poll_wait_max_ms, ..Core::default() }.with_partitions(16)
    }

    /// Sized for `partitions` ready partitions: a watched queue holds one watch per partition,
    /// and the node at most [`WATCHES_MAX`].
    pub fn with_partitions(mut self, partitions: u32) -> Self {
        self.watched_max = (WATCHES_MAX / partitions.max(1) as usize).max(1);
        self
    }

    /// An id for a new poll, stream or buffer (never reused).
    pub fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Decides what `event` leads to, at `now`.
    pub fn apply(&mut self, ledger: &Matchmaker, now: i64, event: Event) -> Vec<Action> {
        let room_for = match &event {
            Event::Poll(w, _) | Event::Open(w) => Some(w.queue.clone()),
            Event::Credits(id, _) => self.streams.get(id).map(|s| s.queue.clone()),
            Event::Finished(q, _) => Some(q.clone()),
            _ => None,
        };
        let mut a = Apply { core: self, ledger, now, out: Vec::new() };
        a.event(event);
        if room_for.is_some_and(|q| a.wants_room(&q)) {
            a.out.push(Action::Room);
        }
        a.out
    }

    /// What stopping leads to: every poll answered with what it got, every waiting worker out
    /// of the ledger, every buffered execution released.
    pub fn stop(&mut self, ledger: &Matchmaker) -> Vec<Action> {
        let mut out = Vec::new();
        for (id, p) in std::mem::take(&mut self.polls) {
            ledger.remove(&p.queue, id);
            out.push(Action::Answer(id, p.got));
        }
        for (id, s) in std::mem::take(&mut self.streams) {
            ledger.remove(&s.queue, id);
        }
        let buffered: Vec<Claimed> =
            std::mem::take(&mut self.buffers).into_values().flat_map(|b| b.items).collect();
        if !buffered.is_empty() {
            out.push(Action::Release(buffered));
        }
        out
    }

    /// Claims failed in a row.
    pub fn claim_failures(&self) -> u32 {
        self.claim_failures
    }
}

impl Apply<'_> {
    fn event(&mut self, event: Event) {
        match event {
            Event::Poll(w, wait_ms) => self.poll(w, wait_ms),
            Event::Open(w) => self.open(w),
            Event::Credits(id, n) => self.credits(id, n),
            Event::Close(id) => self.close(id),
            Event::Ready(q) => self.ready(q),
            Event::Reclaim(q) => {
                self.core.unwatched.remove(&q);
                if self.has_demand(&q) {
                    self.ready(q);
                }
            }
            Event::Matched(items) => self.matched(items),
            Event::Orphans(claimed) => self.orphans(claimed),
            Event::Undelivered(id, claimed) => self.undelivered(id, claimed),
            Event::Claimed(q, grants, r) => self.claimed(q, grants, r),
            Event::Buffered(q, r) => self.buffered_claimed(q, r),
            Event::Expire(id) => self.answer(id),
            Event::Flush(id) => self.flush(id),
            Event::WatchEnded(q) => self.watch_ended(q),
            Event::Finished(q, n) => self.finished(q, n),
            Event::AgeBuffers => self.age_buffers(),
            Event::Drain => self.drain(),
        }
    }

    pub(super) fn later(&mut self, after: Duration, timer: Timer) {
        self.out.push(Action::Later(after, timer));
    }

    pub(super) fn release(&mut self, claimed: Vec<Claimed>) {
        if !claimed.is_empty() {
            self.out.push(Action::Release(claimed));
        }
    }

    pub(super) fn has_demand(&self, q: &QueueKey) -> bool {
        self.core.streams.values().any(|s| &s.queue == q)
            || self.core.polls.values().any(|p| &p.queue == q)
    }

    /// A waiting worker of `q` was added or got credits.
    pub(super) fn demand(&mut self, q: &QueueKey) {
        if self.core.known.insert(q.clone()) {
            self.core.maybe_ready.insert(q.clone());
        }
        if self.is_buffered(q) {
            self.serve_buffer(q);
            if self.core.maybe_ready.contains(q) {
                self.refill(q);
            } else {
                self.watch(q);
            }
            return;
        }
        if self.core.maybe_ready.contains(q) {
            self.claim_queue(q);
        } else {
            self.watch(q);
        }
    }

    fn ready(&mut self, q: QueueKey) {
        self.core.known.insert(q.clone());
        self.core.maybe_ready.insert(q.clone());
        if self.is_buffered(&q) {
            self.refill(&q);
        } else {
            self.claim_queue(&q);
        }
    }

    /// Claims for the credits of `q`'s waiting workers in one transaction (one claim in flight
    /// per queue per node: no conflicts between this node's own workers).
    fn claim_queue(&mut self, q: &QueueKey) {
        if self.core.draining {
            return;
        }
        if let Some(again) = self.core.claiming.get_mut(q) {
            *again = true; // run again once the claim in flight returns
            return;
        }
        let grants = self.ledger.take(q, CLAIM_EXECUTIONS_MAX);
        if grants.is_empty() {
            return; // nobody waiting with credits (or the concurrency limit is reached)
        }
        let r = Reserved::of(grants);
        self.core.claiming.insert(q.clone(), false);
        self.out.push(Action::Claim(q.clone(), r.grants, r.slots));
    }

    fn claimed(&mut self, q: QueueKey, grants: Vec<Grant>, r: Result<ClaimOutcome, Error>) {
        let again = self.core.claiming.remove(&q).unwrap_or(false);
        let reserved = Reserved::of(grants);
        let out = match r {
            Ok(out) => out,
            Err(e) => {
                self.ledger.give_back(&q, reserved.grants);
                return self.claim_failed(q, e);
            }
        };
        self.core.claim_failures = 0;
        assert!(out.per_slot.len() <= reserved.slots.len(), "a claim answers per slot asked");
        let used: Vec<usize> = out.per_slot.iter().map(Vec::len).collect();
        let taken: usize = used.iter().sum();
        let (per_slot, unused) = reserved.split(&used);
        self.ledger.used(&q, &per_slot);
        self.ledger.give_back(&q, unused);
        let items = out
            .per_slot
            .into_iter()
            .zip(&reserved.ids)
            .flat_map(|(got, id)| got.into_iter().map(move |c| (c, *id)))
            .collect();
        let orphans = self.deliver_granted(items);
        self.orphans(orphans);
        if taken < reserved.grants.len() && !out.more && !again {
            self.core.maybe_ready.remove(&q); // ran dry: wait for a hint or the watch
        }
        if self.has_demand(&q) {
            self.demand(&q);
        }
    }

    pub(super) fn claim_failed(&mut self, q: QueueKey, e: Error) {
        self.core.claim_failures = self.core.claim_failures.saturating_add(1);
        let failures = self.core.claim_failures;
        self.out.push(Action::ClaimFailed(q.clone(), failures, e));
        self.later(claim_retry_pause(failures), Timer::Retry(q));
    }

    /// Watches the queue's ready signals, so work made ready on other nodes wakes us; past the
    /// node's watch bound, claims from it periodically instead.
    pub(super) fn watch(&mut self, q: &QueueKey) {
        if self.core.draining || self.core.watching.contains(q) {
            return;
        }
        if self.core.watching.len() >= self.core.watched_max {
            if self.core.unwatched.insert(q.clone()) {
                let after = Duration::from_millis(UNWATCHED_RECLAIM_MS);
                self.later(after, Timer::Reclaim(q.clone()));
            }
            return;
        }
        self.core.watching.insert(q.clone());
        self.out.push(Action::Watch(q.clone()));
    }

    fn watch_ended(&mut self, q: QueueKey) {
        self.core.watching.remove(&q);
        if self.has_demand(&q) && !self.core.draining && !self.core.maybe_ready.contains(&q) {
            self.watch(&q);
        }
    }

    fn finished(&mut self, q: QueueKey, n: usize) {
        self.ledger.finished(&q, n);
        if self.has_demand(&q) {
            self.demand(&q);
        }
    }

    fn matched(&mut self, items: Vec<(Claimed, u64)>) {
        let mut per_queue: BTreeMap<QueueKey, BTreeMap<u64, usize>> = BTreeMap::new();
        for (c, slot) in &items {
            *per_queue.entry(queue_of(c)).or_default().entry(*slot).or_default() += 1;
        }
        for (q, slots) in per_queue {
            self.ledger.used(&q, &slots.into_iter().collect::<Vec<_>>());
        }
        let orphans = self.deliver_granted(items);
        self.orphans(orphans);
    }

    /// Hands executions to the waiting worker `id`; what it cannot take comes back.
    fn deliver(&mut self, id: u64, claimed: Vec<Claimed>) -> Vec<Claimed> {
        let queue = match (self.core.streams.get(&id), self.core.polls.get(&id)) {
            (Some(s), _) => s.queue.clone(),
            (None, Some(p)) => p.queue.clone(),
            (None, None) => return claimed,
        };
        // A worker only ever gets work of its own namespace and queue: anything else comes
        // back (to be routed by its own queue).
        let (mine, foreign): (Vec<Claimed>, Vec<Claimed>) =
            claimed.into_iter().partition(|c| queue_of(c) == queue);
        if !foreign.is_empty() {
            self.out.push(Action::Misrouted(id, queue, foreign.len()));
        }
        if mine.is_empty() {
            return foreign;
        }
        if self.core.streams.contains_key(&id) {
            self.out.push(Action::Send(id, mine));
            return foreign;
        }
        let mut back = self.deliver_to_poll(id, mine);
        back.extend(foreign);
        back
    }

    /// Delivers per waiting worker; returns what none took.
    pub(super) fn deliver_granted(&mut self, items: Vec<(Claimed, u64)>) -> Vec<Claimed> {
        let mut by_id: BTreeMap<u64, Vec<Claimed>> = BTreeMap::new();
        for (c, id) in items {
            by_id.entry(id).or_default().push(c);
        }
        let mut back = Vec::new();
        for (id, claimed) in by_id {
            back.extend(self.deliver(id, claimed));
        }
        back
    }

    /// What a poll or stream that is gone could not take: it leaves the ledger (so no more
    /// work is reserved for it) and the executions are orphans.
    fn undelivered(&mut self, id: u64, claimed: Vec<Claimed>) {
        if let Some(s) = self.core.streams.remove(&id) {
            self.ledger.remove(&s.queue, id);
            self.out.push(Action::EndStream(id));
        }
        self.orphans(claimed);
    }

    /// Claimed executions without a worker: to another waiting worker of the queue while at
    /// least half their lease is left, else released (READY again, the attempt not counted).
    pub(super) fn orphans(&mut self, orphans: Vec<Claimed>) {
        let mut release = Vec::new();
        let mut touched = BTreeSet::new();
        for c in orphans {
            let q = queue_of(&c);
            let enough = fresh(&c, self.now) && !self.core.draining;
            if enough && self.is_buffered(&q) {
                // Back to the front of the queue's buffer, for the next credit.
                self.core.buffers.entry(q.clone()).or_default().items.push_front(c);
                touched.insert(q);
                continue;
            }
            match enough.then(|| self.ledger.take(&q, 1).pop()).flatten() {
                Some(g) => {
                    self.ledger.used(&q, &[(g.slot, 1)]);
                    self.ledger.finished(&q, 1); // it was in flight already
                    let back = self.deliver_granted(vec![(c, g.slot)]);
                    release.extend(back);
                }
                None => release.push(c),
            }
        }
        self.release(release);
        for q in touched {
            self.serve_buffer(&q);
        }
    }

    /// Stops serving: waiting polls answered with what they have, streams let go, buffers
    /// given back.
    fn drain(&mut self) {
        self.core.draining = true;
        let ids: Vec<u64> = self.core.polls.keys().copied().collect();
        for id in ids {
            self.answer(id);
        }
        // Letting go of a stream ends it; its worker reconnects elsewhere.
        for (id, s) in std::mem::take(&mut self.core.streams) {
            self.ledger.remove(&s.queue, id);
            self.out.push(Action::EndStream(id));
        }
        let queues: Vec<QueueKey> = self.core.buffers.keys().cloned().collect();
        for q in queues {
            self.drop_buffer(&q);
        }
    }
}
