//! Learning-rate schedules.

use std::f64::consts::PI;

/// Linear warmup to `peak`, then cosine decay to `min_ratio·peak` at `total` steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmupCosine {
    /// The peak learning rate.
    pub peak: f64,
    /// Steps of linear warmup.
    pub warmup: usize,
    /// Steps in all.
    pub total: usize,
    /// The final learning rate as a fraction of the peak.
    pub min_ratio: f64,
}

impl WarmupCosine {
    /// The learning rate at `step` (0-based).
    pub fn at(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.peak * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1);
        let progress = ((step - self.warmup) as f64 / span as f64).min(1.0);
        let cosine = 0.5 * (1.0 + (PI * progress).cos());
        self.peak * (self.min_ratio + (1.0 - self.min_ratio) * cosine)
    }
}
