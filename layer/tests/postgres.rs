//! What only the postgres backend has to prove, on throwaway PostgreSQL clusters
//! (`.ci/install-postgres` installs the server; without it these tests fail naming it): key
//! order of `bytea`, old versions served from `history`, the versioned schema, settings, a
//! multi-host URL, versionstamps in commit order under concurrent commits from several nodes,
//! the watch that must not miss a change made between the read and the watch, a key PostgreSQL
//! cannot index failing alone, how a lost connection and the statement timeout are reported,
//! and garbage collection.

use std::sync::Arc;
use std::time::Duration;

use kairos_layer::env::{Clock, ManualClock, Rng, SharedClock, SystemClock, Timestamp};
use kairos_layer::kv::postgres::testing::{self, ClusterOptions, TempCluster};
use kairos_layer::kv::postgres::{PG_KEY_INDEX_BYTES_MAX, PostgresDatabase, PostgresOptions};
use kairos_layer::kv::{Database, Error, RangeOption, decode_i64};

fn shared_url() -> String {
    testing::shared().unwrap_or_else(|e| panic!("{e}"))
}

fn options(url: &str, prefix: &str) -> PostgresOptions {
    PostgresOptions { schema: testing::fresh_schema(prefix), ..PostgresOptions::new(url) }
}

async fn connect(options: PostgresOptions) -> Database {
    let clock: SharedClock = Arc::new(SystemClock::default());
    PostgresDatabase::connect_database(options, clock, Rng::seeded(1)).await.expect("connect")
}

async fn put(db: &Database, key: &[u8], value: &[u8]) {
    let (key, value) = (key.to_vec(), value.to_vec());
    db.run(|tx| {
        let (key, value) = (key.clone(), value.clone());
        async move { tx.set(&key, &value) }
    })
    .await
    .unwrap();
}

/// Polls `sql` (through psql) until it prints something other than "" or "0" (that output), or
/// `ended()` says to stop first (`None`). Panics after about five seconds of neither.
async fn poll(cluster: &TempCluster, sql: &str, ended: impl Fn() -> bool) -> Option<String> {
    let clock = SystemClock::default();
    for _ in 0..500 {
        let out = cluster.psql(sql).unwrap();
        if !out.is_empty() && out != "0" {
            return Some(out);
        }
        if ended() {
            return None;
        }
        clock.sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {sql}");
}

/// Polls `sql` until it prints something other than "" or "0".
async fn wait_for(cluster: &TempCluster, sql: &str) -> String {
    poll(cluster, sql, || false).await.expect("never ends early")
}

/// Polls `sql` until it prints something other than "" or "0" (`true`), or `task` ends first
/// (`false`).
async fn waits_or_ends<T>(
    cluster: &TempCluster,
    sql: &str,
    task: &tokio::task::JoinHandle<T>,
) -> bool {
    poll(cluster, sql, || task.is_finished()).await.is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_order_bytewise_like_foundationdb() {
    let db = connect(options(&shared_url(), "order")).await;
    let rng = Rng::seeded(3);
    let mut keys: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![0, 0],
        vec![0x7f],
        vec![0x80],
        vec![0xff],
        vec![0xff, 0xff],
        b"a".to_vec(),
        b"B".to_vec(),
        b"a\x00".to_vec(),
        b"ab".to_vec(),
    ];
    for _ in 0..200 {
        let n = rng.below(6) as usize;
        keys.push(
            (0..n).map(|_| [0u8, 1, 0x7f, 0x80, 0xfe, 0xff][rng.below(6) as usize]).collect(),
        );
    }
    let tx = db.begin().unwrap();
    for k in &keys {
        tx.set(k, b"v").unwrap();
    }
    tx.commit().await.unwrap();
    keys.sort();
    keys.dedup();
    let all = RangeOption::new(Vec::new(), vec![0xff, 0xff, 0xff]);
    let tx = db.begin().unwrap();
    let got: Vec<Vec<u8>> =
        tx.get_range(&all, true).await.unwrap().iter().map(|kv| kv.key.to_vec()).collect();
    assert_eq!(got, keys, "ascending = unsigned bytewise order");
    let rev = tx.get_range(&all.clone().reverse(true).limit(7), true).await.unwrap();
    let want: Vec<Vec<u8>> = keys.iter().rev().take(7).cloned().collect();
    assert_eq!(rev.iter().map(|kv| kv.key.to_vec()).collect::<Vec<_>>(), want);
    let from = RangeOption::new(vec![0x7f], vec![0xff]).limit(3);
    let want: Vec<Vec<u8>> =
        keys.iter().filter(|k| k.as_slice() >= [0x7f].as_slice()).take(3).cloned().collect();
    let got = tx.get_range(&from, true).await.unwrap();
    assert_eq!(got.iter().map(|kv| kv.key.to_vec()).collect::<Vec<_>>(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_read_versions_read_replaced_and_cleared_values() {
    let db = connect(options(&shared_url(), "history")).await;
    let tx = db.begin().unwrap();
    for i in 0..100u8 {
        tx.set(format!("r/{i:03}").as_bytes(), &[i]).unwrap();
    }
    tx.commit().await.unwrap();
    let reader = db.begin().unwrap();
    assert_eq!(reader.get(b"r/050").await.unwrap().as_deref(), Some(&[50u8][..]));
    // Meanwhile: most keys cleared, some replaced, one added.
    let w = db.begin().unwrap();
    w.clear_range(b"r/010", b"r/095").unwrap();
    w.set(b"r/020", b"new").unwrap();
    w.set(b"r/099", b"new").unwrap();
    w.set(b"r/100", b"new").unwrap();
    w.commit().await.unwrap();
    let w = db.begin().unwrap();
    w.clear(b"r/099").unwrap();
    w.commit().await.unwrap();
    // The reader still sees its version...
    let rows = reader.get_range(&RangeOption::prefix(b"r/"), true).await.unwrap();
    assert_eq!(rows.len(), 100);
    assert!(rows.iter().enumerate().all(|(i, kv)| kv.value.as_ref() == [i as u8]));
    assert_eq!(reader.get(b"r/099").await.unwrap().as_deref(), Some(&[99u8][..]));
    assert_eq!(reader.get(b"r/100").await.unwrap(), None);
    let rev = reader.get_range(&RangeOption::prefix(b"r/").reverse(true).limit(2), true).await;
    assert_eq!(rev.unwrap().iter().map(|kv| kv.value[0]).collect::<Vec<_>>(), [99, 98]);
    // ... a new transaction the new one, where a limit counts only keys present.
    let now = db.begin().unwrap();
    let range = RangeOption::new(b"r/005".to_vec(), b"r/2".to_vec()).limit(8);
    let keys: Vec<String> = now
        .get_range(&range, true)
        .await
        .unwrap()
        .iter()
        .map(|kv| String::from_utf8(kv.key.to_vec()).unwrap())
        .collect();
    assert_eq!(keys, ["r/005", "r/006", "r/007", "r/008", "r/009", "r/020", "r/095", "r/096"]);
    assert_eq!(now.get(b"r/099").await.unwrap(), None);
    assert_eq!(now.get(b"r/100").await.unwrap().as_deref(), Some(&b"new"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_created_once_and_another_format_is_refused() {
    let url = shared_url();
    let opts = options(&url, "format");
    let db = connect(opts.clone()).await;
    put(&db, b"kept", b"yes").await;
    db.close().await;
    let db = connect(opts.clone()).await;
    let tx = db.begin().unwrap();
    assert_eq!(tx.get(b"kept").await.unwrap().as_deref(), Some(&b"yes"[..]), "same tables");
    db.close().await;
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client.execute(&format!("UPDATE {}.meta SET format = 99", opts.schema), &[]).await.unwrap();
    let clock: SharedClock = Arc::new(SystemClock::default());
    let e = PostgresDatabase::connect(opts.clone(), clock).await.unwrap_err().to_string();
    assert!(e.contains("format 99") && e.contains("format 1"), "names both formats: {e}");
    assert!(e.contains(&opts.schema), "names the schema: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_are_refused_naming_the_field() {
    let clock: SharedClock = Arc::new(SystemClock::default());
    let url = "postgresql://postgres@127.0.0.1:1/postgres";
    let cases = [
        (PostgresOptions { schema: "Bad-Name".into(), ..PostgresOptions::new(url) }, "schema"),
        (PostgresOptions { pool_size: 0, ..PostgresOptions::new(url) }, "pool size"),
        (
            PostgresOptions { statement_timeout: Duration::ZERO, ..PostgresOptions::new(url) },
            "statement timeout",
        ),
        (PostgresOptions::new("postgresql://x:notaport/db"), "url"),
    ];
    for (opts, field) in cases {
        let e = PostgresDatabase::connect(opts, clock.clone()).await.unwrap_err();
        assert!(matches!(e, Error::InvalidOperation(_)), "{e}");
        assert!(e.to_string().contains(&format!("postgres {field}:")), "{e}");
    }
    // A database that cannot be reached: retryable, not a conflict.
    let e = PostgresDatabase::connect(PostgresOptions::new(url), clock).await.unwrap_err();
    assert_eq!(e.code(), 9004, "{e}");
    assert!(e.is_retryable() && !e.is_maybe_committed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_host_url_finds_the_writable_server() {
    let read_only = TempCluster::start_with(ClusterOptions {
        settings: vec!["default_transaction_read_only=on".into()],
        ..ClusterOptions::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let writable = TempCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!(
        "postgresql://postgres@127.0.0.1:{dead},127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        read_only.port(),
        writable.port()
    );
    let opts = options(&url, "multihost");
    let db = connect(opts.clone()).await;
    put(&db, b"where", b"primary").await;
    let q = format!("SELECT count(*) FROM {}.kv", opts.schema);
    assert_eq!(writable.psql(&q).unwrap(), "1", "written to the writable server");
    let q = format!("SELECT to_regclass('{}.kv') IS NULL", opts.schema);
    assert_eq!(read_only.psql(&q).unwrap(), "t", "nothing on the read-only one");
    db.close().await;
}

/// Versionstamps are unique and increase in commit order, with commits racing from three
/// nodes: a chain of transactions that each read and bump one counter (so each commits after
/// the one before) logs under versionstamped keys the value it read; the log in key order must
/// be the chain's order. Blind versionstamped writes race alongside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versionstamps_are_unique_and_in_commit_order_across_nodes() {
    let url = shared_url();
    let opts = options(&url, "stamps");
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(connect(opts.clone()).await);
    }
    let mut joins = Vec::new();
    for t in 0..12usize {
        let db = nodes[t % 3].clone();
        joins.push(tokio::spawn(async move {
            let mut stamps = Vec::new();
            for i in 0..15u32 {
                let (_, info) = db
                    .run_with_info(|tx| async move {
                        let mut key = b"log/".to_vec();
                        key.extend_from_slice(&[0u8; 10]);
                        if t % 2 == 0 {
                            let n = decode_i64(tx.get(b"counter").await?.as_deref());
                            tx.set(b"counter", &(n + 1).to_le_bytes())?;
                            tx.set_versionstamped_key(&key, 4, &n.to_le_bytes())?;
                        } else {
                            key[0] = b'L';
                            tx.set_versionstamped_key(&key, 4, &i.to_le_bytes())?;
                        }
                        Ok::<_, Error>(())
                    })
                    .await
                    .unwrap();
                stamps.push(info.versionstamp.expect("a writing commit has a stamp"));
            }
            stamps
        }));
    }
    let mut stamps = Vec::new();
    for j in joins {
        stamps.extend(j.await.unwrap());
    }
    let n = stamps.len();
    stamps.sort();
    stamps.dedup();
    assert_eq!(stamps.len(), n, "unique");
    let tx = nodes[1].begin().unwrap();
    let chain = tx.get_range(&RangeOption::prefix(b"log/"), true).await.unwrap();
    let read: Vec<i64> = chain.iter().map(|kv| decode_i64(Some(&kv.value))).collect();
    assert_eq!(read, (0..read.len() as i64).collect::<Vec<_>>(), "key order = commit order");
    assert_eq!(read.len(), 6 * 15);
    assert_eq!(decode_i64(tx.get(b"counter").await.unwrap().as_deref()), 90);
    let blind = tx.get_range(&RangeOption::prefix(b"Log/"), true).await.unwrap();
    assert_eq!(blind.len(), 6 * 15);
}

/// A watch compares with the value its transaction saw: a change committed between that read
/// and the watch's registration (here, before the watching transaction even commits) fires it
/// — on the same node and from another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_between_the_read_and_the_watch_fires_it() {
    let opts = options(&shared_url(), "lostwakeup");
    let (a, b) = (connect(opts.clone()).await, connect(opts).await);
    for (round, writer) in [a.clone(), b.clone()].into_iter().enumerate() {
        let key = format!("w{round}").into_bytes();
        put(&a, &key, b"old").await;
        let tx = a.begin().unwrap();
        assert_eq!(tx.get(&key).await.unwrap().as_deref(), Some(&b"old"[..]));
        let watch = tx.watch(&key).unwrap();
        put(&writer, &key, b"new").await; // after the read, before the watch is registered
        tx.commit().await.unwrap(); // read-only: commits, registers the watch
        tokio::time::timeout(Duration::from_secs(5), watch)
            .await
            .expect("the watch fired")
            .expect("with success");
    }
    // And a change after the registration, from the other node.
    let tx = a.begin().unwrap();
    let watch = tx.watch(b"w0").unwrap();
    tx.commit().await.unwrap();
    put(&b, b"w0", b"newer").await;
    tokio::time::timeout(Duration::from_secs(5), watch).await.expect("fired").unwrap();
}

/// PostgreSQL cannot index a long incompressible key: that transaction fails with
/// `key_too_large`, the others committed alongside (maybe in the same batch) do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_postgres_cannot_index_fails_alone() {
    let db = connect(options(&shared_url(), "bigkey")).await;
    let rng = Rng::seeded(8);
    let big: Vec<u8> = (0..5_000).map(|_| rng.below(256) as u8).collect();
    let mut joins = Vec::new();
    for i in 0..24u32 {
        let (db, big) = (db.clone(), big.clone());
        joins.push(tokio::spawn(async move {
            let tx = db.begin().unwrap();
            if i == 12 {
                tx.set(&big, b"v").unwrap();
            }
            tx.set(format!("small/{i:02}").as_bytes(), b"v").unwrap();
            tx.commit().await
        }));
    }
    for (i, j) in joins.into_iter().enumerate() {
        let r = j.await.unwrap();
        if i == 12 {
            let e = r.unwrap_err();
            assert_eq!(e, Error::KeyTooLarge { size: 5_000, limit: PG_KEY_INDEX_BYTES_MAX });
        } else {
            r.expect("the other transactions commit");
        }
    }
    let tx = db.begin().unwrap();
    let rows = tx.get_range(&RangeOption::prefix(b"small/"), true).await.unwrap();
    assert_eq!(rows.len(), 23);
}

/// A connection lost while `COMMIT` is in flight leaves the outcome unknown
/// (`commit_unknown_result`, maybe committed): here PostgreSQL waits for a synchronous standby
/// that does not exist, the test terminates the committer's backend, and the commit is in fact
/// applied (committed locally). The next commit reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_in_commit_is_an_unknown_result() {
    let cluster = TempCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let opts = options(&cluster.url(), "unknown");
    let db = connect(opts.clone()).await;
    put(&db, b"before", b"1").await;
    cluster.psql("ALTER SYSTEM SET synchronous_standby_names = 'nobody'").unwrap();
    cluster.psql("SELECT pg_reload_conf()").unwrap();
    // The reload reaches each backend when it next looks (asynchronously): a commit may still
    // go through without waiting. Such a commit is tried again, until one waits.
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'";
    let mut tries = 0;
    let commit = loop {
        tries += 1;
        let commit = {
            let db = db.clone();
            tokio::spawn(async move {
                let tx = db.begin().unwrap();
                tx.set(b"maybe", b"1").unwrap();
                tx.commit().await
            })
        };
        if waits_or_ends(&cluster, waiting, &commit).await {
            break commit;
        }
        commit.await.unwrap().expect("a commit the reload had not reached yet");
        assert!(tries < 20, "no commit ever waited for the synchronous standby");
    };
    cluster
        .psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
        .unwrap();
    let e = commit.await.unwrap().unwrap_err();
    assert_eq!(e, Error::CommitUnknownResult);
    assert!(e.is_retryable() && e.is_maybe_committed());
    cluster.psql("ALTER SYSTEM RESET synchronous_standby_names").unwrap();
    cluster.psql("SELECT pg_reload_conf()").unwrap();
    let tx = db.begin().unwrap();
    assert_eq!(tx.get(b"maybe").await.unwrap().as_deref(), Some(&b"1"[..]), "applied after all");
    put(&db, b"after", b"1").await;
}

/// A commit waiting for the commit lock: past the statement timeout it is `transaction_too_old`;
/// with its connection lost before `COMMIT` was sent it is retryable and not maybe-committed
/// (PostgreSQL rolled it back); once the lock is free, `run` commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_blocked_on_the_lock_time_out_or_fail_cleanly() {
    let cluster = TempCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let opts = options(&cluster.url(), "blocked");
    let quick =
        connect(PostgresOptions { statement_timeout: Duration::from_millis(300), ..opts.clone() })
            .await;
    let db = connect(opts.clone()).await;
    let (mut holder, conn) =
        tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let lock = holder.transaction().await.unwrap();
    lock.execute(&format!("SELECT 1 FROM {}.meta FOR UPDATE", opts.schema), &[]).await.unwrap();

    let tx = quick.begin().unwrap();
    tx.set(b"k", b"1").unwrap();
    let e = tx.commit().await.unwrap_err();
    assert!(matches!(e, Error::TransactionTooOld { .. }), "{e}");

    let commit = {
        let db = db.clone();
        tokio::spawn(async move {
            let tx = db.begin().unwrap();
            tx.set(b"k", b"2").unwrap();
            tx.commit().await
        })
    };
    let blocked = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                   AND application_name = 'kairos'";
    wait_for(&cluster, blocked).await;
    cluster
        .psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event_type = \
             'Lock' AND application_name = 'kairos'",
        )
        .unwrap();
    let e = commit.await.unwrap().unwrap_err();
    assert!(e.is_retryable() && !e.is_maybe_committed(), "{e}");
    lock.rollback().await.unwrap();
    put(&db, b"k", b"3").await;
    let tx = quick.begin().unwrap();
    assert_eq!(tx.get(b"k").await.unwrap().as_deref(), Some(&b"3"[..]));
}

/// Replaced versions and cleared keys are deleted once older than the retention (10 s of the
/// injected clock); reads stay right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_versions_are_collected() {
    let url = shared_url();
    let opts = options(&url, "gc");
    let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
    let shared: SharedClock = Arc::new(clock.clone());
    let db =
        PostgresDatabase::connect_database(opts.clone(), shared, Rng::seeded(1)).await.unwrap();
    for i in 0..20u8 {
        put(&db, b"hot", &[i]).await;
    }
    put(&db, b"gone", b"x").await;
    let tx = db.begin().unwrap();
    tx.clear(b"gone").unwrap();
    tx.commit().await.unwrap();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let count = |table: &'static str| {
        let q = format!("SELECT count(*) FROM {}.{table}", opts.schema);
        let client = &client;
        async move { client.query_one(&q, &[]).await.unwrap().get::<_, i64>(0) }
    };
    assert_eq!(count("history").await, 20, "19 replaced versions of hot, 1 of gone");
    // The committer collects after replying, reading the clock then: a second commit after
    // each tick makes sure it did so before the clock moves on.
    for _ in 0..3 {
        clock.advance(Duration::from_secs(6));
        put(&db, b"tick", b"x").await;
        put(&db, b"tock", b"x").await;
    }
    // At +18 s the versions known at +6 s (the first tick) and older are collected.
    assert_eq!(count("history").await, 4, "only the replaced ticks and tocks are left");
    assert_eq!(count("kv").await, 3, "the cleared key's row is gone: hot, tick, tock remain");
    let tx = db.begin().unwrap();
    assert_eq!(tx.get(b"hot").await.unwrap().as_deref(), Some(&[19u8][..]));
    assert_eq!(tx.get(b"gone").await.unwrap(), None);
    let gc: i64 = client
        .query_one(&format!("SELECT gc_version FROM {}.meta", opts.schema), &[])
        .await
        .unwrap()
        .get(0);
    assert!(gc > 20, "reads below {gc} are too old now");
}
