//! Expression tests: hand-picked cases (specials, Vixie day semantics, errors naming the field)
//! and a property test against an independent model (random expressions built from value sets,
//! rendered as text; the model's own membership test and a brute-force scan are the oracle).

use super::*;
use crate::env::Rng;

fn t(s: &str) -> NaiveDateTime {
    NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S").unwrap()
}

fn next(e: &str, after: &str) -> String {
    Expr::parse(e).unwrap().next_after(t(after)).unwrap().format("%Y-%m-%d %H:%M:%S").to_string()
}

#[test]
fn fields_macros_names_and_steps() {
    assert_eq!(next("*/15 * * * *", "2026-03-01 10:07:00"), "2026-03-01 10:15:00");
    assert_eq!(next("0 9-17/4 * * MON-FRI", "2026-03-06 17:00:00"), "2026-03-09 09:00:00");
    assert_eq!(next("30 2 * JAN,jul *", "2026-03-01 00:00:00"), "2026-07-01 02:30:00");
    assert_eq!(next("@hourly", "2026-03-01 10:00:00"), "2026-03-01 11:00:00");
    assert_eq!(next("@daily", "2026-03-01 10:00:00"), "2026-03-02 00:00:00");
    assert_eq!(next("@weekly", "2026-03-01 10:00:00"), "2026-03-08 00:00:00"); // a Sunday
    assert_eq!(next("@monthly", "2026-03-01 10:00:00"), "2026-04-01 00:00:00");
    assert_eq!(next("@yearly", "2026-03-01 10:00:00"), "2027-01-01 00:00:00");
    assert_eq!(next("*/20 * * * * *", "2026-03-01 10:00:59"), "2026-03-01 10:01:00");
    assert_eq!(next("5 * * * * *", "2026-03-01 10:00:05"), "2026-03-01 10:01:05");
    assert_eq!(next("0 0 * * 7", "2026-03-02 00:00:00"), "2026-03-08 00:00:00", "7 is Sunday");
    assert_eq!(next("0 0 * * 5-7", "2026-03-02 00:00:00"), "2026-03-06 00:00:00");
    assert_eq!(next("0 0 29 2 *", "2026-03-01 00:00:00"), "2028-02-29 00:00:00");
    assert_eq!(next("10/20 * * * *", "2026-03-01 10:31:00"), "2026-03-01 10:50:00");
    assert_eq!(Expr::parse("  0  0 * * *  ").unwrap().text(), "0 0 * * *");
}

#[test]
fn vixie_day_semantics() {
    // Both restricted: either matches (the 13th, and every Friday).
    assert_eq!(next("0 0 13 * FRI", "2026-03-01 00:00:00"), "2026-03-06 00:00:00");
    assert_eq!(next("0 0 13 * FRI", "2026-03-06 00:00:00"), "2026-03-13 00:00:00");
    // Day-of-week `*`: only the day of month.
    assert_eq!(next("0 0 13 * *", "2026-03-01 00:00:00"), "2026-03-13 00:00:00");
    // A field starting with `*` counts as unrestricted (Vixie): both must match.
    assert_eq!(next("0 0 */2 * MON", "2026-03-01 00:00:00"), "2026-03-09 00:00:00");
    // `?` is `*`.
    assert_eq!(next("0 0 ? * MON", "2026-03-01 00:00:00"), "2026-03-02 00:00:00");
}

#[test]
fn last_nearest_weekday_and_nth() {
    assert_eq!(next("0 0 L * *", "2026-02-01 00:00:00"), "2026-02-28 00:00:00");
    assert_eq!(next("0 0 L-2 * *", "2026-02-01 00:00:00"), "2026-02-26 00:00:00");
    // 2026-02-15 is a Sunday: 15W is Monday the 16th.
    assert_eq!(next("0 0 15W * *", "2026-02-01 00:00:00"), "2026-02-16 00:00:00");
    // 2026-08-01 is a Saturday: 1W is Monday the 3rd (never the month before).
    assert_eq!(next("0 0 1W * *", "2026-07-02 00:00:00"), "2026-08-03 00:00:00");
    // 2026-05-31 is a Sunday: LW is Friday the 29th.
    assert_eq!(next("0 0 LW * *", "2026-05-01 00:00:00"), "2026-05-29 00:00:00");
    assert_eq!(next("0 0 * * 5L", "2026-03-01 00:00:00"), "2026-03-27 00:00:00");
    assert_eq!(next("0 0 * * MON#1", "2026-03-03 00:00:00"), "2026-04-06 00:00:00");
    assert_eq!(next("0 0 * * 2#3", "2026-03-01 00:00:00"), "2026-03-17 00:00:00");
}

#[test]
fn errors_name_the_field() {
    let cases = [
        ("", "expression", "empty"),
        ("* * * *", "expression", "4 fields"),
        ("61 * * * *", "minute field", "out of range 0-59"),
        ("0 24 * * *", "hour field", "out of range"),
        ("0 0 0 * *", "day-of-month field", "out of range 1-31"),
        ("0 0 * 13 *", "month field", "out of range 1-12"),
        ("0 0 * * 8", "day-of-week field", "out of range 0-7"),
        ("0 0 * FOO *", "month field", "not a number or a name"),
        ("*/0 * * * *", "minute field", "positive"),
        ("5-1 * * * *", "minute field", "start is after its end"),
        ("0 0 * * L", "day-of-week field", "ambiguous"),
        ("0 0 * * MON#6", "day-of-week field", "1-5"),
        ("0 0 L-40 * *", "day-of-month field", "L-n"),
        ("0 0 30 2 *", "expression", "matches no day"),
        ("@reboot", "expression", "unknown macro"),
        ("0,,5 * * * *", "minute field", "empty list item"),
        ("0 ? * * *", "hour field", "only for day"),
        ("60 * * * * *", "second field", "out of range"),
    ];
    for (e, field, what) in cases {
        let err = Expr::parse(e).unwrap_err();
        assert_eq!(err.field, field, "{e:?}: {err}");
        assert!(err.reason.contains(what), "{e:?}: {err}");
    }
}

/// A field of the model: its values and how it is written.
struct Field {
    values: Vec<u32>,
    text: String,
    star: bool,
}

fn random_field(rng: &Rng, lo: u32, hi: u32, names: &[&str], base: u32) -> Field {
    let name = |v: u32| -> String {
        if !names.is_empty() && rng.chance(0.3) {
            names[(v - base) as usize].to_string()
        } else {
            v.to_string()
        }
    };
    match rng.below(6) {
        0 => Field { values: (lo..=hi).collect(), text: "*".into(), star: true },
        1 => {
            let step = rng.between(1, u64::from((hi - lo).max(1))) as u32;
            Field {
                values: (lo..=hi).step_by(step as usize).collect(),
                text: format!("*/{step}"),
                star: true,
            }
        }
        2 => {
            let a = rng.between(u64::from(lo), u64::from(hi)) as u32;
            let b = rng.between(u64::from(a), u64::from(hi)) as u32;
            let step = rng.between(1, 4) as u32;
            Field {
                values: (a..=b).step_by(step as usize).collect(),
                text: if step == 1 {
                    format!("{}-{}", name(a), name(b))
                } else {
                    format!("{}-{}/{step}", name(a), name(b))
                },
                star: false,
            }
        }
        _ => {
            let n = rng.between(1, 4);
            let mut vs: Vec<u32> =
                (0..n).map(|_| rng.between(u64::from(lo), u64::from(hi)) as u32).collect();
            let text = vs.iter().map(|v| name(*v)).collect::<Vec<_>>().join(",");
            vs.sort_unstable();
            vs.dedup();
            Field { values: vs, text, star: false }
        }
    }
}

struct Model {
    minute: Field,
    hour: Field,
    dom: Field,
    month: Field,
    dow: Field,
}

impl Model {
    fn day(&self, d: NaiveDate) -> bool {
        if !self.month.values.contains(&d.month()) {
            return false;
        }
        let dom = self.dom.values.contains(&d.day());
        let dow = self.dow.values.contains(&d.weekday().num_days_from_sunday());
        if self.dom.star || self.dow.star { dom && dow } else { dom || dow }
    }

    fn matches(&self, t: NaiveDateTime) -> bool {
        self.day(t.date())
            && self.hour.values.contains(&t.hour())
            && self.minute.values.contains(&t.minute())
            && t.second() == 0
    }

    /// Brute force: day by day, then minute by minute.
    fn next_after(&self, after: NaiveDateTime, days: i64) -> Option<NaiveDateTime> {
        let mut d = after.date();
        for _ in 0..days {
            if self.day(d) {
                for m in 0..1440 {
                    let t = d.and_hms_opt(m / 60, m % 60, 0)?;
                    if t > after && self.matches(t) {
                        return Some(t);
                    }
                }
            }
            d = d.succ_opt()?;
        }
        None
    }
}

#[test]
fn random_expressions_agree_with_an_independent_model() {
    let rng = Rng::seeded(20_261_203);
    const MONTHS: [&str; 12] =
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"];
    const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    let mut checked = 0;
    for _ in 0..300 {
        let m = Model {
            minute: random_field(&rng, 0, 59, &[], 0),
            hour: random_field(&rng, 0, 23, &[], 0),
            dom: random_field(&rng, 1, 31, &[], 1),
            month: random_field(&rng, 1, 12, &MONTHS, 1),
            dow: random_field(&rng, 0, 6, &DAYS, 0),
        };
        let text = format!(
            "{} {} {} {} {}",
            m.minute.text, m.hour.text, m.dom.text, m.month.text, m.dow.text
        );
        let e = match Expr::parse(&text) {
            Ok(e) => e,
            Err(err) => {
                // Only an impossible day (e.g. 31 in a 30-day month only) may be refused.
                assert_eq!(err.field, "expression", "{text}: {err}");
                assert!(m.next_after(t("2026-01-01 00:00:00"), 3_000).is_none(), "{text}");
                continue;
            }
        };
        for _ in 0..5 {
            let start = t("2026-01-01 00:00:00")
                + Duration::minutes(rng.below(3 * 365 * 1440) as i64)
                + Duration::seconds(rng.below(60) as i64);
            for k in 0..20 {
                let probe = start + Duration::minutes(k * 7);
                assert_eq!(e.matches(probe), m.matches(probe), "{text} at {probe}");
            }
            let want = m.next_after(start, 800);
            let got = e.next_after(start);
            if want.is_some() {
                assert_eq!(got, want, "{text} after {start}");
                checked += 1;
            }
        }
    }
    assert!(checked > 500, "only {checked} comparisons");
}

/// An independent Gregorian calendar (no chrono): days since 1970-01-01 ↔ (year, month, day),
/// the leap rule from its definition, weekdays from the day count (1970-01-01 was a Thursday).
mod civil {
    pub fn is_leap(y: i64) -> bool {
        (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
    }

    pub fn days_in_month(y: i64, m: u32) -> u32 {
        match m {
            2 if is_leap(y) => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        }
    }

    /// Days since 1970-01-01 by counting whole years and months (slow, obviously right).
    pub fn days(y: i64, m: u32, d: u32) -> i64 {
        assert!(y >= 1970);
        let years: i64 = (1970..y).map(|yy| if is_leap(yy) { 366 } else { 365 }).sum();
        let months: i64 = (1..m).map(|mm| i64::from(days_in_month(y, mm))).sum();
        years + months + i64::from(d) - 1
    }

    /// (year, month, day) of a day number, walking forward from a known year start.
    pub fn date(mut n: i64) -> (i64, u32, u32) {
        let mut y = 1970;
        loop {
            let len = if is_leap(y) { 366 } else { 365 };
            if n < len {
                break;
            }
            n -= len;
            y += 1;
        }
        let mut m = 1;
        while n >= i64::from(days_in_month(y, m)) {
            n -= i64::from(days_in_month(y, m));
            m += 1;
        }
        (y, m, n as u32 + 1)
    }

    /// 0 = Sunday.
    pub fn weekday(n: i64) -> u32 {
        ((n + 4).rem_euclid(7)) as u32
    }
}

/// The model on the independent calendar: a day number matches, and the first minute after
/// `(day, minute_of_day)` that matches, searching `days` days.
struct CivilModel<'a> {
    m: &'a Model,
    /// `L` in the day-of-month field (the month's last day) instead of the model's values.
    dom_last: bool,
}

impl CivilModel<'_> {
    fn day(&self, (y, mo, d): (i64, u32, u32), weekday: u32) -> bool {
        if !self.m.month.values.contains(&mo) {
            return false;
        }
        let dom = if self.dom_last {
            d == civil::days_in_month(y, mo)
        } else {
            self.m.dom.values.contains(&d)
        };
        let dow = self.m.dow.values.contains(&weekday);
        let dom_star = self.m.dom.star && !self.dom_last;
        if dom_star || self.m.dow.star { dom && dow } else { dom || dow }
    }

    /// First (day number, minute of day) strictly after `(day, minute, second)` (occurrences are
    /// at second 0, so the start's own minute never counts), searching `days` days.
    fn next_after(&self, day: i64, minute: u32, _second: u32, days: i64) -> Option<(i64, u32)> {
        let (mut y, mut mo, mut d) = civil::date(day);
        let mut n = day;
        while n < day + days {
            if !self.m.month.values.contains(&mo) {
                // Skip the rest of the month.
                n += i64::from(civil::days_in_month(y, mo) - d) + 1;
                (y, mo, d) = if mo == 12 { (y + 1, 1, 1) } else { (y, mo + 1, 1) };
                continue;
            }
            if self.day((y, mo, d), civil::weekday(n)) {
                let from = if n == day { minute + 1 } else { 0 };
                for min in from..1440 {
                    if self.m.hour.values.contains(&(min / 60))
                        && self.m.minute.values.contains(&(min % 60))
                    {
                        return Some((n, min));
                    }
                }
            }
            n += 1;
            (y, mo, d) = if d < civil::days_in_month(y, mo) {
                (y, mo, d + 1)
            } else if mo < 12 {
                (y, mo + 1, 1)
            } else {
                (y + 1, 1, 1)
            };
        }
        None
    }
}

fn naive_of_civil(n: i64, minute: u32, second: u32) -> NaiveDateTime {
    let (y, m, d) = civil::date(n);
    NaiveDate::from_ymd_opt(y as i32, m, d)
        .unwrap()
        .and_hms_opt(minute / 60, minute % 60, second)
        .unwrap()
}

#[test]
fn the_independent_calendar_agrees_with_known_dates() {
    // Spot checks of the oracle itself, from outside both calendars.
    assert_eq!(civil::days(1970, 1, 1), 0);
    assert_eq!(civil::days(2000, 3, 1), 11_017);
    assert_eq!(civil::weekday(civil::days(2028, 2, 29)), 2); // a Tuesday
    assert_eq!(civil::weekday(civil::days(2100, 3, 1)), 1); // a Monday
    assert!(civil::is_leap(2000) && civil::is_leap(2028) && !civil::is_leap(2100));
    for n in [0, 11_016, 11_017, 21_243, 47_540, 47_541] {
        let (y, m, d) = civil::date(n);
        assert_eq!(civil::days(y, m, d), n);
    }
}

#[test]
fn schedules_run_on_across_every_leap_day_from_every_start_day() {
    // The bug: a search horizon computed with `with_year` from 29 February does not exist, so a
    // schedule asked for its next run on a leap day (2028-02-29) had none and ended.
    // Every start day from 2023 to 2105 (so 2024, 2028, … 2104 and the non-leap 2100), at
    // three times of day, for expressions whose answers cross month, year and leap-day edges.
    let cases: [(&str, bool); 8] = [
        ("0 3 * * *", false),
        ("30 23 * * *", false),
        ("0 0 29 2 *", false),
        ("0 12 28-31 2 *", false),
        ("0 0 1 3 *", false),
        ("15 6 31 * *", false),
        ("0 0 L * *", true),
        ("0 9 * 2 TUE", false),
    ];
    let first = civil::days(2023, 1, 1);
    let last = civil::days(2105, 12, 31);
    for (text, dom_last) in cases {
        let e = Expr::parse(text).unwrap();
        let fields: Vec<&str> = text.split(' ').collect();
        let model = model_of(&fields);
        let oracle = CivilModel { m: &model, dom_last };
        let mut checked = 0;
        for n in first..=last {
            for (minute, second) in [(0, 0), (4 * 60, 0), (23 * 60 + 59, 59)] {
                let start = naive_of_civil(n, minute, second);
                let want = oracle
                    .next_after(n, minute, second, 9 * 366)
                    .map(|(d, m)| naive_of_civil(d, m, 0));
                assert_eq!(e.next_after(start), want, "{text} after {start}");
                checked += 1;
            }
        }
        assert!(checked > 90_000, "{text}: {checked}");
    }
}

/// A plain-fields model from five written fields (`L` handled by the caller).
fn model_of(f: &[&str]) -> Model {
    let parse = |s: &str, lo: u32, hi: u32| -> Field {
        if s == "*" || s == "L" {
            return Field { values: (lo..=hi).collect(), text: s.into(), star: s == "*" };
        }
        let names = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
        let mut values = Vec::new();
        for part in s.split(',') {
            let v = |x: &str| -> u32 {
                names.iter().position(|n| *n == x).map_or_else(|| x.parse().unwrap(), |p| p as u32)
            };
            match part.split_once('-') {
                Some((a, b)) => values.extend(v(a)..=v(b)),
                None => values.push(v(part)),
            }
        }
        Field { values, text: s.into(), star: false }
    };
    Model {
        minute: parse(f[0], 0, 59),
        hour: parse(f[1], 0, 23),
        dom: parse(f[2], 1, 31),
        month: parse(f[3], 1, 12),
        dow: parse(f[4], 0, 6),
    }
}

#[test]
fn random_expressions_agree_with_the_independent_calendar_around_leap_days() {
    // Random plain expressions from random instants clustered at the edges of February and of
    // the year, 2024–2104, against the chrono-free calendar.
    let rng = Rng::seeded(20_280_229);
    const MONTHS: [&str; 12] =
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"];
    const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    let mut checked = 0;
    for _ in 0..400 {
        let m = Model {
            minute: random_field(&rng, 0, 59, &[], 0),
            hour: random_field(&rng, 0, 23, &[], 0),
            dom: random_field(&rng, 1, 31, &[], 1),
            month: random_field(&rng, 1, 12, &MONTHS, 1),
            dow: random_field(&rng, 0, 6, &DAYS, 0),
        };
        let text = format!(
            "{} {} {} {} {}",
            m.minute.text, m.hour.text, m.dom.text, m.month.text, m.dow.text
        );
        let Ok(e) = Expr::parse(&text) else { continue };
        let oracle = CivilModel { m: &m, dom_last: false };
        for _ in 0..10 {
            let year = 2024 + 4 * rng.below(21) as i64; // leap years and 2100
            let (mo, d) = [(2, 27), (2, 28), (3, 1), (12, 31), (1, 1)][rng.below(5) as usize];
            let d = d.min(civil::days_in_month(year, mo));
            let n = civil::days(year, mo, d) + rng.below(3) as i64 - 1;
            let (minute, second) = (rng.below(1440) as u32, rng.below(60) as u32);
            let start = naive_of_civil(n, minute, second);
            let want =
                oracle.next_after(n, minute, second, 800).map(|(d, m)| naive_of_civil(d, m, 0));
            if want.is_some() {
                assert_eq!(e.next_after(start), want, "{text} after {start}");
                checked += 1;
            }
        }
    }
    assert!(checked > 2_000, "only {checked} comparisons");
}
