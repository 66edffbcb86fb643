//! Occurrences across DST changes, for every gap and fold policy, checked against an
//! independent computation: a minute-by-minute scan of UTC that asks the zone only for its
//! offset at each instant (never local → UTC, which the code under test uses), finds every
//! wall time that appears zero, one or two times, and applies the policy rules from their
//! definitions. Plus hand-written cases for the documented examples.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{Datelike, NaiveDate, Timelike};

use super::*;
use crate::cron::Expr;

const MINUTE_MS: i64 = 60_000;

fn ms(s: &str) -> i64 {
    DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis()
}

fn sched(expr: &str, zone: &str, gap: GapPolicy, fold: FoldPolicy) -> Schedule {
    Schedule::new(Expr::parse(expr).unwrap(), parse_zone(zone).unwrap(), gap, fold)
}

/// The independent computation over `[from, to]` (UTC ms) for wall times where `wanted`.
fn oracle(
    zone: &str,
    wanted: &dyn Fn(NaiveDateTime) -> bool,
    gap: GapPolicy,
    fold: FoldPolicy,
    from: i64,
    to: i64,
) -> BTreeSet<i64> {
    let tz: Tz = zone.parse().unwrap();
    let wall = |u: i64| {
        let off = tz.offset_from_utc_datetime(&naive_of(u)).fix().local_minus_utc();
        naive_of(u + i64::from(off) * 1_000)
    };
    // Every wall time of the scanned span, with the instants showing it.
    let (scan_from, scan_to) = (from - 2 * DAY_MS, to + 2 * DAY_MS);
    let mut seen: BTreeMap<NaiveDateTime, Vec<i64>> = BTreeMap::new();
    let mut u = scan_from;
    while u <= scan_to {
        seen.entry(wall(u)).or_default().push(u);
        u += MINUTE_MS;
    }
    let mut out = BTreeSet::new();
    let first = wall(from - DAY_MS);
    let last = wall(to + DAY_MS);
    let mut w = first.with_second(0).unwrap();
    while w <= last {
        if wanted(w) {
            match seen.get(&w).map(Vec::as_slice) {
                Some([one]) => {
                    out.insert(*one);
                }
                Some([a, b]) => {
                    match fold {
                        FoldPolicy::First => out.insert(*a),
                        FoldPolicy::Second => out.insert(*b),
                        FoldPolicy::Both => out.insert(*a) | out.insert(*b),
                    };
                }
                Some(other) => panic!("{w} seen {} times", other.len()),
                None => {
                    // Not shown by any instant: in a gap. The gap ends at the first instant
                    // whose wall time is past w; its length is the jump there.
                    let end = (scan_from..=scan_to)
                        .step_by(MINUTE_MS as usize)
                        .find(|u| wall(*u) > w)
                        .expect("gap end");
                    let jump = (wall(end) - wall(end - MINUTE_MS)).num_milliseconds() - MINUTE_MS;
                    match gap {
                        GapPolicy::Skip => {}
                        GapPolicy::ShiftToGapEnd => {
                            out.insert(end);
                        }
                        GapPolicy::ShiftByGap => {
                            let moved = w + chrono::Duration::milliseconds(jump);
                            let at = seen.get(&moved).expect("moved wall time exists");
                            out.insert(at[0]);
                        }
                    }
                }
            }
        }
        w += chrono::Duration::minutes(1);
    }
    out.into_iter().filter(|u| *u > from && *u <= to).collect()
}

/// Windows of three days around DST changes (and one quiet window) per zone.
const CASES: [(&str, [&str; 2]); 5] = [
    ("America/New_York", ["2026-03-07T00:00:00Z", "2026-10-31T00:00:00Z"]),
    ("Europe/London", ["2026-03-28T00:00:00Z", "2026-10-24T00:00:00Z"]),
    // A 30-minute shift: 02:00 → 02:30 in October, 02:00 → 01:30 in April.
    ("Australia/Lord_Howe", ["2026-04-03T00:00:00Z", "2026-10-02T00:00:00Z"]),
    // No DST.
    ("Asia/Kolkata", ["2026-03-07T00:00:00Z", "2026-10-31T00:00:00Z"]),
    // Offsets changed by law: +3 → +4 all year in March 2011, +4 → +3 in October 2014.
    ("Europe/Moscow", ["2011-03-25T00:00:00Z", "2014-10-24T00:00:00Z"]),
];

type Wanted = fn(NaiveDateTime) -> bool;

const EXPRESSIONS: [(&str, Wanted); 5] = [
    ("*/15 * * * *", |w| w.minute() % 15 == 0),
    ("30 2 * * *", |w| w.hour() == 2 && w.minute() == 30),
    ("30 1 * * *", |w| w.hour() == 1 && w.minute() == 30),
    ("45 1,2 * * *", |w| (w.hour() == 1 || w.hour() == 2) && w.minute() == 45),
    ("0 0 * * SUN", |w| {
        w.hour() == 0 && w.minute() == 0 && w.weekday().num_days_from_sunday() == 0
    }),
];

#[test]
fn dst_occurrences_match_an_independent_computation() {
    let mut compared = 0;
    for (zone, windows) in CASES {
        for start in windows {
            let from = ms(start);
            let to = from + 3 * DAY_MS;
            for (expr, wanted) in EXPRESSIONS {
                for (gap, _) in GapPolicy::ALL {
                    for (fold, _) in FoldPolicy::ALL {
                        let s = sched(expr, zone, gap, fold);
                        let got: Vec<i64> = s.between(from, to, 10_000);
                        let want: Vec<i64> =
                            oracle(zone, &wanted, gap, fold, from, to).into_iter().collect();
                        assert_eq!(
                            got.iter().map(|u| utc_rfc3339(*u)).collect::<Vec<_>>(),
                            want.iter().map(|u| utc_rfc3339(*u)).collect::<Vec<_>>(),
                            "{zone} {expr} gap {gap:?} fold {fold:?} from {start}"
                        );
                        assert!(got.windows(2).all(|w| w[0] < w[1]), "strictly increasing");
                        compared += got.len();
                    }
                }
            }
        }
    }
    assert!(compared > 10_000, "{compared}");
}

fn occ(expr: &str, zone: &str, gap: GapPolicy, fold: FoldPolicy, day: &str) -> Vec<String> {
    let s = sched(expr, zone, gap, fold);
    let from = ms(&format!("{day}T00:00:00Z")) - DAY_MS / 2;
    s.between(from, from + DAY_MS, 100).into_iter().map(utc_rfc3339).collect()
}

#[test]
fn documented_examples() {
    use FoldPolicy as F;
    use GapPolicy as G;
    let ny = "America/New_York";
    // 2026-03-08: 02:00 EST → 03:00 EDT; 02:30 does not exist.
    assert!(
        occ("30 2 * * *", ny, G::Skip, F::First, "2026-03-08")
            .iter()
            .all(|o| !o.starts_with("2026-03-08"))
    );
    assert!(
        occ("30 2 * * *", ny, G::ShiftToGapEnd, F::First, "2026-03-08")
            .contains(&"2026-03-08T07:00:00Z".to_string())
    );
    assert!(
        occ("30 2 * * *", ny, G::ShiftByGap, F::First, "2026-03-08")
            .contains(&"2026-03-08T07:30:00Z".to_string())
    );
    // 2026-11-01: 02:00 EDT → 01:00 EST; 01:30 happens twice.
    let fold = |f| occ("30 1 * * *", ny, G::ShiftToGapEnd, f, "2026-11-01");
    assert!(fold(F::First).contains(&"2026-11-01T05:30:00Z".to_string()));
    assert!(!fold(F::First).contains(&"2026-11-01T06:30:00Z".to_string()));
    assert!(fold(F::Second).contains(&"2026-11-01T06:30:00Z".to_string()));
    let both = fold(F::Both);
    assert!(
        both.contains(&"2026-11-01T05:30:00Z".to_string())
            && both.contains(&"2026-11-01T06:30:00Z".to_string())
    );
    // Lord Howe, 2026-10-04: 02:00 → 02:30 (+10:30 → +11); 02:15 shifts to 02:30 or 02:45.
    let lh = "Australia/Lord_Howe";
    assert!(
        occ("15 2 * * *", lh, G::ShiftToGapEnd, F::First, "2026-10-04")
            .contains(&"2026-10-03T15:30:00Z".to_string())
    );
    assert!(
        occ("15 2 * * *", lh, G::ShiftByGap, F::First, "2026-10-04")
            .contains(&"2026-10-03T15:45:00Z".to_string())
    );
    // Lord Howe, 2026-04-05: 02:00 → 01:30 (+11 → +10:30); 01:45 happens twice, 30 min apart.
    let both = occ("45 1 * * *", lh, G::ShiftToGapEnd, F::Both, "2026-04-05");
    assert!(
        both.contains(&"2026-04-04T14:45:00Z".to_string())
            && both.contains(&"2026-04-04T15:15:00Z".to_string()),
        "{both:?}"
    );
    // Kolkata: no DST, +05:30.
    assert_eq!(
        occ("30 2 * * *", "Asia/Kolkata", G::Skip, F::First, "2026-03-08"),
        ["2026-03-07T21:00:00Z"]
    );
    // London, 2026-10-25: 01:30 first is BST (00:30Z), second GMT (01:30Z).
    assert!(
        occ("30 1 * * *", "Europe/London", G::Skip, F::Second, "2026-10-25")
            .contains(&"2026-10-25T01:30:00Z".to_string())
    );
    // A shift that lands on a real occurrence is one occurrence.
    let s = sched("0,30 2,3 * * *", ny, G::ShiftByGap, F::First);
    let day = s.between(ms("2026-03-08T05:00:00Z"), ms("2026-03-08T09:00:00Z"), 10);
    assert_eq!(
        day.iter().map(|u| utc_rfc3339(*u)).collect::<Vec<_>>(),
        ["2026-03-08T07:00:00Z", "2026-03-08T07:30:00Z"]
    );
}

#[test]
fn local_times_and_zones() {
    let s = sched("0 3 * * *", "America/New_York", GapPolicy::Skip, FoldPolicy::First);
    assert_eq!(s.local_rfc3339(ms("2026-03-08T07:00:00Z")), "2026-03-08T03:00:00-04:00");
    let l = sched("0 3 * * *", "Europe/London", GapPolicy::Skip, FoldPolicy::First);
    assert_eq!(l.local_rfc3339(ms("2026-01-08T03:00:00Z")), "2026-01-08T03:00:00+00:00");
    assert!(parse_zone("Mars/Olympus").unwrap_err().contains("IANA"));
    assert!(parse_zone("").is_err());
    // Far apart occurrences across several DST changes.
    let y = sched("0 12 29 2 *", "Europe/London", GapPolicy::Skip, FoldPolicy::First);
    assert_eq!(
        y.next_after(ms("2026-03-01T00:00:00Z")).map(utc_rfc3339).unwrap(),
        "2028-02-29T12:00:00Z"
    );
    let d = NaiveDate::from_ymd_opt(2026, 7, 1).unwrap();
    assert_eq!(d.year(), 2026);
}

#[test]
fn a_daily_schedule_goes_on_after_a_leap_day() {
    // The reported reproduction: `cron preview '0 3 * * *' --tz UTC --from 2028-02-29T04:00:00Z
    // --until 2028-03-04T00:00:00Z` printed nothing (every schedule ended on 2028-02-29).
    for zone in ["UTC", "Europe/London", "America/New_York", "Australia/Lord_Howe"] {
        let s = sched("0 3 * * *", zone, GapPolicy::ShiftToGapEnd, FoldPolicy::First);
        let from = ms("2028-02-29T12:00:00Z"); // past 03:00 on 29 February local everywhere
        let got: Vec<_> = s
            .between(from, ms("2028-03-05T00:00:00Z") + 86_400_000, 10)
            .into_iter()
            .map(|u| s.local(u).format("%Y-%m-%d %H:%M").to_string())
            .collect();
        assert_eq!(got.first().map(String::as_str), Some("2028-03-01 03:00"), "{zone}: {got:?}");
        assert!(got.len() >= 4, "{zone}: {got:?}");
        let s = sched("0 3 * * *", zone, GapPolicy::ShiftToGapEnd, FoldPolicy::First);
        assert!(s.next_after(ms("2028-02-29T12:00:00Z")).is_some(), "{zone}");
    }
}
