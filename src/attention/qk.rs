//! The query/key path both attention layers share: the dynamics and the rotary embedding, in the
//! order [`RotaryPosition`] says, written once.

use super::rotary::{RotaryPosition, rotate};
use crate::dynamics::QkDynamics;
use burn::nn::RotaryEncoding;
use burn::tensor::{Tensor, backend::Backend};

/// Evolves `q` and `k` under `dynamics` and rotates them as positions `start..` (when `rope` is
/// given), before or after the dynamics as `position` says.
///
/// # Shapes
/// - `q`, `k`: token-major `[batch, seq, maps, width]` (where the dynamics run fastest)
/// - output: head-major `[batch, maps, seq, width]`
///
/// # Panics
/// If the positions exceed the rotary embedding's `max_seq_len`; the message starts with `layer`.
pub(crate) fn evolve_and_rotate<B: Backend>(
    layer: &str,
    dynamics: &QkDynamics<B>,
    rope: Option<&RotaryEncoding<B>>,
    position: RotaryPosition,
    (q, k): (Tensor<B, 4>, Tensor<B, 4>),
    start: usize,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    // RoPE needs head-major [.., seq, width].
    let rotate = |x: Tensor<B, 4>| match rope {
        Some(rope) => rotate(layer, rope, x, start),
        None => x,
    };
    match (rope, position) {
        (None, _) | (Some(_), RotaryPosition::AfterDynamics) => {
            let (q, k) = dynamics.forward(q, k);
            (rotate(to_heads(q)), rotate(to_heads(k)))
        }
        (Some(_), RotaryPosition::BeforeDynamics) => {
            let rotated = |x: Tensor<B, 4>| rotate(x.swap_dims(1, 2)).swap_dims(1, 2);
            let (q, k) = dynamics.forward(rotated(q), rotated(k));
            (to_heads(q), to_heads(k))
        }
    }
}

/// `[batch, seq, heads, d_head]` → `[batch, heads, seq, d_head]`, as a view.
///
/// The gradient that comes back through a transposition is a strided view, and the dynamics
/// use their inputs twice (`q` in the drift and in `f`, `k` in the drift and the kick): on Flex
/// every backward op on that view would take the strided path, several times slower than on
/// contiguous memory. The reshape round trip costs nothing forward and makes the backward pass
/// copy the gradient to token-major memory once, before it fans out.
pub(crate) fn to_heads<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 4> {
    let [batch, seq, heads, d_head] = x.dims();
    x.reshape([batch, seq, heads * d_head])
        .reshape([batch, seq, heads, d_head])
        .swap_dims(1, 2)
}
