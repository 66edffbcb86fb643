//! NodeSupervisor: the root of a node's actor tree. Starts the shard lease manager and the
//! dispatcher, restarts a failed child with capped exponential back-off (overriding ractor's
//! default of stopping with it), and drains on shutdown: stop claiming, let in-flight
//! transactions finish, stop shard owners and release their leases.

use std::time::Duration;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SupervisionEvent};

use kairos_layer::ops::retry::doubling_ms;

use super::context::{Ctx, send_after};
use super::dispatcher::Dispatcher;
use super::lease_manager::LeaseManager;
use super::messages::{Child, DispatcherMsg, LeaseMsg, SupervisorMsg};

/// The node supervisor actor.
pub struct NodeSupervisor;

/// State of the node supervisor.
pub struct NodeState {
    ctx: Ctx,
    leases: Option<ActorRef<LeaseMsg>>,
    dispatcher: Option<ActorRef<DispatcherMsg>>,
    restarts: u32,
    draining: bool,
}

/// Back-off before the `n`-th restart: 100 ms doubling, at most 10 s.
pub fn restart_backoff(n: u32) -> Duration {
    Duration::from_millis(doubling_ms(100, n, 10_000))
}

const CALL_TIMEOUT: Duration = Duration::from_secs(30);

impl NodeState {
    fn child_of(&self, cell: &ActorCell) -> Option<Child> {
        if self.leases.as_ref().is_some_and(|a| a.get_id() == cell.get_id()) {
            Some(Child::Leases)
        } else if self.dispatcher.as_ref().is_some_and(|a| a.get_id() == cell.get_id()) {
            Some(Child::Dispatcher)
        } else {
            None
        }
    }
}

impl Actor for NodeSupervisor {
    type Msg = SupervisorMsg;
    type State = NodeState;
    type Arguments = Ctx;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        ctx: Ctx,
    ) -> Result<NodeState, ActorProcessingErr> {
        let mut s = NodeState { ctx, leases: None, dispatcher: None, restarts: 0, draining: false };
        let (d, _) =
            Actor::spawn_linked(None, Dispatcher, s.ctx.clone(), myself.get_cell()).await?;
        s.dispatcher = Some(d);
        let (l, _) =
            Actor::spawn_linked(None, LeaseManager, s.ctx.clone(), myself.get_cell()).await?;
        s.leases = Some(l);
        Ok(s)
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        s: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Start(child) if !s.draining => {
                let cell = myself.get_cell();
                match child {
                    Child::Leases => {
                        let (a, _) =
                            Actor::spawn_linked(None, LeaseManager, s.ctx.clone(), cell).await?;
                        s.leases = Some(a);
                    }
                    Child::Dispatcher => {
                        let (a, _) =
                            Actor::spawn_linked(None, Dispatcher, s.ctx.clone(), cell).await?;
                        s.dispatcher = Some(a);
                    }
                }
                tracing::info!(?child, "restarted");
            }
            SupervisorMsg::Start(_) => {}
            SupervisorMsg::Drain(reply) => {
                s.draining = true;
                if let Some(d) = &s.dispatcher {
                    let _ = d.call(DispatcherMsg::Drain, Some(CALL_TIMEOUT)).await;
                }
                if let Some(l) = &s.leases {
                    let _ = l.call(LeaseMsg::Drain, Some(CALL_TIMEOUT)).await;
                }
                let _ = reply.send(());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        evt: SupervisionEvent,
        s: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, reason) = match &evt {
            SupervisionEvent::ActorFailed(cell, e) => (cell, e.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, r) => (cell, r.clone().unwrap_or_default()),
            _ => return Ok(()),
        };
        let Some(child) = s.child_of(cell) else { return Ok(()) };
        match child {
            Child::Leases => s.leases = None,
            Child::Dispatcher => s.dispatcher = None,
        }
        if s.draining {
            return Ok(());
        }
        let delay = restart_backoff(s.restarts);
        s.restarts += 1;
        s.ctx.metrics.actor_restarts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(?child, %reason, ?delay, "child stopped; restarting");
        send_after(&s.ctx.clock, delay, myself, SupervisorMsg::Start(child));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(restart_backoff(0), Duration::from_millis(100));
        assert_eq!(restart_backoff(3), Duration::from_millis(800));
        assert_eq!(restart_backoff(50), Duration::from_secs(10));
    }
}
