use super::DifferentialAttention;
use crate::attention::input::{validate_heads_and_dropout, validate_kernel};
use crate::attention::kernel::AttentionKernel;
use crate::attention::{RotaryConfig, RotaryPosition};
use crate::coupling::CouplingNetConfig;
use crate::dynamics::{DynamicsConfig, QkDynamics};
use crate::error::{ConfigError, or_panic};
use crate::step_size::StepSizeConfig;
use burn::config::Config;
use burn::module::Initializer;
use burn::nn::{DropoutConfig, LinearConfig, RmsNormConfig};
use burn::tensor::backend::Backend;

/// Configuration of a [`DifferentialAttention`] layer (Ye et al. 2024), built by
/// [`init`](Self::init).
///
/// The geometry follows the reference code: `n_heads` differential heads, each with two query
/// maps and two key maps of width `d_map = d_model / (2·n_heads)` and a value of width `2·d_map`,
/// so that all four projections are `d_model → d_model` as in a standard layer. To replace a
/// standard layer of `h` heads of width `d_head`, Ye et al. use `h/2` differential heads
/// (`d_map = d_head`).
#[derive(Config, Debug)]
pub struct DifferentialAttentionConfig {
    /// The model width.
    pub d_model: usize,
    /// The number of differential heads; `d_map = d_model / (2·n_heads)`.
    pub n_heads: usize,
    /// The layer's depth, 0-based: it sets `λ_init = 0.8 − 0.6·exp(−0.3·layer_index)`.
    #[config(default = 0)]
    pub layer_index: usize,
    /// The standard deviation of the normal initialisation (mean 0) of the four λ vectors; 0.1
    /// in the reference code.
    #[config(default = 0.1)]
    pub lambda_std: f64,
    /// The epsilon of the per-head RMSNorm (1e-5 in the reference code).
    #[config(default = 1e-5)]
    pub norm_epsilon: f64,
    /// Rotary position embedding over `d_map` (each query and key map rotated separately, as
    /// in the reference code), if any; its `position` says whether it acts before or after the
    /// dynamics.
    #[config(default = "None")]
    pub rotary: Option<RotaryConfig>,
    /// Query-key dynamics applied to each of the two query/key map pairs of every head before
    /// scoring, as a coupled layer applies them to its heads: MLP-only, Euler or leapfrog
    /// integration, or the affine coupling. `Standard` (the default) is plain differential
    /// attention.
    #[config(default = "DynamicsConfig::Standard")]
    pub dynamics: DynamicsConfig,
    /// The coupling net's hidden width; `None` means `d_map`. One net serves every map of the
    /// layer.
    #[config(default = "None")]
    pub coupling_hidden: Option<usize>,
    /// The step size `dt` of integrated dynamics.
    #[config(default = "StepSizeConfig::new()")]
    pub dt: StepSizeConfig,
    /// Mask future positions (decoder self-attention).
    #[config(default = false)]
    pub causal: bool,
    /// Dropout on the differential attention map `A₁ − λ·A₂`, in `[0, 1)` (the reference code
    /// has none).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// How scores are computed under autodiff: explicit (default) or flash (two flash
    /// attentions, `A₁·V − λ·A₂·V`; see [`AttentionKernel`]).
    #[config(default = "AttentionKernel::Explicit")]
    pub kernel: AttentionKernel,
    /// Bias in the q/k/v/output projections (the reference code has none; the default matches
    /// the crate's [`CoupledQkAttention`](crate::CoupledQkAttention), so that the projections of
    /// both layers have the same parameters).
    #[config(default = true)]
    pub bias: bool,
    /// The initializer of the projections (the one of burn-nn's `MultiHeadAttention`).
    #[config(default = "Initializer::KaimingUniform{gain:0.5773502691896258, fan_out_only:false}")]
    pub initializer: Initializer,
}

const NAME: &str = "DifferentialAttentionConfig";

impl DifferentialAttentionConfig {
    /// The width of each query and key map, `d_model / (2·n_heads)`; each head's value is
    /// `2·d_map` wide.
    pub fn d_map(&self) -> usize {
        self.d_model / (2 * self.n_heads.max(1))
    }

    /// `λ_init = 0.8 − 0.6·exp(−0.3·layer_index)`, Ye et al.'s schedule (0-based layers).
    pub fn lambda_init(&self) -> f64 {
        0.8 - 0.6 * (-0.3 * self.layer_index as f64).exp()
    }

    /// The parameters the layer adds over a standard attention layer with the same projections:
    /// the four λ vectors (`4·d_map`) and the RMSNorm's weight (`2·d_map`), without those of the
    /// dynamics.
    pub fn extra_num_params(&self) -> usize {
        6 * self.d_map()
    }

    /// The config of the dynamics' coupling net, `d_map → hidden → d_map`.
    pub fn coupling(&self) -> CouplingNetConfig {
        CouplingNetConfig::new(self.d_map()).with_d_hidden(self.coupling_hidden)
    }

    /// Checks every field; the error names the field, its value and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_heads_and_dropout(NAME, self.d_model, self.n_heads, 2, self.dropout)?;
        validate_kernel(NAME, self.kernel, self.dropout)?;
        if !(self.lambda_std.is_finite() && self.lambda_std >= 0.0) {
            return Err(ConfigError::new(
                NAME,
                "lambda_std",
                self.lambda_std,
                "must be finite and >= 0",
            ));
        }
        if !(self.norm_epsilon.is_finite() && self.norm_epsilon > 0.0) {
            return Err(ConfigError::new(
                NAME,
                "norm_epsilon",
                self.norm_epsilon,
                "must be finite and > 0",
            ));
        }
        if let Some(rotary) = &self.rotary {
            rotary.validate(NAME, self.d_map(), "d_map")?;
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
    ) -> Result<DifferentialAttention<B>, ConfigError> {
        self.validate()?;
        let d_map = self.d_map();
        let linear = || {
            LinearConfig::new(self.d_model, self.d_model)
                .with_bias(self.bias)
                .with_initializer(self.initializer.clone())
                .init(device)
        };
        let lambda = || {
            Initializer::Normal {
                mean: 0.0,
                std: self.lambda_std,
            }
            .init([d_map], device)
        };
        Ok(DifferentialAttention {
            query: linear(),
            key: linear(),
            value: linear(),
            output: linear(),
            lambda_q1: lambda(),
            lambda_k1: lambda(),
            lambda_q2: lambda(),
            lambda_k2: lambda(),
            norm: RmsNormConfig::new(2 * d_map)
                .with_epsilon(self.norm_epsilon)
                .init(device),
            rotary: self.rotary.as_ref().map(|r| r.init(d_map, device)),
            rotary_position: self
                .rotary
                .as_ref()
                .map_or(RotaryPosition::AfterDynamics, |r| r.position),
            // The two maps of every head are `2·n_heads` "heads" of width d_map to the dynamics.
            dynamics: QkDynamics::try_init(
                &self.dynamics,
                &self.coupling(),
                &self.dt,
                2 * self.n_heads,
                device,
            )?,
            dropout: DropoutConfig::new(self.dropout).init(),
            n_heads: self.n_heads,
            d_map,
            lambda_init: self.lambda_init(),
            causal: self.causal,
            kernel: self.kernel,
        })
    }

    /// Builds the layer.
    ///
    /// # Panics
    /// If a field is invalid, with the message of [`validate`](Self::validate).
    pub fn init<B: Backend>(&self, device: &B::Device) -> DifferentialAttention<B> {
        or_panic(self.try_init(device))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lambda_init_follows_the_schedule_of_ye_et_al() {
        // λ_init = 0.8 − 0.6·exp(−0.3·l):
        // l = 0: 0.8 − 0.6·1                     = 0.2
        // l = 1: 0.8 − 0.6·0.740818220681717866 = 0.8 − 0.444490932409030720 = 0.355509067590969280
        // l = 5: 0.8 − 0.6·0.223130160148429829 = 0.8 − 0.133878096089057897 = 0.666121903910942103
        for (layer, expected) in [
            (0, 0.2),
            (1, 0.355_509_067_590_969_3),
            (5, 0.666_121_903_910_942_1),
        ] {
            let got = DifferentialAttentionConfig::new(8, 1)
                .with_layer_index(layer)
                .lambda_init();
            assert!((got - expected).abs() < 1e-12, "layer {layer}: {got}");
        }
    }

    #[test]
    fn invalid_fields_are_named() {
        let field = |c: DifferentialAttentionConfig| c.validate().unwrap_err().field;
        assert_eq!(field(DifferentialAttentionConfig::new(0, 1)), "d_model");
        assert_eq!(field(DifferentialAttentionConfig::new(8, 0)), "n_heads");
        // 12 = 2·3·2 is fine, 12 / (2·4) is not whole.
        assert!(DifferentialAttentionConfig::new(12, 3).validate().is_ok());
        let err = DifferentialAttentionConfig::new(12, 4)
            .validate()
            .unwrap_err();
        assert_eq!(err.field, "d_model");
        assert!(err.to_string().contains("2·n_heads = 8"), "{err}");
        assert_eq!(
            field(DifferentialAttentionConfig::new(8, 1).with_dropout(1.0)),
            "dropout"
        );
        assert_eq!(
            field(DifferentialAttentionConfig::new(8, 1).with_norm_epsilon(0.0)),
            "norm_epsilon"
        );
        assert_eq!(
            field(DifferentialAttentionConfig::new(8, 1).with_lambda_std(f64::NAN)),
            "lambda_std"
        );
        // d_map = 12 / (2·2) = 3: odd, cannot be rotated.
        assert_eq!(
            field(DifferentialAttentionConfig::new(12, 2).with_rotary(Some(RotaryConfig::new(8)))),
            "rotary"
        );
    }
}
