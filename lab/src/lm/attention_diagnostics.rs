//! The attention pathologies the paper sets out to fix, measured: how spread the attention rows
//! are (entropy, distance from uniform), and how close the attention matrices are to rank one
//! (effective rank, the gap between their two leading singular values).

use burn::tensor::{Int, Tensor, backend::Backend};
use coupled_qk::model::Gpt;
use nalgebra::DMatrix;
use rayon::prelude::*;

/// The windows of the first validation batch the diagnostics read.
pub const DIAGNOSTIC_WINDOWS: usize = 4;
/// The leading positions of each window they read. With causal attention the leading
/// `p × p` block of a window's attention matrix is exactly the attention of its first `p` tokens,
/// so the cap bounds the cost (a singular value decomposition per map, `O(p³)`) without mixing in
/// anything else.
pub const DIAGNOSTIC_POSITIONS: usize = 128;
/// The largest `σ₁ / σ₂` reported: a matrix of rank one has `σ₂` at rounding error.
pub const MAX_LEADING_RATIO: f64 = 1e12;

/// What the attention of one layer looks like, averaged over its maps (heads × windows).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AttentionDiagnostics {
    /// The mean over rows of the entropy of the row, `−Σ p·ln p` (nats).
    pub entropy: f64,
    /// The mean over rows that may see two keys or more of the entropy as a fraction of the
    /// uniform row's (`ln` of the keys the row may see): 1 when attention is uniform, 0 when each
    /// row attends to one key.
    pub normalised_entropy: f64,
    /// The mean over maps of the effective rank, `exp` of the entropy of the normalised singular
    /// values `σᵢ / Σσ` (Roy & Vetterli, 2007): 1 for a rank-one map, `n` for a permutation.
    pub effective_rank: f64,
    /// The geometric mean over maps of `σ₁ / σ₂`, the ratio of the two leading singular values
    /// (at most [`MAX_LEADING_RATIO`]): large when the map is close to rank one.
    pub leading_ratio: f64,
    /// The mean over rows of the total-variation distance `½·Σ|p − u|` between the row and the
    /// uniform row `u` over the keys it may see: 0 for uniform attention, `1 − 1/n` for a row on
    /// one of `n` keys.
    pub distance_from_uniform: f64,
}

/// The diagnostics of each block's attention (see [`Gpt::attention_maps`]) on the first
/// [`DIAGNOSTIC_WINDOWS`] rows of `tokens`, cut to their first [`DIAGNOSTIC_POSITIONS`]
/// positions: one entry per block, over its heads (both softmax maps of differential attention).
///
/// # Shapes
/// - `tokens`: `[batch, seq]`, `seq <= context`
///
/// # Panics
/// If `tokens` is empty or longer than the model's context.
pub fn gpt_attention_diagnostics<B: Backend>(
    model: &Gpt<B>,
    tokens: Tensor<B, 2, Int>,
) -> Vec<AttentionDiagnostics> {
    let [rows, seq] = tokens.dims();
    let tokens = tokens.slice([
        0..rows.min(DIAGNOSTIC_WINDOWS),
        0..seq.min(DIAGNOSTIC_POSITIONS),
    ]);
    model
        .attention_maps(tokens)
        .into_iter()
        .map(|maps| {
            let [batch, heads, n, _] = maps.dims();
            let values = maps
                .into_data()
                .convert::<f32>()
                .to_vec::<f32>()
                .expect("attention maps convert to f32");
            // A Gpt's attention is causal.
            diagnose(&values, batch * heads, n, true)
        })
        .collect()
}

/// Row statistics of one map, summed; singular-value statistics of it.
#[derive(Clone, Copy, Default)]
struct MapSums {
    entropy: f64,
    normalised_entropy: f64,
    normalised_rows: usize,
    distance: f64,
    effective_rank: f64,
    ln_leading_ratio: f64,
}

/// The diagnostics of attention maps `weights` (row-major `[maps, n, n]`, each row a distribution
/// over the keys it may see: the first `i + 1` when `causal`, all `n` otherwise).
///
/// # Panics
/// If `weights` does not hold `maps · n · n` values or `n` is 0.
pub fn diagnose(weights: &[f32], maps: usize, n: usize, causal: bool) -> AttentionDiagnostics {
    assert!(n > 0, "attention maps of no positions");
    assert_eq!(weights.len(), maps * n * n, "weights of [{maps}, {n}, {n}]");
    // In parallel over maps, summed in map order: the same figures at any thread count.
    let per_map: Vec<MapSums> = weights
        .par_chunks(n * n)
        .map(|map| map_sums(map, n, causal))
        .collect();
    let rows = (maps * n) as f64;
    let sum = |f: fn(&MapSums) -> f64| per_map.iter().map(f).sum::<f64>();
    let normalised_rows: usize = per_map.iter().map(|m| m.normalised_rows).sum();
    AttentionDiagnostics {
        entropy: sum(|m| m.entropy) / rows,
        normalised_entropy: sum(|m| m.normalised_entropy) / normalised_rows.max(1) as f64,
        effective_rank: sum(|m| m.effective_rank) / maps as f64,
        leading_ratio: (sum(|m| m.ln_leading_ratio) / maps as f64).exp(),
        distance_from_uniform: sum(|m| m.distance) / rows,
    }
}

fn map_sums(map: &[f32], n: usize, causal: bool) -> MapSums {
    let mut sums = MapSums::default();
    for (i, row) in map.chunks(n).enumerate() {
        let visible = if causal { i + 1 } else { n };
        let uniform = 1.0 / visible as f64;
        let mut entropy = 0.0;
        let mut distance = 0.0;
        for &p in &row[..visible] {
            let p = f64::from(p);
            if p > 0.0 {
                entropy -= p * p.ln();
            }
            distance += (p - uniform).abs();
        }
        // Weight on keys the row may not see counts as distance too.
        distance += row[visible..]
            .iter()
            .map(|&p| f64::from(p).abs())
            .sum::<f64>();
        sums.entropy += entropy;
        sums.distance += distance / 2.0;
        if visible > 1 {
            sums.normalised_entropy += entropy / (visible as f64).ln();
            sums.normalised_rows += 1;
        }
    }
    let matrix = DMatrix::from_row_iterator(n, n, map.iter().map(|&p| f64::from(p)));
    let mut sigma: Vec<f64> = matrix.singular_values().iter().copied().collect();
    sigma.sort_by(|a, b| b.total_cmp(a));
    let total: f64 = sigma.iter().sum();
    if total > 0.0 {
        let spectral_entropy: f64 = sigma
            .iter()
            .map(|s| s / total)
            .filter(|&p| p > 0.0)
            .map(|p| -p * p.ln())
            .sum();
        sums.effective_rank = spectral_entropy.exp();
        let second = sigma.get(1).copied().unwrap_or(0.0);
        sums.ln_leading_ratio = (sigma[0] / second.max(sigma[0] / MAX_LEADING_RATIO)).ln();
    }
    sums
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_relative_eq;

    fn identity(n: usize) -> Vec<f32> {
        (0..n * n)
            .map(|i| if i / n == i % n { 1.0 } else { 0.0 })
            .collect()
    }

    /// Uniform rows over all keys: a rank-one map at the maximum entropy.
    #[test]
    fn uniform_attention_is_rank_one_and_at_zero_distance() {
        let n = 8;
        let d = diagnose(&vec![1.0 / n as f32; n * n], 1, n, false);
        assert_relative_eq!(d.entropy, (n as f64).ln(), epsilon = 1e-6);
        assert_relative_eq!(d.normalised_entropy, 1.0, epsilon = 1e-6);
        assert_relative_eq!(d.effective_rank, 1.0, epsilon = 1e-6);
        assert!(d.leading_ratio > 1e6, "{d:?}");
        assert_relative_eq!(d.distance_from_uniform, 0.0, epsilon = 1e-6);
    }

    /// Each row on its own key: full rank, all singular values equal, no entropy.
    #[test]
    fn the_identity_is_full_rank_and_as_far_from_uniform_as_can_be() {
        let n = 8;
        let d = diagnose(&identity(n), 1, n, false);
        assert_relative_eq!(d.entropy, 0.0);
        assert_relative_eq!(d.normalised_entropy, 0.0);
        assert_relative_eq!(d.effective_rank, n as f64, epsilon = 1e-9);
        assert_relative_eq!(d.leading_ratio, 1.0, epsilon = 1e-9);
        assert_relative_eq!(
            d.distance_from_uniform,
            1.0 - 1.0 / n as f64,
            epsilon = 1e-9
        );
        // Causal: row i sees i + 1 keys and sits on one of them.
        let d = diagnose(&identity(n), 1, n, true);
        let expected = (0..n).map(|i| 1.0 - 1.0 / (i + 1) as f64).sum::<f64>() / n as f64;
        assert_relative_eq!(d.distance_from_uniform, expected, epsilon = 1e-9);
        assert_relative_eq!(d.effective_rank, n as f64, epsilon = 1e-9);
    }

    /// Every row the same distribution `p`: rank one whatever `p` is; entropy and distance are
    /// `p`'s.
    #[test]
    fn equal_rows_are_rank_one() {
        let p = [0.5f32, 0.25, 0.125, 0.125];
        let map: Vec<f32> = p.iter().cycle().take(16).copied().collect();
        let d = diagnose(&map, 1, 4, false);
        let entropy: f64 = p.iter().map(|&x| -f64::from(x) * f64::from(x).ln()).sum();
        assert_relative_eq!(d.entropy, entropy, epsilon = 1e-6);
        assert_relative_eq!(d.effective_rank, 1.0, epsilon = 1e-6);
        assert!(d.leading_ratio > 1e6, "{d:?}");
        // ½(|0.5 − 0.25| + 0 + 2·|0.125 − 0.25|) = 0.25.
        assert_relative_eq!(d.distance_from_uniform, 0.25, epsilon = 1e-6);
    }

    /// Causal uniform rows (row i: `1/(i+1)` on its keys) are at zero distance, at the entropy
    /// `ln(i+1)`; and maps average: an identity beside a uniform map halves the distance.
    #[test]
    fn causal_rows_are_measured_on_the_keys_they_see() {
        let n = 6;
        let causal_uniform: Vec<f32> = (0..n * n)
            .map(|k| {
                let (i, j) = (k / n, k % n);
                if j <= i { 1.0 / (i + 1) as f32 } else { 0.0 }
            })
            .collect();
        let d = diagnose(&causal_uniform, 1, n, true);
        assert_relative_eq!(d.distance_from_uniform, 0.0, epsilon = 1e-6);
        let entropy = (1..=n).map(|m| (m as f64).ln()).sum::<f64>() / n as f64;
        assert_relative_eq!(d.entropy, entropy, epsilon = 1e-6);
        assert_relative_eq!(d.normalised_entropy, 1.0, epsilon = 1e-6);
        let both: Vec<f32> = identity(n).into_iter().chain(causal_uniform).collect();
        let mixed = diagnose(&both, 2, n, true);
        let alone = diagnose(&identity(n), 1, n, true);
        assert_relative_eq!(
            mixed.distance_from_uniform,
            alone.distance_from_uniform / 2.0,
            epsilon = 1e-6
        );
    }
}
