//! Keyspace format upgrades through the real `kairos` binary: a store of the previous format
//! (format 2) is planned (`kairos migrate --dry-run` changes nothing), copied aside and
//! upgraded (`kairos migrate`), passes `kairos check`, keeps its records; a store of a newer
//! format is refused by `kairos migrate` and by `kairos dev`, naming both formats.
//!
//! The format 3 store is a fixture written by main before issue 34 (`fixtures/format-3-store`,
//! made by `fixtures/format-3-store.sh` with that build's `kairos` and `kairosctl`): twelve
//! executions of two definitions, three SUCCEEDED, idempotency keys, its by-definition index.
//!
//! The format 2 store is this build's store with its cluster config lowered to format 2 and
//! status index revision 1: the 2 → 3 step changes no record (format 2 records are read as they
//! are, layer/tests/spec_apart.rs covers reading and splitting them), so the config is what
//! the step reads and writes.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::keys::Keyspace;
use kairos_layer::kv::Database;
use kairos_layer::kv::embedded::EmbeddedDatabase;
use kairos_layer::ops::{ClusterParams, FORMAT_VERSION, Scheduler};
use kairos_proto::storage::v1::ClusterConfig;
use prost::Message;

fn kairos(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kairos"))
        .args(args)
        .env_remove("KAIROS_DATA_DIR")
        .env_remove("KAIROS_BACKEND")
        .output()
        .expect("running kairos")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn open(path: &Path) -> Database {
    let clock: SharedClock = Arc::new(SystemClock::default());
    EmbeddedDatabase::open_database(path, clock, Rng::seeded(7)).unwrap()
}

/// The cluster config of the store at `path` (a closed store).
async fn config_of(path: &Path) -> ClusterConfig {
    let db = open(path);
    let ks = Keyspace::new("default");
    let ks = &ks;
    let v = db.run(|tx| async move { tx.get(&ks.cluster()).await }).await.unwrap().unwrap();
    db.close().await;
    ClusterConfig::decode(&v[..]).unwrap()
}

/// Rewrites the store's cluster config with `f`.
async fn set_config(path: &Path, f: impl Fn(&mut ClusterConfig)) {
    let mut config = config_of(path).await;
    f(&mut config);
    let db = open(path);
    let ks = Keyspace::new("default");
    let (ks, bytes) = (&ks, &config.encode_to_vec());
    db.run(|tx| async move { tx.set(&ks.cluster(), bytes) }).await.unwrap();
    db.close().await;
}

/// A store written by this build (one API key in it), then lowered to format 2.
async fn format_2_store(dir: &Path) -> String {
    let path = dir.join("kv.redb");
    let db = open(&path);
    let clock: SharedClock = Arc::new(SystemClock::default());
    let params = ClusterParams { shard_count: 4, bucket_width_ms: 1_000, ready_partitions: 2 };
    let sched =
        Scheduler::open(db.clone(), Keyspace::new("default"), clock, Rng::seeded(3), params)
            .await
            .unwrap();
    let key = sched.create_api_key("*", &["admin".into()], "kept", "upgrade test").await.unwrap();
    db.close().await;
    drop((db, sched));
    set_config(&path, |c| {
        c.format_version = 2;
        c.status_index = 1;
    })
    .await;
    key.key.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_2_store_is_planned_backed_up_and_upgraded_and_a_newer_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let path = dir.path().join("kv.redb");
    let key_id = format_2_store(dir.path()).await;

    let dry = kairos(&["migrate", "--data-dir", data, "--dry-run"]);
    let said = text(&dry);
    assert!(dry.status.success(), "{said}");
    assert!(said.contains("the store holds keyspace format 2; this binary's is 4"), "{said}");
    assert!(said.contains("would run: format 2 → 3"), "{said}");
    assert!(said.contains("would run: format 3 → 4"), "{said}");
    assert!(said.contains("would run: status index revision 1 → 2"), "{said}");
    assert_eq!(config_of(&path).await.format_version, 2, "a dry run changes nothing");
    assert!(!dir.path().join("backups").exists(), "a dry run takes no backup");

    let run = kairos(&["migrate", "--data-dir", data]);
    let said = text(&run);
    assert!(run.status.success(), "{said}");
    assert!(said.contains("done: the store holds keyspace format 4"), "{said}");
    let upgraded = config_of(&path).await;
    assert_eq!((upgraded.format_version, upgraded.status_index), (FORMAT_VERSION, 2));
    // The copy taken first is the store as it was, and can be served by a binary of format 2.
    let backups: Vec<_> =
        std::fs::read_dir(dir.path().join("backups")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(backups.len(), 1, "{backups:?}");
    let name = backups[0].file_name().unwrap().to_string_lossy().to_string();
    assert!(name.starts_with("before-format-4-from-2-"), "{name}");
    assert_eq!(config_of(&backups[0].join("kv.redb")).await.format_version, 2);

    let check = kairos(&["check", "--data-dir", data]);
    assert!(check.status.success(), "{}", text(&check));
    assert_kept(&path, &key_id).await;

    let again = kairos(&["migrate", "--data-dir", data]);
    assert!(text(&again).contains("nothing to run: the store is current"), "{}", text(&again));
    assert_newer_refused(&path, data).await;
}

/// The records are kept: the API key written before the upgrade is there.
async fn assert_kept(path: &Path, key_id: &str) {
    let db = open(path);
    let clock: SharedClock = Arc::new(SystemClock::default());
    let params = ClusterParams { shard_count: 4, bucket_width_ms: 1_000, ready_partitions: 2 };
    let sched =
        Scheduler::open(db.clone(), Keyspace::new("default"), clock, Rng::seeded(4), params)
            .await
            .unwrap();
    let keys = sched.list_api_keys(None).await.unwrap();
    assert!(keys.iter().any(|k| k.id == key_id), "{keys:?}");
    db.close().await;
}

/// A store of a newer format: a downgrade, refused naming both formats, by migrate and node.
async fn assert_newer_refused(path: &Path, data: &str) {
    set_config(path, |c| c.format_version = FORMAT_VERSION + 1).await;
    for args in [
        vec!["migrate", "--data-dir", data],
        vec![
            "dev",
            "--data-dir",
            data,
            "--listen-http",
            "127.0.0.1:0",
            "--listen-grpc",
            "127.0.0.1:0",
        ],
    ] {
        let refused = kairos(&args);
        let said = text(&refused);
        assert_eq!(refused.status.code(), Some(1), "{args:?}: {said}");
        assert!(said.contains("format 5, newer than this binary's format 4"), "{args:?}: {said}");
        assert!(said.contains("downgrade is refused"), "{args:?}: {said}");
    }
    assert_eq!(config_of(path).await.format_version, 5, "a refused store is left as it is");
}

/// A node started on a format 2 store copies it aside, upgrades it at its open and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_on_a_format_2_store_backs_it_up_then_upgrades_it() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let path = dir.path().join("kv.redb");
    let key_id = format_2_store(dir.path()).await;
    let mut node = Command::new(env!("CARGO_BIN_EXE_kairos"))
        .args(["dev", "--data-dir", data, "--listen-http", "127.0.0.1:0"])
        .args(["--listen-grpc", "127.0.0.1:0"])
        .env_remove("KAIROS_DATA_DIR")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(node.stdout.take().unwrap());
    let up = stdout.lines().map_while(Result::ok).any(|l| l.contains(" up — "));
    node.kill().unwrap();
    let out = node.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(up, "the node did not come up: {said}");
    assert!(said.contains("keyspace format is upgraded at this start; a copy"), "{said}");
    let backups: Vec<_> = std::fs::read_dir(dir.path().join("backups"))
        .unwrap()
        .map(|e| e.unwrap().path().join("kv.redb"))
        .collect();
    assert_eq!(backups.len(), 1, "{backups:?}");
    assert_eq!(config_of(&backups[0]).await.format_version, 2, "the copy is the store as it was");
    assert_eq!(config_of(&path).await.format_version, FORMAT_VERSION, "upgraded at the open");
    assert_kept(&path, &key_id).await;
}

/// A store written by main before issue 34 (keyspace format 3, with its by-definition index):
/// `kairos migrate` clears that index and raises the format, `kairos check` passes, and every
/// execution is kept — got by id and by idempotency key, listed whole and by definition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_3_store_written_by_main_before_keeps_every_execution() {
    use kairos_layer::ops::query::ListQuery;
    use kairos_proto::storage::v1::ExecutionStatus;
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-3-store");
    for f in std::fs::read_dir(&fixture).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let data = dir.path().to_str().unwrap();
    let path = dir.path().join("kv.redb");
    assert_eq!(config_of(&path).await.format_version, 3);
    let run = kairos(&["migrate", "--data-dir", data]);
    let said = text(&run);
    assert!(run.status.success(), "{said}");
    assert!(said.contains("format 3 → 4"), "{said}");
    assert_eq!(config_of(&path).await.format_version, FORMAT_VERSION);
    let check = kairos(&["check", "--data-dir", data]);
    assert!(check.status.success(), "{}", text(&check));

    let db = open(&path);
    let clock: SharedClock = Arc::new(SystemClock::default());
    let params = ClusterParams::default();
    let sched =
        Scheduler::open(db.clone(), Keyspace::new("default"), clock, Rng::seeded(4), params)
            .await
            .unwrap();
    let list = |definition: Option<&str>| {
        let q = ListQuery {
            namespace: "default".into(),
            definition: definition.map(String::from),
            limit: 100,
            ..ListQuery::default()
        };
        let sched = &sched;
        async move { sched.list(&q).await.unwrap() }
    };
    let all = list(None).await;
    assert_eq!(all.executions.len(), 12, "{all:?}");
    assert!(all.unreadable.is_empty(), "{all:?}");
    let report = list(Some("report")).await;
    assert_eq!(report.executions.len(), 5, "{report:?}");
    assert!(report.executions.iter().all(|e| e.definition_name == "report"));
    let echo = list(Some("registry://jobs/echo")).await;
    assert_eq!(echo.executions.len(), 7, "{echo:?}");
    let done = echo.executions.iter().filter(|e| e.status == ExecutionStatus::Succeeded as i32);
    assert_eq!(done.count(), 3);
    for e in &all.executions {
        let got = sched.get("default", &e.id).await.unwrap();
        assert_eq!((&got.definition_name, &got.input_json), (&e.definition_name, &e.input_json));
    }
    let later = sched.get_by_idempotency_key("default", "later-2").await.unwrap();
    assert_eq!(later.input_json, br#"{"name":"later-2"}"#.to_vec());
    let index = &Keyspace::new("default").subspace_range(kairos_layer::keys::Tag::ByDefinition);
    let left = db.run(|tx| async move { tx.get_range(index, true).await }).await.unwrap();
    assert!(left.is_empty(), "by-definition entries left: {}", left.len());
    db.close().await;
}
