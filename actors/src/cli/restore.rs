//! `kairos restore FILE --data-dir DIR`: a backup (from `kairos backup`) made the store of a
//! data directory. The file is copied beside its place, verified as `kairos check` verifies a
//! store (the engine's page check, then every record), then renamed to `DIR/kv.redb`, and the
//! `store-created` markers are written: a node started with `--data-dir DIR` serves it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::embedded::{
    EmbeddedDatabase, EmbeddedOptions, EngineCheck, VerifyAtOpen, check_file,
};

use crate::server::config::NodeConfig;

/// The files of an embedded store in its data directory (a forced restore replaces them).
const STORE_FILES: [&str; 3] = ["kv.redb", "kv.redb.log", "kv.redb.clean-shutdown"];

/// `kairos restore`.
#[derive(Debug, Args)]
pub(super) struct RestoreArgs {
    /// The backup file (written by `kairos backup`).
    file: PathBuf,
    /// The data directory to restore into: created if missing, refused when not empty unless
    /// --force.
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// The keyspace root whose records are checked [env: KAIROS_CLUSTER] [default: default].
    #[arg(long, value_name = "NAME")]
    cluster: Option<String>,
    /// Replace the store of a data directory that is not empty (what it held is lost).
    #[arg(long)]
    force: bool,
}

/// Runs `kairos restore`.
pub(super) async fn run(a: RestoreArgs) -> anyhow::Result<()> {
    let meta = std::fs::metadata(&a.file).with_context(|| format!("FILE: {}", a.file.display()))?;
    if !meta.is_file() {
        bail!("FILE: {} is not a file", a.file.display());
    }
    let mut config = NodeConfig::default();
    config.apply_env(|k| std::env::var(k).ok())?;
    config.set("data_dir", &a.data_dir.to_string_lossy())?;
    if let Some(c) = &a.cluster {
        config.set("cluster", c)?;
    }
    refuse_non_empty(&a.data_dir, a.force)?;
    super::files::private_data_dir(&a.data_dir)?;
    let staging = a.data_dir.join(".restoring-kv.redb");
    remove_store(&staging);
    std::fs::copy(&a.file, &staging)
        .with_context(|| format!("copying {} to {}", a.file.display(), staging.display()))?;
    std::fs::File::open(&staging)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", staging.display()))?;
    println!("kairos restore: {} → {}", a.file.display(), a.data_dir.join("kv.redb").display());
    if let Err(e) = verify(&staging, &config.cluster).await {
        remove_store(&staging);
        return Err(
            e.context(format!("{} is not a sound store: nothing restored", a.file.display()))
        );
    }
    for name in STORE_FILES {
        let _ = std::fs::remove_file(a.data_dir.join(name));
    }
    let store = a.data_dir.join("kv.redb");
    std::fs::rename(&staging, &store)
        .with_context(|| format!("renaming to {}", store.display()))?;
    remove_store(&staging);
    super::backup::sync_parent(&store)?;
    super::marker::mark_store_created(&config)?;
    println!(
        "kairos restore: done; start the node with --data-dir {} (its first start verifies the \
         store's pages again)",
        a.data_dir.display()
    );
    Ok(())
}

/// Refuses a data directory holding anything, unless forced.
fn refuse_non_empty(dir: &Path, force: bool) -> anyhow::Result<()> {
    let entries: Vec<String> = match std::fs::read_dir(dir) {
        Ok(d) => d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("--data-dir: reading {}", dir.display())),
    };
    if entries.is_empty() || force {
        return Ok(());
    }
    let mut shown = entries.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if entries.len() > 5 {
        shown.push_str(", …");
    }
    bail!(
        "--data-dir: {} is not empty ({shown}): restore into an empty directory, or pass --force \
         to replace its store (what it held is lost)",
        dir.display()
    )
}

/// The engine's check, then every record, as `kairos check` makes them.
async fn verify(path: &Path, cluster: &str) -> anyhow::Result<()> {
    match check_file(path).map_err(anyhow::Error::msg)? {
        EngineCheck::Clean => println!("engine: every page verified"),
        EngineCheck::Repaired => {
            println!("engine: pages verified; the free-space bookkeeping was rebuilt")
        }
        EngineCheck::Damaged(why) => bail!("engine: DAMAGED — {why}"),
    }
    #[allow(clippy::disallowed_methods)] // a command-line tool on the wall clock
    let clock: SharedClock = Arc::new(SystemClock::default());
    let options = EmbeddedOptions {
        cache_bytes: 16 << 20,
        verify_at_open: VerifyAtOpen::Never,
        commit_log: false,
        ..Default::default()
    };
    let db = EmbeddedDatabase::open_database_with(path, clock, Rng::from_entropy(), options)
        .with_context(|| format!("opening {}", path.display()))?;
    let report = super::check::check(&db, cluster).await;
    db.close().await;
    let report = report?;
    super::check::print_report(&report);
    if !report.is_clean() {
        bail!("records: {} problem(s)", report.finding_count);
    }
    Ok(())
}

/// Removes a store file and what its close leaves beside it.
fn remove_store(path: &Path) {
    for suffix in ["", ".log", ".clean-shutdown"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}
