//! Dispatcher: serves workers' long polls. A poll claims READY executions of its queue at
//! once if there are any; otherwise it waits, woken by new ready work on this node (a local
//! hint from a shard owner) or on any node (a watch on the queue's ready-signal counter),
//! until its wait runs out. Per-queue concurrency limits bound what is in flight through this
//! node. Claims run in spawned tasks; results come back as messages.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kairos_layer::ops::claim::{CLAIM_MANY_MAX, ClaimSlot, Claimed};
use kairos_layer::ops::{Error, error::invalid, limits::CLAIM_BATCH_MAX};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::context::{Ctx, send_after};

/// A worker's poll.
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

/// Messages of the dispatcher.
#[derive(Debug)]
pub enum DispatcherMsg {
    /// A worker polls.
    Poll(PollRequest, RpcReplyPort<PollReply>),
    /// A queue has new ready work.
    Ready {
        /// Namespace.
        ns: String,
        /// Queue.
        queue: String,
    },
    /// A claim for the listed waiters of a queue finished.
    Claimed(QueueKey, Vec<u64>, Result<Vec<Vec<Claimed>>, Error>),
    /// A waiter's wait ran out.
    Expire(u64),
    /// A watch on a queue's ready signal ended.
    WatchEnded(String, String),
    /// An execution claimed through this node finished (or its lease was extended).
    Released(String),
    /// Its lease now ends at this time.
    Extended(String, i64),
    /// Stop serving polls: answer the waiting ones with no work.
    Drain(RpcReplyPort<()>),
}

struct Waiter {
    req: PollRequest,
    reply: Option<RpcReplyPort<PollReply>>,
    expired: bool,
}

/// (namespace, queue).
pub type QueueKey = (String, String);

/// The pure part: per-queue in-flight accounting under concurrency limits.
#[derive(Debug, Default)]
pub struct InFlight {
    by_id: BTreeMap<String, (QueueKey, i64)>,
    by_expiry: BTreeSet<(i64, String)>,
    counts: BTreeMap<QueueKey, usize>,
}

impl InFlight {
    /// Records claimed executions (only tracked for limited queues).
    pub fn add(&mut self, q: &QueueKey, id: &str, expires_at: i64) {
        if self.by_id.insert(id.to_string(), (q.clone(), expires_at)).is_none() {
            *self.counts.entry(q.clone()).or_default() += 1;
        }
        self.by_expiry.insert((expires_at, id.to_string()));
    }
    /// Forgets an execution; returns its queue.
    pub fn remove(&mut self, id: &str) -> Option<QueueKey> {
        let (q, exp) = self.by_id.remove(id)?;
        self.by_expiry.remove(&(exp, id.to_string()));
        if let Some(c) = self.counts.get_mut(&q) {
            *c = c.saturating_sub(1);
        }
        Some(q)
    }
    /// Moves an execution's lease end.
    pub fn extend(&mut self, id: &str, expires_at: i64) {
        if let Some((q, _)) = self.by_id.get(id).cloned() {
            self.remove(id);
            self.add(&q, id, expires_at);
        }
    }
    /// Forgets executions whose lease ended before `now` (their attempt timed out or will).
    pub fn prune(&mut self, now: i64) -> Vec<QueueKey> {
        let mut freed = Vec::new();
        while let Some((exp, id)) = self.by_expiry.first().cloned() {
            if exp >= now {
                break;
            }
            if let Some(q) = self.remove(&id) {
                freed.push(q);
            }
        }
        freed
    }
    /// Executions in flight on a queue.
    pub fn count(&self, q: &QueueKey) -> usize {
        self.counts.get(q).copied().unwrap_or(0)
    }
}

/// The dispatcher actor.
pub struct Dispatcher;

/// State of the dispatcher.
pub struct DispatcherState {
    ctx: Ctx,
    next_id: u64,
    waiters: BTreeMap<u64, Waiter>,
    /// Waiters inside an in-flight claim.
    claiming: BTreeSet<u64>,
    /// Queues with a claim in flight, and whether ready work arrived meanwhile.
    queue_claims: BTreeMap<QueueKey, bool>,
    watching: BTreeSet<QueueKey>,
    /// Claimed executions whose poll vanished before delivery, for the next poller.
    orphans: BTreeMap<QueueKey, Vec<Claimed>>,
    in_flight: InFlight,
    draining: bool,
}

impl DispatcherState {
    fn limit(&self, q: &QueueKey) -> Option<usize> {
        self.ctx.config.queue_concurrency.get(&q.1).copied()
    }

    /// Claims for the waiters of `q` in one transaction (one claim in flight per queue per
    /// node: no conflicts between this node's own pollers).
    fn claim_queue(&mut self, myself: &ActorRef<DispatcherMsg>, q: &QueueKey) {
        self.serve_orphans(q);
        if let Some(again) = self.queue_claims.get_mut(q) {
            *again = true; // re-run once the claim in flight returns
            return;
        }
        let mut room = self.limit(q).map(|l| l.saturating_sub(self.in_flight.count(q)));
        let mut ids = Vec::new();
        let mut slots = Vec::new();
        let mut total = 0;
        for (id, w) in &self.waiters {
            if w.expired || w.req.namespace != q.0 || w.req.queue != q.1 {
                continue;
            }
            let mut max = w.req.max;
            if let Some(r) = room.as_mut() {
                max = max.min(*r);
                *r -= max;
            }
            if max == 0 || total + max > CLAIM_MANY_MAX {
                break;
            }
            total += max;
            ids.push(*id);
            slots.push(ClaimSlot { worker_id: w.req.worker_id.clone(), max });
        }
        if ids.is_empty() {
            return; // nobody waiting, or parked until something in flight is released
        }
        let lease = self.waiters[&ids[0]].req.lease_ms;
        self.claiming.extend(ids.iter().copied());
        self.queue_claims.insert(q.clone(), false);
        let (sched, me, q) = (self.ctx.sched.clone(), myself.clone(), q.clone());
        tokio::spawn(async move {
            let r = sched.claim_many(&q.0, &q.1, &slots, lease).await;
            let _ = me.send_message(DispatcherMsg::Claimed(q, ids, r));
        });
    }

    /// Watches the queue's ready-signal counter, so work made ready on other nodes wakes us.
    fn ensure_watch(&mut self, myself: &ActorRef<DispatcherMsg>, q: &QueueKey) {
        if !self.watching.insert(q.clone()) {
            return;
        }
        let db = self.ctx.sched.database().clone();
        let key = self.ctx.sched.keyspace().ready_signal(&q.0, &q.1);
        let me = myself.clone();
        let cap = self.ctx.clock.sleep(Duration::from_millis(self.ctx.config.poll_wait_max_ms));
        let (ns, queue) = q.clone();
        tokio::spawn(async move {
            let watch = async {
                let tx = db.begin()?;
                let w = tx.watch(&key)?;
                tx.commit().await?;
                w.await
            };
            tokio::select! {
                r = watch => {
                    if r.is_ok() {
                        let _ = me.send_message(DispatcherMsg::Ready { ns: ns.clone(), queue: queue.clone() });
                    }
                }
                _ = cap => {}
            }
            let _ = me.send_message(DispatcherMsg::WatchEnded(ns, queue));
        });
    }

    fn record_claimed(&mut self, claimed: &[Claimed]) {
        let m = &self.ctx.metrics;
        m.claimed.fetch_add(claimed.len() as u64, std::sync::atomic::Ordering::Relaxed);
        for c in claimed {
            let e = &c.execution;
            if c.attempt.number == 1 {
                let late = u64::try_from(c.attempt.started_at_ms - e.execute_at_ms).unwrap_or(0);
                m.lateness_start.observe(Duration::from_millis(late));
            }
            if let Some(t) = kairos_layer::ops::timer_of(e) {
                self.ctx.routes.timer_hint(t); // its lease check, to a local owner
            }
            let q = (e.namespace.clone(), e.queue.clone());
            if self.limit(&q).is_some() {
                self.in_flight.add(&q, &e.id, e.lease_expires_at_ms);
            }
        }
    }

    fn answer(&mut self, id: u64, r: PollReply) {
        if let Some(mut w) = self.waiters.remove(&id)
            && let Some(reply) = w.reply.take()
        {
            let _ = reply.send(r);
        }
    }

    /// Hands claimed executions to a waiter; if its poll is gone (the worker disconnected or
    /// its call timed out), keeps them for the next poller of the queue instead of leaving
    /// them RUNNING until their lease expires.
    fn deliver(&mut self, id: u64, claimed: Vec<Claimed>) {
        let Some(mut w) = self.waiters.remove(&id) else {
            self.orphan(claimed);
            return;
        };
        match w.reply.take().map(|reply| reply.send(Ok(claimed))) {
            Some(Ok(())) => {}
            Some(Err(ractor::MessagingErr::SendErr(Ok(back)))) => self.orphan(back),
            _ => {}
        }
    }

    fn orphan(&mut self, claimed: Vec<Claimed>) {
        for c in claimed {
            let q = (c.execution.namespace.clone(), c.execution.queue.clone());
            self.orphans.entry(q).or_default().push(c);
        }
    }

    /// Serves waiting polls of `q` from orphaned claims first (those with at least a second
    /// of lease left; the others are left to their lease expiry and retry).
    fn serve_orphans(&mut self, q: &QueueKey) {
        let Some(mut orphans) = self.orphans.remove(q) else { return };
        let now = self.ctx.now_ms();
        orphans.retain(|c| c.execution.lease_expires_at_ms > now + 1_000);
        let ids: Vec<u64> = self
            .waiters
            .iter()
            .filter(|(id, w)| {
                w.req.namespace == q.0 && w.req.queue == q.1 && !self.claiming.contains(id)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if orphans.is_empty() {
                break;
            }
            let n = self.waiters[&id].req.max.min(orphans.len());
            let batch: Vec<Claimed> = orphans.drain(..n).collect();
            self.deliver(id, batch);
        }
        if !orphans.is_empty() {
            self.orphans.entry(q.clone()).or_default().extend(orphans);
        }
    }
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
        ctx.routes.set_dispatcher(Some(myself));
        Ok(DispatcherState {
            ctx,
            next_id: 0,
            waiters: BTreeMap::new(),
            claiming: BTreeSet::new(),
            queue_claims: BTreeMap::new(),
            watching: BTreeSet::new(),
            orphans: BTreeMap::new(),
            in_flight: InFlight::default(),
            draining: false,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<DispatcherMsg>,
        s: &mut DispatcherState,
    ) -> Result<(), ActorProcessingErr> {
        s.ctx.routes.set_dispatcher(None);
        for id in s.waiters.keys().copied().collect::<Vec<_>>() {
            s.answer(id, Ok(Vec::new()));
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<DispatcherMsg>,
        msg: DispatcherMsg,
        s: &mut DispatcherState,
    ) -> Result<(), ActorProcessingErr> {
        let now = s.ctx.now_ms();
        for q in s.in_flight.prune(now) {
            s.claim_queue(&myself, &q);
        }
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
                s.waiters.insert(id, Waiter { req, reply: Some(reply), expired: false });
                let expire = DispatcherMsg::Expire(id);
                send_after(&s.ctx.clock, Duration::from_millis(wait), myself.clone(), expire);
                s.claim_queue(&myself, &q);
            }
            DispatcherMsg::Ready { ns, queue } => s.claim_queue(&myself, &(ns, queue)),
            DispatcherMsg::Claimed(q, ids, result) => {
                let again = s.queue_claims.remove(&q).unwrap_or(false);
                for id in &ids {
                    s.claiming.remove(id);
                }
                let mut more = again;
                match result {
                    Ok(per_slot) => {
                        for (id, claimed) in ids.iter().zip(per_slot) {
                            let wanted = s.waiters.get(id).map_or(0, |w| w.req.max);
                            if claimed.is_empty() {
                                if s.waiters.get(id).is_some_and(|w| w.expired) || s.draining {
                                    s.answer(*id, Ok(Vec::new()));
                                }
                                continue;
                            }
                            more |= claimed.len() == wanted; // the queue may hold more
                            s.record_claimed(&claimed);
                            s.deliver(*id, claimed);
                        }
                    }
                    Err(e) => {
                        for id in &ids {
                            s.answer(*id, Err(e.clone()));
                        }
                    }
                }
                let waiting =
                    s.waiters.values().any(|w| w.req.namespace == q.0 && w.req.queue == q.1);
                if waiting && more {
                    s.claim_queue(&myself, &q);
                } else if waiting {
                    s.ensure_watch(&myself, &q); // nothing ready: wait for a hint or the watch
                }
            }
            DispatcherMsg::Expire(id) => {
                if s.claiming.contains(&id) {
                    if let Some(w) = s.waiters.get_mut(&id) {
                        w.expired = true; // answered when its claim returns: nothing is orphaned
                    }
                } else {
                    s.answer(id, Ok(Vec::new()));
                }
            }
            DispatcherMsg::WatchEnded(ns, queue) => {
                let q = (ns, queue);
                s.watching.remove(&q);
                let waiting =
                    s.waiters.values().any(|w| w.req.namespace == q.0 && w.req.queue == q.1);
                if waiting && !s.draining {
                    s.ensure_watch(&myself, &q);
                }
            }
            DispatcherMsg::Released(id) => {
                if let Some(q) = s.in_flight.remove(&id) {
                    s.claim_queue(&myself, &q);
                }
            }
            DispatcherMsg::Extended(id, until) => s.in_flight.extend(&id, until),
            DispatcherMsg::Drain(reply) => {
                s.draining = true;
                let idle: Vec<u64> =
                    s.waiters.keys().filter(|id| !s.claiming.contains(id)).copied().collect();
                for id in idle {
                    s.answer(id, Ok(Vec::new()));
                }
                for w in s.waiters.values_mut() {
                    w.expired = true;
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

    #[test]
    fn in_flight_counts_follow_claims_releases_and_expiry() {
        let mut f = InFlight::default();
        let q = ("ns".to_string(), "q".to_string());
        f.add(&q, "a", 100);
        f.add(&q, "b", 200);
        assert_eq!(f.count(&q), 2);
        f.extend("a", 300);
        assert_eq!(f.prune(250), vec![q.clone()], "b's lease ended");
        assert_eq!(f.count(&q), 1);
        assert_eq!(f.remove("a"), Some(q.clone()));
        assert_eq!(f.count(&q), 0);
        assert_eq!(f.remove("a"), None);
    }
}
