//! kairos-actors: the node runtime — a ractor actor tree over the transactional layer — and
//! the `kairos` binary.
//!
//! ```text
//! NodeSupervisor ─┬─ LeaseManager ─┬─ ShardOwner (per owned shard) ── ExecutionSupervisor (per in-flight execution)
//!                 │               └─ CronShardOwner (per owned cron shard; materializes through the SDK client)
//!                 └─ Dispatcher (worker streams and long polls)
//! shared: Matchmaker (waiting workers' credits), Batcher (results and heartbeats → few transactions)
//! ```
//! Decision logic lives in pure cores ([`window`], [`lease_manager::plan_leases`],
//! [`execution_supervisor::on_wake`], [`matchmaker::Matchmaker`]); actors perform the effects,
//! never wait on the store inside a handler (transactions run in spawned tasks that report
//! back), use no named-actor registry, and take every wait from the injected clock.

pub mod api;
mod boot;
pub mod cli;
pub mod limits;
pub mod node;
pub mod runtime;
pub mod server;

pub use node::Node;

/// This build's version (`kairos --version`, the node record).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
