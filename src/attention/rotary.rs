//! Rotary position embedding (Burn's `RotaryEncoding`) as both attention layers configure,
//! validate and apply it.

use crate::error::ConfigError;
use burn::config::Config;
use burn::nn::{RotaryEncoding, RotaryEncodingConfig};
use burn::tensor::{Tensor, backend::Backend};
use serde::{Deserialize, Serialize};

/// Where the rotary embedding acts relative to the dynamics. The paper does not say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RotaryPosition {
    /// Rotate `q` and `k`, then evolve them: the dynamics see positions, and scores are no
    /// longer a function of relative position alone.
    BeforeDynamics,
    /// Evolve the content, then rotate: scores keep RoPE's relative-position property. Default.
    AfterDynamics,
}

/// Rotary position embedding (Burn's `RotaryEncoding`, one per layer, over each head's query and
/// key width).
#[derive(Config, Debug, PartialEq)]
pub struct RotaryConfig {
    /// The longest sequence (including cached positions) the layer will see.
    pub max_seq_len: usize,
    /// The RoPE base.
    #[config(default = 10000.0)]
    pub theta: f32,
    /// Before or after the dynamics.
    #[config(default = "RotaryPosition::AfterDynamics")]
    pub position: RotaryPosition,
}

impl RotaryConfig {
    /// Checks the config for rotating vectors of width `width` (named `width_name` in the
    /// error), as part of the config `config`.
    pub(crate) fn validate(
        &self,
        config: &'static str,
        width: usize,
        width_name: &str,
    ) -> Result<(), ConfigError> {
        if !width.is_multiple_of(2) {
            return Err(ConfigError::new(
                config,
                "rotary",
                format!("Some(..) with {width_name} = {width}"),
                format!("rotary embedding rotates pairs of dimensions: {width_name} must be even"),
            ));
        }
        if self.max_seq_len == 0 {
            return Err(ConfigError::new(
                config,
                "rotary.max_seq_len",
                0,
                "must be at least 1",
            ));
        }
        if !(self.theta.is_finite() && self.theta > 0.0) {
            return Err(ConfigError::new(
                config,
                "rotary.theta",
                self.theta,
                "must be finite and > 0",
            ));
        }
        Ok(())
    }

    /// Burn's embedding for vectors of width `width`.
    pub(crate) fn init<B: Backend>(&self, width: usize, device: &B::Device) -> RotaryEncoding<B> {
        RotaryEncodingConfig::new(self.max_seq_len, width)
            .with_theta(self.theta)
            .init(device)
    }
}

/// Rotates `x` as positions `start..start + seq`.
///
/// # Shapes
/// - `x`: `[batch, heads, seq, width]`, and the same on output.
///
/// # Panics
/// If the positions exceed the embedding's `max_seq_len`; the message starts with `layer`.
pub(crate) fn rotate<B: Backend>(
    layer: &str,
    rope: &RotaryEncoding<B>,
    x: Tensor<B, 4>,
    start: usize,
) -> Tensor<B, 4> {
    let max = rope.freq_complex.dims()[0];
    let end = start + x.dims()[2];
    assert!(
        end <= max,
        "{layer}: positions up to {end} exceed the rotary embedding's max_seq_len = {max}; \
         raise RotaryConfig::max_seq_len"
    );
    rope.apply(x, start)
}
