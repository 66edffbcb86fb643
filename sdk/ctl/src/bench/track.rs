//! What was submitted (id → `execute_at`) and what the workers started (id, attempt, wall-clock
//! start): the source of lateness, duplicates, missing and early starts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::stats::Summary;

/// One handler start, as a worker reported it.
#[derive(Debug, Clone, Copy)]
pub struct Start {
    pub attempt: u32,
    /// Wall clock, microseconds since the epoch.
    pub at_us: i64,
}

#[derive(Debug)]
struct Entry {
    execute_at_ms: i64,
    starts: Vec<Start>,
}

/// Submissions of the current phase and the starts seen for them.
#[derive(Debug, Default)]
pub struct Tracker {
    expected: HashMap<String, Entry>,
    /// Starts of ids not (yet) known to this phase: a start can be read before its
    /// submission's acknowledgement, and leftovers of earlier runs may be delivered.
    unknown: HashMap<String, Vec<Start>>,
    started: usize,
}

/// The tracker, shared by submitters and the worker pipes' readers.
#[derive(Clone, Default)]
pub struct Shared(Arc<Mutex<Tracker>>);

impl Shared {
    /// Locks it (a poisoned lock is still usable: the data is plain counters).
    pub fn lock(&self) -> MutexGuard<'_, Tracker> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a new phase; returns the previous one's tracker.
    pub fn reset(&self) -> Tracker {
        std::mem::take(&mut *self.lock())
    }
}

/// Duplicate starts of one phase.
#[derive(Debug, Default, Clone, Copy)]
pub struct Duplicates {
    /// Executions started more than once.
    pub total: usize,
    /// … with an attempt after the first (the node retried: a lease expired, a crash).
    pub retried: usize,
    /// … with the same attempt started twice (the same attempt delivered again).
    pub redelivered: usize,
    /// Handler starts beyond the first, over all executions.
    pub extra_starts: usize,
}

/// What a phase came to.
#[derive(Debug, Default)]
pub struct Outcome {
    pub submitted: usize,
    pub started: usize,
    /// Submitted and acknowledged, never started.
    pub missing: Vec<String>,
    /// Executions with a start before their `execute_at`.
    pub early: usize,
    /// A few of them: (id, execute_at ms, start µs).
    pub early_examples: Vec<(String, i64, i64)>,
    pub duplicates: Duplicates,
    /// First start − `execute_at`, ms.
    pub lateness: Summary,
    /// Earliest and latest first start, µs.
    pub first_start_us: Option<i64>,
    pub last_start_us: Option<i64>,
    /// Starts of executions this phase did not submit.
    pub foreign: usize,
    /// Executions whose first recorded start has an attempt after 1.
    pub first_seen_retry: usize,
}

impl Tracker {
    /// An acknowledged submission.
    pub fn expect(&mut self, id: String, execute_at_ms: i64) {
        let moved = self.unknown.remove(&id).unwrap_or_default();
        // The same execution acknowledged twice (an idempotent retry) keeps one entry.
        let e =
            self.expected.entry(id).or_insert_with(|| Entry { execute_at_ms, starts: Vec::new() });
        let was_started = !e.starts.is_empty();
        e.starts.extend(moved);
        if !was_started && !e.starts.is_empty() {
            self.started += 1;
        }
    }

    /// A handler start read from a worker.
    pub fn start(&mut self, id: &str, attempt: u32, at_us: i64) {
        let s = Start { attempt, at_us };
        match self.expected.get_mut(id) {
            Some(e) => {
                if e.starts.is_empty() {
                    self.started += 1;
                }
                e.starts.push(s);
            }
            None => self.unknown.entry(id.to_string()).or_default().push(s),
        }
    }

    /// Acknowledged submissions.
    pub fn expected(&self) -> usize {
        self.expected.len()
    }

    /// Of them, started at least once.
    pub fn started(&self) -> usize {
        self.started
    }

    /// The first start (µs) after `after_us`, over every start of this phase.
    pub fn first_start_after(&self, after_us: i64) -> Option<i64> {
        self.expected
            .values()
            .flat_map(|e| e.starts.iter())
            .chain(self.unknown.values().flatten())
            .map(|s| s.at_us)
            .filter(|&t| t > after_us)
            .min()
    }

    /// Lateness, duplicates, missing and early starts of this phase.
    pub fn analyze(&self) -> Outcome {
        let mut o = Outcome { submitted: self.expected.len(), ..Outcome::default() };
        let mut lateness = Vec::with_capacity(self.expected.len());
        for (id, e) in &self.expected {
            if e.starts.is_empty() {
                o.missing.push(id.clone());
                continue;
            }
            o.started += 1;
            let due_us = e.execute_at_ms * 1_000;
            let first = e.starts.iter().min_by_key(|s| s.at_us).copied().unwrap_or(e.starts[0]);
            lateness.push((first.at_us - due_us) as f64 / 1_000.0);
            o.first_start_us = Some(o.first_start_us.map_or(first.at_us, |v| v.min(first.at_us)));
            o.last_start_us = Some(o.last_start_us.map_or(first.at_us, |v| v.max(first.at_us)));
            if first.attempt > 1 {
                o.first_seen_retry += 1;
            }
            if let Some(s) = e.starts.iter().find(|s| s.at_us < due_us) {
                o.early += 1;
                if o.early_examples.len() < 10 {
                    o.early_examples.push((id.clone(), e.execute_at_ms, s.at_us));
                }
            }
            if e.starts.len() > 1 {
                o.duplicates.total += 1;
                o.duplicates.extra_starts += e.starts.len() - 1;
                let mut attempts: Vec<u32> = e.starts.iter().map(|s| s.attempt).collect();
                attempts.sort_unstable();
                let before = attempts.len();
                attempts.dedup();
                if attempts.len() < before {
                    o.duplicates.redelivered += 1;
                } else {
                    o.duplicates.retried += 1;
                }
            }
        }
        o.foreign = self.unknown.values().map(Vec::len).sum();
        o.missing.sort();
        o.lateness = Summary::of(lateness);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_before_acknowledgements_and_duplicates_are_counted() {
        let mut t = Tracker::default();
        t.start("a", 1, 10_500_000); // read before its acknowledgement
        t.expect("a".into(), 10_000);
        t.expect("b".into(), 10_000);
        t.expect("c".into(), 10_000);
        t.expect("d".into(), 10_000);
        assert_eq!((t.expected(), t.started()), (4, 1));
        t.start("b", 1, 10_001_000);
        t.start("b", 1, 10_002_000); // redelivered
        t.start("c", 1, 9_999_000); // early
        t.start("c", 2, 10_300_000); // retried
        t.start("zz", 1, 1); // foreign
        assert_eq!(t.started(), 3);
        let o = t.analyze();
        assert_eq!(o.missing, vec!["d".to_string()]);
        assert_eq!(o.early, 1);
        assert_eq!((o.duplicates.total, o.duplicates.redelivered, o.duplicates.retried), (2, 1, 1));
        assert_eq!(o.foreign, 1);
        assert_eq!(o.lateness.n, 3);
        assert_eq!(o.lateness.max, 500.0);
        assert_eq!(t.first_start_after(10_001_500), Some(10_002_000));
    }
}
