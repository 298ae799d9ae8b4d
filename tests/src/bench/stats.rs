//! Summaries of measured samples: percentiles and medians.

use serde::Serialize;

/// A latency distribution in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Latency {
    pub n: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn of(samples: &[f64]) -> Latency {
        let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
        sorted.sort_by(f64::total_cmp);
        Latency {
            n: sorted.len(),
            p50_ms: percentile(&sorted, 50.0),
            p99_ms: percentile(&sorted, 99.0),
            max_ms: sorted.last().copied().unwrap_or(0.0),
        }
    }
}

/// Nearest-rank percentile of sorted samples; 0 for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, 50.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let l = Latency::of(&v);
        assert_eq!(
            (l.n, l.p50_ms, l.p99_ms, l.max_ms),
            (100, 50.0, 99.0, 100.0)
        );
        assert_eq!(Latency::of(&[]).p99_ms, 0.0);
        assert_eq!(Latency::of(&[7.0]).p50_ms, 7.0);
        assert_eq!(median(&[3.0, 1.0, 2.0, f64::NAN]), 2.0);
    }
}
