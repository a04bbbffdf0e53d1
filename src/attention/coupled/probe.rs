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
/// embedding).
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
        let states = self.qk_states(x.clone());
        let q_change = relative_change(states.q, states.q_evolved);
        let k_change = relative_change(states.k, states.k_evolved);
        let entropy_with = |dynamics: &QkDynamics<B>| {
            let (q, k, _) = self.project_with(x.clone(), 0, dynamics);
            mean_entropy(attention_weights(q, k, None, self.causal))
        };
        DynamicsStats {
            dt: step_sizes(&self.dynamics),
            q_change,
            k_change,
            entropy: entropy_with(&self.dynamics),
            entropy_standard: entropy_with(&QkDynamics::Standard(Identity)),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::attention::CoupledQkAttentionConfig;
    use crate::attention::probe::tests::keys_equal_queries_and_no_force;
    use crate::dynamics::DynamicsConfig;
    use crate::step_size::StepSizeConfig;
    use burn::backend::Flex;
    use burn::tensor::{Distribution, Tensor};

    type TestBackend = Flex;

    /// One Euler step with `f = 0` and keys equal to queries: `q₁ = q₀ + dt·k₀ = (1 + dt)·q₀`,
    /// `k₁ = k₀`, so the query moves by exactly `dt` of its size and the key not at all.
    #[test]
    fn known_dt_and_force_give_the_changes_by_hand() {
        let device = Default::default();
        let mut layer = CoupledQkAttentionConfig::new(8, 2)
            .with_dynamics(DynamicsConfig::euler(1))
            .with_dt(StepSizeConfig::new().with_init(0.25))
            .with_causal(true)
            .init::<TestBackend>(&device);
        keys_equal_queries_and_no_force(&layer.query, &mut layer.key, &mut layer.dynamics);
        let x = Tensor::<TestBackend, 3>::random([2, 5, 8], Distribution::Default, &device);
        let stats = layer.dynamics_stats(x);
        assert_eq!(stats.dt, [0.25]);
        assert!((stats.q_change - 0.25).abs() < 1e-6, "{stats:?}");
        assert!(stats.k_change.abs() < 1e-7, "{stats:?}");
        // Scores scale by 1 + dt: sharper rows, lower entropy.
        assert!(stats.entropy < stats.entropy_standard, "{stats:?}");
        // Five causal rows of 1..5 keys: the entropy is at most the mean of ln(1..5).
        let bound = (1..=5).map(|n| (n as f64).ln()).sum::<f64>() / 5.0;
        assert!(stats.entropy_standard <= bound + 1e-6, "{stats:?}");
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
