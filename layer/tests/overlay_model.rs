//! The embedded store's reads while recent commits live in the overlay and older ones in redb
//! (ADR 0012): random sets, clears, range clears and atomic adds, committed with checkpoints
//! every few batches (a small commit log) or never, checked after every commit against a model
//! map — point reads, range reads both ways with and without a limit — and again after a
//! re-open, which replays the commit log.

use std::collections::BTreeMap;
use std::sync::Arc;

use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::embedded::{EmbeddedDatabase, EmbeddedOptions};
use kairos_layer::kv::{Database, RangeOption};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn key(rng: &Rng) -> Vec<u8> {
    format!("k{:03}", rng.between(0, 119)).into_bytes()
}

fn open(dir: &std::path::Path, options: EmbeddedOptions) -> Database {
    let clock: SharedClock = Arc::new(SystemClock::default());
    EmbeddedDatabase::open_database_with(dir.join("kv.redb"), clock, Rng::seeded(7), options)
        .expect("open the store")
}

/// One transaction of random writes, applied to the model too.
async fn random_commit(db: &Database, model: &mut Model, rng: &Rng) {
    let tx = db.begin().unwrap();
    for _ in 0..rng.between(1, 8) {
        let k = key(rng);
        match rng.between(0, 9) {
            0..=4 => {
                let v = format!("v{}", rng.between(0, 1_000_000)).into_bytes();
                tx.set(&k, &v).unwrap();
                model.insert(k, v);
            }
            5 | 6 => {
                tx.clear(&k).unwrap();
                model.remove(&k);
            }
            7 => {
                let end = key(rng);
                let (b, e) = if k <= end { (k, end) } else { (end, k) };
                tx.clear_range(&b, &e).unwrap();
                let gone: Vec<Vec<u8>> = model.range(b..e).map(|(k, _)| k.clone()).collect();
                for k in gone {
                    model.remove(&k);
                }
            }
            _ => {
                let add = rng.between(1, 100) as i64;
                tx.add_i64(&k, add).unwrap();
                let old = model.get(&k).map_or(0, |v| {
                    let mut b = [0u8; 8];
                    for (i, x) in v.iter().take(8).enumerate() {
                        b[i] = *x;
                    }
                    i64::from_le_bytes(b)
                });
                model.insert(k, old.wrapping_add(add).to_le_bytes().to_vec());
            }
        }
    }
    tx.commit().await.unwrap();
}

async fn check(db: &Database, model: &Model, rng: &Rng, round: u64) {
    let tx = db.begin().unwrap();
    for _ in 0..8 {
        let k = key(rng);
        let got = tx.get(&k).await.unwrap().map(|b| b.to_vec());
        assert_eq!(got, model.get(&k).cloned(), "round {round}: get {}", k.escape_ascii());
    }
    let (a, b) = (key(rng), key(rng));
    let (begin, end) = if a <= b { (a, b) } else { (b, a) };
    for reverse in [false, true] {
        let limit = if rng.between(0, 2) == 0 { 0 } else { rng.between(1, 20) as usize };
        let mut range = RangeOption::new(begin.clone(), end.clone()).reverse(reverse);
        if limit > 0 {
            range = range.limit(limit);
        }
        let rows = tx.get_range(&range, true).await.unwrap();
        let got: Vec<(Vec<u8>, Vec<u8>)> =
            rows.iter().map(|kv| (kv.key.to_vec(), kv.value.to_vec())).collect();
        let mut want: Vec<(Vec<u8>, Vec<u8>)> =
            model.range(begin.clone()..end.clone()).map(|(k, v)| (k.clone(), v.clone())).collect();
        if reverse {
            want.reverse();
        }
        if limit > 0 {
            want.truncate(limit);
        }
        assert_eq!(got, want, "round {round}: range (reverse {reverse}, limit {limit})");
    }
}

async fn run(options: EmbeddedOptions, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let rng = Rng::seeded(seed);
    let mut model = Model::new();
    let db = open(dir.path(), options.clone());
    for round in 0..300 {
        random_commit(&db, &mut model, &rng).await;
        check(&db, &model, &rng, round).await;
    }
    db.close().await;
    let db = open(dir.path(), options);
    check(&db, &model, &rng, 10_000).await;
    let tx = db.begin().unwrap();
    let all = tx.get_range(&RangeOption::new(b"k".to_vec(), b"l".to_vec()), true).await.unwrap();
    assert_eq!(all.len(), model.len(), "after the re-open, every key");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_across_the_overlay_and_redb_match_a_model() {
    for seed in 1..=4 {
        // A checkpoint every few batches: keys in both.
        run(EmbeddedOptions { checkpoint_log_bytes: 400, ..EmbeddedOptions::default() }, seed)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_from_the_overlay_alone_match_a_model_and_survive_the_reopen() {
    let never = EmbeddedOptions { checkpoint_interval_ms: 3_600_000, ..EmbeddedOptions::default() };
    run(never, 11).await;
}
