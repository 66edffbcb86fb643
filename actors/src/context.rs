//! What every actor of a node shares: the scheduler operations, the injected clock, metrics,
//! configuration, and the node-local routes between actors (an explicit table owned by the
//! node — no global named-actor registry, which would break multi-node tests and simulation).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_layer::env::SharedClock;
use kairos_layer::keys::TimerKey;
use kairos_layer::ops::Scheduler;
use ractor::{ActorRef, Message};

use crate::config::NodeConfig;
use crate::dispatcher::DispatcherMsg;
use crate::metrics::Metrics;
use crate::shard_owner::OwnerMsg;

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
}

impl Ctx {
    /// Milliseconds since the epoch, by the injected clock.
    pub fn now_ms(&self) -> i64 {
        self.clock.now().as_millis()
    }
}

/// Node-local routing: which actor owns which shard, and the dispatcher.
#[derive(Default)]
pub struct Routes {
    owners: Mutex<BTreeMap<u32, ActorRef<OwnerMsg>>>,
    dispatcher: Mutex<Option<ActorRef<DispatcherMsg>>>,
}

impl Routes {
    pub(crate) fn set_owner(&self, shard: u32, owner: Option<ActorRef<OwnerMsg>>) {
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        match owner {
            Some(o) => {
                owners.insert(shard, o);
            }
            None => {
                owners.remove(&shard);
            }
        }
    }

    pub(crate) fn set_dispatcher(&self, d: Option<ActorRef<DispatcherMsg>>) {
        *self.dispatcher.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    /// Tells the local owner of the timer's shard (if any) about a new timer: wake-up, not
    /// only polling.
    pub fn timer_hint(&self, timer: TimerKey) {
        let owner =
            self.owners.lock().unwrap_or_else(|e| e.into_inner()).get(&timer.shard).cloned();
        if let Some(o) = owner {
            let _ = o.send_message(OwnerMsg::Hint(timer));
        }
    }

    /// Tells the local dispatcher that a queue has new ready work.
    pub fn ready_hint(&self, ns: &str, queue: &str) {
        let d = self.dispatcher.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(d) = d {
            let _ = d.send_message(DispatcherMsg::Ready {
                ns: ns.to_string(),
                queue: queue.to_string(),
            });
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
