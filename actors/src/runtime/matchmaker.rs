//! The credit ledger of a node's waiting workers: which worker slots of which queue can take
//! how many executions right now. Shared by the dispatcher (which adds and removes waiting
//! workers and claims READY work for them) and the shard owners (which reserve an *offer* of
//! slots before a fire transaction, so it can start executions for waiting workers at once — a
//! *sync match* — and give back what it did not use). A pure data structure under one lock; it
//! performs no I/O. Grants become the layer's claim slots in one place ([`Reserved::of`]).

use std::collections::BTreeMap;
use std::sync::Mutex;

use kairos_layer::limits::CLAIM_BATCH_MAX;
use kairos_layer::ops::claim::ClaimSlot;

use super::messages::{Grant, QueueKey};

#[derive(Debug, Clone)]
struct Slot {
    worker_id: String,
    lease_ms: Option<u64>,
    credits: usize,
    /// Grants taken and not yet used or given back.
    pending: usize,
    /// A queue's dispatch buffer, not a worker: fire transactions may fill it (after the
    /// waiting workers), the dispatcher never serves it from itself.
    buffer: bool,
    /// A long poll (answered once, soon): never offered to a pre-fire, whose executions are
    /// handed over only when due — after the poll may have answered.
    poll: bool,
}

#[derive(Debug, Default)]
struct Queue {
    slots: BTreeMap<u64, Slot>,
    /// Round-robin start, so the slots of a queue share work evenly.
    cursor: u64,
    /// Most executions in flight through this node (None: unlimited).
    limit: Option<usize>,
    /// Executions in flight through this node (counted for limited queues only).
    in_flight: usize,
    /// Reserved and not yet used or given back (counted against the limit too).
    reserved: usize,
}

impl Queue {
    fn room(&self) -> usize {
        match self.limit {
            Some(l) => l.saturating_sub(self.in_flight + self.reserved),
            None => usize::MAX,
        }
    }
}

/// A waiting worker slot as [`Matchmaker::workers`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingWorker {
    /// Namespace.
    pub namespace: String,
    /// Queue.
    pub queue: String,
    /// The worker's id.
    pub worker_id: String,
    /// A long poll (else a stream).
    pub poll: bool,
    /// Free slots it holds now.
    pub credits: usize,
    /// The queue's concurrency limit on this node, if any.
    pub limit: Option<usize>,
}

/// The ledger. See the module docs.
#[derive(Debug, Default)]
pub struct Matchmaker {
    queues: Mutex<BTreeMap<QueueKey, Queue>>,
    limits: BTreeMap<String, usize>,
}

impl Matchmaker {
    /// A ledger applying per-queue concurrency limits (by queue name).
    pub fn new(limits: BTreeMap<String, usize>) -> Self {
        Matchmaker { queues: Mutex::default(), limits }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<QueueKey, Queue>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn queue<'a>(&self, m: &'a mut BTreeMap<QueueKey, Queue>, q: &QueueKey) -> &'a mut Queue {
        m.entry(q.clone())
            .or_insert_with(|| Queue { limit: self.limits.get(&q.1).copied(), ..Queue::default() })
    }

    /// Adds a waiting worker slot (or adds credits to it).
    pub fn add(
        &self,
        q: &QueueKey,
        slot: u64,
        worker_id: &str,
        lease_ms: Option<u64>,
        credits: usize,
    ) {
        let mut m = self.lock();
        let queue = self.queue(&mut m, q);
        let s = queue.slots.entry(slot).or_insert_with(|| Slot {
            worker_id: worker_id.to_string(),
            lease_ms,
            credits: 0,
            pending: 0,
            buffer: false,
            poll: false,
        });
        s.credits = s.credits.saturating_add(credits);
    }

    /// Marks a slot as a long poll's (see `Slot::poll`).
    pub fn mark_poll(&self, q: &QueueKey, slot: u64) {
        if let Some(s) = self.lock().get_mut(q).and_then(|q| q.slots.get_mut(&slot)) {
            s.poll = true;
        }
    }

    /// Sets the room of `q`'s dispatch buffer slot (created unassigned on first use): fire
    /// transactions may start up to that many executions for the buffer.
    pub fn set_buffer_room(&self, q: &QueueKey, slot: u64, room: usize) {
        let mut m = self.lock();
        let queue = self.queue(&mut m, q);
        let s = queue.slots.entry(slot).or_insert_with(|| Slot {
            worker_id: String::new(),
            lease_ms: None,
            credits: 0,
            pending: 0,
            buffer: true,
            poll: false,
        });
        s.credits = room;
    }

    /// Adds credits to an existing slot (a worker stream freed slots); none if it is gone.
    pub fn credit(&self, q: &QueueKey, slot: u64, credits: usize) {
        let mut m = self.lock();
        if let Some(s) = m.get_mut(q).and_then(|queue| queue.slots.get_mut(&slot)) {
            s.credits = s.credits.saturating_add(credits);
        }
    }

    /// Removes a slot; returns the credits it still had.
    pub fn remove(&self, q: &QueueKey, slot: u64) -> usize {
        let mut m = self.lock();
        let Some(queue) = m.get_mut(q) else { return 0 };
        let left = queue.slots.remove(&slot).map_or(0, |s| s.credits);
        if queue.slots.is_empty() && queue.in_flight == 0 && queue.reserved == 0 {
            m.remove(q);
        }
        left
    }

    /// Credits a queue's waiting workers hold, within its concurrency limit.
    #[cfg(test)]
    pub fn available(&self, q: &QueueKey) -> usize {
        let m = self.lock();
        m.get(q).map_or(0, |queue| {
            queue.slots.values().map(|s| s.credits).sum::<usize>().min(queue.room())
        })
    }

    /// Per queue with a worker stream connected to this node: how many streams, and their
    /// free credits (what this node may hand them now, within the queue's limit). Long polls
    /// and dispatch buffers are not worker streams and are left out. For `kairosctl queues`
    /// and the `kairos_workers_connected` / `kairos_worker_credits_free` gauges.
    pub fn workers(&self) -> BTreeMap<QueueKey, (u32, u64)> {
        let m = self.lock();
        m.iter()
            .filter_map(|(k, q)| {
                let streams: Vec<&Slot> =
                    q.slots.values().filter(|s| !s.buffer && !s.poll).collect();
                let credits: usize = streams.iter().map(|s| s.credits).sum();
                let n = u32::try_from(streams.len()).unwrap_or(u32::MAX);
                (n > 0).then(|| (k.clone(), (n, credits.min(q.room()) as u64)))
            })
            .collect()
    }

    /// Queues this node's workers serve (a worker stream or a waiting poll), with or without
    /// credits now: the queues a fire may hold back for them (`super::held`).
    pub fn local_queues(&self) -> std::collections::BTreeSet<QueueKey> {
        let m = self.lock();
        m.iter()
            .filter(|(_, q)| q.slots.values().any(|s| !s.buffer))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// This node's waiting workers, queue by queue: each stream's or poll's slot with the
    /// credits it holds now (dispatch buffers left out). For the console's overview.
    pub fn waiting_workers(&self) -> Vec<WaitingWorker> {
        let m = self.lock();
        m.iter()
            .flat_map(|(q, queue)| {
                queue.slots.values().filter(|s| !s.buffer).map(|s| WaitingWorker {
                    namespace: q.0.clone(),
                    queue: q.1.clone(),
                    worker_id: s.worker_id.clone(),
                    poll: s.poll,
                    credits: s.credits,
                    limit: queue.limit,
                })
            })
            .collect()
    }

    /// Whether `q`'s waiting workers (or dispatch buffer) hold credits now.
    pub fn has_room_for(&self, q: &QueueKey) -> bool {
        self.room_for(q) > 0
    }

    /// Credits `q`'s waiting workers and dispatch buffer hold now, within its limit.
    pub fn room_for(&self, q: &QueueKey) -> usize {
        let m = self.lock();
        m.get(q).map_or(0, |q| q.slots.values().map(|s| s.credits).sum::<usize>().min(q.room()))
    }

    /// Queues whose waiting workers hold credits.
    fn hungry(&self) -> Vec<QueueKey> {
        let m = self.lock();
        m.iter()
            .filter(|(_, q)| q.room() > 0 && q.slots.values().any(|s| s.credits > 0))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Takes up to `n` credits of `q`'s waiting workers, round robin over them, one grant per
    /// execution.
    pub fn take(&self, q: &QueueKey, n: usize) -> Vec<Grant> {
        self.take_of(q, n, false, false)
    }

    /// Takes credits of waiting workers first, then of the queue's dispatch buffer; only of
    /// streams and buffers when `ahead` (for a pre-fire).
    fn take_for_fire(&self, q: &QueueKey, n: usize, ahead: bool) -> Vec<Grant> {
        let mut g = self.take_of(q, n, false, ahead);
        if g.len() < n {
            g.extend(self.take_of(q, n - g.len(), true, ahead));
        }
        g
    }

    fn take_of(&self, q: &QueueKey, n: usize, buffer: bool, ahead: bool) -> Vec<Grant> {
        let mut m = self.lock();
        let Some(queue) = m.get_mut(q) else { return Vec::new() };
        let mut want = n.min(queue.room());
        let mut grants = Vec::new();
        if want == 0 || queue.slots.is_empty() {
            return grants;
        }
        let ids = queue.slots.iter().filter(|(_, s)| s.buffer == buffer && !(ahead && s.poll));
        let ids: Vec<u64> = ids.map(|(id, _)| *id).collect();
        if ids.is_empty() {
            return grants;
        }
        let start = ids.iter().position(|id| *id >= queue.cursor).unwrap_or(0);
        // Deal one credit per slot per pass, so one slot does not take a whole batch while
        // others wait.
        while want > 0 {
            let mut dealt = false;
            for i in 0..ids.len() {
                if want == 0 {
                    break;
                }
                let id = ids[(start + i) % ids.len()];
                let s = queue.slots.get_mut(&id).expect("listed slot");
                if s.credits > 0 {
                    s.credits -= 1;
                    s.pending += 1;
                    want -= 1;
                    dealt = true;
                    grants.push(Grant {
                        worker_id: s.worker_id.clone(),
                        lease_ms: s.lease_ms,
                        slot: id,
                    });
                    queue.cursor = id + 1;
                }
            }
            if !dealt {
                break;
            }
        }
        queue.reserved += grants.len();
        assert!(grants.len() <= n, "never more grants than asked");
        debug_assert!(queue.limit.is_none_or(|l| queue.in_flight + queue.reserved <= l));
        grants
    }

    /// Gives grants back (not used): their credits return to slots that still exist.
    pub fn give_back(&self, q: &QueueKey, grants: Vec<Grant>) {
        let mut m = self.lock();
        let Some(queue) = m.get_mut(q) else { return };
        debug_assert!(queue.reserved >= grants.len(), "only reserved grants come back");
        queue.reserved = queue.reserved.saturating_sub(grants.len());
        for g in grants {
            if let Some(s) = queue.slots.get_mut(&g.slot) {
                s.credits += 1;
                s.pending = s.pending.saturating_sub(1);
            }
        }
    }

    /// Grants were used: executions are now in flight on `q`, `n` of them for each slot.
    pub fn used(&self, q: &QueueKey, per_slot: &[(u64, usize)]) {
        let mut m = self.lock();
        let queue = self.queue(&mut m, q);
        let n: usize = per_slot.iter().map(|(_, n)| n).sum();
        debug_assert!(queue.reserved >= n, "only reserved grants are used");
        queue.reserved = queue.reserved.saturating_sub(n);
        if queue.limit.is_some() {
            queue.in_flight += n;
        }
        for (slot, k) in per_slot {
            if let Some(s) = queue.slots.get_mut(slot) {
                s.pending = s.pending.saturating_sub(*k);
            }
        }
    }

    /// Credits `slot` holds now (0 if it is gone).
    pub fn credits(&self, q: &QueueKey, slot: u64) -> usize {
        let m = self.lock();
        m.get(q).and_then(|queue| queue.slots.get(&slot)).map_or(0, |s| s.credits)
    }

    /// Grants of `slot` still outstanding (reserved by a transaction not yet finished).
    pub fn pending(&self, q: &QueueKey, slot: u64) -> usize {
        let m = self.lock();
        m.get(q).and_then(|queue| queue.slots.get(&slot)).map_or(0, |s| s.pending)
    }

    /// `n` executions of `q` left flight (finished, released, or their lease ran out).
    pub fn finished(&self, q: &QueueKey, n: usize) {
        let mut m = self.lock();
        if let Some(queue) = m.get_mut(q) {
            queue.in_flight = queue.in_flight.saturating_sub(n);
        }
    }

    /// Whether `q` has a concurrency limit.
    pub fn is_limited(&self, q: &QueueKey) -> bool {
        self.limits.contains_key(&q.1)
    }
}

/// Grants reserved for one claim or one fire of a queue, as the layer's claim slots: one slot per
/// waiting worker in grant order, split at [`CLAIM_BATCH_MAX`]; `ids[i]` is slot `i`'s worker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reserved {
    /// The grants, in the order the ledger dealt them.
    pub grants: Vec<Grant>,
    /// The claim slots they make.
    pub slots: Vec<ClaimSlot>,
    /// The waiting worker (matchmaker slot) of each claim slot.
    pub ids: Vec<u64>,
}

impl Reserved {
    /// The claim slots of `grants`.
    pub fn of(grants: Vec<Grant>) -> Reserved {
        let mut order: Vec<(u64, ClaimSlot)> = Vec::new();
        for g in &grants {
            match order.iter_mut().find(|(id, _)| *id == g.slot) {
                Some((_, s)) => s.max += 1,
                None => order.push((
                    g.slot,
                    ClaimSlot { worker_id: g.worker_id.clone(), max: 1, lease_ms: g.lease_ms },
                )),
            }
        }
        let (mut slots, mut ids) = (Vec::new(), Vec::new());
        for (id, mut s) in order {
            while s.max > CLAIM_BATCH_MAX {
                slots.push(ClaimSlot { max: CLAIM_BATCH_MAX, ..s.clone() });
                ids.push(id);
                s.max -= CLAIM_BATCH_MAX;
            }
            slots.push(s);
            ids.push(id);
        }
        debug_assert_eq!(slots.iter().map(|s| s.max).sum::<usize>(), grants.len());
        Reserved { grants, slots, ids }
    }

    /// What a transaction used of these grants, `used[i]` executions of claim slot `i`: the
    /// count used per waiting worker, and the grants left over (each slot's tail), to give back.
    pub fn split(&self, used: &[usize]) -> (Vec<(u64, usize)>, Vec<Grant>) {
        let (mut per_slot, mut unused) = (Vec::new(), Vec::new());
        for (i, (id, slot)) in self.ids.iter().zip(&self.slots).enumerate() {
            let n = used.get(i).copied().unwrap_or(0);
            assert!(n <= slot.max, "a claim slot gets at most its max");
            per_slot.push((*id, n));
            if let Some(g) = self.grants.iter().find(|g| g.slot == *id) {
                unused.extend(std::iter::repeat_n(g.clone(), slot.max - n));
            }
        }
        (per_slot, unused)
    }
}

impl Matchmaker {
    /// Reserves, before a fire transaction, up to `want` grants of every queue whose waiting
    /// workers (or dispatch buffer) hold credits: the fire's offer.
    pub fn offer(&self, want: usize) -> BTreeMap<QueueKey, Reserved> {
        self.offer_of(want, false)
    }

    /// [`Matchmaker::offer`] for a pre-fire: of worker streams and dispatch buffers only (a long
    /// poll may have answered by the time its executions are due).
    pub fn offer_ahead(&self, want: usize) -> BTreeMap<QueueKey, Reserved> {
        self.offer_of(want, true)
    }

    /// [`Matchmaker::offer`] for a submit of due-now work (sync match at submit): of the hungry
    /// queues of the namespaces in `want`, up to that namespace's count each.
    pub fn offer_in(&self, want: &BTreeMap<String, usize>) -> BTreeMap<QueueKey, Reserved> {
        self.hungry()
            .into_iter()
            .filter_map(|q| {
                let n = want.get(&q.0).copied().unwrap_or(0);
                let grants = if n == 0 { Vec::new() } else { self.take_for_fire(&q, n, false) };
                (!grants.is_empty()).then(|| (q, Reserved::of(grants)))
            })
            .collect()
    }

    fn offer_of(&self, want: usize, ahead: bool) -> BTreeMap<QueueKey, Reserved> {
        if want == 0 {
            return BTreeMap::new();
        }
        self.hungry()
            .into_iter()
            .filter_map(|q| {
                let grants = self.take_for_fire(&q, want, ahead);
                (!grants.is_empty()).then(|| (q, Reserved::of(grants)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(slot: u64) -> Grant {
        Grant { worker_id: format!("w{slot}"), lease_ms: None, slot }
    }

    #[test]
    fn grants_become_one_claim_slot_per_worker_in_order() {
        let r = Reserved::of(vec![g(3), g(1), g(3), g(3), g(1)]);
        assert_eq!(
            r.slots.iter().map(|s| (s.worker_id.as_str(), s.max)).collect::<Vec<_>>(),
            [("w3", 3), ("w1", 2)]
        );
        assert_eq!(r.ids, vec![3, 1]);
        let many = Reserved::of((0..600).map(|_| g(7)).collect());
        assert_eq!(many.slots.iter().map(|s| s.max).collect::<Vec<_>>(), [256, 256, 88]);
        assert_eq!(many.ids, vec![7, 7, 7]);
        let (used, unused) = r.split(&[1, 2]);
        assert_eq!(used, vec![(3, 1), (1, 2)]);
        assert_eq!(unused, vec![g(3), g(3)], "the tail of each slot's share goes back");
    }

    #[test]
    fn an_offer_takes_from_every_hungry_queue_up_to_want() {
        let m = Matchmaker::default();
        m.add(&q(), 1, "a", None, 5);
        let other: QueueKey = ("ns".into(), "other".into());
        m.add(&other, 2, "b", None, 1);
        let offer = m.offer(3);
        assert_eq!(offer[&q()].grants.len(), 3);
        assert_eq!(offer[&other].grants.len(), 1);
        assert_eq!(m.available(&q()), 2, "reserved until settled");
        assert!(m.offer(0).is_empty());
    }

    #[test]
    fn a_prefire_is_offered_streams_and_buffers_never_long_polls() {
        let m = Matchmaker::default();
        m.add(&q(), 1, "poller", None, 4);
        m.mark_poll(&q(), 1);
        assert!(m.offer_ahead(3).is_empty(), "a long poll only");
        m.add(&q(), 2, "streamer", None, 2);
        m.set_buffer_room(&q(), 3, 2);
        let ahead = m.offer_ahead(10);
        let ids: Vec<u64> = ahead[&q()].grants.iter().map(|g| g.slot).collect();
        assert_eq!(ids, [2, 2, 3, 3], "the stream, then the buffer");
        assert_eq!(m.offer(10)[&q()].grants.len(), 4, "a fire takes the poll's too");
    }

    #[test]
    fn workers_counts_streams_and_their_free_credits_only() {
        let m = Matchmaker::new(BTreeMap::from([("q".to_string(), 5)]));
        m.add(&q(), 1, "a", None, 3);
        m.add(&q(), 2, "b", None, 4);
        m.add(&q(), 3, "poller", None, 9);
        m.mark_poll(&q(), 3);
        m.set_buffer_room(&q(), 4, 8);
        assert_eq!(m.workers()[&q()], (2, 5), "two streams; 7 credits capped by the limit");
        m.take(&q(), 1);
        m.remove(&q(), 1);
        m.remove(&q(), 2);
        assert!(m.workers().is_empty(), "a poll and a buffer are not worker streams");
    }

    fn q() -> QueueKey {
        ("ns".into(), "q".into())
    }

    #[test]
    fn credits_are_dealt_round_robin_and_come_back() {
        let m = Matchmaker::default();
        m.add(&q(), 1, "a", None, 3);
        m.add(&q(), 2, "b", Some(5_000), 3);
        assert_eq!(m.available(&q()), 6);
        let g = m.take(&q(), 4);
        let per: Vec<u64> = g.iter().map(|g| g.slot).collect();
        assert_eq!(per.iter().filter(|s| **s == 1).count(), 2, "{per:?}");
        assert_eq!(per.iter().filter(|s| **s == 2).count(), 2, "{per:?}");
        assert_eq!(g.iter().find(|g| g.slot == 2).unwrap().lease_ms, Some(5_000));
        assert_eq!(m.available(&q()), 2);
        assert_eq!((m.credits(&q(), 1), m.credits(&q(), 2), m.credits(&q(), 9)), (1, 1, 0));
        m.give_back(&q(), g);
        assert_eq!(m.available(&q()), 6, "cancelled grants return their credits");
        assert_eq!(m.remove(&q(), 1), 3);
        assert_eq!(m.take(&q(), 10).len(), 3, "only what is left");
        assert!(m.hungry().is_empty());
    }

    #[test]
    fn a_concurrency_limit_caps_reservations_and_in_flight() {
        let m = Matchmaker::new(BTreeMap::from([("q".to_string(), 2)]));
        m.add(&q(), 1, "a", None, 10);
        let g = m.take(&q(), 10);
        assert_eq!(g.len(), 2, "limit 2");
        assert_eq!(m.take(&q(), 1).len(), 0, "reserved count against the limit");
        assert_eq!(m.pending(&q(), 1), 2);
        m.used(&q(), &[(1, 2)]);
        assert_eq!(m.pending(&q(), 1), 0);
        assert_eq!(m.available(&q()), 0);
        m.finished(&q(), 1);
        assert_eq!(m.take(&q(), 5).len(), 1);
    }
}
