//! Errors of the scheduler operations. Each names what was wrong so the API can map it to a
//! gRPC code / HTTP status in one place and show the message as is.

use crate::kv;
use crate::state::InvalidTransition;

/// The result type of the operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An operation's error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Bad input; `field` names it (API field names: `executeAt`, `inputs.report_date`, …).
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The offending field.
        field: String,
        /// Why it was rejected.
        reason: String,
    },
    /// Something referenced does not exist.
    #[error("{what} not found: {id}")]
    NotFound {
        /// What kind of thing (`execution`, `definition`, …).
        what: &'static str,
        /// Its id.
        id: String,
    },
    /// The idempotency key was used before for a different request.
    #[error(
        "idempotency key {key:?} was already used for a different request (execution {execution_id})"
    )]
    IdempotencyConflict {
        /// The key.
        key: String,
        /// The execution it created.
        execution_id: String,
    },
    /// Something with this identity exists and cannot change.
    #[error("{what} {id} already exists and is immutable")]
    AlreadyExists {
        /// What kind of thing.
        what: &'static str,
        /// Its id.
        id: String,
    },
    /// The operation does not apply in the current state (e.g. cancelling a RUNNING execution).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A worker result or heartbeat whose attempt is no longer current (or not the caller's):
    /// nothing was changed. It names no fencing token, neither the one sent nor the current one
    /// (a token is the only proof of holding an attempt).
    #[error("fenced out: execution {execution_id}: {reason}")]
    FencedOut {
        /// The execution.
        execution_id: String,
        /// Why the attempt is not the caller's to report.
        reason: String,
    },
    /// A shard write with a stale lease epoch: nothing was changed; the owner must stop.
    #[error("ownership of shard {shard} lost: epoch {epoch} is stale (current epoch {current})")]
    OwnershipLost {
        /// The shard.
        shard: u32,
        /// The epoch the caller holds.
        epoch: u64,
        /// The current epoch.
        current: u64,
    },
    /// The shard is leased to another node.
    #[error("shard {shard} is leased to {owner} until {expires_at_ms} ms")]
    LeaseHeld {
        /// The shard.
        shard: u32,
        /// The current owner.
        owner: String,
        /// When the lease expires.
        expires_at_ms: i64,
    },
    /// A state machine rejected the event.
    #[error(transparent)]
    InvalidTransition(#[from] InvalidTransition),
    /// A stored record or key could not be decoded.
    #[error("corrupt data: {0}")]
    Corrupt(String),

    /// The namespace is over one of its quotas; retry after `retry_after_ms`.
    #[error("namespace {namespace} is over its quota: {what}")]
    QuotaExceeded {
        /// The namespace.
        namespace: String,
        /// Which quota, and its limit.
        what: String,
        /// When a retry may pass.
        retry_after_ms: u64,
    },
    /// No valid API key came with the call (missing, malformed, unknown or revoked).
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller's key does not allow this (its namespace or a scope is missing).
    #[error("{0}")]
    PermissionDenied(String),
    /// The KV layer failed (retryable ones are retried by `run` before surfacing).
    #[error(transparent)]
    Kv(#[from] kv::Error),
}

impl kv::TxnError for Error {
    fn kv_error(&self) -> Option<&kv::Error> {
        match self {
            Error::Kv(e) => Some(e),
            _ => None,
        }
    }
}

impl From<crate::keys::KeyError> for Error {
    fn from(e: crate::keys::KeyError) -> Self {
        Error::Corrupt(e.to_string())
    }
}

/// An `InvalidArgument` error.
pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::InvalidArgument { field: field.into(), reason: reason.into() }
}

/// A client's value as an error message shows it: quoted, cut after 64 characters with its
/// length said (a 100 KB value is not sent back whole).
pub fn shown(value: &str) -> String {
    const SHOWN: usize = 64;
    match value.char_indices().nth(SHOWN) {
        None => format!("{value:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &value[..cut], value.len()),
    }
}
