//! Fencing tokens (issue 24, decision 0010): not guessable, never in an error, bound to the
//! worker and queue holding the attempt; a second result with other content for an attempt
//! that already ended is refused as such; attempts started by a build whose tokens counted
//! 1, 2, … still complete.

mod common;

use common::*;
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::ops::Error;
use kairos_layer::ops::worker::{Beat, Outcome, Report};
use kairos_proto::storage::v1::{Execution, ExecutionError, ExecutionStatus};
use prost::Message;

fn err(message: &str, retryable: bool) -> ExecutionError {
    ExecutionError { message: message.into(), retryable, code: String::new() }
}

fn success(output: &str) -> Outcome {
    Outcome::Success { output_json: output.as_bytes().to_vec(), output_reference: String::new() }
}

fn report(id: &str, token: u64, outcome: Outcome, worker: &str, queue: Option<&str>) -> Report {
    Report {
        namespace: NS.into(),
        execution_id: id.into(),
        token,
        outcome,
        worker_id: Some(worker.into()),
        queue: queue.map(str::to_string),
    }
}

async fn report_one(w: &World, r: Report) -> Result<Execution, Error> {
    w.sched.report(vec![Ok(r)]).await.unwrap().pop().unwrap()
}

/// `n` executions due now, fired and claimed by `worker`: (id, token) each.
async fn running(w: &World, n: usize, worker: &str) -> Vec<(String, u64)> {
    for _ in 0..n {
        w.sched.submit(request(None, T0)).await.unwrap();
    }
    w.fire_all().await;
    let claimed = w.sched.claim_for(NS, "report", worker, n, None).await.unwrap();
    assert_eq!(claimed.len(), n);
    claimed.into_iter().map(|c| (c.execution.id, c.attempt.fencing_token)).collect()
}

#[tokio::test]
async fn tokens_are_not_guessable() {
    let w = world(31, FaultConfig::none()).await;
    let claimed = running(&w, 64, "w1").await;
    let tokens: std::collections::BTreeSet<u64> = claimed.iter().map(|(_, t)| *t).collect();
    assert_eq!(tokens.len(), 64, "every attempt has its own token");
    // Not a small counter: the old tokens were 1, 2, 3 …; these spread over all 64 bits.
    assert!(tokens.iter().all(|t| *t > 1 << 20), "{tokens:?}");
    let high_bits = tokens.iter().filter(|t| **t >> 63 == 1).count();
    assert!((16..=48).contains(&high_bits), "the top bit is set in about half: {high_bits}");
    // The next attempt of one execution gets an unrelated token, not token + 1.
    let (id, first) = claimed[0].clone();
    let after = report_one(&w, report(&id, first, Outcome::Failure(err("x", true)), "w1", None))
        .await
        .unwrap();
    assert_eq!(after.status(), ExecutionStatus::RetryWait);
    w.advance_ms(20_000);
    w.fire_all().await;
    let again = w.sched.claim_for(NS, "report", "w1", 1, None).await.unwrap();
    assert_eq!(again[0].attempt.number, 2);
    let second = again[0].attempt.fencing_token;
    assert!(second != first && second != first + 1 && second > 1 << 20, "{first} → {second}");
}

#[tokio::test]
async fn errors_never_name_a_token() {
    let w = world(32, FaultConfig::none()).await;
    let (id, token) = running(&w, 1, "w1").await.remove(0);
    for wrong in [token ^ 1, token.wrapping_add(1), 1, 2] {
        let e = report_one(&w, report(&id, wrong, success("{}"), "w1", None)).await.unwrap_err();
        assert!(matches!(e, Error::FencedOut { .. }), "{e}");
        let text = e.to_string();
        // (1 and 2 are too short to look for: an execution id may hold them.)
        for t in [token, wrong].into_iter().filter(|t| *t > 1 << 20) {
            assert!(!text.contains(&t.to_string()), "{text:?} names a token");
        }
        let beat = Beat {
            namespace: NS.into(),
            execution_id: id.clone(),
            token: wrong,
            worker_id: None,
            queue: None,
        };
        let e = w.sched.heartbeat(vec![beat]).await.unwrap().pop().unwrap().unwrap_err();
        assert!(!e.to_string().contains(&token.to_string()), "{e}");
    }
    report_one(&w, report(&id, token, success("{}"), "w1", None)).await.unwrap();
}

#[tokio::test]
async fn results_are_bound_to_the_worker_and_queue_holding_the_attempt() {
    let w = world(33, FaultConfig::none()).await;
    let (id, token) = running(&w, 1, "w1").await.remove(0);
    let before = w.dump().await;
    let other_worker = report_one(&w, report(&id, token, success("{}"), "w2", None)).await;
    assert!(
        matches!(&other_worker, Err(Error::FencedOut { reason, .. }) if reason.contains("held by worker w1")),
        "{other_worker:?}"
    );
    let other_queue = report_one(&w, report(&id, token, success("{}"), "w1", Some("q2"))).await;
    assert!(
        matches!(&other_queue, Err(Error::FencedOut { reason, .. }) if reason.contains("queue report")),
        "{other_queue:?}"
    );
    let beat = |worker: &str, queue: &str| Beat {
        namespace: NS.into(),
        execution_id: id.clone(),
        token,
        worker_id: Some(worker.into()),
        queue: Some(queue.into()),
    };
    let beats = w.sched.heartbeat(vec![beat("w2", "report"), beat("w1", "q2")]).await.unwrap();
    assert!(beats.iter().all(|b| matches!(b, Err(Error::FencedOut { .. }))), "{beats:?}");
    assert_eq!(w.dump().await, before, "refused results and heartbeats change nothing");
    let done = report_one(&w, report(&id, token, success("{}"), "w1", Some("report"))).await;
    assert_eq!(done.unwrap().status(), ExecutionStatus::Succeeded);
}

#[tokio::test]
async fn a_second_result_with_other_content_is_refused_as_such() {
    let w = world(34, FaultConfig::none()).await;
    let claimed = running(&w, 2, "w1").await;
    let (a, ta) = claimed[0].clone();
    let (b, tb) = claimed[1].clone();
    report_one(&w, report(&a, ta, success(r#"{"by":"first"}"#), "w1", None)).await.unwrap();
    // The same result again (a retry after an unknown commit result): answered as applied.
    let again = report_one(&w, report(&a, ta, success(r#"{"by":"first"}"#), "w1", None)).await;
    assert_eq!(again.unwrap().status(), ExecutionStatus::Succeeded);
    // Another output for the same attempt: not a success, and the first output stays.
    let other = report_one(&w, report(&a, ta, success(r#"{"by":"second"}"#), "w1", None)).await;
    assert!(
        matches!(&other, Err(Error::FencedOut { reason, .. }) if reason.contains("already ended")),
        "{other:?}"
    );
    assert_eq!(w.sched.get(NS, &a).await.unwrap().output_json, br#"{"by":"first"}"#);
    let failure = report_one(&w, report(&a, ta, Outcome::Failure(err("no", false)), "w1", None));
    assert!(matches!(failure.await, Err(Error::FencedOut { .. })));
    // A failure repeated is applied once; the same attempt failed with another error is refused.
    let failed = report_one(&w, report(&b, tb, Outcome::Failure(err("bad", false)), "w1", None));
    assert_eq!(failed.await.unwrap().status(), ExecutionStatus::Failed);
    let repeat = report_one(&w, report(&b, tb, Outcome::Failure(err("bad", false)), "w1", None));
    assert_eq!(repeat.await.unwrap().status(), ExecutionStatus::Failed);
    let changed = report_one(&w, report(&b, tb, Outcome::Failure(err("worse", false)), "w1", None));
    assert!(matches!(changed.await, Err(Error::FencedOut { .. })));
    let late_success = report_one(&w, report(&b, tb, success("{}"), "w1", None)).await;
    assert!(matches!(late_success, Err(Error::FencedOut { .. })), "{late_success:?}");
    w.check_invariants().await;
}

#[tokio::test]
async fn an_attempt_started_with_a_counted_token_still_completes() {
    // An attempt a build before the change started: its record holds token 1 (tokens counted
    // 1, 2, …), and its worker holds that token.
    let w = world(35, FaultConfig::none()).await;
    let (id, _) = running(&w, 1, "w1").await.remove(0);
    let key = w.ks.execution(NS, &id);
    let tx = w.store.begin().unwrap();
    let mut e = Execution::decode(&tx.get(&key, false).await.unwrap().unwrap()[..]).unwrap();
    e.fencing_token = 1;
    tx.set(&key, &e.encode_to_vec()).unwrap();
    tx.commit().await.unwrap();
    let beat = Beat {
        namespace: NS.into(),
        execution_id: id.clone(),
        token: 1,
        worker_id: Some("w1".into()),
        queue: None,
    };
    w.sched.heartbeat(vec![beat]).await.unwrap().pop().unwrap().unwrap();
    let done = report_one(&w, report(&id, 1, success("{}"), "w1", None)).await.unwrap();
    assert_eq!(done.status(), ExecutionStatus::Succeeded);
    w.check_invariants().await;
}
