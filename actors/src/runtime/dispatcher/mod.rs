//! Dispatcher: hands work to the workers waiting on this node — worker streams (`Work`, with
//! credits) and one-shot long polls (`Poll`). Every waiting worker is a slot in the node's
//! [`Matchmaker`] ledger with as many credits as tasks it can take. Work reaches them two ways:
//!
//! - **matched at fire time**: a shard owner's fire transaction reserves credits and starts the
//!   executions it fires for those workers in the same transaction; the dispatcher only
//!   delivers them ([`DispatcherMsg::Matched`]);
//! - **claimed from the ready queues**: when workers hold credits and a queue may have READY
//!   work (a local hint, a watch on the queue's ready signals, or simply not known yet), one
//!   `claim_many` per queue per node takes work for all of them, each with its own lease.
//!
//! - **from the dispatch buffer** (queues served by worker streams): the node claims a little
//!   ahead of demand — up to the streams' total slots — *unassigned* (no worker named yet), so
//!   a credit coming back with a result is answered with a task at once instead of after a
//!   claim transaction. A buffered attempt is named by its worker's first heartbeat or result;
//!   if the node dies holding it, its lease runs out and it is released uncounted (it never
//!   ran). Items older than half their lease are released, and a queue whose streams all
//!   closed gives its buffer back.
//!
//! Claimed work whose worker vanished before delivery (an *orphan*) goes to another waiting
//! worker of the queue if at least half its lease is left, else it is released (READY again at
//! once, the attempt not counted). Claims run in spawned tasks; results come back as messages.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kairos_layer::limits::CLAIM_BATCH_MAX;
use kairos_layer::ops::claim::{CLAIM_MANY_MAX, ClaimSlot, Claimed};
use kairos_layer::ops::fire::Grant;
use kairos_layer::ops::worker::{Outcome, Report};
use kairos_layer::ops::{Error, error::invalid};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::mpsc;

use crate::runtime::context::{Ctx, send_after};
use crate::runtime::matchmaker::QueueKey;

/// A worker's long poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollRequest {
    /// Namespace.
    pub namespace: String,
    /// Queue.
    pub queue: String,
    /// The polling worker.
    pub worker_id: String,
    /// Most executions wanted.
    pub max: usize,
    /// Lease per execution (the definition's when `None`).
    pub lease_ms: Option<u64>,
    /// How long to wait for work.
    pub wait_ms: u64,
}

/// The reply to a poll.
pub type PollReply = Result<Vec<Claimed>, Error>;

/// Where a worker stream's tasks go.
pub type TaskSender = mpsc::UnboundedSender<Vec<Claimed>>;

/// A worker stream opening.
#[derive(Debug)]
pub struct SessionOpen {
    /// Namespace.
    pub namespace: String,
    /// Queue.
    pub queue: String,
    /// The worker.
    pub worker_id: String,
    /// Lease per execution (the definition's when `None`).
    pub lease_ms: Option<u64>,
    /// Free slots to start with.
    pub credits: usize,
    /// Where its tasks go.
    pub tasks: TaskSender,
}

/// Messages of the dispatcher.
#[derive(Debug)]
pub enum DispatcherMsg {
    /// A worker polls.
    Poll(PollRequest, RpcReplyPort<PollReply>),
    /// A worker stream opens; the reply is its slot id.
    Open(SessionOpen, RpcReplyPort<u64>),
    /// A worker stream has more free slots.
    Credits(u64, usize),
    /// A worker stream closed.
    Close(u64),
    /// A queue may have new ready work.
    Ready {
        /// Namespace.
        ns: String,
        /// Queue.
        queue: String,
    },
    /// A fire transaction started these executions for the waiting workers of its grants.
    Matched(Vec<(Claimed, Grant)>),
    /// Claimed executions without a worker.
    Orphans(Vec<Claimed>),
    /// A claim for the listed grants of a queue finished.
    Claimed(QueueKey, Vec<Grant>, Result<(Vec<Vec<Claimed>>, bool), Error>),
    /// A poll's wait ran out.
    Expire(u64),
    /// A poll that got work stops lingering.
    Flush(u64),
    /// A watch on a queue's ready signals ended.
    WatchEnded(QueueKey),
    /// Executions of a queue left flight (results, releases).
    Finished(QueueKey, usize),
    /// Stop serving: answer waiting polls with no work, close worker streams.
    Drain(RpcReplyPort<()>),
    /// A claim for a queue's dispatch buffer finished: the queue and the claimed executions
    /// with whether the queue may hold more.
    Buffered(QueueKey, Result<(Vec<Claimed>, bool), Error>),
    /// Release dispatch-buffer items that waited too long.
    AgeBuffers,
}

struct Waiter {
    queue: QueueKey,
    reply: RpcReplyPort<PollReply>,
    max: usize,
    /// Work delivered and not yet answered: a poll lingers [`POLL_LINGER`] after its first
    /// delivery, so the fires of several shards that reserved its credits fill one answer.
    got: Vec<Claimed>,
    lingering: bool,
}

/// How long a poll that got work waits for more reserved for it before answering.
pub const POLL_LINGER: Duration = Duration::from_millis(2);

struct Session {
    queue: QueueKey,
    tasks: TaskSender,
    /// The worker's slots as far as the node can tell: the credits it opened the stream with,
    /// raised to the most it has held at once. A stream may open with every slot busy
    /// (credits 0: a worker reconnecting while its tasks run) and get its slots back later as
    /// credits; sized by its opening credits alone, its queue's dispatch buffer would aim at
    /// nothing and never claim (simulation seed 437).
    capacity: usize,
}

/// Executions claimed ahead of demand for a queue's worker streams.
#[derive(Default)]
struct Buffer {
    items: std::collections::VecDeque<Claimed>,
    refilling: usize,
    /// A ready hint came while a refill was in flight.
    again: bool,
    /// The buffer's slot in the matchmaker: fire transactions start executions for it
    /// (unassigned) when no worker waits, so they skip the ready queue.
    slot: Option<u64>,
}

/// Most executions one queue's dispatch buffer holds.
pub const DISPATCH_BUFFER_MAX: usize = 512;
/// How often the buffers are checked for items waiting too long (and queues with waiting
/// credits look at their ready queues again).
const BUFFER_AGE_CHECK: Duration = Duration::from_secs(1);
/// How long a failed ready-signal watch waits before it is set again.
const WATCH_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// The dispatcher actor.
pub struct Dispatcher;

/// State of the dispatcher.
pub struct DispatcherState {
    ctx: Ctx,
    next_id: u64,
    waiters: BTreeMap<u64, Waiter>,
    sessions: BTreeMap<u64, Session>,
    /// Queues with a claim in flight, and whether ready work was hinted meanwhile.
    claiming: BTreeMap<QueueKey, bool>,
    /// Queues that may hold READY work (hinted, or not known to be empty).
    maybe_ready: BTreeSet<QueueKey>,
    /// Queues seen so far (a first waiter claims at once: work may be ready from before).
    known: BTreeSet<QueueKey>,
    watching: BTreeSet<QueueKey>,
    buffers: BTreeMap<QueueKey, Buffer>,
    draining: bool,
    /// Claims failed in a row (any queue): the retry pause doubles with it and only the 1st,
    /// 2nd, 4th… failure is logged, so a failing store is neither spun on nor floods the log.
    claim_failures: u32,
}

/// The pause before retrying a claim after `failures` failures in a row: 100 ms doubling,
/// at most 5 s.
fn claim_retry_pause(failures: u32) -> Duration {
    Duration::from_millis(100u64 << failures.saturating_sub(1).min(6)).min(Duration::from_secs(5))
}

impl DispatcherState {
    /// Whether `q` is served through a dispatch buffer: worker streams wait on it and it has
    /// no concurrency limit (a buffer would hold work beyond the limit).
    fn buffered(&self, q: &QueueKey) -> bool {
        !self.ctx.matchmaker.is_limited(q) && self.sessions.values().any(|s| &s.queue == q)
    }

    /// How much `q`'s buffer aims to hold: the streams' slots, bounded. At least the credits
    /// they hold (a session's capacity never falls below them): a target of 0 with credits
    /// waiting would have the queue never claimed.
    fn buffer_target(&self, q: &QueueKey) -> usize {
        let slots: usize =
            self.sessions.values().filter(|s| &s.queue == q).map(|s| s.capacity).sum();
        slots.min(DISPATCH_BUFFER_MAX)
    }

    /// Hands buffered executions to the waiting workers of `q` with credits.
    fn serve_buffer(&mut self, myself: &ActorRef<DispatcherMsg>, q: &QueueKey) {
        let n = self.buffers.get(q).map_or(0, |b| b.items.len());
        if n == 0 {
            return;
        }
        let grants = self.ctx.matchmaker.take(q, n);
        if grants.is_empty() {
            return;
        }
        let now = self.ctx.now_ms();
        let mut items = Vec::with_capacity(grants.len());
        let mut stale = Vec::new();
        let mut unused = Vec::new();
        let buffer = self.buffers.get_mut(q).expect("checked above");
        for g in grants {
            loop {
                match buffer.items.pop_front() {
                    Some(c) if fresh(&c, now) => {
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
        self.ctx.matchmaker.used(q, &used.into_iter().collect::<Vec<_>>());
        self.ctx.matchmaker.give_back(q, unused);
        let mut orphans = self.deliver_granted(myself, items);
        orphans.extend(stale);
        self.release(orphans);
        self.sync_buffer_slot(q);
    }

    /// Claims ahead for `q`'s buffer when it runs below half its target and the queue may
    /// hold READY work.
    fn refill(&mut self, myself: &ActorRef<DispatcherMsg>, q: &QueueKey) {
        if self.draining || !self.buffered(q) || !self.maybe_ready.contains(q) {
            return;
        }
        let target = self.buffer_target(q);
        let b = self.buffers.entry(q.clone()).or_default();
        if b.refilling > 0 {
            b.again = true;
            return;
        }
        if b.items.len() * 2 > target {
            return;
        }
        let want = (target - b.items.len()).min(CLAIM_MANY_MAX);
        if want == 0 {
            return;
        }
        b.refilling = want;
        b.again = false;
        let mut slots = Vec::new();
        let mut left = want;
        while left > 0 {
            let n = left.min(CLAIM_BATCH_MAX);
            // Unassigned: the worker is named by its first heartbeat or result.
            slots.push(ClaimSlot { worker_id: String::new(), max: n, lease_ms: None });
            left -= n;
        }
        let (sched, me, qq) = (self.ctx.sched.clone(), myself.clone(), q.clone());
        tokio::spawn(async move {
            let r = sched
                .claim_many_more(&qq.0, &qq.1, &slots)
                .await
                .map(|(v, more)| (v.concat(), more));
            let _ = me.send_message(DispatcherMsg::Buffered(qq, r));
        });
        self.sync_buffer_slot(q);
    }

    /// Sets the room fire transactions may fill in `q`'s buffer: its target less what it holds,
    /// what a refill is claiming, and what fires already reserved.
    fn sync_buffer_slot(&mut self, q: &QueueKey) {
        if !self.buffered(q) || self.draining {
            return;
        }
        let target = self.buffer_target(q);
        let next = &mut self.next_id;
        let b = self.buffers.entry(q.clone()).or_default();
        // Ids are taken as sessions and polls take theirs (the current value, then one up):
        // taking `next + 1` here gave a buffer the id of the next stream to open, and work
        // reserved for the buffer of one queue went to a stream of another (even of another
        // namespace).
        let slot = *b.slot.get_or_insert_with(|| {
            let id = *next;
            *next += 1;
            id
        });
        let pending = self.ctx.matchmaker.pending(q, slot);
        let room = target.saturating_sub(b.items.len() + b.refilling + pending);
        self.ctx.matchmaker.set_buffer_room(q, slot, room);
    }

    /// Drops `q`'s buffer (no stream left, or draining): its slot leaves the matchmaker and
    /// its executions are given back.
    fn drop_buffer(&mut self, q: &QueueKey) {
        if let Some(b) = self.buffers.remove(q) {
            if let Some(slot) = b.slot {
                self.ctx.matchmaker.remove(q, slot);
            }
            self.release(b.items.into());
        }
    }

    /// Gives claimed executions back: READY again at once, the attempts not counted.
    fn release(&self, claimed: Vec<Claimed>) {
        if claimed.is_empty() {
            return;
        }
        self.ctx
            .metrics
            .orphans_released
            .fetch_add(claimed.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            let reports: Vec<Report> = claimed
                .iter()
                .map(|c| Report {
                    namespace: c.execution.namespace.clone(),
                    execution_id: c.execution.id.clone(),
                    token: c.attempt.fencing_token,
                    outcome: Outcome::Release,
                    worker_id: None,
                })
                .collect();
            match ctx.batcher.report(reports).await {
                Ok(results) => {
                    for e in results.into_iter().flatten() {
                        let q = (e.namespace.clone(), e.queue.clone());
                        if ctx.matchmaker.is_limited(&q)
                            && let Some(d) = ctx.routes.dispatcher()
                        {
                            let _ = d.send_message(DispatcherMsg::Finished(q.clone(), 1));
                        }
                        ctx.routes.ready_hint(&q.0, &q.1);
                    }
                }
                // Not released: their leases run out and the lease check releases or retries
                // them.
                Err(e) => tracing::warn!(error = %e, "releasing undelivered executions failed"),
            }
        });
    }
    fn has_demand(&self, q: &QueueKey) -> bool {
        self.sessions.values().any(|s| &s.queue == q)
            || self.waiters.values().any(|w| &w.queue == q)
    }

    /// A waiting worker of `q` was added or got credits.
    fn demand(&mut self, myself: &ActorRef<DispatcherMsg>, q: &QueueKey) {
        if self.known.insert(q.clone()) {
            self.maybe_ready.insert(q.clone());
        }
        if self.buffered(q) {
            self.serve_buffer(myself, q);
            if self.maybe_ready.contains(q) {
                self.refill(myself, q);
            } else {
                self.ensure_watch(myself, q);
            }
            return;
        }
        if self.maybe_ready.contains(q) {
            self.claim_queue(myself, q);
        } else {
            self.ensure_watch(myself, q);
        }
    }

    /// Claims for the credits of `q`'s waiting workers in one transaction (one claim in flight
    /// per queue per node: no conflicts between this node's own workers).
    fn claim_queue(&mut self, myself: &ActorRef<DispatcherMsg>, q: &QueueKey) {
        if self.draining {
            return;
        }
        if let Some(again) = self.claiming.get_mut(q) {
            *again = true; // re-run once the claim in flight returns
            return;
        }
        let grants = self.ctx.matchmaker.take(q, CLAIM_MANY_MAX);
        if grants.is_empty() {
            return; // nobody waiting with credits (or the concurrency limit is reached)
        }
        let slots = slots_of(&grants);
        self.claiming.insert(q.clone(), false);
        let (sched, me, q) = (self.ctx.sched.clone(), myself.clone(), q.clone());
        tokio::spawn(async move {
            let r = sched.claim_many_more(&q.0, &q.1, &slots).await;
            let _ = me.send_message(DispatcherMsg::Claimed(q, grants, r));
        });
    }

    /// Watches the queue's ready signals, so work made ready on other nodes wakes us.
    fn ensure_watch(&mut self, myself: &ActorRef<DispatcherMsg>, q: &QueueKey) {
        if self.draining || !self.watching.insert(q.clone()) {
            return;
        }
        let sched = self.ctx.sched.clone();
        let me = myself.clone();
        let cap = self.ctx.clock.sleep(Duration::from_millis(self.ctx.config.poll_wait_max_ms));
        let clock = self.ctx.clock.clone();
        let q = q.clone();
        tokio::spawn(async move {
            let watch = async {
                let db = sched.database();
                let tx = db.begin()?;
                let parts = sched.config().ready_partitions.max(1);
                let mut watches = Vec::new();
                for p in 0..parts {
                    watches.push(tx.watch(&sched.keyspace().ready_signal(&q.0, &q.1, p))?);
                }
                tx.commit().await?;
                // Let go of the transaction before waiting: a live transaction pins its read
                // snapshot (the store cannot reuse pages freed after it) and the resolver's
                // history, for as long as the watch waits.
                drop(tx);
                futures_util::future::select_all(watches).await.0
            };
            let failed = tokio::select! {
                r = watch => {
                    if r.is_ok() {
                        let _ = me.send_message(DispatcherMsg::Ready { ns: q.0.clone(), queue: q.1.clone() });
                    }
                    r.is_err()
                }
                _ = cap => false,
            };
            if failed {
                // A store failing at once (unavailable, failing over) would otherwise have the
                // watch set again at once, and fail again: a busy loop against the store.
                clock.sleep(WATCH_RETRY_PAUSE).await;
            }
            let _ = me.send_message(DispatcherMsg::WatchEnded(q));
        });
    }

    /// Records what reached workers.
    fn record_delivered(&self, claimed: &[Claimed]) {
        let m = &self.ctx.metrics;
        m.claimed.fetch_add(claimed.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let now = self.ctx.now_ms();
        for c in claimed {
            if c.attempt.number == 1 {
                let late = u64::try_from(now - c.execution.execute_at_ms).unwrap_or(0);
                m.lateness_start.observe(Duration::from_millis(late));
            }
            if let Some(t) = kairos_layer::ops::timer_of(&c.execution) {
                self.ctx.routes.timer_hint(t); // its lease check, to a local owner
            }
        }
    }

    /// Hands claimed executions to the waiting worker `slot`; what it cannot take comes back.
    fn deliver(
        &mut self,
        myself: &ActorRef<DispatcherMsg>,
        slot: u64,
        claimed: Vec<Claimed>,
    ) -> Vec<Claimed> {
        if claimed.is_empty() {
            return claimed;
        }
        // A worker only ever gets work of its own namespace and queue: anything else comes
        // back (to be routed by its own queue) and is logged, as it means a wrong slot.
        let queue = match (self.sessions.get(&slot), self.waiters.get(&slot)) {
            (Some(s), _) => Some(s.queue.clone()),
            (None, Some(w)) => Some(w.queue.clone()),
            (None, None) => None,
        };
        let mut foreign = Vec::new();
        let claimed = match &queue {
            Some(q) => {
                let (mine, other): (Vec<Claimed>, Vec<Claimed>) = claimed
                    .into_iter()
                    .partition(|c| c.execution.namespace == q.0 && c.execution.queue == q.1);
                if !other.is_empty() {
                    tracing::error!(
                        slot,
                        namespace = %q.0,
                        queue = %q.1,
                        other = other.len(),
                        "work of another queue was about to go to this worker: kept back"
                    );
                }
                foreign = other;
                mine
            }
            None => claimed,
        };
        if claimed.is_empty() {
            return foreign;
        }
        if let Some(s) = self.sessions.get(&slot) {
            return match s.tasks.send(claimed) {
                Ok(()) => foreign,
                Err(mpsc::error::SendError(mut back)) => {
                    back.extend(foreign);
                    back
                }
            };
        }
        if let Some(w) = self.waiters.get_mut(&slot) {
            w.got.extend(claimed);
            if w.got.len() >= w.max {
                let mut back = self.answer(slot);
                back.extend(foreign);
                return back;
            }
            if !w.lingering {
                w.lingering = true;
                send_after(
                    &self.ctx.clock,
                    POLL_LINGER,
                    myself.clone(),
                    DispatcherMsg::Flush(slot),
                );
            }
            return foreign;
        }
        claimed
    }

    /// Answers a poll with what it got (a poll is answered once: its remaining credits go);
    /// returns what could not be handed over (the poller is gone).
    fn answer(&mut self, slot: u64) -> Vec<Claimed> {
        let Some(w) = self.waiters.remove(&slot) else { return Vec::new() };
        self.ctx.matchmaker.remove(&w.queue, slot);
        match w.reply.send(Ok(w.got)) {
            Ok(()) => Vec::new(),
            Err(ractor::MessagingErr::SendErr(Ok(back))) => back,
            Err(_) => Vec::new(),
        }
    }

    /// Delivers per grant, recording what reached a worker; returns the orphans.
    fn deliver_granted(
        &mut self,
        myself: &ActorRef<DispatcherMsg>,
        items: Vec<(Claimed, u64)>,
    ) -> Vec<Claimed> {
        let mut by_slot: BTreeMap<u64, Vec<Claimed>> = BTreeMap::new();
        for (c, slot) in items {
            by_slot.entry(slot).or_default().push(c);
        }
        let mut orphans = Vec::new();
        for (slot, claimed) in by_slot {
            let n = claimed.len();
            let back = self.deliver(myself, slot, claimed.clone());
            if back.len() < n {
                let delivered: Vec<Claimed> = claimed
                    .into_iter()
                    .filter(|c| !back.iter().any(|b| b.execution.id == c.execution.id))
                    .collect();
                self.record_delivered(&delivered);
            }
            orphans.extend(back);
        }
        orphans
    }

    /// Claimed executions without a worker: to another waiting worker of the queue while at
    /// least half their lease is left, else released (READY again, the attempt not counted).
    fn orphans(&mut self, myself: &ActorRef<DispatcherMsg>, orphans: Vec<Claimed>) {
        let now = self.ctx.now_ms();
        let mut release = Vec::new();
        let mut touched = BTreeSet::new();
        for c in orphans {
            let q = (c.execution.namespace.clone(), c.execution.queue.clone());
            let enough = fresh(&c, now);
            if enough && !self.draining && self.buffered(&q) {
                // Back to the front of the queue's buffer, for the next credit.
                self.buffers.entry(q.clone()).or_default().items.push_front(c);
                touched.insert(q);
                continue;
            }
            let grant =
                if enough && !self.draining { self.ctx.matchmaker.take(&q, 1).pop() } else { None };
            match grant {
                Some(g) => {
                    self.ctx.matchmaker.used(&q, &[(g.slot, 1)]);
                    self.ctx.matchmaker.finished(&q, 1); // it was in flight already
                    let back = self.deliver_granted(myself, vec![(c, g.slot)]);
                    release.extend(back);
                }
                None => release.push(c),
            }
        }
        self.release(release);
        for q in touched {
            self.serve_buffer(myself, &q);
        }
    }
}

/// Whether a claimed execution still has at least half its lease: enough for its worker's
/// first heartbeat (at a third of the lease) to land in time.
fn fresh(c: &Claimed, now: i64) -> bool {
    let left = c.execution.lease_expires_at_ms - now;
    left.saturating_mul(2) >= c.execution.lease_ms as i64
}

/// One claim slot per waiting worker among the grants, in grant order.
fn slots_of(grants: &[Grant]) -> Vec<ClaimSlot> {
    let mut slots: Vec<(u64, ClaimSlot)> = Vec::new();
    for g in grants {
        match slots.iter_mut().find(|(id, _)| *id == g.slot) {
            Some((_, s)) => s.max += 1,
            None => slots.push((
                g.slot,
                ClaimSlot { worker_id: g.worker_id.clone(), max: 1, lease_ms: g.lease_ms },
            )),
        }
    }
    // A claim slot takes at most CLAIM_BATCH_MAX: split bigger ones.
    let mut out = Vec::new();
    for (_, mut s) in slots {
        while s.max > CLAIM_BATCH_MAX {
            out.push(ClaimSlot { max: CLAIM_BATCH_MAX, ..s.clone() });
            s.max -= CLAIM_BATCH_MAX;
        }
        out.push(s);
    }
    out
}

/// The slot id of each claim slot of [`slots_of`], in the same order.
fn slot_ids(grants: &[Grant]) -> Vec<u64> {
    let mut ids: Vec<(u64, usize)> = Vec::new();
    for g in grants {
        match ids.iter_mut().find(|(id, _)| *id == g.slot) {
            Some((_, n)) => *n += 1,
            None => ids.push((g.slot, 1)),
        }
    }
    let mut out = Vec::new();
    for (id, mut n) in ids {
        while n > CLAIM_BATCH_MAX {
            out.push(id);
            n -= CLAIM_BATCH_MAX;
        }
        out.push(id);
    }
    out
}

impl Actor for Dispatcher {
    type Msg = DispatcherMsg;
    type State = DispatcherState;
    type Arguments = Ctx;

    async fn pre_start(
        &self,
        myself: ActorRef<DispatcherMsg>,
        ctx: Ctx,
    ) -> Result<DispatcherState, ActorProcessingErr> {
        ctx.routes.set_dispatcher(Some(myself.clone()));
        send_after(&ctx.clock, BUFFER_AGE_CHECK, myself, DispatcherMsg::AgeBuffers);
        Ok(DispatcherState {
            ctx,
            next_id: 1,
            waiters: BTreeMap::new(),
            sessions: BTreeMap::new(),
            claiming: BTreeMap::new(),
            maybe_ready: BTreeSet::new(),
            known: BTreeSet::new(),
            watching: BTreeSet::new(),
            buffers: BTreeMap::new(),
            draining: false,
            claim_failures: 0,
        })
    }

    async fn post_stop(
        &self,
        myself: ActorRef<DispatcherMsg>,
        s: &mut DispatcherState,
    ) -> Result<(), ActorProcessingErr> {
        s.ctx.routes.remove_dispatcher(myself.get_id());
        for (id, w) in std::mem::take(&mut s.waiters) {
            s.ctx.matchmaker.remove(&w.queue, id);
            let _ = w.reply.send(Ok(w.got));
        }
        for (id, session) in std::mem::take(&mut s.sessions) {
            s.ctx.matchmaker.remove(&session.queue, id);
        }
        let buffered: Vec<Claimed> =
            std::mem::take(&mut s.buffers).into_values().flat_map(|b| b.items).collect();
        s.release(buffered);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<DispatcherMsg>,
        msg: DispatcherMsg,
        s: &mut DispatcherState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            DispatcherMsg::Poll(req, reply) => {
                if req.max == 0 || req.max > CLAIM_BATCH_MAX {
                    let _ = reply.send(Err(invalid(
                        "maxExecutions",
                        format!("must be between 1 and {CLAIM_BATCH_MAX}"),
                    )));
                    return Ok(());
                }
                if s.draining {
                    let _ = reply.send(Ok(Vec::new()));
                    return Ok(());
                }
                let wait = req.wait_ms.min(s.ctx.config.poll_wait_max_ms);
                let id = s.next_id;
                s.next_id += 1;
                let q = (req.namespace.clone(), req.queue.clone());
                s.ctx.matchmaker.add(&q, id, &req.worker_id, req.lease_ms, req.max);
                s.waiters.insert(
                    id,
                    Waiter {
                        queue: q.clone(),
                        reply,
                        max: req.max,
                        got: Vec::new(),
                        lingering: false,
                    },
                );
                send_after(
                    &s.ctx.clock,
                    Duration::from_millis(wait),
                    myself.clone(),
                    DispatcherMsg::Expire(id),
                );
                s.demand(&myself, &q);
            }
            DispatcherMsg::Open(open, reply) => {
                let id = s.next_id;
                s.next_id += 1;
                let _ = reply.send(id);
                if s.draining {
                    return Ok(()); // its task sender drops: the stream ends
                }
                let q = (open.namespace.clone(), open.queue.clone());
                s.ctx.matchmaker.add(&q, id, &open.worker_id, open.lease_ms, open.credits);
                s.sessions.insert(
                    id,
                    Session { queue: q.clone(), tasks: open.tasks, capacity: open.credits },
                );
                s.demand(&myself, &q);
            }
            DispatcherMsg::Credits(id, n) => {
                if let Some(session) = s.sessions.get_mut(&id) {
                    let q = session.queue.clone();
                    s.ctx.matchmaker.credit(&q, id, n);
                    // The buffer's target covers every credit its streams hold.
                    session.capacity = session.capacity.max(s.ctx.matchmaker.credits(&q, id));
                    s.demand(&myself, &q);
                }
            }
            DispatcherMsg::Close(id) => {
                if let Some(session) = s.sessions.remove(&id) {
                    s.ctx.matchmaker.remove(&session.queue, id);
                    if !s.buffered(&session.queue) {
                        // No stream left on this node: let other nodes' workers have them.
                        s.drop_buffer(&session.queue);
                    }
                }
            }
            DispatcherMsg::Ready { ns, queue } => {
                let q = (ns, queue);
                s.known.insert(q.clone());
                s.maybe_ready.insert(q.clone());
                if s.buffered(&q) {
                    s.refill(&myself, &q);
                } else {
                    s.claim_queue(&myself, &q);
                }
            }
            DispatcherMsg::Buffered(q, result) => {
                let again = s.buffers.get_mut(&q).is_some_and(|b| {
                    b.refilling = 0;
                    std::mem::take(&mut b.again)
                });
                match result {
                    Ok((claimed, more)) => {
                        s.claim_failures = 0;
                        if !more && !again {
                            s.maybe_ready.remove(&q); // the queue ran dry
                        }
                        if s.buffered(&q) && !s.draining {
                            s.buffers.entry(q.clone()).or_default().items.extend(claimed);
                            s.serve_buffer(&myself, &q);
                        } else {
                            s.release(claimed);
                        }
                        s.sync_buffer_slot(&q);
                        if s.has_demand(&q) {
                            s.demand(&myself, &q);
                        }
                    }
                    Err(e) => {
                        s.claim_failures = s.claim_failures.saturating_add(1);
                        if s.claim_failures.is_power_of_two() {
                            tracing::warn!(namespace = %q.0, queue = %q.1, error = %e, failures = s.claim_failures, "claim for the dispatch buffer failed; retrying with back-off");
                        }
                        let retry = DispatcherMsg::Ready { ns: q.0.clone(), queue: q.1.clone() };
                        let pause = claim_retry_pause(s.claim_failures);
                        send_after(&s.ctx.clock, pause, myself.clone(), retry);
                    }
                }
            }
            DispatcherMsg::AgeBuffers => {
                let now = s.ctx.now_ms();
                let mut stale = Vec::new();
                for b in s.buffers.values_mut() {
                    let (keep, old): (Vec<Claimed>, Vec<Claimed>) =
                        b.items.drain(..).partition(|c| fresh(c, now));
                    b.items = keep.into();
                    stale.extend(old);
                }
                s.release(stale);
                if !s.draining {
                    send_after(
                        &s.ctx.clock,
                        BUFFER_AGE_CHECK,
                        myself.clone(),
                        DispatcherMsg::AgeBuffers,
                    );
                }
            }
            DispatcherMsg::Matched(items) => {
                let mut per_queue: BTreeMap<QueueKey, BTreeMap<u64, usize>> = BTreeMap::new();
                for (c, g) in &items {
                    let q = (c.execution.namespace.clone(), c.execution.queue.clone());
                    *per_queue.entry(q).or_default().entry(g.slot).or_default() += 1;
                }
                for (q, slots) in per_queue {
                    s.ctx.matchmaker.used(&q, &slots.into_iter().collect::<Vec<_>>());
                }
                let orphans = s.deliver_granted(
                    &myself,
                    items.into_iter().map(|(c, g)| (c, g.slot)).collect(),
                );
                s.orphans(&myself, orphans);
            }
            DispatcherMsg::Orphans(claimed) => s.orphans(&myself, claimed),
            DispatcherMsg::Claimed(q, grants, result) => {
                let again = s.claiming.remove(&q).unwrap_or(false);
                match result {
                    Ok((per_slot, more)) => {
                        s.claim_failures = 0;
                        let ids = slot_ids(&grants);
                        let claimed: usize = per_slot.iter().map(Vec::len).sum();
                        // Unused grants go back (per slot: the tail of each slot's share).
                        let mut unused: Vec<Grant> = Vec::new();
                        let mut items = Vec::new();
                        let mut used: Vec<(u64, usize)> = Vec::new();
                        let slots = slots_of(&grants);
                        for ((id, got), slot) in ids.iter().zip(per_slot).zip(&slots) {
                            let missing = slot.max - got.len();
                            if let Some(g) = grants.iter().find(|g| g.slot == *id) {
                                unused.extend(std::iter::repeat_n(g.clone(), missing));
                            }
                            used.push((*id, got.len()));
                            items.extend(got.into_iter().map(|c| (c, *id)));
                        }
                        s.ctx.matchmaker.used(&q, &used);
                        s.ctx.matchmaker.give_back(&q, unused);
                        let orphans = s.deliver_granted(&myself, items);
                        s.orphans(&myself, orphans);
                        if claimed < grants.len() && !more && !again {
                            // The queue ran dry: wait for a hint or the watch.
                            s.maybe_ready.remove(&q);
                        }
                        if s.has_demand(&q) {
                            s.demand(&myself, &q);
                        }
                    }
                    Err(e) => {
                        s.ctx.matchmaker.give_back(&q, grants);
                        s.claim_failures = s.claim_failures.saturating_add(1);
                        if s.claim_failures.is_power_of_two() {
                            tracing::warn!(namespace = %q.0, queue = %q.1, error = %e, failures = s.claim_failures, "claim failed; retrying with back-off");
                        }
                        let retry = DispatcherMsg::Ready { ns: q.0.clone(), queue: q.1.clone() };
                        let pause = claim_retry_pause(s.claim_failures);
                        send_after(&s.ctx.clock, pause, myself.clone(), retry);
                    }
                }
            }
            DispatcherMsg::Flush(id) => {
                // Work reserved for this poll by a transaction still running comes soon:
                // linger on for it rather than answer and leave it without a taker.
                let pending =
                    s.waiters.get(&id).map_or(0, |w| s.ctx.matchmaker.pending(&w.queue, id));
                if pending > 0 {
                    send_after(&s.ctx.clock, POLL_LINGER, myself.clone(), DispatcherMsg::Flush(id));
                } else {
                    let back = s.answer(id);
                    s.orphans(&myself, back);
                }
            }
            DispatcherMsg::Expire(id) => {
                let back = s.answer(id);
                s.orphans(&myself, back);
            }
            DispatcherMsg::WatchEnded(q) => {
                s.watching.remove(&q);
                if s.has_demand(&q) && !s.draining && !s.maybe_ready.contains(&q) {
                    s.ensure_watch(&myself, &q);
                }
            }
            DispatcherMsg::Finished(q, n) => {
                s.ctx.matchmaker.finished(&q, n);
                if s.has_demand(&q) {
                    s.demand(&myself, &q);
                }
            }
            DispatcherMsg::Drain(reply) => {
                s.draining = true;
                let ids: Vec<u64> = s.waiters.keys().copied().collect();
                for id in ids {
                    let back = s.answer(id);
                    s.orphans(&myself, back);
                }
                // Dropping a stream's task sender ends it; its worker reconnects elsewhere.
                for (id, session) in std::mem::take(&mut s.sessions) {
                    s.ctx.matchmaker.remove(&session.queue, id);
                }
                let queues: Vec<QueueKey> = s.buffers.keys().cloned().collect();
                for q in queues {
                    s.drop_buffer(&q);
                }
                let _ = reply.send(());
            }
        }
        Ok(())
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
        let grants = vec![g(3), g(1), g(3), g(3), g(1)];
        let slots = slots_of(&grants);
        assert_eq!(
            slots.iter().map(|s| (s.worker_id.as_str(), s.max)).collect::<Vec<_>>(),
            [("w3", 3), ("w1", 2)]
        );
        assert_eq!(slot_ids(&grants), vec![3, 1]);
        let many: Vec<Grant> = (0..600).map(|_| g(7)).collect();
        assert_eq!(slots_of(&many).iter().map(|s| s.max).collect::<Vec<_>>(), [256, 256, 88]);
        assert_eq!(slot_ids(&many), vec![7, 7, 7]);
    }
}
