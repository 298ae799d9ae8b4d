//! Retry delays: exponential with jitter, so the nodes of a fleet that lost their database
//! together do not all retry in the same instant when it comes back.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Delays from `first`, doubling up to `most`, each lengthened by a random part of itself
/// (backon's jitter: a delay `d` becomes one in `[d, 2d)`).
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
}

impl Backoff {
    pub fn new(first: Duration, most: Duration) -> Backoff {
        let builder = ExponentialBuilder::default()
            .with_min_delay(first)
            .with_max_delay(most.max(first))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Backoff {
            builder,
            delays: builder.build(),
        }
    }

    /// The wait before the next try.
    pub fn next_delay(&mut self) -> Duration {
        // Without a limit on tries the iterator never ends; `most` is the fallback anyway.
        self.delays
            .next()
            .unwrap_or_else(|| self.builder.build().next().unwrap_or(Duration::ZERO))
    }

    /// Back to `first`, after a success.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_with_jitter_and_are_capped() {
        let first = Duration::from_millis(100);
        let most = Duration::from_secs(2);
        let mut b = Backoff::new(first, most);
        let delays: Vec<Duration> = (0..12).map(|_| b.next_delay()).collect();
        for (i, d) in delays.iter().enumerate() {
            let base = (first * (1 << i.min(10))).min(most);
            assert!(*d >= base && *d < base * 2, "try {i}: {d:?} vs {base:?}");
        }
        b.reset();
        assert!(b.next_delay() < first * 2);
        // Two fleets' nodes draw different delays: retries spread out.
        let spread: std::collections::BTreeSet<Duration> = (0..20)
            .map(|_| Backoff::new(first, most).next_delay())
            .collect();
        assert!(spread.len() > 10, "{spread:?}");
    }
}
