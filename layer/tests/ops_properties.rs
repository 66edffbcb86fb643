//! Scheduler operations under concurrency and injected faults: idempotency, races, and the
//! cross-record invariants (no timer below a watermark, attempts ≤ max, indexes consistent).

mod common;

use std::collections::BTreeSet;

use common::*;
use kairos_layer::env::Rng;
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::ops::Error;
use kairos_layer::ops::query::ListQuery;
use kairos_proto::storage::v1::{ExecutionError, ExecutionStatus};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicate_submits_create_one_execution() {
    let w = world(10, FaultConfig::all(0.05)).await;
    let mut joins = Vec::new();
    for _ in 0..32 {
        let sched = w.sched.clone();
        joins.push(tokio::spawn(async move {
            sched.submit(request(Some("dup-key"), T0 + 5_000)).await
        }));
    }
    let mut ids = BTreeSet::new();
    let mut created = 0;
    for j in joins {
        let s = j.await.unwrap().expect("submit succeeds");
        ids.insert(s.execution.id);
        created += usize::from(s.created);
    }
    assert_eq!(ids.len(), 1, "one execution per idempotency key");
    assert!(created <= 1, "at most one call reports creating it ({created})");
    let page =
        w.sched.list(&ListQuery { namespace: NS.into(), ..ListQuery::default() }).await.unwrap();
    assert_eq!(page.executions.len(), 1);
    w.check_invariants().await;
}

#[tokio::test]
async fn reusing_a_key_for_another_request_is_a_conflict() {
    let w = world(11, FaultConfig::none()).await;
    let first = w.sched.submit(request(Some("k"), T0 + 1_000)).await.unwrap();
    let same = w.sched.submit(request(Some("k"), T0 + 1_000)).await.unwrap();
    assert_eq!((same.execution.id.clone(), same.created), (first.execution.id.clone(), false));
    let mut other = request(Some("k"), T0 + 1_000);
    other.inputs["report_date"] = serde_json::json!("2026-08-13");
    for req in [other, request(Some("k"), T0 + 2_000)] {
        let e = w.sched.submit(req).await.unwrap_err();
        match &e {
            Error::IdempotencyConflict { key, execution_id } => {
                assert_eq!(key, "k");
                assert_eq!(execution_id, &first.execution.id);
            }
            other => panic!("expected a conflict, got {other}"),
        }
        assert!(e.to_string().contains("\"k\""), "the message names the key: {e}");
    }
}

/// A valid request, changed by `f`.
fn changed(
    f: impl FnOnce(&mut kairos_layer::ops::submit::SubmitRequest),
) -> kairos_layer::ops::submit::SubmitRequest {
    let mut r = request(None, T0);
    f(&mut r);
    r
}

/// Requests each wrong in one field: (request, the field its error names).
fn bad_requests() -> Vec<(kairos_layer::ops::submit::SubmitRequest, &'static str)> {
    vec![
        (changed(|r| r.definition = "nope".into()), "definition"),
        (changed(|r| r.definition_version = 9), "definition"),
        (changed(|r| r.definition_version = 0), "definitionVersion"),
        (
            changed(|r| r.inputs["report_date"] = serde_json::json!("2026-13-01")),
            "inputs.report_date",
        ),
        (changed(|r| r.inputs["extra"] = serde_json::json!(1)), "inputs.extra"),
        (
            changed(|r| r.inputs = serde_json::json!({"report_date": "2026-01-01"})),
            "inputs.dataset_uri",
        ),
        (changed(|r| r.inputs = serde_json::json!([1, 2])), "inputs"),
        (request(None, T0 + 11 * 366 * 24 * 3_600_000), "executeAt"),
        (request(None, T0 - 2 * 24 * 3_600_000), "executeAt"),
        (request(Some(""), T0), "idempotencyKey"),
        (request(Some(&"x".repeat(300)), T0), "idempotencyKey"),
        (changed(|r| r.namespace = "bad namespace".into()), "namespace"),
        (
            changed(|r| {
                r.inputs["dataset_uri"] = serde_json::json!(format!("s3://{}", "x".repeat(40_000)))
            }),
            "inputs",
        ),
    ]
}

#[tokio::test]
async fn bad_submissions_name_the_field() {
    let w = world(12, FaultConfig::none()).await;
    let cases = bad_requests();
    for (req, field) in cases {
        let e = w.sched.submit(req).await.unwrap_err();
        let msg = e.to_string();
        match &e {
            Error::InvalidArgument { field: f, .. } => {
                assert!(f.starts_with(field), "{field}: got {msg}")
            }
            Error::NotFound { what, .. } => assert_eq!(*what, field, "{msg}"),
            other => panic!("{field}: unexpected {other}"),
        }
    }
    assert!(w.dump().await.keys().all(|k| !k.is_empty()));
    let page =
        w.sched.list(&ListQuery { namespace: NS.into(), ..ListQuery::default() }).await.unwrap();
    assert!(page.executions.is_empty(), "nothing stored for rejected submissions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_races_with_fire_and_claim() {
    let w = world(13, FaultConfig::none()).await;
    let mut outcomes = [0usize; 2];
    for round in 0..40 {
        let id = w.sched.submit(request(None, w.now_ms())).await.unwrap().execution.id;
        if round % 2 == 0 {
            w.fire_all().await; // race cancel against claim of a READY execution
        }
        let (s1, s2) = (w.sched.clone(), w.sched.clone());
        let id2 = id.clone();
        let cancel = tokio::spawn(async move { s1.cancel(NS, &id2, "test").await });
        let epochs = w.epochs.clone();
        let now = w.now_ms();
        let claim = tokio::spawn(async move {
            for shard in 0..SHARDS {
                s2.fire_due(shard, epochs[shard as usize], now, 100, &Default::default())
                    .await
                    .unwrap();
            }
            s2.claim_for(NS, "report", "w", 5, None).await.unwrap()
        });
        let cancelled = cancel.await.unwrap();
        let claimed = claim.await.unwrap();
        let e = w.sched.get(NS, &id).await.unwrap();
        match cancelled {
            Ok(c) if c.done => {
                outcomes[0] += 1;
                assert_eq!(e.status(), ExecutionStatus::Cancelled);
                assert!(
                    claimed.iter().all(|c| c.execution.id != id),
                    "a cancelled execution was claimed"
                );
            }
            Ok(_) => {
                // It was claimed first: RUNNING with cancellation requested; a handler that
                // completes anyway makes it SUCCEEDED.
                outcomes[1] += 1;
                assert_eq!(e.status(), ExecutionStatus::Running);
                assert!(e.cancel_requested);
                let done = w
                    .sched
                    .complete(NS, &id, e.fencing_token, Vec::new(), String::new())
                    .await
                    .unwrap();
                assert_eq!(done.status(), ExecutionStatus::Succeeded);
            }
            Err(other) => panic!("unexpected {other}"),
        }
        w.check_invariants().await;
        w.advance_ms(7);
    }
    assert_eq!(outcomes.iter().sum::<usize>(), 40);
}

/// Runs one random step of a workload: submits (past, present, future), firing, claims,
/// heartbeats, completions, failures, cancels and time passing.
async fn random_step(w: &World, rng: &Rng, running: &mut Vec<(String, u64)>) {
    match rng.below(10) {
        0..=2 => {
            let offset = rng.between(0, 240_000) as i64 - 60_000;
            let key = (rng.chance(0.3)).then(|| format!("key-{}", rng.below(20)));
            let _ = w.sched.submit(request(key.as_deref(), w.now_ms() + offset)).await;
        }
        3 => {
            w.fire_all().await;
        }
        4 => {
            let claimed = w
                .sched
                .claim_for(NS, "report", "w", 1 + rng.below(4) as usize, Some(5_000))
                .await
                .unwrap();
            running.extend(claimed.into_iter().map(|c| (c.execution.id, c.attempt.fencing_token)));
        }
        5 if !running.is_empty() => {
            let (id, token) = running.swap_remove(rng.below(running.len() as u64) as usize);
            let r = if rng.chance(0.5) {
                w.sched.complete(NS, &id, token, Vec::new(), String::new()).await.map(|_| ())
            } else {
                let retryable = rng.chance(0.7);
                let error =
                    ExecutionError { message: "boom".into(), retryable, code: String::new() };
                w.sched.fail(NS, &id, token, error).await.map(|_| ())
            };
            assert!(matches!(r, Ok(()) | Err(Error::FencedOut { .. })), "{r:?}");
        }
        6 if !running.is_empty() => {
            let (id, token) = &running[rng.below(running.len() as u64) as usize];
            let r = w.sched.heartbeat_one(NS, id, *token).await;
            assert!(matches!(r, Ok(_) | Err(Error::FencedOut { .. })), "{r:?}");
        }
        7 => {
            let page = w
                .sched
                .list(&ListQuery { namespace: NS.into(), limit: 50, ..ListQuery::default() })
                .await
                .unwrap();
            if let Some(e) =
                page.executions.get(rng.below(page.executions.len().max(1) as u64) as usize)
            {
                let r = w.sched.cancel(NS, &e.id, "test").await;
                assert!(matches!(r, Ok(_) | Err(Error::FailedPrecondition(_))), "{r:?}");
            }
        }
        _ => w.advance_ms(rng.between(1, 8_000)),
    }
}

#[tokio::test]
async fn random_workloads_with_faults_keep_every_invariant() {
    for seed in 0..8u64 {
        let faults =
            if seed % 2 == 0 { FaultConfig::from_seed(seed) } else { FaultConfig::all(0.03) };
        let w = world(100 + seed, faults).await;
        let rng = Rng::seeded(seed);
        let mut running = Vec::new();
        for step in 0..300 {
            random_step(&w, &rng, &mut running).await;
            if step % 25 == 0 {
                w.check_invariants().await;
            }
        }
        // Liveness: with workers completing everything, all reach a terminal state.
        for _ in 0..200 {
            w.advance_ms(5_000);
            w.fire_all().await;
            for c in w.sched.claim_for(NS, "report", "finisher", 50, None).await.unwrap() {
                w.sched
                    .complete(
                        NS,
                        &c.execution.id,
                        c.attempt.fencing_token,
                        Vec::new(),
                        String::new(),
                    )
                    .await
                    .unwrap();
            }
        }
        w.check_invariants().await;
        let page = w
            .sched
            .list(&ListQuery { namespace: NS.into(), limit: 1_000, ..ListQuery::default() })
            .await
            .unwrap();
        assert!(!page.executions.is_empty());
        for e in &page.executions {
            assert!(
                kairos_layer::state::is_terminal(e.status()),
                "seed {seed}: {} stuck in {:?}",
                e.id,
                e.status()
            );
        }
    }
}

/// Every operation run twice — its commit applied but reported `commit_unknown_result`, so
/// the retry loop runs it again — leaves exactly the state of running it once.
#[tokio::test]
async fn every_operation_twice_equals_once() {
    let once = world(20, FaultConfig::none()).await;
    let twice =
        world(20, FaultConfig { unknown_result_applied: Some(1.0), ..FaultConfig::none() }).await;
    async fn script(w: &World) {
        let a = w.sched.submit(request(Some("a"), T0)).await.unwrap().execution.id;
        let b = w.sched.submit(request(None, T0 + 1_000)).await.unwrap().execution.id;
        let c = w.sched.submit(request(None, T0 + 120_000)).await.unwrap().execution.id;
        w.advance_ms(1_000);
        w.fire_all().await;
        let claimed = w.sched.claim_for(NS, "report", "w", 2, Some(5_000)).await.unwrap();
        assert_eq!(claimed.len(), 2);
        let token =
            |id: &str| claimed.iter().find(|c| c.execution.id == id).unwrap().attempt.fencing_token;
        w.advance_ms(1_000);
        w.sched.heartbeat_one(NS, &a, token(&a)).await.unwrap();
        w.sched.complete(NS, &a, token(&a), b"{}".to_vec(), "ref".into()).await.unwrap();
        let err = ExecutionError { message: "no".into(), retryable: false, code: String::new() };
        w.sched.fail(NS, &b, token(&b), err).await.unwrap();
        w.sched.replay(NS, &b, "test").await.unwrap();
        w.sched.cancel(NS, &b, "test").await.unwrap();
        w.sched.cancel(NS, &c, "test").await.unwrap();
        let d = w.sched.submit(request(None, T0 + 2_000)).await.unwrap().execution.id;
        w.advance_ms(1_000);
        w.fire_all().await;
        w.sched.claim_for(NS, "report", "w", 1, Some(5_000)).await.unwrap();
        w.advance_ms(5_000);
        w.fire_all().await; // lease expiry → retry timer
        w.sched.cancel(NS, &d, "test").await.unwrap();
        w.sched.release_shard(0, NODE, w.epochs[0]).await.unwrap();
        w.sched.acquire_shard(0, NODE, 60_000).await.unwrap();
        let mut def = report_definition();
        def.version = 2;
        w.sched.register_definition(NS, def, "test").await.unwrap();
    }
    script(&once).await;
    script(&twice).await;
    let (a, b) = (once.dump().await, twice.dump().await);
    let differing: Vec<_> = a.keys().chain(b.keys()).filter(|k| a.get(*k) != b.get(*k)).collect();
    assert!(differing.is_empty(), "{} keys differ, e.g. {:?}", differing.len(), differing.first());
    twice.check_invariants().await;
}

#[tokio::test]
async fn list_filters_and_pages() {
    let w = world(21, FaultConfig::none()).await;
    for i in 0..25 {
        w.sched.submit(request(None, T0 + i * 1_000)).await.unwrap();
    }
    w.advance_ms(10_000);
    w.fire_all().await; // 11 are due (0..=10 s)
    let ready = ListQuery {
        namespace: NS.into(),
        status: Some(ExecutionStatus::Ready),
        limit: 4,
        ..ListQuery::default()
    };
    let mut seen = Vec::new();
    let mut q = ready.clone();
    loop {
        let page = w.sched.list(&q).await.unwrap();
        seen.extend(page.executions.iter().map(|e| e.execute_at_ms));
        match page.next_cursor {
            Some(c) => q.cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(
        seen,
        (0..=10).map(|i| T0 + i * 1_000).collect::<Vec<_>>(),
        "ordered, no gaps or repeats"
    );
    let window = ListQuery {
        namespace: NS.into(),
        from_ms: Some(T0 + 5_000),
        to_ms: Some(T0 + 8_000),
        ..ListQuery::default()
    };
    assert_eq!(w.sched.list(&window).await.unwrap().executions.len(), 3, "[from, to)");
    let by_def = ListQuery {
        namespace: NS.into(),
        definition: Some("report".into()),
        limit: 1_000,
        ..ListQuery::default()
    };
    assert_eq!(w.sched.list(&by_def).await.unwrap().executions.len(), 25);
    let none = ListQuery {
        namespace: NS.into(),
        definition: Some("other".into()),
        ..ListQuery::default()
    };
    assert!(w.sched.list(&none).await.unwrap().executions.is_empty());
    let bad =
        ListQuery { namespace: NS.into(), cursor: Some(b"zzz".to_vec()), ..ListQuery::default() };
    assert!(
        matches!(w.sched.list(&bad).await, Err(Error::InvalidArgument { field, .. }) if field == "cursor")
    );
}

#[tokio::test]
async fn definitions_are_immutable_per_version() {
    let w = world(22, FaultConfig::none()).await;
    let (_, created) = w.sched.register_definition(NS, report_definition(), "test").await.unwrap();
    assert!(!created, "same content again is a no-op");
    let mut changed = report_definition();
    changed.queue = "elsewhere".into();
    let e = w.sched.register_definition(NS, changed.clone(), "test").await.unwrap_err();
    assert!(matches!(e, Error::AlreadyExists { .. }), "{e}");
    changed.version = 2;
    assert!(w.sched.register_definition(NS, changed, "test").await.unwrap().1);
    assert_eq!(w.sched.get_definition(NS, "report", None).await.unwrap().version, 2, "latest");
    assert_eq!(w.sched.get_definition(NS, "report", Some(1)).await.unwrap().queue, "report");
    assert_eq!(w.sched.list_definitions(NS).await.unwrap().len(), 2);
    assert!(matches!(
        w.sched.get_definition(NS, "report", Some(7)).await,
        Err(Error::NotFound { .. })
    ));
}

#[tokio::test]
async fn batches_report_each_request_and_dedup_inside() {
    let w = world(23, FaultConfig::all(0.02)).await;
    let mut reqs = vec![request(Some("same"), T0 + 1_000), request(Some("same"), T0 + 1_000)];
    let mut bad = request(None, T0);
    bad.inputs["report_date"] = serde_json::json!("not a date");
    reqs.push(bad);
    reqs.push({
        let mut r = request(Some("other"), T0);
        r.definition = "missing".into();
        r
    });
    reqs.extend((0..50).map(|i| request(None, T0 + i)));
    let out = w.sched.submit_batch(reqs.into_iter().map(Ok).collect()).await.unwrap();
    assert_eq!(out.len(), 54);
    let a = out[0].as_ref().unwrap();
    let b = out[1].as_ref().unwrap();
    assert!(
        a.created && !b.created && a.execution.id == b.execution.id,
        "one execution per key in a batch"
    );
    assert!(
        matches!(&out[2], Err(Error::InvalidArgument { field, .. }) if field == "inputs.report_date")
    );
    assert!(matches!(&out[3], Err(Error::NotFound { .. })));
    assert!(out[4..].iter().all(|r| r.as_ref().is_ok_and(|s| s.created)));
    w.check_invariants().await;
    let too_many: Vec<_> = (0..1_001).map(|_| request(None, T0)).collect();
    assert!(matches!(
        w.sched.submit_batch(too_many.into_iter().map(Ok).collect()).await,
        Err(Error::InvalidArgument { .. })
    ));
}
