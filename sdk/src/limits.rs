//! The SDK's bounds, in one place (units last).

/// The `http` executor: longest answer body read, in bytes (the output limit is 32 KiB; the rest is cut).
pub const BODY_READ_MAX: usize = 1024 * 1024;

/// Most executions (or cron jobs) one list page holds: the node's bound (`LIST_PAGE_MAX` in
/// `kairos-layer`), which `kairosctl --limit` checks before asking.
pub const LIST_PAGE_MAX: u32 = 1_000;
