//! The masks both attention layers build: causality aligned at the bottom right (for cached
//! decoding) and the user's padding and attention masks combined into one. `true` means "masked
//! out", Burn's convention.

use burn::tensor::{Bool, Tensor, backend::Backend};

/// `0` where query `i` may see key `j` (`j ≤ i + s_k − s_q`), `−∞` where it may not.
///
/// # Shapes
/// - output: `[s_q, s_k]`
pub(crate) fn causal_bias<B: Backend>(s_q: usize, s_k: usize, device: &B::Device) -> Tensor<B, 2> {
    Tensor::<B, 2>::zeros([s_q, s_k], device)
        .mask_fill(future_mask(s_q, s_k, device), f32::NEG_INFINITY)
}

/// `true` where query `i` may not see key `j` (`j > i + s_k − s_q`): causality aligned at the
/// bottom right, so that the last queries of a cached decode see every earlier key.
///
/// # Shapes
/// - output: `[s_q, s_k]`
pub(crate) fn future_mask<B: Backend>(
    s_q: usize,
    s_k: usize,
    device: &B::Device,
) -> Tensor<B, 2, Bool> {
    Tensor::<B, 2, Bool>::tril_mask([s_q, s_k], s_k as i64 - s_q as i64, device)
}

/// One mask (`true`: masked out) from a padding mask `[batch, seq]` and an attention mask
/// `[batch, seq, seq]`, either optional, shared by every head: `[batch, 1, 1, seq]` for a padding
/// mask alone, `[batch, 1, seq, seq]` otherwise. Kept unbroadcast so that the flash kernel reads
/// it as it is; the scoring paths that need `[batch, heads, s_q, s_k]` expand it (a view).
///
/// # Panics
/// If a mask has another shape; the message starts with `layer`.
pub(crate) fn combine_masks<B: Backend>(
    layer: &str,
    mask_pad: Option<Tensor<B, 2, Bool>>,
    mask_attn: Option<Tensor<B, 3, Bool>>,
    [batch, seq]: [usize; 2],
) -> Option<Tensor<B, 4, Bool>> {
    let pad = mask_pad.map(|m| {
        assert_eq!(
            m.dims(),
            [batch, seq],
            "{layer}: expected mask_pad [batch, seq] = {:?}, got {:?}",
            [batch, seq],
            m.dims()
        );
        m.reshape([batch, 1, 1, seq])
    });
    let attn = mask_attn.map(|m| {
        assert_eq!(
            m.dims(),
            [batch, seq, seq],
            "{layer}: expected mask_attn [batch, seq, seq] = {:?}, got {:?}",
            [batch, seq, seq],
            m.dims()
        );
        m.reshape([batch, 1, seq, seq])
    });
    match (pad, attn) {
        (Some(pad), Some(attn)) => Some(pad.expand([batch, 1, seq, seq]).bool_or(attn)),
        (a, b) => a.or(b),
    }
}

/// `mask` broadcast to `[batch, heads, s_q, s_k]` (a view where the backend has them).
pub(crate) fn expand_mask<B: Backend>(
    mask: Option<Tensor<B, 4, Bool>>,
    full: [usize; 4],
) -> Option<Tensor<B, 4, Bool>> {
    mask.map(|m| if m.dims() == full { m } else { m.expand(full) })
}
