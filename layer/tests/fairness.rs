//! Fair firing: a namespace with a few timers due behind another namespace's backlog gets its
//! share of the very next fire batch (weighted round robin), not the batch after the backlog;
//! every timer still fires exactly once and the store stays consistent.

mod common;

use std::collections::BTreeMap;

use common::*;
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::ops::check::check_records;
use kairos_proto::storage::v1::ExecutionStatus;

/// `n` executions of `ns` due at `at`, spread over every shard.
async fn submit(w: &World, ns: &str, n: usize, at: i64) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let mut r = request(None, at);
        r.namespace = ns.into();
        ids.push(w.sched.submit(r).await.unwrap().execution.id);
    }
    ids
}

/// Fires one batch of `limit` on every shard: how many of each namespace.
async fn one_round(w: &World, limit: usize) -> BTreeMap<String, usize> {
    let mut by_ns = BTreeMap::new();
    for shard in 0..SHARDS {
        let out = w
            .sched
            .fire_due(shard, w.epochs[shard as usize], w.now_ms(), limit, &Default::default())
            .await
            .unwrap();
        for f in out.fired {
            *by_ns.entry(f.namespace.clone()).or_default() += 1;
        }
    }
    by_ns
}

#[tokio::test]
async fn a_trickle_behind_a_backlog_fires_in_the_next_batch() {
    let w = world(31, FaultConfig::none()).await;
    w.sched.register_definition("b", report_definition(), "test").await.unwrap();
    // 2,000 of `default` due first, then 12 of b due a second later.
    submit(&w, NS, 2_000, T0 + 1_000).await;
    let b = submit(&w, "b", 12, T0 + 2_000).await;
    w.advance_ms(3_000);
    let first = one_round(&w, 50).await;
    assert_eq!(first.get("b").copied().unwrap_or(0), 12, "{first:?}");
    assert_eq!(first[NS], 4 * 50 - 12, "the rest of the batches go to the backlog");
    for id in &b {
        let e = w.sched.get("b", id).await.unwrap();
        assert_eq!(e.status(), ExecutionStatus::Ready);
    }
    // Everything else fires, each once.
    let rest = w.fire_all().await;
    assert_eq!(rest, 2_000 - first[NS]);
    let counts: Vec<_> =
        w.sched.status_counts(NS).await.unwrap().into_iter().filter(|(_, n)| *n > 0).collect();
    assert_eq!(counts, vec![(ExecutionStatus::Ready, 2_000)]);
    let report = check_records(w.sched.database(), w.sched.keyspace(), |_| {}).await.unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
}

#[tokio::test]
async fn weights_share_a_batch() {
    let w = world(32, FaultConfig::none()).await;
    let weights = BTreeMap::from([("heavy".to_string(), 3)]);
    let w = World { sched: w.sched.clone().with_namespace_weights(weights), ..w };
    for ns in ["heavy", "light"] {
        w.sched.register_definition(ns, report_definition(), "test").await.unwrap();
    }
    // `light` first (earliest due), then `heavy`: both with far more than a batch per shard.
    submit(&w, "light", 800, T0 + 1_000).await;
    submit(&w, "heavy", 800, T0 + 1_500).await;
    w.advance_ms(2_000);
    let round = one_round(&w, 40).await;
    assert_eq!((round["heavy"], round["light"]), (4 * 30, 4 * 10), "3:1, {round:?}");
}

#[tokio::test]
async fn without_the_fair_scan_timers_fire_in_time_order() {
    let w = world(33, FaultConfig::none()).await;
    let w = World { sched: w.sched.clone().with_fair_scan(0), ..w };
    w.sched.register_definition("b", report_definition(), "test").await.unwrap();
    submit(&w, NS, 2_000, T0 + 1_000).await;
    submit(&w, "b", 12, T0 + 2_000).await;
    w.advance_ms(3_000);
    let first = one_round(&w, 50).await;
    assert_eq!(first.get("b"), None, "behind the backlog: {first:?}");
}
