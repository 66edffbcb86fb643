//! The keyspace: the single owner of Kairos's key layout.
//!
//! Every key is a FoundationDB tuple under the cluster root `("kairos", <cluster>)`, starting
//! with a [`Tag`] naming its subspace. Tags are never reused: a retired tag stays reserved in
//! the enum. `ns` is the namespace, `ms` are milliseconds since the Unix epoch.
//!
//! | tag | subspace | key (after the root) | value |
//! |---|---|---|---|
//! | 1 | cluster | `(1, "config")` | `ClusterConfig` (shard count, bucket width, ready partitions: fixed at creation) |
//! | 2 | execution | `(2, ns, shard, execution_id)` | `Execution` (grouped by shard: a batch of one shard's timers updates neighbouring records) |
//! | 3 | attempt | `(3, ns, execution_id, attempt_no)` | `Attempt` (written when the attempt ends; the running one lives on the execution) |
//! | 4 | idempotency | `(4, ns, idempotency_key)` | `IdempotencyRecord` (execution id + request fingerprint) |
//! | 5 | timer | `(5, bucket, shard, fire_at_ms, execution_id, kind)` | `TimerEntry` |
//! | 6 | *retired* | ready queue without partitions (format 1) | |
//! | 7 | *retired* | shard lease with owner and expiry in one key (format 1) | |
//! | 8 | watermark | `(8, shard)` | i64 bucket, big-endian: lowest bucket that may hold timers |
//! | 9 | node | `(9, node_id)` | `NodeRecord` |
//! | 10 | cron job | `(10, ns, cron_job_id)` | `CronJob` (its shard is `fnv1a64(cron_job_id) mod shard_count`) |
//! | 11 | cron timer | `(11, bucket, shard, fire_at_ms, cron_job_id)` | `CronTimerEntry` (namespace): when the cron shard's owner looks at the job next |
//! | 12 | definition | `(12, ns, name, version)` | `JobDefinition` |
//! | 13 | by status | `(13, ns, status, execute_at_ms, execution_id)` | empty (index) |
//! | 14 | by definition | `(14, ns, definition_name, execute_at_ms, execution_id)` | empty (index) |
//! | 15 | by time | `(15, ns, execute_at_ms, execution_id)` | empty (index) |
//! | 16–18 | *retired* | ready signal, claim receipt, status count without partitions (format 1) | |
//! | 19 | partition owner | `(19, space, partition)` | `PartitionOwner` (owner, epoch): read with a conflict by every fenced write |
//! | 20 | partition expiry | `(20, space, partition)` | `PartitionExpiry` (owner, epoch, expires_at): only renewals write it |
//! | 21 | ready | `(21, ns, queue, partition, ready_at_ms, execution_id)` | empty |
//! | 22 | ready signal | `(22, ns, queue, partition)` | i64 little-endian counter, bumped when work becomes ready; dispatchers watch it |
//! | 23 | claim receipt | `(23, claimed_at_ms, claim_id, node_id)` (older receipts name no node: `(23, claimed_at_ms, claim_id)`) | tuple-packed list of `(namespace, execution_id, fencing_token, slot)`, one per attempt one claim started — or one fire started for its offer's slots — so the transaction retried after an unknown commit result hands out exactly that, to the same slots, and a restarted node finds what its previous run held; kept 60 s |
//! | 24 | status count | `(24, ns, status, partition)` | i64 little-endian counter of executions in that status, kept by atomic adds |
//! | 25 | quarantine | `(25, space, partition, at_ms, key)` | `QuarantineRecord`: a record that could not be processed, kept for operators |
//! | 26 | cron watermark | `(26, shard)` | i64 big-endian: lowest bucket that may hold cron timers of the cron shard (written with the shard's first cron timer) |
//! | 27 | api key | `(27, key_id)` | `ApiKey`: namespace, scopes, the secret's hash (never the secret) |
//! | 28 | audit | `(28, ns, at_ms, audit_id)` | `AuditRecord`: who did what to which target |
//!
//! `partition` of the ready queue and the status counts is `shard mod ready_partitions`: no key
//! or range is written by every node, while a claimer reads only a few heads. Leased
//! partitions (tags 19–20) are numbered per *space* ([`Space`]): execution shards, cron shards.
//!
//! `bucket = floor(fire_at_ms / bucket_width_ms)`, `shard = fnv1a64(execution_id) mod
//! shard_count` ([`crate::ids`]). The timer key order `(bucket, shard, fire_at)` lets a shard
//! owner scan `(b, s, *)` for buckets from its watermark up to now.

use foundationdb_tuple::{Subspace, TuplePack, TupleUnpack};

use crate::kv::RangeOption;

/// Subspace tags. Never reuse a value; retire by commenting, keeping the number reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(i64)]
pub enum Tag {
    /// Cluster configuration.
    Cluster = 1,
    /// Execution records.
    Execution = 2,
    /// Attempt records.
    Attempt = 3,
    /// Idempotency keys.
    Idempotency = 4,
    /// The timer index.
    Timer = 5,
    // 6: retired (format 1 ready queue).
    // 7: retired (format 1 shard lease).
    /// Per-shard timer watermarks.
    Watermark = 8,
    /// Node records.
    Node = 9,
    /// Cron jobs.
    CronJob = 10,
    /// Cron timer index.
    CronTimer = 11,
    /// Job definitions.
    Definition = 12,
    /// Executions by status.
    ByStatus = 13,
    /// Executions by definition: written by keyspace formats 2 and 3 only; a store is raised
    /// to format 4 by clearing it (listing by definition filters the time index).
    ByDefinition = 14,
    /// Executions by execute_at.
    ByTime = 15,
    // 16: retired (format 1 ready signal).
    // 17: retired (format 1 claim receipt).
    // 18: retired (format 1 status count).
    /// Owner and epoch of a leased partition.
    PartitionOwner = 19,
    /// Expiry of a leased partition's lease.
    PartitionExpiry = 20,
    /// Ready queues, partitioned.
    Ready = 21,
    /// Ready-work counters, partitioned.
    ReadySignal = 22,
    /// Claim receipts.
    ClaimReceipt = 23,
    /// Executions per status, partitioned.
    StatusCount = 24,
    /// Records quarantined as unprocessable.
    Quarantine = 25,
    /// Per-cron-shard watermarks of the cron timer index.
    CronWatermark = 26,
    /// API keys (hashed secrets), by key id.
    ApiKey = 27,
    /// The audit log, by namespace and time.
    Audit = 28,
}

impl Tag {
    /// Every tag in use, in value order.
    pub const ALL: [Tag; 23] = [
        Tag::Cluster,
        Tag::Execution,
        Tag::Attempt,
        Tag::Idempotency,
        Tag::Timer,
        Tag::Watermark,
        Tag::Node,
        Tag::CronJob,
        Tag::CronTimer,
        Tag::Definition,
        Tag::ByStatus,
        Tag::ByDefinition,
        Tag::ByTime,
        Tag::PartitionOwner,
        Tag::PartitionExpiry,
        Tag::Ready,
        Tag::ReadySignal,
        Tag::ClaimReceipt,
        Tag::StatusCount,
        Tag::Quarantine,
        Tag::CronWatermark,
        Tag::ApiKey,
        Tag::Audit,
    ];
    /// Retired tag values: never to be used again.
    pub const RETIRED: [i64; 5] = [6, 7, 16, 17, 18];
}

/// A space of leased partitions: each has its own numbering, leases and owners.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(i64)]
pub enum Space {
    /// Execution shards: timers, firing, lease checks.
    Executions = 1,
    /// Cron shards: cron timers and materialization.
    Cron = 2,
}

impl Space {
    /// Every space, in value order.
    pub const ALL: [Space; 2] = [Space::Executions, Space::Cron];

    /// A short name (metrics, logs, the admin API).
    pub fn name(self) -> &'static str {
        match self {
            Space::Executions => "executions",
            Space::Cron => "cron",
        }
    }

    /// The space with this number.
    pub fn from_i64(v: i64) -> Option<Space> {
        Space::ALL.into_iter().find(|s| *s as i64 == v)
    }
}

/// A decoded timer key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TimerKey {
    /// Time bucket (possibly clamped up to the shard's watermark).
    pub bucket: i64,
    /// Logical shard.
    pub shard: u32,
    /// When it fires.
    pub fire_at_ms: i64,
    /// The execution.
    pub execution_id: String,
    /// `TimerKind` as its protobuf number.
    pub kind: i32,
}

/// A decoded cron timer key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct CronTimerKey {
    /// Time bucket (possibly clamped up to the cron shard's watermark).
    pub bucket: i64,
    /// Cron shard.
    pub shard: u32,
    /// When the owner looks at the job.
    pub fire_at_ms: i64,
    /// The cron job.
    pub cron_job_id: String,
}

/// A decoded ready-queue key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyKey {
    /// Namespace.
    pub namespace: String,
    /// Queue.
    pub queue: String,
    /// Ready partition (`shard mod ready_partitions`).
    pub partition: u32,
    /// When it became ready.
    pub ready_at_ms: i64,
    /// The execution.
    pub execution_id: String,
}

/// The key layout of one cluster.
#[derive(Debug, Clone)]
pub struct Keyspace {
    root: Subspace,
    /// Execution records are grouped by `fnv1a64(id) mod shards` (the execution's shard once
    /// the cluster's shard count is set), so the records a shard owner's batch touches are
    /// neighbours in the store.
    shards: u32,
}

/// A key could not be decoded: data corruption or a foreign key in our range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable key in subspace {subspace}: {reason}")]
pub struct KeyError {
    /// The subspace expected.
    pub subspace: &'static str,
    /// What failed.
    pub reason: String,
}

impl Keyspace {
    /// The keyspace of cluster `cluster` (`"default"` for a single embedded node).
    pub fn new(cluster: &str) -> Self {
        Keyspace { root: Subspace::all().subspace(&("kairos", cluster)), shards: 1 }
    }

    /// The same layout with execution records grouped by the cluster's `shard_count` (set
    /// once the cluster's configuration is known; fixed for the life of the cluster).
    pub fn with_shards(mut self, shard_count: u32) -> Self {
        self.shards = shard_count.max(1);
        self
    }

    fn key<T: TuplePack>(&self, tag: Tag, rest: T) -> Vec<u8> {
        self.root.subspace(&(tag as i64)).pack(&rest)
    }

    fn prefix<T: TuplePack>(&self, tag: Tag, rest: T) -> RangeOption {
        let (b, e) = self.root.subspace(&(tag as i64)).subspace(&rest).range();
        RangeOption::new(b, e)
    }

    fn unpack<'a, T: TupleUnpack<'a>>(&self, tag: Tag, key: &'a [u8]) -> Result<T, KeyError> {
        self.root
            .subspace(&(tag as i64))
            .unpack(key)
            .map_err(|e| KeyError { subspace: tag_name(tag), reason: e.to_string() })
    }

    /// The whole subspace of `tag`.
    pub fn subspace_range(&self, tag: Tag) -> RangeOption {
        let (b, e) = self.root.subspace(&(tag as i64)).range();
        RangeOption::new(b, e)
    }

    /// The cluster configuration key.
    pub fn cluster(&self) -> Vec<u8> {
        self.key(Tag::Cluster, "config")
    }

    /// An execution record.
    pub fn execution(&self, ns: &str, id: &str) -> Vec<u8> {
        let group = crate::ids::shard_of(id, self.shards);
        self.key(Tag::Execution, (ns, group, id))
    }

    /// An attempt record.
    pub fn attempt(&self, ns: &str, id: &str, number: u32) -> Vec<u8> {
        self.key(Tag::Attempt, (ns, id, number))
    }

    /// All attempts of an execution.
    pub fn attempts(&self, ns: &str, id: &str) -> RangeOption {
        self.prefix(Tag::Attempt, (ns, id))
    }

    /// An idempotency key.
    pub fn idempotency(&self, ns: &str, key: &str) -> Vec<u8> {
        self.key(Tag::Idempotency, (ns, key))
    }

    /// A timer.
    pub fn timer(&self, t: &TimerKey) -> Vec<u8> {
        self.key(Tag::Timer, (t.bucket, t.shard, t.fire_at_ms, t.execution_id.as_str(), t.kind))
    }

    /// Timers of `(bucket, shard)`.
    pub fn timer_bucket(&self, bucket: i64, shard: u32) -> RangeOption {
        self.prefix(Tag::Timer, (bucket, shard))
    }

    /// Timers of `(bucket, shard)` firing at or before `now_ms`.
    pub fn timers_due(&self, bucket: i64, shard: u32, now_ms: i64) -> RangeOption {
        let all = self.timer_bucket(bucket, shard);
        let end = self.key(Tag::Timer, (bucket, shard, now_ms.saturating_add(1)));
        RangeOption::new(all.begin, end)
    }

    /// Decodes a timer key.
    pub fn parse_timer(&self, key: &[u8]) -> Result<TimerKey, KeyError> {
        let (bucket, shard, fire_at_ms, execution_id, kind) =
            self.unpack::<(i64, u32, i64, String, i32)>(Tag::Timer, key)?;
        Ok(TimerKey { bucket, shard, fire_at_ms, execution_id, kind })
    }

    /// A ready-queue entry.
    pub fn ready(&self, r: &ReadyKey) -> Vec<u8> {
        self.key(
            Tag::Ready,
            (
                r.namespace.as_str(),
                r.queue.as_str(),
                r.partition,
                r.ready_at_ms,
                r.execution_id.as_str(),
            ),
        )
    }

    /// One partition of a ready queue, oldest first.
    pub fn ready_queue(&self, ns: &str, queue: &str, partition: u32) -> RangeOption {
        self.prefix(Tag::Ready, (ns, queue, partition))
    }

    /// Decodes a ready key.
    pub fn parse_ready(&self, key: &[u8]) -> Result<ReadyKey, KeyError> {
        let (namespace, queue, partition, ready_at_ms, execution_id) =
            self.unpack::<(String, String, u32, i64, String)>(Tag::Ready, key)?;
        Ok(ReadyKey { namespace, queue, partition, ready_at_ms, execution_id })
    }

    /// The ready-work counter of one partition of a queue.
    pub fn ready_signal(&self, ns: &str, queue: &str, partition: u32) -> Vec<u8> {
        self.key(Tag::ReadySignal, (ns, queue, partition))
    }

    /// The count of executions in `status` of one partition.
    pub fn status_count(&self, ns: &str, status: i32, partition: u32) -> Vec<u8> {
        self.key(Tag::StatusCount, (ns, status, partition))
    }

    /// Every status count of a namespace.
    pub fn status_counts(&self, ns: &str) -> RangeOption {
        self.prefix(Tag::StatusCount, ns)
    }

    /// Decodes a status count key into `(ns, status, partition)`.
    pub fn parse_status_count(&self, key: &[u8]) -> Result<(String, i32, u32), KeyError> {
        self.unpack(Tag::StatusCount, key)
    }

    /// Timers of `(bucket, shard)` with `after_ms < fire_at <= until_ms`.
    pub fn timers_between(
        &self,
        bucket: i64,
        shard: u32,
        after_ms: i64,
        until_ms: i64,
    ) -> RangeOption {
        RangeOption::new(
            self.key(Tag::Timer, (bucket, shard, after_ms.saturating_add(1))),
            self.key(Tag::Timer, (bucket, shard, until_ms.saturating_add(1))),
        )
    }

    /// A claim receipt.
    pub fn claim_receipt(&self, claimed_at_ms: i64, claim_id: u64, holder: &str) -> Vec<u8> {
        if holder.is_empty() {
            self.key(Tag::ClaimReceipt, (claimed_at_ms, claim_id))
        } else {
            self.key(Tag::ClaimReceipt, (claimed_at_ms, claim_id, holder))
        }
    }

    /// When a claim receipt was written, and by which node (empty: a receipt that names none,
    /// as those written before receipts named their node).
    pub fn parse_claim_receipt(&self, key: &[u8]) -> Result<(i64, String), KeyError> {
        self.unpack::<(i64, u64, String)>(Tag::ClaimReceipt, key)
            .map(|(at, _, holder)| (at, holder))
            .or_else(|_| {
                self.unpack::<(i64, u64)>(Tag::ClaimReceipt, key).map(|(at, _)| (at, String::new()))
            })
    }

    /// Claim receipts written from `from_ms` to before `to_ms`.
    pub fn claim_receipts_between(&self, from_ms: i64, to_ms: i64) -> RangeOption {
        RangeOption::new(self.key(Tag::ClaimReceipt, from_ms), self.key(Tag::ClaimReceipt, to_ms))
    }

    /// Claim receipts older than `before_ms` (claims and fires clear them, and retention).
    pub fn claim_receipts_before(&self, before_ms: i64) -> RangeOption {
        let all = self.subspace_range(Tag::ClaimReceipt);
        RangeOption::new(all.begin, self.key(Tag::ClaimReceipt, before_ms))
    }

    /// The owner and epoch of a leased partition.
    pub fn partition_owner(&self, space: Space, partition: u32) -> Vec<u8> {
        self.key(Tag::PartitionOwner, (space as i64, partition))
    }

    /// The lease expiry of a leased partition.
    pub fn partition_expiry(&self, space: Space, partition: u32) -> Vec<u8> {
        self.key(Tag::PartitionExpiry, (space as i64, partition))
    }

    /// Every partition owner of a space.
    pub fn partition_owners(&self, space: Space) -> RangeOption {
        self.prefix(Tag::PartitionOwner, space as i64)
    }

    /// Every partition expiry of a space.
    pub fn partition_expiries(&self, space: Space) -> RangeOption {
        self.prefix(Tag::PartitionExpiry, space as i64)
    }

    /// Decodes a partition owner or expiry key into `(space, partition)`.
    pub fn parse_partition(&self, tag: Tag, key: &[u8]) -> Result<(Space, u32), KeyError> {
        let (space, partition) = self.unpack::<(i64, u32)>(tag, key)?;
        let space = Space::from_i64(space).ok_or_else(|| KeyError {
            subspace: tag_name(tag),
            reason: format!("unknown space {space}"),
        })?;
        Ok((space, partition))
    }

    /// A quarantined record of `(space, partition)`, put aside at `at_ms`.
    pub fn quarantine(&self, space: Space, partition: u32, at_ms: i64, key: &[u8]) -> Vec<u8> {
        self.key(Tag::Quarantine, (space as i64, partition, at_ms, key))
    }

    /// Every quarantined record.
    pub fn quarantined(&self) -> RangeOption {
        self.subspace_range(Tag::Quarantine)
    }

    /// A cron job.
    pub fn cron_job(&self, ns: &str, id: &str) -> Vec<u8> {
        self.key(Tag::CronJob, (ns, id))
    }

    /// Every cron job of a namespace, by id.
    pub fn cron_jobs(&self, ns: &str) -> RangeOption {
        self.prefix(Tag::CronJob, ns)
    }

    /// Decodes a cron job key into `(ns, cron_job_id)`.
    pub fn parse_cron_job(&self, key: &[u8]) -> Result<(String, String), KeyError> {
        self.unpack(Tag::CronJob, key)
    }

    /// A cron timer.
    pub fn cron_timer(&self, t: &CronTimerKey) -> Vec<u8> {
        self.key(Tag::CronTimer, (t.bucket, t.shard, t.fire_at_ms, t.cron_job_id.as_str()))
    }

    /// Cron timers of `(bucket, shard)` firing at or before `until_ms`.
    pub fn cron_timers_until(&self, bucket: i64, shard: u32, until_ms: i64) -> RangeOption {
        let all = self.prefix(Tag::CronTimer, (bucket, shard));
        let end = self.key(Tag::CronTimer, (bucket, shard, until_ms.saturating_add(1)));
        RangeOption::new(all.begin, end)
    }

    /// Decodes a cron timer key.
    pub fn parse_cron_timer(&self, key: &[u8]) -> Result<CronTimerKey, KeyError> {
        let (bucket, shard, fire_at_ms, cron_job_id) =
            self.unpack::<(i64, u32, i64, String)>(Tag::CronTimer, key)?;
        Ok(CronTimerKey { bucket, shard, fire_at_ms, cron_job_id })
    }

    /// A cron shard's watermark.
    pub fn cron_watermark(&self, shard: u32) -> Vec<u8> {
        self.key(Tag::CronWatermark, shard)
    }

    /// Idempotency keys of `ns` that start with `prefix` (which holds no NUL byte), in key
    /// order: a tuple string is its bytes then a terminator, so every string extending
    /// `prefix` encodes to the prefix's bytes followed by more.
    pub fn idempotency_prefix(&self, ns: &str, prefix: &str) -> RangeOption {
        debug_assert!(!prefix.contains('\0'), "a prefix with a NUL byte");
        let mut begin = self.key(Tag::Idempotency, (ns, prefix));
        begin.pop(); // the string's terminator
        let mut end = begin.clone();
        end.push(0xff);
        RangeOption::new(begin, end)
    }

    /// Decodes an idempotency key into `(ns, key)`.
    pub fn parse_idempotency(&self, key: &[u8]) -> Result<(String, String), KeyError> {
        self.unpack(Tag::Idempotency, key)
    }

    /// An API key record.
    pub fn api_key(&self, id: &str) -> Vec<u8> {
        self.key(Tag::ApiKey, id)
    }

    /// The id of an API key record's key.
    pub fn parse_api_key(&self, key: &[u8]) -> Result<String, KeyError> {
        self.unpack(Tag::ApiKey, key)
    }

    /// Every API key record.
    pub fn api_keys(&self) -> RangeOption {
        self.subspace_range(Tag::ApiKey)
    }

    /// An audit record: `(ns, at_ms, id)`.
    pub fn audit(&self, ns: &str, at_ms: i64, id: &str) -> Vec<u8> {
        self.key(Tag::Audit, (ns, at_ms, id))
    }

    /// A namespace's audit records from `from_ms` (inclusive) on, oldest first.
    pub fn audit_from(&self, ns: &str, from_ms: i64) -> RangeOption {
        let all = self.prefix(Tag::Audit, ns);
        RangeOption::new(self.key(Tag::Audit, (ns, from_ms)), all.end)
    }

    /// A namespace's audit records before `before_ms`.
    pub fn audit_before(&self, ns: &str, before_ms: i64) -> RangeOption {
        let all = self.prefix(Tag::Audit, ns);
        RangeOption::new(all.begin, self.key(Tag::Audit, (ns, before_ms)))
    }

    /// Every audit record of a namespace.
    pub fn audit_all(&self, ns: &str) -> RangeOption {
        self.prefix(Tag::Audit, ns)
    }

    /// `(ns, at_ms, id)` of an audit record's key.
    pub fn parse_audit(&self, key: &[u8]) -> Result<(String, i64, String), KeyError> {
        self.unpack(Tag::Audit, key)
    }

    /// A shard's watermark.
    pub fn watermark(&self, shard: u32) -> Vec<u8> {
        self.key(Tag::Watermark, shard)
    }

    /// A node record.
    pub fn node(&self, node_id: &str) -> Vec<u8> {
        self.key(Tag::Node, node_id)
    }

    /// All node records.
    pub fn nodes(&self) -> RangeOption {
        self.subspace_range(Tag::Node)
    }

    /// A definition version.
    pub fn definition(&self, ns: &str, name: &str, version: u32) -> Vec<u8> {
        self.key(Tag::Definition, (ns, name, version))
    }

    /// All versions of a definition, oldest first.
    pub fn definition_versions(&self, ns: &str, name: &str) -> RangeOption {
        self.prefix(Tag::Definition, (ns, name))
    }

    /// All definitions of a namespace.
    pub fn definitions(&self, ns: &str) -> RangeOption {
        self.prefix(Tag::Definition, ns)
    }

    /// Decodes a definition key into `(ns, name, version)`.
    pub fn parse_definition(&self, key: &[u8]) -> Result<(String, String, u32), KeyError> {
        self.unpack(Tag::Definition, key)
    }

    /// Index entry: executions by status.
    pub fn by_status(&self, ns: &str, status: i32, execute_at_ms: i64, id: &str) -> Vec<u8> {
        self.key(Tag::ByStatus, (ns, status, execute_at_ms, id))
    }

    /// Index range: one status, `execute_at` in `[from_ms, to_ms)`.
    pub fn by_status_range(&self, ns: &str, status: i32, from_ms: i64, to_ms: i64) -> RangeOption {
        RangeOption::new(
            self.key(Tag::ByStatus, (ns, status, from_ms)),
            self.key(Tag::ByStatus, (ns, status, to_ms)),
        )
    }

    /// Index entry: executions by definition (formats 2 and 3; cleared by the 3 → 4 upgrade).
    pub fn by_definition(&self, ns: &str, name: &str, execute_at_ms: i64, id: &str) -> Vec<u8> {
        self.key(Tag::ByDefinition, (ns, name, execute_at_ms, id))
    }

    /// Index range: one definition, `execute_at` in `[from_ms, to_ms)`.
    pub fn by_definition_range(
        &self,
        ns: &str,
        name: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> RangeOption {
        RangeOption::new(
            self.key(Tag::ByDefinition, (ns, name, from_ms)),
            self.key(Tag::ByDefinition, (ns, name, to_ms)),
        )
    }

    /// Index entry: executions by time.
    pub fn by_time(&self, ns: &str, execute_at_ms: i64, id: &str) -> Vec<u8> {
        self.key(Tag::ByTime, (ns, execute_at_ms, id))
    }

    /// Index range: `execute_at` in `[from_ms, to_ms)`.
    pub fn by_time_range(&self, ns: &str, from_ms: i64, to_ms: i64) -> RangeOption {
        RangeOption::new(self.key(Tag::ByTime, (ns, from_ms)), self.key(Tag::ByTime, (ns, to_ms)))
    }

    /// Every key of this cluster.
    pub fn cluster_range(&self) -> RangeOption {
        let (b, e) = self.root.range();
        RangeOption::new(b, e)
    }

    /// The subspace a key of this cluster is in; `None` for a key in no subspace in use (a
    /// retired tag, or damage).
    pub fn tag_of(&self, key: &[u8]) -> Option<Tag> {
        Tag::ALL.into_iter().find(|t| self.root.subspace(&(*t as i64)).is_start_of(key))
    }

    /// The namespace, record group and id of an execution record's key.
    pub fn parse_execution(&self, key: &[u8]) -> Result<(String, u32, String), KeyError> {
        self.unpack(Tag::Execution, key)
    }

    /// The namespace, execution id and number of an attempt record's key.
    pub fn parse_attempt(&self, key: &[u8]) -> Result<(String, String, u32), KeyError> {
        self.unpack(Tag::Attempt, key)
    }

    /// `(ns, status, execute_at_ms, id)` of a by-status index entry.
    pub fn parse_by_status(&self, key: &[u8]) -> Result<(String, i32, i64, String), KeyError> {
        self.unpack(Tag::ByStatus, key)
    }

    /// `(ns, definition, execute_at_ms, id)` of a by-definition index entry.
    pub fn parse_by_definition(
        &self,
        key: &[u8],
    ) -> Result<(String, String, i64, String), KeyError> {
        self.unpack(Tag::ByDefinition, key)
    }

    /// `(ns, execute_at_ms, id)` of a by-time index entry.
    pub fn parse_by_time(&self, key: &[u8]) -> Result<(String, i64, String), KeyError> {
        self.unpack(Tag::ByTime, key)
    }

    /// Checks that `key` has the layout of its subspace `tag` (the integrity check's view of
    /// the table above).
    pub fn check_layout(&self, tag: Tag, key: &[u8]) -> Result<(), KeyError> {
        match tag {
            Tag::Cluster => self.unpack::<String>(tag, key).map(drop),
            Tag::Execution => self.parse_execution(key).map(drop),
            Tag::Attempt => self.parse_attempt(key).map(drop),
            Tag::Idempotency => self.parse_idempotency(key).map(drop),
            Tag::Timer => self.parse_timer(key).map(drop),
            Tag::Watermark | Tag::CronWatermark => self.unpack::<u32>(tag, key).map(drop),
            Tag::Node => self.unpack::<String>(tag, key).map(drop),
            Tag::CronJob => self.parse_cron_job(key).map(drop),
            Tag::CronTimer => self.parse_cron_timer(key).map(drop),
            Tag::Definition => self.parse_definition(key).map(drop),
            Tag::ByStatus | Tag::ByDefinition | Tag::ByTime => {
                self.index_execution_id(tag, key).map(drop)
            }
            Tag::PartitionOwner | Tag::PartitionExpiry => self.parse_partition(tag, key).map(drop),
            Tag::Ready => self.parse_ready(key).map(drop),
            Tag::ReadySignal => self.unpack::<(String, String, u32)>(tag, key).map(drop),
            Tag::ClaimReceipt => self.parse_claim_receipt(key).map(drop),
            Tag::StatusCount => self.parse_status_count(key).map(drop),
            Tag::Quarantine => self.unpack::<(i64, u32, i64, Vec<u8>)>(tag, key).map(drop),
            Tag::ApiKey => self.parse_api_key(key).map(drop),
            Tag::Audit => self.parse_audit(key).map(drop),
        }
    }

    /// The execution id (last element) of an index entry of `tag`.
    pub fn index_execution_id(&self, tag: Tag, key: &[u8]) -> Result<String, KeyError> {
        match tag {
            Tag::ByStatus => self.parse_by_status(key).map(|t| t.3),
            Tag::ByDefinition => self.parse_by_definition(key).map(|t| t.3),
            Tag::ByTime => self.parse_by_time(key).map(|t| t.2),
            other => Err(KeyError { subspace: tag_name(other), reason: "not an index".into() }),
        }
    }
}

fn tag_name(tag: Tag) -> &'static str {
    match tag {
        Tag::Cluster => "cluster",
        Tag::Execution => "execution",
        Tag::Attempt => "attempt",
        Tag::Idempotency => "idempotency",
        Tag::Timer => "timer",
        Tag::Watermark => "watermark",
        Tag::Node => "node",
        Tag::CronJob => "cron job",
        Tag::CronTimer => "cron timer",
        Tag::Definition => "definition",
        Tag::ByStatus => "by status",
        Tag::ByDefinition => "by definition",
        Tag::ByTime => "by time",
        Tag::PartitionOwner => "partition owner",
        Tag::PartitionExpiry => "partition expiry",
        Tag::Ready => "ready",
        Tag::ReadySignal => "ready signal",
        Tag::ClaimReceipt => "claim receipt",
        Tag::StatusCount => "status count",
        Tag::Quarantine => "quarantine",
        Tag::CronWatermark => "cron watermark",
        Tag::ApiKey => "api key",
        Tag::Audit => "audit",
    }
}

#[cfg(test)]
mod tests;
