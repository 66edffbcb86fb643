//! The `kairos` command line (the binary is a thin `main` calling [`main`]).
//!
//! ```text
//! kairos dev    [flags]   one node on the embedded backend in ./kairos-data: no set-up
//! kairos serve  [flags]   a node as configured (file, KAIROS_* env, flags)
//! kairos check  [flags]   checks a stopped node's store (engine pages, then every record)
//! kairos worker --queue Q runs the generic executors for one queue
//! kairos completions SHELL
//! ```
//! Parsed with clap (`kairos <command> --help`): usage errors exit 2, failures exit 1 with
//! their causes on stderr (no backtrace).
//! Stops on Ctrl-C / SIGTERM: drains (stops claiming, finishes in-flight transactions,
//! releases shard leases so other nodes take over at once), then exits.

#![allow(clippy::disallowed_methods)] // the command line runs on the wall clock

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use crate::Node;
use crate::auth::AuthMode;
use crate::config::{Backend, NodeConfig};
use anyhow::{Context, bail};
use clap::{Args, CommandFactory, Parser, Subcommand};
use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::{Database, StoreHealth};

/// `kairos …`.
#[derive(Debug, Parser)]
#[command(
    name = "kairos",
    bin_name = "kairos",
    version = crate::VERSION,
    about = "Kairos: a distributed time-based job scheduler (the node, its store check, a generic worker).",
    after_help = "Node settings: defaults, then --config FILE, then KAIROS_* environment variables, \
                  then flags (docs/node.md). Stops on Ctrl-C / SIGTERM after draining.",
    subcommand_required = true,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One node on the embedded backend in ./kairos-data: no set-up.
    Dev(NodeArgs),
    /// A node as configured (file, KAIROS_* environment, flags).
    Serve(NodeArgs),
    /// Checks a stopped node's store (engine pages, then every record); exits 1 when damaged.
    Check(CheckArgs),
    /// Runs the generic executors (`command` and `http` definitions) for one queue.
    Worker(WorkerArgs),
    /// Prints a shell completion script, e.g. `kairos completions bash`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Where the node's settings come from (each also a YAML key and a KAIROS_* variable:
/// docs/node.md).
#[derive(Debug, Args)]
struct StoreArgs {
    /// A YAML settings file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The data directory [env: KAIROS_DATA_DIR] [default: kairos-data].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<String>,
    /// The keyspace root [env: KAIROS_CLUSTER] [default: default].
    #[arg(long, value_name = "NAME")]
    cluster: Option<String>,
}

/// The postgres backend's settings (docs/node.md, "A cluster on PostgreSQL").
#[derive(Debug, Args)]
struct PostgresArgs {
    /// The database of --backend postgres, e.g.
    /// postgresql://kairos@db1:5432,db2:5432/kairos?target_session_attrs=read-write
    /// [env: KAIROS_POSTGRES_URL].
    #[arg(long, value_name = "URL")]
    postgres_url: Option<String>,
    /// The schema of Kairos's tables, the same on every node [env: KAIROS_POSTGRES_SCHEMA]
    /// [default: kairos].
    #[arg(long, value_name = "NAME")]
    postgres_schema: Option<String>,
    /// Pooled connections for reads, 1-1000 (the committer and the watch listener have one
    /// each on top) [env: KAIROS_POSTGRES_POOL_SIZE] [default: 16].
    #[arg(long, value_name = "N")]
    postgres_pool_size: Option<u64>,
    /// PostgreSQL's statement_timeout for the node's statements
    /// [env: KAIROS_POSTGRES_STATEMENT_TIMEOUT_MS] [default: 5000].
    #[arg(long, value_name = "MS")]
    postgres_statement_timeout_ms: Option<u64>,
}

impl PostgresArgs {
    fn apply(&self, config: &mut NodeConfig) -> anyhow::Result<()> {
        let flags = [
            ("postgres_url", self.postgres_url.clone()),
            ("postgres_schema", self.postgres_schema.clone()),
            ("postgres_pool_size", self.postgres_pool_size.map(|v| v.to_string())),
            (
                "postgres_statement_timeout_ms",
                self.postgres_statement_timeout_ms.map(|v| v.to_string()),
            ),
        ];
        for (setting, value) in flags {
            if let Some(v) = value {
                config.set(setting, &v)?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
struct NodeArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The storage backend [env: KAIROS_BACKEND] [default: embedded].
    #[arg(long, value_parser = ["embedded", "memory", "postgres", "fdb"])]
    backend: Option<String>,
    #[command(flatten)]
    postgres: PostgresArgs,
    /// HTTP API, /metrics and /healthz [env: KAIROS_LISTEN_HTTP] [default: 127.0.0.1:7070].
    #[arg(long, value_name = "ADDR", value_parser = clap::value_parser!(std::net::SocketAddr))]
    listen_http: Option<std::net::SocketAddr>,
    /// gRPC API [env: KAIROS_LISTEN_GRPC] [default: 127.0.0.1:7071].
    #[arg(long, value_name = "ADDR", value_parser = clap::value_parser!(std::net::SocketAddr))]
    listen_grpc: Option<std::net::SocketAddr>,
    /// PEM certificate chain for both listeners: TLS on (with --tls-key-file), reloaded when
    /// the file changes [env: KAIROS_TLS_CERT_FILE] [default: plain TCP].
    #[arg(long, value_name = "FILE")]
    tls_cert_file: Option<String>,
    /// PEM private key of --tls-cert-file [env: KAIROS_TLS_KEY_FILE].
    #[arg(long, value_name = "FILE")]
    tls_key_file: Option<String>,
    /// PEM CA: gRPC clients (workers, kairosctl) must present a certificate it signed
    /// (mutual TLS) [env: KAIROS_TLS_CLIENT_CA_FILE].
    #[arg(long, value_name = "FILE")]
    tls_client_ca_file: Option<String>,
    /// This node's id [env: KAIROS_NODE_ID] [default: kept in DIR/node-id].
    #[arg(long, value_name = "ID")]
    node_id: Option<String>,
    /// This node's region label [env: KAIROS_REGION] [default: local].
    #[arg(long, value_name = "NAME")]
    region: Option<String>,
    /// Logical shards, fixed when the cluster is created [default: 64].
    #[arg(long, value_name = "N")]
    shard_count: Option<u32>,
    /// A `tracing` filter for the logs on stderr [env: KAIROS_LOG] [default: info].
    #[arg(long, value_name = "FILTER")]
    log: Option<String>,
    /// The embedded store's page cache, 8-65536 MiB [env: KAIROS_STORE_CACHE_MIB] [default: 128].
    #[arg(long, value_name = "MIB")]
    store_cache_mib: Option<u64>,
    /// Start a new, empty store although the data directory held one (what it held is lost).
    #[arg(long)]
    new_store: bool,
    /// API keys on every call (`keys`) or none (`off`) [env: KAIROS_AUTH] [default: keys for
    /// serve, off for dev].
    #[arg(long, value_parser = ["keys", "off"])]
    auth: Option<String>,
}

#[derive(Debug, Args)]
struct CheckArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The storage backend [env: KAIROS_BACKEND] [default: embedded].
    #[arg(long, value_parser = ["embedded", "postgres", "fdb"])]
    backend: Option<String>,
    #[command(flatten)]
    postgres: PostgresArgs,
}

#[derive(Debug, Args)]
struct WorkerArgs {
    /// The queue to serve (letters, digits and -_.:/@, as the node requires).
    #[arg(long, value_parser = |q: &str| name("queue", q))]
    queue: String,
    /// The node's gRPC endpoint (https://… for TLS).
    #[arg(
        long,
        env = "KAIROS_ENDPOINT",
        hide_env_values = true,
        default_value = "http://127.0.0.1:7071",
        value_name = "URL"
    )]
    endpoint: String,
    #[command(flatten)]
    tls: kairos_sdk::TlsArgs,
    /// The namespace.
    #[arg(
        long,
        env = "KAIROS_NAMESPACE",
        hide_env_values = true,
        default_value = "default",
        value_name = "NS",
        value_parser = |n: &str| name("namespace", n)
    )]
    namespace: String,
    /// Executions run at once (at least 1).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    concurrency: u32,
    /// The API key (`kai_…`; scope `worker`) sent with every call.
    #[arg(long, env = "KAIROS_API_KEY", hide_env_values = true, value_name = "KEY")]
    api_key: Option<String>,
    /// This worker's id [default: worker-PID].
    #[arg(long, value_name = "ID", value_parser = |w: &str| name("worker id", w))]
    worker_id: Option<String>,
}

/// A name checked by the node's own rule (namespaces, queues, worker ids).
fn name(what: &str, v: &str) -> Result<String, String> {
    kairos_layer::ops::submit::check_name(what, v)
        .map(|()| v.to_string())
        .map_err(|e| e.to_string())
}

/// Runs the `kairos` command line with the process arguments: exit code 0 on success, 1 on a
/// failure (its causes on stderr, no backtrace), 2 on a usage error.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    match run_command(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kairos: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("kairos")
        .build()
        .context("starting the runtime")
}

fn run_command(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Dev(a) => {
            let mut config = node_config(&a)?;
            config.auth.get_or_insert(AuthMode::Off);
            runtime()?.block_on(run(config))
        }
        Command::Serve(a) => {
            let mut config = node_config(&a)?;
            config.auth.get_or_insert(AuthMode::Keys);
            runtime()?.block_on(run(config))
        }
        Command::Check(a) => {
            let mut config = base_config(&a.store)?;
            if let Some(b) = &a.backend {
                config.set("backend", b)?;
            }
            a.postgres.apply(&mut config)?;
            config.validate()?;
            let damaged = runtime()?.block_on(crate::check::run(&config))?;
            if damaged {
                bail!("the store is damaged (see above)");
            }
            Ok(())
        }
        Command::Worker(a) => runtime()?.block_on(worker(a)),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "kairos", &mut std::io::stdout());
            Ok(())
        }
    }
}

/// `kairos worker`: runs the generic executors (`command` and `http` definitions) for one queue.
async fn worker(a: WorkerArgs) -> anyhow::Result<()> {
    let WorkerArgs { queue, endpoint, tls, namespace, concurrency, worker_id, api_key } = a;
    let tls = tls.tls();
    let worker_id = worker_id.unwrap_or_else(|| format!("worker-{}", std::process::id()));
    // Wait for the node (it may still be starting), up to 30 s.
    let mut tries = 0;
    let client = loop {
        match kairos_sdk::Client::connect_tls(&endpoint, &tls).await {
            Ok(c) => match api_key.as_deref().filter(|k| !k.is_empty()) {
                Some(k) => break c.with_api_key(k)?.with_namespace(namespace),
                None => break c.with_namespace(namespace),
            },
            // A setting that cannot work (an unreadable file): no point in retrying.
            Err(e @ kairos_sdk::Error::Invalid(_)) => return Err(e.into()),
            Err(e) if e.is_tls_failure() => return Err(e.into()),
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
        .concurrency(concurrency as usize)
        .fallback(kairos_sdk::run_generic);
    println!(
        "kairos worker {worker_id}: serving queue {queue} from {endpoint} ({concurrency} at once)"
    );
    let mut run = tokio::spawn(w.run(stop_rx));
    // The worker ends by itself when the node refuses it (a bad setting): exit non-zero then.
    tokio::select! {
        r = &mut run => {
            r.context("worker task")??;
            bail!("the worker stopped");
        }
        () = wait_for_signal() => {}
    }
    println!("kairos worker: finishing running tasks…");
    let _ = stop_tx.send(true);
    run.await.context("worker task")??;
    Ok(())
}

/// Defaults, then the file, then the environment, then the store flags.
fn base_config(a: &StoreArgs) -> anyhow::Result<NodeConfig> {
    let mut config = NodeConfig::default();
    if let Some(path) = &a.config {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        config = NodeConfig::from_yaml(&text)?;
    }
    config.apply_env(|k| std::env::var(k).ok())?;
    if let Some(v) = &a.data_dir {
        config.set("data_dir", v)?;
    }
    if let Some(v) = &a.cluster {
        config.set("cluster", v)?;
    }
    Ok(config)
}

fn node_config(a: &NodeArgs) -> anyhow::Result<NodeConfig> {
    let mut config = base_config(&a.store)?;
    let flags = [
        ("backend", a.backend.clone()),
        ("listen_http", a.listen_http.map(|v| v.to_string())),
        ("listen_grpc", a.listen_grpc.map(|v| v.to_string())),
        ("tls_cert_file", a.tls_cert_file.clone()),
        ("tls_key_file", a.tls_key_file.clone()),
        ("tls_client_ca_file", a.tls_client_ca_file.clone()),
        ("node_id", a.node_id.clone()),
        ("region", a.region.clone()),
        ("shard_count", a.shard_count.map(|v| v.to_string())),
        ("log", a.log.clone()),
        ("store_cache_mib", a.store_cache_mib.map(|v| v.to_string())),
        ("new_store", a.new_store.then(|| "true".to_string())),
        ("auth", a.auth.clone()),
    ];
    for (setting, value) in flags {
        if let Some(v) = value {
            config.set(setting, &v)?;
        }
    }
    a.postgres.apply(&mut config)?;
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

async fn open_database(
    config: &NodeConfig,
    clock: SharedClock,
    rng: Rng,
) -> anyhow::Result<Database> {
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
        Backend::Postgres => {
            let options = config.postgres_options()?.context("backend postgres: no settings")?;
            let at = options.describe().unwrap_or_default();
            kairos_layer::kv::postgres::PostgresDatabase::connect_database(options, clock, rng)
                .await
                .with_context(|| format!("connecting to PostgreSQL at {at} (postgres_url)"))?
        }
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
    // Before anything starts: a TLS file that cannot be used is a configuration error.
    let tls = match crate::tls::TlsFiles::from_config(&config) {
        Some(files) => Some(crate::tls::ServerTls::load(files)?),
        None => None,
    };
    let clock: SharedClock = Arc::new(SystemClock::default());
    let rng = Rng::from_entropy();
    config.node_id = Some(node_id(&config, &rng)?);
    let db = open_database(&config, clock.clone(), rng.fork()).await?;
    let store = describe_store(&config);
    let listen = config.listen_http;
    let listen_grpc = config.listen_grpc;
    let data_dir = config.data_dir.clone();
    let tls_reload =
        (config.tls_reload_ms > 0).then(|| std::time::Duration::from_millis(config.tls_reload_ms));
    let node = Node::start(config, db.clone(), clock, rng).await?;
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (bound, http) = crate::api::http::serve_with(
        listen,
        node.clone(),
        tls.clone(),
        stopped(shutdown_rx.clone()),
    )
    .await
    .with_context(|| format!("listening on {listen}"))?;
    let (bound_grpc, grpc) = crate::api::grpc::Api::new(node.clone())
        .serve_with(listen_grpc, tls.clone(), stopped(shutdown_rx))
        .await
        .with_context(|| format!("listening on {listen_grpc}"))?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!(
        "kairos: node {} up — HTTP API {scheme}://{bound} (metrics at /metrics), gRPC {bound_grpc}; {store}",
        node.node_id(),
    );
    announce_auth(&node, &data_dir, &format!("{scheme}://{bound}"), bound_grpc).await?;
    let tls_watch = tls.as_ref().map(|t| {
        let client_auth = match &t.files().client_ca {
            Some(ca) => format!("; gRPC clients need a certificate signed by {}", ca.display()),
            None => String::new(),
        };
        let reload = match tls_reload {
            Some(d) => format!("checked every {d:?} and on SIGHUP"),
            None => "reloaded on SIGHUP".into(),
        };
        println!(
            "kairos: TLS on both listeners with {} ({reload}){client_auth}",
            t.files().cert.display()
        );
        t.watch(tls_reload)
    });
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

/// The file where a node that requires keys and finds none leaves the first admin key.
const BOOTSTRAP_KEY_FILE: &str = "admin-key";

/// Says how callers get in: loudly when anyone may, and with a first admin key (written to a
/// file only its owner may read) when keys are required and none exists yet.
async fn announce_auth(
    node: &Node,
    data_dir: &Path,
    http: &str,
    grpc: std::net::SocketAddr,
) -> anyhow::Result<()> {
    if node.auth().mode() == AuthMode::Off {
        eprintln!(
            "kairos: WARNING: authentication is OFF — anyone who can reach {http} or {grpc} \
             may use every namespace (kairos dev's default; `kairos serve` requires API keys)"
        );
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
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(text.as_bytes())
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
