//! The step size `dt` of the query-key dynamics.

use crate::error::{ConfigError, or_panic};
use burn::config::Config;
use burn::module::{Module, Param};
use burn::tensor::{Tensor, backend::Backend};

/// Configuration of a [`StepSize`].
///
/// The paper learns `dt` but does not publish its parametrisation or initial value. We learn it
/// directly (`dt = θ`, so that `dt = 0`, standard attention, is reachable and the gradient is
/// plain) and start at `0.1`: one Euler step then moves each query by a tenth of its key, which
/// already adds a key–key similarity term `0.1·kᵢ·kⱼ` of the order of the initial scores (see
/// docs/integrators.md), while keeping the layer close to standard attention at initialisation.
#[derive(Config, Debug, PartialEq)]
pub struct StepSizeConfig {
    /// The initial value. Must be finite and non-negative (a negative step runs the dynamics
    /// backwards; the integrators support it, but as a starting point it is a mistake).
    #[config(default = 0.1)]
    pub init: f64,
    /// One step size per head instead of one per layer.
    #[config(default = false)]
    pub per_head: bool,
    /// Whether training updates `dt`. When false it stays at `init`.
    #[config(default = true)]
    pub learned: bool,
}

/// The step size of a layer's dynamics: one value per layer, or one per head.
#[derive(Module, Debug)]
pub struct StepSize<B: Backend> {
    /// `[1]` (per layer) or `[heads]` (per head).
    pub dt: Param<Tensor<B, 1>>,
}

impl StepSizeConfig {
    /// Checks the initial value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.init.is_finite() || self.init < 0.0 {
            return Err(ConfigError::new(
                "StepSizeConfig",
                "init",
                self.init,
                "the initial dt must be finite and >= 0",
            ));
        }
        Ok(())
    }

    /// Builds the step size for a layer of `n_heads` heads, or says which field is invalid.
    pub fn try_init<B: Backend>(
        &self,
        n_heads: usize,
        device: &B::Device,
    ) -> Result<StepSize<B>, ConfigError> {
        self.validate()?;
        let n = if self.per_head { n_heads } else { 1 };
        let dt = Param::from_tensor(Tensor::full([n], self.init, device));
        Ok(StepSize {
            dt: dt.set_require_grad(self.learned),
        })
    }

    /// Builds the step size for a layer of `n_heads` heads.
    ///
    /// # Panics
    /// If `init` is negative or not finite.
    pub fn init<B: Backend>(&self, n_heads: usize, device: &B::Device) -> StepSize<B> {
        or_panic(self.try_init(n_heads, device))
    }
}

impl<B: Backend> StepSize<B> {
    /// `dt` shaped to broadcast against `[batch, seq, heads, d_head]`: `[1, 1, 1 or heads, 1]`.
    pub fn broadcast(&self) -> Tensor<B, 4> {
        let [n] = self.dt.dims();
        self.dt.val().reshape([1, 1, n, 1])
    }
}
