//! Identifiers and stable hashes: execution ids, shard assignment, request fingerprints.
//!
//! All stable across versions and platforms (shard assignment and fingerprints are stored).

use crate::env::{Rng, Timestamp};

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A new execution id: 26 characters of Crockford base32 encoding 48 bits of milliseconds
/// followed by 80 random bits (the ULID layout). Ids sort by creation time, so records of
/// recent executions sit together in the B-tree (see docs/decisions/0001).
pub fn new_execution_id(now: Timestamp, rng: &Rng) -> String {
    let millis = u128::from(now.as_millis().clamp(0, (1 << 48) - 1) as u64);
    let random = (u128::from(rng.next_u64()) << 16) | u128::from(rng.next_u64() & 0xffff);
    let value = (millis << 80) | random;
    let mut out = [0u8; 26];
    for (i, c) in out.iter_mut().enumerate() {
        let shift = 125 - 5 * i as i32;
        let bits = if shift >= 0 { (value >> shift) & 0x1f } else { (value << -shift) & 0x1f };
        *c = CROCKFORD[bits as usize];
    }
    String::from_utf8(out.to_vec()).expect("ascii")
}

/// 64-bit FNV-1a: small, stable forever, good enough spread for shard assignment.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The logical shard of an execution: `hash(execution_id) mod shard_count`.
pub fn shard_of(execution_id: &str, shard_count: u32) -> u32 {
    assert!(shard_count > 0, "shard_count must be positive");
    (fnv1a64(execution_id.as_bytes()) % u64::from(shard_count)) as u32
}

/// The time bucket of `fire_at_ms`: `floor(fire_at / width)`.
pub fn bucket_of(fire_at_ms: i64, bucket_width_ms: i64) -> i64 {
    assert!(bucket_width_ms > 0, "bucket width must be positive");
    fire_at_ms.div_euclid(bucket_width_ms)
}

/// A 128-bit fingerprint of a request (two independent FNV-1a passes), used to tell an
/// identical retry from a different request under the same idempotency key.
pub fn fingerprint(parts: &[&[u8]]) -> Vec<u8> {
    let mut a: Vec<u8> = Vec::new();
    for p in parts {
        a.extend_from_slice(&(p.len() as u64).to_be_bytes());
        a.extend_from_slice(p);
    }
    let h1 = fnv1a64(&a);
    a.push(0x5a);
    let h2 = fnv1a64(&a).rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15;
    let mut out = h1.to_be_bytes().to_vec();
    out.extend_from_slice(&h2.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_by_time_and_are_unique() {
        let rng = Rng::seeded(3);
        let a = new_execution_id(Timestamp::from_millis(1_000), &rng);
        let b = new_execution_id(Timestamp::from_millis(1_001), &rng);
        let c = new_execution_id(Timestamp::from_millis(1_001), &rng);
        assert_eq!(a.len(), 26);
        assert!(a < b && b != c);
        assert!(a.bytes().all(|ch| CROCKFORD.contains(&ch)));
    }

    #[test]
    fn shards_spread_and_stay_stable() {
        assert_eq!(shard_of("01HZX3", 1024), shard_of("01HZX3", 1024));
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c, "FNV-1a reference value");
        let rng = Rng::seeded(5);
        let mut counts = [0u32; 16];
        for i in 0..16_000 {
            let id = new_execution_id(Timestamp::from_millis(i), &rng);
            counts[shard_of(&id, 16) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "uneven: {counts:?}");
    }

    #[test]
    fn buckets_floor_negative_times_too() {
        assert_eq!(bucket_of(59_999, 60_000), 0);
        assert_eq!(bucket_of(60_000, 60_000), 1);
        assert_eq!(bucket_of(-1, 60_000), -1);
    }

    #[test]
    fn fingerprints_separate_parts() {
        assert_ne!(fingerprint(&[b"ab", b"c"]), fingerprint(&[b"a", b"bc"]));
        assert_eq!(fingerprint(&[b"x"]), fingerprint(&[b"x"]));
        assert_eq!(fingerprint(&[b"x"]).len(), 16);
    }
}
