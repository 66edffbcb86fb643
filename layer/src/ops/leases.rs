//! Shard ownership leases (epoch rises on every change of owner) and node records.

use kairos_proto::storage::v1::{Node, ShardLease};

use super::Scheduler;
use super::error::{Error, Result, invalid};
use super::records::{decode, encode};
use super::submit::check_name;
use crate::kv::Transaction;

async fn load_lease(tx: &Transaction, sched: &Scheduler, shard: u32) -> Result<Option<ShardLease>> {
    match tx.get(&sched.ks.shard_lease(shard)).await? {
        Some(v) => Ok(Some(decode("shard lease", &v)?)),
        None => Ok(None),
    }
}

impl Scheduler {
    fn check_shard(&self, shard: u32) -> Result<()> {
        if shard >= self.config.shard_count {
            return Err(invalid("shard", format!("must be below {}", self.config.shard_count)));
        }
        Ok(())
    }

    /// Takes `shard` for `node_id` for `duration_ms` if it is free, expired, or already this
    /// node's (a restarted node proves ownership by its stable id and takes its shards back
    /// at once). The epoch always rises, fencing off any older holder — including this node's
    /// previous incarnation.
    pub async fn acquire_shard(
        &self,
        shard: u32,
        node_id: &str,
        duration_ms: i64,
    ) -> Result<ShardLease> {
        self.check_shard(shard)?;
        check_name("nodeId", node_id)?;
        let now_ms = self.clock.now().as_millis();
        self.db
            .run(|tx| async move {
                let old = load_lease(&tx, self, shard).await?;
                let expires_at_ms = now_ms.saturating_add(duration_ms);
                if let Some(l) = &old
                    && l.owner == node_id
                    && l.expires_at_ms == expires_at_ms
                {
                    return Ok(l.clone()); // this very call committed already
                }
                if let Some(l) = &old
                    && l.owner != node_id
                    && l.expires_at_ms > now_ms
                {
                    return Err(Error::LeaseHeld {
                        shard,
                        owner: l.owner.clone(),
                        expires_at_ms: l.expires_at_ms,
                    });
                }
                let lease = ShardLease {
                    shard,
                    owner: node_id.to_string(),
                    epoch: old.map_or(0, |l| l.epoch) + 1,
                    expires_at_ms,
                };
                tx.set(&self.ks.shard_lease(shard), &encode(&lease))?;
                Ok(lease)
            })
            .await
    }

    /// Extends a lease this node holds at `epoch`; `OwnershipLost` if the epoch moved.
    pub async fn renew_shard(
        &self,
        shard: u32,
        node_id: &str,
        epoch: u64,
        duration_ms: i64,
    ) -> Result<ShardLease> {
        self.check_shard(shard)?;
        let now_ms = self.clock.now().as_millis();
        self.db
            .run(|tx| async move {
                let Some(mut l) = load_lease(&tx, self, shard).await? else {
                    return Err(Error::OwnershipLost { shard, epoch, current: 0 });
                };
                if l.epoch != epoch || l.owner != node_id {
                    return Err(Error::OwnershipLost { shard, epoch, current: l.epoch });
                }
                let expires_at_ms = now_ms.saturating_add(duration_ms);
                if l.expires_at_ms != expires_at_ms {
                    l.expires_at_ms = expires_at_ms;
                    tx.set(&self.ks.shard_lease(shard), &encode(&l))?;
                }
                Ok(l)
            })
            .await
    }

    /// Gives a lease up (graceful drain) so another node can take it at once. Releasing a
    /// lease no longer held is a no-op.
    pub async fn release_shard(&self, shard: u32, node_id: &str, epoch: u64) -> Result<()> {
        self.check_shard(shard)?;
        self.db
            .run(|tx| async move {
                if let Some(mut l) = load_lease(&tx, self, shard).await?
                    && l.epoch == epoch
                    && l.owner == node_id
                    && l.expires_at_ms != 0
                {
                    l.expires_at_ms = 0;
                    tx.set(&self.ks.shard_lease(shard), &encode(&l))?;
                }
                Ok(())
            })
            .await
    }

    /// Every shard lease on record.
    pub async fn shard_leases(&self) -> Result<Vec<ShardLease>> {
        self.db
            .run(|tx| async move {
                let rows = tx.get_range(&self.ks.shard_leases(), true).await?;
                rows.iter().map(|kv| decode("shard lease", &kv.value)).collect::<Result<Vec<_>>>()
            })
            .await
    }

    /// Records a node's heartbeat.
    pub async fn heartbeat_node(&self, node: Node) -> Result<Node> {
        check_name("nodeId", &node.node_id)?;
        let now_ms = self.clock.now().as_millis();
        let node = Node { heartbeat_at_ms: now_ms, ..node };
        self.db
            .run(|tx| {
                let node = node.clone();
                async move {
                    let key = self.ks.node(&node.node_id);
                    let bytes = encode(&node);
                    if tx.get(&key).await?.as_deref() != Some(bytes.as_slice()) {
                        tx.set(&key, &bytes)?;
                    }
                    Ok(node)
                }
            })
            .await
    }

    /// Removes a node's record (a drained node leaves the live set at once, so the others
    /// take its share without waiting for its heartbeat to go stale).
    pub async fn remove_node(&self, node_id: &str) -> Result<()> {
        self.db
            .run(|tx| async move {
                tx.clear(&self.ks.node(node_id))?;
                Ok(())
            })
            .await
    }

    /// Every node on record.
    pub async fn nodes(&self) -> Result<Vec<Node>> {
        self.db
            .run(|tx| async move {
                let rows = tx.get_range(&self.ks.nodes(), true).await?;
                rows.iter().map(|kv| decode("node", &kv.value)).collect::<Result<Vec<_>>>()
            })
            .await
    }
}
