//! Operations whose commit comes back `commit_unknown_result` although it applied, with the
//! store moving on before the retry reads it (as in a FoundationDB region failover).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::*;
use kairos_layer::env::{BoxFuture, Rng, SharedClock};
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::kv::{
    CommitInfo, Database, Error, KeyValue, KvDatabase, KvTransaction, RangeOption, Result, Watch,
};
use kairos_layer::ops::Scheduler;
use kairos_proto::storage::v1::{ExecutionError, ExecutionStatus};

type Hook = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// A handle on a store whose next commit, once armed, applies, then runs a hook (someone
/// else's transactions), then reports `commit_unknown_result`.
struct Unknown {
    inner: Arc<dyn KvDatabase>,
    armed: Arc<AtomicBool>,
    hook: Arc<Mutex<Option<Hook>>>,
}

impl KvDatabase for Unknown {
    fn begin(&self) -> Result<Arc<dyn KvTransaction>> {
        Ok(Arc::new(UnknownTxn {
            inner: self.inner.begin()?,
            armed: self.armed.clone(),
            hook: self.hook.clone(),
        }))
    }
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    fn close(&self) -> BoxFuture<'_, ()> {
        self.inner.close()
    }
}

struct UnknownTxn {
    inner: Arc<dyn KvTransaction>,
    armed: Arc<AtomicBool>,
    hook: Arc<Mutex<Option<Hook>>>,
}

impl KvTransaction for UnknownTxn {
    fn read_version(&self) -> BoxFuture<'_, Result<u64>> {
        self.inner.read_version()
    }
    fn get<'a>(&'a self, key: &'a [u8], snapshot: bool) -> BoxFuture<'a, Result<Option<Bytes>>> {
        self.inner.get(key, snapshot)
    }
    fn get_range<'a>(
        &'a self,
        range: &'a RangeOption,
        snapshot: bool,
    ) -> BoxFuture<'a, Result<Vec<KeyValue>>> {
        self.inner.get_range(range, snapshot)
    }
    fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.inner.set(key, value)
    }
    fn clear(&self, key: &[u8]) -> Result<()> {
        self.inner.clear(key)
    }
    fn clear_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.inner.clear_range(begin, end)
    }
    fn atomic_add(&self, key: &[u8], param: &[u8]) -> Result<()> {
        self.inner.atomic_add(key, param)
    }
    fn set_versionstamped_key(&self, key: &[u8], offset: usize, value: &[u8]) -> Result<()> {
        self.inner.set_versionstamped_key(key, offset, value)
    }
    fn set_versionstamped_value(&self, key: &[u8], value: &[u8], offset: usize) -> Result<()> {
        self.inner.set_versionstamped_value(key, value, offset)
    }
    fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.inner.add_read_conflict_range(begin, end)
    }
    fn watch(&self, key: &[u8]) -> Result<Watch> {
        self.inner.watch(key)
    }
    fn approximate_size(&self) -> usize {
        self.inner.approximate_size()
    }
    fn commit(&self) -> BoxFuture<'_, Result<CommitInfo>> {
        Box::pin(async move {
            if !self.armed.swap(false, Ordering::SeqCst) {
                return self.inner.commit().await;
            }
            self.inner.commit().await.expect("the armed commit applies");
            let hook = self.hook.lock().unwrap().take();
            if let Some(hook) = hook {
                hook().await;
            }
            Err(Error::CommitUnknownResult)
        })
    }
}

/// A second scheduler on `w`'s store whose commits apply; once `armed`, the next one also runs
/// `hook` and reports unknown-result.
async fn flaky_handle(
    w: &World,
    seed: u64,
) -> (Scheduler, Arc<AtomicBool>, Arc<Mutex<Option<Hook>>>) {
    let armed = Arc::new(AtomicBool::new(false));
    let hook = Arc::new(Mutex::new(None));
    let store = Unknown { inner: w.store.clone(), armed: armed.clone(), hook: hook.clone() };
    let clock: SharedClock = Arc::new(w.clock.clone());
    let db = Database::new(Arc::new(store), clock.clone(), Rng::seeded(seed));
    let flaky = Scheduler::open(db, w.ks.clone(), clock, Rng::seeded(seed + 1), w.params)
        .await
        .expect("a second handle opens");
    (flaky, armed, hook)
}

/// A FAILED execution of `w`, and a second scheduler on the same store whose next commit
/// (once armed) applies, runs the hook, and reports unknown-result.
async fn failed_and_a_flaky_handle(
    w: &World,
) -> (String, Scheduler, Arc<AtomicBool>, Arc<Mutex<Option<Hook>>>) {
    let id = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    w.fire_all().await;
    let c = w.sched.claim_for(NS, "report", "w", 1, None).await.unwrap();
    let error = ExecutionError { message: "no".into(), retryable: false, code: String::new() };
    w.sched.fail(NS, &id, c[0].attempt.fencing_token, error).await.unwrap();
    assert_eq!(w.sched.get(NS, &id).await.unwrap().status(), ExecutionStatus::Failed);
    let (flaky, armed, hook) = flaky_handle(w, 98).await;
    (id, flaky, armed, hook)
}

/// Simulation seed 45: a replay whose commit applied but came back unknown-result was retried
/// after a worker had claimed the execution again; the retry found it RUNNING and answered
/// FAILED_PRECONDITION for a replay that had happened.
#[tokio::test]
async fn a_replay_applied_under_an_unknown_result_is_answered_as_done() {
    let w = world(45, FaultConfig::none()).await;
    let (id, flaky, armed, hook) = failed_and_a_flaky_handle(&w).await;
    let sched = w.sched.clone();
    *hook.lock().unwrap() = Some(Box::new(move || {
        Box::pin(async move {
            let c = sched.claim_for(NS, "report", "w2", 1, None).await.unwrap();
            assert_eq!(c.len(), 1, "the replayed execution is claimed before the retry");
        })
    }));
    armed.store(true, Ordering::SeqCst);
    let e = flaky.replay(NS, &id, "test").await.expect("the replay took effect: it is answered so");
    assert_eq!(e.status(), ExecutionStatus::Running, "as the retry found it");
    assert_eq!(e.attempt_base, 1);
    assert_eq!(e.attempt_count, 2, "replayed once: one more attempt, not two replays");
    w.check_invariants().await;
}

/// The retry of a replay that applied must not replay again when the replayed attempt has
/// already failed (FAILED again, one attempt later).
#[tokio::test]
async fn a_replay_applied_under_an_unknown_result_is_not_applied_twice() {
    let w = world(46, FaultConfig::none()).await;
    let (id, flaky, armed, hook) = failed_and_a_flaky_handle(&w).await;
    let sched = w.sched.clone();
    let id2 = id.clone();
    *hook.lock().unwrap() = Some(Box::new(move || {
        Box::pin(async move {
            let c = sched.claim_for(NS, "report", "w2", 1, None).await.unwrap();
            let error =
                ExecutionError { message: "again".into(), retryable: false, code: String::new() };
            sched.fail(NS, &id2, c[0].attempt.fencing_token, error).await.unwrap();
        })
    }));
    armed.store(true, Ordering::SeqCst);
    let e = flaky.replay(NS, &id, "test").await.expect("the replay took effect");
    assert_eq!(e.status(), ExecutionStatus::Failed, "its attempt failed; not READY again");
    assert_eq!((e.attempt_base, e.attempt_count), (1, 2));
    // A replay asked for now is a new one.
    let e = w.sched.replay(NS, &id, "test").await.unwrap();
    assert_eq!((e.status(), e.attempt_base), (ExecutionStatus::Ready, 2));
    w.check_invariants().await;
}

/// A fire that matched executions to offered slots, whose commit applied but came back
/// unknown-result, hands the same executions to the same slots on its retry (from its
/// receipt), and fires nothing twice.
#[tokio::test]
async fn a_matched_fire_applied_under_an_unknown_result_returns_the_same_matches() {
    use kairos_layer::ops::claim::ClaimSlot;
    use kairos_layer::ops::fire::Offer;
    let w = world(47, FaultConfig::none()).await;
    let id = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    let shard = w.sched.get(NS, &id).await.unwrap().shard;
    let (flaky, armed, _) = flaky_handle(&w, 96).await;
    armed.store(true, Ordering::SeqCst);
    let mut offer = Offer::new();
    let slots = vec![ClaimSlot { worker_id: "w1".into(), max: 1, lease_ms: None }];
    offer.insert((NS.into(), "report".into()), slots);
    let out = flaky.fire_due(shard, w.epochs[shard as usize], w.now_ms(), 100, &offer).await;
    let out = out.expect("the fire took effect");
    assert_eq!(out.matched.len(), 1, "the committed try's match, from the receipt");
    assert_eq!((out.matched[0].claim.execution.id.as_str(), out.matched[0].slot), (id.as_str(), 0));
    assert_eq!(out.matched[0].claim.execution.worker_id, "w1");
    let e = w.sched.get(NS, &id).await.unwrap();
    assert_eq!((e.status(), e.attempt_count), (ExecutionStatus::Running, 1), "fired once");
    w.check_invariants().await;
}

/// The same for a pre-fire: its retry after an applied commit that came back unknown-result
/// hands out what the committed try started (from its receipt), and starts nothing twice.
#[tokio::test]
async fn a_prefire_applied_under_an_unknown_result_returns_the_same_matches() {
    use kairos_layer::ops::claim::ClaimSlot;
    use kairos_layer::ops::fire::Offer;
    let w = world(48, FaultConfig::none()).await;
    let id = w.sched.submit(request(None, T0 + 10)).await.unwrap().execution.id;
    let shard = w.sched.get(NS, &id).await.unwrap().shard;
    let (flaky, armed, _) = flaky_handle(&w, 94).await;
    armed.store(true, Ordering::SeqCst);
    let mut offer = Offer::new();
    let slots = vec![ClaimSlot { worker_id: "w1".into(), max: 1, lease_ms: None }];
    offer.insert((NS.into(), "report".into()), slots);
    let (now, epoch) = (w.now_ms(), w.epochs[shard as usize]);
    let out = flaky.prefire(shard, epoch, now, now + 20, &offer).await.expect("it took effect");
    assert_eq!(out.matched.len(), 1, "the committed try's start, from the receipt");
    assert_eq!((out.matched[0].claim.execution.id.as_str(), out.matched[0].slot), (id.as_str(), 0));
    let e = w.sched.get(NS, &id).await.unwrap();
    assert_eq!((e.status(), e.attempt_count), (ExecutionStatus::Running, 1), "started once");
    assert_eq!(e.started_at_ms, T0 + 10);
    assert!(!armed.load(Ordering::SeqCst), "the commit came back unknown-result");
    w.check_invariants().await;
}
