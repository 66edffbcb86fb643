//! Crash durability of the embedded backend: a child process commits in a loop and prints
//! each acknowledged key; the test SIGKILLs it mid-stream, reopens the store and finds every
//! acknowledged key. Three kill/reopen rounds on the same file. The open after a kill verifies
//! the store (the run did not close it cleanly), except when the store is larger than the
//! bound for that, which the last round sets below the store's size.
//!
//! The rounds differ in where the acknowledged commits are when the child dies: round 0 with
//! the default commit log (checkpoints each second: some in redb, the rest in the log), round 1
//! with no checkpoint at all during the run (every commit only in the log, replayed at the
//! open), round 2 without the log (each batch a durable redb commit).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::embedded::{EmbeddedDatabase, EmbeddedOptions, Integrity};
use kairos_layer::kv::{Database, Error, RangeOption};

const CHILD_ENV: &str = "KAIROS_CRASH_CHILD_DIR";
const ACKS_BEFORE_KILL: usize = 3_000;

/// The child: run only when the parent starts this binary with `CHILD_ENV` set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of embedded_survives_sigkill"]
async fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else { return };
    let round: u64 = std::env::var("KAIROS_CRASH_ROUND").unwrap().parse().unwrap();
    let clock: SharedClock = Arc::new(SystemClock::default());
    let options = match round {
        0 => EmbeddedOptions::default(),
        1 => EmbeddedOptions { checkpoint_interval_ms: 3_600_000, ..Default::default() },
        _ => EmbeddedOptions { commit_log: false, ..Default::default() },
    };
    let path = format!("{dir}/kv.redb");
    let db = EmbeddedDatabase::open_database_with(path, clock, Rng::seeded(round), options)
        .expect("child opens the store");
    let mut joins = Vec::new();
    for w in 0..32u64 {
        let db = db.clone();
        joins.push(tokio::spawn(async move {
            for i in 0u64.. {
                let key = format!("ack/{round}/{w:02}/{i:08}");
                let k = key.clone();
                db.run(|tx| {
                    let k = k.clone();
                    async move {
                        tx.set(k.as_bytes(), b"durable")?;
                        tx.add_i64(b"acked-count", 1)?;
                        Ok::<_, Error>(())
                    }
                })
                .await
                .expect("commit");
                // Printed only after the commit was acknowledged.
                println!("ACK {key}");
            }
        }));
    }
    for j in joins {
        j.await.unwrap();
    }
}

/// A copy of the crashed store whose log has one byte changed in its first frame: the open
/// refuses the store as damaged (whole frames follow the bad one: not a crash's cut), naming
/// the log, instead of serving it without the commits after the damage.
fn a_damaged_log_is_refused_not_cut(dir: &std::path::Path, log: &std::path::Path) {
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(dir.join("kv.redb"), copy.path().join("kv.redb")).unwrap();
    let mut bytes = std::fs::read(log).unwrap();
    bytes[30] ^= 0x01;
    std::fs::write(copy.path().join("kv.redb.log"), &bytes).unwrap();
    // `kairos check`'s engine check reads the log back too.
    match kairos_layer::kv::embedded::check_file(&copy.path().join("kv.redb")) {
        Ok(kairos_layer::kv::embedded::EngineCheck::Damaged(why)) => {
            assert!(why.contains("commit log"), "{why}")
        }
        other => panic!("the check finds the damaged log: {other:?}"),
    }
    let clock: SharedClock = Arc::new(SystemClock::default());
    let edb = EmbeddedDatabase::open_with(copy.path().join("kv.redb"), clock, Default::default())
        .expect("a damaged store opens failed, not as an error");
    let Integrity::Damaged { reason } = edb.integrity() else {
        panic!("a damaged commit log is damage: {:?}", edb.integrity())
    };
    assert!(reason.contains("commit log") && reason.contains("kv.redb.log"), "{reason}");
}

#[test]
fn embedded_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut acked: Vec<String> = Vec::new();
    for round in 0..3 {
        let mut child = Command::new(&exe)
            .args(["--ignored", "--exact", "crash_child", "--nocapture", "--test-threads", "1"])
            .env(CHILD_ENV, dir.path())
            .env("KAIROS_CRASH_ROUND", round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let mut this_round = 0;
        while this_round < ACKS_BEFORE_KILL {
            let line = lines.next().expect("child exited early").unwrap();
            if let Some(key) = line.strip_prefix("ACK ") {
                acked.push(key.to_string());
                this_round += 1;
            }
        }
        child.kill().unwrap(); // SIGKILL
        // Acks already in the pipe were printed before the kill: they count too.
        for line in lines.map_while(Result::ok) {
            if let Some(key) = line.strip_prefix("ACK ") {
                acked.push(key.to_string());
            }
        }
        child.wait().unwrap();
        let log = dir.path().join("kv.redb.log");
        let log_bytes = || std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        if round == 1 {
            assert!(log_bytes() > 0, "round 1: the acknowledged commits are in the log");
            a_damaged_log_is_refused_not_cut(dir.path(), &log);
        }

        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let missing = rt.block_on(async {
            let clock: SharedClock = Arc::new(SystemClock::default());
            let bound = if round == 2 { 0 } else { 1 << 30 };
            let options =
                EmbeddedOptions { verify_after_crash_bytes_max: bound, ..Default::default() };
            let edb =
                EmbeddedDatabase::open_with(dir.path().join("kv.redb"), clock.clone(), options)
                    .expect("reopen after SIGKILL");
            match (round, edb.integrity()) {
                (0 | 1, Integrity::Verified { why }) => assert!(why.contains("cleanly"), "{why}"),
                (2, Integrity::Unverified { why }) => {
                    assert!(why.contains("kairos check"), "{why}")
                }
                (_, other) => panic!("round {round}: after a SIGKILL the open knows: {other:?}"),
            }
            let db = Database::new(Arc::new(edb), clock, Rng::seeded(0));
            let tx = db.begin().unwrap();
            let rows = tx.get_range(&RangeOption::prefix(b"ack/"), true).await.unwrap();
            let present: std::collections::BTreeSet<Vec<u8>> =
                rows.into_iter().map(|kv| kv.key.to_vec()).collect();
            let counter =
                kairos_layer::kv::decode_i64(tx.get(b"acked-count").await.unwrap().as_deref());
            assert_eq!(counter as usize, present.len(), "counter and keys committed together");
            db.close().await;
            assert_eq!(log_bytes(), 0, "round {round}: replayed, then a clean close: no log left");
            acked.iter().filter(|k| !present.contains(k.as_bytes())).cloned().collect::<Vec<_>>()
        });
        assert!(
            missing.is_empty(),
            "round {round}: {} acknowledged keys lost, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
    }
    assert!(acked.len() >= 3 * ACKS_BEFORE_KILL);
}
