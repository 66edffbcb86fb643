//! The node's actors and what they share.

pub mod batcher;
pub mod context;
pub mod cron_api;
pub mod cron_owner;
pub mod dispatcher;
pub(crate) mod effects;
pub mod execution_timer;
pub mod fire_gate;
pub mod held;
pub mod lease_manager;
pub mod matchmaker;
pub mod messages;
pub mod retention;
pub mod shard_owner;
pub mod supervisor;
