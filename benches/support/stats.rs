//! How sure a figure is: the 95% interval of a mean and of a ratio measured in alternating
//! runs, so a section says "4.5% (95% interval −2.1% – 11.0%)" rather than a median that
//! cannot tell 4.5% from 0%.
//!
//! A ratio of two jobs run in alternation (A, B, A, B, …) is taken pair by pair: each pair
//! ran under about the same machine conditions, so the spread of the per-pair ratios is the
//! noise the comparison really sees. Ratios multiply, so the interval is Student's t on
//! their logarithms, turned back into a ratio (a geometric mean and its interval).

/// An estimate with its 95% interval and the number of runs behind it.
#[derive(Debug, Clone, Copy)]
pub struct Interval {
    pub estimate: f64,
    pub low: f64,
    pub high: f64,
    pub runs: usize,
}

impl Interval {
    /// The interval is entirely at or above `target` (a target that is met with 95%
    /// confidence, not only by the estimate).
    pub fn at_least(&self, target: f64) -> bool {
        self.low >= target
    }

    /// The interval is entirely at or below `target`.
    pub fn at_most(&self, target: f64) -> bool {
        self.high <= target
    }

    /// `1.22 (95% interval 1.10–1.35, 6 pairs)`, numbers with `decimals` places; `unit`
    /// names what the runs are (`pairs`, `runs`).
    pub fn show(&self, decimals: usize, unit: &str) -> String {
        format!(
            "{:.d$} (95% interval {:.d$}–{:.d$}, {} {unit})",
            self.estimate,
            self.low,
            self.high,
            self.runs,
            d = decimals
        )
    }

    /// The same, as percentages of `1 − ratio` (a cost: `1 − with / without`).
    pub fn show_cost(&self) -> String {
        format!(
            "{:.1}% (95% interval {:.1}% – {:.1}%, {} pairs)",
            (1.0 - self.estimate) * 100.0,
            (1.0 - self.high) * 100.0,
            (1.0 - self.low) * 100.0,
            self.runs
        )
    }
}

/// The two-sided 95% quantile of Student's t with `df` degrees of freedom.
fn t95(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => TABLE[df - 1],
        _ => 1.96,
    }
}

/// The mean of `values` and its 95% interval (Student's t). One value gives an unbounded
/// interval: one run says nothing of the noise.
pub fn mean(values: &[f64]) -> Interval {
    let n = values.len();
    assert!(n > 0, "an interval needs at least one run");
    let mean = values.iter().sum::<f64>() / n as f64;
    let var = if n > 1 {
        values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        f64::INFINITY
    };
    let half = t95(n - 1) * (var / n as f64).sqrt();
    Interval {
        estimate: mean,
        low: mean - half,
        high: mean + half,
        runs: n,
    }
}

/// `numerator / denominator` over runs taken in alternation (`numerator[i]` beside
/// `denominator[i]`): the geometric mean of the per-pair ratios and its 95% interval.
pub fn paired_ratio(numerator: &[f64], denominator: &[f64]) -> Interval {
    assert_eq!(
        numerator.len(),
        denominator.len(),
        "a paired ratio needs as many runs of each"
    );
    let logs: Vec<f64> = numerator
        .iter()
        .zip(denominator)
        .map(|(n, d)| (n / d).ln())
        .collect();
    let m = mean(&logs);
    Interval {
        estimate: m.estimate.exp(),
        low: m.low.exp(),
        high: m.high.exp(),
        runs: m.runs,
    }
}

/// CPU per record, in µs: `cpu_seconds` (user + system, the process's own counters) over
/// `records`.
pub fn cpu_us_per_record(cpu_seconds: f64, records: u64) -> f64 {
    if records == 0 {
        return f64::NAN;
    }
    cpu_seconds * 1e6 / records as f64
}
