//! The attention layer and its parts.

mod cache;
mod config;
mod layer;
mod scores;

pub use cache::CoupledQkCache;
pub use config::{CoupledQkAttentionConfig, RotaryConfig, RotaryPosition};
pub use layer::{AttentionInput, CoupledQkAttention};
