//! The attention layers and their parts: coupled QK attention (with the standard and MLP-only
//! baselines) and differential attention.

mod cache;
mod config;
mod differential;
mod layer;
mod scores;

pub use cache::CoupledQkCache;
pub use config::{CoupledQkAttentionConfig, RotaryConfig, RotaryPosition};
pub use differential::{DifferentialAttention, DifferentialAttentionConfig};
pub use layer::{AttentionInput, CoupledQkAttention};
