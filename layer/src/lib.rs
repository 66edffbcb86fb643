//! kairos-layer: the transactional layer of Kairos.
//!
//! - [`kv`]: the KV trait with FoundationDB semantics and its backends (memory, embedded, fdb).
//! - [`tuple`]: FoundationDB tuple encoding, so keys are byte-identical on every backend.
//! - [`env`]: the injected clock and random source.

#![warn(missing_docs)]

pub mod env;
pub mod kv;
pub mod tuple;
