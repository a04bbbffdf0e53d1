//! The attention layers: coupled QK attention (with the standard and MLP-only baselines) and
//! differential attention. Both take an [`AttentionInput`], score with one scaled dot-product
//! function (`sdpa`) and build their masks with one mask builder (`mask`).

mod cache;
mod coupled;
mod differential;
mod input;
mod mask;
mod probe;
mod rotary;
mod sdpa;

pub use cache::{CoupledQkCache, KvCache};
pub use coupled::{CoupledQkAttention, CoupledQkAttentionConfig, QkStates};
pub use differential::{DifferentialAttention, DifferentialAttentionConfig};
pub use input::AttentionInput;
pub use probe::DynamicsStats;
pub use rotary::{RotaryConfig, RotaryPosition};
