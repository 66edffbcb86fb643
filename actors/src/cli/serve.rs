//! `kairos dev` / `kairos serve`: opening the store (refusing one that vanished), starting
//! the node and its listeners, announcing how callers get in, and stopping — drained on a
//! signal, at once when the store fails.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::{Database, StoreHealth};

use super::signal::wait_for_signal;
use super::{marker, warn};
use crate::api;
use crate::node::Node;
use crate::server::auth::AuthMode;
use crate::server::config::{Backend, NodeConfig};
use crate::server::tls::{ServerTls, TlsFiles};

/// The node id: configured, or kept in the data directory so a restarted node keeps it (a new
/// one is made here and written by [`keep_node_id`]). Known before the first log line.
fn node_id(config: &NodeConfig, rng: &Rng) -> String {
    if let Some(id) = &config.node_id {
        return id.clone();
    }
    match std::fs::read_to_string(config.data_dir.join("node-id")) {
        Ok(id) => id.trim().to_string(),
        Err(_) => format!("node-{:016x}", rng.next_u64()),
    }
}

/// The node id, then the logs (every JSON line carries the id); the guard keeps the exporter.
fn start_logs(
    config: &NodeConfig,
    rng: &Rng,
) -> anyhow::Result<(String, crate::server::telemetry::Guard)> {
    let id = node_id(config, rng);
    crate::server::telemetry::set_node_id(&id);
    Ok((id, crate::server::telemetry::init(config)?))
}

/// Writes a new node id into the data directory (unless configured, or kept there already).
fn keep_node_id(config: &NodeConfig, id: &str) -> anyhow::Result<()> {
    let path = config.data_dir.join("node-id");
    if config.node_id.is_some() || path.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating {}", config.data_dir.display()))?;
    std::fs::write(&path, id).with_context(|| format!("writing {}", path.display()))
}

/// The store, and why its bytes were not verified at the open when they were not (an
/// embedded store after a crash, too large to verify at start-up).
pub(super) async fn open_database(
    config: &NodeConfig,
    clock: SharedClock,
    rng: Rng,
) -> anyhow::Result<(Database, Option<String>)> {
    Ok(match config.backend {
        Backend::Embedded => open_embedded(config, clock, rng)?,
        Backend::Memory => {
            warn(
                config,
                "backend memory: nothing is durable — every execution, schedule, definition and \
                 key is lost when this node stops (for tests and demos; embedded or postgres keep \
                 them)",
            );
            let db = kairos_layer::kv::memory::MemoryDatabase::open(
                clock,
                rng,
                kairos_layer::kv::memory::FaultConfig::none(),
            );
            (db, None)
        }
        Backend::Postgres => {
            let options = config.postgres_options()?.context("backend postgres: no settings")?;
            let at = options.describe().unwrap_or_default();
            let db =
                kairos_layer::kv::postgres::PostgresDatabase::connect_database(options, clock, rng)
                    .await
                    .with_context(|| format!("connecting to PostgreSQL at {at} (postgres_url)"))?;
            (db, None)
        }
        #[cfg(feature = "fdb")]
        Backend::Fdb => {
            let db = kairos_layer::kv::fdb::FdbDatabase::open_database(
                config.fdb_cluster_file.as_deref(),
                clock,
                rng,
            )
            .context("connecting to FoundationDB")?;
            (db, None)
        }
        #[cfg(not(feature = "fdb"))]
        Backend::Fdb => bail!(
            "backend fdb: this binary was built without the `fdb` feature (cargo build --features fdb)"
        ),
    })
}

/// The embedded store in the data directory: refused when it vanished, damaged or not.
fn open_embedded(
    config: &NodeConfig,
    clock: SharedClock,
    rng: Rng,
) -> anyhow::Result<(Database, Option<String>)> {
    use kairos_layer::kv::embedded::{EmbeddedDatabase, EmbeddedOptions, Integrity};
    let path = config.data_dir.join("kv.redb");
    marker::check_store_exists(config, &path)?;
    let options = EmbeddedOptions {
        cache_bytes: usize::try_from(config.store_cache_mib * 1024 * 1024).unwrap_or(usize::MAX),
        verify_after_crash_bytes_max: config.store_verify_after_crash_mib.saturating_mul(1 << 20),
        commit_log: config.store_checkpoint_ms > 0,
        checkpoint_interval_ms: config.store_checkpoint_ms,
        ..Default::default()
    };
    let edb = EmbeddedDatabase::open_with(&path, clock.clone(), options)
        .with_context(|| format!("opening the embedded store {}", path.display()))?;
    let doubt = match edb.integrity() {
        Integrity::Unverified { why } => Some(why.clone()),
        _ => None,
    };
    marker::mark_store_created(config)?;
    Ok((Database::new(Arc::new(edb), clock, rng), doubt))
}

/// What is checked and set before the node starts: the TLS files (one that cannot be used is a
/// configuration error), the descriptor limit raised and the connection limits fitted into it
/// (before any listener), and the data directory made private (saying so loudly).
fn before_start(
    config: &mut NodeConfig,
) -> anyhow::Result<(Option<ServerTls>, crate::server::conns::Budget)> {
    let tls = match TlsFiles::from_config(config) {
        Some(files) => Some(ServerTls::load(files)?),
        None => None,
    };
    let budget = crate::server::conns::descriptor_budget(config);
    if let Some(w) = &budget.warning {
        warn(config, w);
    }
    if config.backend == Backend::Embedded || config.data_dir.exists() {
        let changed = super::files::private_data_dir(&config.data_dir)?;
        if !changed.is_empty() {
            let text = format!(
                "the data directory was readable by other users; made private (it holds every \
                 namespace's data and the key hashes): {}",
                changed.join(", ")
            );
            warn(config, &text);
        }
    }
    Ok((tls, budget))
}

/// `kairos dev` / `kairos serve`: the node and its listeners, until a signal (drained) or a
/// failed store (stopped, exit 1).
pub(super) async fn run(mut config: NodeConfig) -> anyhow::Result<()> {
    // Declared first, dropped last: stops FoundationDB's network thread when `run` ends,
    // however it ends, after the node and the database (a no-op on the other backends).
    #[cfg(feature = "fdb")]
    let _fdb_network = kairos_layer::kv::fdb::NetworkGuard::new();
    // Kept to the end of `run`: flushes exported spans.
    let rng = Rng::from_entropy();
    let (id, _telemetry) = start_logs(&config, &rng)?;
    let (tls, budget) = before_start(&mut config)?;
    let clock: SharedClock = Arc::new(SystemClock::default());
    before_embedded_open(&config).await?;
    keep_node_id(&config, &id)?;
    config.node_id = Some(id);
    let (db, doubt) = open_database(&config, clock.clone(), rng.fork()).await?;
    let say = config.clone();
    let store = describe_store(&config);
    let data_dir = config.data_dir.clone();
    let tls_reload =
        (config.tls_reload_ms > 0).then(|| std::time::Duration::from_millis(config.tls_reload_ms));
    // Both ports first: one in use stops the node before it starts or takes any lease.
    let listeners = bind(&config).await?;
    let node = Node::start(config, db.clone(), clock, rng).await?;
    if let Some(why) = doubt {
        say_unverified(&say, &node, &data_dir, why);
    }
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let ((bound, http), (bound_grpc, grpc)) = serve(&node, &tls, listeners, shutdown_rx)?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!(
        "kairos: node {} up — HTTP API {scheme}://{bound} (metrics at /metrics), gRPC {bound_grpc}; {store}",
        node.node_id(),
    );
    let c = node.config();
    println!(
        "kairos: at most {} connections per listener, {} per address ({} file descriptors)",
        c.max_connections,
        c.max_connections_per_peer,
        budget.descriptors.map_or("unknown".into(), |n| n.to_string())
    );
    announce_auth(&say, &node, &data_dir, &format!("{scheme}://{bound}"), bound_grpc).await?;
    let tls_watch = tls.as_ref().map(|t| announce_tls(t, tls_reload));
    let fatal = wait_for_stop(&say, &node).await;
    if let Some(w) = tls_watch {
        w.abort();
    }
    // A failed store cannot finish a drain's writes: bound the wait.
    let drain = async {
        node.stop().await;
        let _ = shutdown_tx.send(true);
        let _ = http.await;
        let _ = grpc.await;
        db.close().await;
    };
    if fatal {
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

/// The embedded store's checks before anything is written into the data directory (its node
/// id): a vanished store is refused; a newer one is refused, one this open upgrades is copied
/// aside first.
async fn before_embedded_open(config: &NodeConfig) -> anyhow::Result<()> {
    if matches!(config.backend, Backend::Embedded) {
        marker::check_store_exists(config, &config.data_dir.join("kv.redb"))?;
        super::migrate::before_open(config).await?;
    }
    Ok(())
}

/// A store not verified at start-up: warned about, and `/healthz` says so until it is.
fn say_unverified(config: &NodeConfig, node: &Node, data_dir: &Path, why: String) {
    let text = format!(
        "the store was not verified at start-up ({why}); /healthz says `unverified` until \
         `kairos check --data-dir {}` verifies it with the node stopped",
        display_dir(data_dir)
    );
    warn(config, &text);
    node.note_store_unverified(why);
}

/// Binds the HTTP and gRPC ports (before the node starts).
async fn bind(
    config: &NodeConfig,
) -> anyhow::Result<(tokio::net::TcpListener, tokio::net::TcpListener)> {
    let (listen, listen_grpc) = (config.listen_http, config.listen_grpc);
    let http = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen} (listen_http)"))?;
    let grpc = tokio::net::TcpListener::bind(listen_grpc)
        .await
        .with_context(|| format!("listening on {listen_grpc} (listen_grpc)"))?;
    Ok((http, grpc))
}

/// A listener's address and its serving task.
type Serving = (std::net::SocketAddr, tokio::task::JoinHandle<()>);

/// Serves the HTTP and gRPC APIs on the bound listeners until `shutdown` says true.
fn serve(
    node: &Node,
    tls: &Option<ServerTls>,
    (http, grpc): (tokio::net::TcpListener, tokio::net::TcpListener),
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<(Serving, Serving)> {
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let h = api::http::serve_listener(http, node.clone(), tls.clone(), stopped(shutdown.clone()))
        .context("serving the HTTP API")?;
    let g = api::grpc::Api::new(node.clone())
        .serve_listener(grpc, tls.clone(), stopped(shutdown))
        .context("serving the gRPC API")?;
    Ok((h, g))
}

/// Says how the listeners' certificates are used and reloaded, and starts watching them.
fn announce_tls(t: &ServerTls, reload: Option<std::time::Duration>) -> tokio::task::JoinHandle<()> {
    let client_auth = match &t.files().client_ca {
        Some(ca) => format!("; gRPC clients need a certificate signed by {}", ca.display()),
        None => String::new(),
    };
    let reloaded = match reload {
        Some(d) => format!("checked every {d:?} and on SIGHUP"),
        None => "reloaded on SIGHUP".into(),
    };
    println!(
        "kairos: TLS on both listeners with {} ({reloaded}){client_auth}",
        t.files().cert.display()
    );
    t.watch(reload)
}

/// Waits for a signal (`false`: drain) or a failed store (`true`: stop at once).
async fn wait_for_stop(config: &NodeConfig, node: &Node) -> bool {
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
            let text = format!(
                "the store failed ({reason}); stopping so a supervisor can restart the node"
            );
            warn(config, &text);
        }
        _ => println!("kairos: draining…"),
    }
    fatal.is_some()
}

/// The file where a node that requires keys and finds none leaves the first admin key.
pub(super) const BOOTSTRAP_KEY_FILE: &str = "admin-key";

/// Says how callers get in: loudly when anyone may, and with a first admin key (written to a
/// file only its owner may read) when keys are required and none exists yet.
async fn announce_auth(
    config: &NodeConfig,
    node: &Node,
    data_dir: &Path,
    http: &str,
    grpc: std::net::SocketAddr,
) -> anyhow::Result<()> {
    if node.auth().mode() == AuthMode::Off {
        let text = format!(
            "authentication is OFF (auth: off) — anyone who can reach {http} or {grpc} may use \
             every namespace; `--auth keys` (KAIROS_AUTH=keys) requires an API key on every call"
        );
        warn(config, &text);
        return Ok(());
    }
    let sched = node.scheduler();
    if sched.has_live_api_keys().await.context("reading the API keys")? {
        println!("kairos: API keys required on every call (authorization: Bearer kai_…)");
        return Ok(());
    }
    let created = sched
        .create_api_key("*", &["admin".to_string()], "bootstrap", "kairos serve (no keys yet)")
        .await
        .context("creating the first admin key")?;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let path = data_dir.join(BOOTSTRAP_KEY_FILE);
    write_private(&path, &format!("{}\n", created.token))
        .with_context(|| format!("writing {}", path.display()))?;
    println!(
        "kairos: API keys required; there were none, so an admin key for every namespace was \
         created: its token is in {} (readable by this user only). Create narrower keys with \
         `KAIROS_API_KEY=$(cat {}) kairosctl keys create …`, then delete the file.",
        display_dir(&path),
        display_dir(&path)
    );
    Ok(())
}

/// Writes a file only its owner may read.
pub(super) fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(text.as_bytes())
}

/// Where the node's data lives, for the start-up line (never a password).
fn describe_store(config: &NodeConfig) -> String {
    match config.backend {
        Backend::Embedded => format!("data in {}", display_dir(&config.data_dir)),
        Backend::Memory => "data in memory (lost at exit)".into(),
        Backend::Postgres => {
            let at = config.postgres_options().ok().flatten().and_then(|o| o.describe());
            format!("data in PostgreSQL {}", at.unwrap_or_default())
        }
        Backend::Fdb => format!(
            "data in FoundationDB ({})",
            config.fdb_cluster_file.as_deref().unwrap_or("the default cluster file")
        ),
    }
}

pub(super) fn display_dir(p: &Path) -> String {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()).display().to_string()
}
