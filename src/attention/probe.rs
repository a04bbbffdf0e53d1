//! What a layer's query-key dynamics do to one input, as numbers: shared by the coupled and the
//! differential layer's probes.

use crate::dynamics::QkDynamics;
use burn::tensor::{ElementConversion, Tensor, backend::Backend};

/// What a layer's dynamics did to one input, as numbers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DynamicsStats {
    /// The step size `dt`: one value, or one per head; empty without coupled dynamics.
    pub dt: Vec<f64>,
    /// `‖q₁ − q₀‖ / ‖q₀‖` over the whole input (Frobenius norms).
    pub q_change: f64,
    /// `‖k₁ − k₀‖ / ‖k₀‖` over the whole input.
    pub k_change: f64,
    /// The mean entropy (nats) of the attention rows, as the layer scores (for differential
    /// attention, the rows of both softmax maps).
    pub entropy: f64,
    /// The same with the dynamics switched off (standard attention with the layer's projections).
    pub entropy_standard: f64,
}

/// The Frobenius norm.
fn norm<B: Backend>(x: Tensor<B, 4>) -> f64 {
    x.powf_scalar(2.0).sum().sqrt().into_scalar().elem::<f64>()
}

/// The mean over rows of `−Σ p·ln p`, for weights `[batch, heads, s_q, s_k]`.
pub(crate) fn mean_entropy<B: Backend>(weights: Tensor<B, 4>) -> f64 {
    let [batch, heads, s_q, _] = weights.dims();
    // 0·ln 0 = 0: a masked key contributes nothing.
    let terms = weights.clone() * weights.clamp_min(1e-30).log();
    let total = terms.sum().into_scalar().elem::<f64>();
    -total / (batch * heads * s_q) as f64
}

/// `‖after − before‖ / ‖before‖` (Frobenius norms; 0 when nothing moved).
pub(crate) fn relative_change<B: Backend>(before: Tensor<B, 4>, after: Tensor<B, 4>) -> f64 {
    let moved = norm(after - before.clone());
    moved / norm(before).max(f64::MIN_POSITIVE)
}

/// The learned step sizes of integrated dynamics (one, or one per head); empty for the others.
pub(crate) fn step_sizes<B: Backend>(dynamics: &QkDynamics<B>) -> Vec<f64> {
    dynamics.step_size().map_or_else(Vec::new, |step| {
        step.dt
            .val()
            .into_data()
            .convert::<f64>()
            .to_vec::<f64>()
            .expect("dt converts to f64")
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::dynamics::QkDynamics;
    use burn::module::Param;
    use burn::nn::Linear;
    use burn::tensor::backend::Backend;

    /// Makes the key projection a copy of the query projection and the coupling force `f` zero,
    /// so that one Euler step gives `q₁ = (1 + dt)·q₀`, `k₁ = k₀`: changes computable by hand.
    ///
    /// # Panics
    /// If the dynamics are not integrated ones.
    pub(crate) fn keys_equal_queries_and_no_force<B: Backend>(
        query: &Linear<B>,
        key: &mut Linear<B>,
        dynamics: &mut QkDynamics<B>,
    ) {
        // The same weights (a clone of a lazily initialised parameter would draw its own).
        key.weight = Param::from_tensor(query.weight.val());
        key.bias = query.bias.as_ref().map(|b| Param::from_tensor(b.val()));
        let QkDynamics::Coupled(dynamics) = dynamics else {
            panic!("integrated dynamics expected")
        };
        let f = &mut dynamics.coupling;
        f.w2 = Param::from_tensor(f.w2.val().zeros_like());
        f.b2 = Param::from_tensor(f.b2.val().zeros_like());
    }
}
