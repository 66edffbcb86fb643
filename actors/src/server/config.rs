//! Node configuration: defaults, then a YAML file, then `KAIROS_*` environment variables,
//! then command-line flags. Every value is checked, and an error names the setting.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use kairos_layer::kv::postgres::PostgresOptions;
use kairos_layer::limits::{
    CRON_LOOKAHEAD_MAX_MS, FAIR_SCAN_ROWS_MAX, FIRE_BATCH_MAX, NAME_BYTES_MAX,
    PREFIRE_AHEAD_MS_MAX, SHARD_COUNT_MAX,
};
use serde::Deserialize;

use crate::limits::CLOCK_SKEW_MAX_MS;
use crate::server::auth::AuthMode;

/// Where the node keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// redb file in the data directory (the default).
    Embedded,
    /// In memory: lost at exit (tests, demos).
    Memory,
    /// A FoundationDB cluster (build with `--features fdb`).
    Fdb,
    /// A PostgreSQL database several nodes share (`postgres_url`; ADR 0008).
    Postgres,
}

/// How the node writes its log lines (on stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line (for log shippers): timestamp, level, fields, span.
    Json,
}

/// Limits of one namespace (0 = none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Quota {
    /// Executions submitted per second through this node (a token bucket holding one
    /// second's worth).
    pub submit_per_s: u32,
    /// Executions not yet finished (SCHEDULED, READY, RUNNING, RETRY_WAIT), cluster-wide.
    pub pending_max: u64,
    /// Largest inputs of one execution, in bytes of JSON (0: the global 32 KiB; more than
    /// that is not possible).
    pub inputs_bytes_max: u32,
    /// Largest definition source, in bytes (0: the global limit).
    pub definition_bytes_max: u32,
}

/// Quotas: a default for every namespace, and per-namespace ones instead of it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Quotas {
    /// For namespaces not listed.
    pub default: Quota,
    /// `{namespace: quota}`.
    pub namespaces: BTreeMap<String, Quota>,
}

impl Quotas {
    /// The quota of `ns`.
    pub fn of(&self, ns: &str) -> Quota {
        self.namespaces.get(ns).copied().unwrap_or(self.default)
    }
}

/// The node's configuration. Field names are the YAML keys.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Stable node id; by default generated once and kept in `<data_dir>/node-id`, so a
    /// restarted node recognizes its own shard leases.
    pub node_id: Option<String>,
    /// Region label of this node.
    pub region: String,
    /// The region whose nodes hold the partition leases while any of them is alive (empty: no
    /// preference). Nodes of other regions take over when it is gone.
    pub primary_region: String,
    /// Data directory (embedded store, node id).
    pub data_dir: PathBuf,
    /// Storage backend.
    pub backend: Backend,
    /// FoundationDB cluster file (backend `fdb`); default: the client's default.
    pub fdb_cluster_file: Option<String>,
    /// The database of backend `postgres`: a libpq-style URL, e.g.
    /// `postgresql://kairos:secret@db1:5432,db2:5432/kairos?target_session_attrs=read-write`
    /// (several hosts: the first writable one, i.e. the primary after a failover).
    pub postgres_url: Option<String>,
    /// The PostgreSQL schema holding Kairos's tables (created when absent): lower-case
    /// letters, digits and `_`, at most 40 characters. Every node of a cluster names the same.
    pub postgres_schema: String,
    /// Pooled connections for reads, per node (the committer and the watch listener have one
    /// each on top): 1-1000.
    pub postgres_pool_size: usize,
    /// PostgreSQL's `statement_timeout` for the node's statements (and the idle-in-transaction
    /// timeout that frees the commit lock of a node that vanished mid-commit), 1 ms-1 h.
    pub postgres_statement_timeout_ms: u64,
    /// Cluster name: the root of the keyspace.
    pub cluster: String,
    /// HTTP listen address: the seed's JSON API, `/metrics`, `/healthz`.
    pub listen_http: SocketAddr,
    /// gRPC listen address: the `kairos.v1` services.
    pub listen_grpc: SocketAddr,
    /// PEM certificate chain both listeners present (TLS is on when set; plain TCP otherwise).
    /// Reloaded when it changes ([`crate::server::tls`]).
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file` (required with it).
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificate(s): when set, the gRPC listener requires every client to present a
    /// certificate signed by one of them (mutual TLS). Needs `tls_cert_file`.
    pub tls_client_ca_file: Option<PathBuf>,
    /// How often the TLS files are checked for changes (0: only on SIGHUP).
    pub tls_reload_ms: u64,
    /// Open connections per listener (HTTP, gRPC); the excess is closed at once. Lowered at
    /// start-up to fit the descriptor limit ([`crate::server::conns::descriptor_budget`]).
    pub max_connections: usize,
    /// Open connections per listener from one IP address (at most half of `max_connections`).
    pub max_connections_per_peer: usize,
    /// A connection with no byte read or written for this long is closed (both listeners;
    /// more than `grpc_keepalive_ms`, whose pings keep idle worker streams alive).
    pub connection_idle_timeout_ms: u64,
    /// The HTTP listener's limit on reading a request's headers, and on waiting for the next
    /// request of a kept-alive connection.
    pub http_header_timeout_ms: u64,
    /// Concurrent HTTP/2 streams (calls) per gRPC connection.
    pub grpc_max_concurrent_streams: u32,
    /// How often the node pings an HTTP/2 connection (gRPC); unanswered for 20 s, it is closed.
    pub grpc_keepalive_ms: u64,
    /// Logical shards, fixed when the cluster is created.
    pub shard_count: u32,
    /// Timer bucket width, fixed when the cluster is created.
    pub bucket_width_ms: i64,
    /// Partitions of each ready queue and status count, fixed when the cluster is created (at
    /// most `shard_count`; 0 = 16, or `shard_count` if smaller).
    pub ready_partitions: u32,
    /// Shard lease length; renewed every third of it.
    pub shard_lease_ms: u64,
    /// The most two nodes' clocks may differ (lease expiry compares times written by different
    /// nodes). A lease is taken over only once it expired by this much more; a node whose
    /// heartbeat appears further ahead is reported. At most 250 ms (a quarter of the shortest
    /// attempt lease) and a quarter of `shard_lease_ms`.
    pub max_clock_skew_ms: u64,
    /// A node is alive if it heartbeated within this (at least `shard_lease_ms`). The shards
    /// of a node that died move once its leases expired and it stopped counting as alive:
    /// after `max(shard_lease_ms, node_ttl_ms)` plus the clock-skew bound.
    pub node_ttl_ms: u64,
    /// How far ahead a shard owner loads timers into memory.
    pub window_ms: u64,
    /// Most timers a shard owner keeps in memory (the rest stays in the store: later, never lost).
    pub window_timers_max: usize,
    /// A shard owner scans its shard at least this often (timers written by other nodes).
    pub poll_interval_ms: u64,
    /// Timers per fire transaction.
    pub fire_batch: usize,
    /// How early a shard owner may start an execution for a worker waiting now (a *pre-fire*:
    /// committed before `execute_at`, handed to the worker at it); 0 turns it off.
    pub prefire_ms: u64,
    /// How early the cron service materializes an occurrence (the core scheduler then fires it
    /// on time). At most 1 hour.
    pub cron_lookahead_ms: u64,
    /// Longest a worker's poll may wait.
    pub poll_wait_max_ms: u64,
    /// Per-queue limit of executions in flight through this node (absent: unlimited).
    pub queue_concurrency: BTreeMap<String, usize>,
    /// Days a terminal execution (with its attempts and idempotency key) is kept after it
    /// finished; 0 keeps everything.
    pub retention_days: u32,
    /// `{namespace: days}`: retention for these namespaces instead of `retention_days`.
    pub namespace_retention_days: BTreeMap<String, u32>,
    /// Days audit records (definition registrations, key changes, cancels, replays) are kept;
    /// 0 keeps them forever.
    pub audit_retention_days: u32,
    /// How often the retention sweeper looks for what is due (on the node owning shard 0).
    pub retention_sweep_ms: u64,
    /// `{namespace: weight}` (1-1000; absent: 1): how a fire batch is shared between
    /// namespaces with due work (weighted round robin among a shard's first 4,096 due
    /// timers), so one namespace's backlog does not hold up another's.
    pub namespace_weights: BTreeMap<String, u32>,
    /// Due timers of a shard one fire transaction looks at to share its batch between
    /// namespaces (0: fire in time order only, no sharing), at most 20000.
    pub fair_scan_rows: usize,
    /// Per-namespace limits ([`Quotas`]); none by default.
    pub quotas: Quotas,
    /// Log filter (`tracing` env-filter syntax), e.g. `info` or `kairos_actors=debug`.
    pub log: String,
    /// Log line format: `text` or `json`.
    pub log_format: LogFormat,
    /// OTLP/HTTP traces URL to export the node's spans to (binaries built with the `otel`
    /// feature), e.g. `http://127.0.0.1:4318/v1/traces`.
    pub otlp_endpoint: Option<String>,
    /// The embedded store's page cache, in MiB (memory the store may use beyond the node).
    pub store_cache_mib: u64,
    /// Create a new, empty store even though the data directory shows that one existed (its
    /// `store-created` marker) and it is now missing or empty. Off by default: a vanished
    /// store is refused rather than silently replaced by an empty cluster.
    pub new_store: bool,
    /// The largest embedded store, in MiB, whose every page is verified at start-up after a
    /// run that did not close it cleanly (seconds per GiB); a larger one opens unverified and
    /// `/healthz` says so until `kairos check` verified it.
    pub store_verify_after_crash_mib: u64,
    /// The longest time, in ms, between two durable commits of the embedded store's engine:
    /// between them each group commit is made durable by the store's commit log
    /// (`kv.redb.log`, one append and sync), which a crash leaves to replay at the next start.
    /// `0`: no commit log, every group commit is a durable engine commit (ADR 0011).
    pub store_checkpoint_ms: u64,
    /// `keys`: every API call needs an API key; `off`: none (anyone who reaches the ports may
    /// do everything). Absent: `kairos serve` requires keys, `kairos dev` and nodes embedded
    /// in a program do not.
    pub auth: Option<crate::server::auth::AuthMode>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            node_id: None,
            region: "local".into(),
            primary_region: String::new(),
            data_dir: PathBuf::from("kairos-data"),
            backend: Backend::Embedded,
            fdb_cluster_file: None,
            postgres_url: None,
            postgres_schema: "kairos".into(),
            postgres_pool_size: 16,
            postgres_statement_timeout_ms: 5_000,
            cluster: "default".into(),
            listen_http: SocketAddr::from(([127, 0, 0, 1], 7070)),
            listen_grpc: SocketAddr::from(([127, 0, 0, 1], 7071)),
            tls_cert_file: None,
            tls_key_file: None,
            tls_client_ca_file: None,
            tls_reload_ms: 5_000,
            max_connections: 4_096,
            max_connections_per_peer: 1_024,
            connection_idle_timeout_ms: 120_000,
            http_header_timeout_ms: 10_000,
            grpc_max_concurrent_streams: 256,
            grpc_keepalive_ms: 30_000,
            shard_count: 64,
            bucket_width_ms: 60_000,
            ready_partitions: 0,
            shard_lease_ms: 10_000,
            max_clock_skew_ms: 250,
            node_ttl_ms: 10_000,
            window_ms: 30_000,
            window_timers_max: 100_000,
            poll_interval_ms: 1_000,
            fire_batch: 256,
            prefire_ms: 20,
            cron_lookahead_ms: 5_000,
            poll_wait_max_ms: 60_000,
            queue_concurrency: BTreeMap::new(),
            retention_days: 7,
            namespace_retention_days: BTreeMap::new(),
            audit_retention_days: 90,
            retention_sweep_ms: 60_000,
            namespace_weights: BTreeMap::new(),
            fair_scan_rows: kairos_layer::ops::fire::FAIR_SCAN_ROWS,
            quotas: Quotas::default(),
            log: "info".into(),
            log_format: LogFormat::Text,
            otlp_endpoint: None,
            store_cache_mib: 128,
            new_store: false,
            store_verify_after_crash_mib: 256,
            store_checkpoint_ms: kairos_layer::kv::embedded::CHECKPOINT_INTERVAL_MS,
            auth: None,
        }
    }
}

/// A configuration error naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config {setting}: {reason}")]
pub struct ConfigError {
    /// The setting (YAML key, env variable or flag).
    pub setting: String,
    /// What is wrong.
    pub reason: String,
}

fn bad(setting: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError { setting: setting.into(), reason: reason.into() }
}

/// Environment variables read, and the setting each overrides.
pub const ENV_VARS: [(&str, &str); 33] = [
    ("KAIROS_AUTH", "auth"),
    ("KAIROS_FAIR_SCAN_ROWS", "fair_scan_rows"),
    ("KAIROS_PREFIRE_MS", "prefire_ms"),
    ("KAIROS_NODE_ID", "node_id"),
    ("KAIROS_DATA_DIR", "data_dir"),
    ("KAIROS_BACKEND", "backend"),
    ("KAIROS_LISTEN_HTTP", "listen_http"),
    ("KAIROS_LISTEN_GRPC", "listen_grpc"),
    ("KAIROS_CLUSTER", "cluster"),
    ("KAIROS_LOG", "log"),
    ("KAIROS_LOG_FORMAT", "log_format"),
    ("KAIROS_RETENTION_DAYS", "retention_days"),
    ("KAIROS_OTLP_ENDPOINT", "otlp_endpoint"),
    ("KAIROS_STORE_CACHE_MIB", "store_cache_mib"),
    ("KAIROS_STORE_VERIFY_AFTER_CRASH_MIB", "store_verify_after_crash_mib"),
    ("KAIROS_STORE_CHECKPOINT_MS", "store_checkpoint_ms"),
    ("KAIROS_FDB_CLUSTER_FILE", "fdb_cluster_file"),
    ("KAIROS_POSTGRES_URL", "postgres_url"),
    ("KAIROS_POSTGRES_SCHEMA", "postgres_schema"),
    ("KAIROS_POSTGRES_POOL_SIZE", "postgres_pool_size"),
    ("KAIROS_POSTGRES_STATEMENT_TIMEOUT_MS", "postgres_statement_timeout_ms"),
    ("KAIROS_REGION", "region"),
    ("KAIROS_PRIMARY_REGION", "primary_region"),
    ("KAIROS_TLS_CERT_FILE", "tls_cert_file"),
    ("KAIROS_TLS_KEY_FILE", "tls_key_file"),
    ("KAIROS_TLS_CLIENT_CA_FILE", "tls_client_ca_file"),
    ("KAIROS_TLS_RELOAD_MS", "tls_reload_ms"),
    ("KAIROS_MAX_CONNECTIONS", "max_connections"),
    ("KAIROS_MAX_CONNECTIONS_PER_PEER", "max_connections_per_peer"),
    ("KAIROS_CONNECTION_IDLE_TIMEOUT_MS", "connection_idle_timeout_ms"),
    ("KAIROS_HTTP_HEADER_TIMEOUT_MS", "http_header_timeout_ms"),
    ("KAIROS_GRPC_MAX_CONCURRENT_STREAMS", "grpc_max_concurrent_streams"),
    ("KAIROS_GRPC_KEEPALIVE_MS", "grpc_keepalive_ms"),
];

impl NodeConfig {
    /// Parses a YAML configuration file's text.
    pub fn from_yaml(text: &str) -> Result<NodeConfig, ConfigError> {
        serde_yaml_ng::from_str(text).map_err(|e| bad("file", e.to_string()))
    }

    /// Sets one setting from a string (environment variable or flag value).
    pub fn set(&mut self, setting: &str, value: &str) -> Result<(), ConfigError> {
        if self.set_number(setting, value)? || self.set_choice(setting, value)? {
            return Ok(());
        }
        let address =
            |v: &str| v.parse().map_err(|_| bad(setting, format!("not a socket address: {v:?}")));
        let path = |v: &str| (!v.is_empty()).then(|| PathBuf::from(v));
        match setting {
            "node_id" => self.node_id = Some(value.to_string()),
            "region" => self.region = value.to_string(),
            "primary_region" => self.primary_region = value.to_string(),
            "data_dir" => self.data_dir = PathBuf::from(value),
            "fdb_cluster_file" => self.fdb_cluster_file = Some(value.to_string()),
            "postgres_url" => self.postgres_url = Some(value.to_string()),
            "postgres_schema" => self.postgres_schema = value.to_string(),
            "cluster" => self.cluster = value.to_string(),
            "listen_http" => self.listen_http = address(value)?,
            "listen_grpc" => self.listen_grpc = address(value)?,
            // An empty value unsets a file (so the environment can turn TLS off again).
            "tls_cert_file" => self.tls_cert_file = path(value),
            "tls_key_file" => self.tls_key_file = path(value),
            "tls_client_ca_file" => self.tls_client_ca_file = path(value),
            "log" => self.log = value.to_string(),
            "otlp_endpoint" => self.otlp_endpoint = Some(value.to_string()),
            other => return Err(bad(other, "unknown setting")),
        }
        Ok(())
    }

    /// Sets a numeric setting; `false` if `setting` is not one.
    fn set_number(&mut self, setting: &str, value: &str) -> Result<bool, ConfigError> {
        let num =
            |v: &str| v.parse::<u64>().map_err(|_| bad(setting, format!("not a number: {v:?}")));
        let num32 = |v: &str| {
            v.parse::<u32>().map_err(|_| {
                bad(setting, format!("not a number between 0 and {}: {v:?}", u32::MAX))
            })
        };
        match setting {
            "tls_reload_ms" => self.tls_reload_ms = num(value)?,
            "max_connections" => self.max_connections = num(value)? as usize,
            "max_connections_per_peer" => self.max_connections_per_peer = num(value)? as usize,
            "connection_idle_timeout_ms" => self.connection_idle_timeout_ms = num(value)?,
            "http_header_timeout_ms" => self.http_header_timeout_ms = num(value)?,
            "grpc_max_concurrent_streams" => self.grpc_max_concurrent_streams = num32(value)?,
            "grpc_keepalive_ms" => self.grpc_keepalive_ms = num(value)?,
            "shard_count" => self.shard_count = num32(value)?,
            "ready_partitions" => self.ready_partitions = num32(value)?,
            "cron_lookahead_ms" => self.cron_lookahead_ms = num(value)?,
            "shard_lease_ms" => self.shard_lease_ms = num(value)?,
            "max_clock_skew_ms" => self.max_clock_skew_ms = num(value)?,
            "poll_interval_ms" => self.poll_interval_ms = num(value)?,
            "prefire_ms" => self.prefire_ms = num(value)?,
            "retention_days" => self.retention_days = num32(value)?,
            "retention_sweep_ms" => self.retention_sweep_ms = num(value)?,
            "audit_retention_days" => self.audit_retention_days = num32(value)?,
            "fair_scan_rows" => self.fair_scan_rows = num(value)? as usize,
            "store_cache_mib" => self.store_cache_mib = num(value)?,
            "store_verify_after_crash_mib" => self.store_verify_after_crash_mib = num(value)?,
            "store_checkpoint_ms" => self.store_checkpoint_ms = num(value)?,
            "postgres_pool_size" => self.postgres_pool_size = num(value)? as usize,
            "postgres_statement_timeout_ms" => self.postgres_statement_timeout_ms = num(value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Sets a setting with a few named values; `false` if `setting` is not one.
    fn set_choice(&mut self, setting: &str, value: &str) -> Result<bool, ConfigError> {
        let not = |what: &str| Err(bad(setting, format!("{value:?} is not {what}")));
        match setting {
            "backend" => {
                self.backend = match value {
                    "embedded" => Backend::Embedded,
                    "memory" => Backend::Memory,
                    "fdb" => Backend::Fdb,
                    "postgres" => Backend::Postgres,
                    _ => return not("embedded, memory, postgres or fdb"),
                }
            }
            "log_format" => {
                self.log_format = match value {
                    "text" => LogFormat::Text,
                    "json" => LogFormat::Json,
                    _ => return not("text or json"),
                }
            }
            "auth" => {
                self.auth = Some(match value {
                    "keys" => AuthMode::Keys,
                    "off" => AuthMode::Off,
                    _ => return not("keys or off"),
                })
            }
            "new_store" => {
                self.new_store = match value {
                    "true" | "1" | "yes" => true,
                    "false" | "0" | "no" => false,
                    _ => return not("true or false"),
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Applies the `KAIROS_*` environment variables found by `get`.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        for (var, setting) in ENV_VARS {
            if let Some(v) = get(var) {
                self.set(setting, &v).map_err(|e| bad(var, e.reason))?;
            }
        }
        Ok(())
    }

    /// The ready partitions a new cluster gets.
    pub fn ready_partitions(&self) -> u32 {
        match self.ready_partitions {
            0 => self.shard_count.min(16),
            n => n,
        }
    }

    /// Checks every setting and their relations.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_cluster()?;
        self.validate_timing()?;
        self.validate_tls()?;
        if !(8..=65_536).contains(&self.store_cache_mib) {
            return Err(bad("store_cache_mib", "must be between 8 and 65536"));
        }
        if self.store_checkpoint_ms > 60_000 {
            return Err(bad(
                "store_checkpoint_ms",
                "must be between 0 (no commit log) and 60000 (a crash replays at most a minute)",
            ));
        }
        if let Some((ns, _)) =
            self.namespace_weights.iter().find(|(_, w)| !(1..=1_000).contains(*w))
        {
            return Err(bad(&format!("namespace_weights.{ns}"), "must be between 1 and 1000"));
        }
        if let Some((q, _)) = self.queue_concurrency.iter().find(|(_, n)| **n == 0) {
            return Err(bad(&format!("queue_concurrency.{q}"), "must be positive"));
        }
        self.postgres_options().map(|_| ())
    }

    /// The postgres backend's settings (`None` on another backend), checked: an error names
    /// the setting (the URL itself is never repeated: it may hold a password).
    pub fn postgres_options(&self) -> Result<Option<PostgresOptions>, ConfigError> {
        if self.backend != Backend::Postgres {
            return Ok(None);
        }
        let Some(url) = self.postgres_url.clone().filter(|u| !u.is_empty()) else {
            return Err(bad(
                "postgres_url",
                "required with backend postgres (--postgres-url or KAIROS_POSTGRES_URL)",
            ));
        };
        let options = PostgresOptions {
            schema: self.postgres_schema.clone(),
            pool_size: self.postgres_pool_size,
            statement_timeout: std::time::Duration::from_millis(self.postgres_statement_timeout_ms),
            ..PostgresOptions::new(url)
        };
        options.check().map_err(|e| {
            let setting = match e.field {
                "schema" => "postgres_schema",
                "pool size" => "postgres_pool_size",
                "statement timeout" => "postgres_statement_timeout_ms",
                _ => "postgres_url",
            };
            bad(setting, e.reason)
        })?;
        Ok(Some(options))
    }

    /// The node's id and the cluster's shape.
    fn validate_cluster(&self) -> Result<(), ConfigError> {
        if let Some(id) = &self.node_id
            && (id.is_empty() || id.len() > NAME_BYTES_MAX || id.contains(char::is_whitespace))
        {
            return Err(bad(
                "node_id",
                format!("must be 1-{NAME_BYTES_MAX} characters without spaces"),
            ));
        }
        if self.shard_count == 0 || self.shard_count > SHARD_COUNT_MAX {
            return Err(bad("shard_count", format!("must be between 1 and {SHARD_COUNT_MAX}")));
        }
        if self.bucket_width_ms < 1_000 {
            return Err(bad("bucket_width_ms", "must be at least 1000"));
        }
        if self.ready_partitions > self.shard_count {
            return Err(bad("ready_partitions", "must be at most shard_count"));
        }
        if self.prefire_ms > PREFIRE_AHEAD_MS_MAX as u64 {
            return Err(bad("prefire_ms", format!("must be at most {PREFIRE_AHEAD_MS_MAX}")));
        }
        if self.fire_batch == 0 || self.fire_batch > FIRE_BATCH_MAX {
            return Err(bad("fire_batch", format!("must be between 1 and {FIRE_BATCH_MAX}")));
        }
        if self.fair_scan_rows > FAIR_SCAN_ROWS_MAX {
            return Err(bad("fair_scan_rows", format!("must be at most {FAIR_SCAN_ROWS_MAX}")));
        }
        Ok(())
    }

    /// Leases, clocks, windows and periods, and how they relate.
    fn validate_timing(&self) -> Result<(), ConfigError> {
        if self.cron_lookahead_ms > CRON_LOOKAHEAD_MAX_MS {
            return Err(bad("cron_lookahead_ms", "must be at most 3600000 (1 hour)"));
        }
        if self.shard_lease_ms < 1_000 {
            return Err(bad("shard_lease_ms", "must be at least 1000"));
        }
        if self.max_clock_skew_ms > CLOCK_SKEW_MAX_MS {
            return Err(bad(
                "max_clock_skew_ms",
                format!(
                    "must be at most {CLOCK_SKEW_MAX_MS} (a quarter of the shortest attempt \
                     lease, so a heartbeat at a third of it always lands in time)"
                ),
            ));
        }
        if self.max_clock_skew_ms.saturating_mul(4) > self.shard_lease_ms {
            return Err(bad("max_clock_skew_ms", "must be at most a quarter of shard_lease_ms"));
        }
        if self.node_ttl_ms < self.shard_lease_ms {
            return Err(bad("node_ttl_ms", "must be at least shard_lease_ms"));
        }
        if self.window_ms < 1_000 || self.window_timers_max == 0 {
            return Err(bad(
                "window_ms",
                "window must be at least 1000 ms and hold at least one timer",
            ));
        }
        if self.poll_interval_ms == 0 || self.poll_interval_ms > self.window_ms {
            return Err(bad("poll_interval_ms", "must be between 1 and window_ms"));
        }
        if self.retention_sweep_ms < 1_000 {
            return Err(bad("retention_sweep_ms", "must be at least 1000"));
        }
        Ok(())
    }

    /// The listeners' certificate files.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(_), None) => return Err(bad("tls_key_file", "required with tls_cert_file")),
            (None, Some(_)) => return Err(bad("tls_cert_file", "required with tls_key_file")),
            _ => {}
        }
        if self.tls_client_ca_file.is_some() && self.tls_cert_file.is_none() {
            return Err(bad(
                "tls_client_ca_file",
                "needs tls_cert_file and tls_key_file (mutual TLS is on top of TLS)",
            ));
        }
        if self.tls_reload_ms != 0 && self.tls_reload_ms < 100 {
            return Err(bad("tls_reload_ms", "must be 0 (only on SIGHUP) or at least 100"));
        }
        self.validate_connections()
    }

    /// The listeners' connection limits and time-outs.
    fn validate_connections(&self) -> Result<(), ConfigError> {
        if self.max_connections == 0 {
            return Err(bad("max_connections", "must be at least 1"));
        }
        if self.max_connections_per_peer == 0 {
            return Err(bad("max_connections_per_peer", "must be at least 1"));
        }
        if self.http_header_timeout_ms < 100 {
            return Err(bad("http_header_timeout_ms", "must be at least 100"));
        }
        if !(1_000..=3_600_000).contains(&self.grpc_keepalive_ms) {
            return Err(bad("grpc_keepalive_ms", "must be between 1000 and 3600000"));
        }
        if self.connection_idle_timeout_ms <= self.grpc_keepalive_ms {
            return Err(bad(
                "connection_idle_timeout_ms",
                "must be more than grpc_keepalive_ms (its pings keep idle worker streams open)",
            ));
        }
        if self.grpc_max_concurrent_streams == 0 {
            return Err(bad("grpc_max_concurrent_streams", "must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_env_and_flags_layer_in_order() {
        let mut c = NodeConfig::from_yaml(
            "data_dir: /tmp/x\nshard_count: 8\nqueue_concurrency: {reports: 4}\n",
        )
        .unwrap();
        assert_eq!(c.shard_count, 8);
        assert_eq!(c.queue_concurrency["reports"], 4);
        c.apply_env(|k| (k == "KAIROS_DATA_DIR").then(|| "/tmp/y".to_string())).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/tmp/y"));
        c.set("listen_http", "127.0.0.1:9999").unwrap();
        assert_eq!(c.listen_http.port(), 9999);
        c.validate().unwrap();
    }

    #[test]
    fn errors_name_the_setting() {
        let e = NodeConfig::from_yaml("shard_cont: 8\n").unwrap_err();
        assert!(e.to_string().contains("shard_cont"), "{e}");
        let e = NodeConfig::default().set("backend", "mysql").unwrap_err();
        assert_eq!(e.setting, "backend");
        let e = NodeConfig::default()
            .apply_env(|k| (k == "KAIROS_LISTEN_HTTP").then(|| "nope".into()))
            .unwrap_err();
        assert_eq!(e.setting, "KAIROS_LISTEN_HTTP");
        let c = NodeConfig { poll_interval_ms: 0, ..NodeConfig::default() };
        assert_eq!(c.validate().unwrap_err().setting, "poll_interval_ms");
        let c = NodeConfig { node_ttl_ms: 10, ..NodeConfig::default() };
        assert_eq!(c.validate().unwrap_err().setting, "node_ttl_ms");
        let e = NodeConfig::default().set("shard_count", "4294967297").unwrap_err();
        assert_eq!(e.setting, "shard_count", "not truncated to a u32: {e}");
        let c = NodeConfig { max_clock_skew_ms: 400, ..NodeConfig::default() };
        assert_eq!(c.validate().unwrap_err().setting, "max_clock_skew_ms");
        let c = NodeConfig { shard_count: 8, ready_partitions: 9, ..NodeConfig::default() };
        assert_eq!(c.validate().unwrap_err().setting, "ready_partitions");
        assert_eq!(NodeConfig { shard_count: 8, ..NodeConfig::default() }.ready_partitions(), 8);
        assert_eq!(NodeConfig::default().ready_partitions(), 16);
    }

    #[test]
    fn postgres_settings_are_checked_naming_the_setting() {
        let mut c = NodeConfig::default();
        c.set("backend", "postgres").unwrap();
        let e = c.validate().unwrap_err();
        assert!(e.setting == "postgres_url" && e.reason.contains("KAIROS_POSTGRES_URL"), "{e}");
        let env = |k: &str| match k {
            "KAIROS_POSTGRES_URL" => Some("postgresql://kairos:secret@db1:5432,db2:5432/k".into()),
            "KAIROS_POSTGRES_POOL_SIZE" => Some("4".into()),
            _ => None,
        };
        c.apply_env(env).unwrap();
        c.validate().unwrap();
        let o = c.postgres_options().unwrap().unwrap();
        assert_eq!((o.pool_size, o.schema.as_str()), (4, "kairos"));
        c.set("postgres_url", "postgresql://kairos:secret@db1:notaport/k").unwrap();
        let e = c.validate().unwrap_err();
        assert_eq!(e.setting, "postgres_url");
        assert!(!e.to_string().contains("secret"), "the URL is not repeated: {e}");
        c.set("postgres_url", "postgresql://db1/k").unwrap();
        c.set("postgres_schema", "Bad-Name").unwrap();
        assert_eq!(c.validate().unwrap_err().setting, "postgres_schema");
        c.set("postgres_schema", "kairos_2").unwrap();
        c.set("postgres_statement_timeout_ms", "0").unwrap();
        assert_eq!(c.validate().unwrap_err().setting, "postgres_statement_timeout_ms");
        c.set("postgres_statement_timeout_ms", "2000").unwrap();
        c.set("postgres_pool_size", "0").unwrap();
        assert_eq!(c.validate().unwrap_err().setting, "postgres_pool_size");
        let yaml = "backend: postgres\npostgres_url: postgresql://db1/k\npostgres_pool_size: 8\n";
        NodeConfig::from_yaml(yaml).unwrap().validate().unwrap();
    }

    #[test]
    fn tls_files_come_in_pairs() {
        let mut c = NodeConfig::default();
        c.apply_env(|k| (k == "KAIROS_TLS_CERT_FILE").then(|| "/etc/kairos/node.pem".into()))
            .unwrap();
        assert_eq!(c.tls_cert_file, Some(PathBuf::from("/etc/kairos/node.pem")));
        assert_eq!(c.validate().unwrap_err().setting, "tls_key_file");
        c.set("tls_key_file", "/etc/kairos/node.key").unwrap();
        c.validate().unwrap();
        c.set("tls_reload_ms", "10").unwrap();
        assert_eq!(c.validate().unwrap_err().setting, "tls_reload_ms");
        c.set("tls_reload_ms", "0").unwrap();
        c.validate().unwrap();
        let c = NodeConfig::from_yaml("tls_client_ca_file: /etc/kairos/ca.pem\n").unwrap();
        let e = c.validate().unwrap_err();
        assert!(e.setting == "tls_client_ca_file" && e.reason.contains("tls_cert_file"), "{e}");
        let mut c = NodeConfig::from_yaml("tls_cert_file: a.pem\ntls_key_file: a.key\n").unwrap();
        c.set("tls_cert_file", "").unwrap();
        assert_eq!(c.tls_cert_file, None, "an empty value turns TLS off");
        assert_eq!(c.validate().unwrap_err().setting, "tls_cert_file");
    }

    #[test]
    fn log_format_and_cache_size_come_from_the_environment_too() {
        let mut c = NodeConfig::default();
        assert_eq!(c.log_format, LogFormat::Text);
        c.apply_env(|k| match k {
            "KAIROS_LOG_FORMAT" => Some("json".into()),
            "KAIROS_STORE_CACHE_MIB" => Some("64".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!((c.log_format, c.store_cache_mib), (LogFormat::Json, 64));
        let e = NodeConfig::default().set("log_format", "xml").unwrap_err();
        assert!(e.to_string().contains("log_format") && e.to_string().contains("xml"), "{e}");
        let y = NodeConfig::from_yaml("log_format: json\n").unwrap();
        assert_eq!(y.log_format, LogFormat::Json);
    }
}
