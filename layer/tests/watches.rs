//! Watches never miss a change: a watch registered while commits race with it fires once the
//! value it saw is no longer the value stored (memory, embedded and postgres backends; on
//! postgres also with the writer on another node than the watcher). With the old
//! registration (read the current value, then insert the watcher, with commits publishing in
//! between and skipping change collection when no watch existed) some of these hung.

use std::sync::Arc;
use std::time::Duration;

use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::Database;
use kairos_layer::kv::embedded::EmbeddedDatabase;
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};

async fn race(db: Database, writer_db: Database) {
    let mut missed = 0;
    for round in 0..150u64 {
        let key = format!("w{round}").into_bytes();
        // A writer changes the key a few times while a watcher registers.
        let writer = {
            let (db, key) = (writer_db.clone(), key.clone());
            tokio::spawn(async move {
                for i in 0..5u64 {
                    let tx = db.begin().unwrap();
                    tx.set(&key, &i.to_le_bytes()).unwrap();
                    tx.commit().await.unwrap();
                    tokio::task::yield_now().await;
                }
            })
        };
        let tx = db.begin().unwrap();
        let seen = tx.get(&key).await.unwrap();
        let watch = tx.watch(&key).unwrap();
        tx.commit().await.unwrap();
        writer.await.unwrap();
        let last = Some(bytes::Bytes::copy_from_slice(&4u64.to_le_bytes()));
        if seen != last {
            // The stored value differs from what the watcher saw: it must fire.
            if tokio::time::timeout(Duration::from_secs(2), watch).await.is_err() {
                missed += 1;
            }
        }
    }
    assert_eq!(missed, 0, "watches that never fired although their key changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_watches_never_miss_a_change() {
    let clock: SharedClock = Arc::new(SystemClock::default());
    let db = MemoryDatabase::open(clock, Rng::seeded(1), FaultConfig::none());
    race(db.clone(), db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_watches_never_miss_a_change() {
    let clock: SharedClock = Arc::new(SystemClock::default());
    let dir = tempfile::tempdir().unwrap();
    let db =
        EmbeddedDatabase::open_database(dir.path().join("kv.redb"), clock, Rng::seeded(1)).unwrap();
    race(db.clone(), db).await;
}

async fn postgres_nodes(nodes: usize) -> Vec<Database> {
    use kairos_layer::kv::postgres::{PostgresDatabase, PostgresOptions, testing};
    let url = testing::shared().unwrap_or_else(|e| panic!("{e}"));
    let schema = testing::fresh_schema("watches");
    let mut out = Vec::new();
    for n in 0..nodes {
        let clock: SharedClock = Arc::new(SystemClock::default());
        let options = PostgresOptions { schema: schema.clone(), ..PostgresOptions::new(&url) };
        out.push(
            PostgresDatabase::connect_database(options, clock, Rng::seeded(n as u64))
                .await
                .expect("connect to the throwaway PostgreSQL"),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_watches_never_miss_a_change() {
    let nodes = postgres_nodes(1).await;
    race(nodes[0].clone(), nodes[0].clone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_watches_see_changes_made_on_another_node() {
    let nodes = postgres_nodes(2).await;
    race(nodes[0].clone(), nodes[1].clone()).await;
}
