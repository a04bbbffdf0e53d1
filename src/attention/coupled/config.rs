use super::CoupledQkAttention;
use crate::attention::input::{validate_heads_and_dropout, validate_kernel};
use crate::attention::kernel::AttentionKernel;
use crate::attention::rotary::{RotaryConfig, RotaryPosition};
use crate::coupling::CouplingNetConfig;
use crate::dynamics::{DynamicsConfig, QkDynamics};
use crate::error::{ConfigError, or_panic};
use crate::step_size::StepSizeConfig;
use burn::config::Config;
use burn::module::Initializer;
use burn::nn::{DropoutConfig, LinearConfig};
use burn::tensor::backend::Backend;

/// Configuration of a [`CoupledQkAttention`] layer, built by [`init`](Self::init).
///
/// Every choice the paper leaves open is a field with a documented default.
#[derive(Config, Debug)]
pub struct CoupledQkAttentionConfig {
    /// The model width.
    pub d_model: usize,
    /// The number of heads; `d_head = d_model / n_heads`.
    pub n_heads: usize,
    /// Standard, MLP-only or coupled (integrator and steps). Default: one Euler step (`euler1`).
    #[config(default = "DynamicsConfig::default()")]
    pub dynamics: DynamicsConfig,
    /// The coupling net's hidden width; `None` means `d_head`.
    #[config(default = "None")]
    pub coupling_hidden: Option<usize>,
    /// One coupling net per head instead of one shared by the layer's heads (the paper's setting).
    #[config(default = false)]
    pub coupling_per_head: bool,
    /// The step size `dt`: initial value, per layer or per head, learned or fixed.
    #[config(default = "StepSizeConfig::new()")]
    pub dt: StepSizeConfig,
    /// Rotary position embedding, if any.
    #[config(default = "None")]
    pub rotary: Option<RotaryConfig>,
    /// Mask future positions (decoder self-attention).
    #[config(default = false)]
    pub causal: bool,
    /// Dropout on the attention weights, in `[0, 1)`; 0 with the flash kernel.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// How scores are computed under autodiff: explicit (default) or flash (memory linear in the
    /// sequence length; see [`AttentionKernel`]).
    #[config(default = "AttentionKernel::Explicit")]
    pub kernel: AttentionKernel,
    /// Bias in the q/k/v/output projections.
    #[config(default = true)]
    pub bias: bool,
    /// The initializer of the projections (the one of burn-nn's `MultiHeadAttention`).
    #[config(default = "Initializer::KaimingUniform{gain:0.5773502691896258, fan_out_only:false}")]
    pub initializer: Initializer,
}

const NAME: &str = "CoupledQkAttentionConfig";

impl CoupledQkAttentionConfig {
    /// `d_model / n_heads`.
    pub fn d_head(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// The config of the layer's coupling net.
    pub fn coupling(&self) -> CouplingNetConfig {
        CouplingNetConfig::new(self.d_head())
            .with_d_hidden(self.coupling_hidden)
            .with_n_nets(if self.coupling_per_head {
                self.n_heads
            } else {
                1
            })
    }

    /// Checks every field; the error names the field, its value and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_heads_and_dropout(NAME, self.d_model, self.n_heads, 1, self.dropout)?;
        validate_kernel(NAME, self.kernel, self.dropout)?;
        if let Some(rotary) = &self.rotary {
            rotary.validate(NAME, self.d_head(), "d_head")?;
        }
        self.dynamics.validate()?;
        if self.dynamics.has_coupling_net() {
            self.coupling().validate()?;
        }
        if matches!(self.dynamics, DynamicsConfig::Coupled { .. }) {
            self.dt.validate()?;
        }
        Ok(())
    }

    /// Builds the layer, or says which field is invalid.
    pub fn try_init<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<CoupledQkAttention<B>, ConfigError> {
        self.validate()?;
        let linear = || {
            LinearConfig::new(self.d_model, self.d_model)
                .with_bias(self.bias)
                .with_initializer(self.initializer.clone())
                .init(device)
        };
        let rotary = self.rotary.as_ref().map(|r| r.init(self.d_head(), device));
        Ok(CoupledQkAttention {
            query: linear(),
            key: linear(),
            value: linear(),
            output: linear(),
            dynamics: QkDynamics::try_init(
                &self.dynamics,
                &self.coupling(),
                &self.dt,
                self.n_heads,
                device,
            )?,
            rotary,
            rotary_position: self
                .rotary
                .as_ref()
                .map_or(RotaryPosition::AfterDynamics, |r| r.position),
            dropout: DropoutConfig::new(self.dropout).init(),
            n_heads: self.n_heads,
            d_head: self.d_head(),
            causal: self.causal,
            kernel: self.kernel,
        })
    }

    /// Builds the layer.
    ///
    /// # Panics
    /// If a field is invalid, with the message of [`validate`](Self::validate).
    pub fn init<B: Backend>(&self, device: &B::Device) -> CoupledQkAttention<B> {
        or_panic(self.try_init(device))
    }
}
