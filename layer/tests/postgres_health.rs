//! The postgres backend's health follows the database: `Unavailable` (with the reason) while
//! it cannot be reached, `Healthy` again by itself once it can. The database is reached
//! through a TCP relay in this process that the test cuts (every connection dropped, new ones
//! closed at once) and restores, on a throwaway PostgreSQL cluster.
#![allow(clippy::disallowed_methods)] // a relay on real sockets, real time

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::postgres::testing::{self};
use kairos_layer::kv::postgres::{PostgresDatabase, PostgresOptions};
use kairos_layer::kv::{Database, StoreHealth};
use tokio::net::{TcpListener, TcpStream};

/// A relay to `target`; while `cut`, it drops what it relays and closes new connections.
async fn relay(target: u16, cut: Arc<AtomicBool>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = l.accept().await {
            if cut.load(Ordering::Acquire) {
                continue; // dropped: closed at once
            }
            let cut = cut.clone();
            tokio::spawn(async move {
                let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                    return;
                };
                let copy = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
                let watch = async {
                    while !cut.load(Ordering::Acquire) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                };
                tokio::select! { _ = copy => {}, () = watch => {} }
            });
        }
    });
    port
}

async fn put(db: &Database, key: &'static [u8]) -> Result<(), kairos_layer::kv::Error> {
    let tx = db.begin()?;
    tx.set(key, b"v")?;
    tx.commit().await.map(|_| ())
}

async fn wait_health(db: &Database, want: impl Fn(&StoreHealth) -> bool) -> StoreHealth {
    let t = Instant::now();
    loop {
        let _ = put(db, b"probe").await;
        let h = db.health();
        if want(&h) || t.elapsed() > Duration::from_secs(30) {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_shows_in_the_health_and_heals() {
    let url = testing::shared().unwrap_or_else(|e| panic!("{e}"));
    let pg_port: u16 = url.rsplit(':').next().unwrap().split('/').next().unwrap().parse().unwrap();
    let cut = Arc::new(AtomicBool::new(false));
    let port = relay(pg_port, cut.clone()).await;
    let options = PostgresOptions {
        schema: testing::fresh_schema("health"),
        connect_timeout: Duration::from_secs(1),
        ..PostgresOptions::new(format!("postgresql://postgres@127.0.0.1:{port}/postgres"))
    };
    let clock: SharedClock = Arc::new(SystemClock::default());
    let db = PostgresDatabase::connect_database(options, clock, Rng::seeded(1)).await.unwrap();
    put(&db, b"a").await.unwrap();
    assert_eq!(db.health(), StoreHealth::Healthy);

    cut.store(true, Ordering::Release);
    let h = wait_health(&db, |h| matches!(h, StoreHealth::Unavailable { .. })).await;
    let StoreHealth::Unavailable { reason } = h else { panic!("still {h:?} while cut off") };
    assert!(reason.contains("database_unavailable") || reason.contains("commit"), "{reason}");
    assert!(put(&db, b"b").await.is_err(), "nothing commits while cut off");

    cut.store(false, Ordering::Release);
    let h = wait_health(&db, |h| *h == StoreHealth::Healthy).await;
    assert_eq!(h, StoreHealth::Healthy, "healthy again once reachable");
    put(&db, b"c").await.unwrap();
    db.close().await;
}
