//! The per-schedule policies, their names (as the API spells them) and defaults.

use super::zone::{FoldPolicy, GapPolicy};
use crate::limits::{CRON_CATCH_UP_WINDOW_MAX_MS, CRON_JITTER_MAX_MS};

/// Occurrences that passed without being materialized (node down, paused, lookahead lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissedPolicy {
    /// None of them runs.
    Skip,
    /// The most recent one within the catch-up window runs, once.
    #[default]
    Latest,
    /// Each one within the catch-up window runs.
    All,
}

/// An occurrence comes while the previous occurrence's execution has not finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverlapPolicy {
    /// It runs anyway, alongside.
    Allow,
    /// It is skipped.
    #[default]
    Skip,
    /// It runs when the previous one ends; at most one waits (later ones are skipped).
    BufferOne,
    /// Each runs in turn when the previous one ends (at most `CRON_BUFFER_MAX` wait).
    BufferAll,
    /// The previous one is cancelled (asked to stop if it runs) and this one runs.
    CancelPrevious,
}

impl MissedPolicy {
    /// Every policy, with its name.
    pub const ALL: [(MissedPolicy, &'static str); 3] = [
        (MissedPolicy::Skip, "skip"),
        (MissedPolicy::Latest, "latest"),
        (MissedPolicy::All, "all"),
    ];
}

impl OverlapPolicy {
    /// Every policy, with its name.
    pub const ALL: [(OverlapPolicy, &'static str); 5] = [
        (OverlapPolicy::Allow, "allow"),
        (OverlapPolicy::Skip, "skip"),
        (OverlapPolicy::BufferOne, "buffer-one"),
        (OverlapPolicy::BufferAll, "buffer-all"),
        (OverlapPolicy::CancelPrevious, "cancel-previous"),
    ];
}

/// The name of a policy value.
pub fn name_of<T: PartialEq + Copy>(all: &[(T, &'static str)], v: T) -> &'static str {
    all.iter().find(|(p, _)| *p == v).map_or("?", |(_, n)| n)
}

/// Parses a policy name; an empty name is the default. The error names the choices.
pub fn parse_named<T: Copy + Default>(all: &[(T, &'static str)], s: &str) -> Result<T, String> {
    if s.is_empty() {
        return Ok(T::default());
    }
    all.iter().find(|(_, n)| *n == s).map(|(p, _)| *p).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|(_, n)| *n).collect();
        format!("{s:?} is not one of {}", names.join(", "))
    })
}

/// Every policy of one schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policies {
    /// A matching local time that does not exist.
    pub gap: GapPolicy,
    /// A matching local time that occurs twice.
    pub fold: FoldPolicy,
    /// Missed occurrences.
    pub missed: MissedPolicy,
    /// How far back missed occurrences are still made up.
    pub catch_up_window_ms: i64,
    /// An occurrence while the previous one's execution has not finished.
    pub overlap: OverlapPolicy,
    /// Pause the schedule when an occurrence's execution ends FAILED.
    pub pause_on_failure: bool,
    /// Bound of the deterministic per-schedule delay added to every occurrence.
    pub jitter_ms: i64,
}

/// The catch-up window when none is given: one day.
pub const CATCH_UP_WINDOW_DEFAULT_MS: i64 = 24 * 3_600_000;

impl Default for Policies {
    fn default() -> Self {
        Policies {
            gap: GapPolicy::default(),
            fold: FoldPolicy::default(),
            missed: MissedPolicy::default(),
            catch_up_window_ms: CATCH_UP_WINDOW_DEFAULT_MS,
            overlap: OverlapPolicy::default(),
            pause_on_failure: false,
            jitter_ms: 0,
        }
    }
}

impl Policies {
    /// Checks the numeric bounds; the error is `(field, reason)` with API field names.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if !(0..=CRON_CATCH_UP_WINDOW_MAX_MS).contains(&self.catch_up_window_ms) {
            return Err((
                "catchUpWindowMs",
                format!("must be between 0 and {CRON_CATCH_UP_WINDOW_MAX_MS} (7 days)"),
            ));
        }
        if !(0..=CRON_JITTER_MAX_MS).contains(&self.jitter_ms) {
            return Err((
                "jitterMs",
                format!("must be between 0 and {CRON_JITTER_MAX_MS} (1 hour)"),
            ));
        }
        Ok(())
    }
}

/// The schedule's deterministic delay within `[0, jitter_ms]`: the same for every occurrence
/// of one schedule (so its period is kept), different between schedules (so schedules due at
/// the top of the minute spread out).
pub fn jitter_offset_ms(cron_job_id: &str, jitter_ms: i64) -> i64 {
    if jitter_ms <= 0 {
        return 0;
    }
    let h = crate::ids::fnv1a64(cron_job_id.as_bytes());
    (h % (jitter_ms as u64 + 1)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_errors_list_the_choices() {
        assert_eq!(parse_named(&OverlapPolicy::ALL, "buffer-one"), Ok(OverlapPolicy::BufferOne));
        assert_eq!(parse_named(&OverlapPolicy::ALL, ""), Ok(OverlapPolicy::Skip));
        assert_eq!(parse_named(&MissedPolicy::ALL, ""), Ok(MissedPolicy::Latest));
        assert_eq!(parse_named(&GapPolicy::ALL, ""), Ok(GapPolicy::ShiftToGapEnd));
        assert_eq!(parse_named(&FoldPolicy::ALL, ""), Ok(FoldPolicy::First));
        let e = parse_named(&MissedPolicy::ALL, "most").unwrap_err();
        assert!(e.contains("skip, latest, all"), "{e}");
        for (p, n) in OverlapPolicy::ALL {
            assert_eq!(name_of(&OverlapPolicy::ALL, p), n);
        }
    }

    #[test]
    fn jitter_is_stable_bounded_and_spread() {
        assert_eq!(jitter_offset_ms("a", 0), 0);
        assert_eq!(jitter_offset_ms("job-1", 60_000), jitter_offset_ms("job-1", 60_000));
        let offsets: std::collections::BTreeSet<i64> =
            (0..50).map(|i| jitter_offset_ms(&format!("job-{i}"), 60_000)).collect();
        assert!(offsets.iter().all(|o| (0..=60_000).contains(o)));
        assert!(offsets.len() > 40, "schedules spread: {offsets:?}");
        let bad = Policies { jitter_ms: CRON_JITTER_MAX_MS + 1, ..Policies::default() };
        assert_eq!(bad.check().unwrap_err().0, "jitterMs");
        let bad = Policies { catch_up_window_ms: -1, ..Policies::default() };
        assert_eq!(bad.check().unwrap_err().0, "catchUpWindowMs");
    }
}
