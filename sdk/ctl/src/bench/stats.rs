//! Percentiles, number formatting and the report: a human table on stdout, then one JSON
//! line (printed last, so scripts can take the last line).

use serde_json::{Map, Value, json};

/// Percentiles of a sample (ms for lateness).
#[derive(Debug, Clone, Copy, Default)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// The nearest-rank percentile `p` (0–100) of a sorted sample.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Summary {
    /// The summary of a sample.
    pub fn of(mut v: Vec<f64>) -> Summary {
        if v.is_empty() {
            return Summary::default();
        }
        v.sort_by(f64::total_cmp);
        Summary {
            n: v.len(),
            min: v[0],
            p50: percentile(&v, 50.0),
            p90: percentile(&v, 90.0),
            p99: percentile(&v, 99.0),
            max: v[v.len() - 1],
        }
    }

    /// `{"n":…,"min":…,"p50":…,"p90":…,"p99":…,"max":…}` (ms, one decimal; `n` samples).
    pub fn json(&self) -> Value {
        json!({"n": self.n, "min": round1(self.min), "p50": round1(self.p50), "p90": round1(self.p90),
            "p99": round1(self.p99), "max": round1(self.max)})
    }

    /// `p50 / p90 / p99 / max` for the table.
    pub fn human(&self) -> String {
        if self.n == 0 {
            return "-".into();
        }
        format!("{} / {} / {} / {}", ms(self.p50), ms(self.p90), ms(self.p99), ms(self.max))
    }
}

/// One decimal.
pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Two decimals.
pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// An integer with thousands separators.
pub fn int(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A duration in ms for humans: `4.2 ms`, `1,234 ms`, `12.3 s`.
pub fn ms(x: f64) -> String {
    if x.abs() >= 10_000.0 {
        format!("{:.1} s", x / 1_000.0)
    } else if x.abs() >= 100.0 {
        format!(
            "{} ms",
            if x < 0.0 { format!("-{}", int((-x).round() as u64)) } else { int(x.round() as u64) }
        )
    } else {
        format!("{x:.1} ms")
    }
}

/// A rate for humans.
pub fn rate(x: f64) -> String {
    format!("{}/s", int(x.max(0.0).round() as u64))
}

/// What a scenario came to: the table rows, the JSON fields, and violated invariants.
pub struct Report {
    pub title: String,
    rows: Vec<(String, String)>,
    pub json: Map<String, Value>,
    /// Invariants that failed (missing, lost or early > 0): exit 1 under `--quick`.
    pub failures: Vec<String>,
    /// Remarks printed under the table.
    pub notes: Vec<String>,
}

impl Report {
    /// An empty report for `scenario`.
    pub fn new(scenario: &str, title: impl Into<String>) -> Report {
        let mut json = Map::new();
        json.insert("scenario".into(), Value::from(scenario));
        Report {
            title: title.into(),
            rows: Vec::new(),
            json,
            failures: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// A table row.
    pub fn row(&mut self, measure: impl Into<String>, value: impl Into<String>) {
        self.rows.push((measure.into(), value.into()));
    }

    /// A JSON field.
    pub fn set(&mut self, key: &str, v: impl Into<Value>) {
        self.json.insert(key.to_string(), v.into());
    }

    /// The human table.
    pub fn table(&self) -> String {
        let w = self.rows.iter().map(|(m, _)| m.chars().count()).max().unwrap_or(0).max(7);
        let mut out = format!("{}\n{:<w$}  value\n", self.title, "measure");
        out.push_str(&format!("{}  {}\n", "-".repeat(w), "-".repeat(24)));
        for (m, v) in &self.rows {
            out.push_str(&format!("{m:<w$}  {v}\n"));
        }
        for n in &self.notes {
            out.push_str(&format!("note: {n}\n"));
        }
        out
    }

    /// The JSON line.
    pub fn json_line(&self) -> String {
        Value::Object(self.json.clone()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_formats() {
        let s = Summary::of((1..=100).map(f64::from).collect());
        assert_eq!((s.p50, s.p90, s.p99, s.max, s.min), (50.0, 90.0, 99.0, 100.0, 1.0));
        assert_eq!(Summary::of(vec![7.0]).p99, 7.0);
        assert_eq!(int(1_234_567), "1,234,567");
        assert_eq!(int(12), "12");
        assert_eq!(ms(4.3), "4.3 ms");
        assert_eq!(ms(1_234.4), "1,234 ms");
        assert_eq!(ms(12_345.0), "12.3 s");
    }
}
