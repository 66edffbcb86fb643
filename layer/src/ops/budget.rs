//! The transaction budget of a batch ([`TRANSACTION_BUDGET_BYTES`]): a batch takes items while
//! its transaction stays within it and leaves the rest to the next transaction, so no batch —
//! whatever its items' inputs and outputs hold — meets `transaction_too_large`, and none is
//! retried whole forever. Any single item fits ([`crate::limits::ITEM_BYTES_MAX`]).

use kairos_proto::storage::v1::Execution;
use prost::Message;

use crate::kv::Transaction;
use crate::limits::{ITEM_OVERHEAD_BYTES, TRANSACTION_BUDGET_BYTES};

/// What writing `e` (and what goes with it: keys, indexes, a timer) costs at most, besides
/// what the change adds to the record. A record whose spec is kept apart writes its state only,
/// without its input (`records::save_execution`); one stored by an earlier format writes both.
pub(crate) fn execution_bytes(e: &Execution) -> usize {
    let spec_left = if e.spec_apart { e.input_json.len() } else { 0 };
    e.encoded_len() - spec_left + ITEM_OVERHEAD_BYTES
}

/// Whether `tx`, having taken `taken` items, has room for one more writing up to `bytes`: the
/// first item always has.
pub(crate) fn has_room(tx: &Transaction, taken: usize, bytes: usize) -> bool {
    taken == 0 || fits(tx.approximate_size(), bytes)
}

/// Whether `bytes` more on top of `used` stay within the budget.
pub(crate) fn fits(used: usize, bytes: usize) -> bool {
    used.saturating_add(bytes) <= TRANSACTION_BUDGET_BYTES
}
