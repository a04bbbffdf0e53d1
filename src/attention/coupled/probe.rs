//! What a coupled layer's dynamics do to one input: the queries and keys before and after them,
//! and the numbers a training run logs about them (how far they move, how the attention's
//! entropy changes, the learned step size).

use super::CoupledQkAttention;
use crate::attention::input::check_input;
use crate::attention::probe::{DynamicsStats, mean_entropy, relative_change, step_sizes};
use crate::attention::sdpa::attention_weights;
use crate::dynamics::{Identity, QkDynamics};
use burn::tensor::{Tensor, backend::Backend};

/// A layer's queries and keys for one input, before and after its dynamics (without the rotary
/// embedding: a layer that rotates before its dynamics evolves the rotated ones, which
/// [`CoupledQkAttention::dynamics_stats`] measures).
///
/// # Shapes
/// Each `[batch, seq, heads, d_head]`.
#[derive(Debug, Clone)]
pub struct QkStates<B: Backend> {
    /// The projected queries, `x·W_q`.
    pub q: Tensor<B, 4>,
    /// The projected keys, `x·W_k`.
    pub k: Tensor<B, 4>,
    /// The queries the dynamics give.
    pub q_evolved: Tensor<B, 4>,
    /// The keys the dynamics give.
    pub k_evolved: Tensor<B, 4>,
}

impl<B: Backend> CoupledQkAttention<B> {
    /// The queries and keys of `x` before and after the dynamics.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// If `x` is not `[batch, seq, d_model]`.
    pub fn qk_states(&self, x: Tensor<B, 3>) -> QkStates<B> {
        check_input("CoupledQkAttention::qk_states", &x, self.d_model());
        let q = self.split_heads(self.query.forward(x.clone()));
        let k = self.split_heads(self.key.forward(x));
        let (q_evolved, k_evolved) = self.dynamics.forward(q.clone(), k.clone());
        QkStates {
            q,
            k,
            q_evolved,
            k_evolved,
        }
    }

    /// How far the dynamics move the queries and keys of `x`, and how they change the entropy of
    /// the attention (the layer's masking and rotary embedding included, no padding mask).
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// If `x` is not `[batch, seq, d_model]`.
    pub fn dynamics_stats(&self, x: Tensor<B, 3>) -> DynamicsStats {
        check_input("CoupledQkAttention::dynamics_stats", &x, self.d_model());
        let standard = QkDynamics::Standard(Identity);
        let (q0, k0, _) = self.project_with(x.clone(), 0, &standard);
        let (q1, k1, _) = self.project_with(x, 0, &self.dynamics);
        // The states the layer scores: with the rotary embedding before the dynamics, these evolve
        // rotated; after them, both sides are rotated alike, which keeps the norms of the moves.
        DynamicsStats {
            dt: step_sizes(&self.dynamics),
            q_change: relative_change(q0.clone(), q1.clone()),
            k_change: relative_change(k0.clone(), k1.clone()),
            entropy: mean_entropy(attention_weights(q1, k1, None, self.causal)),
            entropy_standard: mean_entropy(attention_weights(q0, k0, None, self.causal)),
        }
    }

    /// The attention weights the layer scores `x` with: the softmax of its (evolved, rotated,
    /// masked) queries against its keys, no padding mask. A diagnostic: what the runs' attention
    /// diagnostics (entropy, effective rank, singular values) are computed from.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    /// - output: `[batch, heads, seq, seq]`, rows summing to 1
    ///
    /// # Panics
    /// If `x` is not `[batch, seq, d_model]`.
    pub fn attention_maps(&self, x: Tensor<B, 3>) -> Tensor<B, 4> {
        check_input("CoupledQkAttention::attention_maps", &x, self.d_model());
        let (q, k, _) = self.project_with(x, 0, &self.dynamics);
        attention_weights(q, k, None, self.causal)
    }
}

#[cfg(test)]
mod tests {
    use crate::attention::CoupledQkAttentionConfig;
    use crate::attention::probe::tests::keys_equal_queries_and_no_force;
    use crate::attention::{RotaryConfig, RotaryPosition};
    use crate::dynamics::DynamicsConfig;
    use crate::step_size::StepSizeConfig;
    use burn::backend::Flex;
    use burn::tensor::{Distribution, Tensor};

    type TestBackend = Flex;

    fn rotaries() -> [Option<RotaryConfig>; 3] {
        [
            None,
            Some(RotaryConfig::new(16).with_position(RotaryPosition::BeforeDynamics)),
            Some(RotaryConfig::new(16).with_position(RotaryPosition::AfterDynamics)),
        ]
    }

    /// One Euler step with `f = 0` and keys equal to queries: `q₁ = q₀ + dt·k₀ = (1 + dt)·q₀`,
    /// `k₁ = k₀`, so the query moves by exactly `dt` of its size and the key not at all, wherever
    /// the rotary embedding acts (it rotates queries and keys alike).
    #[test]
    fn known_dt_and_force_give_the_changes_by_hand() {
        let device = Default::default();
        for rotary in rotaries() {
            let mut layer = CoupledQkAttentionConfig::new(8, 2)
                .with_dynamics(DynamicsConfig::euler(1))
                .with_dt(StepSizeConfig::new().with_init(0.25))
                .with_rotary(rotary.clone())
                .with_causal(true)
                .init::<TestBackend>(&device);
            keys_equal_queries_and_no_force(&layer.query, &mut layer.key, &mut layer.dynamics);
            let x = Tensor::<TestBackend, 3>::random([2, 5, 8], Distribution::Default, &device);
            let stats = layer.dynamics_stats(x);
            assert_eq!(stats.dt, [0.25]);
            assert!(
                (stats.q_change - 0.25).abs() < 1e-6,
                "{rotary:?}: {stats:?}"
            );
            assert!(stats.k_change.abs() < 1e-7, "{rotary:?}: {stats:?}");
            // Scores scale by 1 + dt: sharper rows, lower entropy.
            assert!(
                stats.entropy < stats.entropy_standard,
                "{rotary:?}: {stats:?}"
            );
            // Five causal rows of 1..5 keys: the entropy is at most the mean of ln(1..5).
            let bound = (1..=5).map(|n| (n as f64).ln()).sum::<f64>() / 5.0;
            assert!(
                stats.entropy_standard <= bound + 1e-6,
                "{rotary:?}: {stats:?}"
            );
        }
    }

    /// The maps are the softmax of the scored states: rows sum to 1, and a causal row gives
    /// nothing to later keys.
    #[test]
    fn attention_maps_are_causal_distributions() {
        let device = Default::default();
        let layer = CoupledQkAttentionConfig::new(8, 2)
            .with_dynamics(DynamicsConfig::euler(1))
            .with_causal(true)
            .init::<TestBackend>(&device);
        let x = Tensor::<TestBackend, 3>::random([2, 5, 8], Distribution::Default, &device);
        let maps = layer.attention_maps(x);
        assert_eq!(maps.dims(), [2, 2, 5, 5]);
        let values = maps.clone().into_data().to_vec::<f32>().unwrap();
        for (row, weights) in values.chunks(5).enumerate() {
            let query = row % 5;
            let sum: f32 = weights.iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "row {row}: {weights:?}");
            assert!(
                weights[query + 1..].iter().all(|&w| w == 0.0),
                "row {row}: {weights:?}"
            );
        }
    }

    #[test]
    fn standard_attention_moves_nothing() {
        let device = Default::default();
        let layer = CoupledQkAttentionConfig::new(8, 2)
            .with_dynamics(DynamicsConfig::Standard)
            .init::<TestBackend>(&device);
        let x = Tensor::<TestBackend, 3>::random([1, 4, 8], Distribution::Default, &device);
        let stats = layer.dynamics_stats(x);
        assert!(stats.dt.is_empty());
        assert_eq!((stats.q_change, stats.k_change), (0.0, 0.0));
        assert_eq!(stats.entropy, stats.entropy_standard);
    }
}
