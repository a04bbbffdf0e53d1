//! Whether two variants' seed spreads differ: the F test of the ratio of their variances over
//! seeds (the paper reports low seed variance for coupled QK, so the spread is a result of its
//! own, not only the mean).

use super::{CellResult, Paired, mean_std};
use statrs::distribution::{ContinuousCDF, FisherSnedecor};

/// The F test of a variant's seed spread against its baseline's, over the seeds of a [`Paired`]
/// comparison.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SpreadTest {
    /// The corpus.
    pub corpus: String,
    /// The variant's label.
    pub variant: String,
    /// The baseline's label.
    pub baseline: String,
    /// Seeds (both finished each).
    pub seeds: usize,
    /// Sample standard deviation of the variant's validation loss over those seeds.
    pub std: f64,
    /// The baseline's.
    pub baseline_std: f64,
    /// `std² / baseline_std²`.
    pub ratio: f64,
    /// Two-sided p-value of the ratio under equal variances (F with `seeds − 1`, `seeds − 1`
    /// degrees of freedom, normal losses); `None` for fewer than two seeds or a zero spread.
    pub p: Option<f64>,
}

/// The F test of every pair of `paired` (see [`super::paired_to_baselines`]), over the seeds both
/// variants finished.
pub fn spread_tests(results: &[CellResult], paired: &[Paired]) -> Vec<SpreadTest> {
    paired
        .iter()
        .map(|p| {
            let losses = |variant: &str, other: &str| -> Vec<f64> {
                results
                    .iter()
                    .filter(|r| r.corpus == p.corpus && r.variant == variant)
                    .filter(|r| {
                        results
                            .iter()
                            .any(|o| o.corpus == p.corpus && o.variant == other && o.seed == r.seed)
                    })
                    .map(|r| r.val_loss)
                    .collect()
            };
            let (std, baseline_std) = (
                mean_std(&losses(&p.variant, &p.baseline)).1,
                mean_std(&losses(&p.baseline, &p.variant)).1,
            );
            let ratio = std.powi(2) / baseline_std.powi(2);
            let df = p.seeds.saturating_sub(1) as f64;
            let p_value = (p.seeds >= 2 && ratio.is_finite() && ratio > 0.0).then(|| {
                let cdf = f_cdf(ratio, df, df);
                (2.0 * cdf.min(1.0 - cdf)).min(1.0)
            });
            SpreadTest {
                corpus: p.corpus.clone(),
                variant: p.variant.clone(),
                baseline: p.baseline.clone(),
                seeds: p.seeds,
                std,
                baseline_std,
                ratio,
                p: p_value,
            }
        })
        .collect()
}

/// The CDF of Fisher's F distribution with `d1`, `d2` degrees of freedom at `x ≥ 0` (statrs'
/// Fisher–Snedecor); 0 for `x ≤ 0`, NaN for degrees of freedom that are not positive.
pub fn f_cdf(x: f64, d1: f64, d2: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    FisherSnedecor::new(d1, d2).map_or(f64::NAN, |f| f.cdf(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_f_distribution_matches_closed_forms_and_tables() {
        // d1 = d2 = 2: CDF = x / (1 + x).
        for x in [0.1, 0.5, 1.0, 3.0, 40.0] {
            assert!((f_cdf(x, 2.0, 2.0) - x / (1.0 + x)).abs() < 1e-12, "{x}");
        }
        // Tabulated 97.5% quantiles: F(5, 5) 7.1464, F(7, 7) 4.9949, F(2, 2) 39.
        for (q, d) in [(7.1464, 5.0), (4.9949, 7.0), (39.0, 2.0)] {
            let cdf = f_cdf(q, d, d);
            assert!((cdf - 0.975).abs() < 2e-5, "F({d}, {d}) at {q}: {cdf}");
        }
        // Unequal degrees of freedom: F(3, 10) 95% quantile 3.7083, F(10, 3) 8.7855.
        assert!((f_cdf(3.7083, 3.0, 10.0) - 0.95).abs() < 2e-5);
        assert!((f_cdf(8.7855, 10.0, 3.0) - 0.95).abs() < 2e-5);
        // F(1/x; d2, d1) = 1 − F(x; d1, d2).
        let (a, b) = (f_cdf(2.5, 3.0, 6.0), f_cdf(0.4, 6.0, 3.0));
        assert!((a + b - 1.0).abs() < 1e-12, "{a} {b}");
        assert!(f_cdf(1.0, 0.0, 3.0).is_nan());
    }
}
