//! kairos-layer: the transactional layer of Kairos.
//!
//! - [`kv`]: the KV trait with FoundationDB semantics and its backends (memory, embedded, fdb).
//! - [`mod@tuple`]: FoundationDB tuple encoding, so keys are byte-identical on every backend.
//! - [`mod@env`]: the injected clock and random source.

#![warn(missing_docs)]

pub mod cron;
pub mod definition;
pub mod env;
pub mod ids;
pub mod keys;
pub mod kv;
pub mod limits;
pub mod ops;
pub mod state;
pub mod tuple;
