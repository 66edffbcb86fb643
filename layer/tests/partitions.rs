//! Leased partitions: renewals never abort the owner's fenced work (owner/epoch and expiry
//! live in different keys), while a change of owner still fences it; batched renewals keep
//! partial success.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kairos_layer::env::{Rng, SharedClock, Timestamp, TokioClock};
use kairos_layer::keys::{Keyspace, Space};
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use kairos_layer::kv::{Error as KvError, RunObserver};
use kairos_layer::ops::submit::SubmitRequest;
use kairos_layer::ops::{ClusterParams, Error, Scheduler};

use common::TestOps;

const NS: &str = "default";
const DEF: &str = "name: job\nversion: 1\nexecution:\n  type: command\n  command: [\"true\"]\n";

/// Counts the retries of every `run` on the database.
#[derive(Default)]
struct Retries(AtomicUsize);

impl RunObserver for Retries {
    fn committed(&self, _: Duration) {}
    fn retrying(&self, _: &KvError) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

async fn setup(retries: Arc<Retries>) -> (Scheduler, SharedClock) {
    let clock: SharedClock =
        Arc::new(TokioClock::starting_at(Timestamp::from_millis(1_790_000_000_000)));
    // Every read takes 1 ms: a fire transaction spans several renewals' worth of time.
    let faults = FaultConfig { read_round_trip: Duration::from_millis(1), ..FaultConfig::none() };
    let db = MemoryDatabase::open(clock.clone(), Rng::seeded(3), faults).with_observer(retries);
    let params = ClusterParams { shard_count: 4, bucket_width_ms: 60_000, ready_partitions: 2 };
    let sched = Scheduler::open(db, Keyspace::new("p"), clock.clone(), Rng::seeded(4), params)
        .await
        .unwrap();
    sched
        .register_definition(NS, kairos_layer::definition::parse_definition(DEF).unwrap(), "test")
        .await
        .unwrap();
    (sched, clock)
}

fn due_now(clock: &SharedClock, i: usize) -> SubmitRequest {
    SubmitRequest {
        namespace: NS.into(),
        definition: "job".into(),
        definition_version: 1,
        inputs: serde_json::json!({}),
        execute_at_ms: clock.now().as_millis(),
        idempotency_key: Some(format!("k{i}")),
        delay_ms: None,
        traceparent: None,
    }
}

#[tokio::test(start_paused = true)]
async fn renewals_never_abort_the_owners_fire_transactions() {
    let retries = Arc::new(Retries::default());
    let (sched, clock) = setup(retries.clone()).await;
    let held: Vec<(Space, u32, u64)> = sched
        .acquire_partitions(&[(Space::Executions, 0), (Space::Executions, 1)], "n1", 10_000, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.map(|l| (l.space, l.partition, l.epoch)).unwrap())
        .collect();
    let (_, _, epoch0) = held[0];
    // Renew both leases every millisecond while the owner fires shard 0 again and again.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renewer = {
        let (sched, held, stop, clock) = (sched.clone(), held.clone(), stop.clone(), clock.clone());
        tokio::spawn(async move {
            let mut renewals = 0;
            while !stop.load(Ordering::Relaxed) {
                let out = sched.renew_partitions(&held, "n1", 10_000).await.unwrap();
                assert!(out.iter().all(|r| r.is_ok()));
                renewals += 1;
                clock.sleep(Duration::from_millis(1)).await;
            }
            renewals
        })
    };
    let mut fired = 0;
    for round in 0..40 {
        let reqs: Vec<SubmitRequest> = (0..20).map(|i| due_now(&clock, round * 20 + i)).collect();
        sched.submit_batch(reqs.into_iter().map(Ok).collect()).await.unwrap();
        let now = clock.now().as_millis();
        let before = retries.0.load(Ordering::Relaxed);
        let out = sched.fire_due(0, epoch0, now, 1_000, &Default::default()).await.unwrap();
        fired += out.fired.len();
        assert_eq!(
            retries.0.load(Ordering::Relaxed),
            before,
            "round {round}: a fire transaction was aborted and retried during renewals"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let renewals = renewer.await.unwrap();
    println!(
        "{fired} timers fired in 40 fire transactions, {renewals} renewals meanwhile, 0 aborted"
    );
    assert!(fired > 0 && renewals >= 40, "fired {fired}, renewals {renewals}");
}

#[tokio::test(start_paused = true)]
async fn a_takeover_still_fences_the_old_owner() {
    let (sched, clock) = setup(Arc::default()).await;
    let l = sched.acquire_shard(0, "n1", 2_000).await.unwrap();
    sched.submit(due_now(&clock, 0)).await.unwrap();
    // n1's lease runs out unrenewed; n2 may take over only after the skew margin too.
    clock.sleep(Duration::from_millis(2_100)).await;
    let held = sched
        .acquire_partitions(&[(Space::Executions, 0)], "n2", 10_000, 500)
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert!(matches!(held, Err(Error::LeaseHeld { .. })), "inside the skew margin: {held:?}");
    clock.sleep(Duration::from_millis(500)).await;
    let taken = sched
        .acquire_partitions(&[(Space::Executions, 0)], "n2", 10_000, 500)
        .await
        .unwrap()
        .pop()
        .unwrap()
        .unwrap();
    assert_eq!(taken.epoch, l.epoch + 1);
    let now = clock.now().as_millis();
    let e = sched.fire_due(0, l.epoch, now, 100, &Default::default()).await.unwrap_err();
    assert!(matches!(e, Error::OwnershipLost { .. }), "{e}");
    // The old owner's renewal is refused, the new owner's fire goes through.
    let r = sched.renew_partitions(&[(Space::Executions, 0, l.epoch)], "n1", 10_000).await;
    assert!(matches!(r.unwrap().pop().unwrap(), Err(Error::OwnershipLost { .. })));
    sched.fire_due(0, taken.epoch, now, 100, &Default::default()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_batched_round_keeps_what_succeeded() {
    let (sched, _) = setup(Arc::default()).await;
    sched.acquire_shard(1, "other", 60_000).await.unwrap();
    let wanted: Vec<(Space, u32)> = (0..4).map(|p| (Space::Executions, p)).collect();
    let out = sched.acquire_partitions(&wanted, "n1", 10_000, 0).await.unwrap();
    let taken: Vec<u32> = out.iter().flatten().map(|l| l.partition).collect();
    assert_eq!(taken, vec![0, 2, 3], "partition 1 is held by another node; the rest are taken");
    assert!(matches!(&out[1], Err(Error::LeaseHeld { owner, .. }) if owner == "other"));
    // Cron shards are a space of their own, leased the same way.
    let cron = sched.acquire_partitions(&[(Space::Cron, 1)], "n1", 10_000, 0).await.unwrap();
    assert!(cron[0].is_ok(), "cron shard 1 is free although execution shard 1 is not");
    let leases = sched.partition_leases(Space::Executions).await.unwrap();
    assert_eq!(leases.len(), 4);
    assert_eq!(sched.partition_leases(Space::Cron).await.unwrap().len(), 1);
}
