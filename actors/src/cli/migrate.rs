//! Keyspace format upgrades ([`kairos_layer::ops::migrate`]) from the command line:
//! `kairos migrate` on a stopped node (`--dry-run` says what would run), and the copy of an
//! embedded store a node takes before its own open upgrades it ([`before_open`]).
//!
//! The steps themselves run inside `Scheduler::open`, at every node's start: this module adds
//! the backup, the plan printed, and the refusal of a newer store before anything is opened
//! for writing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::keys::Keyspace;
use kairos_layer::kv::Database;
use kairos_layer::kv::embedded::{EmbeddedDatabase, EmbeddedOptions, VerifyAtOpen};
use kairos_layer::ops::migrate::{FORMAT_VERSION, Plan, pending};
use kairos_layer::ops::{ClusterParams, Scheduler};

use crate::server::config::{Backend, NodeConfig};

/// The folder of the copies taken before upgrades, in the data directory.
pub(super) const BACKUP_DIR: &str = "backups";

/// The plan of the cluster in `db` (`None`: no cluster yet).
async fn plan_of(db: &Database, config: &NodeConfig) -> anyhow::Result<Option<Plan>> {
    Ok(pending(db, &Keyspace::new(&config.cluster)).await?)
}

/// The embedded store, opened to read its plan only (a small cache, no verification).
fn open_for_plan(path: &Path, clock: SharedClock, rng: Rng) -> anyhow::Result<Database> {
    let options = EmbeddedOptions {
        cache_bytes: 16 << 20,
        verify_at_open: VerifyAtOpen::Never,
        ..Default::default()
    };
    EmbeddedDatabase::open_database_with(path, clock, rng, options)
        .with_context(|| format!("opening the embedded store {}", path.display()))
}

/// Lines saying what a plan runs.
fn describe(plan: &Plan) -> Vec<String> {
    let mut out = Vec::new();
    for s in &plan.steps {
        out.push(format!("format {} → {}: {}", s.from, s.to, s.what));
    }
    if let Some(from) = plan.status_index_from {
        out.push(format!(
            "status index revision {from} → {}: index entries of states no longer indexed are \
             cleared (in bounded transactions)",
            kairos_layer::ops::migrate::STATUS_INDEX
        ));
    }
    out
}

/// Copies the (closed) embedded store at `path` — `kv.redb` and its commit log, if any — into
/// `DATA_DIR/backups/before-format-N-<unix ms>/`; returns that folder.
fn copy_store(config: &NodeConfig, path: &Path, plan: &Plan) -> anyhow::Result<PathBuf> {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let dir = config
        .data_dir
        .join(BACKUP_DIR)
        .join(format!("before-format-{FORMAT_VERSION}-from-{}-{ms}", plan.format));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path.file_name().context("the store's file name")?;
    let mut log_name = name.to_os_string();
    log_name.push(".log");
    for (from, to) in [
        (path.to_path_buf(), dir.join(name)),
        (path.with_file_name(&log_name), dir.join(&log_name)),
    ] {
        if from.exists() {
            std::fs::copy(&from, &to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
    }
    Ok(dir)
}

/// Before a node opens an existing embedded store: refuses a store this binary cannot serve
/// (a newer format: a downgrade), and copies the store aside when its open will upgrade it.
/// Returns the backup's folder when one was taken.
pub(super) async fn before_open(config: &NodeConfig) -> anyhow::Result<Option<PathBuf>> {
    let path = config.data_dir.join("kv.redb");
    let empty = std::fs::metadata(&path).map_or(true, |m| m.len() == 0);
    if config.backend != Backend::Embedded || config.new_store || empty {
        return Ok(None);
    }
    let clock: SharedClock = Arc::new(SystemClock::default());
    let db = open_for_plan(&path, clock, Rng::from_entropy())?;
    let plan = plan_of(&db, config).await;
    db.close().await;
    drop(db);
    let Some(plan) = plan? else { return Ok(None) };
    if plan.is_empty() {
        return Ok(None);
    }
    let dir = copy_store(config, &path, &plan)?;
    let text = format!(
        "the store's keyspace format is upgraded at this start; a copy of it as it was is in {}",
        dir.display()
    );
    super::warn(config, &text);
    Ok(Some(dir))
}

/// `kairos migrate [--dry-run]`: on a stopped node, says what the store needs and (without
/// `--dry-run`) copies it aside (embedded) and runs the steps. `shared` is the database of a
/// shared backend (PostgreSQL, FoundationDB), opened by the caller; `None` for embedded.
pub(super) async fn run(
    config: &NodeConfig,
    dry_run: bool,
    shared: Option<Database>,
) -> anyhow::Result<()> {
    let clock: SharedClock = Arc::new(SystemClock::default());
    let rng = Rng::from_entropy();
    let path = config.data_dir.join("kv.redb");
    let db = match (config.backend, shared) {
        (Backend::Memory, _) => {
            bail!("backend memory keeps nothing between runs: nothing to migrate")
        }
        (Backend::Embedded, _) => {
            if std::fs::metadata(&path).map_or(true, |m| m.len() == 0) {
                bail!("no store in {} (kv.redb): nothing to migrate", config.data_dir.display());
            }
            open_for_plan(&path, clock.clone(), rng.fork()).context(
                "is the node stopped? The embedded store is used by one process at a time",
            )?
        }
        (_, Some(db)) => db,
        (backend, None) => bail!("backend {backend:?}: no database to migrate"),
    };
    let Some(plan) = say_plan(&db, config, dry_run).await? else { return Ok(()) };
    let db = if config.backend == Backend::Embedded {
        db.close().await;
        drop(db);
        let dir = copy_store(config, &path, &plan)?;
        println!("backup: the store as it was is in {}", dir.display());
        open_for_plan(&path, clock.clone(), rng.fork())?
    } else {
        println!(
            "backup: none taken by kairos on this backend — take one first (PostgreSQL: pg_dump \
             or a base backup)"
        );
        db
    };
    let params = ClusterParams {
        shard_count: config.shard_count,
        bucket_width_ms: config.bucket_width_ms,
        ready_partitions: config.ready_partitions(),
    };
    let opened =
        Scheduler::open(db.clone(), Keyspace::new(&config.cluster), clock, rng, params).await;
    db.close().await;
    let sched = opened.context("migrating")?;
    println!("done: the store holds keyspace format {}", sched.config().format_version);
    Ok(())
}

/// Prints the store's plan; the plan when there is something to run and this is no dry run
/// (else `None`, `db` closed).
async fn say_plan(
    db: &Database,
    config: &NodeConfig,
    dry_run: bool,
) -> anyhow::Result<Option<Plan>> {
    let plan = match plan_of(db, config).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            db.close().await;
            bail!("no cluster {:?} in the store: nothing to migrate", config.cluster);
        }
        Err(e) => {
            db.close().await;
            return Err(e);
        }
    };
    println!(
        "kairos migrate: the store holds keyspace format {}; this binary's is {FORMAT_VERSION}",
        plan.format
    );
    if plan.is_empty() {
        db.close().await;
        println!("nothing to run: the store is current");
        return Ok(None);
    }
    let verb = if dry_run { "would run" } else { "runs" };
    for line in describe(&plan) {
        println!("  {verb}: {line}");
    }
    if dry_run {
        db.close().await;
        println!("dry run: nothing was changed");
        return Ok(None);
    }
    Ok(Some(plan))
}
