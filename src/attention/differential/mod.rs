//! Differential attention (Ye et al. 2024, *Differential Transformer*, arXiv:2410.05258, V1).

mod config;
mod layer;
mod probe;

pub use config::DifferentialAttentionConfig;
pub use layer::DifferentialAttention;
