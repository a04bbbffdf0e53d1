//! Coupled QK attention (Gahtan & Bronstein, 2026): the layer, its config and its decoding cache.
//! The same layer is the standard and MLP-only baselines.

mod cache;
mod config;
mod layer;
mod probe;

pub use cache::CoupledQkCache;
pub use config::CoupledQkAttentionConfig;
pub use layer::CoupledQkAttention;
pub use probe::{DynamicsStats, QkStates};
