//! kairos-simulation: deterministic simulation of whole clusters (turmoil). Arrives with the simulation issue.
