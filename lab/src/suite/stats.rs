//! Mean ± standard deviation over seeds, and paired differences between variants that share
//! seeds.

use super::{CellResult, CurvePoint};
use statrs::distribution::{ContinuousCDF, StudentsT};

/// Mean and sample standard deviation (0 for one value).
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    if values.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// One (corpus, variant) over its seeds.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Aggregate {
    /// The corpus.
    pub corpus: String,
    /// The variant's label.
    pub variant: String,
    /// Seeds aggregated.
    pub seeds: usize,
    /// Validation loss (nats per token): mean, std.
    pub loss: (f64, f64),
    /// Validation perplexity: mean, std.
    pub ppl: (f64, f64),
    /// Validation bits per byte: mean, std.
    pub bpb: (f64, f64),
    /// Training tokens per second: mean over seeds.
    pub tokens_per_s: f64,
    /// Parameters added by the variant.
    pub extra_params: usize,
}

/// Aggregates results by (corpus, variant), keeping the order of first appearance.
pub fn aggregate(results: &[CellResult]) -> Vec<Aggregate> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in results {
        let key = (r.corpus.clone(), r.variant.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(corpus, variant)| {
            let group: Vec<&CellResult> = results
                .iter()
                .filter(|r| r.corpus == corpus && r.variant == variant)
                .collect();
            let pick = |f: &dyn Fn(&CellResult) -> f64| {
                mean_std(&group.iter().map(|r| f(r)).collect::<Vec<_>>())
            };
            Aggregate {
                seeds: group.len(),
                loss: pick(&|r| r.val_loss),
                ppl: pick(&|r| r.val_ppl),
                bpb: pick(&|r| r.val_bpb),
                tokens_per_s: pick(&|r| r.tokens_per_s).0,
                extra_params: group[0].extra_params,
                corpus,
                variant,
            }
        })
        .collect()
}

/// A variant against a baseline over the seeds both finished on one corpus: runs that differ
/// only in the variant share the seed (initialisation of the shared parts, data order), so the
/// per-seed difference removes most of the seed-to-seed spread.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Paired {
    /// The corpus.
    pub corpus: String,
    /// The variant's label.
    pub variant: String,
    /// The baseline's label.
    pub baseline: String,
    /// Seeds both finished.
    pub seeds: usize,
    /// Mean over those seeds of the variant's validation loss minus the baseline's (negative:
    /// the variant is better).
    pub mean_diff: f64,
    /// The 95% confidence interval of that mean (Student's t over the seeds; `None` for fewer
    /// than two seeds).
    pub ci95: Option<(f64, f64)>,
    /// Seeds where the variant's loss is below the baseline's.
    pub ahead: usize,
}

/// The two-sided 95% quantile of Student's t with `df` degrees of freedom (its 97.5th
/// percentile, by statrs); NaN for 0.
pub fn t_975(df: usize) -> f64 {
    StudentsT::new(0.0, 1.0, df as f64).map_or(f64::NAN, |t| t.inverse_cdf(0.975))
}

/// Every variant of each corpus against `baseline` on the same corpus, paired by seed, in order
/// of first appearance; the baseline itself is left out.
pub fn paired(results: &[CellResult], baseline: &str) -> Vec<Paired> {
    let mut out: Vec<Paired> = Vec::new();
    for r in results {
        if r.variant == baseline
            || out
                .iter()
                .any(|p| p.corpus == r.corpus && p.variant == r.variant)
        {
            continue;
        }
        let diffs: Vec<f64> = results
            .iter()
            .filter(|v| v.corpus == r.corpus && v.variant == r.variant)
            .filter_map(|v| {
                results
                    .iter()
                    .find(|b| b.corpus == r.corpus && b.variant == baseline && b.seed == v.seed)
                    .map(|b| v.val_loss - b.val_loss)
            })
            .collect();
        if diffs.is_empty() {
            continue;
        }
        let (mean, std) = mean_std(&diffs);
        let n = diffs.len();
        let ci95 = (n >= 2).then(|| {
            let half = t_975(n - 1) * std / (n as f64).sqrt();
            (mean - half, mean + half)
        });
        out.push(Paired {
            corpus: r.corpus.clone(),
            variant: r.variant.clone(),
            baseline: baseline.to_string(),
            seeds: n,
            mean_diff: mean,
            ci95,
            ahead: diffs.iter().filter(|d| **d < 0.0).count(),
        });
    }
    out
}

/// Every variant against standard attention, then each coupled differential attention
/// (`diff+…`) also against plain `diff` (what the coupling adds to differential attention), and
/// each affine coupling against its uncoupled control of the same size when that was run
/// (`affine1` against `affine-uncoupled1`: what the exchange between q and k adds beyond the
/// parameters), and the paper's structural ablation against Euler's coupling: `mlp-only` against
/// `euler1` (the net without the coupling) and `leapfrogN` against `eulerN` (the integrator).
pub fn paired_to_baselines(results: &[CellResult]) -> Vec<Paired> {
    let mut out = paired(results, "standard");
    out.extend(
        paired(results, "diff")
            .into_iter()
            .filter(|p| p.variant.starts_with("diff+")),
    );
    let mut controls: Vec<&str> = Vec::new();
    for r in results {
        if r.variant.contains(AFFINE_CONTROL) && !controls.contains(&r.variant.as_str()) {
            controls.push(&r.variant);
        }
    }
    for control in controls {
        let coupled = control.replace(AFFINE_CONTROL, "affine");
        out.extend(
            paired(results, control)
                .into_iter()
                .filter(|p| p.variant == coupled),
        );
    }
    let ran = |name: &str| results.iter().any(|r| r.variant == name);
    let mut euler_pairs: Vec<(String, String)> = Vec::new();
    if ran("mlp-only") && ran("euler1") {
        euler_pairs.push(("mlp-only".into(), "euler1".into()));
    }
    for r in results {
        if let Some(steps) = r.variant.strip_prefix("leapfrog") {
            let pair = (r.variant.clone(), format!("euler{steps}"));
            if ran(&pair.1) && !euler_pairs.contains(&pair) {
                euler_pairs.push(pair);
            }
        }
    }
    for (variant, euler) in euler_pairs {
        out.extend(
            paired(results, &euler)
                .into_iter()
                .filter(|p| p.variant == variant),
        );
    }
    out
}

/// The name of the affine coupling's uncoupled control.
const AFFINE_CONTROL: &str = "affine-uncoupled";

/// Where a validation curve first reaches `target` (loss at or below it), interpolating linearly
/// between evaluations: `(tokens, elapsed seconds)`; `None` if it never does.
pub fn first_reach(curve: &[CurvePoint], target: f64) -> Option<(f64, f64)> {
    let mut previous: Option<&CurvePoint> = None;
    for p in curve {
        if p.val_loss <= target {
            return Some(match previous {
                Some(q) if q.val_loss > p.val_loss => {
                    let t = (q.val_loss - target) / (q.val_loss - p.val_loss);
                    (
                        q.tokens as f64 + t * (p.tokens - q.tokens) as f64,
                        q.elapsed_s + t * (p.elapsed_s - q.elapsed_s),
                    )
                }
                _ => (p.tokens as f64, p.elapsed_s),
            });
        }
        previous = Some(p);
    }
    None
}
