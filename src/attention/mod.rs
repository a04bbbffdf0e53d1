//! The attention layers: coupled QK attention (with the standard and MLP-only baselines) and
//! differential attention. Both take an [`AttentionInput`], score with one scaled dot-product
//! function (`sdpa`: explicit, or the blockwise `flash` op under autodiff) and build their masks with one mask builder (`mask`).

#[cfg(feature = "autodiff")]
mod blockwise;
mod cache;
mod coupled;
mod differential;
#[cfg(feature = "autodiff")]
mod flash;
#[cfg(feature = "autodiff")]
pub(crate) mod host;
mod input;
mod kernel;
mod mask;
mod probe;
mod qk;
mod rotary;
mod sdpa;

#[cfg(feature = "autodiff")]
pub use blockwise::{BLOCK_FLOATS, default_block_rows};
pub use cache::{CoupledQkCache, KvCache};
pub use coupled::{CoupledQkAttention, CoupledQkAttentionConfig, QkStates};
pub use differential::{DifferentialAttention, DifferentialAttentionConfig};
#[cfg(feature = "autodiff")]
pub use flash::{FlashAttention, flash_attention};
pub use input::AttentionInput;
#[cfg(feature = "autodiff")]
pub use kernel::register_flash_attention;
pub use kernel::{AttentionKernel, UnknownKernel};
pub use probe::DynamicsStats;
pub use rotary::{RotaryConfig, RotaryPosition};
