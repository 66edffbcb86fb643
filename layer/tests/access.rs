//! API keys and the audit log in the store: keys are stored hashed and revoked for good; an
//! audited action and its record commit together (a retried transaction writes one record);
//! the audit sweep deletes exactly what is older than its cutoff; `kairos check` reads both
//! subspaces cleanly.

mod common;

use common::*;
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::ops::access::{parse_token, secret_matches};
use kairos_layer::ops::check::check_records;

#[tokio::test]
async fn keys_are_hashed_revoked_for_good_and_audited() {
    let w = world(21, FaultConfig::none()).await;
    let k = w
        .sched
        .create_api_key("a", &["read".into(), "worker".into()], "ci", "key:root")
        .await
        .unwrap();
    let (id, secret) = parse_token(&k.token).unwrap();
    assert_eq!(id, k.key.id);
    let stored = w.sched.api_key(id).await.unwrap().unwrap();
    assert!(secret_matches(&stored, secret));
    assert!(!secret_matches(&stored, &"0".repeat(48)));
    assert_eq!(stored.scopes, vec!["read".to_string(), "worker".to_string()]);
    assert!(w.sched.has_live_api_keys().await.unwrap());
    let e = w.sched.create_api_key("bad ns", &["read".into()], "", "x").await.unwrap_err();
    assert!(e.to_string().starts_with("namespace:"), "{e}");

    w.advance_ms(1_000);
    let r = w.sched.revoke_api_key(id, "key:root").await.unwrap();
    assert!(r.revoked_at_ms > 0);
    // Idempotent: revoking again changes nothing (and records nothing more).
    let again = w.sched.revoke_api_key(id, "key:other").await.unwrap();
    assert_eq!((again.revoked_at_ms, again.revoked_by.as_str()), (r.revoked_at_ms, "key:root"));
    assert!(!w.sched.has_live_api_keys().await.unwrap());
    let log = w.sched.audit_log("a", 0, 100).await.unwrap();
    let actions: Vec<&str> = log.iter().map(|a| a.action.as_str()).collect();
    assert_eq!(actions, ["key.create", "key.revoke"]);
    assert!(log.iter().all(|a| a.who == "key:root"));
}

#[tokio::test]
async fn audited_actions_commit_with_their_record_even_when_retried() {
    // Commits that fail with an unknown result are retried by `run`: one record each.
    let w =
        world(22, FaultConfig { unknown_result_applied: Some(0.3), ..FaultConfig::none() }).await;
    let mut ids = Vec::new();
    for i in 0..10 {
        let key = format!("k{i}");
        ids.push(w.sched.submit(request(Some(&key), T0 + 3_600_000)).await.unwrap().execution.id);
    }
    for id in &ids {
        w.sched.cancel(NS, id, "key:ops").await.unwrap();
    }
    let cancels = || async {
        let log = w.sched.audit_log(NS, 0, 1_000).await.unwrap();
        log.into_iter().filter(|a| a.action == "execution.cancel").collect::<Vec<_>>()
    };
    let log = cancels().await;
    assert_eq!(log.len(), 10, "{log:#?}");
    assert!(log.iter().all(|a| a.who == "key:ops"));
    let mut targets: Vec<&str> = log.iter().map(|a| a.target.as_str()).collect();
    targets.sort_unstable();
    let mut want: Vec<&str> = ids.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(targets, want);
    // Cancelling again changes nothing: nothing more recorded.
    w.sched.cancel(NS, &ids[0], "key:ops").await.unwrap();
    assert_eq!(cancels().await.len(), 10);
}

#[tokio::test]
async fn the_audit_sweep_deletes_exactly_what_is_older_than_its_cutoff() {
    let w = world(23, FaultConfig::none()).await;
    for i in 0..5 {
        let ns = if i % 2 == 0 { "a" } else { "b" };
        w.sched.create_api_key(ns, &["read".into()], "", "t").await.unwrap();
        w.advance_ms(1_000);
    }
    w.sched.create_api_key("*", &["admin".into()], "", "t").await.unwrap();
    // (`default` holds the registrations of the world's definitions.)
    assert_eq!(w.sched.audit_namespaces().await.unwrap(), ["*", "a", "b", "default"]);
    let cutoff = w.sched.clock().now().as_millis() - 2_500; // after the 3rd record
    let mut deleted = 0;
    for ns in ["*", "a", "b"] {
        deleted += w.sched.sweep_audit(ns, cutoff, 500).await.unwrap();
    }
    assert_eq!(deleted, 3);
    let left: usize = [
        w.sched.audit_log("a", 0, 100).await.unwrap().len(),
        w.sched.audit_log("b", 0, 100).await.unwrap().len(),
        w.sched.audit_log("*", 0, 100).await.unwrap().len(),
    ]
    .iter()
    .sum();
    assert_eq!(left, 3);
    let report = check_records(w.sched.database(), w.sched.keyspace(), |_| {}).await.unwrap();
    assert!(report.is_clean(), "{:#?}", report.findings);
}

#[tokio::test]
async fn the_last_cluster_admin_key_cannot_be_revoked() {
    let w = world(24, FaultConfig::none()).await;
    let scopes = ["admin".to_string()];
    let admin = |name: &'static str| w.sched.create_api_key("*", &scopes, name, "test");
    let first = admin("first").await.unwrap().key.id;
    // A namespace's admin and a `*` key without `admin` do not count as cluster admins.
    w.sched.create_api_key("a", &["admin".into()], "ns admin", "test").await.unwrap();
    let read = ["read".to_string()];
    let reader = w.sched.create_api_key("*", &read, "all reader", "test").await.unwrap().key.id;
    let e = w.sched.revoke_api_key(&first, "key:x").await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains("last admin key") && text.contains("kairos admin-key"), "{text}");
    assert!(w.sched.api_key(&first).await.unwrap().unwrap().revoked_at_ms == 0, "still live");
    w.sched.revoke_api_key(&reader, "key:x").await.unwrap();
    // With a second one, either may go — but not both.
    let second = admin("second").await.unwrap().key.id;
    w.sched.revoke_api_key(&first, "key:x").await.unwrap();
    assert!(w.sched.revoke_api_key(&second, "key:x").await.is_err());
    let log = w.sched.audit_log("*", 0, 100).await.unwrap();
    let revokes: Vec<&str> =
        log.iter().filter(|a| a.action == "key.revoke").map(|a| a.target.as_str()).collect();
    assert_eq!(revokes, [reader.as_str(), first.as_str()], "a refused revoke records nothing");
}
