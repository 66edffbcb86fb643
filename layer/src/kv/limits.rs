//! FoundationDB's limits, enforced by every backend so code that passes locally also runs on
//! FoundationDB. Names carry their unit last (`_bytes_max`, `_ms`).

use super::error::{Error, Result};

/// Largest key, in bytes (FoundationDB: 10,000).
pub const KEY_BYTES_MAX: usize = 10_000;
/// Largest value, in bytes (FoundationDB: 100,000).
pub const VALUE_BYTES_MAX: usize = 100_000;
/// Largest transaction (mutations + conflict ranges), in bytes (FoundationDB: 10,000,000).
pub const TRANSACTION_BYTES_MAX: usize = 10_000_000;
/// Longest a transaction may live from its read version, in milliseconds (FoundationDB: 5 s).
pub const TRANSACTION_AGE_MAX_MS: u64 = 5_000;
/// Fixed per-mutation overhead counted toward the transaction size (as FoundationDB does).
pub const MUTATION_OVERHEAD_BYTES: usize = 32;
/// Length of a versionstamp: 8-byte commit version + 2-byte batch order.
pub const VERSIONSTAMP_BYTES: usize = 10;

const _: () = assert!(KEY_BYTES_MAX + VALUE_BYTES_MAX < TRANSACTION_BYTES_MAX);

/// Checks a key against [`KEY_BYTES_MAX`].
pub fn check_key(key: &[u8]) -> Result<()> {
    if key.len() > KEY_BYTES_MAX {
        return Err(Error::KeyTooLarge { size: key.len(), limit: KEY_BYTES_MAX });
    }
    Ok(())
}

/// Checks a value against [`VALUE_BYTES_MAX`].
pub fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > VALUE_BYTES_MAX {
        return Err(Error::ValueTooLarge { size: value.len(), limit: VALUE_BYTES_MAX });
    }
    Ok(())
}

/// Checks a range's bounds: each a valid key, begin not after end.
pub fn check_range(begin: &[u8], end: &[u8]) -> Result<()> {
    // FoundationDB accepts range ends up to KEY_BYTES_MAX + 1 (e.g. `key\x00`).
    if begin.len() > KEY_BYTES_MAX + 1 {
        return Err(Error::KeyTooLarge { size: begin.len(), limit: KEY_BYTES_MAX });
    }
    if end.len() > KEY_BYTES_MAX + 1 {
        return Err(Error::KeyTooLarge { size: end.len(), limit: KEY_BYTES_MAX });
    }
    if begin > end {
        return Err(Error::InvertedRange);
    }
    Ok(())
}

/// Checks a versionstamp offset: the 10-byte placeholder must lie inside `bytes`.
pub fn check_versionstamp_offset(bytes: &[u8], offset: usize) -> Result<()> {
    if offset.checked_add(VERSIONSTAMP_BYTES).is_none_or(|end| end > bytes.len()) {
        return Err(Error::InvalidOperation(format!(
            "versionstamp offset {offset} + {VERSIONSTAMP_BYTES} bytes exceeds the {}-byte buffer",
            bytes.len()
        )));
    }
    Ok(())
}

/// The key immediately after `key` in byte order (`key` + `\x00`).
pub fn key_after(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.extend_from_slice(key);
    k.push(0);
    k
}

/// The first key not starting with `prefix` (FoundationDB's `strinc`), or `None` when the
/// prefix is empty or all `\xff`.
pub fn strinc(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut p = prefix.to_vec();
    while let Some(last) = p.last_mut() {
        if *last == 0xff {
            p.pop();
        } else {
            *last += 1;
            return Some(p);
        }
    }
    None
}
/// Most transactions written by one engine commit (one fsync).
pub const GROUP_COMMIT_TRANSACTIONS_MAX: usize = 8_192;

// The embedded backend.

/// `EmbeddedOptions::verify_after_crash_bytes_max` by default.
pub const VERIFY_AFTER_CRASH_BYTES_MAX: u64 = 256 * 1024 * 1024;

// The postgres backend.

/// Most transactions one commit batch (one PostgreSQL transaction) carries.
pub const COMMIT_BATCH_TRANSACTIONS_MAX: usize = 1_024;
/// PostgreSQL's largest B-tree entry (a third of an 8 KiB page, after compression): the
/// `limit` reported when PostgreSQL refuses a key.
pub const PG_KEY_INDEX_BYTES_MAX: usize = 2_704;
/// Bytes the postgres backend's read cache holds at most, its own overhead counted; when over,
/// about half of its entries are evicted (ADR 0015).
pub const PG_READ_CACHE_BYTES_MAX: usize = 128 << 20;
/// Most keys one point-read statement of the postgres backend carries (the misses of the read
/// cache waiting at the time, see `postgres::reads`).
pub const PG_POINT_READ_BATCH_KEYS_MAX: usize = 1_000;
/// Point-read statements of one process in flight at once.
pub const PG_POINT_READS_IN_FLIGHT_MAX: usize = 4;
/// A value larger than this is never held by the read cache.
pub const PG_READ_CACHE_VALUE_BYTES_MAX: usize = 16 << 10;
/// Commit batches that may wait in the read cache for an earlier one before it gives up on
/// their order (and empties).
pub const PG_READ_CACHE_WAITING_MAX: usize = 256;
/// Most commit batches remembered for read versions (see `AckLog`).
pub const ACK_LOG_BATCHES_MAX: usize = 4_096;
/// Longest notification payload sent (PostgreSQL's limit is 8,000 bytes).
pub const PAYLOAD_BYTES_MAX: usize = 7_000;
/// Longest pause between two attempts to reconnect the listening connection.
pub const RECONNECT_DELAY_MAX: std::time::Duration = std::time::Duration::from_secs(1);
/// Stored rows a limited range read fetches per round trip at least when the transaction's
/// own cleared ranges may hide some of them.
pub const RANGE_PAGE_ROWS_HIDDEN_MIN: usize = 256;
