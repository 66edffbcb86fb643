//! The simulation's bounds, in one place (units last).

/// The longest a workload's handler works (the liveness bound counts on it).
pub const WORK_MAX_MS: u64 = 12_000;
