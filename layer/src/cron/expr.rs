//! Cron expressions: parsing, and matching local wall-clock times (no time zone here: see
//! [`super::zone`]).
//!
//! ```text
//! [second] minute hour day-of-month month day-of-week
//!   second        0-59            (optional: 6 fields = seconds first; 5 fields = second 0)
//!   minute        0-59
//!   hour          0-23
//!   day-of-month  1-31, L, L-n, nW, LW, ?
//!   month         1-12 or JAN-DEC
//!   day-of-week   0-7 or SUN-SAT (0 and 7 are Sunday), nL, n#k, ?
//! ```
//! Each field is `*`, or a comma list of `a`, `a-b`, `*/s`, `a/s` (from a to the field's end)
//! and `a-b/s`. Names are case-insensitive. `@yearly` (`@annually`), `@monthly`, `@weekly`,
//! `@daily` (`@midnight`) and `@hourly` stand for their usual 5-field forms.
//!
//! Day matching follows Vixie cron: when the day-of-month or the day-of-week field starts with
//! `*` (or is `?`), a day must match both; when both are restricted, a day matching either
//! one matches (`0 0 13 * FRI` runs on every 13th *and* every Friday).
//!
//! Specials: `L` the month's last day, `L-n` n days before it, `nW` the weekday (Mon–Fri)
//! nearest day n within the month, `LW` the month's last weekday; `nL` the month's last
//! weekday n (`5L` = last Friday), `n#k` its k-th weekday n (`MON#1` = first Monday).

use crate::limits::CRON_SEARCH_YEARS_MAX;
use chrono::{Datelike, Duration, Months, NaiveDate, NaiveDateTime, NaiveTime, Timelike};

/// What is wrong with an expression: the field and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ExprError {
    /// `expression`, or the field at fault (`minute field`, `day-of-week field`, …).
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

fn err(field: &'static str, reason: impl Into<String>) -> ExprError {
    ExprError { field, reason: reason.into() }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Second,
    Minute,
    Hour,
    Dom,
    Month,
    Dow,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Second => "second field",
            Kind::Minute => "minute field",
            Kind::Hour => "hour field",
            Kind::Dom => "day-of-month field",
            Kind::Month => "month field",
            Kind::Dow => "day-of-week field",
        }
    }

    /// Values accepted (day-of-week 7 is folded to 0).
    fn range(self) -> (u32, u32) {
        match self {
            Kind::Second | Kind::Minute => (0, 59),
            Kind::Hour => (0, 23),
            Kind::Dom => (1, 31),
            Kind::Month => (1, 12),
            Kind::Dow => (0, 7),
        }
    }

    fn names(self) -> &'static [&'static str] {
        match self {
            Kind::Month => &[
                "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
            ],
            Kind::Dow => &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
            _ => &[],
        }
    }
}

/// Day-of-month and day-of-week rules beyond plain values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Specials {
    /// `L` (0) and `L-n` (n): days before the month's last day.
    last_minus: Vec<u32>,
    /// `nW`: the weekday nearest day n.
    nearest_weekday: Vec<u32>,
    /// `LW`.
    last_weekday: bool,
    /// `nL`: bit per weekday (0 = Sunday) whose last occurrence in the month matches.
    dow_last: u8,
    /// `n#k`: (weekday, k).
    dow_nth: Vec<(u32, u32)>,
}

/// A parsed cron expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expr {
    seconds: u64,
    minutes: u64,
    hours: u64,
    dom: u64,
    months: u64,
    dow: u64,
    dom_star: bool,
    dow_star: bool,
    specials: Specials,
    text: String,
}

fn macro_of(name: &str) -> Option<&'static str> {
    Some(match name.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        _ => return None,
    })
}

fn parse_value(kind: Kind, s: &str) -> Result<u32, ExprError> {
    let upper = s.to_ascii_uppercase();
    if let Some(i) = kind.names().iter().position(|n| *n == upper) {
        let base = if kind == Kind::Month { 1 } else { 0 };
        return Ok(i as u32 + base);
    }
    let v: u32 = s.parse().map_err(|_| {
        let names = if kind.names().is_empty() { "" } else { " or a name" };
        err(kind.name(), format!("{s:?} is not a number{names}"))
    })?;
    let (lo, hi) = kind.range();
    if v < lo || v > hi {
        return Err(err(kind.name(), format!("{v} is out of range {lo}-{hi}")));
    }
    Ok(v)
}

fn bits(lo: u32, hi: u32, step: u32) -> u64 {
    (lo..=hi).step_by(step as usize).fold(0, |b, v| b | (1u64 << v))
}

/// One comma item of a field into bits (or specials for the day fields).
fn parse_item(kind: Kind, item: &str, sp: &mut Specials) -> Result<u64, ExprError> {
    if item.is_empty() {
        return Err(err(kind.name(), "empty list item"));
    }
    let upper = item.to_ascii_uppercase();
    let special = match kind {
        Kind::Dom => dom_special(item, &upper, sp)?,
        Kind::Dow => dow_special(item, &upper, sp)?,
        _ => false,
    };
    if special {
        return Ok(0);
    }
    parse_range(kind, item)
}

/// `L`, `L-n`, `LW` and `nW` of the day of the month, into `sp`; `false` if `item` is none.
fn dom_special(item: &str, upper: &str, sp: &mut Specials) -> Result<bool, ExprError> {
    let name = Kind::Dom.name();
    if upper == "LW" {
        sp.last_weekday = true;
        return Ok(true);
    }
    if let Some(rest) = upper.strip_prefix('L') {
        let minus = match rest {
            "" => 0,
            r => r
                .strip_prefix('-')
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|n| (1..=30).contains(n))
                .ok_or_else(|| err(name, format!("{item:?}: write L or L-n with n 1-30")))?,
        };
        sp.last_minus.push(minus);
        return Ok(true);
    }
    if let Some(day) = upper.strip_suffix('W') {
        sp.nearest_weekday.push(parse_value(Kind::Dom, day)?);
        return Ok(true);
    }
    Ok(false)
}

/// `n#k` and `nL` of the day of the week, into `sp`; `false` if `item` is none.
fn dow_special(item: &str, upper: &str, sp: &mut Specials) -> Result<bool, ExprError> {
    let name = Kind::Dow.name();
    if let Some((day, k)) = upper.split_once('#') {
        let d = parse_value(Kind::Dow, day)? % 7;
        let k: u32 = k
            .parse()
            .ok()
            .filter(|k| (1..=5).contains(k))
            .ok_or_else(|| err(name, format!("{item:?}: the k of n#k must be 1-5")))?;
        sp.dow_nth.push((d, k));
        return Ok(true);
    }
    if upper == "L" {
        return Err(err(
            name,
            "\"L\" alone is ambiguous: write 6 (SAT), or nL for the last weekday n",
        ));
    }
    if let Some(day) = upper.strip_suffix('L') {
        let d = parse_value(Kind::Dow, day)? % 7;
        sp.dow_last |= 1 << d;
        return Ok(true);
    }
    Ok(false)
}

/// `*`, `?`, `a`, `a-b`, each with an optional `/step`, into bits.
fn parse_range(kind: Kind, item: &str) -> Result<u64, ExprError> {
    let name = kind.name();
    let (lo, hi) = kind.range();
    let hi = if kind == Kind::Dow { 6 } else { hi };
    let (range, step) = match item.split_once('/') {
        Some((r, s)) => {
            let step: u32 = s.parse().ok().filter(|s| *s >= 1).ok_or_else(|| {
                err(name, format!("{item:?}: the step must be a positive number"))
            })?;
            (r, Some(step))
        }
        None => (item, None),
    };
    let (a, b) = if range == "*" || range == "?" {
        if range == "?" && !matches!(kind, Kind::Dom | Kind::Dow) {
            return Err(err(name, "\"?\" is only for day-of-month and day-of-week"));
        }
        (lo, hi)
    } else if let Some((a, b)) = range.split_once('-') {
        let (a, b) = (parse_value(kind, a)?, parse_value(kind, b)?);
        // 7 is Sunday too; a range ending at 7 (`5-7`) means through Sunday.
        let (a, b) = if kind == Kind::Dow && a == 7 { (0, b) } else { (a, b) };
        if a > b {
            return Err(err(name, format!("{item:?}: the range start is after its end")));
        }
        (a, b)
    } else {
        let a = parse_value(kind, range)?;
        let a = if kind == Kind::Dow && a == 7 && step.is_none() { 0 } else { a };
        (a, if step.is_some() { hi.max(a) } else { a })
    };
    if step.is_some_and(|s| s > hi - lo + 1) {
        return Err(err(name, format!("{item:?}: the step is larger than the field's range")));
    }
    let mut b = bits(a, b, step.unwrap_or(1));
    if kind == Kind::Dow && b & (1 << 7) != 0 {
        b = (b & !(1 << 7)) | 1;
    }
    Ok(b)
}

fn parse_field(kind: Kind, text: &str, sp: &mut Specials) -> Result<u64, ExprError> {
    text.split(',').try_fold(0, |acc, item| Ok(acc | parse_item(kind, item, sp)?))
}

impl Expr {
    /// Parses an expression (5 or 6 fields, or a macro). Every error names the field.
    pub fn parse(text: &str) -> Result<Expr, ExprError> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(err("expression", "is empty"));
        }
        let expanded = if trimmed.starts_with('@') {
            macro_of(trimmed).ok_or_else(|| {
                err(
                    "expression",
                    format!(
                        "unknown macro {trimmed:?} (use @yearly, @annually, @monthly, @weekly, \
                         @daily, @midnight or @hourly)"
                    ),
                )
            })?
        } else {
            trimmed
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let (sec, rest) = match fields.len() {
            5 => ("0", &fields[..]),
            6 => (fields[0], &fields[1..]),
            n => {
                return Err(err(
                    "expression",
                    format!(
                        "has {n} fields: expected 5 (minute hour day-of-month month day-of-week) \
                         or 6 (with seconds first)"
                    ),
                ));
            }
        };
        let mut sp = Specials::default();
        let mut none = Specials::default();
        let seconds = parse_field(Kind::Second, sec, &mut none)?;
        let minutes = parse_field(Kind::Minute, rest[0], &mut none)?;
        let hours = parse_field(Kind::Hour, rest[1], &mut none)?;
        let dom = parse_field(Kind::Dom, rest[2], &mut sp)?;
        let months = parse_field(Kind::Month, rest[3], &mut none)?;
        let dow = parse_field(Kind::Dow, rest[4], &mut sp)?;
        let star = |f: &str| f.starts_with('*') || f == "?";
        let expr = Expr {
            seconds,
            minutes,
            hours,
            dom,
            months,
            dow,
            dom_star: star(rest[2]),
            dow_star: star(rest[4]),
            specials: sp,
            text: fields.join(" "),
        };
        let probe = NaiveDate::from_ymd_opt(2000, 1, 1).and_then(|d| d.and_hms_opt(0, 0, 0));
        if let Some(start) = probe
            && expr.next_after(start).is_none()
        {
            return Err(err(
                "expression",
                format!("{trimmed:?} matches no day (e.g. the 30th of February)"),
            ));
        }
        Ok(expr)
    }

    /// The expression as given (macros expanded, fields separated by one space).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the second field is the only one that varies below a minute (for callers that
    /// want to know how dense a schedule is).
    pub fn every_second(&self) -> bool {
        self.seconds.count_ones() > 1
    }

    fn dom_matches(&self, d: NaiveDate) -> bool {
        let day = d.day();
        if self.dom & (1 << day) != 0 {
            return true;
        }
        let sp = &self.specials;
        let last = last_day(d);
        if sp.last_minus.iter().any(|m| last.checked_sub(*m) == Some(day)) {
            return true;
        }
        if sp.last_weekday && Some(day) == weekday_nearest(d, last) {
            return true;
        }
        sp.nearest_weekday.iter().any(|n| Some(day) == weekday_nearest(d, *n))
    }

    fn dow_matches(&self, d: NaiveDate) -> bool {
        let wd = d.weekday().num_days_from_sunday();
        if self.dow & (1 << wd) != 0 {
            return true;
        }
        let sp = &self.specials;
        if sp.dow_last & (1 << wd) != 0 && d.day() + 7 > last_day(d) {
            return true;
        }
        sp.dow_nth.iter().any(|(w, k)| *w == wd && (d.day() - 1) / 7 + 1 == *k)
    }

    /// Whether a local date is one of the expression's days.
    pub fn day_matches(&self, d: NaiveDate) -> bool {
        if self.months & (1 << d.month()) == 0 {
            return false;
        }
        let (dom, dow) = (self.dom_matches(d), self.dow_matches(d));
        if self.dom_star || self.dow_star { dom && dow } else { dom || dow }
    }

    /// Whether a local wall-clock time matches (to the second).
    pub fn matches(&self, t: NaiveDateTime) -> bool {
        self.day_matches(t.date())
            && self.hours & (1 << t.hour()) != 0
            && self.minutes & (1 << t.minute()) != 0
            && self.seconds & (1 << t.second()) != 0
    }

    /// The first matching time of day at or after `t`, if any.
    fn time_at_or_after(&self, t: NaiveTime) -> Option<NaiveTime> {
        let (h0, m0, s0) = (t.hour(), t.minute(), t.second());
        let mut h = next_bit(self.hours, h0)?;
        loop {
            let mut m = next_bit(self.minutes, if h == h0 { m0 } else { 0 });
            while let Some(min) = m {
                let from = if h == h0 && min == m0 { s0 } else { 0 };
                if let Some(s) = next_bit(self.seconds, from) {
                    return NaiveTime::from_hms_opt(h, min, s);
                }
                m = next_bit(self.minutes, min + 1);
            }
            h = next_bit(self.hours, h + 1)?;
        }
    }

    /// The first matching wall-clock time strictly after `after` (whole seconds), searching at
    /// most [`CRON_SEARCH_YEARS_MAX`] years ahead.
    pub fn next_after(&self, after: NaiveDateTime) -> Option<NaiveDateTime> {
        let start = after.with_nanosecond(0)? + Duration::seconds(1);
        // Months, not `with_year`: a year from 29 February is 28 February (or 1 March), never
        // "no such date" — which once ended every schedule on 2028-02-29.
        let limit = start.date().checked_add_months(Months::new(12 * CRON_SEARCH_YEARS_MAX))?;
        let (mut date, mut from) = (start.date(), start.time());
        while date <= limit {
            if self.months & (1 << date.month()) == 0 {
                date = first_of_next_month(date)?;
                from = NaiveTime::MIN;
                continue;
            }
            if self.day_matches(date)
                && let Some(t) = self.time_at_or_after(from)
            {
                return Some(date.and_time(t));
            }
            date = date.succ_opt()?;
            from = NaiveTime::MIN;
        }
        None
    }
}

impl std::fmt::Display for Expr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn next_bit(bits: u64, from: u32) -> Option<u32> {
    if from >= 64 {
        return None;
    }
    let masked = bits & (u64::MAX << from);
    (masked != 0).then(|| masked.trailing_zeros())
}

fn first_of_next_month(d: NaiveDate) -> Option<NaiveDate> {
    let (y, m) = if d.month() == 12 { (d.year() + 1, 1) } else { (d.year(), d.month() + 1) };
    NaiveDate::from_ymd_opt(y, m, 1)
}

/// The last day of `d`'s month.
pub fn last_day(d: NaiveDate) -> u32 {
    first_of_next_month(d).and_then(|n| n.pred_opt()).map_or(28, |l| l.day())
}

/// The weekday (Mon–Fri) nearest day `n` of `d`'s month, staying within the month; `None`
/// if the month has no day `n`.
fn weekday_nearest(d: NaiveDate, n: u32) -> Option<u32> {
    let last = last_day(d);
    if n > last {
        return None;
    }
    let target = d.with_day(n)?;
    Some(match target.weekday().num_days_from_monday() {
        5 if n > 1 => n - 1,    // Saturday → Friday
        5 => n + 2,             // Saturday the 1st → Monday the 3rd
        6 if n < last => n + 1, // Sunday → Monday
        6 => n - 2,             // Sunday the last → Friday
        _ => n,
    })
}

#[cfg(test)]
#[path = "expr_tests.rs"]
mod tests;
