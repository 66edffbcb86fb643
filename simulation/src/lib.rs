//! Deterministic simulation of whole Kairos clusters on turmoil, replayable from a seed.
//!
//! One turmoil host per node (a real [`kairos_actors::node::Node`] serving the real gRPC
//! services over turmoil's network), per worker group (real SDK workers) and one client (the
//! SDK over gRPC). All nodes share one `memory` store standing for FoundationDB, with its
//! seeded faults. All time is turmoil's simulated time (an injected clock per node, with its
//! skew) and all randomness comes from the seed. See docs/simulation.md.

pub mod check;
pub mod clock;
pub mod limits;
pub mod net;
pub mod plan;
pub mod run;
pub mod store;
pub mod workload;

pub use run::{Outcome, run, run_plan};
