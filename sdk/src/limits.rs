//! The SDK's bounds, in one place (units last).

/// The `http` executor: longest answer body read, in bytes (the output limit is 32 KiB; the rest is cut).
pub const BODY_READ_MAX: usize = 1024 * 1024;
