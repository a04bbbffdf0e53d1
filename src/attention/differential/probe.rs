//! What a differential layer's query-key dynamics do to one input: the numbers a training run
//! logs about them, as for the coupled layer.

use super::DifferentialAttention;
use crate::attention::input::check_input;
use crate::attention::probe::{DynamicsStats, mean_entropy, relative_change, step_sizes};
use crate::attention::sdpa::attention_weights;
use crate::dynamics::{Identity, QkDynamics};
use burn::tensor::{Tensor, backend::Backend};

impl<B: Backend> DifferentialAttention<B> {
    /// How far the dynamics move the query and key maps of `x` (both maps of every head
    /// together), and how they change the mean entropy of the two softmax maps `A₁`, `A₂` (the
    /// layer's masking and rotary embedding included, no padding mask). Plain differential
    /// attention moves nothing.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// If `x` is not `[batch, seq, d_model]`.
    pub fn dynamics_stats(&self, x: Tensor<B, 3>) -> DynamicsStats {
        check_input("DifferentialAttention::dynamics_stats", &x, self.d_model());
        let standard = QkDynamics::Standard(Identity);
        let (q0, k0, _) = self.project_with(x.clone(), 0, &standard);
        let (q1, k1, _) = self.project_with(x, 0, &self.dynamics);
        // A rotary embedding after the dynamics rotates both states alike, which keeps the norm
        // of their difference: the moves are the dynamics' own either way.
        let q_change = relative_change(q0.clone(), q1.clone());
        let k_change = relative_change(k0.clone(), k1.clone());
        DynamicsStats {
            dt: step_sizes(&self.dynamics),
            q_change,
            k_change,
            entropy: mean_entropy(attention_weights(q1, k1, None, self.causal)),
            entropy_standard: mean_entropy(attention_weights(q0, k0, None, self.causal)),
        }
    }

    /// The two softmax maps `A₁`, `A₂` of every head the layer scores `x` with (before their
    /// difference, which is not a distribution), no padding mask. A diagnostic: what the runs'
    /// attention diagnostics are computed from.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    /// - output: `[batch, 2·heads, seq, seq]`, rows summing to 1
    ///
    /// # Panics
    /// If `x` is not `[batch, seq, d_model]`.
    pub fn attention_maps(&self, x: Tensor<B, 3>) -> Tensor<B, 4> {
        check_input("DifferentialAttention::attention_maps", &x, self.d_model());
        let (q, k, _) = self.project_with(x, 0, &self.dynamics);
        attention_weights(q, k, None, self.causal)
    }
}

#[cfg(test)]
mod tests {
    use crate::attention::DifferentialAttentionConfig;
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

    /// One Euler step with `f = 0` and key maps equal to query maps: `q₁ = (1 + dt)·q₀`,
    /// `k₁ = k₀`, so the queries move by exactly `dt` of their size and the keys not at all, wherever
    /// the rotary embedding acts (it rotates queries and keys alike).
    #[test]
    fn known_dt_and_force_give_the_changes_by_hand() {
        let device = Default::default();
        for rotary in rotaries() {
            let mut layer = DifferentialAttentionConfig::new(8, 2)
                .with_dynamics(DynamicsConfig::euler(1))
                .with_dt(StepSizeConfig::new().with_init(0.25))
                .with_rotary(rotary.clone())
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
        }
    }

    #[test]
    fn plain_differential_attention_moves_nothing() {
        let device = Default::default();
        let layer = DifferentialAttentionConfig::new(8, 2).init::<TestBackend>(&device);
        let x = Tensor::<TestBackend, 3>::random([1, 4, 8], Distribution::Default, &device);
        let stats = layer.dynamics_stats(x);
        assert!(stats.dt.is_empty());
        assert_eq!((stats.q_change, stats.k_change), (0.0, 0.0));
        assert_eq!(stats.entropy, stats.entropy_standard);
    }
}
