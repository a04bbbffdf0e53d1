//! Coupled QK attention (Gahtan & Bronstein, 2026): the layer, its config and what its dynamics
//! do (the probe). The same layer is the standard and MLP-only baselines.

mod config;
mod layer;
mod probe;

pub use config::CoupledQkAttentionConfig;
pub use layer::CoupledQkAttention;
pub use probe::QkStates;
