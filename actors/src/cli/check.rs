//! `kairos check`: the integrity check of a stopped node's store. First the storage engine's
//! own check (pages and checksums of the redb file), then every record of the cluster
//! ([`kairos_layer::ops::check`]): layouts, decoding, references, indexes, status counters.
//! Prints what it found; the command exits non-zero when anything is damaged.

#![allow(clippy::disallowed_methods)] // a command-line tool on the wall clock

use std::sync::Arc;

use anyhow::{Context, bail};
use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::keys::Keyspace;
use kairos_layer::kv::Database;
use kairos_layer::kv::embedded::{
    EmbeddedDatabase, EmbeddedOptions, EngineCheck, VerifyAtOpen, check_file,
};
use kairos_layer::ops::check::{CheckReport, check_records};

use crate::server::config::{Backend, NodeConfig};

/// Findings printed (the report keeps more; the count is exact).
const PRINTED: usize = 50;

/// Runs the check; `Ok(true)` when the store is damaged.
pub async fn run(config: &NodeConfig) -> anyhow::Result<bool> {
    let clock: SharedClock = Arc::new(SystemClock::default());
    let rng = Rng::from_entropy();
    let mut damaged = false;
    let db = match config.backend {
        Backend::Embedded => {
            let (db, engine_damaged) = open_embedded(config, clock, rng)?;
            damaged = engine_damaged;
            match db {
                Some(db) => db,
                None => return Ok(true),
            }
        }
        Backend::Memory => bail!("backend memory keeps nothing between runs: nothing to check"),
        Backend::Postgres => {
            let options = config.postgres_options()?.context("backend postgres: no settings")?;
            let at = options.describe().unwrap_or_default();
            println!("kairos check: PostgreSQL {at}");
            println!(
                "engine: PostgreSQL checks its own storage (pg_amcheck); with nodes running, \
                 counts may move while they are read"
            );
            kairos_layer::kv::postgres::PostgresDatabase::connect_database(options, clock, rng)
                .await
                .with_context(|| format!("connecting to PostgreSQL at {at} (postgres_url)"))?
        }
        #[cfg(feature = "fdb")]
        Backend::Fdb => {
            println!("engine: FoundationDB checks its own storage (fdbcli `consistencycheck`)");
            kairos_layer::kv::fdb::FdbDatabase::open_database(
                config.fdb_cluster_file.as_deref(),
                clock,
                rng,
            )
            .context("connecting to FoundationDB")?
        }
        #[cfg(not(feature = "fdb"))]
        Backend::Fdb => bail!("backend fdb: this binary was built without the `fdb` feature"),
    };
    let report = check(&db, &config.cluster).await;
    db.close().await;
    match report {
        Ok(r) => {
            print_report(&r);
            Ok(damaged || !r.is_clean())
        }
        Err(e) => {
            println!("records: reading them failed — {e:#}");
            Ok(true)
        }
    }
}

/// The engine's check of the embedded store, then the store opened for the record pass
/// (`None` when it cannot be read); `true` when the engine found damage.
fn open_embedded(
    config: &NodeConfig,
    clock: SharedClock,
    rng: Rng,
) -> anyhow::Result<(Option<Database>, bool)> {
    let mut damaged = false;
    let path = config.data_dir.join("kv.redb");
    if !path.exists() {
        bail!("no store at {}: nothing to check", path.display());
    }
    println!("kairos check: {}", path.display());
    match check_file(&path).map_err(anyhow::Error::msg)? {
        EngineCheck::Clean => println!("engine: every page verified"),
        EngineCheck::Repaired => println!(
            "engine: pages verified; the free-space bookkeeping was wrong and has been \
             rebuilt (no record changed)"
        ),
        EngineCheck::Damaged(why) => {
            damaged = true;
            println!("engine: DAMAGED — {why}");
        }
    }
    // The engine's check ran above: the record pass reads whatever the engine still can.
    let options = EmbeddedOptions {
        cache_bytes: 16 << 20,
        verify_at_open: VerifyAtOpen::Never,
        ..Default::default()
    };
    match EmbeddedDatabase::open_database_with(&path, clock, rng, options) {
        Ok(db) => Ok((Some(db), damaged)),
        Err(e) => {
            println!("records: cannot be read — {e}");
            Ok((None, true))
        }
    }
}

pub(super) async fn check(db: &Database, cluster: &str) -> anyhow::Result<CheckReport> {
    let ks = Keyspace::new(cluster);
    let mut next = 100_000;
    let report = check_records(db, &ks, |keys| {
        if keys >= next {
            eprintln!("  … {keys} keys read");
            next += 100_000;
        }
    })
    .await
    .context("checking the records")?;
    Ok(report)
}

pub(super) fn print_report(r: &CheckReport) {
    println!("records: {} keys read, {} executions", r.keys, r.executions);
    if let Some(at) = &r.stopped {
        println!(
            "records: reading STOPPED {at}; what follows is what could be read before it (the \
             checks across records were not made)"
        );
    }
    for (subspace, n) in &r.per_subspace {
        println!("  {subspace:<16} {n}");
    }
    if r.is_clean() {
        println!("records: no problem found");
        return;
    }
    println!("records: {} PROBLEM(S)", r.finding_count);
    for f in r.findings.iter().take(PRINTED) {
        println!("  {} — {}", f.key, f.problem);
    }
    if r.finding_count > PRINTED as u64 {
        println!("  … and {} more", r.finding_count - PRINTED as u64);
    }
}
