//! Whether two variants' seed spreads differ: the F test of the ratio of their variances over
//! seeds (the paper reports low seed variance for coupled QK, so the spread is a result of its
//! own, not only the mean).

use super::{CellResult, Paired, mean_std};

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

/// The CDF of Fisher's F distribution with `d1`, `d2` degrees of freedom at `x ≥ 0`.
pub fn f_cdf(x: f64, d1: f64, d2: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    regularized_beta(d1 * x / (d1 * x + d2), d1 / 2.0, d2 / 2.0)
}

/// The regularized incomplete beta function `I_x(a, b)`, by its continued fraction (modified
/// Lentz), on the side where it converges fast.
pub fn regularized_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let log_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    if x < (a + 1.0) / (a + b + 2.0) {
        log_front.exp() * beta_fraction(x, a, b) / a
    } else {
        1.0 - log_front.exp() * beta_fraction(1.0 - x, b, a) / b
    }
}

fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let mut c = 1.0;
    let mut d = 1.0 - (a + b) * x / (a + 1.0);
    d = 1.0 / if d.abs() < TINY { TINY } else { d };
    let mut h = d;
    for m in 1..300 {
        let m = m as f64;
        for numerator in [
            m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)),
        ] {
            d = 1.0 + numerator * d;
            d = 1.0 / if d.abs() < TINY { TINY } else { d };
            c = 1.0 + numerator / c;
            c = if c.abs() < TINY { TINY } else { c };
            h *= d * c;
        }
        if (d * c - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, 9 terms: ~1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1−x) = π / sin(πx).
        return std::f64::consts::PI.ln()
            - (std::f64::consts::PI * x).sin().ln()
            - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let series = G[1..]
        .iter()
        .enumerate()
        .fold(G[0], |acc, (i, g)| acc + g / (x + i as f64 + 1.0));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + series.ln()
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
        // I_x(1, 1) = x; I_x(a, 1) = x^a.
        assert!((regularized_beta(0.3, 1.0, 1.0) - 0.3).abs() < 1e-12);
        assert!((regularized_beta(0.6, 2.5, 1.0) - 0.6f64.powf(2.5)).abs() < 1e-12);
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
        assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-12);
    }
}
