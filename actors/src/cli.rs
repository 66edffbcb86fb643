//! The `kairos` command line (the binary is a thin `main` calling [`main`]).
//!
//! ```text
//! kairos dev   [flags]   one node on the embedded backend in ./kairos-data: no set-up
//! kairos serve [flags]   a node as configured (file, KAIROS_* env, flags)
//! kairos check [flags]   checks a stopped node's store (engine pages, then every record)
//!
//! flags: --config FILE  --data-dir DIR  --listen-http ADDR  --node-id ID  --cluster NAME
//!        --backend embedded|memory|fdb  --shard-count N  --log FILTER
//! ```
//! Stops on Ctrl-C / SIGTERM: drains (stops claiming, finishes in-flight transactions,
//! releases shard leases so other nodes take over at once), then exits.

#![allow(clippy::disallowed_methods)] // the command line runs on the wall clock

use std::path::Path;
use std::sync::Arc;

use crate::Node;
use crate::config::{Backend, NodeConfig};
use anyhow::{Context, bail};
use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::{Database, StoreHealth};

const USAGE: &str = "usage: kairos --version
       kairos check [--config FILE] [--data-dir DIR] [--cluster NAME] [--backend embedded|fdb]
       kairos worker --queue QUEUE [--endpoint URL] [--namespace NS] [--concurrency N] [--worker-id ID]
       kairos <dev|serve> [--config FILE] [--data-dir DIR] [--listen-http ADDR] [--listen-grpc ADDR] \
[--node-id ID] [--cluster NAME] [--backend embedded|memory|fdb] [--shard-count N] [--log FILTER] \
[--store-cache-mib N] [--new-store]";

/// Runs the `kairos` command line with the process arguments.
pub fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (command, flags) = match args.split_first() {
        Some((c, rest)) => (c.as_str(), rest),
        None => bail!("no command given\n{USAGE}"),
    };
    match command {
        "dev" | "serve" => {}
        "check" => {
            let config = load_config(flags)?;
            let damaged = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the runtime")?
                .block_on(crate::check::run(&config))?;
            if damaged {
                bail!("the store is damaged (see above)");
            }
            return Ok(());
        }
        "worker" => {
            return tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the runtime")?
                .block_on(worker(flags));
        }
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            return Ok(());
        }
        "-V" | "--version" | "version" => {
            println!("kairos {}", crate::VERSION);
            return Ok(());
        }
        other => bail!("unknown command `{other}`\n{USAGE}"),
    }
    let config = load_config(flags)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("kairos")
        .build()
        .context("starting the runtime")?
        .block_on(run(config))
}

/// `kairos worker`: runs the generic executors (`command` and `http` definitions) for one queue.
async fn worker(flags: &[String]) -> anyhow::Result<()> {
    let mut endpoint = "http://127.0.0.1:7071".to_string();
    let mut namespace = "default".to_string();
    let mut queue = None;
    let mut concurrency = 8usize;
    let mut worker_id = format!("worker-{}", std::process::id());
    let mut it = flags.iter();
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--endpoint" => endpoint = value.clone(),
            "--namespace" => namespace = value.clone(),
            "--queue" => queue = Some(value.clone()),
            "--concurrency" => concurrency = value.parse().context("--concurrency: a number")?,
            "--worker-id" => worker_id = value.clone(),
            other => bail!("unknown flag `{other}`\n{USAGE}"),
        }
    }
    let queue = queue.context("--queue is required")?;
    // Wait for the node (it may still be starting), up to 30 s.
    let mut tries = 0;
    let client = loop {
        match kairos_sdk::Client::connect(&endpoint).await {
            Ok(c) => break c.with_namespace(namespace),
            Err(e) if tries < 60 => {
                if tries == 0 {
                    eprintln!("kairos worker: {e}; retrying for up to 30 s");
                }
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let w = kairos_sdk::Worker::new(client, queue.clone(), worker_id.clone())
        .concurrency(concurrency)
        .fallback(kairos_sdk::run_generic);
    println!(
        "kairos worker {worker_id}: serving queue {queue} from {endpoint} ({concurrency} at once)"
    );
    let run = tokio::spawn(w.run(stop_rx));
    wait_for_signal().await;
    println!("kairos worker: finishing running tasks…");
    let _ = stop_tx.send(true);
    run.await.context("worker task")??;
    Ok(())
}

fn load_config(flags: &[String]) -> anyhow::Result<NodeConfig> {
    let mut config = NodeConfig::default();
    if let Some(i) = flags.iter().position(|f| f == "--config") {
        let path = flags.get(i + 1).context("--config needs a file")?;
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        config = NodeConfig::from_yaml(&text)?;
    }
    config.apply_env(|k| std::env::var(k).ok())?;
    let mut it = flags.iter();
    while let Some(flag) = it.next() {
        let setting = match flag.as_str() {
            "--config" => {
                it.next();
                continue;
            }
            "--data-dir" => "data_dir",
            "--listen-http" => "listen_http",
            "--listen-grpc" => "listen_grpc",
            "--node-id" => "node_id",
            "--cluster" => "cluster",
            "--backend" => "backend",
            "--shard-count" => "shard_count",
            "--log" => "log",
            "--store-cache-mib" => "store_cache_mib",
            "--new-store" => {
                config.set("new_store", "true")?;
                continue;
            }
            other => bail!("unknown flag `{other}`\n{USAGE}"),
        };
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        config.set(setting, value)?;
    }
    config.validate()?;
    Ok(config)
}

/// The node id: configured, or kept in the data directory so a restarted node keeps it.
fn node_id(config: &NodeConfig, rng: &Rng) -> anyhow::Result<String> {
    if let Some(id) = &config.node_id {
        return Ok(id.clone());
    }
    let path = config.data_dir.join("node-id");
    if let Ok(id) = std::fs::read_to_string(&path) {
        return Ok(id.trim().to_string());
    }
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating {}", config.data_dir.display()))?;
    let id = format!("node-{:016x}", rng.next_u64());
    std::fs::write(&path, &id).with_context(|| format!("writing {}", path.display()))?;
    Ok(id)
}

fn open_database(config: &NodeConfig, clock: SharedClock, rng: Rng) -> anyhow::Result<Database> {
    Ok(match config.backend {
        Backend::Embedded => {
            let path = config.data_dir.join("kv.redb");
            check_store_exists(config, &path)?;
            let options = kairos_layer::kv::embedded::EmbeddedOptions {
                cache_bytes: usize::try_from(config.store_cache_mib * 1024 * 1024)
                    .unwrap_or(usize::MAX),
                ..Default::default()
            };
            let db = kairos_layer::kv::embedded::EmbeddedDatabase::open_database_with(
                &path, clock, rng, options,
            )
            .with_context(|| format!("opening the embedded store {}", path.display()))?;
            mark_store_created(config)?;
            db
        }
        Backend::Memory => kairos_layer::kv::memory::MemoryDatabase::open(
            clock,
            rng,
            kairos_layer::kv::memory::FaultConfig::none(),
        ),
        #[cfg(feature = "fdb")]
        Backend::Fdb => kairos_layer::kv::fdb::FdbDatabase::open_database(
            config.fdb_cluster_file.as_deref(),
            clock,
            rng,
        )
        .context("connecting to FoundationDB")?,
        #[cfg(not(feature = "fdb"))]
        Backend::Fdb => bail!(
            "backend fdb: this binary was built without the `fdb` feature (cargo build --features fdb)"
        ),
    })
}

/// The marker a data directory keeps once it held a store.
const STORE_MARKER: &str = "store-created";

/// Refuses to start on a data directory whose store existed and is now missing or empty
/// (deleted, truncated, a volume not mounted): that would silently be a new, empty cluster.
fn check_store_exists(config: &NodeConfig, store: &Path) -> anyhow::Result<()> {
    let marker = config.data_dir.join(STORE_MARKER);
    let Ok(created) = std::fs::read_to_string(&marker) else { return Ok(()) };
    let size = std::fs::metadata(store).map(|m| m.len()).ok();
    if size.is_some_and(|s| s > 0) || config.new_store {
        return Ok(());
    }
    let what = if size.is_none() { "is missing" } else { "is empty" };
    bail!(
        "the store {} {what}, but this data directory held one ({}: {}).\n\
         Restore kv.redb from a backup, or start with --new-store to begin a new, empty cluster \
         here (what the old store held is lost).",
        store.display(),
        marker.display(),
        created.trim()
    )
}

/// Records that the data directory now holds a store.
fn mark_store_created(config: &NodeConfig) -> anyhow::Result<()> {
    let marker = config.data_dir.join(STORE_MARKER);
    if config.new_store || !marker.exists() {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let now = crate::api::json::rfc3339(ms).unwrap_or_default();
        std::fs::write(&marker, format!("store created {now} by kairos {}\n", crate::VERSION))
            .with_context(|| format!("writing {}", marker.display()))?;
    }
    Ok(())
}

async fn run(mut config: NodeConfig) -> anyhow::Result<()> {
    // Declared first, dropped last: stops FoundationDB's network thread when `run` ends,
    // however it ends, after the node and the database (a no-op on the other backends).
    #[cfg(feature = "fdb")]
    let _fdb_network = kairos_layer::kv::fdb::NetworkGuard::new();
    // Kept to the end of `run`: flushes exported spans.
    let _telemetry = crate::telemetry::init(&config)?;
    let clock: SharedClock = Arc::new(SystemClock::default());
    let rng = Rng::from_entropy();
    config.node_id = Some(node_id(&config, &rng)?);
    let db = open_database(&config, clock.clone(), rng.fork())?;
    let listen = config.listen_http;
    let listen_grpc = config.listen_grpc;
    let data_dir = config.data_dir.clone();
    let node = Node::start(config, db.clone(), clock, rng).await?;
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (bound, http) = crate::api::http::serve(listen, node.clone(), stopped(shutdown_rx.clone()))
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let (bound_grpc, grpc) = crate::api::grpc::Api::new(node.clone())
        .serve(listen_grpc, stopped(shutdown_rx))
        .await
        .with_context(|| format!("listening on {listen_grpc}"))?;
    println!(
        "kairos: node {} up — HTTP API http://{bound} (metrics at /metrics), gRPC {bound_grpc}; data in {}",
        node.node_id(),
        display_dir(&data_dir)
    );
    let mut health = node.watch_store_health();
    let failed = async move {
        let failed = health.wait_for(|h| matches!(h, StoreHealth::Failed { .. })).await;
        match failed {
            Ok(h) => h.clone(),
            Err(_) => std::future::pending().await,
        }
    };
    let fatal = tokio::select! {
        _ = wait_for_signal() => None,
        h = failed => Some(h),
    };
    match &fatal {
        Some(StoreHealth::Failed { reason }) => {
            eprintln!(
                "kairos: the store failed ({reason}); stopping so a supervisor can restart the node"
            );
        }
        _ => println!("kairos: draining…"),
    }
    // A failed store cannot finish a drain's writes: bound the wait.
    let drain = async {
        node.stop().await;
        let _ = shutdown_tx.send(true);
        let _ = http.await;
        let _ = grpc.await;
        db.close().await;
    };
    if fatal.is_some() {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), drain).await;
        bail!(
            "the store failed; run `kairos check --data-dir {}` before restarting",
            display_dir(&data_dir)
        );
    }
    drain.await;
    println!("kairos: stopped");
    Ok(())
}

fn display_dir(p: &Path) -> String {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()).display().to_string()
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
