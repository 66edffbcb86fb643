//! kairos-actors: the node runtime — a ractor actor tree over the transactional layer — and
//! the `kairos` binary.
//!
//! ```text
//! NodeSupervisor ─┬─ ShardLeaseManager ── ShardOwner (per owned shard) ── ExecutionSupervisor (per in-flight execution)
//!                 └─ Dispatcher (workers' long polls)
//! ```
//! Decision logic lives in pure cores ([`window`], [`lease_manager::plan_leases`],
//! [`execution::on_wake`], [`dispatcher::InFlight`]); actors perform the effects, never wait
//! on the store inside a handler (transactions run in spawned tasks that report back), use no
//! named-actor registry, and take every wait from the injected clock.

pub mod api;
pub mod cli;
pub mod config;
pub mod context;
pub mod dispatcher;
pub mod execution;
pub mod lease_manager;
pub mod metrics;
pub mod node;
pub mod shard_owner;
pub mod supervisor;
pub mod window;

pub use node::Node;
