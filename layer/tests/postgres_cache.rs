//! The postgres backend's read cache (ADR 0015): a point read served in the process, without a
//! statement, is never stale — after another node's commit, after a range clear, at an old read
//! version — and reads are served from it.

use std::collections::BTreeMap;
use std::sync::Arc;

use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::postgres::{PostgresDatabase, PostgresOptions, testing};
use kairos_layer::kv::{Database, Error};

async fn node(opts: &PostgresOptions, seed: u64) -> (PostgresDatabase, Database) {
    let clock: SharedClock = Arc::new(SystemClock::default());
    let pg = PostgresDatabase::connect(opts.clone(), clock.clone()).await.expect("connect");
    let db = Database::new(Arc::new(pg.clone()), clock, Rng::seeded(seed));
    (pg, db)
}

fn key(i: u32) -> Vec<u8> {
    format!("k{i}").into_bytes()
}

/// What `db` reads now for each key of `model`, and that it matches.
async fn assert_reads(db: &Database, model: &BTreeMap<Vec<u8>, Vec<u8>>, round: u32, who: &str) {
    let tx = db.begin().unwrap();
    for i in 0..5 {
        let got = tx.get(&key(i)).await.unwrap();
        assert_eq!(
            got.as_deref(),
            model.get(&key(i)).map(Vec::as_slice),
            "round {round}: {who} read k{i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_reads_are_never_stale_across_nodes() {
    let url = testing::shared().unwrap_or_else(|e| panic!("{e}"));
    let opts =
        PostgresOptions { schema: testing::fresh_schema("cache"), ..PostgresOptions::new(url) };
    let (pg_a, a) = node(&opts, 1).await;
    let (_pg_b, b) = node(&opts, 2).await;
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for round in 0..150u32 {
        let writer = if round % 3 == 0 { &b } else { &a };
        // A reader that began before this round's write keeps reading what it saw.
        let old = a.begin().unwrap();
        let seen = old.get(&key(round % 5)).await.unwrap();
        if round % 7 == 6 {
            writer.run(|tx| async move { tx.clear_range(b"k", b"l") }).await.unwrap();
            model.clear();
        } else {
            let (k, v) = (key(round % 5), round.to_le_bytes().to_vec());
            model.insert(k.clone(), v.clone());
            writer
                .run(|tx| {
                    let (k, v) = (k.clone(), v.clone());
                    async move { tx.set(&k, &v) }
                })
                .await
                .unwrap();
        }
        assert_eq!(old.get(&key(round % 5)).await.unwrap(), seen, "round {round}: old reader");
        match old.get(&key((round + 1) % 5)).await {
            Ok(_) | Err(Error::TransactionTooOld { .. }) => {}
            Err(e) => panic!("round {round}: {e}"),
        }
        assert_reads(&a, &model, round, "a").await;
        assert_reads(&b, &model, round, "b").await;
        assert_reads(&a, &model, round, "a again").await;
    }
    let (hits, misses, _) = pg_a.cache_stats();
    assert!(hits > 300, "reads served from the cache: {hits} hits, {misses} misses");
}

/// The misses that wait together share one statement (`postgres::reads`), and each still reads
/// its own key at its own read version: present, absent, and replaced after the read version
/// (answered from `history`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_share_statements_and_read_their_own_versions() {
    let url = testing::shared().unwrap_or_else(|e| panic!("{e}"));
    let opts =
        PostgresOptions { schema: testing::fresh_schema("reads"), ..PostgresOptions::new(url) };
    let (_pg_a, a) = node(&opts, 1).await;
    let (pg_b, b) = node(&opts, 2).await;
    const N: u32 = 2_000;
    // Even keys hold "v1-i"; odd keys are never written.
    for chunk in (0..N).step_by(500).collect::<Vec<_>>() {
        a.run(|tx| async move {
            for i in (chunk..chunk + 500).filter(|i| i % 2 == 0) {
                tx.set(&key(i), format!("v1-{i}").as_bytes())?;
            }
            Ok::<(), Error>(())
        })
        .await
        .unwrap();
    }
    // A reader on b whose read version is fixed before the keys are replaced.
    let old = b.begin().unwrap();
    old.get(b"nothing").await.unwrap();
    a.run(|tx| async move {
        for i in (0..N).filter(|i| i % 4 == 0) {
            tx.set(&key(i), format!("v2-{i}").as_bytes())?;
        }
        Ok::<(), Error>(())
    })
    .await
    .unwrap();
    let before = pg_b.stats();
    let (reads0, stmts0) = (
        before.point_reads.load(std::sync::atomic::Ordering::Relaxed),
        before.point_read_statements.load(std::sync::atomic::Ordering::Relaxed),
    );
    let new = b.begin().unwrap();
    let (old_reads, new_reads) = futures_util::future::join(
        futures_util::future::join_all((0..N).map(|i| {
            let old = &old;
            async move { old.get(&key(i)).await.unwrap() }
        })),
        futures_util::future::join_all((0..N).map(|i| {
            let new = &new;
            async move { new.get(&key(i)).await.unwrap() }
        })),
    )
    .await;
    for i in 0..N {
        let (o, n) = (&old_reads[i as usize], &new_reads[i as usize]);
        let want_old = (i % 2 == 0).then(|| format!("v1-{i}").into_bytes());
        let want_new = match i % 4 {
            0 => Some(format!("v2-{i}").into_bytes()),
            2 => Some(format!("v1-{i}").into_bytes()),
            _ => None,
        };
        assert_eq!(o.as_deref(), want_old.as_deref(), "k{i} at the old read version");
        assert_eq!(n.as_deref(), want_new.as_deref(), "k{i} at the new read version");
    }
    let after = pg_b.stats();
    let reads = after.point_reads.load(std::sync::atomic::Ordering::Relaxed) - reads0;
    let stmts = after.point_read_statements.load(std::sync::atomic::Ordering::Relaxed) - stmts0;
    assert!(reads >= u64::from(N), "{reads} point reads sent for {} misses", 2 * N);
    assert!(stmts * 10 <= reads, "{reads} point reads took {stmts} statements");
}
