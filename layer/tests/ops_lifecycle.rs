//! Scheduler operations: the lifecycle, fencing, leases and retries, on the memory backend.

mod common;

use common::*;
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::ops::Error;
use kairos_layer::ops::retry::backoff_cap_ms;
use kairos_proto::storage::v1::{AttemptStatus, ExecutionError, ExecutionStatus, TimerKind};

fn err(message: &str, retryable: bool) -> ExecutionError {
    ExecutionError { message: message.into(), retryable, code: String::new() }
}

#[tokio::test]
async fn happy_path_fires_at_execute_at_and_completes() {
    let w = world(1, FaultConfig::none()).await;
    let at = T0 + 90_000;
    let s = w.sched.submit(request(Some("k1"), at)).await.unwrap();
    assert!(s.created);
    let id = s.execution.id.clone();
    assert_eq!(s.execution.status(), ExecutionStatus::Scheduled);
    w.check_invariants().await;

    w.advance_ms(89_999);
    assert_eq!(w.fire_all().await, 0, "nothing fires before execute_at");
    assert_eq!(w.sched.get(NS, &id).await.unwrap().status(), ExecutionStatus::Scheduled);
    w.advance_ms(1);
    assert_eq!(w.fire_all().await, 1);
    let e = w.sched.get(NS, &id).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Ready);
    assert_eq!(e.ready_at_ms, at);
    w.check_invariants().await;

    let claimed = w.sched.claim_for(NS, "report", "worker-1", 10, None).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let c = &claimed[0];
    assert_eq!(c.execution.status(), ExecutionStatus::Running);
    assert_eq!(c.attempt.number, 1);
    let token = c.attempt.fencing_token;
    assert!(token > 1 << 20, "an unguessable token, not the attempt number: {token}");
    assert_eq!(c.attempt.lease_expires_at_ms, at + 30_000, "the definition's 30 s lease");
    w.check_invariants().await;

    w.advance_ms(10_000);
    let hb = w.sched.heartbeat_one(NS, &id, token).await.unwrap();
    assert_eq!(hb.lease_expires_at_ms, at + 40_000);
    assert!(!hb.cancel_requested);
    let out = br#"{"report_uri":"s3://reports/1"}"#.to_vec();
    let e = w.sched.complete(NS, &id, token, out.clone(), "s3://reports/1".into()).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Succeeded);
    assert_eq!(e.output_json, out);
    let attempts = w.sched.attempts(NS, &id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].status(), AttemptStatus::Succeeded);
    w.check_invariants().await;
    assert!(w.sched.claim_for(NS, "report", "worker-1", 10, None).await.unwrap().is_empty());
}

#[tokio::test]
async fn lease_expiry_retries_with_backoff_then_fails_after_max_attempts() {
    let w = world(2, FaultConfig::none()).await;
    let id = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    w.fire_all().await;
    let policy = w.sched.get(NS, &id).await.unwrap().retry_policy.unwrap();
    for attempt in 1..=3u32 {
        let claimed = w.sched.claim_for(NS, "report", "w", 1, Some(5_000)).await.unwrap();
        assert_eq!(claimed.len(), 1, "attempt {attempt} claimed");
        assert_eq!(claimed[0].attempt.number, attempt);
        // The worker got it (its first heartbeat), then dies: no heartbeat after it. Just
        // before expiry nothing happens.
        let token = claimed[0].attempt.fencing_token;
        w.sched.heartbeat_one(NS, &id, token).await.unwrap();
        w.advance_ms(4_999);
        w.fire_all().await;
        assert_eq!(w.sched.get(NS, &id).await.unwrap().status(), ExecutionStatus::Running);
        w.advance_ms(1);
        w.fire_all().await;
        let e = w.sched.get(NS, &id).await.unwrap();
        let attempts = w.sched.attempts(NS, &id).await.unwrap();
        assert_eq!(attempts[attempt as usize - 1].status(), AttemptStatus::TimedOut);
        w.check_invariants().await;
        if attempt < 3 {
            assert_eq!(e.status(), ExecutionStatus::RetryWait);
            let t = e.timer.unwrap();
            assert_eq!(t.kind(), TimerKind::Retry);
            let cap = backoff_cap_ms(&policy, attempt) as i64;
            assert!(
                t.fire_at_ms >= w.now_ms() && t.fire_at_ms <= w.now_ms() + cap,
                "full jitter bounds"
            );
            w.advance_ms((t.fire_at_ms - w.now_ms()) as u64);
            w.fire_all().await;
            assert_eq!(w.sched.get(NS, &id).await.unwrap().status(), ExecutionStatus::Ready);
        } else {
            assert_eq!(e.status(), ExecutionStatus::Failed, "no fourth attempt");
            assert_eq!(e.error.unwrap().code, "lease_expired");
            assert_eq!(e.attempt_count, 3);
        }
    }
    assert!(w.sched.claim_for(NS, "report", "w", 1, None).await.unwrap().is_empty());
    // Replay: the next attempt of the same execution, with a fresh budget.
    let e = w.sched.replay(NS, &id, "test").await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Ready);
    // Asked again before a new attempt (a client retrying a lost answer): the same replay, as
    // docs/api.md says — not a second one, not a refusal.
    let again = w.sched.replay(NS, &id, "test").await.unwrap();
    assert_eq!((again.status(), again.attempt_base), (ExecutionStatus::Ready, e.attempt_base));
    let c = w.sched.claim_for(NS, "report", "w", 1, None).await.unwrap();
    assert_eq!(c[0].attempt.number, 4);
    assert!(c[0].attempt.fencing_token > 1 << 20);
    // Once it runs again, a replay is refused: only FAILED executions are replayed (409).
    let e = w.sched.replay(NS, &id, "test").await.unwrap_err();
    assert!(matches!(&e, Error::FailedPrecondition(m) if m.contains("RUNNING")), "{e}");
    w.check_invariants().await;
}

#[tokio::test]
async fn heartbeats_keep_the_lease_and_the_timer_follows() {
    let w = world(3, FaultConfig::none()).await;
    let id = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    w.fire_all().await;
    let c = w.sched.claim_for(NS, "report", "w", 1, Some(5_000)).await.unwrap();
    let token = c[0].attempt.fencing_token;
    for _ in 0..5 {
        w.advance_ms(4_000);
        w.sched.heartbeat_one(NS, &id, token).await.unwrap();
        w.fire_all().await; // lease-check timers fire and move to the renewed expiry
        assert_eq!(w.sched.get(NS, &id).await.unwrap().status(), ExecutionStatus::Running);
        w.check_invariants().await;
    }
    w.sched.complete(NS, &id, token, Vec::new(), String::new()).await.unwrap();
    w.check_invariants().await;
}

#[tokio::test]
async fn retryable_and_permanent_failures() {
    let w = world(4, FaultConfig::none()).await;
    let a = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    let b = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    w.fire_all().await;
    let claimed = w.sched.claim_for(NS, "report", "w", 2, None).await.unwrap();
    assert_eq!(claimed.len(), 2);
    let token =
        |id: &str| claimed.iter().find(|c| c.execution.id == id).unwrap().attempt.fencing_token;
    let e = w.sched.fail(NS, &a, token(&a), err("flaky", true)).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::RetryWait);
    let e = w.sched.fail(NS, &b, token(&b), err("bad input", false)).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Failed, "permanent errors are not retried");
    assert_eq!(e.error.as_ref().unwrap().message, "bad input");
    // Failing again with the same token is a no-op (idempotent), not a second failure.
    let again = w.sched.fail(NS, &b, token(&b), err("bad input", false)).await.unwrap();
    assert_eq!(again, e);
    w.check_invariants().await;
}

#[tokio::test]
async fn stale_tokens_change_nothing() {
    let w = world(5, FaultConfig::none()).await;
    let id = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    w.fire_all().await;
    let old = w.sched.claim_for(NS, "report", "old-worker", 1, Some(5_000)).await.unwrap();
    let old = old[0].attempt.fencing_token;
    w.sched.heartbeat_one(NS, &id, old).await.unwrap(); // it got it
    w.advance_ms(5_000);
    w.fire_all().await; // lease expired: RETRY_WAIT
    let e = w.sched.get(NS, &id).await.unwrap();
    w.advance_ms((e.timer.unwrap().fire_at_ms - w.now_ms()) as u64);
    w.fire_all().await;
    let c = w.sched.claim_for(NS, "report", "new-worker", 1, None).await.unwrap();
    let new = c[0].attempt.fencing_token;
    assert!(new != old && c[0].attempt.number == 2);

    let before = w.dump().await;
    let stale = [
        w.sched.complete(NS, &id, old, Vec::new(), String::new()).await.unwrap_err(),
        w.sched.fail(NS, &id, old, err("late", true)).await.unwrap_err(),
        w.sched.heartbeat_one(NS, &id, old).await.unwrap_err(),
        w.sched.heartbeat_one(NS, &id, 7).await.unwrap_err(),
    ];
    for e in &stale {
        assert!(matches!(e, Error::FencedOut { .. }), "{e}");
        assert!(e.to_string().contains("fenced out"), "{e}");
        assert!(!e.to_string().contains(&new.to_string()), "the current token is not told: {e}");
    }
    assert_eq!(w.dump().await, before, "stale results changed nothing");
    w.sched.complete(NS, &id, new, Vec::new(), String::new()).await.unwrap();
    // The timed-out attempt's token stays fenced after the execution finished too.
    assert!(matches!(
        w.sched.complete(NS, &id, old, Vec::new(), String::new()).await,
        Err(Error::FencedOut { .. })
    ));
    w.check_invariants().await;
}

#[tokio::test]
async fn stale_epoch_fire_changes_nothing() {
    let w = world(6, FaultConfig::none()).await;
    w.sched.submit(request(None, T0)).await.unwrap();
    let shard = (0..SHARDS).find(|_| true).unwrap();
    let old = w.epochs[shard as usize];
    // Node B takes every shard over after A's lease expired (A restarted with a new epoch).
    for s in 0..SHARDS {
        w.sched.release_shard(s, NODE, w.epochs[s as usize]).await.unwrap();
        let l = w.sched.acquire_shard(s, "node-b", 60_000).await.unwrap();
        assert_eq!(l.epoch, w.epochs[s as usize] + 1, "epoch rises on a change of owner");
    }
    let before = w.dump().await;
    for s in 0..SHARDS {
        let e = w
            .sched
            .fire_due(s, w.epochs[s as usize], w.now_ms(), 100, &Default::default())
            .await
            .unwrap_err();
        assert!(matches!(e, Error::OwnershipLost { .. }), "{e}");
    }
    assert_eq!(w.dump().await, before, "a stale owner changed nothing");
    let e = w.sched.renew_shard(shard, NODE, old, 60_000).await.unwrap_err();
    assert!(matches!(e, Error::OwnershipLost { .. }));
}

#[tokio::test]
async fn shard_leases_move_only_when_free() {
    let w = world(7, FaultConfig::none()).await;
    let held = w.sched.acquire_shard(0, "node-b", 10_000).await.unwrap_err();
    assert!(matches!(&held, Error::LeaseHeld { owner, .. } if owner == NODE), "{held}");
    // A restarted node-a re-acquires its own shard at once, with a new epoch.
    let again = w.sched.acquire_shard(0, NODE, 10_000).await.unwrap();
    assert_eq!(again.epoch, w.epochs[0] + 1);
    w.advance_ms(10_001);
    let b = w.sched.acquire_shard(0, "node-b", 10_000).await.unwrap();
    assert_eq!(b.epoch, again.epoch + 1, "expired lease taken over");
    let renewed = w.sched.renew_shard(0, "node-b", b.epoch, 20_000).await.unwrap();
    assert_eq!(renewed.expires_at_ms, w.now_ms() + 20_000);
    w.sched.release_shard(0, "node-b", b.epoch).await.unwrap();
    let a = w.sched.acquire_shard(0, NODE, 10_000).await.unwrap();
    assert_eq!(a.epoch, b.epoch + 1, "released lease taken at once");
    assert!(w.sched.acquire_shard(99, NODE, 1).await.is_err(), "unknown shard");
    let leases = w.sched.partition_leases(kairos_layer::keys::Space::Executions).await.unwrap();
    assert_eq!(leases.len(), SHARDS as usize);
}

#[tokio::test]
async fn cancel_before_start_at_once_and_of_a_running_one_through_its_worker() {
    let w = world(8, FaultConfig::none()).await;
    let scheduled = w.sched.submit(request(None, T0 + 60_000)).await.unwrap().execution.id;
    let ready = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    let running = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    w.fire_all().await;
    let c = w.sched.cancel(NS, &scheduled, "test").await.unwrap();
    assert!(c.done);
    assert_eq!(c.execution.status(), ExecutionStatus::Cancelled);
    assert!(c.execution.timer.is_none());
    // Claim exactly one of the two READY ones, then cancel the other.
    let claimed = w.sched.claim_for(NS, "report", "w", 1, None).await.unwrap();
    let (run_id, ready_id) = if claimed[0].execution.id == running {
        (running.clone(), ready.clone())
    } else {
        (ready.clone(), running.clone())
    };
    let c = w.sched.cancel(NS, &ready_id, "test").await.unwrap();
    assert_eq!(c.execution.status(), ExecutionStatus::Cancelled);
    assert!(
        w.sched.claim_for(NS, "report", "w", 5, None).await.unwrap().is_empty(),
        "cancelled READY not dispatched"
    );
    // A running one is flagged; the worker sees it on its next heartbeat.
    let c = w.sched.cancel(NS, &run_id, "test").await.unwrap();
    assert!(!c.done);
    assert_eq!(c.execution.status(), ExecutionStatus::Running);
    w.advance_ms(1);
    let token = claimed[0].attempt.fencing_token;
    assert!(w.sched.heartbeat_one(NS, &run_id, token).await.unwrap().cancel_requested);
    // Its handler stops and reports a retryable failure: CANCELLED, never retried.
    let e = w.sched.fail(NS, &run_id, token, err("stopped", true)).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Cancelled);
    assert!(e.timer.is_none(), "no retry timer");
    let attempts = w.sched.attempts(NS, &run_id).await.unwrap();
    assert_eq!(attempts.last().unwrap().status(), AttemptStatus::Cancelled);
    assert_eq!(
        w.sched.cancel(NS, &scheduled, "test").await.unwrap().execution.status(),
        ExecutionStatus::Cancelled,
        "idempotent"
    );
    w.advance_ms(120_000);
    w.fire_all().await;
    assert_eq!(
        w.sched.get(NS, &scheduled).await.unwrap().status(),
        ExecutionStatus::Cancelled,
        "never fired"
    );
    assert!(
        w.sched.claim_for(NS, "report", "w", 5, None).await.unwrap().is_empty(),
        "never retried"
    );
    w.check_invariants().await;
    assert!(matches!(w.sched.cancel(NS, "nope", "test").await, Err(Error::NotFound { .. })));
}

#[tokio::test]
async fn a_cancelled_running_execution_whose_worker_vanished_ends_cancelled_at_lease_expiry() {
    let w = world(18, FaultConfig::none()).await;
    let id = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    w.fire_all().await;
    w.sched.claim_for(NS, "report", "w", 1, None).await.unwrap();
    assert!(!w.sched.cancel(NS, &id, "test").await.unwrap().done);
    w.advance_ms(31_000); // the 30 s lease runs out without a heartbeat
    w.fire_all().await;
    let e = w.sched.get(NS, &id).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Cancelled, "not RETRY_WAIT: cancelled is final");
    assert!(w.sched.claim_for(NS, "report", "w", 5, None).await.unwrap().is_empty());
    let e = w.sched.cancel(NS, &id, "test").await.unwrap();
    assert!(e.done, "cancelling it again is a no-op");
    w.check_invariants().await;
}

#[tokio::test]
async fn a_finished_execution_cannot_be_cancelled() {
    let w = world(19, FaultConfig::none()).await;
    let id = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    w.fire_all().await;
    let c = w.sched.claim_for(NS, "report", "w", 1, None).await.unwrap();
    let token = c[0].attempt.fencing_token;
    w.sched.complete(NS, &id, token, Vec::new(), String::new()).await.unwrap();
    let e = w.sched.cancel(NS, &id, "test").await.unwrap_err();
    assert!(matches!(&e, Error::FailedPrecondition(m) if m.contains("SUCCEEDED")), "{e}");
}

#[tokio::test]
async fn a_released_attempt_is_ready_again_and_not_counted() {
    let w = world(20, FaultConfig::none()).await;
    let id = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    w.fire_all().await;
    // The report definition allows 3 attempts: release 5 times, then fail 3 times.
    for number in 1..=5 {
        let c = w.sched.claim_for(NS, "report", "w", 1, None).await.unwrap();
        assert_eq!(c[0].attempt.number, number);
        let token = c[0].attempt.fencing_token;
        let e = w.sched.release(NS, &id, token).await.unwrap();
        assert_eq!(e.status(), ExecutionStatus::Ready);
        // Idempotent: the same release again answers the same.
        assert_eq!(w.sched.release(NS, &id, token).await.unwrap().status(), ExecutionStatus::Ready);
    }
    for _ in 0..3 {
        let c = w.sched.claim_for(NS, "report", "w", 1, None).await.unwrap();
        let token = c[0].attempt.fencing_token;
        let e = w.sched.fail(NS, &id, token, err("boom", true)).await.unwrap();
        if e.status() == ExecutionStatus::RetryWait {
            w.advance_ms((e.timer.unwrap().fire_at_ms - w.now_ms()).max(0) as u64);
            w.fire_all().await;
        }
    }
    let e = w.sched.get(NS, &id).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Failed, "3 counted attempts, 5 released ones");
    assert_eq!(e.attempt_count, 8);
    let attempts = w.sched.attempts(NS, &id).await.unwrap();
    let abandoned = attempts.iter().filter(|a| a.status() == AttemptStatus::Abandoned).count();
    assert_eq!(abandoned, 5);
    w.check_invariants().await;
}

#[tokio::test]
async fn lists_by_every_status_including_the_unindexed_passing_ones() {
    use kairos_layer::ops::query::ListQuery;
    let w = world(21, FaultConfig::none()).await;
    let ids: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(w.sched.submit(request(None, T0)).await.unwrap().execution.id);
        }
        v
    };
    w.fire_all().await;
    let claimed = w.sched.claim_for(NS, "report", "w", 1, None).await.unwrap();
    let (running, token) = (claimed[0].execution.id.clone(), claimed[0].attempt.fencing_token);
    let list = |status| {
        let q = ListQuery { namespace: NS.into(), status: Some(status), ..ListQuery::default() };
        let s = w.sched.clone();
        async move { s.list(&q).await.unwrap().executions.into_iter().map(|e| e.id).collect::<Vec<_>>() }
    };
    assert_eq!(list(ExecutionStatus::Running).await, vec![running.clone()]);
    let ready = list(ExecutionStatus::Ready).await;
    assert_eq!(ready.len(), 2);
    assert!(ready.iter().all(|id| ids.contains(id) && *id != running));
    w.sched.complete(NS, &running, token, Vec::new(), String::new()).await.unwrap();
    assert_eq!(list(ExecutionStatus::Succeeded).await, vec![running.clone()]);
    assert!(list(ExecutionStatus::Running).await.is_empty());
    let attempts = w.sched.attempts(NS, &running).await.unwrap();
    assert_eq!(attempts.len(), 1, "the successful attempt, from the execution record");
    assert_eq!(attempts[0].status(), AttemptStatus::Succeeded);
    assert_eq!(attempts[0].worker_id, "w");
    w.check_invariants().await;
}

#[tokio::test]
async fn an_unassigned_claim_is_released_uncounted_when_no_worker_confirmed_it() {
    use kairos_layer::ops::claim::ClaimSlot;
    use kairos_layer::ops::worker::Beat;
    let w = world(22, FaultConfig::none()).await;
    let a = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    let b = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    w.fire_all().await;
    // A node's dispatch buffer claims both without naming a worker.
    let slot = ClaimSlot { worker_id: String::new(), max: 2, lease_ms: None };
    let claimed: Vec<_> =
        w.sched.claim(NS, "report", &[slot]).await.map(|o| o.per_slot).unwrap().concat();
    assert_eq!(claimed.len(), 2);
    assert!(claimed.iter().all(|c| c.execution.worker_id.is_empty()));
    // `a` reaches a worker, whose heartbeat names it; `b` stays in the buffer of a node that
    // dies.
    let ta = claimed.iter().find(|c| c.execution.id == a).unwrap().attempt.fencing_token;
    w.advance_ms(1_000);
    let beat = Beat {
        namespace: NS.into(),
        execution_id: a.clone(),
        token: ta,
        worker_id: Some("w7".into()),
        queue: Some("report".into()),
    };
    w.sched.heartbeat(vec![beat]).await.unwrap().pop().unwrap().unwrap();
    assert_eq!(w.sched.get(NS, &a).await.unwrap().worker_id, "w7");
    w.advance_ms(31_000); // both leases run out
    w.fire_all().await;
    let ea = w.sched.get(NS, &a).await.unwrap();
    assert_eq!(ea.status(), ExecutionStatus::RetryWait, "a confirmed attempt times out: counted");
    let eb = w.sched.get(NS, &b).await.unwrap();
    assert_eq!(eb.status(), ExecutionStatus::Ready, "an unconfirmed one is released");
    assert_eq!(eb.attempts_released, 1);
    let attempts = w.sched.attempts(NS, &b).await.unwrap();
    assert_eq!(attempts[0].status(), AttemptStatus::Abandoned);
    w.check_invariants().await;
}

/// An attempt started for a waiting worker (by a claim, as by a fire matched to it) whose node
/// died before handing it over: the worker never heard of it, so when its lease runs out it is
/// released uncounted — repeated crashes cannot FAIL an execution no handler ever saw.
#[tokio::test]
async fn an_attempt_for_a_waiting_worker_that_never_got_it_is_not_counted() {
    use kairos_layer::ops::claim::ClaimSlot;
    use kairos_layer::ops::worker::Beat;
    let w = world(24, FaultConfig::none()).await;
    let a = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    let b = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    w.fire_all().await;
    let slot = ClaimSlot { worker_id: "w1".into(), max: 2, lease_ms: None };
    let claimed: Vec<_> =
        w.sched.claim(NS, "report", &[slot]).await.map(|o| o.per_slot).unwrap().concat();
    assert_eq!(claimed.len(), 2);
    assert!(claimed.iter().all(|c| c.execution.worker_id == "w1" && !c.execution.worker_confirmed));
    // `a` reaches the worker (its heartbeat); `b` was lost with the node that claimed it.
    let ta = claimed.iter().find(|c| c.execution.id == a).unwrap().attempt.fencing_token;
    w.advance_ms(1_000);
    let beat = Beat {
        namespace: NS.into(),
        execution_id: a.clone(),
        token: ta,
        worker_id: None,
        queue: None,
    };
    w.sched.heartbeat(vec![beat]).await.unwrap().pop().unwrap().unwrap();
    assert!(w.sched.get(NS, &a).await.unwrap().worker_confirmed);
    w.advance_ms(31_000); // both leases run out
    w.fire_all().await;
    let ea = w.sched.get(NS, &a).await.unwrap();
    assert_eq!(ea.status(), ExecutionStatus::RetryWait, "a confirmed attempt lost: counted");
    let eb = w.sched.get(NS, &b).await.unwrap();
    assert_eq!(eb.status(), ExecutionStatus::Ready, "one its worker never got is released");
    assert_eq!(eb.attempts_released, 1);
    w.check_invariants().await;
}

#[tokio::test]
async fn a_poison_timer_is_quarantined_and_the_shard_goes_on() {
    use kairos_layer::keys::TimerKey;
    let w = world(23, FaultConfig::none()).await;
    let ids: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..8 {
            v.push(w.sched.submit(request(None, T0)).await.unwrap().execution.id);
        }
        v
    };
    // Corrupt one execution's timer value, and plant an undecodable timer in another shard.
    let victim = w.sched.get(NS, &ids[0]).await.unwrap();
    let t = victim.timer.unwrap();
    let key = w.ks.timer(&TimerKey {
        bucket: t.bucket,
        shard: victim.shard,
        fire_at_ms: t.fire_at_ms,
        execution_id: victim.id.clone(),
        kind: t.kind,
    });
    let garbage = w.ks.timer(&TimerKey {
        bucket: t.bucket,
        shard: (victim.shard + 1) % SHARDS,
        fire_at_ms: t.fire_at_ms,
        execution_id: "no-such-execution".into(),
        kind: 9,
    });
    w.db.run(|tx| {
        let (key, garbage) = (key.clone(), garbage.clone());
        async move {
            tx.set(&key, b"\xff\xff\xff not a protobuf")?;
            tx.set(&garbage, b"")?;
            Ok::<_, kairos_layer::kv::Error>(())
        }
    })
    .await
    .unwrap();
    let mut fired = 0;
    let mut quarantined = 0;
    for shard in 0..SHARDS {
        let out = w
            .sched
            .fire_due(shard, w.epochs[shard as usize], w.now_ms(), 100, &Default::default())
            .await;
        let out = out.expect("one poison record does not fail the batch");
        fired += out.fired.len();
        quarantined += out.quarantined;
    }
    assert_eq!(fired, 7, "every other execution fired");
    assert_eq!(quarantined, 1, "the corrupt value is put aside");
    let q = w.sched.quarantined(10).await.unwrap();
    assert_eq!(q.len(), 1);
    assert_eq!(q[0].execution_id, victim.id);
    assert!(q[0].reason.contains("timer record"), "{}", q[0].reason);
    // The planted timer (unknown execution) is stale, not poison: it is cleared silently.
    let dump = w.dump().await;
    assert!(!dump.contains_key(&key) && !dump.contains_key(&garbage), "both keys are gone");
    // Firing again changes nothing more and fails nothing.
    for shard in 0..SHARDS {
        w.sched
            .fire_due(shard, w.epochs[shard as usize], w.now_ms(), 100, &Default::default())
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn an_attempt_timeout_is_reported_as_such_not_as_a_lost_lease() {
    let w = world(24, FaultConfig::none()).await;
    let mut def = report_definition();
    def.version = 2;
    def.attempt_timeout_ms = 5_000; // shorter than the 30 s lease
    w.sched.register_definition(NS, def, "test").await.unwrap();
    let mut req = request(None, T0);
    req.definition_version = 2;
    let id = w.sched.submit(req).await.unwrap().execution.id;
    w.fire_all().await;
    w.sched.claim_for(NS, "report", "w", 1, None).await.unwrap();
    w.advance_ms(5_001);
    w.fire_all().await;
    let e = w.sched.get(NS, &id).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::RetryWait);
    assert_eq!(e.error.as_ref().unwrap().code, "attempt_timeout", "{:?}", e.error);
    // And a lease lost without heartbeats says so.
    w.advance_ms((e.timer.unwrap().fire_at_ms - w.now_ms()).max(0) as u64);
    w.fire_all().await;
    w.sched.claim_for(NS, "report", "w", 1, None).await.unwrap();
    let mut def = report_definition();
    def.version = 3;
    w.sched.register_definition(NS, def, "test").await.unwrap();
    let mut req = request(None, w.now_ms());
    req.definition_version = 3;
    let id2 = w.sched.submit(req).await.unwrap().execution.id;
    w.fire_all().await;
    for c in w.sched.claim_for(NS, "report", "w", 5, None).await.unwrap() {
        let (e, token) = (&c.execution.id, c.attempt.fencing_token);
        w.sched.heartbeat_one(NS, e, token).await.unwrap(); // the worker got them
    }
    w.advance_ms(31_000);
    w.fire_all().await;
    let e2 = w.sched.get(NS, &id2).await.unwrap();
    assert_eq!(e2.error.as_ref().unwrap().code, "lease_expired", "{:?}", e2.error);
}

#[tokio::test]
async fn claim_receipts_of_workers_that_never_return_are_cleared() {
    use kairos_layer::keys::Tag;
    let w = world(25, FaultConfig::none()).await;
    for i in 0..3 {
        w.sched.submit(request(Some(&format!("r{i}")), T0)).await.unwrap();
    }
    w.fire_all().await;
    // Three different workers claim once each and never come back.
    for worker in ["gone-1", "gone-2", "gone-3"] {
        w.sched.claim_for(NS, "report", worker, 1, None).await.unwrap();
    }
    let receipts = |dump: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>| {
        let r = w.ks.subspace_range(Tag::ClaimReceipt);
        dump.range(r.begin..r.end).count()
    };
    assert_eq!(receipts(&w.dump().await), 3);
    // A minute later any claim, by anyone, clears them.
    w.advance_ms(61_000);
    w.sched.claim_for(NS, "report", "someone-else", 1, None).await.unwrap();
    assert_eq!(receipts(&w.dump().await), 1, "only the new claim's own receipt is left");
}

/// A worker's mistakes are its own: results for an execution never claimed (token 0, or any
/// token) are refused as a failed precondition, never reported as corrupt data.
#[tokio::test]
async fn results_for_a_never_claimed_execution_are_a_precondition_failure() {
    let w = world(9, FaultConfig::none()).await;
    let id = w.sched.submit(request(None, T0 + 60_000)).await.unwrap().execution.id;
    let before = w.dump().await;
    for token in [0, 1] {
        let results = [
            w.sched.fail(NS, &id, token, err("x", true)).await.unwrap_err(),
            w.sched.complete(NS, &id, token, Vec::new(), String::new()).await.unwrap_err(),
            w.sched.heartbeat_one(NS, &id, token).await.unwrap_err(),
            w.sched.release(NS, &id, token).await.unwrap_err(),
        ];
        for e in &results {
            assert!(
                matches!(e, Error::FencedOut { .. } | Error::FailedPrecondition(_)),
                "token {token}: {e:?}"
            );
        }
    }
    assert_eq!(w.dump().await, before, "nothing changed");
}

#[tokio::test]
async fn a_fire_starts_executions_for_its_offered_slots_in_order_and_readies_the_rest() {
    use kairos_layer::ops::claim::ClaimSlot;
    use kairos_layer::ops::fire::Offer;
    let w = world(31, FaultConfig::none()).await;
    let ids: Vec<String> = (0..12)
        .map(|i| request(Some(&format!("m{i}")), T0 + 1_000))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|r| w.sched.submit(r))
        .collect::<futures_util::future::JoinAll<_>>()
        .await
        .into_iter()
        .map(|s| s.unwrap().execution.id)
        .collect();
    w.advance_ms(1_000);
    let slot =
        |worker: &str, max| ClaimSlot { worker_id: worker.into(), max, lease_ms: Some(5_000) };
    let mut offer = Offer::new();
    offer.insert((NS.into(), "report".into()), vec![slot("w1", 1), slot("w2", 2)]);
    let (mut matched, mut ready) = (0, 0);
    for shard in 0..SHARDS {
        let out = w.sched.fire_due(shard, w.epochs[shard as usize], w.now_ms(), 100, &offer);
        let out = out.await.unwrap();
        assert!(out.matched.len() <= 3, "at most the offer: {}", out.matched.len());
        for (i, m) in out.matched.iter().enumerate() {
            let (worker, slot) = if i == 0 { ("w1", 0) } else { ("w2", 1) };
            assert_eq!((m.claim.execution.worker_id.as_str(), m.slot), (worker, slot));
            assert_eq!(m.claim.execution.status(), ExecutionStatus::Running);
            assert_eq!(m.claim.execution.lease_ms, 5_000, "the slot's lease");
        }
        matched += out.matched.len();
        ready += out.fired.iter().filter(|f| f.status == ExecutionStatus::Ready).count();
    }
    assert_eq!(matched + ready, ids.len(), "every due execution fired once");
    assert!(matched > 0 && ready > 0, "{matched} matched, {ready} ready");
    w.check_invariants().await;
    let claimed = w.sched.claim_for(NS, "report", "w3", 100, None).await.unwrap();
    assert_eq!(claimed.len(), ready, "the rest are READY for any worker");
}

/// Step 3 of issue 21: a fire holding a queue starts what its offer has room for, and leaves
/// the rest of that queue due (SCHEDULED, timers in place, never READY) for later fires with
/// room.
#[tokio::test]
async fn a_held_queue_starts_only_with_room() {
    use kairos_layer::ops::claim::ClaimSlot;
    use kairos_layer::ops::fire::Offer;
    use kairos_layer::ops::hold::Hold;
    let w = world(32, FaultConfig::none()).await;
    let submit = |i: usize| w.sched.submit(request(Some(&format!("h{i}")), w.now_ms() + 1_000));
    let mut ids = Vec::new();
    for i in 0..12 {
        ids.push(submit(i).await.unwrap().execution.id);
    }
    w.advance_ms(1_000);
    let hold = Hold::queues([(NS.to_string(), "report".to_string())]);
    let slot = ClaimSlot { worker_id: "w1".into(), max: 1, lease_ms: None };
    let offer: Offer = [((NS.to_string(), "report".to_string()), vec![slot])].into();
    let (mut started, mut rounds) = (std::collections::BTreeSet::new(), 0);
    while started.len() < ids.len() {
        rounds += 1;
        assert!(rounds <= 20, "every held execution starts once there is room");
        for shard in 0..SHARDS {
            let (epoch, now) = (w.epochs[shard as usize], w.now_ms());
            let out =
                w.sched.fire_due_holding(shard, epoch, now, 100, &offer, &hold).await.unwrap();
            assert!(out.matched.len() <= 1, "at most the room offered");
            assert!(!out.more, "held rows do not ask to fire again at once");
            for m in out.matched {
                assert!(started.insert(m.claim.execution.id.clone()), "started once");
            }
        }
        for id in &ids {
            let e = w.sched.get(NS, id).await.unwrap();
            let status = e.status();
            assert!(
                status == ExecutionStatus::Scheduled || status == ExecutionStatus::Running,
                "held or started, never READY: {status:?}"
            );
            assert_eq!(status == ExecutionStatus::Running, started.contains(id));
            assert!(e.timer.is_some(), "a held execution keeps its timer");
        }
        w.check_invariants().await;
    }
    assert!(rounds > 1, "the room of one fire did not start them all");
}

/// A queue not held is readied as before; an execution held longer than `HOLD_MS_MAX` is made
/// READY even with no room (and the watermark did not pass it by while it was held).
#[tokio::test]
async fn a_queue_not_held_and_work_held_too_long_go_ready() {
    use kairos_layer::limits::HOLD_MS_MAX;
    use kairos_layer::ops::fire::Offer;
    use kairos_layer::ops::hold::Hold;
    let w = world(34, FaultConfig::none()).await;
    let submit = |i: usize| w.sched.submit(request(Some(&format!("h{i}")), w.now_ms() + 1_000));
    let other = submit(99).await.unwrap().execution.id;
    w.advance_ms(1_000);
    let elsewhere = Hold::queues([(NS.to_string(), "elsewhere".to_string())]);
    for shard in 0..SHARDS {
        let (epoch, now) = (w.epochs[shard as usize], w.now_ms());
        let none = Offer::new();
        let out = w.sched.fire_due_holding(shard, epoch, now, 100, &none, &elsewhere).await;
        assert_eq!(out.unwrap().held, 0);
    }
    let e = w.sched.get(NS, &other).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Ready, "a queue not held is readied as before");

    let hold = Hold::queues([(NS.to_string(), "report".to_string())]);
    let mut late = Vec::new();
    for i in 100..104 {
        late.push(submit(i).await.unwrap().execution.id);
    }
    w.advance_ms(1_000);
    let empty = Offer::new();
    let mut held = 0;
    for shard in 0..SHARDS {
        let (epoch, now) = (w.epochs[shard as usize], w.now_ms());
        held += w.sched.fire_due_holding(shard, epoch, now, 100, &empty, &hold).await.unwrap().held;
    }
    assert_eq!(held, late.len(), "no room: all held");
    w.advance_ms(HOLD_MS_MAX as u64 + 1_000);
    let mut ready = 0;
    for shard in 0..SHARDS {
        let (epoch, now) = (w.epochs[shard as usize], w.now_ms());
        let out = w.sched.fire_due_holding(shard, epoch, now, 100, &empty, &hold).await.unwrap();
        assert_eq!(out.held, 0);
        let late_ready = |f: &&kairos_layer::ops::fire::Fired| {
            f.status == ExecutionStatus::Ready && late.contains(&f.execution_id)
        };
        ready += out.fired.iter().filter(late_ready).count();
    }
    assert_eq!(ready, late.len(), "held too long: READY for any worker");
    w.check_invariants().await;
}

/// A narrow fire (woken by room) reads about as many due rows as its room, not the backlog:
/// it starts what the room allows, in due order, holds what it read beyond that, and does not
/// ask to be called again at once; full fires still see (and hold) the whole backlog.
#[tokio::test]
async fn a_narrow_fire_reads_in_proportion_to_its_room_not_to_the_backlog() {
    use kairos_layer::ops::claim::ClaimSlot;
    use kairos_layer::ops::fire::Offer;
    use kairos_layer::ops::hold::{Hold, NARROW_EXTRA_ROWS};
    let w = world(33, FaultConfig::none()).await;
    let due = w.now_ms() + 1_000;
    let n = 60 * SHARDS as usize;
    for i in 0..n {
        w.sched.submit(request(Some(&format!("b{i}")), due)).await.unwrap();
    }
    w.advance_ms(1_000);
    let full = Hold::queues([(NS.to_string(), "report".to_string())]);
    let narrow = Hold { narrow: true, ..full.clone() };
    let slot = ClaimSlot { worker_id: "w1".into(), max: 2, lease_ms: None };
    let offer: Offer = [((NS.to_string(), "report".to_string()), vec![slot])].into();
    let (mut started, mut backlog) = (0, 0);
    for shard in 0..SHARDS {
        let (epoch, now) = (w.epochs[shard as usize], w.now_ms());
        let out = w.sched.fire_due_holding(shard, epoch, now, 100, &offer, &full).await.unwrap();
        started += out.matched.len();
        backlog = backlog.max(out.held);
        let out = w.sched.fire_due_holding(shard, epoch, now, 100, &offer, &narrow).await.unwrap();
        assert!(out.held <= NARROW_EXTRA_ROWS, "a narrow fire holds only what it read");
        assert!(!out.more, "it waits for room, not called again at once");
        started += out.matched.len();
    }
    assert!(backlog > NARROW_EXTRA_ROWS + 2, "a full fire sees the backlog ({backlog})");
    assert_eq!(started, 4 * SHARDS as usize, "two per fire, every fire");
    w.check_invariants().await;
}
