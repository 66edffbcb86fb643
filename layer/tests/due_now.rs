//! The due-now path (issue 34): a submit offered waiting workers starts its due-now
//! executions itself.

mod common;

use common::*;
use kairos_layer::kv::memory::FaultConfig;
use kairos_proto::storage::v1::{ExecutionStatus, TimerKind};

/// Issue 34, the due-now path: a submit offered waiting workers starts its due-now executions
/// for them in its own transaction (RUNNING, attempt 1, the slot's lease, a lease check as the
/// only timer, a receipt), in request order; the rest of the due-now ones and the delayed ones
/// are SCHEDULED with their due timers as before. What it started completes with its token.
#[tokio::test]
async fn a_submit_starts_due_now_executions_for_its_offered_slots() {
    use kairos_layer::ops::claim::ClaimSlot;
    use kairos_layer::ops::fire::Offer;
    let w = world(33, FaultConfig::none()).await;
    let slot = |worker: &str| ClaimSlot { worker_id: worker.into(), max: 1, lease_ms: Some(5_000) };
    let mut offer = Offer::new();
    offer.insert((NS.into(), "report".into()), vec![slot("w1"), slot("w2")]);
    let now = w.now_ms();
    let mut items: Vec<_> = (0..3).map(|i| Ok(request(Some(&format!("n{i}")), now))).collect();
    items.insert(1, Ok(request(Some("later"), now + 60_000)));
    let (out, matched) = w.sched.submit_batch_offered(items, &offer).await.unwrap();
    let got: Vec<_> = out.into_iter().map(|r| r.unwrap().execution).collect();
    assert_eq!(matched.len(), 2, "one per slot");
    for (m, (e, worker)) in matched.iter().zip([(&got[0], "w1"), (&got[2], "w2")]) {
        assert_eq!(m.claim.execution.id, e.id, "in request order");
        assert_eq!(e.status(), ExecutionStatus::Running);
        assert_eq!((e.worker_id.as_str(), e.attempt_count, e.lease_ms), (worker, 1, 5_000));
        assert_eq!(
            e.timer.as_ref().map(|t| t.kind),
            Some(TimerKind::LeaseChecks as i32),
            "its only timer"
        );
        assert_eq!(m.claim.attempt.number, 1);
    }
    for e in [&got[1], &got[3]] {
        assert_eq!(e.status(), ExecutionStatus::Scheduled, "delayed, or no slot left");
        assert_eq!(e.timer.as_ref().map(|t| t.kind), Some(TimerKind::Due as i32));
    }
    w.check_invariants().await;
    let token = matched[0].claim.attempt.fencing_token;
    let e = w.sched.complete(NS, &got[0].id, token, Vec::new(), String::new()).await.unwrap();
    assert_eq!(e.status(), ExecutionStatus::Succeeded);
    // Without an offer nothing starts at submit: the fire does it.
    let (_, none) =
        w.sched.submit_batch_offered(vec![Ok(request(None, now))], &Offer::new()).await.unwrap();
    assert!(none.is_empty());
}
