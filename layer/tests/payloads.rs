//! Batches with realistic payloads: 32 KiB inputs and 32 KiB outputs. Every state change
//! rewrites an execution's whole record, so a batch bounded by count alone passes the store's
//! 10 MB transaction limit (`transaction_too_large`, not retryable) long before its count
//! bound. Each batch here must be split to fit [`TRANSACTION_BUDGET_BYTES`] and complete — the
//! memory backend enforces the size limit as FoundationDB does. And one caller's bad result,
//! merged with others', fails alone.

use std::sync::Arc;

use kairos_layer::env::{Rng, SharedClock, Timestamp, TokioClock};
use kairos_layer::keys::{Keyspace, Space};
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use kairos_layer::limits::{ERROR_CODE_BYTES_MAX, OUTPUT_BYTES_MAX, SUBMIT_BATCH_MAX};
use kairos_layer::ops::claim::{ClaimSlot, Claimed};
use kairos_layer::ops::submit::SubmitRequest;
use kairos_layer::ops::worker::{Beat, Outcome, Report};
use kairos_layer::ops::{ClusterParams, Error, Scheduler};
use kairos_proto::storage::v1::{ExecutionError, ExecutionStatus};

const NS: &str = "default";
/// An input just under the 32 KiB bound once encoded.
const INPUT_BYTES: usize = 32 * 1024 - 64;

const DEF: &str = r#"
name: big
version: 1
inputs:
  blob: string
timeouts:
  lease: 600s
execution:
  type: command
  command: ["true"]
"#;

async fn scheduler() -> (Scheduler, SharedClock) {
    let clock: SharedClock =
        Arc::new(TokioClock::starting_at(Timestamp::from_millis(1_790_000_000_000)));
    let db = MemoryDatabase::open(clock.clone(), Rng::seeded(5), FaultConfig::none());
    let params = ClusterParams { shard_count: 4, bucket_width_ms: 60_000, ready_partitions: 4 };
    let sched =
        Scheduler::open(db, Keyspace::new("payloads"), clock.clone(), Rng::seeded(6), params)
            .await
            .expect("opens");
    let def = kairos_layer::definition::parse_definition(DEF).unwrap();
    sched.register_definition(NS, def, "test").await.unwrap();
    (sched, clock)
}

fn request(now: i64, i: usize) -> SubmitRequest {
    let blob = format!("{i:08}{}", "x".repeat(INPUT_BYTES - 8));
    SubmitRequest {
        namespace: NS.into(),
        definition: "big".into(),
        definition_version: 1,
        inputs: serde_json::json!({ "blob": blob }),
        execute_at_ms: now,
        idempotency_key: Some(format!("k{i}")),
        delay_ms: None,
        traceparent: None,
    }
}

/// Submits `n` executions with 32 KiB inputs, due now, in one call; fires them all.
async fn submit_and_fire(sched: &Scheduler, clock: &SharedClock, n: usize) {
    let now = clock.now().as_millis();
    let reqs = (0..n).map(|i| Ok(request(now, i))).collect();
    let out = sched.submit_batch(reqs).await.expect("a batch of 32 KiB inputs commits");
    assert!(out.iter().all(|r| r.as_ref().is_ok_and(|s| s.created)), "{:?}", out.first());
    let mut fired = 0;
    for shard in 0..4 {
        let lease = sched.acquire_partitions(&[(Space::Executions, shard)], "n1", 600_000, 0).await;
        let epoch = lease.unwrap()[0].as_ref().unwrap().epoch;
        loop {
            let out = sched
                .fire_due(shard, epoch, now, 1_000, &Default::default())
                .await
                .expect("a fire of 32 KiB records commits");
            fired += out.fired.len();
            if !out.more {
                break;
            }
        }
    }
    assert_eq!(fired, n);
}

/// Claims until `n` are claimed, for four workers of 250 credits each; every claim commits.
async fn claim_all(sched: &Scheduler, n: usize) -> Vec<Claimed> {
    let mut claimed = Vec::new();
    let mut claims = 0;
    while claimed.len() < n {
        let slots: Vec<ClaimSlot> = (0..4)
            .map(|i| ClaimSlot { worker_id: format!("w{i}"), max: 250, lease_ms: None })
            .collect();
        let out = sched.claim(NS, "big", &slots).await.expect("a claim of 32 KiB records commits");
        let got: Vec<Claimed> = out.per_slot.into_iter().flatten().collect();
        assert!(!got.is_empty(), "a claim takes at least one while any is ready");
        claimed.extend(got);
        claims += 1;
    }
    assert_eq!(claimed.len(), n);
    // A claim rewrites the executions' states only, never their inputs (kept apart, written
    // once at submit): a thousand executions of 32 KiB inputs are claimed in one transaction
    // (before, a claim rewrote every input and was split into four or more).
    assert_eq!(claims, n.div_ceil(1_000), "claims of {n} records with 32 KiB inputs");
    claimed
}

fn beat(c: &Claimed) -> Beat {
    Beat {
        namespace: NS.into(),
        execution_id: c.execution.id.clone(),
        token: c.attempt.fencing_token,
        worker_id: None,
        queue: None,
    }
}

fn success(c: &Claimed) -> Report {
    Report {
        namespace: NS.into(),
        execution_id: c.execution.id.clone(),
        token: c.attempt.fencing_token,
        outcome: Outcome::Success {
            output_json: format!("\"{}\"", "y".repeat(OUTPUT_BYTES_MAX - 2)).into_bytes(),
            output_reference: String::new(),
        },
        worker_id: None,
        queue: None,
    }
}

/// 1,000 executions with 32 KiB inputs (~33 MB of records): a submit batch, fires, claims
/// for workers with 1,000 credits, a heartbeat batch and a result batch with 32 KiB outputs
/// all commit, each split to fit the transaction budget.
#[tokio::test(start_paused = true)]
async fn full_batches_of_32_kib_payloads_commit() {
    let (sched, clock) = scheduler().await;
    submit_and_fire(&sched, &clock, SUBMIT_BATCH_MAX).await;
    let claimed = claim_all(&sched, SUBMIT_BATCH_MAX).await;
    let beats = sched.heartbeat(claimed.iter().map(beat).collect()).await;
    assert!(beats.expect("a heartbeat batch commits").iter().all(|r| r.is_ok()));
    let done = sched.report(claimed.iter().map(|c| Ok(success(c))).collect()).await;
    let done = done.expect("a result batch with 32 KiB outputs commits");
    assert!(
        done.iter()
            .all(|r| r.as_ref().is_ok_and(|e| e.status == ExecutionStatus::Succeeded as i32))
    );
}

/// A result whose error code is far too large, merged with other callers' results, fails
/// alone, naming its field; the others complete.
#[tokio::test(start_paused = true)]
async fn a_poisoned_result_fails_alone() {
    let (sched, clock) = scheduler().await;
    submit_and_fire(&sched, &clock, 20).await;
    let claimed = claim_all(&sched, 20).await;
    let mut items: Vec<_> = claimed.iter().map(|c| Ok(success(c))).collect();
    let poisoned = Report {
        outcome: Outcome::Failure(ExecutionError {
            message: "boom".into(),
            retryable: false,
            code: "c".repeat(100_000),
        }),
        ..success(&claimed[7])
    };
    items[7] = Ok(poisoned);
    let out = sched.report(items).await.expect("the batch commits");
    for (i, r) in out.iter().enumerate() {
        if i == 7 {
            let Err(Error::InvalidArgument { field, reason }) = r else { panic!("{r:?}") };
            assert_eq!(field, "error.code");
            assert!(reason.contains(&ERROR_CODE_BYTES_MAX.to_string()), "{reason}");
        } else {
            assert!(r.as_ref().is_ok_and(|e| e.status == ExecutionStatus::Succeeded as i32));
        }
    }
    let e = sched.get(NS, &claimed[7].execution.id).await.expect("exists");
    assert_eq!(e.status, ExecutionStatus::Running as i32, "the poisoned one is untouched");
}
