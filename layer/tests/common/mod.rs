//! Shared harness of the scheduler-operation tests: a memory backend (optionally with fault
//! injection), a hand-driven clock, and invariant checks over the whole keyspace.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kairos_layer::env::{ManualClock, Rng, SharedClock, Timestamp};
use kairos_layer::keys::Space;
use kairos_layer::keys::{Keyspace, Tag};
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use kairos_layer::kv::{Database, KvDatabase, RunOptions};
use kairos_layer::ops::claim::{ClaimSlot, Claimed};
use kairos_layer::ops::leases::PartitionLease;
use kairos_layer::ops::records::merge_spec;
use kairos_layer::ops::submit::SubmitRequest;
use kairos_layer::ops::worker::{Beat, HeartbeatOutcome, Outcome, Report};
use kairos_layer::ops::{ClusterParams, Error, Result, Scheduler};
use kairos_proto::storage::v1::{
    Execution, ExecutionError, ExecutionStatus, JobDefinition, TimerKind,
};
use prost::Message;

pub const NS: &str = "default";
pub const T0: i64 = 1_790_000_000_000;
pub const SHARDS: u32 = 4;
pub const NODE: &str = "node-a";

pub struct World {
    pub sched: Scheduler,
    pub db: Database,
    pub ks: Keyspace,
    pub clock: ManualClock,
    /// Epoch held by NODE per shard.
    pub epochs: Vec<u64>,
    /// The backend under `db`, for a second handle on the same store.
    pub store: Arc<dyn KvDatabase>,
    pub params: ClusterParams,
}

pub const REPORT_YAML: &str = r#"
name: report
version: 1
inputs:
  dataset_uri: uri
  report_date: date
outputs:
  report_uri: string
retry:
  max_attempts: 3
  base_delay: 1s
  max_delay: 10s
timeouts:
  lease: 30s
execution:
  type: command
  command: ["generate"]
"#;

pub fn report_definition() -> JobDefinition {
    kairos_layer::definition::parse_definition(REPORT_YAML).expect("test definition parses")
}

pub async fn world(seed: u64, faults: FaultConfig) -> World {
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let shared: SharedClock = Arc::new(clock.clone());
    // As MemoryDatabase::open, keeping the backend.
    let rng = Rng::seeded(seed);
    let store: Arc<dyn KvDatabase> =
        Arc::new(MemoryDatabase::with_faults(shared.clone(), rng.fork(), faults));
    let db = Database::new(store.clone(), shared.clone(), rng).with_options(RunOptions {
        backoff_initial: Duration::ZERO,
        backoff_max: Duration::ZERO,
        ..RunOptions::default()
    });
    let ks = Keyspace::new("test");
    let params =
        ClusterParams { shard_count: SHARDS, bucket_width_ms: 60_000, ready_partitions: 2 };
    let sched = Scheduler::open(db.clone(), ks.clone(), shared, Rng::seeded(seed ^ 0xabc), params)
        .await
        .expect("cluster opens");
    sched.register_definition(NS, report_definition(), "test").await.expect("definition registers");
    let mut epochs = Vec::new();
    for shard in 0..SHARDS {
        epochs.push(sched.acquire_shard(shard, NODE, 3_600_000).await.expect("lease").epoch);
    }
    World { sched, db, ks, clock, epochs, store, params }
}

/// The cluster parameters of a store on a real file (`open_file`).
pub const FILE_PARAMS: ClusterParams =
    ClusterParams { shard_count: 4, bucket_width_ms: 60_000, ready_partitions: 2 };

/// Opens (creating it if need be) an embedded store on the file at `path`, as a node would:
/// a format upgrade or index migration runs here.
pub async fn open_file(path: &std::path::Path, clock: &ManualClock) -> (Database, Scheduler) {
    let shared: SharedClock = Arc::new(clock.clone());
    let db = kairos_layer::kv::embedded::EmbeddedDatabase::open_database(
        path,
        shared.clone(),
        Rng::seeded(1),
    )
    .unwrap();
    let ks = Keyspace::new("test");
    let sched = Scheduler::open(db.clone(), ks, shared, Rng::seeded(2), FILE_PARAMS)
        .await
        .expect("the store opens");
    (db, sched)
}

pub fn request(key: Option<&str>, execute_at_ms: i64) -> SubmitRequest {
    SubmitRequest {
        namespace: NS.into(),
        definition: "report".into(),
        definition_version: 1,
        inputs: serde_json::json!({"dataset_uri": "s3://datasets/orders", "report_date": "2026-08-12"}),
        execute_at_ms,
        idempotency_key: key.map(str::to_string),
        delay_ms: None,
        traceparent: None,
    }
}

impl World {
    pub fn now_ms(&self) -> i64 {
        use kairos_layer::env::Clock;
        self.clock.now().as_millis()
    }

    pub fn advance_ms(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
    }

    /// Fires everything due on every shard at the current time.
    pub async fn fire_all(&self) -> usize {
        let mut n = 0;
        for shard in 0..SHARDS {
            loop {
                let out = self
                    .sched
                    .fire_due(
                        shard,
                        self.epochs[shard as usize],
                        self.now_ms(),
                        100,
                        &Default::default(),
                    )
                    .await
                    .expect("fire_due");
                n += out.fired.len();
                if !out.more {
                    break;
                }
            }
        }
        n
    }

    /// Every key and value of the cluster.
    pub async fn dump(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let range =
            kairos_layer::kv::RangeOption::prefix(&kairos_layer::tuple::pack(&("kairos", "test")));
        let rows = self
            .db
            .run(|tx| {
                let range = range.clone();
                async move { tx.get_range(&range, false).await }
            })
            .await
            .expect("dump");
        rows.into_iter().map(|kv| (kv.key.to_vec(), kv.value.to_vec())).collect()
    }

    /// Checks the cross-record invariants of the whole keyspace.
    pub async fn check_invariants(&self) {
        let dump = self.dump().await;
        let ks = &self.ks;
        let in_tag = |tag: Tag| {
            let r = ks.subspace_range(tag);
            dump.range(r.begin..r.end).map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>()
        };
        let mut watermarks = BTreeMap::new();
        for shard in 0..SHARDS {
            let v = dump.get(&ks.watermark(shard)).expect("every shard has a watermark");
            watermarks.insert(shard, i64::from_be_bytes(v[..8].try_into().unwrap()));
        }
        let executions: Vec<Execution> = in_tag(Tag::Execution)
            .iter()
            .map(|(_, v)| {
                let mut e = Execution::decode(v.as_slice()).unwrap();
                if e.spec_apart {
                    let spec = dump.get(&ks.by_time(&e.namespace, e.execute_at_ms, &e.id));
                    merge_spec(&mut e, spec.map(|v| v.as_slice())).expect("its spec");
                }
                e
            })
            .collect();
        let by_id: BTreeMap<String, &Execution> =
            executions.iter().map(|e| (e.id.clone(), e)).collect();
        check_timers(ks, &in_tag(Tag::Timer), &watermarks, &by_id);
        let ready: Vec<_> =
            in_tag(Tag::Ready).iter().map(|(k, _)| ks.parse_ready(k).unwrap()).collect();
        for r in &ready {
            let e = by_id.get(&r.execution_id).expect("ready entry of a known execution");
            assert_eq!(e.status(), ExecutionStatus::Ready, "ready entry of a non-READY execution");
            assert_eq!(e.ready_at_ms, r.ready_at_ms);
        }
        let counts = self.sched.status_counts(NS).await.unwrap();
        for (status, n) in counts {
            let actual = executions.iter().filter(|e| e.status() == status).count() as i64;
            assert_eq!(n, actual, "status count of {status:?}");
        }
        for e in &executions {
            check_execution(ks, &dump, &ready, e);
        }
    }
}

/// One-item forms of the scheduler's batched operations, as tests use them (the node only ever
/// uses the batched ones).
#[allow(async_fn_in_trait)]
pub trait TestOps {
    /// Claims up to `max` READY executions of `queue` for one worker.
    async fn claim_for(
        &self,
        ns: &str,
        queue: &str,
        worker_id: &str,
        max: usize,
        lease_ms: Option<u64>,
    ) -> Result<Vec<Claimed>>;
    /// Applies one result.
    async fn report_one(
        &self,
        ns: &str,
        id: &str,
        token: u64,
        outcome: Outcome,
    ) -> Result<Execution>;
    /// Completes an attempt.
    async fn complete(
        &self,
        ns: &str,
        id: &str,
        token: u64,
        output_json: Vec<u8>,
        output_reference: String,
    ) -> Result<Execution> {
        let outcome = Outcome::Success { output_json, output_reference };
        self.report_one(ns, id, token, outcome).await
    }
    /// Fails an attempt.
    async fn fail(
        &self,
        ns: &str,
        id: &str,
        token: u64,
        error: ExecutionError,
    ) -> Result<Execution> {
        self.report_one(ns, id, token, Outcome::Failure(error)).await
    }
    /// Releases an attempt unstarted.
    async fn release(&self, ns: &str, id: &str, token: u64) -> Result<Execution> {
        self.report_one(ns, id, token, Outcome::Release).await
    }
    /// Extends one attempt's lease.
    async fn heartbeat_one(&self, ns: &str, id: &str, token: u64) -> Result<HeartbeatOutcome>;
    /// Takes one execution shard (no clock-skew margin).
    async fn acquire_shard(
        &self,
        shard: u32,
        node: &str,
        duration_ms: i64,
    ) -> Result<PartitionLease>;
    /// Renews one execution shard's lease held at `epoch`.
    async fn renew_shard(
        &self,
        shard: u32,
        node: &str,
        epoch: u64,
        duration_ms: i64,
    ) -> Result<PartitionLease>;
    /// Releases one execution shard's lease held at `epoch`.
    async fn release_shard(&self, shard: u32, node: &str, epoch: u64) -> Result<()>;
}

fn one<T>(mut v: Vec<Result<T>>) -> Result<T> {
    v.pop().unwrap_or_else(|| Err(Error::Corrupt("result missing".into())))
}

impl TestOps for Scheduler {
    async fn claim_for(
        &self,
        ns: &str,
        queue: &str,
        worker_id: &str,
        max: usize,
        lease_ms: Option<u64>,
    ) -> Result<Vec<Claimed>> {
        let slots = [ClaimSlot { worker_id: worker_id.to_string(), max, lease_ms }];
        Ok(self.claim(ns, queue, &slots).await?.per_slot.pop().unwrap_or_default())
    }

    async fn report_one(
        &self,
        ns: &str,
        id: &str,
        token: u64,
        outcome: Outcome,
    ) -> Result<Execution> {
        let r = Report {
            namespace: ns.into(),
            execution_id: id.into(),
            token,
            outcome,
            worker_id: None,
            queue: None,
        };
        one(self.report(vec![Ok(r)]).await?)
    }

    async fn heartbeat_one(&self, ns: &str, id: &str, token: u64) -> Result<HeartbeatOutcome> {
        let beat = Beat {
            namespace: ns.into(),
            execution_id: id.into(),
            token,
            worker_id: None,
            queue: None,
        };
        one(self.heartbeat(vec![beat]).await?)
    }

    async fn acquire_shard(
        &self,
        shard: u32,
        node: &str,
        duration_ms: i64,
    ) -> Result<PartitionLease> {
        one(self.acquire_partitions(&[(Space::Executions, shard)], node, duration_ms, 0).await?)
    }

    async fn renew_shard(
        &self,
        shard: u32,
        node: &str,
        epoch: u64,
        duration_ms: i64,
    ) -> Result<PartitionLease> {
        one(self.renew_partitions(&[(Space::Executions, shard, epoch)], node, duration_ms).await?)
    }

    async fn release_shard(&self, shard: u32, node: &str, epoch: u64) -> Result<()> {
        self.release_partitions(&[(Space::Executions, shard, epoch)], node).await
    }
}

type Dump = BTreeMap<Vec<u8>, Vec<u8>>;

/// Timers: never below the watermark, always the execution's current timer.
fn check_timers(
    ks: &Keyspace,
    timers: &[(Vec<u8>, Vec<u8>)],
    watermarks: &BTreeMap<u32, i64>,
    by_id: &BTreeMap<String, &Execution>,
) {
    for (k, _) in timers {
        let t = ks.parse_timer(k).unwrap();
        assert!(
            t.bucket >= watermarks[&t.shard],
            "timer {t:?} below watermark {}",
            watermarks[&t.shard]
        );
        if t.kind == TimerKind::LeaseChecks as i32 {
            continue; // shared: its members may have finished since (check_execution)
        }
        let e = by_id.get(&t.execution_id).unwrap_or_else(|| panic!("orphan timer {t:?}"));
        let r =
            e.timer.as_ref().unwrap_or_else(|| panic!("timer {t:?} of an execution without one"));
        assert_eq!(
            (r.fire_at_ms, r.kind, r.bucket),
            (t.fire_at_ms, t.kind, t.bucket),
            "stale timer"
        );
    }
}

/// One execution against what the keyspace holds of it: its timer, ready entry, attempts and
/// indexes.
fn check_execution(
    ks: &Keyspace,
    dump: &Dump,
    ready: &[kairos_layer::keys::ReadyKey],
    e: &Execution,
) {
    let timer_kind = e.timer.as_ref().map(|t| t.kind());
    let want_timer = match e.status() {
        ExecutionStatus::Scheduled => Some(TimerKind::Due),
        ExecutionStatus::RetryWait => Some(TimerKind::Retry),
        ExecutionStatus::Running => Some(TimerKind::LeaseCheck),
        _ => None,
    };
    // A first lease check may be shared (LEASE_CHECKS): its key names the group, which lists
    // this attempt.
    let shared = timer_kind == Some(TimerKind::LeaseChecks);
    let timer_kind = if shared { Some(TimerKind::LeaseCheck) } else { timer_kind };
    assert_eq!(timer_kind, want_timer, "execution {} in {:?}", e.id, e.status());
    if let Some(t) = &e.timer {
        let key = ks.timer(&kairos_layer::keys::TimerKey {
            bucket: t.bucket,
            shard: e.shard,
            fire_at_ms: t.fire_at_ms,
            execution_id: if shared { t.group.clone() } else { e.id.clone() },
            kind: t.kind,
        });
        let entry = dump.get(&key).unwrap_or_else(|| panic!("timer of {} missing", e.id));
        if shared {
            use prost::Message as _;
            let entry = kairos_proto::storage::v1::TimerEntry::decode(&entry[..]).unwrap();
            let listed = entry
                .members
                .iter()
                .any(|m| m.execution_id == e.id && m.fencing_token == e.fencing_token);
            assert!(listed, "{} is not a member of its shared lease check", e.id);
        }
    }
    let queued = ready.iter().filter(|r| r.execution_id == e.id).count();
    assert_eq!(
        queued,
        usize::from(e.status() == ExecutionStatus::Ready),
        "ready entries of {}",
        e.id
    );
    let policy = e.retry_policy.unwrap_or_default();
    assert!(
        e.attempt_count - e.attempt_base - e.attempts_released <= policy.max_attempts,
        "attempts over the maximum"
    );
    // Attempt records are written when attempts end; a running one lives on the
    // execution.
    // Attempt records are written when attempts end unsuccessfully; a running one and a
    // successful one live on the execution.
    let attempts = dump.range(ks.attempts(NS, &e.id).begin..ks.attempts(NS, &e.id).end).count();
    let on_record =
        u32::from(matches!(e.status(), ExecutionStatus::Running | ExecutionStatus::Succeeded));
    assert_eq!(attempts as u32 + on_record, e.attempt_count, "attempt records of {}", e.id);
    let statuses: Vec<i32> = (0..8)
        .filter(|s| dump.contains_key(&ks.by_status(NS, *s, e.execute_at_ms, &e.id)))
        .collect();
    let want: Vec<i32> =
        if kairos_layer::ops::records::is_indexed(e.status) { vec![e.status] } else { Vec::new() };
    assert_eq!(statuses, want, "status index of {}", e.id);
}
