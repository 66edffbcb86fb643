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

/// What a batch leaves for one key, before it touches the store.
#[derive(Debug, Clone)]
enum Final {
    /// The key's value afterwards (`None`: cleared).
    Value(Option<Bytes>),
    /// Atomic adds on the stored value, in order.
    Adds(Vec<Bytes>),
}

/// Applies the mutations of many transactions, in commit order, as **one write per distinct
/// key, in key order**: the batch is first folded in memory (later writes win, adds merge,
/// cleared ranges drop earlier writes), then the cleared ranges and the final values go to the
/// store. Same result as [`apply`] on each transaction in turn, with fewer and more local store
/// writes (a counter bumped by a hundred transactions costs one read-modify-write).
pub(crate) fn apply_batch(
    target: &mut dyn ApplyTarget,
    batch: &[(&[Mutation], Versionstamp)],
    collect: bool,
) -> Result<Vec<Change>> {
    let mut fold = Fold::default();
    for (mutations, stamp) in batch {
        for m in *mutations {
            fold.add(m, stamp);
        }
    }
    let mut changes = Vec::new();
    for (b, e) in &fold.cleared {
        target.clear_range(b, e)?;
        if collect {
            changes.push(Change::Range(b.clone(), e.clone()));
        }
    }
    for (k, f) in fold.finals {
        let v = match f {
            Final::Value(v) => v,
            Final::Adds(ps) => {
                let mut v = target.get(&k)?;
                for p in &ps {
                    v = Some(atomic_add(v.as_deref(), p));
                }
                v
            }
        };
        target.put(&k, v.clone())?;
        if collect {
            changes.push(Change::Key(k, v));
        }
    }
    Ok(changes)
}

/// A batch's mutations folded in memory: the final value (or adds) per key, and the ranges it
/// cleared.
#[derive(Default)]
struct Fold {
    finals: std::collections::BTreeMap<Vec<u8>, Final>,
    cleared: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Fold {
    fn in_cleared(&self, k: &[u8]) -> bool {
        self.cleared.iter().any(|(b, e)| b.as_slice() <= k && k < e.as_slice())
    }

    /// One more mutation, after every earlier one.
    fn add(&mut self, m: &Mutation, stamp: &Versionstamp) {
        match m {
            Mutation::Set(k, v) => {
                self.finals.insert(k.clone(), Final::Value(Some(v.clone())));
            }
            Mutation::Clear(k) => {
                self.finals.insert(k.clone(), Final::Value(None));
            }
            Mutation::ClearRange(b, e) => {
                let bounds = (
                    std::ops::Bound::Included(b.as_slice()),
                    std::ops::Bound::Excluded(e.as_slice()),
                );
                let inside: Vec<Vec<u8>> =
                    self.finals.range::<[u8], _>(bounds).map(|(k, _)| k.clone()).collect();
                for k in inside {
                    self.finals.remove(&k);
                }
                self.cleared.push((b.clone(), e.clone()));
            }
            Mutation::Add(k, p) => {
                let next = match self.finals.remove(k) {
                    Some(Final::Value(v)) => Final::Value(Some(atomic_add(v.as_deref(), p))),
                    Some(Final::Adds(mut ps)) => {
                        ps.push(p.clone());
                        Final::Adds(ps)
                    }
                    // The stored value was cleared by this batch: add to nothing.
                    None if self.in_cleared(k) => Final::Value(Some(atomic_add(None, p))),
                    None => Final::Adds(vec![p.clone()]),
                };
                self.finals.insert(k.clone(), next);
            }
            Mutation::VersionstampedKey { key, offset, value } => {
                self.finals.insert(stamped(key, *offset, stamp), Final::Value(Some(value.clone())));
            }
            Mutation::VersionstampedValue { key, value, offset } => {
                let v = Bytes::from(stamped(value, *offset, stamp));
                self.finals.insert(key.clone(), Final::Value(Some(v)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A store for comparing batch and one-by-one application.
    #[derive(Default, Clone, PartialEq, Debug)]
    struct Map(BTreeMap<Vec<u8>, Bytes>, usize);

    impl ApplyTarget for Map {
        fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>> {
            Ok(self.0.get(key).cloned())
        }
        fn put(&mut self, key: &[u8], value: Option<Bytes>) -> Result<()> {
            self.1 += 1;
            match value {
                Some(v) => self.0.insert(key.to_vec(), v),
                None => self.0.remove(key),
            };
            Ok(())
        }
        fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> Result<()> {
            self.0.retain(|k, _| !(begin <= k.as_slice() && k.as_slice() < end));
            Ok(())
        }
    }

    #[test]
    fn a_folded_batch_equals_applying_each_transaction_in_turn() {
        let rng = crate::env::Rng::seeded(9);
        for round in 0..300 {
            let mut base = Map::default();
            for i in 0..6u8 {
                base.0.insert(vec![b'k', i], Bytes::from(vec![i; 8]));
            }
            let key = |r: &crate::env::Rng| vec![b'k', r.below(8) as u8];
            let txns: Vec<Vec<Mutation>> = (0..1 + rng.below(6))
                .map(|_| {
                    (0..1 + rng.below(5))
                        .map(|_| match rng.below(5) {
                            0 => Mutation::Set(key(&rng), Bytes::from(vec![rng.below(200) as u8])),
                            1 => Mutation::Clear(key(&rng)),
                            2 => {
                                let (a, b) = (key(&rng), key(&rng));
                                Mutation::ClearRange(a.clone().min(b.clone()), a.max(b))
                            }
                            _ => Mutation::Add(
                                key(&rng),
                                Bytes::copy_from_slice(&3u64.to_le_bytes()),
                            ),
                        })
                        .collect()
                })
                .collect();
            let stamps: Vec<Versionstamp> =
                (0..txns.len()).map(|i| Versionstamp::new(i as u64, 0)).collect();
            let mut one_by_one = base.clone();
            for (t, s) in txns.iter().zip(&stamps) {
                apply(&mut one_by_one, t, s, false).unwrap();
            }
            let mut folded = base.clone();
            let batch: Vec<(&[Mutation], Versionstamp)> =
                txns.iter().zip(&stamps).map(|(t, s)| (t.as_slice(), *s)).collect();
            apply_batch(&mut folded, &batch, false).unwrap();
            assert_eq!(folded.0, one_by_one.0, "round {round}: {txns:?}");
            assert!(folded.1 <= one_by_one.1, "never more store writes");
        }
    }

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
