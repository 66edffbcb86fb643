//! List cursors: opaque and tamper-evident. A cursor is the position (a key of the range
//! being listed) sealed with a MAC over the query's range and the position, keyed by the
//! cluster's `cursor_secret`: a client can pass it back, not alter it or use it for another
//! query.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::error::{Result, invalid};
use crate::kv::RangeOption;

/// The cursor format this node writes.
const VERSION: u8 = 1;
/// Bytes of the MAC kept (128 bits).
const MAC_BYTES: usize = 16;

fn mac(secret: &[u8], range: &RangeOption, position: &[u8]) -> [u8; MAC_BYTES] {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    for part in [&range.begin[..], &range.end[..], position] {
        m.update(&(part.len() as u64).to_be_bytes());
        m.update(part);
    }
    let full = m.finalize().into_bytes();
    let mut out = [0u8; MAC_BYTES];
    out.copy_from_slice(&full[..MAC_BYTES]);
    out
}

/// The cursor of `position` in a listing of `range`.
pub fn seal(secret: &[u8], range: &RangeOption, position: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + position.len() + MAC_BYTES);
    out.push(VERSION);
    out.extend_from_slice(position);
    out.extend_from_slice(&mac(secret, range, position));
    out
}

/// The position a cursor of a listing of `range` stands for; refused if it was altered or
/// issued for another query.
pub fn open(secret: &[u8], range: &RangeOption, cursor: &[u8]) -> Result<Vec<u8>> {
    let refused = || invalid("cursor", "was not issued for this query (or was altered)");
    if cursor.len() < 1 + MAC_BYTES || cursor[0] != VERSION {
        return Err(refused());
    }
    let (position, tag) = cursor[1..].split_at(cursor.len() - 1 - MAC_BYTES);
    let want = mac(secret, range, position);
    // Constant time: no byte-by-byte oracle.
    let diff = want.iter().zip(tag).fold(0u8, |d, (a, b)| d | (a ^ b));
    if diff != 0 || position < &range.begin[..] || position > &range.end[..] {
        return Err(refused());
    }
    Ok(position.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_opens_only_unaltered_for_its_own_query() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let range = RangeOption::new(b"a".to_vec(), b"m".to_vec());
        let c = seal(secret, &range, b"f-17");
        assert_eq!(open(secret, &range, &c).unwrap(), b"f-17");
        for i in 0..c.len() {
            let mut bad = c.clone();
            bad[i] ^= 0x01;
            assert!(open(secret, &range, &bad).is_err(), "byte {i} altered");
        }
        let other = RangeOption::new(b"a".to_vec(), b"n".to_vec());
        assert!(open(secret, &other, &c).is_err(), "another query's cursor");
        assert!(open(b"another secret", &range, &c).is_err(), "another cluster's cursor");
        assert!(open(secret, &range, b"").is_err());
        assert!(open(secret, &range, &c[..c.len() - 1]).is_err());
    }
}
