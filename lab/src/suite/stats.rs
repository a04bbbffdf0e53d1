//! Mean ± standard deviation over seeds.

use super::{CellResult, CurvePoint};

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
