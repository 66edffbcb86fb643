//! The partition lease manager: heartbeats this node's record and acquires, renews and
//! releases the leases of every partitioned space (execution shards; cron shards use the same
//! mechanism) so that live nodes converge to an even share — of the primary region's nodes,
//! when one is configured and any of them is alive. It starts the actor that works each
//! partition it holds and stops it at once when the lease is lost, released or runs out
//! unrenewed. A restarted node takes back the leases recorded under its (stable) id without
//! waiting for them to expire; the epoch rises, fencing off anything its previous incarnation
//! still had in flight. Every round is at most three transactions (renew all, acquire all,
//! release all), each keeping what succeeded.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use kairos_layer::keys::Space;
use kairos_layer::ops::Error;
use kairos_layer::ops::leases::PartitionLease;
use kairos_proto::storage::v1::NodeRecord;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SupervisionEvent};

use super::context::{Ctx, send_after};
use super::cron_owner::{CronOwnerArgs, CronShardOwner};
use super::effects;
use super::messages::{LeaseMsg, PartitionId, RoundOutcome};
use super::shard_owner::{OwnerArgs, ShardOwner};
use crate::limits::{DEAD_NODE_CLAIMS_MS, ORPHAN_RELEASE_AFTER_MS};

/// What one round of lease management does (the pure core).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeasePlan {
    /// Partitions to renew (all held).
    pub renew: Vec<PartitionId>,
    /// Partitions to try to acquire, best first.
    pub acquire: Vec<PartitionId>,
    /// Partitions to give up (more than our share, or another region's nodes are preferred).
    pub release: Vec<PartitionId>,
}

/// What the planner knows of the cluster.
#[derive(Debug, Clone)]
pub struct View<'a> {
    /// This node's id.
    pub node_id: &'a str,
    /// This node's region.
    pub region: &'a str,
    /// The preferred region (empty: none).
    pub primary_region: &'a str,
    /// Now, by this node's clock.
    pub now: i64,
    /// A node is alive if it heartbeated within this.
    pub node_ttl_ms: i64,
    /// The clock-skew bound: a lease is free only this long after it expired.
    pub skew_ms: i64,
    /// Node records.
    pub nodes: &'a [NodeRecord],
    /// Leases on record.
    pub leases: &'a [PartitionLease],
}

/// Plans a round for each `(space, partition count)`: hold `ceil(partitions / eligible
/// nodes)` of each space, where the eligible nodes are the live nodes of the primary region
/// if any is alive, else every live node. Reclaim our own records first, then free or expired
/// ones (starting at a node-specific offset so nodes do not all race for the same
/// partitions), and give up the excess — everything, for a node outside the primary region
/// while a primary node lives.
pub fn plan_leases(
    v: &View<'_>,
    held: &BTreeSet<PartitionId>,
    spaces: &[(Space, u32)],
) -> LeasePlan {
    let live: Vec<&NodeRecord> = v
        .nodes
        .iter()
        .filter(|n| n.node_id != v.node_id && n.heartbeat_at_ms >= v.now - v.node_ttl_ms)
        .collect();
    let in_primary = |region: &str| v.primary_region.is_empty() || region == v.primary_region;
    let primary_alive = !v.primary_region.is_empty()
        && (v.region == v.primary_region || live.iter().any(|n| n.region == v.primary_region));
    let eligible = |region: &str| !primary_alive || in_primary(region);
    let me_eligible = eligible(v.region);
    let peers = live.iter().filter(|n| eligible(&n.region)).count();
    let by_part: BTreeMap<PartitionId, &PartitionLease> =
        v.leases.iter().map(|l| ((l.space, l.partition), l)).collect();
    let mut plan = LeasePlan { renew: held.iter().copied().collect(), ..LeasePlan::default() };
    let offset = kairos_layer::ids::fnv1a64(v.node_id.as_bytes());
    for &(space, count) in spaces {
        let mine: Vec<PartitionId> = held.iter().filter(|(s, _)| *s == space).copied().collect();
        let target = if me_eligible { (count as usize).div_ceil(peers + 1) } else { 0 };
        if mine.len() > target {
            plan.release.extend(mine.iter().rev().take(mine.len() - target));
            continue;
        }
        let want = target - mine.len();
        let ours = |p: &PartitionId| {
            by_part.get(p).is_some_and(|l| l.owner == v.node_id && l.expires_at_ms > v.now)
        };
        let free = |p: &PartitionId| {
            by_part.get(p).is_none_or(|l| l.expires_at_ms.saturating_add(v.skew_ms) <= v.now)
        };
        let start = (offset % u64::from(count.max(1))) as u32;
        let order: Vec<PartitionId> = (0..count)
            .map(|i| (space, (i + start) % count))
            .filter(|p| !held.contains(p))
            .collect();
        plan.acquire.extend(
            order
                .iter()
                .filter(|p| ours(p))
                .chain(order.iter().filter(|p| free(p) && !ours(p)))
                .take(want)
                .copied(),
        );
    }
    plan
}

/// The lease manager actor.
pub struct LeaseManager;

/// State of the lease manager.
pub struct LeaseState {
    ctx: Ctx,
    spaces: Vec<Space>,
    held: BTreeMap<PartitionId, (u64, ActorCell)>,
    /// Until when each held lease is known to be ours.
    valid_until: BTreeMap<PartitionId, i64>,
    busy: bool,
    /// When the round under way (if `busy`) started.
    round_started_ms: i64,
    /// Why the last round failed (`None`: it went through).
    last_round_error: Option<String>,
    draining: bool,
    started_at_ms: i64,
    /// Dead nodes (id, start of their run) whose unconfirmed claims this node released.
    dead_handled: BTreeSet<(String, i64)>,
}

/// Why leases ran out unrenewed, as the operator reads it in the one line that says so.
pub fn lapse_cause(busy_for_ms: Option<i64>, last_error: Option<&str>) -> String {
    match (busy_for_ms, last_error) {
        (Some(ms), _) => format!(
            "the renewal round started {ms} ms ago has not finished: the store is slow or unreachable"
        ),
        (None, Some(e)) => format!("the last renewal round failed: {e}"),
        (None, None) => "no renewal round ran in time: the process was paused or starved of CPU, \
                         or its clock jumped"
            .to_string(),
    }
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
        self.round_started_ms = self.ctx.now_ms();
        let ctx = self.ctx.clone();
        let held: BTreeMap<PartitionId, u64> =
            self.held.iter().map(|(p, (e, _))| (*p, *e)).collect();
        let me = myself.clone();
        let started_at_ms = self.started_at_ms;
        let spaces = self.spaces.clone();
        tokio::spawn(async move {
            let r = run_round(&ctx, &spaces, &held, started_at_ms).await;
            let _ = me.send_message(LeaseMsg::Round(r));
        });
    }

    /// A lease that ran out without a renewal may already be someone else's: its worker stops
    /// now rather than wait to be fenced out.
    fn stop_lapsed(&mut self) {
        let now = self.ctx.now_ms();
        let lapsed: Vec<PartitionId> =
            self.valid_until.iter().filter(|(_, until)| **until <= now).map(|(p, _)| *p).collect();
        let mut stopped: BTreeMap<&'static str, usize> = BTreeMap::new();
        for p in lapsed {
            self.valid_until.remove(&p);
            if let Some((_, worker)) = self.held.remove(&p) {
                *stopped.entry(p.0.name()).or_default() += 1;
                worker.stop(Some("lease expired".into()));
            }
        }
        if !stopped.is_empty() {
            // One line for all of them, with the cause (not one per partition).
            let busy_for = self.busy.then(|| now - self.round_started_ms);
            let cause = lapse_cause(busy_for, self.last_round_error.as_deref());
            let n: usize = stopped.values().sum();
            tracing::warn!(
                leases = n,
                by_space = ?stopped,
                cause = %cause,
                "{n} leases ran out unrenewed; their workers stopped (taken again once a round goes through)"
            );
        }
    }

    /// A round finished: renewed leases extended, lost and released ones' workers stopped,
    /// acquired ones' workers started.
    async fn round_done(&mut self, myself: &ActorRef<LeaseMsg>, o: RoundOutcome) {
        if !self.draining {
            self.release_dead_claims(o.dead_nodes.clone());
        }
        for (p, until) in o.renewed {
            self.valid_until.insert(p, until);
        }
        if !o.acquired.is_empty() || !o.lost.is_empty() || !o.released.is_empty() {
            tracing::info!(
                acquired = o.acquired.len(),
                lost = o.lost.len(),
                released = o.released.len(),
                "leases changed"
            );
        }
        for p in o.lost.iter().chain(&o.released) {
            self.valid_until.remove(p);
            if let Some((_, worker)) = self.held.remove(p) {
                worker.stop(Some("lease lost or released".into()));
            }
        }
        for (p, epoch, until) in o.acquired {
            if self.draining {
                break;
            }
            debug_assert!(!self.held.contains_key(&p), "acquired only what is not held");
            assert!(epoch > 0, "an acquired lease has an epoch");
            match self.start_worker(myself, p, epoch).await {
                Ok(worker) => {
                    self.valid_until.insert(p, until);
                    self.held.insert(p, (epoch, worker));
                }
                Err(e) => {
                    tracing::warn!(space = p.0.name(), partition = p.1, error = %e, "cannot start a partition worker")
                }
            }
        }
    }

    /// Releases the unconfirmed claims of nodes newly found dead (once per node run): their
    /// dispatch buffers, tasks they sent to workers never heard from — READY again at once, not
    /// a lease later. Every live node does it; the transactions keep it to one release each.
    fn release_dead_claims(&mut self, dead: Vec<(String, i64)>) {
        for node in &dead {
            if !self.dead_handled.insert(node.clone()) {
                continue;
            }
            let (ctx, id) = (self.ctx.clone(), node.0.clone());
            let silent_ms = dead_after_ms(self.ctx.config.node_ttl_ms as i64);
            tokio::spawn(async move {
                match ctx.sched.release_dead_node_claims(&id, silent_ms).await {
                    Ok(released) if released.is_empty() => {}
                    Ok(released) => {
                        tracing::info!(
                            node = %id,
                            released = released.len(),
                            "released the attempts a dead node claimed and never handed over"
                        );
                        effects::orphans_released(&ctx, &released);
                    }
                    Err(e) => tracing::warn!(
                        node = %id,
                        error = %e,
                        "releasing a dead node's unconfirmed claims failed; their lease checks will"
                    ),
                }
            });
        }
        // Nodes dead for longer than their receipts are kept drop out of the list, and here.
        self.dead_handled.retain(|n| dead.contains(n));
    }

    /// Stops every partition worker and releases every lease, so other nodes take over at once.
    async fn drain(&mut self) {
        self.draining = true;
        self.valid_until.clear();
        let held = std::mem::take(&mut self.held);
        let mut release = Vec::new();
        for ((space, partition), (epoch, worker)) in held {
            let _ =
                worker.stop_and_wait(Some("draining".into()), Some(Duration::from_secs(5))).await;
            release.push((space, partition, epoch));
        }
        if let Err(e) = self.ctx.sched.release_partitions(&release, &self.ctx.node_id).await {
            tracing::warn!(error = %e, "could not release the leases; they will expire");
        }
        if let Err(e) = self.ctx.sched.remove_node(&self.ctx.node_id).await {
            tracing::warn!(error = %e, "could not remove the node record; it will go stale");
        }
    }

    /// Starts the actor that works `p` under `epoch`.
    async fn start_worker(
        &self,
        myself: &ActorRef<LeaseMsg>,
        p: PartitionId,
        epoch: u64,
    ) -> Result<ActorCell, ractor::SpawnErr> {
        match p.0 {
            Space::Executions => {
                let args = OwnerArgs { ctx: self.ctx.clone(), shard: p.1, epoch };
                let (a, _) = Actor::spawn_linked(None, ShardOwner, args, myself.get_cell()).await?;
                Ok(a.get_cell())
            }
            Space::Cron => {
                let args = CronOwnerArgs { ctx: self.ctx.clone(), shard: p.1, epoch };
                let (a, _) =
                    Actor::spawn_linked(None, CronShardOwner, args, myself.get_cell()).await?;
                Ok(a.get_cell())
            }
        }
    }
}

/// This node's record as it heartbeats it.
fn node_record(ctx: &Ctx, started_at_ms: i64) -> NodeRecord {
    let c = &ctx.config;
    NodeRecord {
        node_id: ctx.node_id.clone(),
        address: c.listen_http.to_string(),
        grpc_address: c.listen_grpc.to_string(),
        region: c.region.clone(),
        heartbeat_at_ms: 0,
        capacity: 0,
        started_at_ms,
        version: crate::VERSION.to_string(),
        database: c.database_label(),
        last_commit_us: ctx.metrics.last_commit_us.load(Ordering::Relaxed) as i64,
    }
}

/// One round: renew every held lease (in the same commit batch as the heartbeat, so a busy
/// store delays renewals by one commit, not two), then read the nodes and leases, plan, acquire
/// and release.
async fn run_round(
    ctx: &Ctx,
    spaces: &[Space],
    held: &BTreeMap<PartitionId, u64>,
    started_at_ms: i64,
) -> Result<RoundOutcome, Error> {
    let c = &ctx.config;
    let sched = &ctx.sched;
    let mut out = RoundOutcome::default();
    let (heartbeat, renewed) = tokio::join!(
        sched.heartbeat_node(node_record(ctx, started_at_ms)),
        renew(ctx, held, &mut out)
    );
    heartbeat?;
    renewed?; // a failed renewal round keeps nothing; the owners stop if their leases run out
    // The time before the reads: a read that stalls (a network cut, a paused process) then
    // makes the others look fresher, never silent — a node must not take a live one for dead
    // and release its claims (`release_dead_claims` checks that again in the store).
    let now = ctx.now_ms();
    let nodes = sched.nodes().await?;
    let mut leases = Vec::new();
    for space in spaces {
        leases.extend(sched.partition_leases(*space).await?);
    }
    warn_of_skew(ctx, &nodes, ctx.now_ms());
    let ttl = c.node_ttl_ms as i64;
    let others = nodes.iter().any(|n| n.node_id != ctx.node_id && now - n.heartbeat_at_ms <= ttl);
    ctx.held.set_alone(!others);
    out.dead_nodes = recently_dead(&ctx.node_id, &nodes, now, c.node_ttl_ms as i64);
    let view = View {
        node_id: &ctx.node_id,
        region: &c.region,
        primary_region: &c.primary_region,
        now,
        node_ttl_ms: c.node_ttl_ms as i64,
        skew_ms: c.max_clock_skew_ms as i64,
        nodes: &nodes,
        leases: &leases,
    };
    let counts: Vec<(Space, u32)> =
        spaces.iter().map(|s| (*s, sched.partition_count(*s))).collect();
    let still: BTreeMap<PartitionId, u64> =
        held.iter().filter(|(p, _)| !out.lost.contains(p)).map(|(p, e)| (*p, *e)).collect();
    let plan = plan_leases(&view, &still.keys().copied().collect(), &counts);
    acquire(ctx, &plan, &mut out).await;
    release(ctx, plan, &still, &mut out).await;
    Ok(out)
}

/// Other nodes without a heartbeat for `ttl_ms` plus [`ORPHAN_RELEASE_AFTER_MS`] (the time a
/// restarted node gives its workers: here, for the dead node's workers to reach another node
/// and beat for what they run), and for less than [`DEAD_NODE_CLAIMS_MS`] more: (node id,
/// start of their run).
pub fn recently_dead(me: &str, nodes: &[NodeRecord], now: i64, ttl_ms: i64) -> Vec<(String, i64)> {
    let dead_after = dead_after_ms(ttl_ms);
    nodes
        .iter()
        .filter(|n| n.node_id != me)
        .filter(|n| {
            let silent = now - n.heartbeat_at_ms;
            silent > dead_after && silent <= dead_after + DEAD_NODE_CLAIMS_MS
        })
        .map(|n| (n.node_id.clone(), n.started_at_ms))
        .collect()
}

/// How long a node is silent before it is dead to the others: `ttl_ms` plus
/// [`ORPHAN_RELEASE_AFTER_MS`].
fn dead_after_ms(ttl_ms: i64) -> i64 {
    ttl_ms + ORPHAN_RELEASE_AFTER_MS as i64
}

/// A heartbeat cannot come from the future: one further ahead than the bound means the clocks
/// differ by more than the design assumes.
fn warn_of_skew(ctx: &Ctx, nodes: &[NodeRecord], now: i64) {
    let skew = ctx.config.max_clock_skew_ms as i64;
    for n in nodes.iter().filter(|n| n.node_id != ctx.node_id) {
        if n.heartbeat_at_ms > now + skew {
            ctx.metrics.clock_skew_suspected.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                node = %n.node_id,
                ahead_ms = n.heartbeat_at_ms - now,
                max_clock_skew_ms = skew,
                "another node's clock runs ahead of this one by more than max_clock_skew_ms: \
                 leases may be taken over early; fix the clocks (NTP)"
            );
        }
    }
}

/// Renews every held lease into `out` (renewed with their expiry, or lost).
async fn renew(
    ctx: &Ctx,
    held: &BTreeMap<PartitionId, u64>,
    out: &mut RoundOutcome,
) -> Result<(), Error> {
    if held.is_empty() {
        return Ok(());
    }
    let list: Vec<(Space, u32, u64)> = held.iter().map(|(p, e)| (p.0, p.1, *e)).collect();
    let duration = ctx.config.shard_lease_ms as i64;
    let results = ctx.sched.renew_partitions(&list, &ctx.node_id, duration).await?;
    for (r, p) in results.into_iter().zip(held.keys()) {
        match r {
            Ok(l) => {
                debug_assert_eq!(l.epoch, held[p], "a renewal keeps the epoch it was held at");
                out.renewed.push((*p, l.expires_at_ms));
            }
            Err(e) => {
                tracing::warn!(space = p.0.name(), partition = p.1, error = %e, "lease lost");
                out.lost.push(*p);
            }
        }
    }
    Ok(())
}

/// Acquires what the plan wants; what was renewed stays renewed if this fails (tried again
/// next round).
async fn acquire(ctx: &Ctx, plan: &LeasePlan, out: &mut RoundOutcome) {
    if plan.acquire.is_empty() {
        return;
    }
    let (duration, skew) = (ctx.config.shard_lease_ms as i64, ctx.config.max_clock_skew_ms as i64);
    match ctx.sched.acquire_partitions(&plan.acquire, &ctx.node_id, duration, skew).await {
        Ok(results) => {
            for (r, p) in results.into_iter().zip(&plan.acquire) {
                if let Ok(l) = r {
                    out.acquired.push((*p, l.epoch, l.expires_at_ms));
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "acquiring leases failed; retrying next round"),
    }
}

/// Gives up what the plan releases (tried again next round if this fails).
async fn release(
    ctx: &Ctx,
    plan: LeasePlan,
    held: &BTreeMap<PartitionId, u64>,
    out: &mut RoundOutcome,
) {
    if plan.release.is_empty() {
        return;
    }
    let release: Vec<(Space, u32, u64)> =
        plan.release.iter().map(|p| (p.0, p.1, held[p])).collect();
    match ctx.sched.release_partitions(&release, &ctx.node_id).await {
        Ok(()) => out.released = plan.release,
        Err(e) => tracing::warn!(error = %e, "releasing leases failed; retrying next round"),
    }
}

impl Actor for LeaseManager {
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
            spaces: vec![Space::Executions, Space::Cron],
            held: BTreeMap::new(),
            valid_until: BTreeMap::new(),
            busy: false,
            round_started_ms: started_at_ms,
            last_round_error: None,
            draining: false,
            started_at_ms,
            dead_handled: BTreeSet::new(),
        };
        s.round(&myself);
        // Ticks come every period whether or not a round finished: a round stuck on an
        // unreachable store must not keep a lapsed lease's worker running.
        send_after(&s.ctx.clock, s.period(), myself.clone(), LeaseMsg::Tick);
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
                s.stop_lapsed();
                s.round(&myself);
                if !s.draining {
                    send_after(&s.ctx.clock, s.period(), myself.clone(), LeaseMsg::Tick);
                }
            }
            LeaseMsg::Round(r) => {
                s.busy = false;
                match r {
                    Ok(outcome) => {
                        s.last_round_error = None;
                        s.round_done(&myself, outcome).await
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "lease round failed; retrying");
                        s.last_round_error = Some(e.to_string());
                    }
                }
            }
            LeaseMsg::Drain(reply) => {
                s.drain().await;
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
        // A partition worker that stopped (ownership lost) or failed is forgotten; the next
        // round takes the partition again if it is still ours to take (with a new epoch).
        if let SupervisionEvent::ActorTerminated(cell, ..)
        | SupervisionEvent::ActorFailed(cell, _) = &evt
        {
            if let SupervisionEvent::ActorFailed(_, e) = &evt {
                tracing::warn!(error = %e, "partition worker failed");
                s.ctx.metrics.actor_restarts.fetch_add(1, Ordering::Relaxed);
            }
            s.held.retain(|_, (_, worker)| worker.get_id() != cell.get_id());
            let held = &s.held;
            s.valid_until.retain(|p, _| held.contains_key(p));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: Space = Space::Executions;

    #[test]
    fn a_lapse_names_its_cause() {
        assert!(lapse_cause(Some(12_000), Some("x")).contains("started 12000 ms ago"));
        assert!(lapse_cause(None, Some("store unavailable")).contains("failed: store unavailable"));
        assert!(lapse_cause(None, None).contains("paused"));
    }

    fn node(id: &str, region: &str, hb: i64) -> NodeRecord {
        NodeRecord {
            node_id: id.into(),
            region: region.into(),
            heartbeat_at_ms: hb,
            ..NodeRecord::default()
        }
    }

    fn lease(p: u32, owner: &str, expires: i64) -> PartitionLease {
        PartitionLease {
            space: E,
            partition: p,
            owner: owner.into(),
            epoch: 1,
            expires_at_ms: expires,
        }
    }

    fn view<'a>(
        me: &'a str,
        region: &'a str,
        nodes: &'a [NodeRecord],
        leases: &'a [PartitionLease],
    ) -> View<'a> {
        View {
            node_id: me,
            region,
            primary_region: "",
            now: 1_000,
            node_ttl_ms: 30_000,
            skew_ms: 0,
            nodes,
            leases,
        }
    }

    #[test]
    fn dead_nodes_are_named_until_their_receipts_are_gone() {
        let ttl = 10_000;
        let now = 1_000_000;
        let after = ttl + ORPHAN_RELEASE_AFTER_MS as i64;
        let nodes = [
            node("me", "r", now - 50_000), // silent, but never counted: this node
            node("alive", "r", now - ttl - 1), // dead, but its workers may still be reconnecting
            node("dead", "r", now - after - 1),
            node("older", "r", now - after - DEAD_NODE_CLAIMS_MS), // as long as receipts last
            node("gone", "r", now - after - DEAD_NODE_CLAIMS_MS - 1), // its receipts are gone
        ];
        let dead: Vec<String> =
            recently_dead("me", &nodes, now, ttl).into_iter().map(|(id, _)| id).collect();
        assert_eq!(dead, ["dead", "older"]);
    }

    #[test]
    fn a_lone_node_takes_every_partition_of_every_space() {
        let nodes = [node("a", "r", 1_000)];
        let v = view("a", "r", &nodes, &[]);
        let p = plan_leases(&v, &BTreeSet::new(), &[(E, 8), (Space::Cron, 4)]);
        assert_eq!(p.acquire.len(), 12);
        assert!(p.release.is_empty());
    }

    #[test]
    fn two_live_nodes_split_and_dead_ones_do_not_count() {
        let nodes = [node("a", "r", 1_000), node("b", "r", 1_000), node("dead", "r", -100_000)];
        let leases: Vec<PartitionLease> = (0..4).map(|s| lease(s, "b", 5_000)).collect();
        let p = plan_leases(&view("a", "r", &nodes, &leases), &BTreeSet::new(), &[(E, 8)]);
        assert_eq!(p.acquire.len(), 4, "half of 8");
        assert!(p.acquire.iter().all(|(_, s)| *s >= 4), "only free partitions: {:?}", p.acquire);
        let held: BTreeSet<PartitionId> = (0..8).map(|s| (E, s)).collect();
        let p = plan_leases(&view("a", "r", &nodes, &[]), &held, &[(E, 8)]);
        assert_eq!(p.release.len(), 4);
        assert_eq!(p.renew.len(), 8);
    }

    #[test]
    fn a_restarted_node_reclaims_its_own_leases_first() {
        let nodes = [node("a", "r", 1_000), node("b", "r", 1_000)];
        let leases = vec![lease(6, "a", 9_000), lease(7, "a", 9_000), lease(0, "b", 9_000)];
        let p = plan_leases(&view("a", "r", &nodes, &leases), &BTreeSet::new(), &[(E, 8)]);
        assert_eq!(
            p.acquire[..2].iter().copied().collect::<BTreeSet<_>>(),
            BTreeSet::from([(E, 6), (E, 7)])
        );
        assert!(!p.acquire.contains(&(E, 0)), "b's live lease is left alone");
    }

    #[test]
    fn an_expired_lease_is_free_only_past_the_skew_bound() {
        let nodes = [node("a", "r", 1_000)];
        let leases = vec![lease(0, "b", 900)];
        let mut v = view("a", "r", &nodes, &leases);
        v.skew_ms = 250;
        assert!(!plan_leases(&v, &BTreeSet::new(), &[(E, 1)]).acquire.contains(&(E, 0)));
        v.now = 1_150;
        assert!(plan_leases(&v, &BTreeSet::new(), &[(E, 1)]).acquire.contains(&(E, 0)));
    }

    #[test]
    fn the_primary_regions_nodes_hold_the_leases_while_any_lives() {
        let nodes =
            [node("p1", "east", 1_000), node("p2", "east", 1_000), node("r1", "west", 1_000)];
        let mut v = view("r1", "west", &nodes, &[]);
        v.primary_region = "east";
        let held: BTreeSet<PartitionId> = [(E, 0), (E, 1)].into();
        let p = plan_leases(&v, &held, &[(E, 8)]);
        assert!(p.acquire.is_empty(), "a remote node takes nothing");
        assert_eq!(p.release.len(), 2, "and gives back what it holds");
        let mut v = view("p1", "east", &nodes, &[]);
        v.primary_region = "east";
        assert_eq!(
            plan_leases(&v, &BTreeSet::new(), &[(E, 8)]).acquire.len(),
            4,
            "8 over 2 primary nodes"
        );
        // The primary region is gone: the remote node takes everything.
        let nodes =
            [node("p1", "east", -60_000), node("p2", "east", -60_000), node("r1", "west", 1_000)];
        let mut v = view("r1", "west", &nodes, &[]);
        v.primary_region = "east";
        assert_eq!(plan_leases(&v, &BTreeSet::new(), &[(E, 8)]).acquire.len(), 8);
    }
}
