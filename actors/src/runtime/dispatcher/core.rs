//! The dispatcher's pure core: every decision — which waiting worker gets what, when to claim,
//! when to answer a poll, what goes back — as `apply(event) -> Vec<Action>` over its state and
//! the node's credit ledger ([`Matchmaker`], a pure data structure). No I/O: the actor
//! ([`super::Dispatcher`]) performs the actions and feeds back what it learns (a transaction's
//! result, a worker gone) as events. The decisions are split by what they serve: polls
//! ([`super::polls`]), worker streams ([`super::streams`]), dispatch buffers
//! ([`super::buffer`]); claims, deliveries and orphans are here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kairos_layer::limits::CLAIM_EXECUTIONS_MAX;
use kairos_layer::ops::Error;
use kairos_layer::ops::claim::{ClaimOutcome, ClaimSlot, Claimed};
use kairos_layer::ops::retry::doubling_ms;

use super::buffer::Buffer;
use super::polls::Poll;
use super::streams::Stream;
use crate::runtime::effects::queue_of;
use crate::runtime::matchmaker::{Matchmaker, Reserved};
use crate::runtime::messages::{Grant, QueueKey};

/// A waiting worker arriving: a poll or a worker stream (`credits` = the poll's max).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// The id the dispatcher gave it.
    pub id: u64,
    /// Its queue.
    pub queue: QueueKey,
    /// The worker.
    pub worker_id: String,
    /// The lease it asks for (the definition's when `None`).
    pub lease_ms: Option<u64>,
    /// Executions it can take now.
    pub credits: usize,
}

/// What happened, as the dispatcher's core sees it.
#[derive(Debug)]
pub enum Event {
    /// A worker polls, waiting up to the given time (ms) for work.
    Poll(Waiting, u64),
    /// A worker stream opened.
    Open(Waiting),
    /// A worker stream has more free slots.
    Credits(u64, usize),
    /// A worker stream closed.
    Close(u64),
    /// A queue may have new ready work.
    Ready(QueueKey),
    /// A fire started these executions for these waiting workers.
    Matched(Vec<(Claimed, u64)>),
    /// Claimed executions without a worker (a worker stream let go of them).
    Orphans(Vec<Claimed>),
    /// The actor could not hand these to the poll or stream `id`: it is gone.
    Undelivered(u64, Vec<Claimed>),
    /// A claim for these grants of a queue finished.
    Claimed(QueueKey, Vec<Grant>, Result<ClaimOutcome, Error>),
    /// A claim for a queue's dispatch buffer finished.
    Buffered(QueueKey, Result<ClaimOutcome, Error>),
    /// A poll's wait ran out.
    Expire(u64),
    /// A poll that got work stops lingering.
    Flush(u64),
    /// A watch on a queue's ready signals ended.
    WatchEnded(QueueKey),
    /// Executions of a queue left flight.
    Finished(QueueKey, usize),
    /// Time to release buffered executions that waited too long.
    AgeBuffers,
    /// Stop serving.
    Drain,
}

/// Something to come back as an event later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Timer {
    /// A poll's wait runs out.
    Expire(u64),
    /// A lingering poll answers.
    Flush(u64),
    /// Buffers are checked for stale items.
    AgeBuffers,
    /// A queue is looked at again (after a failed claim).
    Retry(QueueKey),
}

/// What the actor does.
#[derive(Debug)]
pub enum Action {
    /// Answer poll `id` with these executions (the poll ends).
    Answer(u64, Vec<Claimed>),
    /// Hand these executions to worker stream `id`.
    Send(u64, Vec<Claimed>),
    /// Let go of worker stream `id` (it ends).
    EndStream(u64),
    /// Claim for these grants of a queue, as these claim slots.
    Claim(QueueKey, Vec<Grant>, Vec<ClaimSlot>),
    /// Claim ahead for a queue's dispatch buffer.
    Refill(QueueKey, Vec<ClaimSlot>),
    /// Watch a queue's ready signals.
    Watch(QueueKey),
    /// Give executions back: READY again at once, the attempts not counted.
    Release(Vec<Claimed>),
    /// Come back with this after a while.
    Later(Duration, Timer),
    /// A claim failed, `failures` in a row (for the log; the retry is planned).
    ClaimFailed(QueueKey, u32, Error),
    /// Work of another queue was about to go to waiting worker `id` (kept back; a bug).
    Misrouted(u64, QueueKey, usize),
}

/// How long a poll that got work waits for more reserved for it before answering.
pub const POLL_LINGER: Duration = Duration::from_millis(2);
/// How often the buffers are checked for items waiting too long.
pub const BUFFER_AGE_CHECK: Duration = Duration::from_secs(1);

/// The pause before retrying a claim after `failures` failures in a row: 100 ms doubling, at
/// most 5 s.
pub fn claim_retry_pause(failures: u32) -> Duration {
    Duration::from_millis(doubling_ms(100, failures.saturating_sub(1), 5_000))
}

/// Whether a claimed execution still has at least half its lease: enough for its worker's
/// first heartbeat (at a third of the lease) to land in time.
pub fn fresh(c: &Claimed, now: i64) -> bool {
    let left = c.execution.lease_expires_at_ms - now;
    left.saturating_mul(2) >= c.execution.lease_ms as i64
}

/// The dispatcher's state.
#[derive(Debug, Default)]
pub struct Core {
    pub(super) next_id: u64,
    pub(super) polls: BTreeMap<u64, Poll>,
    pub(super) streams: BTreeMap<u64, Stream>,
    /// Queues with a claim in flight, and whether ready work was hinted meanwhile.
    pub(super) claiming: BTreeMap<QueueKey, bool>,
    /// Queues that may hold READY work (hinted, or not known to be empty).
    pub(super) maybe_ready: BTreeSet<QueueKey>,
    /// Queues seen so far (a first waiter claims at once: work may be ready from before).
    pub(super) known: BTreeSet<QueueKey>,
    pub(super) watching: BTreeSet<QueueKey>,
    pub(super) buffers: BTreeMap<QueueKey, Buffer>,
    pub(super) draining: bool,
    /// Claims failed in a row (any queue): the retry pause doubles with it, and only the 1st,
    /// 2nd, 4th… failure is logged.
    pub(super) claim_failures: u32,
    pub(super) poll_wait_max_ms: u64,
}

/// One application of an event: the core, the ledger, the time, and the actions so far.
pub(super) struct Apply<'a> {
    pub(super) core: &'a mut Core,
    pub(super) ledger: &'a Matchmaker,
    pub(super) now: i64,
    pub(super) out: Vec<Action>,
}

impl Core {
    /// A dispatcher that caps polls' waits at `poll_wait_max_ms`.
    pub fn new(poll_wait_max_ms: u64) -> Self {
        Core { next_id: 1, poll_wait_max_ms, ..Core::default() }
    }

    /// An id for a new poll, stream or buffer (never reused).
    pub fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Decides what `event` leads to, at `now`.
    pub fn apply(&mut self, ledger: &Matchmaker, now: i64, event: Event) -> Vec<Action> {
        let mut a = Apply { core: self, ledger, now, out: Vec::new() };
        a.event(event);
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

    /// Watches the queue's ready signals, so work made ready on other nodes wakes us.
    pub(super) fn watch(&mut self, q: &QueueKey) {
        if !self.core.draining && self.core.watching.insert(q.clone()) {
            self.out.push(Action::Watch(q.clone()));
        }
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
