//! ShardOwner: one per shard this node holds a lease on. Loads the shard's upcoming timers
//! into its [`Window`], fires them in batched, epoch-fenced `fire_due` transactions when due
//! (woken by local hints, not only polling), scans the shard at least every poll interval
//! (timers written by other nodes, clamped timers, anything the window dropped), and spawns
//! an [`ExecutionSupervisor`] for each execution that stays in flight after one of its timers
//! was processed (lease renewed by heartbeats, or waiting out a retry back-off). Executions
//! that complete within their first lease never need one.
//!
//! Transactions run in spawned tasks whose results come back as messages: a handler never
//! waits on the store.

pub mod window;

use std::collections::BTreeMap;
use std::time::Duration;

use kairos_layer::keys::TimerKey;
use kairos_layer::ops::fire::{FireOutcome, Fired};
use kairos_layer::ops::{self, Error};
use kairos_proto::storage::v1::{ExecutionStatus, TimerKind};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

use crate::runtime::context::{Ctx, send_after};
use crate::runtime::dispatcher::DispatcherMsg;
use crate::runtime::execution_timer::{ExecMsg, ExecutionSupervisor, SupervisorArgs};
use crate::runtime::shard_owner::window::{OwnerAction, Window};

/// Messages of a shard owner.
#[derive(Debug)]
pub enum OwnerMsg {
    /// Time to re-evaluate.
    Wake,
    /// A timer was written on this node.
    Hint(TimerKey),
    /// A `fire_due` finished.
    Fired(Result<FireOutcome, Error>, i64),
    /// A window load finished.
    Loaded(Result<(Vec<TimerKey>, bool), Error>, i64),
}

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
    supervisors: BTreeMap<String, ActorRef<ExecMsg>>,
    by_actor: BTreeMap<ractor::ActorId, String>,
    /// Timers per fire transaction now: small after a quiet spell (the first execution of a
    /// burst commits in a small, fast transaction), doubling while more is due, up to
    /// `fire_batch`.
    batch: usize,
}

/// Timers in the first fire transaction after a quiet spell.
const FIRST_FIRE_BATCH: usize = 16;

/// Records metrics for a processed timer. Shared by owners and supervisors; the callers route
/// what it produced (ready work to the dispatcher, once per queue; next timers to supervisors).
pub(crate) fn after_fired(ctx: &Ctx, f: &Fired, now_ms: i64) {
    let m = &ctx.metrics;
    m.timers_fired.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if f.kind == TimerKind::Due {
        let late = u64::try_from(now_ms - f.execute_at_ms).unwrap_or(0);
        m.lateness_ready.observe(Duration::from_millis(late));
    }
    if f.kind == TimerKind::LeaseCheck && f.status != ExecutionStatus::Running {
        m.lease_expiries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        m.attempt("timed_out");
    }
    if f.status == ExecutionStatus::RetryWait {
        m.retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Tells the dispatcher about every queue that got ready work, once each.
pub(crate) fn hint_ready_queues<'a>(ctx: &Ctx, fired: impl IntoIterator<Item = &'a Fired>) {
    let queues: std::collections::BTreeSet<(&str, &str)> = fired
        .into_iter()
        .filter(|f| f.status == ExecutionStatus::Ready)
        .map(|f| (f.namespace.as_str(), f.queue.as_str()))
        .collect();
    for (ns, queue) in queues {
        ctx.routes.ready_hint(ns, queue);
    }
}

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
        for action in self.window.decide(now) {
            match action {
                OwnerAction::Fire => {
                    let (sched, me) = (self.ctx.sched.clone(), myself.clone());
                    let matcher = self.ctx.matchmaker.clone();
                    let (shard, epoch, batch) = (self.shard, self.epoch, self.batch);
                    tokio::spawn(async move {
                        let r = sched.fire_due(shard, epoch, now, batch, Some(&*matcher)).await;
                        let _ = me.send_message(OwnerMsg::Fired(r, now));
                    });
                }
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

    /// Routes a timer: to its execution's supervisor if it has one, else to the window (the
    /// batched `fire_due` processes it when due).
    fn route(&mut self, t: TimerKey) {
        match self.supervisors.get(&t.execution_id) {
            Some(s) => {
                let _ = s.send_message(ExecMsg::Reschedule(t));
            }
            None => self.window.hint(t.fire_at_ms, t.execution_id),
        }
    }

    /// Follows an execution that stays in flight after one of its timers was processed
    /// (lease renewed, or retry back-off) with an execution supervisor.
    async fn supervise(&mut self, myself: &ActorRef<OwnerMsg>, t: TimerKey) {
        if let Some(s) = self.supervisors.get(&t.execution_id) {
            let _ = s.send_message(ExecMsg::Reschedule(t));
            return;
        }
        if self.supervisors.len() >= self.ctx.config.window_timers_max {
            return; // over the bound: the shard scan fires it (later, never lost)
        }
        let id = t.execution_id.clone();
        let args = SupervisorArgs {
            ctx: self.ctx.clone(),
            shard: self.shard,
            epoch: self.epoch,
            timer: t,
        };
        match Actor::spawn_linked(None, ExecutionSupervisor, args, myself.get_cell()).await {
            Ok((actor, _)) => {
                self.by_actor.insert(actor.get_id(), id.clone());
                self.supervisors.insert(id, actor);
                self.ctx.metrics.supervisors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(shard = self.shard, error = %e, "cannot start an execution supervisor")
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
            Window::new(now, c.window_ms as i64, c.poll_interval_ms as i64, c.window_timers_max);
        args.ctx.routes.set_owner(args.shard, myself.clone());
        args.ctx.metrics.shards_owned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(shard = args.shard, epoch = args.epoch, "shard owner started");
        let mut state = OwnerState {
            ctx: args.ctx,
            shard: args.shard,
            epoch: args.epoch,
            window,
            wake_at: None,
            supervisors: BTreeMap::new(),
            by_actor: BTreeMap::new(),
            batch: first_batch,
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
        state.ctx.metrics.shards_owned.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
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
            OwnerMsg::Fired(Ok(mut out), at) => {
                let now = state.ctx.now_ms();
                let m = &state.ctx.metrics;
                for f in &out.fired {
                    after_fired(&state.ctx, f, now);
                }
                m.quarantined
                    .fetch_add(out.quarantined as u64, std::sync::atomic::Ordering::Relaxed);
                let matched: Vec<_> =
                    out.fired.iter_mut().filter_map(|f| f.matched.take()).collect();
                if !matched.is_empty() || !out.orphaned.is_empty() {
                    m.matched_at_fire
                        .fetch_add(matched.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    match state.ctx.routes.dispatcher() {
                        Some(d) => {
                            if !matched.is_empty() {
                                let _ = d.send_message(DispatcherMsg::Matched(matched));
                            }
                            if !out.orphaned.is_empty() {
                                let _ = d.send_message(DispatcherMsg::Orphans(std::mem::take(
                                    &mut out.orphaned,
                                )));
                            }
                        }
                        // No dispatcher (draining): the leases run out and the retry policy
                        // applies.
                        None => tracing::warn!(
                            shard = state.shard,
                            "matched executions with no dispatcher to deliver them"
                        ),
                    }
                }
                hint_ready_queues(&state.ctx, &out.fired);
                for f in out.fired {
                    let Some(t) = f.next_timer else { continue };
                    // An execution that outlived a timer (a renewed lease, a retry back-off)
                    // gets a supervisor; a fresh attempt matched at fire time is followed by
                    // the window like any claimed one (most complete within their first lease).
                    if f.kind == TimerKind::LeaseCheck || f.status == ExecutionStatus::RetryWait {
                        state.supervise(&myself, t).await;
                    } else {
                        state.route(t);
                    }
                }
                state.batch = if out.more {
                    (state.batch * 2).min(state.ctx.config.fire_batch)
                } else {
                    FIRST_FIRE_BATCH.min(state.ctx.config.fire_batch)
                };
                state.window.fired(at, out.more);
            }
            OwnerMsg::Fired(Err(Error::OwnershipLost { shard, epoch, current }), _) => {
                tracing::warn!(shard, epoch, current, "shard ownership lost: stopping its owner");
                myself.stop(Some("ownership lost".into()));
                return Ok(());
            }
            OwnerMsg::Fired(Err(e), at) => {
                state.window.fire_failed(at);
                let n = state.window.failures().0;
                // Logged at the 1st, 2nd, 4th, 8th… failure in a row: a failing store shows in
                // the log without flooding it (the node logs the store's state once).
                if n.is_power_of_two() {
                    tracing::warn!(shard = state.shard, error = %e, failures = n, "fire_due failed; retrying with back-off");
                }
            }
            OwnerMsg::Loaded(Ok((timers, truncated)), until) => {
                let unsupervised = timers
                    .into_iter()
                    .filter(|t| !state.supervisors.contains_key(&t.execution_id))
                    .map(|t| (t.fire_at_ms, t.execution_id))
                    .collect();
                state.window.loaded(unsupervised, until, truncated);
            }
            OwnerMsg::Loaded(Err(e), _) => {
                state.window.load_failed(state.ctx.now_ms());
                let n = state.window.failures().1;
                if n.is_power_of_two() {
                    tracing::warn!(shard = state.shard, error = %e, failures = n, "loading timers failed; retrying with back-off");
                }
            }
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
        // An execution supervisor ended (its execution left flight) or failed: forget it; its
        // durable timer remains and the shard scan covers it.
        let cell = match &evt {
            SupervisionEvent::ActorTerminated(cell, ..)
            | SupervisionEvent::ActorFailed(cell, _) => cell,
            _ => return Ok(()),
        };
        if let SupervisionEvent::ActorFailed(_, e) = &evt {
            tracing::warn!(shard = state.shard, error = %e, "execution supervisor failed");
        }
        if let Some(id) = state.by_actor.remove(&cell.get_id()) {
            state.supervisors.remove(&id);
            state.ctx.metrics.supervisors.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Whether an error means the shard is no longer ours.
pub(crate) fn is_ownership_lost(e: &ops::Error) -> bool {
    matches!(e, ops::Error::OwnershipLost { .. })
}
