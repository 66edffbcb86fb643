//! ShardOwner: one per shard this node holds a lease on. Loads the shard's upcoming timers
//! into its [`Window`], fires them in batched, epoch-fenced `fire_due` transactions when due
//! (woken by local hints, not only polling), scans the shard at least every poll interval
//! (timers written by other nodes, clamped timers, anything the window dropped), and spawns
//! an [`ExecutionTimer`] for each execution that stays in flight after one of its timers
//! was processed (lease renewed by heartbeats, or waiting out a retry back-off). Executions
//! that complete within their first lease never need one.
//!
//! Before each fire it reserves an *offer* from the node's waiting workers (as many as the
//! window knows are due, per hungry queue): the transaction starts executions for those
//! workers at once, and [`effects::fired`] gives back what it did not use.
//!
//! Transactions run in spawned tasks whose results come back as messages: a handler never
//! waits on the store.

pub mod window;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kairos_layer::keys::TimerKey;
use kairos_layer::ops::Error;
use kairos_layer::ops::fire::{FireOutcome, Offer};
use kairos_layer::ops::hold::NARROW_EXTRA_ROWS;
use kairos_proto::storage::v1::{ExecutionStatus, TimerKind};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

use self::window::{OwnerAction, Window};
use super::context::{Ctx, send_after};
use super::effects;
use super::execution_timer::{ExecutionTimer, TimerArgs};
use super::fire_gate::{self, Pass};
use super::messages::{OwnerMsg, TimerMsg};

/// The shard owner actor.
pub struct ShardOwner;

/// Arguments of a shard owner.
pub struct OwnerArgs {
    /// Node context.
    pub ctx: Ctx,
    /// The shard.
    pub shard: u32,
    /// The lease epoch every write is fenced with.
    pub epoch: u64,
}

/// State of a shard owner.
pub struct OwnerState {
    ctx: Ctx,
    shard: u32,
    epoch: u64,
    window: Window,
    wake_at: Option<i64>,
    timers: BTreeMap<String, ActorRef<TimerMsg>>,
    by_actor: BTreeMap<ractor::ActorId, String>,
    /// Timers per fire transaction now: small after a quiet spell (the first execution of a
    /// burst commits in a small, fast transaction), doubling while more is due, up to
    /// `fire_batch`.
    batch: usize,
    /// Due executions the last fire held back for this node's busy workers (`super::held`).
    held: usize,
}

/// Timers in the first fire transaction after a quiet spell.
const FIRST_FIRE_BATCH: usize = 16;

impl OwnerState {
    fn schedule_wake(&mut self, myself: &ActorRef<OwnerMsg>, at: i64) {
        let now = self.ctx.now_ms();
        if self.wake_at.is_some_and(|w| w <= at && w > now) {
            return; // an earlier wake-up is already on its way
        }
        self.wake_at = Some(at);
        let d = Duration::from_millis(u64::try_from(at - now).unwrap_or(0));
        send_after(&self.ctx.clock, d, myself.clone(), OwnerMsg::Wake);
    }

    fn evaluate(&mut self, myself: &ActorRef<OwnerMsg>) {
        let now = self.ctx.now_ms();
        if let Some(until) = self.window.prefire(now) {
            self.prefire(myself, now, until);
        }
        for action in self.window.decide(now) {
            match action {
                OwnerAction::Fire { expected } => self.fire(myself, now, expected),
                OwnerAction::Load { after, until } => {
                    let (sched, me) = (self.ctx.sched.clone(), myself.clone());
                    let (shard, cap) = (self.shard, self.ctx.config.window_timers_max);
                    tokio::spawn(async move {
                        let r = sched.load_timers(shard, after, until, cap).await;
                        let _ = me.send_message(OwnerMsg::Loaded(r, until));
                    });
                }
                OwnerAction::WakeAt(at) => self.schedule_wake(myself, at),
            }
        }
    }

    /// Fires the shard's due timers with an offer of up to `expected` (at most a batch) of each
    /// hungry queue's waiting workers, reserved now; the effects follow in the task.
    /// Executions the last fire held count as expected.
    fn fire(&mut self, myself: &ActorRef<OwnerMsg>, now: i64, expected: usize) {
        let want = expected.max(self.held).min(self.batch);
        let reserved = self.ctx.matchmaker.offer(want);
        let offer: Offer = reserved.iter().map(|(q, r)| (q.clone(), r.slots.clone())).collect();
        // Every fire but the poll is narrow (`Hold::narrow`): it reads about what it can start;
        // the poll looks at the whole bucket, so nothing waits unseen behind a held backlog for
        // more than a poll interval.
        let hold = self.ctx.held.hold(&self.ctx.matchmaker, !self.window.polling());
        let pass = self.ctx.fire_gate.enter(now, !offer.is_empty());
        let (ctx, me) = (self.ctx.clone(), myself.clone());
        let (shard, epoch, batch) = (self.shard, self.epoch, self.batch);
        let deliveries = self.ctx.fire_gate.wait_for_deliveries(now);
        tokio::spawn(async move {
            if let Some(wait) = deliveries {
                ctx.clock.sleep(wait).await;
            }
            let lead = match pass {
                Pass::Lead(tx) => Some(tx),
                Pass::Follow(rx) => {
                    fire_gate::follow(&ctx.clock, rx).await;
                    None
                }
                Pass::Go => None,
            };
            let began = ctx.sched.clock().now().as_millis();
            let r = ctx.sched.fire_due_holding(shard, epoch, now, batch, &offer, &hold).await;
            if tracing::enabled!(tracing::Level::TRACE) {
                let done = ctx.sched.clock().now().as_millis();
                let (fired, matched, held) =
                    r.as_ref().map_or((0, 0, 0), |o| (o.fired.len(), o.matched.len(), o.held));
                let first_due =
                    r.as_ref().ok().and_then(|o| o.fired.iter().map(|f| f.fire_at_ms).min());
                let offered: usize =
                    offer.values().map(|s| s.iter().map(|s| s.max).sum::<usize>()).sum();
                tracing::trace!(
                    shard,
                    decided = now,
                    began,
                    done,
                    want,
                    offered,
                    fired,
                    matched,
                    held,
                    first_due,
                    narrow = hold.narrow,
                    ok = r.is_ok(),
                    "fire"
                );
            }
            effects::fired(&ctx, shard, &r, reserved);
            if let Some(tx) = lead {
                // Its executions are on their way to the worker: the others go.
                ctx.fire_gate.led(tx);
            }
            let _ = me.send_message(OwnerMsg::Fired(r, now));
        });
    }

    /// Starts, for this node's waiting workers, executions whose timers fall due by `until`
    /// (`ops::prefire`): committed now, handed over at their due time. Nothing to do when no
    /// worker waits.
    fn prefire(&mut self, myself: &ActorRef<OwnerMsg>, now: i64, until: i64) {
        let want = self.window.due_by(until).min(self.ctx.config.fire_batch);
        let reserved = self.ctx.matchmaker.offer_ahead(want);
        if reserved.is_empty() {
            self.window.prefired(&[]);
            return;
        }
        let offer: Offer = reserved.iter().map(|(q, r)| (q.clone(), r.slots.clone())).collect();
        let (ctx, me) = (self.ctx.clone(), myself.clone());
        let (shard, epoch) = (self.shard, self.epoch);
        tokio::spawn(async move {
            let r = ctx.sched.prefire(shard, epoch, now, until, &offer).await;
            if tracing::enabled!(tracing::Level::TRACE) {
                let done = ctx.sched.clock().now().as_millis();
                let started = r.as_ref().map_or(0, |o| o.matched.len());
                tracing::trace!(shard, decided = now, until, done, started, "prefire");
            }
            effects::prefired(&ctx, shard, &r, reserved);
            let _ = me.send_message(OwnerMsg::Prefired(r));
        });
    }

    /// A pre-fire committed (or failed: the fires at the due times do the work): what it
    /// started leaves the window, their lease checks are followed.
    fn prefired(&mut self, r: Result<FireOutcome, Error>) {
        let fired = r.map(|out| out.fired).unwrap_or_default();
        let started: Vec<(i64, String)> =
            fired.iter().map(|f| (f.fire_at_ms, f.execution_id.clone())).collect();
        self.window.prefired(&started);
        for t in fired.into_iter().filter_map(|f| f.next_timer) {
            self.route(t);
        }
    }

    /// Routes a timer: to its execution's timer actor if it has one, else to the window (the
    /// batched `fire_due` processes it when due).
    fn route(&mut self, t: TimerKey) {
        match self.timers.get(&t.execution_id) {
            Some(s) => {
                let _ = s.send_message(TimerMsg::Reschedule(t));
            }
            None => self.window.hint(t.fire_at_ms, t.execution_id),
        }
    }

    /// Follows an execution that stays in flight after one of its timers was processed
    /// (lease renewed, or retry back-off) with an execution timer.
    async fn follow(&mut self, myself: &ActorRef<OwnerMsg>, t: TimerKey) {
        if let Some(s) = self.timers.get(&t.execution_id) {
            let _ = s.send_message(TimerMsg::Reschedule(t));
            return;
        }
        if self.timers.len() >= self.ctx.config.window_timers_max {
            return; // over the bound: the shard scan fires it (later, never lost)
        }
        let id = t.execution_id.clone();
        let args =
            TimerArgs { ctx: self.ctx.clone(), shard: self.shard, epoch: self.epoch, timer: t };
        match Actor::spawn_linked(None, ExecutionTimer, args, myself.get_cell()).await {
            Ok((actor, _)) => {
                self.by_actor.insert(actor.get_id(), id.clone());
                self.timers.insert(id, actor);
                self.ctx.metrics.execution_timers.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(shard = self.shard, error = %e, "cannot start an execution timer")
            }
        }
    }

    /// A fire committed (its effects are done): next timers routed, the batch size and the
    /// window updated.
    async fn fired(&mut self, myself: &ActorRef<OwnerMsg>, out: FireOutcome, at: i64) {
        for f in out.fired {
            let Some(t) = f.next_timer else { continue };
            // An execution that outlived a timer (a renewed lease, a retry back-off) gets an
            // execution timer; a fresh attempt matched at fire time is followed by the window
            // like any claimed one (most complete within their first lease).
            if f.kind == TimerKind::LeaseCheck || f.status == ExecutionStatus::RetryWait {
                self.follow(myself, t).await;
            } else {
                self.route(t);
            }
        }
        let most = self.ctx.config.fire_batch;
        let busy = out.more || out.held > 0;
        self.batch = if busy { (self.batch * 2).min(most) } else { FIRST_FIRE_BATCH.min(most) };
        assert!(self.batch >= 1 && self.batch <= most.max(1), "a fire batch within its bound");
        self.window.fired(at, out.more);
        self.held = out.held;
        if out.held > 0 {
            // Wait for room behind the owners already waiting; if a queue it held still has
            // room worth a fire (its offer was smaller than the room), the next owner may use
            // it now (less waits for the dispatcher's next wake-up).
            self.ctx.held.wait(self.shard);
            let worth = |q: &_| self.ctx.matchmaker.room_for(q) >= NARROW_EXTRA_ROWS;
            if out.held_queues.iter().any(worth) {
                effects::room(&self.ctx);
            }
        }
    }

    /// A fire failed: ownership lost stops the owner (`true`); anything else is retried with
    /// back-off.
    fn fire_failed(&mut self, myself: &ActorRef<OwnerMsg>, e: Error, at: i64) -> bool {
        if let Error::OwnershipLost { shard, epoch, current } = e {
            tracing::warn!(shard, epoch, current, "shard ownership lost: stopping its owner");
            myself.stop(Some("ownership lost".into()));
            return true;
        }
        self.window.fire_failed(at);
        let n = self.window.failures().0;
        // Logged at the 1st, 2nd, 4th, 8th… failure in a row: a failing store shows in the log
        // without flooding it (the node logs the store's state once).
        if n.is_power_of_two() {
            tracing::warn!(shard = self.shard, error = %e, failures = n, "fire_due failed; retrying with back-off");
        }
        false
    }

    fn loaded(&mut self, r: Result<(Vec<TimerKey>, bool), Error>, until: i64) {
        match r {
            Ok((timers, truncated)) => {
                let unfollowed = timers
                    .into_iter()
                    .filter(|t| !self.timers.contains_key(&t.execution_id))
                    .map(|t| (t.fire_at_ms, t.execution_id))
                    .collect();
                self.window.loaded(unfollowed, until, truncated);
            }
            Err(e) => {
                self.window.load_failed(self.ctx.now_ms());
                let n = self.window.failures().1;
                if n.is_power_of_two() {
                    tracing::warn!(shard = self.shard, error = %e, failures = n, "loading timers failed; retrying with back-off");
                }
            }
        }
    }
}

impl Actor for ShardOwner {
    type Msg = OwnerMsg;
    type State = OwnerState;
    type Arguments = OwnerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<OwnerMsg>,
        args: OwnerArgs,
    ) -> Result<OwnerState, ActorProcessingErr> {
        let c = &args.ctx.config;
        let first_batch = FIRST_FIRE_BATCH.min(c.fire_batch);
        let now = args.ctx.now_ms();
        let window =
            Window::new(now, c.window_ms as i64, c.poll_interval_ms as i64, c.window_timers_max)
                .with_prefire(c.prefire_ms as i64);
        args.ctx.routes.set_owner(args.shard, myself.clone());
        args.ctx.metrics.shards_owned.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(shard = args.shard, epoch = args.epoch, "shard owner started");
        let mut state = OwnerState {
            ctx: args.ctx,
            shard: args.shard,
            epoch: args.epoch,
            window,
            wake_at: None,
            timers: BTreeMap::new(),
            by_actor: BTreeMap::new(),
            batch: first_batch,
            held: 0,
        };
        state.evaluate(&myself);
        Ok(state)
    }

    async fn post_stop(
        &self,
        myself: ActorRef<OwnerMsg>,
        state: &mut OwnerState,
    ) -> Result<(), ActorProcessingErr> {
        state.ctx.routes.remove_owner(state.shard, myself.get_id());
        state.ctx.metrics.shards_owned.fetch_sub(1, Ordering::Relaxed);
        tracing::debug!(shard = state.shard, epoch = state.epoch, "shard owner stopped");
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<OwnerMsg>,
        msg: OwnerMsg,
        state: &mut OwnerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            OwnerMsg::Wake => {
                if state.wake_at.is_some_and(|w| w <= state.ctx.now_ms()) {
                    state.wake_at = None;
                }
            }
            OwnerMsg::Hint(t) => state.route(t),
            OwnerMsg::Fired(Ok(out), at) => state.fired(&myself, out, at).await,
            OwnerMsg::Fired(Err(e), at) => {
                if state.fire_failed(&myself, e, at) {
                    return Ok(()); // stopping
                }
            }
            OwnerMsg::Prefired(r) => state.prefired(r),
            OwnerMsg::Loaded(r, until) => state.loaded(r, until),
            OwnerMsg::Room => state.window.poke(),
        }
        state.evaluate(&myself);
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<OwnerMsg>,
        evt: SupervisionEvent,
        state: &mut OwnerState,
    ) -> Result<(), ActorProcessingErr> {
        // An execution timer ended (its execution left flight) or failed: forget it; its
        // durable timer remains and the shard scan covers it.
        let cell = match &evt {
            SupervisionEvent::ActorTerminated(cell, ..)
            | SupervisionEvent::ActorFailed(cell, _) => cell,
            _ => return Ok(()),
        };
        if let SupervisionEvent::ActorFailed(_, e) = &evt {
            tracing::warn!(shard = state.shard, error = %e, "execution timer failed");
        }
        if let Some(id) = state.by_actor.remove(&cell.get_id()) {
            state.timers.remove(&id);
            state.ctx.metrics.execution_timers.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }
}
