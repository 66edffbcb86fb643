//! Errors of the KV layer, with FoundationDB's meaning and codes.
//!
//! Codes below 9000 are FoundationDB's own (`fdb_get_error`), so code written against the
//! local backends handles errors exactly as it would on FoundationDB. Codes from 9000 are
//! Kairos-specific conditions FoundationDB has no code for.

/// The result type of the KV layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A KV layer error. `is_retryable` and `is_maybe_committed` follow FoundationDB.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// 1020: a key in the transaction's read conflict ranges was written after its read version.
    #[error("not_committed (1020): transaction conflicted with a concurrent write")]
    NotCommitted,
    /// 1021: the commit may or may not have been applied.
    #[error("commit_unknown_result (1021): the transaction may or may not have committed")]
    CommitUnknownResult,
    /// 1007: the transaction is older than the 5 s MVCC window.
    #[error("transaction_too_old (1007): transaction is older than {window_ms} ms")]
    TransactionTooOld {
        /// The MVCC window in milliseconds.
        window_ms: u64,
    },
    /// 1025: the transaction was cancelled or used after commit.
    #[error("transaction_cancelled (1025): {0}")]
    TransactionCancelled(&'static str),
    /// 1031: the transaction exceeded its time-out option.
    #[error("transaction_timed_out (1031): transaction timed out")]
    TimedOut,
    /// 1036: the key was written with a versionstamped value in this transaction.
    #[error("accessed_unreadable (1036): key was written with a versionstamp and cannot be read")]
    AccessedUnreadable,
    /// 2005: a range whose begin is after its end.
    #[error("inverted_range (2005): range begin is after its end")]
    InvertedRange,
    /// 2101: the transaction's mutations and conflict ranges exceed the size limit.
    #[error("transaction_too_large (2101): transaction is {size} bytes, limit is {limit}")]
    TransactionTooLarge {
        /// Approximate transaction size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// 2102: a key exceeds the key size limit.
    #[error("key_too_large (2102): key is {size} bytes, limit is {limit}")]
    KeyTooLarge {
        /// Key size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// 2103: a value exceeds the value size limit.
    #[error("value_too_large (2103): value is {size} bytes, limit is {limit}")]
    ValueTooLarge {
        /// Value size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// 2000: an argument the operation cannot accept (e.g. a bad versionstamp offset).
    #[error("client_invalid_operation (2000): {0}")]
    InvalidOperation(String),
    /// 9001: the database was closed.
    #[error("database_closed (9001): the database is closed")]
    DatabaseClosed,
    /// 9002: the storage engine failed (I/O error, corruption); the message says which.
    #[error("storage_error (9002): {0}")]
    Storage(String),
    /// 9003: the store's disk is full: writes are refused until space returns (reads go on).
    #[error("storage_full (9003): {0}")]
    StorageFull(String),
    /// Any other error with a FoundationDB-style code: FoundationDB's own, passed through by
    /// the `fdb` backend, or the postgres backend's 9004 `database_unavailable`.
    #[error("error {code}: {message}")]
    Other {
        /// FoundationDB error code.
        code: i32,
        /// FoundationDB's description.
        message: String,
        /// Whether FoundationDB considers it retryable.
        retryable: bool,
        /// Whether FoundationDB considers the commit possibly applied.
        maybe_committed: bool,
    },
}

impl Error {
    /// The FoundationDB error code (9000+ for Kairos-specific conditions).
    pub fn code(&self) -> i32 {
        match self {
            Error::NotCommitted => 1020,
            Error::CommitUnknownResult => 1021,
            Error::TransactionTooOld { .. } => 1007,
            Error::TransactionCancelled(_) => 1025,
            Error::TimedOut => 1031,
            Error::AccessedUnreadable => 1036,
            Error::InvalidOperation(_) => 2000,
            Error::InvertedRange => 2005,
            Error::TransactionTooLarge { .. } => 2101,
            Error::KeyTooLarge { .. } => 2102,
            Error::ValueTooLarge { .. } => 2103,
            Error::DatabaseClosed => 9001,
            Error::Storage(_) => 9002,
            Error::StorageFull(_) => 9003,
            Error::Other { code, .. } => *code,
        }
    }

    /// Whether a `run` loop should retry the transaction (FoundationDB's `on_error` set:
    /// not_committed, commit_unknown_result, transaction_too_old).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::NotCommitted | Error::CommitUnknownResult | Error::TransactionTooOld { .. } => {
                true
            }
            Error::Other { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// Whether the transaction may have been applied although it reported an error.
    pub fn is_maybe_committed(&self) -> bool {
        match self {
            Error::CommitUnknownResult => true,
            Error::Other { maybe_committed, .. } => *maybe_committed,
            _ => false,
        }
    }
}

/// An error type a `run` closure may return: it must be able to carry a KV error and say
/// whether it is one, so the retry loop knows what to retry.
pub trait TxnError: From<Error> {
    /// The KV error inside, if this error is one.
    fn kv_error(&self) -> Option<&Error>;
}

impl TxnError for Error {
    fn kv_error(&self) -> Option<&Error> {
        Some(self)
    }
}
