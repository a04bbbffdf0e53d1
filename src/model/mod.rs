//! A GPT-style decoder assembled from the crate's attention layers.

mod config;
#[cfg(feature = "autodiff")]
mod fused_loss;
mod gelu;
mod generate;
mod gpt;
mod linear_loss;
mod loss;
mod variant;
#[cfg(feature = "safetensors")]
mod weights;

pub use config::{GptConfig, NormKind, Positions, Preset, UnknownPreset};
#[cfg(feature = "autodiff")]
pub use fused_loss::{FusedLoss, FusedOps, fused_linear_cross_entropy};
pub use generate::SamplerConfig;
pub use gpt::{Block, BlockAttention, Gpt, GptCache, Mlp, Norm};
pub use linear_loss::{
    CHUNK_FLOATS, default_chunk_rows, linear_cross_entropy, mask_ignored_targets,
};
pub use loss::masked_cross_entropy;
pub use variant::AttentionVariant;
#[cfg(feature = "safetensors")]
pub use weights::WeightsError;
