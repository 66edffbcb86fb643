//! `kairos admin-key`: local recovery of cluster administration. On a stopped node (the
//! embedded store takes one process at a time), or next to running nodes on a shared backend,
//! it creates a new admin key of every namespace (`*`), records it in the audit log, and writes
//! its token to `DATA_DIR/admin-key` (mode 0600). Whoever may read the node's data directory
//! (or its database) already holds everything, so this grants nothing new.

use std::sync::Arc;

use anyhow::{Context, bail};
use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::keys::Keyspace;
use kairos_layer::ops::{ClusterParams, Scheduler};

use super::serve::{BOOTSTRAP_KEY_FILE, display_dir, open_database, write_private};
use crate::server::config::{Backend, NodeConfig};

/// Creates the key and writes its token; prints where.
pub(super) async fn run(config: &NodeConfig) -> anyhow::Result<()> {
    if config.backend == Backend::Memory {
        bail!("backend memory keeps nothing between runs: there is no cluster to recover");
    }
    if config.backend == Backend::Embedded && !config.data_dir.join("kv.redb").exists() {
        bail!(
            "no store in {} (kv.redb): nothing to recover — `kairos serve` creates the first \
             admin key itself",
            display_dir(&config.data_dir)
        );
    }
    let clock: SharedClock = Arc::new(SystemClock::default());
    let rng = Rng::from_entropy();
    // Whether the store was verified at the open matters to a node's health, not here.
    let (db, _unverified) = open_database(config, clock.clone(), rng.fork())
        .await
        .context("is the node stopped? The embedded store is used by one process at a time")?;
    let params = ClusterParams {
        shard_count: config.shard_count,
        bucket_width_ms: config.bucket_width_ms,
        ready_partitions: config.ready_partitions(),
    };
    let created = async {
        let sched =
            Scheduler::open(db.clone(), Keyspace::new(&config.cluster), clock, rng, params).await?;
        sched
            .create_api_key("*", &["admin".to_string()], "recovery", "kairos admin-key (local)")
            .await
    }
    .await;
    db.close().await;
    let created = created.context("creating the admin key")?;
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating {}", config.data_dir.display()))?;
    let path = config.data_dir.join(BOOTSTRAP_KEY_FILE);
    write_private(&path, &format!("{}\n", created.token))
        .with_context(|| format!("writing {}", path.display()))?;
    println!(
        "kairos admin-key: a new admin key of every namespace (key:{}) — its token is in {} \
         (readable by this user only). Start the node, then `KAIROS_API_KEY=$(cat {}) kairosctl \
         keys list`; delete the file once the token is stored elsewhere.",
        created.key.id,
        display_dir(&path),
        display_dir(&path)
    );
    Ok(())
}
