//! ExecutionTimer: one per in-flight execution of a shard this node owns that outlived a timer
//! — RUNNING past its first lease check (heartbeats renewed it), or RETRY_WAIT after a failed
//! or timed-out attempt. It holds that execution's next deadline in memory and, exactly when
//! it passes, runs the fenced `fire_timer` transaction:
//! a lease that expired times the attempt out and applies the retry policy (capped
//! exponential back-off, full jitter — decided in the transaction), a renewed lease moves the
//! deadline, a retry due makes the execution READY. It is a cache of the durable timer: if the
//! node dies, the shard's next owner recreates it from the timer index; if it is slow or
//! absent, the owner's shard scan processes the same timer (whichever commits first wins, the
//! other finds the timer gone).

use std::time::Duration;

use kairos_layer::keys::TimerKey;
use kairos_layer::ops::Error;
use kairos_layer::ops::fire::Fired;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::context::{Ctx, send_after};
use super::effects;
use super::messages::TimerMsg;
use crate::server::log_limit::LogLimit;

/// The execution timer actor.
pub struct ExecutionTimer;

/// Arguments of an execution timer.
pub struct TimerArgs {
    /// Node context.
    pub ctx: Ctx,
    /// The execution's shard.
    pub shard: u32,
    /// The owner's lease epoch.
    pub epoch: u64,
    /// The execution's current timer.
    pub timer: TimerKey,
}

/// What the timer does next (its pure core).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Sleep until this time.
    SleepUntil(i64),
    /// Run the timer now.
    Fire,
    /// The execution left flight: stop.
    Stop,
}

/// Decides after a wake-up at `now`.
pub fn on_wake(timer: &TimerKey, firing: bool, now: i64) -> Option<Next> {
    if firing {
        None
    } else if now >= timer.fire_at_ms {
        Some(Next::Fire)
    } else {
        Some(Next::SleepUntil(timer.fire_at_ms))
    }
}

/// Decides after `fire_timer` returned `fired` for `timer`.
pub fn on_fired(timer: &TimerKey, fired: Option<&Fired>) -> (Option<TimerKey>, Next) {
    match fired.and_then(|f| f.next_timer.clone()) {
        Some(next) if next.execution_id == timer.execution_id => {
            let at = next.fire_at_ms;
            (Some(next), Next::SleepUntil(at))
        }
        _ => (None, Next::Stop),
    }
}

/// State of an execution timer.
pub struct TimerState {
    ctx: Ctx,
    shard: u32,
    epoch: u64,
    timer: TimerKey,
    firing: bool,
}

impl TimerState {
    fn act(&mut self, myself: &ActorRef<TimerMsg>, next: Next) {
        match next {
            Next::SleepUntil(at) => {
                let d = Duration::from_millis(u64::try_from(at - self.ctx.now_ms()).unwrap_or(0));
                send_after(&self.ctx.clock, d, myself.clone(), TimerMsg::Wake);
            }
            Next::Fire => {
                self.firing = true;
                let (sched, me, timer) =
                    (self.ctx.sched.clone(), myself.clone(), self.timer.clone());
                let (shard, epoch, now) = (self.shard, self.epoch, self.ctx.now_ms());
                tokio::spawn(async move {
                    let r = sched.fire_timer(shard, epoch, &timer, now).await;
                    let _ = me.send_message(TimerMsg::Fired(Box::new(r)));
                });
            }
            Next::Stop => myself.stop(None),
        }
    }
}

impl Actor for ExecutionTimer {
    type Msg = TimerMsg;
    type State = TimerState;
    type Arguments = TimerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<TimerMsg>,
        args: TimerArgs,
    ) -> Result<TimerState, ActorProcessingErr> {
        let mut s = TimerState {
            ctx: args.ctx,
            shard: args.shard,
            epoch: args.epoch,
            timer: args.timer,
            firing: false,
        };
        let at = s.timer.fire_at_ms;
        s.act(&myself, Next::SleepUntil(at));
        Ok(s)
    }

    async fn handle(
        &self,
        myself: ActorRef<TimerMsg>,
        msg: TimerMsg,
        s: &mut TimerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            TimerMsg::Wake => {
                // Several wake-ups may be pending (each timer change plans one for its own
                // deadline); act only once the current deadline passed.
                if on_wake(&s.timer, s.firing, s.ctx.now_ms()) == Some(Next::Fire) {
                    s.act(&myself, Next::Fire);
                }
            }
            TimerMsg::Reschedule(t) => {
                assert_eq!(t.execution_id, s.timer.execution_id, "a timer follows one execution");
                if t != s.timer {
                    let at = t.fire_at_ms;
                    s.timer = t;
                    if !s.firing {
                        s.act(&myself, Next::SleepUntil(at));
                    }
                }
            }
            TimerMsg::Fired(r) => match *r {
                Ok(fired) => {
                    s.firing = false;
                    if let Some(f) = &fired {
                        effects::timer_fired(&s.ctx, f);
                    }
                    let (next_timer, next) = on_fired(&s.timer, fired.as_ref());
                    if let Some(t) = next_timer {
                        s.timer = t;
                    }
                    s.act(&myself, next);
                }
                Err(e) => {
                    s.firing = false;
                    if matches!(e, Error::OwnershipLost { .. }) {
                        myself.stop(Some("ownership lost".into()));
                    } else {
                        static LIMIT: LogLimit = LogLimit::new(1_000);
                        if let Some(suppressed) = LIMIT.allow(s.ctx.now_ms()) {
                            tracing::warn!(execution_id = %s.timer.execution_id, error = %e, suppressed, "timer failed; retrying in 1 s");
                        }
                        let at = s.ctx.now_ms() + 1_000;
                        s.act(&myself, Next::SleepUntil(at));
                    }
                }
            },
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kairos_proto::storage::v1::{ExecutionStatus, TimerKind};

    fn timer(at: i64, kind: TimerKind) -> TimerKey {
        TimerKey {
            bucket: 0,
            shard: 1,
            fire_at_ms: at,
            execution_id: "e".into(),
            kind: kind as i32,
        }
    }

    fn fired(next: Option<TimerKey>, status: ExecutionStatus) -> Fired {
        Fired {
            namespace: "ns".into(),
            execution_id: "e".into(),
            kind: TimerKind::LeaseCheck,
            fire_at_ms: 0,
            execute_at_ms: 0,
            status,
            queue: "q".into(),
            next_timer: next,
            timed_out: false,
        }
    }

    #[test]
    fn fires_only_once_the_deadline_passed() {
        let t = timer(100, TimerKind::LeaseCheck);
        assert_eq!(on_wake(&t, false, 99), Some(Next::SleepUntil(100)));
        assert_eq!(on_wake(&t, false, 100), Some(Next::Fire));
        assert_eq!(on_wake(&t, true, 100), None, "never two fires at once");
    }

    #[test]
    fn follows_the_execution_until_it_leaves_flight() {
        let t = timer(100, TimerKind::LeaseCheck);
        let renewed = timer(200, TimerKind::LeaseCheck);
        let (n, next) = on_fired(&t, Some(&fired(Some(renewed.clone()), ExecutionStatus::Running)));
        assert_eq!((n, next), (Some(renewed), Next::SleepUntil(200)));
        let retry = timer(150, TimerKind::Retry);
        let (_, next) = on_fired(&t, Some(&fired(Some(retry), ExecutionStatus::RetryWait)));
        assert_eq!(next, Next::SleepUntil(150), "lease expired: wait for the retry");
        assert_eq!(on_fired(&t, Some(&fired(None, ExecutionStatus::Ready))).1, Next::Stop);
        assert_eq!(on_fired(&t, None).1, Next::Stop, "timer gone: processed elsewhere");
    }
}
