//! ShardLeaseManager: heartbeats this node's record and acquires, renews and releases shard
//! leases so that live nodes converge to an even share. It starts a [`ShardOwner`] per shard
//! it holds and stops it at once when the lease is lost. A restarted node takes back the
//! leases recorded under its (stable) id without waiting for them to expire; the epoch rises,
//! fencing off anything its previous incarnation still had in flight.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kairos_layer::ops::Error;
use kairos_proto::storage::v1::{Node, ShardLease};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::context::{Ctx, send_after};
use crate::shard_owner::{OwnerArgs, OwnerMsg, ShardOwner};

/// What one round of lease management does (the pure core).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeasePlan {
    /// Shards to renew (all held).
    pub renew: Vec<u32>,
    /// Shards to try to acquire, best first.
    pub acquire: Vec<u32>,
    /// Shards to give up (more than our share).
    pub release: Vec<u32>,
}

/// Plans a round: hold `ceil(shards / live nodes)` shards, reclaim our own records first,
/// then free or expired ones (starting at a node-specific offset so nodes do not all race for
/// the same shards), and give up the excess.
pub fn plan_leases(
    node_id: &str,
    now: i64,
    node_ttl_ms: i64,
    nodes: &[Node],
    leases: &[ShardLease],
    held: &BTreeSet<u32>,
    shard_count: u32,
) -> LeasePlan {
    let alive = nodes
        .iter()
        .filter(|n| n.node_id != node_id && n.heartbeat_at_ms >= now - node_ttl_ms)
        .count()
        + 1;
    let target = (shard_count as usize).div_ceil(alive);
    let by_shard: BTreeMap<u32, &ShardLease> = leases.iter().map(|l| (l.shard, l)).collect();
    let mut plan = LeasePlan { renew: held.iter().copied().collect(), ..LeasePlan::default() };
    if held.len() > target {
        plan.release = held.iter().rev().take(held.len() - target).copied().collect();
        return plan;
    }
    let want = target - held.len();
    let ours =
        |s: &u32| by_shard.get(s).is_some_and(|l| l.owner == node_id && l.expires_at_ms > now);
    let free = |s: &u32| by_shard.get(s).is_none_or(|l| l.expires_at_ms <= now);
    let offset = (kairos_layer::ids::fnv1a64(node_id.as_bytes()) % u64::from(shard_count)) as u32;
    let order: Vec<u32> = (0..shard_count)
        .map(|i| (i + offset) % shard_count)
        .filter(|s| !held.contains(s))
        .collect();
    plan.acquire = order
        .iter()
        .filter(|s| ours(s))
        .chain(order.iter().filter(|s| free(s) && !ours(s)))
        .take(want)
        .copied()
        .collect();
    plan
}

/// What a round did.
#[derive(Debug, Default)]
pub struct RoundOutcome {
    /// Shards acquired: (shard, epoch, lease expiry).
    pub acquired: Vec<(u32, u64, i64)>,
    /// Shards renewed: (shard, lease expiry).
    pub renewed: Vec<(u32, i64)>,
    /// Shards whose lease was lost.
    pub lost: Vec<u32>,
    /// Shards given up.
    pub released: Vec<u32>,
}

/// Messages of the lease manager.
#[derive(Debug)]
pub enum LeaseMsg {
    /// Run a round.
    Tick,
    /// A round finished.
    Round(Result<RoundOutcome, Error>),
    /// Stop every owner and release every lease.
    Drain(RpcReplyPort<()>),
}

/// The lease manager actor.
pub struct ShardLeaseManager;

/// State of the lease manager.
pub struct LeaseState {
    ctx: Ctx,
    held: BTreeMap<u32, (u64, ActorRef<OwnerMsg>)>,
    /// Until when each held lease is known to be ours.
    valid_until: BTreeMap<u32, i64>,
    busy: bool,
    draining: bool,
    started_at_ms: i64,
}

impl LeaseState {
    fn period(&self) -> Duration {
        Duration::from_millis(self.ctx.config.shard_lease_ms / 3)
    }

    fn round(&mut self, myself: &ActorRef<LeaseMsg>) {
        if self.busy || self.draining {
            return;
        }
        self.busy = true;
        let ctx = self.ctx.clone();
        let held: BTreeMap<u32, u64> = self.held.iter().map(|(s, (e, _))| (*s, *e)).collect();
        let me = myself.clone();
        let started_at_ms = self.started_at_ms;
        tokio::spawn(async move {
            let r = run_round(&ctx, &held, started_at_ms).await;
            let _ = me.send_message(LeaseMsg::Round(r));
        });
    }
}

async fn run_round(
    ctx: &Ctx,
    held: &BTreeMap<u32, u64>,
    started_at_ms: i64,
) -> Result<RoundOutcome, Error> {
    let c = &ctx.config;
    let sched = &ctx.sched;
    let me = Node {
        node_id: ctx.node_id.clone(),
        address: c.listen_http.to_string(),
        region: c.region.clone(),
        heartbeat_at_ms: 0,
        capacity: 0,
        started_at_ms,
    };
    sched.heartbeat_node(me).await?;
    let nodes = sched.nodes().await?;
    let leases = sched.shard_leases().await?;
    let held_set: BTreeSet<u32> = held.keys().copied().collect();
    let plan = plan_leases(
        &ctx.node_id,
        ctx.now_ms(),
        c.node_ttl_ms as i64,
        &nodes,
        &leases,
        &held_set,
        sched.config().shard_count,
    );
    let duration = c.shard_lease_ms as i64;
    let mut out = RoundOutcome::default();
    for shard in &plan.renew {
        match sched.renew_shard(*shard, &ctx.node_id, held[shard], duration).await {
            Ok(l) => out.renewed.push((*shard, l.expires_at_ms)),
            Err(e @ Error::OwnershipLost { .. }) => {
                tracing::warn!(shard, error = %e, "shard lease lost");
                out.lost.push(*shard);
            }
            // Not renewed this round; the owner stops if the lease runs out meanwhile.
            Err(e) => tracing::warn!(shard, error = %e, "shard lease not renewed"),
        }
    }
    for shard in plan.acquire {
        match sched.acquire_shard(shard, &ctx.node_id, duration).await {
            Ok(l) => out.acquired.push((shard, l.epoch, l.expires_at_ms)),
            Err(Error::LeaseHeld { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    for shard in &plan.release {
        sched.release_shard(*shard, &ctx.node_id, held[shard]).await?;
    }
    out.released = plan.release;
    Ok(out)
}

impl Actor for ShardLeaseManager {
    type Msg = LeaseMsg;
    type State = LeaseState;
    type Arguments = Ctx;

    async fn pre_start(
        &self,
        myself: ActorRef<LeaseMsg>,
        ctx: Ctx,
    ) -> Result<LeaseState, ActorProcessingErr> {
        let started_at_ms = ctx.now_ms();
        let mut s = LeaseState {
            ctx,
            held: BTreeMap::new(),
            valid_until: BTreeMap::new(),
            busy: false,
            draining: false,
            started_at_ms,
        };
        s.round(&myself);
        Ok(s)
    }

    async fn handle(
        &self,
        myself: ActorRef<LeaseMsg>,
        msg: LeaseMsg,
        s: &mut LeaseState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            LeaseMsg::Tick => {
                // A lease that ran out without a renewal may already be someone else's: stop
                // its owner now rather than wait to be fenced out.
                let now = s.ctx.now_ms();
                let lapsed: Vec<u32> = s
                    .valid_until
                    .iter()
                    .filter(|(_, until)| **until <= now)
                    .map(|(s, _)| *s)
                    .collect();
                for shard in lapsed {
                    s.valid_until.remove(&shard);
                    if let Some((_, owner)) = s.held.remove(&shard) {
                        tracing::warn!(shard, "shard lease ran out unrenewed: stopping its owner");
                        owner.stop(Some("lease expired".into()));
                    }
                }
                s.round(&myself)
            }
            LeaseMsg::Round(r) => {
                s.busy = false;
                match r {
                    Ok(RoundOutcome { acquired, renewed, lost, released }) => {
                        for (shard, until) in renewed {
                            s.valid_until.insert(shard, until);
                        }
                        if !acquired.is_empty() || !lost.is_empty() || !released.is_empty() {
                            tracing::info!(
                                acquired = acquired.len(),
                                lost = lost.len(),
                                released = released.len(),
                                "shard leases changed"
                            );
                        }
                        for shard in lost.iter().chain(&released) {
                            s.valid_until.remove(shard);
                            if let Some((_, owner)) = s.held.remove(shard) {
                                owner.stop(Some("lease lost or released".into()));
                            }
                        }
                        for (shard, epoch, until) in acquired {
                            if s.draining {
                                break;
                            }
                            s.valid_until.insert(shard, until);
                            let args = OwnerArgs { ctx: s.ctx.clone(), shard, epoch };
                            match Actor::spawn_linked(None, ShardOwner, args, myself.get_cell())
                                .await
                            {
                                Ok((owner, _)) => {
                                    s.held.insert(shard, (epoch, owner));
                                }
                                Err(e) => {
                                    tracing::warn!(shard, error = %e, "cannot start a shard owner")
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "lease round failed; retrying"),
                }
                if !s.draining {
                    send_after(&s.ctx.clock, s.period(), myself.clone(), LeaseMsg::Tick);
                }
            }
            LeaseMsg::Drain(reply) => {
                s.draining = true;
                s.valid_until.clear();
                let held = std::mem::take(&mut s.held);
                for (shard, (epoch, owner)) in held {
                    let _ = owner
                        .stop_and_wait(Some("draining".into()), Some(Duration::from_secs(5)))
                        .await;
                    if let Err(e) = s.ctx.sched.release_shard(shard, &s.ctx.node_id, epoch).await {
                        tracing::warn!(shard, error = %e, "could not release the lease; it will expire");
                    }
                }
                if let Err(e) = s.ctx.sched.remove_node(&s.ctx.node_id).await {
                    tracing::warn!(error = %e, "could not remove the node record; it will go stale");
                }
                let _ = reply.send(());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<LeaseMsg>,
        evt: SupervisionEvent,
        s: &mut LeaseState,
    ) -> Result<(), ActorProcessingErr> {
        // An owner that stopped (ownership lost) or failed is forgotten; the next round takes
        // the shard again if it is still ours to take (with a new epoch).
        if let SupervisionEvent::ActorTerminated(cell, ..)
        | SupervisionEvent::ActorFailed(cell, _) = &evt
        {
            if let SupervisionEvent::ActorFailed(_, e) = &evt {
                tracing::warn!(error = %e, "shard owner failed");
                s.ctx.metrics.actor_restarts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            s.held.retain(|_, (_, owner)| owner.get_id() != cell.get_id());
            let held = &s.held;
            s.valid_until.retain(|shard, _| held.contains_key(shard));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, hb: i64) -> Node {
        Node { node_id: id.into(), heartbeat_at_ms: hb, ..Node::default() }
    }

    fn lease(shard: u32, owner: &str, expires: i64) -> ShardLease {
        ShardLease { shard, owner: owner.into(), epoch: 1, expires_at_ms: expires }
    }

    #[test]
    fn a_lone_node_takes_every_shard() {
        let p = plan_leases("a", 1_000, 30_000, &[node("a", 1_000)], &[], &BTreeSet::new(), 8);
        assert_eq!(p.acquire.len(), 8);
        assert!(p.release.is_empty());
    }

    #[test]
    fn two_live_nodes_split_and_dead_ones_do_not_count() {
        let nodes = [node("a", 1_000), node("b", 1_000), node("dead", -100_000)];
        let leases: Vec<ShardLease> = (0..4).map(|s| lease(s, "b", 5_000)).collect();
        let p = plan_leases("a", 1_000, 30_000, &nodes, &leases, &BTreeSet::new(), 8);
        assert_eq!(p.acquire.len(), 4, "half of 8");
        assert!(p.acquire.iter().all(|s| *s >= 4), "only free shards: {:?}", p.acquire);
        // Holding more than the share: give up the excess.
        let held: BTreeSet<u32> = (0..8).collect();
        let p = plan_leases("a", 1_000, 30_000, &nodes, &[], &held, 8);
        assert_eq!(p.release.len(), 4);
        assert_eq!(p.renew.len(), 8);
    }

    #[test]
    fn a_restarted_node_reclaims_its_own_leases_first() {
        let nodes = [node("a", 1_000), node("b", 1_000)];
        let leases = vec![lease(6, "a", 9_000), lease(7, "a", 9_000), lease(0, "b", 9_000)];
        let p = plan_leases("a", 1_000, 30_000, &nodes, &leases, &BTreeSet::new(), 8);
        assert_eq!(
            &p.acquire[..2].iter().copied().collect::<BTreeSet<_>>(),
            &BTreeSet::from([6, 7])
        );
        assert!(!p.acquire.contains(&0), "b's live lease is left alone");
        // Expired leases of others are free.
        let p = plan_leases("a", 10_000, 30_000, &nodes, &leases, &BTreeSet::new(), 8);
        assert!(p.acquire.contains(&0) || p.acquire.len() == 4);
    }
}
