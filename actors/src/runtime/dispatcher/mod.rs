//! Dispatcher: hands work to the workers waiting on this node — worker streams (`Work`, with
//! credits) and one-shot long polls (`Poll`). Every waiting worker is a slot in the node's
//! [`Matchmaker`] ledger with as many credits as tasks it can take. Work reaches them three
//! ways:
//!
//! - **matched at fire time**: a shard owner reserves an offer of waiting workers before its
//!   fire transaction, which starts the executions it fires for them; the dispatcher only
//!   delivers them ([`DispatcherMsg::Matched`]);
//! - **claimed from the ready queues**: when workers hold credits and a queue may have READY
//!   work (a local hint, a watch on the queue's ready signals, or simply not known yet), one
//!   claim per queue per node takes work for all of them, each with its own lease;
//! - **from the dispatch buffer** (queues served by worker streams): claimed a little ahead of
//!   demand, unassigned ([`buffer`]).
//!
//! Claimed work whose worker vanished before delivery (an *orphan*) goes to another waiting
//! worker of the queue if at least half its lease is left, else it is released (READY again at
//! once, the attempt not counted).
//!
//! Every decision is the pure core's ([`state::Core::apply`], decided in [`core`]); this actor is the shell that
//! holds the reply ports and task senders and performs the actions: transactions in spawned
//! tasks whose results come back as messages, replies, timers.

pub mod buffer;
pub mod core;
pub mod polls;
pub mod state;
pub mod streams;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

use kairos_layer::ops::claim::{ClaimSlot, Claimed};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use self::state::{Action, BUFFER_AGE_CHECK, Core, Event, Timer, Waiting};
use super::context::{Ctx, send_after};
use super::effects;
use super::messages::{DispatcherMsg, Grant, PollReply, QueueKey, TaskSender};

/// How long a failed ready-signal watch waits before it is set again.
const WATCH_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// The dispatcher actor.
pub struct Dispatcher;

/// State of the dispatcher: its core, and the handles of the workers it serves.
pub struct DispatcherState {
    ctx: Ctx,
    core: Core,
    replies: BTreeMap<u64, RpcReplyPort<PollReply>>,
    streams: BTreeMap<u64, TaskSender>,
}

impl DispatcherState {
    /// Applies `event` and performs what it leads to, feeding back what could not be delivered.
    fn run(&mut self, myself: &ActorRef<DispatcherMsg>, event: Event) {
        let mut events = vec![event];
        while let Some(event) = events.pop() {
            let actions = self.core.apply(&self.ctx.matchmaker, self.ctx.now_ms(), event);
            for action in actions {
                if let Some(back) = self.perform(myself, action) {
                    events.push(back);
                }
            }
        }
    }

    /// Performs one action; returns what must come back as an event now.
    fn perform(&mut self, myself: &ActorRef<DispatcherMsg>, action: Action) -> Option<Event> {
        match action {
            Action::Answer(id, claimed) => return self.answer(id, claimed),
            Action::Send(id, claimed) => return self.send(id, claimed),
            Action::EndStream(id) => drop(self.streams.remove(&id)),
            Action::Claim(q, grants, slots) => self.claim(myself, q, grants, slots),
            Action::Refill(q, slots) => self.refill(myself, q, slots),
            Action::Watch(q) => self.watch(myself, q),
            Action::Release(claimed) => effects::release(&self.ctx, claimed),
            Action::Room => effects::room(&self.ctx),
            Action::Later(after, timer) => {
                let msg = match timer {
                    Timer::Expire(id) => DispatcherMsg::Expire(id),
                    Timer::Flush(id) => DispatcherMsg::Flush(id),
                    Timer::AgeBuffers => DispatcherMsg::AgeBuffers,
                    Timer::Retry(q) => DispatcherMsg::Ready(q),
                    Timer::Reclaim(q) => DispatcherMsg::Reclaim(q),
                };
                send_after(&self.ctx.clock, after, myself.clone(), msg);
            }
            Action::ClaimFailed(q, failures, error) => {
                if failures.is_power_of_two() {
                    tracing::warn!(namespace = %q.0, queue = %q.1, %error, failures, "claim failed; retrying with back-off");
                }
            }
            Action::Misrouted(id, q, n) => tracing::error!(
                slot = id,
                namespace = %q.0,
                queue = %q.1,
                other = n,
                "work of another queue was about to go to this worker: kept back"
            ),
        }
        None
    }

    fn answer(&mut self, id: u64, claimed: Vec<Claimed>) -> Option<Event> {
        let Some(reply) = self.replies.remove(&id) else {
            return (!claimed.is_empty()).then_some(Event::Undelivered(id, claimed));
        };
        let n = claimed.len();
        let delivered = (n > 0).then(|| claimed.clone());
        match reply.send(Ok(claimed)) {
            Ok(()) => {
                if let Some(d) = delivered {
                    effects::delivered(&self.ctx, &d);
                }
                None
            }
            Err(ractor::MessagingErr::SendErr(Ok(back))) if !back.is_empty() => {
                Some(Event::Undelivered(id, back))
            }
            Err(_) => None,
        }
    }

    fn send(&mut self, id: u64, claimed: Vec<Claimed>) -> Option<Event> {
        let Some(tasks) = self.streams.get(&id) else {
            return Some(Event::Undelivered(id, claimed));
        };
        let delivered = claimed.clone();
        match tasks.send(claimed) {
            Ok(()) => {
                effects::delivered(&self.ctx, &delivered);
                None
            }
            Err(tokio::sync::mpsc::error::SendError(back)) => Some(Event::Undelivered(id, back)),
        }
    }

    fn claim(
        &self,
        myself: &ActorRef<DispatcherMsg>,
        q: QueueKey,
        grants: Vec<Grant>,
        slots: Vec<ClaimSlot>,
    ) {
        let (sched, me) = (self.ctx.sched.clone(), myself.clone());
        tokio::spawn(async move {
            let r = sched.claim(&q.0, &q.1, &slots).await;
            let _ = me.send_message(DispatcherMsg::Claimed(q, grants, r));
        });
    }

    fn refill(&self, myself: &ActorRef<DispatcherMsg>, q: QueueKey, slots: Vec<ClaimSlot>) {
        let (sched, me) = (self.ctx.sched.clone(), myself.clone());
        tokio::spawn(async move {
            let r = sched.claim(&q.0, &q.1, &slots).await;
            let _ = me.send_message(DispatcherMsg::Buffered(q, r));
        });
    }

    /// Watches the queue's ready signals (every partition), so work made ready on other nodes
    /// wakes us; the watch ends at the latest after the longest poll wait.
    fn watch(&self, myself: &ActorRef<DispatcherMsg>, q: QueueKey) {
        let (sched, me, clock) = (self.ctx.sched.clone(), myself.clone(), self.ctx.clock.clone());
        let cap = clock.sleep(Duration::from_millis(self.ctx.config.poll_wait_max_ms));
        tokio::spawn(async move {
            let watch = async {
                // Set where the queue is read empty: work made ready since the last claim is
                // claimed at once, not left until a later signal (a lost wake-up). The
                // transaction is gone before waiting: a live one would pin its read snapshot
                // and the resolver's history for as long as the watch waits.
                match sched.watch_ready(&q.0, &q.1).await? {
                    None => Ok::<(), kairos_layer::ops::Error>(()),
                    Some(watches) => futures_util::future::select_all(watches)
                        .await
                        .0
                        .map_err(kairos_layer::ops::Error::from),
                }
            };
            let failed = tokio::select! {
                r = watch => {
                    if r.is_ok() {
                        let _ = me.send_message(DispatcherMsg::Ready(q.clone()));
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

    /// The core's event for a message, registering a new poll's reply port or stream's sender.
    fn event_of(&mut self, msg: DispatcherMsg) -> Option<Event> {
        Some(match msg {
            DispatcherMsg::Poll(p, reply) => {
                let id = self.core.new_id();
                self.replies.insert(id, reply);
                let queue = (p.namespace, p.queue);
                let w = Waiting {
                    id,
                    queue,
                    worker_id: p.worker_id,
                    lease_ms: p.lease_ms,
                    credits: p.max,
                };
                Event::Poll(w, p.wait_ms)
            }
            DispatcherMsg::Open(s, reply) => {
                let id = self.core.new_id();
                let _ = reply.send(id);
                self.streams.insert(id, s.tasks);
                let queue = (s.namespace, s.queue);
                let w = Waiting {
                    id,
                    queue,
                    worker_id: s.worker_id,
                    lease_ms: s.lease_ms,
                    credits: s.credits,
                };
                Event::Open(w)
            }
            DispatcherMsg::Credits(id, n) => Event::Credits(id, n),
            DispatcherMsg::Close(id) => Event::Close(id),
            DispatcherMsg::Ready(q) => Event::Ready(q),
            DispatcherMsg::Reclaim(q) => Event::Reclaim(q),
            DispatcherMsg::Matched(items) => Event::Matched(items),
            DispatcherMsg::Orphans(claimed) => Event::Orphans(claimed),
            DispatcherMsg::Claimed(q, grants, r) => Event::Claimed(q, grants, r),
            DispatcherMsg::Buffered(q, r) => Event::Buffered(q, r),
            DispatcherMsg::Expire(id) => Event::Expire(id),
            DispatcherMsg::Flush(id) => Event::Flush(id),
            DispatcherMsg::WatchEnded(q) => Event::WatchEnded(q),
            DispatcherMsg::Finished(q, n) => Event::Finished(q, n),
            DispatcherMsg::AgeBuffers => Event::AgeBuffers,
            DispatcherMsg::Drain(_) => return None,
        })
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
        ctx.routes.set_dispatcher(Some(myself.clone()));
        send_after(&ctx.clock, BUFFER_AGE_CHECK, myself, DispatcherMsg::AgeBuffers);
        let core = Core::new(ctx.config.poll_wait_max_ms)
            .with_partitions(ctx.sched.config().ready_partitions);
        Ok(DispatcherState { ctx, core, replies: BTreeMap::new(), streams: BTreeMap::new() })
    }

    async fn post_stop(
        &self,
        myself: ActorRef<DispatcherMsg>,
        s: &mut DispatcherState,
    ) -> Result<(), ActorProcessingErr> {
        s.ctx.routes.remove_dispatcher(myself.get_id());
        // Stopping: what cannot be delivered now waits for its lease.
        for action in s.core.stop(&s.ctx.matchmaker) {
            let _ = s.perform(&myself, action);
        }
        s.streams.clear();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<DispatcherMsg>,
        msg: DispatcherMsg,
        s: &mut DispatcherState,
    ) -> Result<(), ActorProcessingErr> {
        if let DispatcherMsg::Drain(reply) = msg {
            s.run(&myself, Event::Drain);
            let _ = reply.send(());
            return Ok(());
        }
        if let Some(event) = s.event_of(msg) {
            s.run(&myself, event);
        }
        Ok(())
    }
}
