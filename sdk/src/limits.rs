//! The SDK's bounds, in one place (units last).

/// The `http` executor: longest answer body read, in bytes (the output limit is 32 KiB; the rest is cut).
pub const BODY_READ_MAX: usize = 1024 * 1024;

/// The largest message the SDK takes from a node (gRPC's default is 4 MiB): a node chunks
/// `Work` tasks to 1 MiB, but a page of executions with outputs, or a `Poll` reply of 32 KiB
/// inputs, may pass the default.
pub const DECODE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// The largest message of results the SDK sends on a `Work` stream (results are chunked to it,
/// a result alone may pass it): a quarter of the node's 4 MiB decode limit.
pub const RESULTS_MESSAGE_BYTES_MAX: usize = 1024 * 1024;
/// Most results in one message (the node takes at most 1,000 at once).
pub const RESULTS_PER_MESSAGE_MAX: usize = 256;
/// Most executions (or cron jobs) one list page holds: the node's bound (`LIST_PAGE_MAX` in
/// `kairos-layer`), which `kairosctl --limit` checks before asking.
pub const LIST_PAGE_MAX: u32 = 1_000;
/// Results, and heartbeats, sent in one `Work` stream message: the node refuses a message with
/// more (`kairos_actors::limits::WORK_MESSAGE_ITEMS_MAX`, the same number), so more due at once
/// go in several messages.
pub const MESSAGE_ITEMS_MAX: usize = 1_000;
