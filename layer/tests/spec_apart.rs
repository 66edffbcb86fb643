//! Issue 21, step 2 (keyspace format 3): what an execution is — its definition, input,
//! idempotency key, retry policy — is written once, at submit, as the value of its time index
//! entry; a transition rewrites only its small state record. A store of format 2 (every record
//! whole, time index values empty) opens as format 3, is read as it is, and each record is
//! split at its next write; `kairos check` reports a state whose spec is missing or damaged.

#![allow(clippy::disallowed_methods)] // a real file on a real disk

mod common;

use std::collections::BTreeMap;

use common::*;
use kairos_layer::env::{ManualClock, Timestamp};
use kairos_layer::keys::{Keyspace, Tag};
use kairos_layer::kv::Database;
use kairos_layer::ops::check::check_records;
use kairos_layer::ops::query::ListQuery;
use kairos_layer::ops::submit::SubmitRequest;
use kairos_layer::ops::{Error, Scheduler};
use kairos_proto::storage::v1::{ClusterConfig, Execution, ExecutionSpec, ExecutionStatus};
use prost::Message;

fn numbered(i: usize, at: i64) -> SubmitRequest {
    let mut r = request(Some(&format!("key-{i}")), at);
    r.inputs = serde_json::json!({
        "dataset_uri": format!("s3://datasets/orders-{i}-{}", "x".repeat(i * 40)),
        "report_date": "2028-02-29",
    });
    r
}

/// The raw state record and time index value of every execution.
async fn raw(db: &Database, ks: &Keyspace) -> BTreeMap<String, (Execution, Vec<u8>)> {
    let (states, specs) = db
        .run(|tx| async move {
            let s = tx.get_range(&ks.subspace_range(Tag::Execution), true).await?;
            let t = tx.get_range(&ks.subspace_range(Tag::ByTime), true).await?;
            Ok::<_, Error>((s, t))
        })
        .await
        .unwrap();
    let mut by_id: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for kv in &specs {
        by_id.insert(ks.parse_by_time(&kv.key).unwrap().2, kv.value.to_vec());
    }
    states
        .iter()
        .map(|kv| {
            let e = Execution::decode(&kv.value[..]).unwrap();
            let spec = by_id.remove(&e.id).expect("every execution has a time index entry");
            (e.id.clone(), (e, spec))
        })
        .collect()
}

/// Every execution as the API reads it, by id.
async fn all(sched: &Scheduler) -> BTreeMap<String, Execution> {
    let q = ListQuery { namespace: NS.into(), limit: 1_000, ..ListQuery::default() };
    let page = sched.list(&q).await.unwrap();
    assert!(page.unreadable.is_empty(), "{:?}", page.unreadable);
    page.executions.into_iter().map(|e| (e.id.clone(), e)).collect()
}

/// The same execution whatever its layout.
fn same(mut a: Execution, mut b: Execution) {
    (a.spec_apart, b.spec_apart) = (false, false);
    assert_eq!(a, b);
}

/// Twelve executions: four left SCHEDULED (due later), and of those due now, READY, RUNNING,
/// RETRY_WAIT and SUCCEEDED ones.
async fn a_store(sched: &Scheduler, clock: &ManualClock) -> i64 {
    sched.register_definition(NS, report_definition(), "test").await.unwrap();
    let now = kairos_layer::env::Clock::now(clock).as_millis();
    let items = (0..12).map(|i| Ok(numbered(i, if i < 4 { now + 120_000 } else { now })));
    sched.submit_batch(items.collect()).await.unwrap().into_iter().for_each(|r| drop(r.unwrap()));
    for s in 0..4u32 {
        let epoch = sched.acquire_shard(s, NODE, 3_600_000).await.unwrap().epoch;
        sched.fire_due(s, epoch, now, 100, &Default::default()).await.unwrap();
    }
    let claimed = sched.claim_for(NS, "report", "w", 6, None).await.unwrap();
    for (i, c) in claimed.iter().enumerate().take(4) {
        let (id, token) = (&c.execution.id, c.attempt.fencing_token);
        if i < 2 {
            sched.complete(NS, id, token, b"{}".to_vec(), String::new()).await.unwrap();
        } else {
            let err = kairos_proto::storage::v1::ExecutionError {
                message: "again".into(),
                retryable: true,
                code: String::new(),
            };
            sched.fail(NS, id, token, err).await.unwrap();
        }
    }
    now
}

/// Rewrites the store as format 2 left it: every record whole, time index values empty.
async fn as_format_2(db: &Database, sched: &Scheduler) {
    let ks = sched.keyspace();
    let whole = all(sched).await;
    db.run(|tx| {
        let whole = whole.clone();
        async move {
            for e in whole.values() {
                let e = Execution { spec_apart: false, ..e.clone() };
                tx.set(&ks.execution(NS, &e.id), &e.encode_to_vec())?;
                tx.set(&ks.by_time(NS, e.execute_at_ms, &e.id), b"")?;
            }
            let mut config =
                ClusterConfig::decode(&tx.get(&ks.cluster()).await?.unwrap()[..]).unwrap();
            config.format_version = 2;
            tx.set(&ks.cluster(), &config.encode_to_vec())
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_transition_rewrites_the_state_only_and_the_spec_is_kept_apart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let (db, sched) = open_file(&dir.path().join("kv.redb"), &clock).await;
    a_store(&sched, &clock).await;
    let ks = sched.keyspace().clone();
    let whole = all(&sched).await;
    assert_eq!(whole.len(), 12);
    for (id, (state, spec)) in raw(&db, &ks).await {
        assert!(state.spec_apart, "{id}");
        assert!(state.input_json.is_empty() && state.definition_name.is_empty(), "{state:?}");
        assert!(state.retry_policy.is_some() && state.idempotency_key.is_empty(), "{state:?}");
        let spec = ExecutionSpec::decode(&spec[..]).unwrap();
        let e = &whole[&id];
        assert_eq!(spec.input_json, e.input_json);
        assert!(String::from_utf8_lossy(&e.input_json).contains("orders-"), "{e:?}");
        assert_eq!(
            (spec.definition_name.as_str(), spec.idempotency_key.is_empty()),
            ("report", false)
        );
        same(sched.get(NS, &id).await.unwrap(), e.clone());
        let by_key = sched.get_by_idempotency_key(NS, &e.idempotency_key).await.unwrap();
        same(by_key, e.clone());
    }
    let report = check_records(&db, &ks, |_| {}).await.unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
}

#[tokio::test]
async fn a_format_2_store_is_read_as_it_is_and_split_at_each_record_s_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.redb");
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let (db, sched) = open_file(&path, &clock).await;
    let now = a_store(&sched, &clock).await;
    let before = all(&sched).await;
    as_format_2(&db, &sched).await;
    let ks = sched.keyspace().clone();
    let report = check_records(&db, &ks, |_| {}).await.unwrap();
    assert!(report.is_clean(), "a format 2 store is not damage: {:#?}", report.findings);
    db.close().await;
    drop((db, sched));

    let (db, sched) = open_file(&path, &clock).await;
    assert_eq!(
        sched.config().format_version,
        kairos_layer::ops::FORMAT_VERSION,
        "raised at open, so format 2 binaries refuse it"
    );
    let whole = raw(&db, &ks).await;
    assert!(whole.values().all(|(e, spec)| !e.spec_apart && spec.is_empty()), "nothing rewritten");
    for (id, e) in &before {
        same(sched.get(NS, id).await.unwrap(), e.clone());
    }
    // Run everything to its end: each record is split at its first write after the upgrade.
    let running: Vec<_> = before
        .values()
        .filter(|e| e.status() == ExecutionStatus::Running)
        .map(|e| (e.id.clone(), e.fencing_token))
        .collect();
    assert_eq!(running.len(), 2);
    let mut done = 0;
    for (id, token) in running {
        sched.complete(NS, &id, token, b"{}".to_vec(), String::new()).await.unwrap();
        done += 1;
    }
    clock.advance(std::time::Duration::from_secs(600));
    let later = now + 600_000;
    for s in 0..4u32 {
        let epoch = sched.acquire_shard(s, NODE, 3_600_000).await.unwrap().epoch;
        sched.fire_due(s, epoch, later, 100, &Default::default()).await.unwrap();
    }
    loop {
        let claimed = sched.claim_for(NS, "report", "w", 20, None).await.unwrap();
        if claimed.is_empty() {
            break;
        }
        for c in claimed {
            let (id, token) = (&c.execution.id, c.attempt.fencing_token);
            assert_eq!(c.execution.input_json, before[id].input_json, "the task carries its input");
            sched.complete(NS, id, token, b"{}".to_vec(), String::new()).await.unwrap();
            done += 1;
        }
    }
    assert_eq!(done, 10, "all but the two that had succeeded before the upgrade");
    let after = all(&sched).await;
    for (id, (state, spec)) in raw(&db, &ks).await {
        let e = &after[&id];
        assert_eq!(e.status(), ExecutionStatus::Succeeded, "{id}");
        assert_eq!(e.input_json, before[&id].input_json);
        assert_eq!(e.idempotency_key, before[&id].idempotency_key);
        let succeeded_before = before[&id].status() == ExecutionStatus::Succeeded;
        assert_eq!(state.spec_apart, !succeeded_before, "split at its next write only: {id}");
        assert_eq!(spec.is_empty(), succeeded_before);
    }
    let report = check_records(&db, &ks, |_| {}).await.unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
}

#[tokio::test]
async fn a_state_without_its_spec_is_damage_reported_not_served_as_empty() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_millis(T0));
    let (db, sched) = open_file(&dir.path().join("kv.redb"), &clock).await;
    a_store(&sched, &clock).await;
    let ks = sched.keyspace().clone();
    let whole = all(&sched).await;
    let mut ids = whole.keys();
    let (blank, garbled) = (ids.next().unwrap().clone(), ids.next().unwrap().clone());
    let keys = [&blank, &garbled].map(|id| ks.by_time(NS, whole[id].execute_at_ms, id));
    let keys = &keys;
    db.run(|tx| async move {
        tx.set(&keys[0], b"")?;
        tx.set(&keys[1], b"\xff\xff\xff")
    })
    .await
    .unwrap();
    for id in [&blank, &garbled] {
        let err = sched.get(NS, id).await.unwrap_err();
        assert!(matches!(err, Error::Corrupt(_)), "{err:?}");
    }
    let q = ListQuery { namespace: NS.into(), limit: 1_000, ..ListQuery::default() };
    let page = sched.list(&q).await.unwrap();
    assert_eq!(page.executions.len(), 10);
    let mut unreadable = page.unreadable.clone();
    unreadable.sort();
    let mut want = vec![blank.clone(), garbled.clone()];
    want.sort();
    assert_eq!(unreadable, want, "named, never left out silently");
    let report = check_records(&db, &ks, |_| {}).await.unwrap();
    let problems: Vec<&str> = report.findings.iter().map(|f| f.problem.as_str()).collect();
    assert!(
        problems.iter().any(|p| p.contains(&format!("execution {blank:?} has no spec"))),
        "{problems:#?}"
    );
    assert!(problems.iter().any(|p| p.contains("the spec does not decode")), "{problems:#?}");
}
