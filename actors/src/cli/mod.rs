//! The `kairos` command line (the binary is a thin `main` calling [`main`]).
//!
//! ```text
//! kairos dev    [flags]   one node on the embedded backend in ./kairos-data: no set-up
//! kairos serve  [flags]   a node as configured (file, KAIROS_* env, flags)
//! kairos check  [flags]   checks a stopped node's store (engine pages, then every record)
//! kairos admin-key [flags] a new admin key of every namespace, on a stopped node (recovery)
//! kairos migrate [--dry-run] upgrades a stopped node's store to this binary's keyspace format
//! kairos config check FILE reports every unknown key and bad value of a settings file
//! kairos backup --to FILE  an online backup of a running node's embedded store
//! kairos restore FILE --data-dir DIR  a backup verified and made a data directory's store
//! kairos worker --queue Q runs the generic executors for one queue
//! kairos completions SHELL
//! kairos man --out DIR     the manual pages (one per subcommand)
//! ```
//! Parsed with clap (`kairos <command> --help`): usage errors exit 2, failures exit 1 with
//! their causes on stderr (no backtrace).
//! Stops on Ctrl-C / SIGTERM: drains (stops claiming, finishes in-flight transactions,
//! releases shard leases so other nodes take over at once), then exits.

#![allow(clippy::disallowed_methods)] // the command line runs on the wall clock

mod admin_key;
mod backup;
pub mod check;
mod config_check;
mod files;
pub mod man;
mod marker;
mod migrate;
mod restore;
mod serve;
mod settings_doc;
mod signal;

use self::signal::wait_for_signal;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::server::auth::AuthMode;
use crate::server::config::{Backend, NodeConfig};
use anyhow::{Context, bail};
use clap::{Args, CommandFactory, Parser, Subcommand};

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
    /// On a stopped node: creates a new admin key of every namespace and writes its token to
    /// DIR/admin-key (recovers administration, e.g. after the last admin key was lost).
    AdminKey(CheckArgs),
    /// On a stopped node: upgrades the store to this binary's keyspace format (an embedded
    /// store is copied to DIR/backups/ first); `--dry-run` says what would run.
    Migrate(MigrateArgs),
    /// Checks a settings file: `kairos config check FILE` reports every unknown key and bad
    /// value with its line.
    #[command(subcommand)]
    Config(config_check::ConfigCommand),
    /// An online backup of a running node's embedded store, through its gRPC API (an admin
    /// key of namespace `*`): one consistent snapshot, written to FILE whole or not at all.
    Backup(backup::BackupArgs),
    /// Verifies a backup (engine pages, then every record) and makes it the store of a data
    /// directory (empty, unless --force).
    Restore(restore::RestoreArgs),
    /// Runs the generic executors (`command` and `http` definitions) for one queue.
    Worker(WorkerArgs),
    /// Prints a shell completion script, e.g. `kairos completions bash`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Writes the manual pages (kairos.1 and one per subcommand) into DIR, e.g.
    /// `kairos man --out /usr/share/man/man1`.
    Man {
        /// The directory of the pages (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
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
struct MigrateArgs {
    #[command(flatten)]
    store: CheckArgs,
    /// Say what would run, change nothing.
    #[arg(long)]
    dry_run: bool,
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
    kairos_layer::ops::validate::check_name(what, v)
        .map(|()| v.to_string())
        .map_err(|e| e.to_string())
}

/// A warning for the operator on stderr: with `log_format: json` a log event (stderr stays one
/// stream of JSON lines), else a plain `kairos: WARNING: …` line.
fn warn(config: &crate::server::config::NodeConfig, text: &str) {
    if config.log_format == crate::server::config::LogFormat::Json {
        tracing::warn!("{text}");
    } else {
        eprintln!("kairos: WARNING: {text}");
    }
}

/// The command line's definition (the manual pages and completions are made from it).
pub fn command() -> clap::Command {
    Cli::command()
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
            eprintln!("kairos: {}", said_once(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes, "error: cause: cause", each cause said once: one whose text the
/// message already holds (an error that names its source in its own message, as
/// `StartError::Cluster` does) is not repeated.
fn said_once(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
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
            runtime()?.block_on(serve::run(config))
        }
        Command::Serve(a) => {
            let mut config = node_config(&a)?;
            config.auth.get_or_insert(AuthMode::Keys);
            runtime()?.block_on(serve::run(config))
        }
        Command::Check(a) => {
            let config = store_config(&a)?;
            let damaged = runtime()?.block_on(crate::cli::check::run(&config))?;
            if damaged {
                bail!("the store is damaged (see above)");
            }
            Ok(())
        }
        Command::AdminKey(a) => {
            let config = store_config(&a)?;
            runtime()?.block_on(admin_key::run(&config))
        }
        Command::Migrate(a) => {
            let config = store_config(&a.store)?;
            runtime()?.block_on(async {
                let shared = match config.backend {
                    Backend::Embedded | Backend::Memory => None,
                    _ => Some(shared_database(&config).await?),
                };
                migrate::run(&config, a.dry_run, shared).await
            })
        }
        Command::Config(c) => config_check::run(c),
        Command::Backup(a) => runtime()?.block_on(backup::run(a)),
        Command::Restore(a) => runtime()?.block_on(restore::run(a)),
        Command::Worker(a) => runtime()?.block_on(worker(a)),
        Command::Man { out } => {
            let written = man::write_pages(Cli::command(), &out)?;
            println!("kairos man: {} pages in {}", written.len(), out.display());
            Ok(())
        }
        Command::Completions { shell } => {
            // Written whole, then printed: clap_complete panics when stdout is closed, and a
            // reader that left (`| head -1`) is no error.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "kairos", &mut script);
            use std::io::Write as _;
            match std::io::stdout().lock().write_all(&script) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    Err(anyhow::Error::new(e).context("writing the completion script"))
                }
                _ => Ok(()),
            }
        }
    }
}

/// The database of a shared backend (PostgreSQL, FoundationDB) for `kairos migrate`.
async fn shared_database(config: &NodeConfig) -> anyhow::Result<kairos_layer::kv::Database> {
    let clock: kairos_layer::env::SharedClock =
        std::sync::Arc::new(kairos_layer::env::SystemClock::default());
    let rng = kairos_layer::env::Rng::from_entropy();
    Ok(serve::open_database(config, clock, rng).await?.0)
}

/// The settings of a command on a stopped node's store (`check`, `admin-key`).
fn store_config(a: &CheckArgs) -> anyhow::Result<NodeConfig> {
    let mut config = base_config(&a.store)?;
    if let Some(b) = &a.backend {
        config.set("backend", b)?;
    }
    a.postgres.apply(&mut config)?;
    config.validate()?;
    Ok(config)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_the_message_names_already_is_said_once() {
        let inner = kairos_layer::ops::Error::FailedPrecondition(
            "the store holds keyspace format 3 and this binary reads format 2 only".into(),
        );
        let e = anyhow::Error::new(crate::node::StartError::Cluster(inner)).context("starting");
        let text = said_once(&e);
        assert_eq!(text.matches("keyspace format 3").count(), 1, "{text}");
        assert!(text.starts_with("starting: opening the cluster: "), "{text}");
        let plain = anyhow::anyhow!("root cause").context("wrapper");
        assert_eq!(said_once(&plain), "wrapper: root cause");
    }
}
