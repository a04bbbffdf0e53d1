//! A GPT-style decoder assembled from the crate's attention layer.

mod config;
mod gpt;
mod loss;

pub use config::{GptConfig, NormKind, Positions, Preset};
pub use gpt::{Block, Gpt, Mlp, Norm};
pub use loss::masked_cross_entropy;
