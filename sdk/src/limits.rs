//! The SDK's bounds, in one place (units last).

/// The `http` executor: longest answer body read, in bytes (the output limit is 32 KiB; the rest is cut).
pub const BODY_READ_MAX: usize = 1024 * 1024;

/// Results, and heartbeats, sent in one `Work` stream message: the node refuses a message with
/// more (`kairos_actors::limits::WORK_MESSAGE_ITEMS_MAX`, the same number), so more due at once
/// go in several messages.
pub const MESSAGE_ITEMS_MAX: usize = 1_000;
