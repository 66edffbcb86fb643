//! Occurrences in a time zone: an expression's matching wall-clock times resolved to instants
//! (IANA zones from `chrono-tz`), with the per-schedule DST policies.
//!
//! - **Gap** (a wall time that does not exist, e.g. 02:30 when clocks jump 02:00 → 03:00):
//!   `skip`; `shift-to-gap-end` runs at the instant the gap ends (03:00); `shift-by-gap` runs
//!   at the wall time moved by the gap's length (03:30).
//! - **Fold** (a wall time that occurs twice, e.g. 01:30 when clocks go back 02:00 → 01:00):
//!   `first` (the earlier instant), `second`, or `both`.
//!
//! Occurrences are instants (milliseconds since the epoch, whole seconds), strictly increasing:
//! two wall times resolved to the same instant (a gap shift landing on a real occurrence) are
//! one occurrence.

use chrono::{DateTime, LocalResult, NaiveDateTime, Offset, SecondsFormat, TimeZone, Utc};
use chrono_tz::Tz;

use super::expr::Expr;
use crate::limits::CRON_WALL_TIMES_PER_CALL_MAX;

const SECOND_MS: i64 = 1_000;
const HOUR_MS: i64 = 3_600 * SECOND_MS;
const DAY_MS: i64 = 24 * HOUR_MS;

/// What to do with a matching wall time that does not exist (clocks jumped over it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GapPolicy {
    /// No occurrence.
    Skip,
    /// At the instant the gap ends (02:30 in a 02:00 → 03:00 gap runs at 03:00).
    #[default]
    ShiftToGapEnd,
    /// At the wall time moved by the gap's length (02:30 → 03:30).
    ShiftByGap,
}

/// What to do with a matching wall time that occurs twice (clocks went back over it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FoldPolicy {
    /// The earlier instant only.
    #[default]
    First,
    /// The later instant only.
    Second,
    /// Both instants.
    Both,
}

impl GapPolicy {
    /// Every policy, with its name.
    pub const ALL: [(GapPolicy, &'static str); 3] = [
        (GapPolicy::Skip, "skip"),
        (GapPolicy::ShiftToGapEnd, "shift-to-gap-end"),
        (GapPolicy::ShiftByGap, "shift-by-gap"),
    ];
}

impl FoldPolicy {
    /// Every policy, with its name.
    pub const ALL: [(FoldPolicy, &'static str); 3] =
        [(FoldPolicy::First, "first"), (FoldPolicy::Second, "second"), (FoldPolicy::Both, "both")];
}

/// Parses an IANA zone name (`Europe/London`, `UTC`).
pub fn parse_zone(name: &str) -> Result<Tz, String> {
    if name.is_empty() {
        return Err("is required: an IANA time zone such as UTC or Europe/London".into());
    }
    name.parse::<Tz>()
        .map_err(|_| format!("{name:?} is not an IANA time zone (e.g. UTC, America/New_York)"))
}

/// An expression in a zone with its DST policies: the occurrences of a schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    expr: Expr,
    tz: Tz,
    gap: GapPolicy,
    fold: FoldPolicy,
}

fn naive_of(ms: i64) -> NaiveDateTime {
    DateTime::<Utc>::from_timestamp_millis(ms).map_or(NaiveDateTime::MIN, |t| t.naive_utc())
}

fn ms_of_naive(t: NaiveDateTime) -> i64 {
    t.and_utc().timestamp_millis()
}

impl Schedule {
    /// A schedule.
    pub fn new(expr: Expr, tz: Tz, gap: GapPolicy, fold: FoldPolicy) -> Self {
        Schedule { expr, tz, gap, fold }
    }

    /// The expression.
    pub fn expr(&self) -> &Expr {
        &self.expr
    }

    /// The zone.
    pub fn zone(&self) -> Tz {
        self.tz
    }

    /// The zone's UTC offset at an instant, in milliseconds.
    pub fn offset_ms(&self, at_ms: i64) -> i64 {
        let off = self.tz.offset_from_utc_datetime(&naive_of(at_ms)).fix();
        i64::from(off.local_minus_utc()) * SECOND_MS
    }

    /// The least and greatest offset over `[from_ms, to_ms]`, sampled every 12 hours and at
    /// both ends (zones do not change offset twice within 12 hours).
    fn offsets(&self, from_ms: i64, to_ms: i64) -> (i64, i64) {
        let mut lo = self.offset_ms(to_ms);
        let mut hi = lo;
        let mut at = from_ms;
        while at < to_ms {
            let o = self.offset_ms(at);
            lo = lo.min(o);
            hi = hi.max(o);
            at = at.saturating_add(12 * HOUR_MS);
        }
        (lo, hi)
    }

    /// The instant a gap containing the nonexistent wall time `w` ends, and the offset before
    /// it (both in milliseconds).
    fn gap_at(&self, w: NaiveDateTime) -> Option<(i64, i64)> {
        let center = ms_of_naive(w);
        let (mut lo, mut hi) = (center - DAY_MS, center + DAY_MS);
        let before = self.offset_ms(lo);
        if self.offset_ms(hi) == before {
            return None;
        }
        // First instant with another offset, to the second.
        while hi - lo > SECOND_MS {
            let mid = lo + (hi - lo) / 2 / SECOND_MS * SECOND_MS;
            let mid = if mid <= lo { lo + SECOND_MS } else { mid };
            if self.offset_ms(mid) == before { lo = mid } else { hi = mid }
        }
        Some((hi, before))
    }

    /// The instants a matching wall time stands for, under the DST policies (0, 1 or 2).
    fn resolve(&self, w: NaiveDateTime) -> Vec<i64> {
        match self.tz.from_local_datetime(&w) {
            LocalResult::Single(t) => vec![t.timestamp_millis()],
            LocalResult::Ambiguous(a, b) => {
                let (a, b) = (a.timestamp_millis(), b.timestamp_millis());
                let (first, second) = (a.min(b), a.max(b));
                match self.fold {
                    FoldPolicy::First => vec![first],
                    FoldPolicy::Second => vec![second],
                    FoldPolicy::Both => vec![first, second],
                }
            }
            LocalResult::None => match (self.gap, self.gap_at(w)) {
                (GapPolicy::Skip, _) | (_, None) => Vec::new(),
                (GapPolicy::ShiftToGapEnd, Some((end, _))) => vec![end],
                (GapPolicy::ShiftByGap, Some((_, before))) => vec![ms_of_naive(w) - before],
            },
        }
    }

    /// The first occurrence strictly after `after_ms`, if any within the expression's search
    /// horizon.
    ///
    /// Wall times are scanned in order from the earliest that could map to an instant after
    /// `after_ms` (`after + least offset` over the instants in question), each resolved under
    /// the policies; the scan stops once no later wall time can map below the best instant
    /// found (`wall - greatest offset > best`). Away from DST changes that is the first
    /// matching wall time; near one, the scan also covers the hour that repeats or was shifted.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let now_off = self.offset_ms(after_ms);
        let (mut lo, mut hi) = (now_off, now_off);
        if self.gap == GapPolicy::ShiftByGap {
            // A gap that ended shortly before `after_ms` may still have shifted wall times ahead.
            let before = self.offset_ms(after_ms - DAY_MS);
            if before < now_off
                && let Some((end, _)) = self.gap_at(naive_of(after_ms))
                && after_ms < end + (now_off - before)
            {
                lo = before;
            }
        }
        let start_of =
            |lo: i64| naive_of(after_ms + lo).with_nanosecond_zero() - chrono::Duration::seconds(1);
        let mut cursor = start_of(lo);
        let mut best: Option<i64> = None;
        for _ in 0..CRON_WALL_TIMES_PER_CALL_MAX {
            let Some(w) = self.expr.next_after(cursor) else { break };
            if let Some(b) = best
                && ms_of_naive(w) - hi > b
            {
                break;
            }
            let mut restart = false;
            for u in self.resolve(w) {
                if u > after_ms && best.is_none_or(|b| u < b) {
                    best = Some(u);
                    let (l, h) = self.offsets(after_ms, u);
                    hi = hi.max(h);
                    if l < lo {
                        lo = l;
                        restart = true;
                    }
                }
            }
            if restart {
                cursor = start_of(lo); // a DST change ahead: look again from earlier wall times
                continue;
            }
            if best.is_some() && lo == hi {
                break; // no DST change in between: the first match is the answer
            }
            cursor = w;
        }
        best
    }

    /// Occurrences in `(after_ms, until_ms]`, at most `max`.
    pub fn between(&self, after_ms: i64, until_ms: i64, max: usize) -> Vec<i64> {
        let mut out = Vec::new();
        let mut at = after_ms;
        while out.len() < max {
            match self.next_after(at) {
                Some(u) if u <= until_ms => {
                    out.push(u);
                    at = u;
                }
                _ => break,
            }
        }
        out
    }

    /// The local time of an instant in the schedule's zone.
    pub fn local(&self, at_ms: i64) -> DateTime<Tz> {
        self.tz.from_utc_datetime(&naive_of(at_ms))
    }

    /// An instant as RFC 3339 local time with its offset (`2026-03-08T03:00:00-04:00`).
    pub fn local_rfc3339(&self, at_ms: i64) -> String {
        self.local(at_ms).to_rfc3339_opts(SecondsFormat::Secs, false)
    }
}

/// An instant as RFC 3339 UTC (`2026-08-13T02:00:00Z`; milliseconds only when not whole).
pub fn utc_rfc3339(at_ms: i64) -> String {
    let t = DateTime::<Utc>::from_timestamp_millis(at_ms).unwrap_or_default();
    let format = if at_ms % SECOND_MS == 0 { SecondsFormat::Secs } else { SecondsFormat::Millis };
    t.to_rfc3339_opts(format, true)
}

trait NanoZero {
    fn with_nanosecond_zero(self) -> Self;
}

impl NanoZero for NaiveDateTime {
    fn with_nanosecond_zero(self) -> Self {
        chrono::Timelike::with_nanosecond(&self, 0).unwrap_or(self)
    }
}

#[cfg(test)]
#[path = "zone_tests.rs"]
mod tests;
