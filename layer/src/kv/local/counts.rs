//! Counts of the writes a store committed, by kind and bytes: what the write budget of a
//! lifecycle is measured with (`layer/tests/write_budget.rs`, docs/benchmarks.md).

use std::sync::atomic::{AtomicU64, Ordering};

use super::mutation::Mutation;

/// Writes committed so far, by kind: a snapshot of a store's counters. Subtract two to get
/// what happened in between.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteCounts {
    /// Transactions committed with at least one mutation.
    pub transactions: u64,
    /// Keys set (including versionstamped ones).
    pub sets: u64,
    /// Keys cleared one by one.
    pub clears: u64,
    /// Ranges cleared.
    pub clear_ranges: u64,
    /// Atomic adds.
    pub adds: u64,
    /// Key + value bytes of the sets.
    pub set_bytes: u64,
    /// Key bytes of the clears (the tombstones an LSM would write).
    pub clear_bytes: u64,
    /// Key + parameter bytes of the adds.
    pub add_bytes: u64,
}

impl WriteCounts {
    /// Point writes: sets, clears and adds (not range clears).
    pub fn point_writes(&self) -> u64 {
        self.sets + self.clears + self.adds
    }
}

impl std::ops::Sub for WriteCounts {
    type Output = WriteCounts;
    fn sub(self, o: WriteCounts) -> WriteCounts {
        WriteCounts {
            transactions: self.transactions - o.transactions,
            sets: self.sets - o.sets,
            clears: self.clears - o.clears,
            clear_ranges: self.clear_ranges - o.clear_ranges,
            adds: self.adds - o.adds,
            set_bytes: self.set_bytes - o.set_bytes,
            clear_bytes: self.clear_bytes - o.clear_bytes,
            add_bytes: self.add_bytes - o.add_bytes,
        }
    }
}

/// A store's live counters, bumped once per committed transaction.
#[derive(Debug, Default)]
pub(crate) struct WriteCounter {
    fields: [AtomicU64; 8],
}

impl WriteCounter {
    /// Counts the mutations of one committed transaction.
    pub(crate) fn committed(&self, mutations: &[Mutation]) {
        let mut c = WriteCounts { transactions: 1, ..WriteCounts::default() };
        for m in mutations {
            match m {
                Mutation::Set(k, v)
                | Mutation::VersionstampedKey { key: k, value: v, .. }
                | Mutation::VersionstampedValue { key: k, value: v, .. } => {
                    c.sets += 1;
                    c.set_bytes += (k.len() + v.len()) as u64;
                }
                Mutation::Clear(k) => {
                    c.clears += 1;
                    c.clear_bytes += k.len() as u64;
                }
                Mutation::ClearRange(..) => c.clear_ranges += 1,
                Mutation::Add(k, p) => {
                    c.adds += 1;
                    c.add_bytes += (k.len() + p.len()) as u64;
                }
            }
        }
        let values = [
            c.transactions,
            c.sets,
            c.clears,
            c.clear_ranges,
            c.adds,
            c.set_bytes,
            c.clear_bytes,
            c.add_bytes,
        ];
        for (f, v) in self.fields.iter().zip(values) {
            f.fetch_add(v, Ordering::Relaxed);
        }
    }

    /// The counts so far.
    pub(crate) fn snapshot(&self) -> WriteCounts {
        let v: Vec<u64> = self.fields.iter().map(|f| f.load(Ordering::Relaxed)).collect();
        WriteCounts {
            transactions: v[0],
            sets: v[1],
            clears: v[2],
            clear_ranges: v[3],
            adds: v[4],
            set_bytes: v[5],
            clear_bytes: v[6],
            add_bytes: v[7],
        }
    }
}
