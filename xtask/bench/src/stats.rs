//! Order statistics over measured samples.

use std::time::Duration;

/// Durations of repeated measurements of one operation.
#[derive(Debug, Default, Clone)]
pub(crate) struct Samples {
    durations: Vec<Duration>,
}

impl Samples {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            durations: Vec::with_capacity(capacity),
        }
    }

    pub(crate) fn push(&mut self, duration: Duration) {
        self.durations.push(duration);
    }

    pub(crate) fn len(&self) -> usize {
        self.durations.len()
    }

    /// The `q` quantile (0.0..=1.0), nearest-rank; zero when empty.
    pub(crate) fn quantile(&self, q: f64) -> Duration {
        if self.durations.is_empty() {
            return Duration::ZERO;
        }
        let mut sorted = self.durations.clone();
        sorted.sort_unstable();
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let rank =
            ((q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    pub(crate) fn median(&self) -> Duration {
        self.quantile(0.5)
    }

    pub(crate) fn p99(&self) -> Duration {
        self.quantile(0.99)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let mut samples = Samples::default();
        for ms in 1..=100 {
            samples.push(Duration::from_millis(ms));
        }
        assert_eq!(samples.median(), Duration::from_millis(50));
        assert_eq!(samples.p99(), Duration::from_millis(99));
        assert_eq!(samples.quantile(1.0), Duration::from_millis(100));
        assert_eq!(Samples::default().median(), Duration::ZERO);
    }
}
