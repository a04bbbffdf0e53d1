//! A GPT-style decoder assembled from the crate's attention layers.

mod config;
mod generate;
mod gpt;
mod loss;
mod variant;
#[cfg(feature = "safetensors")]
mod weights;

pub use config::{GptConfig, NormKind, Positions, Preset};
pub use generate::SamplerConfig;
pub use gpt::{Block, BlockAttention, Gpt, GptCache, Mlp, Norm};
pub use loss::masked_cross_entropy;
pub use variant::AttentionVariant;
#[cfg(feature = "safetensors")]
pub use weights::WeightsError;
