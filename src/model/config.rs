use super::gpt::{Block, BlockAttention, Gpt, Mlp, Norm};
use super::variant::AttentionVariant;
use crate::attention::{
    CoupledQkAttentionConfig, DifferentialAttentionConfig, RotaryConfig, RotaryPosition,
};
use crate::dynamics::DynamicsConfig;
use crate::error::{ConfigError, or_panic};
use crate::step_size::StepSizeConfig;
use burn::config::Config;
use burn::module::Initializer;
use burn::nn::{EmbeddingConfig, LayerNormConfig, LinearConfig, RmsNormConfig};
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// How the model knows positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Positions {
    /// A learned embedding per position, added to the token embedding (GPT-2).
    Learned,
    /// Rotary embedding inside every attention layer.
    Rotary,
}

/// The normalisation of the pre-norm blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NormKind {
    /// Burn's `LayerNorm` (GPT-2).
    LayerNorm,
    /// Burn's `RmsNorm`.
    RmsNorm,
}

/// The model sizes of the experiments. The paper gives parameter counts, not shapes: these are
/// our reconstruction (see docs/).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Preset {
    /// d_model 128, 4 layers, 4 × 32 heads, context 256: CPU-scale runs.
    #[serde(rename = "tiny")]
    Tiny,
    /// d_model 192, 8 layers, 6 × 32 heads, context 256: one step up from `tiny` at CPU scale
    /// (about 4× its parameters, twice its depth).
    #[serde(rename = "small")]
    Small,
    /// d_model 576, 8 layers, 9 × 64 heads, context 512 (≈60.9M parameters with GPT-2's vocabulary).
    #[serde(rename = "60m")]
    M60,
    /// d_model 768, 16 layers, 12 × 64 heads, context 1024.
    #[serde(rename = "150m")]
    M150,
    /// d_model 1024, 24 layers, 16 × 64 heads, context 1024.
    #[serde(rename = "350m")]
    M350,
}

/// A preset name that is not one of [`Preset`]'s.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown preset `{0}`: expected tiny, small, 60m, 150m or 350m")]
pub struct UnknownPreset(pub String);

impl FromStr for Preset {
    type Err = UnknownPreset;
    fn from_str(s: &str) -> Result<Self, UnknownPreset> {
        match s {
            "tiny" => Ok(Self::Tiny),
            "small" => Ok(Self::Small),
            "60m" => Ok(Self::M60),
            "150m" => Ok(Self::M150),
            "350m" => Ok(Self::M350),
            other => Err(UnknownPreset(other.to_string())),
        }
    }
}

/// Configuration of a [`Gpt`] decoder.
#[derive(Config, Debug)]
pub struct GptConfig {
    /// The vocabulary size.
    pub vocab_size: usize,
    /// The model width.
    pub d_model: usize,
    /// The number of blocks.
    pub n_layers: usize,
    /// The attention heads per block.
    pub n_heads: usize,
    /// The longest sequence the model reads.
    pub context: usize,
    /// The attention layer of every block: coupled QK attention with its dynamics (default: one
    /// Euler step), a baseline, or differential attention.
    #[config(default = "AttentionVariant::default()")]
    pub attention: AttentionVariant,
    /// The step size of the coupled variants.
    #[config(default = "StepSizeConfig::new()")]
    pub dt: StepSizeConfig,
    /// The coupling net's hidden width (`None`: `d_head`).
    #[config(default = "None")]
    pub coupling_hidden: Option<usize>,
    /// One coupling net per head instead of one shared by a layer's heads (the paper's setting;
    /// coupled attention only).
    #[config(default = false)]
    pub coupling_per_head: bool,
    /// Learned positions (GPT-2) or rotary.
    #[config(default = "Positions::Learned")]
    pub positions: Positions,
    /// With rotary positions: before or after the dynamics.
    #[config(default = "RotaryPosition::AfterDynamics")]
    pub rotary_position: RotaryPosition,
    /// LayerNorm (GPT-2) or RmsNorm.
    #[config(default = "NormKind::LayerNorm")]
    pub norm: NormKind,
    /// The MLP's hidden width as a multiple of `d_model`; 0 removes the MLP (attention-only
    /// blocks, Zoology's MQAR setting).
    #[config(default = 4)]
    pub mlp_ratio: usize,
    /// Share the LM head's weights with the token embedding.
    #[config(default = true)]
    pub tie_embeddings: bool,
    /// Dropout on attention weights.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// The MLP's GELU as GPT-2's tanh approximation (`gelu_new`) instead of the exact erf form.
    #[config(default = false)]
    pub gelu_tanh: bool,
    /// The epsilon of every LayerNorm or RmsNorm (GPT-2's 1e-5, Burn's default).
    #[config(default = 1e-5)]
    pub norm_epsilon: f64,
}

const NAME: &str = "GptConfig";
/// GPT-2's initialisation: N(0, 0.02).
const INIT_STD: f64 = 0.02;

impl GptConfig {
    /// A preset's shape for a vocabulary of `vocab_size` (the tokenizer decides it).
    pub fn preset(preset: Preset, vocab_size: usize) -> Self {
        let (d_model, n_layers, n_heads, context) = match preset {
            Preset::Tiny => (128, 4, 4, 256),
            Preset::Small => (192, 8, 6, 256),
            Preset::M60 => (576, 8, 9, 512),
            Preset::M150 => (768, 16, 12, 1024),
            Preset::M350 => (1024, 24, 16, 1024),
        };
        Self::new(vocab_size, d_model, n_layers, n_heads, context)
    }

    /// The shape and choices of Hugging Face's GPT-2 (learned positions, LayerNorm ε 1e-5, the
    /// tanh GELU, an MLP of 4×, a tied head) with standard attention: the model a GPT-2
    /// checkpoint loads into (see `Gpt::load_gpt2_safetensors`, feature `safetensors`). Set
    /// `attention` (and `dt`) afterwards to retrofit coupling; `dt = 0` keeps its outputs.
    pub fn gpt2(
        vocab_size: usize,
        context: usize,
        d_model: usize,
        n_layers: usize,
        n_heads: usize,
    ) -> Self {
        Self::new(vocab_size, d_model, n_layers, n_heads, context)
            .with_attention(AttentionVariant::Coupled(DynamicsConfig::Standard))
            .with_gelu_tanh(true)
    }

    /// The config of every block's coupled attention layer, with these dynamics.
    pub fn coupled_attention(&self, dynamics: &DynamicsConfig) -> CoupledQkAttentionConfig {
        CoupledQkAttentionConfig::new(self.d_model, self.n_heads)
            .with_dynamics(dynamics.clone())
            .with_dt(self.dt.clone())
            .with_coupling_hidden(self.coupling_hidden)
            .with_coupling_per_head(self.coupling_per_head)
            .with_rotary(self.rotary())
            .with_causal(true)
            .with_dropout(self.dropout)
            .with_initializer(normal(INIT_STD))
    }

    /// The number of differential heads: `n_heads / 2` when `n_heads` is even (Ye et al.: half
    /// the heads, each query/key map as wide as a standard head, `d_map = d_head`), else
    /// `n_heads` with maps of half a standard head (`d_map = d_head / 2`). The second case is
    /// this crate's, for presets with an odd head count (the 60m preset has 9 heads); both keep
    /// the projections of the standard layer.
    pub fn differential_heads(&self) -> usize {
        if self.n_heads.is_multiple_of(2) {
            self.n_heads / 2
        } else {
            self.n_heads
        }
    }

    /// The config of block `layer_index`'s differential attention layer with these dynamics;
    /// see [`differential_heads`](Self::differential_heads).
    pub fn differential_attention(
        &self,
        dynamics: &DynamicsConfig,
        layer_index: usize,
    ) -> DifferentialAttentionConfig {
        DifferentialAttentionConfig::new(self.d_model, self.differential_heads())
            .with_layer_index(layer_index)
            .with_dynamics(dynamics.clone())
            .with_dt(self.dt.clone())
            .with_coupling_hidden(self.coupling_hidden)
            .with_rotary(self.rotary())
            .with_causal(true)
            .with_dropout(self.dropout)
            .with_initializer(normal(INIT_STD))
    }

    fn rotary(&self) -> Option<RotaryConfig> {
        (self.positions == Positions::Rotary)
            .then(|| RotaryConfig::new(self.context).with_position(self.rotary_position))
    }

    /// Checks every field, the attention layer's included.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.norm_epsilon > 0.0 && self.norm_epsilon.is_finite()) {
            return Err(ConfigError::new(
                NAME,
                "norm_epsilon",
                self.norm_epsilon,
                "must be positive and finite",
            ));
        }
        for (field, value) in [
            ("vocab_size", self.vocab_size),
            ("n_layers", self.n_layers),
            ("context", self.context),
        ] {
            if value == 0 {
                return Err(ConfigError::new(NAME, field, 0, "must be at least 1"));
            }
        }
        match &self.attention {
            AttentionVariant::Coupled(dynamics) => self.coupled_attention(dynamics).validate(),
            AttentionVariant::Differential(_) if self.coupling_per_head => Err(ConfigError::new(
                NAME,
                "coupling_per_head",
                true,
                "is an option of coupled attention; differential attention shares one coupling \
                 net per layer",
            )),
            AttentionVariant::Differential(dynamics) => {
                self.differential_attention(dynamics, 0).validate()
            }
        }
    }

    /// Block `layer_index`'s attention layer, as `attention` says: the one place that decides.
    /// Its output projection (into the residual stream) is initialised with `residual`.
    fn init_attention<B: Backend>(
        &self,
        layer_index: usize,
        residual: &Initializer,
        device: &B::Device,
    ) -> Result<BlockAttention<B>, ConfigError> {
        let d = self.d_model;
        let output = || {
            LinearConfig::new(d, d)
                .with_initializer(residual.clone())
                .init(device)
        };
        Ok(match &self.attention {
            AttentionVariant::Coupled(dynamics) => {
                let mut attention = self.coupled_attention(dynamics).try_init(device)?;
                attention.output = output();
                BlockAttention::Coupled(attention)
            }
            AttentionVariant::Differential(dynamics) => {
                let mut attention = self
                    .differential_attention(dynamics, layer_index)
                    .try_init(device)?;
                attention.output = output();
                BlockAttention::Differential(attention)
            }
        })
    }

    /// Builds the model, or says which field is invalid.
    pub fn try_init<B: Backend>(&self, device: &B::Device) -> Result<Gpt<B>, ConfigError> {
        self.validate()?;
        let d = self.d_model;
        // GPT-2 scales the init of the projections into the residual stream by 1/√(2·layers).
        let residual = normal(INIT_STD / (2.0 * self.n_layers as f64).sqrt());
        let norm = || match self.norm {
            NormKind::LayerNorm => Norm::Layer(
                LayerNormConfig::new(d)
                    .with_epsilon(self.norm_epsilon)
                    .init(device),
            ),
            NormKind::RmsNorm => Norm::Rms(
                RmsNormConfig::new(d)
                    .with_epsilon(self.norm_epsilon)
                    .init(device),
            ),
        };
        let blocks = (0..self.n_layers)
            .map(|layer_index| {
                let attention = self.init_attention(layer_index, &residual, device)?;
                let mlp = (self.mlp_ratio > 0).then(|| Mlp {
                    up: LinearConfig::new(d, self.mlp_ratio * d)
                        .with_initializer(normal(INIT_STD))
                        .init(device),
                    down: LinearConfig::new(self.mlp_ratio * d, d)
                        .with_initializer(residual.clone())
                        .init(device),
                    gelu: match self.gelu_tanh {
                        true => burn::nn::Gelu::new_approximate(),
                        false => burn::nn::Gelu::new(),
                    },
                });
                Ok(Block {
                    norm_attention: norm(),
                    attention,
                    norm_mlp: mlp.as_ref().map(|_| norm()),
                    mlp,
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let embedding = |n| {
            EmbeddingConfig::new(n, d)
                .with_initializer(normal(INIT_STD))
                .init(device)
        };
        Ok(Gpt {
            tokens: embedding(self.vocab_size),
            positions: (self.positions == Positions::Learned).then(|| embedding(self.context)),
            blocks,
            norm: norm(),
            head: (!self.tie_embeddings).then(|| {
                LinearConfig::new(d, self.vocab_size)
                    .with_bias(false)
                    .with_initializer(normal(INIT_STD))
                    .init(device)
            }),
            context: self.context,
        })
    }

    /// Builds the model.
    ///
    /// # Panics
    /// If a field is invalid.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Gpt<B> {
        or_panic(self.try_init(device))
    }
}

fn normal(std: f64) -> Initializer {
    Initializer::Normal { mean: 0.0, std }
}
