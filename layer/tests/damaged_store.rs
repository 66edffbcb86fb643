//! A damaged store is never served as healthy: bytes damaged in a stopped store's file are
//! found at the next open (the file changed since its clean close, so every page is verified),
//! the store opens `Failed` with what was found, and a range read over it fails rather than
//! coming back short. `kairos check`'s engine check finds the same damage without panicking.

#![allow(clippy::disallowed_methods)] // a real file on a real disk

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::embedded::{
    EmbeddedDatabase, EmbeddedOptions, EngineCheck, Integrity, VerifyAtOpen, check_file,
};
use kairos_layer::kv::{Database, Error, RangeOption, StoreHealth};

const KEYS: usize = 20_000;

fn clock() -> SharedClock {
    Arc::new(SystemClock::default())
}

fn open(path: &Path, verify: VerifyAtOpen) -> (EmbeddedDatabase, Database) {
    let options = EmbeddedOptions { verify_at_open: verify, ..EmbeddedOptions::default() };
    let edb = EmbeddedDatabase::open_with(path, clock(), options).expect("the open itself works");
    let db = Database::new(Arc::new(edb.clone()), clock(), Rng::seeded(1));
    (edb, db)
}

/// A store of `KEYS` records of ~200 bytes, closed cleanly.
async fn make_store(path: &Path) {
    let (edb, db) = open(path, VerifyAtOpen::WhenInDoubt);
    assert_eq!(edb.integrity(), &Integrity::New);
    for chunk in 0..KEYS / 1_000 {
        db.run(|tx| async move {
            for i in chunk * 1_000..(chunk + 1) * 1_000 {
                tx.set(format!("exec/{i:08}").as_bytes(), &[(i % 251) as u8; 200])?;
            }
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    }
    db.close().await;
}

/// XORs 16 bytes at seeded offsets in the middle half of the file with 0xFF (as the report
/// that found the problem did).
fn damage(path: &Path, seed: u64) {
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let len = f.metadata().unwrap().len();
    let rng = Rng::seeded(seed);
    for _ in 0..16 {
        let at = len / 4 + rng.below(len / 2);
        let mut b = [0u8; 1];
        f.seek(SeekFrom::Start(at)).unwrap();
        f.read_exact(&mut b).unwrap();
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(&[b[0] ^ 0xFF]).unwrap();
    }
    f.sync_all().unwrap();
}

async fn read_all(db: &Database) -> Result<usize, Error> {
    let tx = db.begin()?;
    Ok(tx.get_range(&RangeOption::prefix(b"exec/"), true).await?.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_damaged_while_stopped_opens_failed_and_never_reads_short() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.redb");
    make_store(&path).await;

    // Closed cleanly and untouched: trusted as it is, every record there.
    let (edb, db) = open(&path, VerifyAtOpen::WhenInDoubt);
    assert_eq!(edb.integrity(), &Integrity::Trusted);
    assert_eq!(read_all(&db).await.unwrap(), KEYS);
    db.close().await;
    // Asked to, the open verifies even a trusted store.
    let (edb, db) = open(&path, VerifyAtOpen::Always);
    assert!(matches!(edb.integrity(), Integrity::Verified { why } if why.contains("always")));
    db.close().await;

    damage(&path, 7);
    let (edb, db) = open(&path, VerifyAtOpen::WhenInDoubt);
    let Integrity::Damaged { reason } = edb.integrity() else {
        panic!("the damage is found at the open: {:?}", edb.integrity())
    };
    assert!(reason.contains("damaged"), "{reason}");
    let StoreHealth::Failed { reason: failed } = db.health() else {
        panic!("a damaged store is never healthy: {:?}", db.health())
    };
    assert!(failed.contains("kairos check"), "says what to do: {failed}");
    let read = read_all(&db).await;
    assert!(read.is_err(), "a read fails rather than returning short: {read:?}");
    assert!(read.unwrap_err().to_string().contains("damaged"));
    db.close().await;

    // The engine's check (kairos check) finds it too, as damage and not a panic.
    match check_file(&path).unwrap() {
        EngineCheck::Damaged(why) => assert!(!why.is_empty()),
        other => panic!("kairos check finds the damage: {other:?}"),
    }
    // Still found at the next open: a damaged store is never recorded as closed cleanly.
    let (edb, db) = open(&path, VerifyAtOpen::WhenInDoubt);
    assert!(matches!(edb.integrity(), Integrity::Damaged { .. }), "{:?}", edb.integrity());
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_with_the_modification_time_put_back_is_still_found() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.redb");
    make_store(&path).await;
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    damage(&path, 11);
    std::fs::File::options().write(true).open(&path).unwrap().set_modified(modified).unwrap();
    let (edb, db) = open(&path, VerifyAtOpen::WhenInDoubt);
    assert!(matches!(edb.integrity(), Integrity::Damaged { .. }), "{:?}", edb.integrity());
    assert!(matches!(db.health(), StoreHealth::Failed { .. }));
    db.close().await;
}

/// Without the open's check (`kairos check`'s record pass reads whatever the engine still can)
/// the engine's panics on damaged pages are contained: each read is an answer or an error, an
/// error fails the store, and nothing panics out of the layer. (Such unverified reads can come
/// back short — redb does not verify checksums on reads, which is why the open verifies the
/// store whenever it is in doubt, and `kairos check` runs the engine's check first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unverified_reads_of_a_damaged_store_never_panic_out_of_the_layer() {
    let mut outcomes = Vec::new();
    for seed in 0..8 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.redb");
        make_store(&path).await;
        damage(&path, 100 + seed);
        let options =
            EmbeddedOptions { verify_at_open: VerifyAtOpen::Never, ..EmbeddedOptions::default() };
        let edb = match EmbeddedDatabase::open_with(&path, clock(), options) {
            Ok(edb) => edb,
            Err(e) => {
                outcomes.push(format!("seed {seed}: open refused: {e}"));
                continue;
            }
        };
        let db = Database::new(Arc::new(edb), clock(), Rng::seeded(1));
        match read_all(&db).await {
            Err(e) => {
                let health = db.health();
                assert!(matches!(health, StoreHealth::Failed { .. }), "seed {seed}: {e}");
                outcomes.push(format!("seed {seed}: read failed: {e}"));
            }
            Ok(n) => outcomes.push(format!("seed {seed}: {n} of {KEYS} rows")),
        }
        db.close().await;
        // Read without being verified, it is not recorded as closed cleanly: the next open
        // still verifies it and finds the damage.
        let (edb, db) = open(&path, VerifyAtOpen::WhenInDoubt);
        assert!(matches!(edb.integrity(), Integrity::Damaged { .. }), "seed {seed}");
        db.close().await;
    }
    eprintln!("{}", outcomes.join("\n"));
}

/// `kairos check`'s record pass on a damaged store that the engine can only partly read: it
/// never fails outright (losing everything it read), but reports what it could read and where
/// reading stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_check_reports_what_it_read_before_the_damage() {
    use kairos_layer::keys::Keyspace;
    use kairos_layer::ops::check::check_records;
    let ks = Keyspace::new("kairos");
    let mut stopped = 0;
    for seed in 0..8 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.redb");
        let (_, db) = open(&path, VerifyAtOpen::WhenInDoubt);
        for chunk in 0..KEYS / 1_000 {
            let ks = &ks;
            db.run(|tx| async move {
                for i in chunk * 1_000..(chunk + 1) * 1_000 {
                    tx.set(&ks.execution("default", &format!("{i:026}")), &[7u8; 200])?;
                }
                Ok::<_, Error>(())
            })
            .await
            .unwrap();
        }
        db.close().await;
        damage(&path, 200 + seed);
        let options =
            EmbeddedOptions { verify_at_open: VerifyAtOpen::Never, ..EmbeddedOptions::default() };
        let Ok(edb) = EmbeddedDatabase::open_with(&path, clock(), options) else { continue };
        let db = Database::new(Arc::new(edb), clock(), Rng::seeded(1));
        let report = check_records(&db, &ks, |_| {}).await;
        let report = report.unwrap_or_else(|e| panic!("seed {seed}: the report is lost: {e}"));
        assert!(!report.is_clean(), "seed {seed}: values that do not decode are findings");
        if let Some(at) = &report.stopped {
            stopped += 1;
            assert!(report.findings.iter().any(|f| f.problem.contains("cannot be read")), "{at}");
        }
        db.close().await;
    }
    eprintln!("{stopped} of 8 damaged stores could not be read to their end");
}

/// The engine's check of an existing, unlocked store never fails outright, whatever the damage:
/// a file the engine cannot read to the length its own header gives (a damaged length or page
/// number sends a read past the end) is damage, reported as such — never "cannot read" as if the
/// disk were at fault. And the open of such a store for serving says it is damaged too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_check_reports_any_damage_as_damage_never_as_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let pristine = dir.path().join("pristine.redb");
    make_store(&pristine).await;
    let mut damaged = 0;
    for seed in 0..48 {
        let path = dir.path().join(format!("kv-{seed}.redb"));
        let served = dir.path().join(format!("served-{seed}.redb"));
        std::fs::copy(&pristine, &path).unwrap();
        damage(&path, 300 + seed);
        std::fs::copy(&path, &served).unwrap();
        match check_file(&path) {
            Ok(EngineCheck::Damaged(_)) => damaged += 1,
            Ok(_) => continue,
            Err(e) => panic!("seed {seed}: damage reported as an error: {e}"),
        }
        let (edb, db) = open(&served, VerifyAtOpen::WhenInDoubt);
        assert!(matches!(edb.integrity(), Integrity::Damaged { .. }), "seed {seed}");
        assert!(matches!(db.health(), StoreHealth::Failed { .. }), "seed {seed}");
        db.close().await;
    }
    eprintln!("{damaged} of 48 damaged copies found damaged");
    assert!(damaged > 0);
}
