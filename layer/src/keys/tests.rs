//! The keyspace's encodings: bijective and order-preserving, every tag's parse, ranges that
//! cover exactly what they name.

use super::*;
use crate::env::Rng;

fn ks() -> Keyspace {
    Keyspace::new("test")
}

#[test]
fn every_key_the_layout_writes_passes_the_layout_check() {
    let ks = ks();
    let timer = TimerKey { bucket: 3, shard: 1, fire_at_ms: 10, execution_id: "e".into(), kind: 1 };
    let ready = ReadyKey {
        namespace: "ns".into(),
        queue: "q".into(),
        partition: 2,
        ready_at_ms: 5,
        execution_id: "e".into(),
    };
    let cron_timer = CronTimerKey { bucket: 1, shard: 2, fire_at_ms: 3, cron_job_id: "c".into() };
    let keys = [
        (Tag::Cluster, ks.cluster()),
        (Tag::Execution, ks.execution("ns", "e")),
        (Tag::Attempt, ks.attempt("ns", "e", 2)),
        (Tag::Idempotency, ks.idempotency("ns", "k")),
        (Tag::Timer, ks.timer(&timer)),
        (Tag::Watermark, ks.watermark(4)),
        (Tag::Node, ks.node("n")),
        (Tag::CronJob, ks.cron_job("ns", "c")),
        (Tag::CronTimer, ks.cron_timer(&cron_timer)),
        (Tag::Definition, ks.definition("ns", "d", 1)),
        (Tag::ByStatus, ks.by_status("ns", 3, 7, "e")),
        (Tag::ByDefinition, ks.by_definition("ns", "d", 7, "e")),
        (Tag::ByTime, ks.by_time("ns", 7, "e")),
        (Tag::PartitionOwner, ks.partition_owner(Space::Cron, 3)),
        (Tag::PartitionExpiry, ks.partition_expiry(Space::Executions, 3)),
        (Tag::Ready, ks.ready(&ready)),
        (Tag::ReadySignal, ks.ready_signal("ns", "q", 1)),
        (Tag::ClaimReceipt, ks.claim_receipt(9, 10, "n1")),
        (Tag::StatusCount, ks.status_count("ns", 2, 1)),
        (Tag::Quarantine, ks.quarantine(Space::Executions, 1, 5, b"k")),
        (Tag::CronWatermark, ks.cron_watermark(2)),
        (Tag::ApiKey, ks.api_key("k1")),
        (Tag::Audit, ks.audit("ns", 5, "a")),
    ];
    assert_eq!(keys.len(), Tag::ALL.len());
    for (tag, key) in &keys {
        assert_eq!(ks.tag_of(key), Some(*tag), "{tag:?}");
        assert!(ks.cluster_range().begin <= *key && *key < ks.cluster_range().end);
        ks.check_layout(*tag, key).unwrap_or_else(|e| panic!("{tag:?}: {e}"));
        // A key truncated by damage fails its layout.
        assert!(ks.check_layout(*tag, &key[..key.len() - 1]).is_err(), "{tag:?}");
    }
    assert_eq!(ks.tag_of(b"elsewhere"), None);
}

#[test]
fn subspaces_are_disjoint_and_ordered_by_tag() {
    let ks = ks();
    let ranges: Vec<RangeOption> = Tag::ALL.iter().map(|t| ks.subspace_range(*t)).collect();
    for w in ranges.windows(2) {
        assert!(w[0].end <= w[1].begin, "tag ranges overlap: {w:?}");
    }
    let mut values: Vec<i64> = Tag::ALL.iter().map(|t| *t as i64).collect();
    values.extend(Tag::RETIRED);
    values.sort_unstable();
    let expected: Vec<i64> = (1..=values.len() as i64).collect();
    assert_eq!(values, expected, "tags in use and retired ones cover 1..=n, never reused");
    // Every key builder lands inside its own subspace.
    let timer =
        TimerKey { bucket: 5, shard: 3, fire_at_ms: 300_000, execution_id: "E".into(), kind: 1 };
    let samples: Vec<(Tag, Vec<u8>)> = vec![
        (Tag::Cluster, ks.cluster()),
        (Tag::Execution, ks.execution("ns", "E")),
        (Tag::Attempt, ks.attempt("ns", "E", 2)),
        (Tag::Idempotency, ks.idempotency("ns", "k")),
        (Tag::Timer, ks.timer(&timer)),
        (Tag::PartitionOwner, ks.partition_owner(Space::Executions, 3)),
        (Tag::PartitionExpiry, ks.partition_expiry(Space::Cron, 3)),
        (Tag::Quarantine, ks.quarantine(Space::Executions, 1, 5, b"k")),
        (Tag::Watermark, ks.watermark(3)),
        (Tag::Node, ks.node("n1")),
        (Tag::Definition, ks.definition("ns", "d", 1)),
        (Tag::ByStatus, ks.by_status("ns", 1, 5, "E")),
        (Tag::ByDefinition, ks.by_definition("ns", "d", 5, "E")),
        (Tag::ByTime, ks.by_time("ns", 5, "E")),
        (Tag::ReadySignal, ks.ready_signal("ns", "q", 1)),
        (Tag::ClaimReceipt, ks.claim_receipt(5, 9, "")),
        (Tag::StatusCount, ks.status_count("ns", 3, 1)),
        (Tag::CronJob, ks.cron_job("ns", "C")),
        (
            Tag::CronTimer,
            ks.cron_timer(&CronTimerKey {
                bucket: 5,
                shard: 3,
                fire_at_ms: 300_000,
                cron_job_id: "C".into(),
            }),
        ),
        (Tag::CronWatermark, ks.cron_watermark(3)),
        (Tag::ApiKey, ks.api_key("k1")),
        (Tag::Audit, ks.audit("ns", 5, "a")),
    ];
    for (tag, key) in samples {
        let r = ks.subspace_range(tag);
        assert!(r.begin <= key && key < r.end, "{tag:?} key outside its subspace");
    }
    let other = Keyspace::new("other");
    assert!(other.execution("ns", "E") != ks.execution("ns", "E"), "clusters are separate");
}

#[test]
fn timer_keys_are_bijective_and_order_preserving() {
    let ks = ks();
    let rng = Rng::seeded(11);
    let mut keys: Vec<TimerKey> = (0..2_000)
        .map(|_| TimerKey {
            bucket: rng.between(0, 6) as i64 - 3,
            shard: rng.below(5) as u32,
            fire_at_ms: rng.between(0, 2_000_000) as i64 - 1_000_000,
            execution_id: format!("{:x}", rng.below(1 << 20)),
            kind: rng.between(1, 3) as i32,
        })
        .collect();
    for k in &keys {
        assert_eq!(&ks.parse_timer(&ks.timer(k)).unwrap(), k, "decode(encode(k)) == k");
    }
    keys.sort();
    keys.dedup();
    let encoded: Vec<Vec<u8>> = keys.iter().map(|k| ks.timer(k)).collect();
    assert!(encoded.windows(2).all(|w| w[0] < w[1]), "byte order = tuple order");
}

#[test]
fn due_range_covers_exactly_timers_at_or_before_now() {
    let ks = ks();
    let t = |fire_at_ms| TimerKey {
        bucket: 7,
        shard: 2,
        fire_at_ms,
        execution_id: "x".into(),
        kind: 1,
    };
    let r = ks.timers_due(7, 2, 1_000);
    for (at, inside) in [(999, true), (1_000, true), (1_001, false)] {
        let k = ks.timer(&t(at));
        assert_eq!(r.begin <= k && k < r.end, inside, "fire_at {at}");
    }
    let other_shard = TimerKey { shard: 3, ..t(5) };
    assert!(ks.timer(&other_shard) >= r.end);
}

#[test]
fn ready_and_index_keys_round_trip() {
    let ks = ks();
    let r = ReadyKey {
        namespace: "ns".into(),
        queue: "q".into(),
        partition: 3,
        ready_at_ms: 42,
        execution_id: "E1".into(),
    };
    assert_eq!(ks.parse_ready(&ks.ready(&r)).unwrap(), r);
    assert_eq!(
        ks.index_execution_id(Tag::ByStatus, &ks.by_status("ns", 2, 9, "E2")).unwrap(),
        "E2"
    );
    assert_eq!(ks.index_execution_id(Tag::ByTime, &ks.by_time("ns", 9, "E3")).unwrap(), "E3");
    assert_eq!(
        ks.parse_definition(&ks.definition("ns", "d", 4)).unwrap(),
        ("ns".into(), "d".into(), 4)
    );
    assert!(ks.parse_timer(&ks.execution("ns", "E")).is_err(), "foreign key rejected");
    let q = ks.ready_queue("ns", "q", 3);
    assert!(q.begin <= ks.ready(&r) && ks.ready(&r) < q.end);
    let other_partition = ks.ready(&ReadyKey { partition: 4, ..r.clone() });
    assert!(!(q.begin <= other_partition && other_partition < q.end));
    let q2 = ks.ready_queue("ns", "q2", 3);
    assert!(
        !(q.begin <= ks.ready(&ReadyKey { queue: "q2".into(), ..r.clone() })
            && ks.ready(&ReadyKey { queue: "q2".into(), ..r.clone() }) < q.end)
    );
    assert!(q2.begin >= q.end || q2.end <= q.begin, "queue prefixes do not nest");
    let owner = ks.partition_owner(Space::Cron, 7);
    assert_eq!(ks.parse_partition(Tag::PartitionOwner, &owner).unwrap(), (Space::Cron, 7));
    let (_, status, partition) = ks.parse_status_count(&ks.status_count("ns", 5, 2)).unwrap();
    assert_eq!((status, partition), (5, 2));
}

#[test]
fn cron_timer_keys_are_bijective_and_order_preserving() {
    let ks = Keyspace::new("test");
    let rng = Rng::seeded(12);
    let mut keys: Vec<CronTimerKey> = (0..2_000)
        .map(|_| CronTimerKey {
            bucket: rng.between(0, 6) as i64 - 3,
            shard: rng.below(5) as u32,
            fire_at_ms: rng.between(0, 2_000_000) as i64 - 1_000_000,
            cron_job_id: format!("{:x}", rng.below(1 << 20)),
        })
        .collect();
    for k in &keys {
        assert_eq!(&ks.parse_cron_timer(&ks.cron_timer(k)).unwrap(), k);
    }
    keys.sort();
    keys.dedup();
    let encoded: Vec<Vec<u8>> = keys.iter().map(|k| ks.cron_timer(k)).collect();
    assert!(encoded.windows(2).all(|w| w[0] < w[1]), "byte order = tuple order");
    let r = ks.cron_timers_until(7, 2, 1_000);
    for (at, inside) in [(999, true), (1_000, true), (1_001, false)] {
        let k = ks.cron_timer(&CronTimerKey {
            bucket: 7,
            shard: 2,
            fire_at_ms: at,
            cron_job_id: "c".into(),
        });
        assert_eq!(r.begin <= k && k < r.end, inside, "fire_at {at}");
    }
    assert_eq!(ks.parse_cron_job(&ks.cron_job("ns", "C1")).unwrap(), ("ns".into(), "C1".into()));
}

#[test]
fn an_idempotency_prefix_covers_exactly_the_keys_extending_it() {
    let ks = Keyspace::new("test");
    let r = ks.idempotency_prefix("ns", "cron:J1:");
    let inside = |k: &str| {
        let key = ks.idempotency("ns", k);
        r.begin <= key && key < r.end
    };
    assert!(inside("cron:J1:2026-08-13T02:00:00Z"));
    assert!(inside("cron:J1:"));
    assert!(!inside("cron:J1"));
    assert!(!inside("cron:J10:2026-08-13T02:00:00Z"));
    assert!(!inside("cron:J2:2026-08-13T02:00:00Z"));
    let other_ns = ks.idempotency("ns2", "cron:J1:x");
    assert!(!(r.begin <= other_ns && other_ns < r.end));
    let (ns, key) = ks.parse_idempotency(&ks.idempotency("ns", "cron:J1:x")).unwrap();
    assert_eq!((ns.as_str(), key.as_str()), ("ns", "cron:J1:x"));
}
