//! Buffered mutations and how a commit applies them to a store.

use bytes::Bytes;

use super::resolver::KeyRange;
use crate::kv::Versionstamp;
use crate::kv::error::Result;
use crate::kv::limits::{VERSIONSTAMP_BYTES, key_after};

/// One buffered mutation, applied in order at commit.
#[derive(Debug, Clone)]
pub(crate) enum Mutation {
    Set(Vec<u8>, Bytes),
    Clear(Vec<u8>),
    ClearRange(Vec<u8>, Vec<u8>),
    Add(Vec<u8>, Bytes),
    VersionstampedKey { key: Vec<u8>, offset: usize, value: Bytes },
    VersionstampedValue { key: Vec<u8>, value: Bytes, offset: usize },
}

/// A change a commit made, reported to watches.
#[derive(Debug, Clone)]
pub(crate) enum Change {
    Key(Vec<u8>, Option<Bytes>),
    Range(Vec<u8>, Vec<u8>),
}

/// Where a commit writes: the memory MVCC map at the commit version, or a redb write
/// transaction.
pub(crate) trait ApplyTarget {
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>>;
    fn put(&mut self, key: &[u8], value: Option<Bytes>) -> Result<()>;
    fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> Result<()>;
}

/// FoundationDB's `ADD`: little-endian addition, the result as long as `param`; a missing or
/// shorter value counts as zero-extended, a longer one is truncated.
pub(crate) fn atomic_add(existing: Option<&[u8]>, param: &[u8]) -> Bytes {
    let existing = existing.unwrap_or(&[]);
    let mut out = Vec::with_capacity(param.len());
    let mut carry = 0u16;
    for (i, p) in param.iter().enumerate() {
        let e = existing.get(i).copied().unwrap_or(0);
        let sum = u16::from(e) + u16::from(*p) + carry;
        out.push((sum & 0xff) as u8);
        carry = sum >> 8;
    }
    Bytes::from(out)
}

fn stamped(bytes: &[u8], offset: usize, stamp: &Versionstamp) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out[offset..offset + VERSIONSTAMP_BYTES].copy_from_slice(&stamp.0);
    out
}

/// The write conflict ranges of `mutations` once the versionstamp is known: versionstamped
/// keys conflict on their final key, so range readers of their prefix see them.
pub(crate) fn stamped_write_ranges(mutations: &[Mutation], stamp: &Versionstamp) -> Vec<KeyRange> {
    mutations
        .iter()
        .filter_map(|m| match m {
            Mutation::VersionstampedKey { key, offset, .. } => {
                let k = stamped(key, *offset, stamp);
                let e = key_after(&k);
                Some((k, e))
            }
            _ => None,
        })
        .collect()
}

/// Applies `mutations` in order; returns the changes when `collect` (for watches).
pub(crate) fn apply(
    target: &mut dyn ApplyTarget,
    mutations: &[Mutation],
    stamp: &Versionstamp,
    collect: bool,
) -> Result<Vec<Change>> {
    let mut changes = Vec::new();
    let mut record = |c: Change| {
        if collect {
            changes.push(c);
        }
    };
    for m in mutations {
        match m {
            Mutation::Set(k, v) => {
                target.put(k, Some(v.clone()))?;
                record(Change::Key(k.clone(), Some(v.clone())));
            }
            Mutation::Clear(k) => {
                target.put(k, None)?;
                record(Change::Key(k.clone(), None));
            }
            Mutation::ClearRange(b, e) => {
                target.clear_range(b, e)?;
                record(Change::Range(b.clone(), e.clone()));
            }
            Mutation::Add(k, p) => {
                let old = target.get(k)?;
                let new = atomic_add(old.as_deref(), p);
                target.put(k, Some(new.clone()))?;
                record(Change::Key(k.clone(), Some(new)));
            }
            Mutation::VersionstampedKey { key, offset, value } => {
                let k = stamped(key, *offset, stamp);
                target.put(&k, Some(value.clone()))?;
                record(Change::Key(k, Some(value.clone())));
            }
            Mutation::VersionstampedValue { key, value, offset } => {
                let v = Bytes::from(stamped(value, *offset, stamp));
                target.put(key, Some(v.clone()))?;
                record(Change::Key(key.clone(), Some(v)));
            }
        }
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_add_follows_fdb() {
        assert_eq!(&atomic_add(None, &5i64.to_le_bytes())[..], &5i64.to_le_bytes());
        let v = atomic_add(Some(&250u64.to_le_bytes()), &10u64.to_le_bytes());
        assert_eq!(&v[..], &260u64.to_le_bytes(), "carry crosses bytes");
        let v = atomic_add(Some(&5i64.to_le_bytes()), &(-7i64).to_le_bytes());
        assert_eq!(&v[..], &(-2i64).to_le_bytes(), "two's complement wraps");
        assert_eq!(&atomic_add(Some(&[1, 2, 3]), &[1])[..], &[2], "truncated to param length");
        assert_eq!(&atomic_add(Some(&[0xff]), &[1, 0])[..], &[0, 1], "extended to param length");
    }
}
