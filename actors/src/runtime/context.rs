//! What every actor of a node shares: the scheduler operations, the injected clock, metrics,
//! configuration, the credit ledger of waiting workers, the result batcher, the cron service's
//! executions client, and the node-local routes between actors (an explicit table owned by the
//! node — no global named-actor registry, which would break multi-node tests and simulation).
//! Knows the actors only by their message types ([`super::messages`]); the hints it routes
//! are sent from one place, [`super::effects`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_layer::env::SharedClock;
use kairos_layer::keys::TimerKey;
use kairos_layer::ops::Scheduler;
use ractor::{ActorId, ActorRef, Message};

use super::batcher::Batcher;
use super::cron_api::SdkExecutions;
use super::fire_gate::FireGate;
use super::held::Held;
use super::matchmaker::Matchmaker;
use super::messages::{CronMsg, DispatcherMsg, OwnerMsg};
use crate::server::config::NodeConfig;
use crate::server::metrics::{CronMetrics, Metrics};

/// Shared by the actors of one node.
#[derive(Clone)]
pub struct Ctx {
    /// The scheduler operations.
    pub sched: Scheduler,
    /// The injected clock.
    pub clock: SharedClock,
    /// Node metrics.
    pub metrics: Arc<Metrics>,
    /// Configuration.
    pub config: Arc<NodeConfig>,
    /// This node's id.
    pub node_id: String,
    /// Routes between this node's actors.
    pub routes: Arc<Routes>,
    /// Waiting workers' credits (fire transactions match executions to them).
    pub matchmaker: Arc<Matchmaker>,
    /// Shard owners holding due executions for this node's busy workers.
    pub held: Arc<Held>,
    /// The first fire of a burst runs alone.
    pub fire_gate: Arc<FireGate>,
    /// Results and heartbeats, batched into few transactions.
    pub batcher: Batcher,
    /// The executions API as the cron service reaches it (the SDK client, in process).
    pub cron_api: SdkExecutions,
    /// Metrics of the cron service.
    pub cron_metrics: Arc<CronMetrics>,
}

impl Ctx {
    /// Milliseconds since the epoch, by the injected clock.
    pub fn now_ms(&self) -> i64 {
        self.clock.now().as_millis()
    }
}

/// Node-local routing: which actor owns which shard (and cron shard), and the dispatcher.
#[derive(Default)]
pub struct Routes {
    owners: Mutex<BTreeMap<u32, ActorRef<OwnerMsg>>>,
    dispatcher: Mutex<Option<ActorRef<DispatcherMsg>>>,
    cron_owners: Mutex<BTreeMap<u32, ActorRef<CronMsg>>>,
}

impl Routes {
    pub(crate) fn set_owner(&self, shard: u32, owner: ActorRef<OwnerMsg>) {
        self.owners.lock().unwrap_or_else(|e| e.into_inner()).insert(shard, owner);
    }

    /// Removes the route of `shard` if it still leads to `owner` (a stopping owner must not
    /// erase the route of the owner that replaced it).
    pub(crate) fn remove_owner(&self, shard: u32, owner: ActorId) {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        if owners.get(&shard).is_some_and(|o| o.get_id() == owner) {
            owners.remove(&shard);
        }
    }

    pub(crate) fn set_dispatcher(&self, d: Option<ActorRef<DispatcherMsg>>) {
        *self.dispatcher.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    /// Removes the dispatcher route if it still leads to `d`.
    pub(crate) fn remove_dispatcher(&self, d: ActorId) {
        let mut cur = self.dispatcher.lock().unwrap_or_else(|e| e.into_inner());
        if cur.as_ref().is_some_and(|c| c.get_id() == d) {
            *cur = None;
        }
    }

    /// Tells the local owner of the timer's shard (if any) about a new timer: wake-up, not
    /// only polling.
    pub(super) fn timer_hint(&self, timer: TimerKey) {
        let owner =
            self.owners.lock().unwrap_or_else(|e| e.into_inner()).get(&timer.shard).cloned();
        if let Some(o) = owner {
            let _ = o.send_message(OwnerMsg::Hint(timer));
        }
    }

    /// Tells the local owner of `shard` (if any) that its held executions may have room now;
    /// `false` when no owner of it is here.
    pub(super) fn room(&self, shard: u32) -> bool {
        let owner = self.owners.lock().unwrap_or_else(|e| e.into_inner()).get(&shard).cloned();
        owner.is_some_and(|o| o.send_message(OwnerMsg::Room).is_ok())
    }

    /// Tells the local dispatcher that a queue has new ready work.
    pub(super) fn ready_hint(&self, ns: &str, queue: &str) {
        if let Some(d) = self.dispatcher() {
            let _ = d.send_message(DispatcherMsg::Ready((ns.to_string(), queue.to_string())));
        }
    }

    /// The local dispatcher.
    pub fn dispatcher(&self) -> Option<ActorRef<DispatcherMsg>> {
        self.dispatcher.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Shards with a local owner.
    pub fn owned_shards(&self) -> Vec<u32> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect()
    }

    pub(crate) fn set_cron_owner(&self, shard: u32, owner: ActorRef<CronMsg>) {
        self.cron_owners.lock().unwrap_or_else(|e| e.into_inner()).insert(shard, owner);
    }

    /// Removes the route of cron shard `shard` if it still leads to `owner`.
    pub(crate) fn remove_cron_owner(&self, shard: u32, owner: ActorId) {
        let mut owners = self.cron_owners.lock().unwrap_or_else(|e| e.into_inner());
        if owners.get(&shard).is_some_and(|o| o.get_id() == owner) {
            owners.remove(&shard);
        }
    }

    /// Tells the local owner of a cron shard (if any) to look at a job now: a client changed it.
    pub(super) fn cron_hint(&self, shard: u32, namespace: &str, cron_job_id: &str) {
        let owner = self.cron_owners.lock().unwrap_or_else(|e| e.into_inner()).get(&shard).cloned();
        if let Some(o) = owner {
            let _ = o.send_message(CronMsg::Hint {
                namespace: namespace.to_string(),
                cron_job_id: cron_job_id.to_string(),
            });
        }
    }

    /// Cron shards with a local owner.
    pub fn owned_cron_shards(&self) -> Vec<u32> {
        self.cron_owners.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect()
    }
}

/// Sends `msg` to `actor` after `d` of the injected clock (ractor's own timers use the
/// runtime clock; this keeps every wait on the injected one).
pub fn send_after<M: Message>(clock: &SharedClock, d: Duration, actor: ActorRef<M>, msg: M) {
    let sleep = clock.sleep(d);
    tokio::spawn(async move {
        sleep.await;
        let _ = actor.send_message(msg);
    });
}
