//! Leased partitions — one ownership model for every partitioned space (execution shards, cron
//! shards) — and node records.
//!
//! A partition's lease lives in **two keys**: the owner key `(owner, epoch)` and the expiry key
//! `(owner, epoch, expires_at)`. Every fenced write of the owner reads the owner key with a
//! conflict ([`check_epoch`]); only a change of owner writes it, and the epoch then rises. A
//! renewal reads the owner key and writes only the expiry key, so renewing never aborts the
//! owner's own in-flight work, while a takeover (epoch + 1) still fences it out.
//!
//! Lease expiry compares times written by different nodes' clocks: the design assumes their
//! skew stays under `max_clock_skew_ms`, and a partition counts as free only once
//! `expires_at + max_clock_skew_ms` has passed on the taker's clock (see docs/decisions/0004).

use kairos_proto::storage::v1::{NodeRecord, PartitionExpiry, PartitionOwner};

use super::Scheduler;
use super::error::{Error, Result, invalid};
use super::records::{decode, encode};
use super::validate::check_name;
use crate::keys::{Space, Tag};
use crate::kv::Transaction;

/// A partition's lease as stored (owner key and expiry key together).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLease {
    /// The space.
    pub space: Space,
    /// The partition.
    pub partition: u32,
    /// The owning node.
    pub owner: String,
    /// Rises on every change of owner.
    pub epoch: u64,
    /// Until when the lease runs (the owner's clock); 0 once released.
    pub expires_at_ms: i64,
}

/// Reads a partition's owner key (with a conflict: a takeover aborts the reader).
async fn load_owner(
    tx: &Transaction,
    sched: &Scheduler,
    space: Space,
    partition: u32,
) -> Result<Option<PartitionOwner>> {
    match tx.get(&sched.ks.partition_owner(space, partition)).await? {
        Some(v) => Ok(Some(decode("partition owner", &v)?)),
        None => Ok(None),
    }
}

async fn load_expiry(
    tx: &Transaction,
    sched: &Scheduler,
    space: Space,
    partition: u32,
) -> Result<Option<PartitionExpiry>> {
    match tx.get(&sched.ks.partition_expiry(space, partition)).await? {
        Some(v) => Ok(Some(decode("partition expiry", &v)?)),
        None => Ok(None),
    }
}

/// Checks the caller still owns `(space, partition)` at `epoch`: a read of the owner key with a
/// conflict, so a concurrent change of owner aborts the caller's transaction. Renewals do not
/// write this key.
pub(crate) async fn check_epoch(
    tx: &Transaction,
    sched: &Scheduler,
    space: Space,
    partition: u32,
    epoch: u64,
) -> Result<()> {
    let current = load_owner(tx, sched, space, partition).await?.map_or(0, |o| o.epoch);
    if current != epoch || epoch == 0 {
        return Err(Error::OwnershipLost { shard: partition, epoch, current });
    }
    Ok(())
}

impl Scheduler {
    /// How many partitions `space` has (cron shards are numbered like execution shards).
    pub fn partition_count(&self, space: Space) -> u32 {
        match space {
            Space::Executions | Space::Cron => self.config.shard_count,
        }
    }

    fn check_partition(&self, space: Space, partition: u32) -> Result<()> {
        let n = self.partition_count(space);
        if partition >= n {
            return Err(invalid(
                "partition",
                format!("must be below {n} in space {}", space.name()),
            ));
        }
        Ok(())
    }

    /// Takes each listed partition for `node_id` for `duration_ms` where it is free (no lease,
    /// or expired for more than `skew_ms`) or already this node's (a restarted node proves
    /// ownership by its stable id and takes its partitions back at once). The epoch always
    /// rises, fencing off any older holder — including this node's previous incarnation. One
    /// transaction; each partition gets its own result (`LeaseHeld` when taken).
    pub async fn acquire_partitions(
        &self,
        wanted: &[(Space, u32)],
        node_id: &str,
        duration_ms: i64,
        skew_ms: i64,
    ) -> Result<Vec<Result<PartitionLease>>> {
        check_name("nodeId", node_id)?;
        for (space, p) in wanted {
            self.check_partition(*space, *p)?;
        }
        let now_ms = self.clock.now().as_millis();
        let expires_at_ms = now_ms.saturating_add(duration_ms);
        self.db
            .run(|tx| async move {
                let reads = wanted.iter().map(|(space, p)| {
                    let tx = &tx;
                    async move {
                        let owner = load_owner(tx, self, *space, *p).await?;
                        let expiry = load_expiry(tx, self, *space, *p).await?;
                        Ok::<_, Error>((owner, expiry))
                    }
                });
                let found = crate::ops::join::join_in_order(reads).await?;
                let mut out = Vec::with_capacity(wanted.len());
                for ((space, partition), (owner, expiry)) in wanted.iter().zip(found) {
                    let (space, partition) = (*space, *partition);
                    let epoch = owner.as_ref().map_or(0, |o| o.epoch);
                    let holder = owner.as_ref().map(|o| o.owner.as_str()).unwrap_or("");
                    let until =
                        expiry.as_ref().filter(|x| x.epoch == epoch).map_or(0, |x| x.expires_at_ms);
                    if holder == node_id && until == expires_at_ms {
                        // This very call committed already (a retry after an unknown result).
                        out.push(Ok(PartitionLease {
                            space,
                            partition,
                            owner: node_id.to_string(),
                            epoch,
                            expires_at_ms,
                        }));
                        continue;
                    }
                    if holder != node_id
                        && !holder.is_empty()
                        && until.saturating_add(skew_ms) > now_ms
                    {
                        out.push(Err(Error::LeaseHeld {
                            shard: partition,
                            owner: holder.to_string(),
                            expires_at_ms: until,
                        }));
                        continue;
                    }
                    let lease = PartitionLease {
                        space,
                        partition,
                        owner: node_id.to_string(),
                        epoch: epoch + 1,
                        expires_at_ms,
                    };
                    self.write_lease(&tx, &lease, epoch)?;
                    out.push(Ok(lease));
                }
                Ok(out)
            })
            .await
    }

    /// Writes a lease taken over from the holder at `previous_epoch`: owner and expiry.
    fn write_lease(&self, tx: &Transaction, l: &PartitionLease, previous_epoch: u64) -> Result<()> {
        assert!(l.epoch > previous_epoch, "an epoch rises with every change of owner");
        let owner = PartitionOwner { owner: l.owner.clone(), epoch: l.epoch };
        tx.set(&self.ks.partition_owner(l.space, l.partition), &encode(&owner))?;
        let expires_at_ms = l.expires_at_ms;
        let expiry = PartitionExpiry { owner: l.owner.clone(), epoch: l.epoch, expires_at_ms };
        tx.set(&self.ks.partition_expiry(l.space, l.partition), &encode(&expiry))?;
        Ok(())
    }

    /// Extends every listed lease this node holds (`(space, partition, epoch)`) in one
    /// transaction that writes only the expiry keys. Each gets its own result:
    /// `OwnershipLost` where the epoch moved.
    pub async fn renew_partitions(
        &self,
        held: &[(Space, u32, u64)],
        node_id: &str,
        duration_ms: i64,
    ) -> Result<Vec<Result<PartitionLease>>> {
        for (space, p, _) in held {
            self.check_partition(*space, *p)?;
        }
        let now_ms = self.clock.now().as_millis();
        let expires_at_ms = now_ms.saturating_add(duration_ms);
        self.db
            .run(|tx| async move {
                let tx = &tx;
                let reads = held.iter().map(|(space, p, _)| async move {
                    let owner = load_owner(tx, self, *space, *p).await?;
                    // A snapshot read: only to write nothing when this very renewal committed
                    // already (a retry after an unknown result); the owner key fences.
                    let key = self.ks.partition_expiry(*space, *p);
                    let expiry = match tx.snapshot_get(&key).await? {
                        Some(v) => Some(decode::<PartitionExpiry>("partition expiry", &v)?),
                        None => None,
                    };
                    Ok::<_, Error>((owner, expiry))
                });
                let found = crate::ops::join::join_in_order(reads).await?;
                let mut out = Vec::with_capacity(held.len());
                for ((space, partition, epoch), (owner, old)) in held.iter().zip(found) {
                    let (space, partition, epoch) = (*space, *partition, *epoch);
                    match owner {
                        Some(o) if o.epoch == epoch && o.owner == node_id => {
                            let expiry = PartitionExpiry {
                                owner: node_id.to_string(),
                                epoch,
                                expires_at_ms,
                            };
                            if old.as_ref() != Some(&expiry) {
                                let key = self.ks.partition_expiry(space, partition);
                                tx.set(&key, &encode(&expiry))?;
                            }
                            out.push(Ok(PartitionLease {
                                space,
                                partition,
                                owner: node_id.to_string(),
                                epoch,
                                expires_at_ms,
                            }));
                        }
                        o => out.push(Err(Error::OwnershipLost {
                            shard: partition,
                            epoch,
                            current: o.map_or(0, |o| o.epoch),
                        })),
                    }
                }
                Ok(out)
            })
            .await
    }

    /// Gives leases up (graceful drain) so other nodes can take them at once. Releasing a lease
    /// no longer held is a no-op.
    pub async fn release_partitions(
        &self,
        held: &[(Space, u32, u64)],
        node_id: &str,
    ) -> Result<()> {
        for (space, p, _) in held {
            self.check_partition(*space, *p)?;
        }
        self.db
            .run(|tx| async move {
                let tx = &tx;
                let reads = held.iter().map(|(space, p, _)| async move {
                    let owner = load_owner(tx, self, *space, *p).await?;
                    let expiry = load_expiry(tx, self, *space, *p).await?;
                    Ok::<_, Error>((owner, expiry))
                });
                let found = crate::ops::join::join_in_order(reads).await?;
                for ((space, partition, epoch), (owner, expiry)) in held.iter().zip(found) {
                    let ours = owner.is_some_and(|o| o.epoch == *epoch && o.owner == node_id);
                    let released =
                        expiry.is_some_and(|x| x.epoch == *epoch && x.expires_at_ms == 0);
                    if ours && !released {
                        let expiry = PartitionExpiry {
                            owner: node_id.to_string(),
                            epoch: *epoch,
                            expires_at_ms: 0,
                        };
                        tx.set(&self.ks.partition_expiry(*space, *partition), &encode(&expiry))?;
                    }
                }
                Ok(())
            })
            .await
    }

    /// Every lease on record in `space`, by partition.
    pub async fn partition_leases(&self, space: Space) -> Result<Vec<PartitionLease>> {
        let (owners, expiries) = self
            .db
            .run(|tx| async move {
                let (owners, expiries) =
                    (self.ks.partition_owners(space), self.ks.partition_expiries(space));
                let o = tx.get_range(&owners, true);
                let x = tx.get_range(&expiries, true);
                let (o, x) = futures_util::future::try_join(o, x).await?;
                Ok::<_, Error>((o, x))
            })
            .await?;
        let mut until = std::collections::BTreeMap::new();
        for kv in expiries {
            let (_, p) = self.ks.parse_partition(Tag::PartitionExpiry, &kv.key)?;
            let x: PartitionExpiry = decode("partition expiry", &kv.value)?;
            until.insert(p, x);
        }
        let mut out = Vec::with_capacity(owners.len());
        for kv in owners {
            let (_, partition) = self.ks.parse_partition(Tag::PartitionOwner, &kv.key)?;
            let o: PartitionOwner = decode("partition owner", &kv.value)?;
            let expires_at_ms =
                until.get(&partition).filter(|x| x.epoch == o.epoch).map_or(0, |x| x.expires_at_ms);
            out.push(PartitionLease {
                space,
                partition,
                owner: o.owner,
                epoch: o.epoch,
                expires_at_ms,
            });
        }
        Ok(out)
    }

    /// Records a node's heartbeat (its own clock's time).
    pub async fn heartbeat_node(&self, node: NodeRecord) -> Result<NodeRecord> {
        check_name("nodeId", &node.node_id)?;
        let now_ms = self.clock.now().as_millis();
        let node = NodeRecord { heartbeat_at_ms: now_ms, ..node };
        self.db
            .run(|tx| {
                let node = node.clone();
                async move {
                    let key = self.ks.node(&node.node_id);
                    let bytes = encode(&node);
                    // Write nothing when this very heartbeat committed already.
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
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        self.db
            .run(|tx| async move {
                let rows = tx.get_range(&self.ks.nodes(), true).await?;
                rows.iter().map(|kv| decode("node", &kv.value)).collect::<Result<Vec<_>>>()
            })
            .await
    }
}
