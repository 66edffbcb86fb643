//! kairos-actors: the node runtime — a ractor actor tree over the transactional layer — its
//! API server, and the `kairos` binary. Laid out by role (`docs/architecture.md`):
//!
//! ```text
//! cli ─→ api, node, server          boot (Node::start) ─→ api, node, runtime, server
//! api ─→ node, server               node ─→ runtime, server          runtime ─→ server
//! ```
//! - [`api`]: gRPC (one file per service) and HTTP over the [`Node`] facade;
//! - [`node`]: the facade — admission, the worker side, store health;
//! - [`runtime`]: the actors —
//!
//! ```text
//! NodeSupervisor ─┬─ LeaseManager ─┬─ ShardOwner (per owned shard) ── ExecutionTimer (per execution outliving a timer)
//!                 │               └─ CronShardOwner (per owned cron shard; materializes through the SDK client)
//!                 └─ Dispatcher (worker streams and long polls)
//! shared: Matchmaker (waiting workers' credits), Batcher (results and heartbeats → few transactions)
//! ```
//! - [`server`]: configuration, API keys, quotas, TLS, telemetry, metrics; [`limits`]: the
//!   node's bounds; [`cli`]: the command line.
//!
//! Decision logic lives in pure cores ([`runtime::shard_owner::window`],
//! [`runtime::lease_manager::plan_leases`], [`runtime::execution_timer::on_wake`],
//! [`runtime::dispatcher::state::Core`], [`runtime::matchmaker::Matchmaker`]); actors perform
//! the effects (what follows a commit in one place, `runtime::effects`), never wait on the
//! store inside a handler (transactions run in spawned tasks that report back), use no
//! named-actor registry, and take every wait from the injected clock.

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
