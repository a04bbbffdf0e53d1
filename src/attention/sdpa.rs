//! Scaled dot-product scoring: the one place that turns evolved queries and keys into context.

use super::kernel::{AttentionKernel, FlashFn, flash_for};
use super::mask::{causal_bias, expand_mask, future_mask};
use burn::nn::Dropout;
use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, FloatDType, Tensor, backend::Backend};

/// `softmax(q·kᵀ/√d_head + mask)·v`, with `true` in `mask` meaning "masked out".
///
/// With `causal`, query `i` of `s_q` sees keys up to `i + s_k − s_q` (aligned at the bottom right,
/// so that the last queries of a cached decode see every earlier key). A row with every key masked
/// yields zeros, not NaN.
///
/// Without autodiff it uses Burn's `attention` op (fused where the backend has a kernel). Under
/// autodiff the `kernel` decides: [`AttentionKernel::Flash`] calls the backend's flash op
/// ([`flash_attention`](super::flash_attention)), which keeps no `[s_q, s_k]` tensor for the
/// backward pass; [`AttentionKernel::Explicit`] scores explicitly, because Burn's autodiff
/// decomposes its op anyway, and its decomposition expands the causal mask to
/// `[batch, heads, s_q, s_k]` and copies it in a masked fill forward and backward, and
/// differentiates through the softmax's max shift. The explicit path adds the causal mask as a
/// broadcast `[s_q, s_k]` bias (free in the backward pass) and uses `softmax`, whose shift is
/// detached; it also applies attention dropout, which the op has not.
///
/// # Shapes
/// - `q`: `[batch, heads, s_q, d_head]`; `k`, `v`: `[batch, heads, s_k, d_head]`
/// - `mask`: `[batch or 1, heads or 1, s_q or 1, s_k]`
/// - output: `[batch, heads, s_q, d_head]`
///
/// # Panics
/// With [`AttentionKernel::Flash`] under an autodiff backend that has no flash op registered (see
/// [`register_flash_attention`](super::register_flash_attention)).
pub(crate) fn attend<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    causal: bool,
    dropout: &Dropout,
    kernel: AttentionKernel,
) -> Tensor<B, 4> {
    let device = q.device();
    if B::ad_enabled(&device) {
        return match kernel {
            AttentionKernel::Explicit => attend_explicit(q, k, v, mask, causal, dropout),
            AttentionKernel::Flash => flash::<B>(&device)(q, k, v, mask, causal),
        };
    }
    let [batch, heads, s_q, _] = q.dims();
    let s_k = k.dims()[2];
    let full = [batch, heads, s_q, s_k];
    let mask = expand_mask(mask, full);
    // Burn's `is_causal` leaves the alignment to the kernel: its fallback aligns at the bottom
    // right, as this crate does, but cubek's flash kernel (which the autotuner may pick on CUDA
    // or a real WGPU adapter) masks from the top left, which for a cached decode (`s_q < s_k`)
    // would hide every key but the first. There the causal structure goes in as a mask.
    let (mask, is_causal) = match causal && s_q < s_k {
        true => {
            let future = future_mask::<B>(s_q, s_k, &device)
                .reshape([1, 1, s_q, s_k])
                .expand(full);
            let mask = match mask {
                Some(mask) => mask.bool_or(future),
                None => future,
            };
            (Some(mask), false)
        }
        false => (mask, causal),
    };
    let options = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal,
    };
    attention(q, k, v, mask, None, options)
}

/// The flash op of `B`.
///
/// # Panics
/// If `B` has none registered, naming the backend and the remedy.
pub(crate) fn flash<B: Backend>(device: &B::Device) -> FlashFn<B> {
    flash_for::<B>().unwrap_or_else(|| {
        panic!(
            "AttentionKernel::Flash: the autodiff backend {} ({}) has no flash attention op \
             registered; call coupled_qk::attention::register_flash_attention::<YourBackend>() once \
             before training (every burn::backend::Autodiff<B, C> has the op), or use \
             AttentionKernel::Explicit",
            B::name(device),
            std::any::type_name::<B>()
        )
    })
}

/// The explicit path: scores, masks, NaN-safe softmax, dropout on the weights.
pub(crate) fn attend_explicit<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    causal: bool,
    dropout: &Dropout,
) -> Tensor<B, 4> {
    dropout
        .forward(attention_weights(q, k, mask, causal))
        .matmul(v)
}

/// `softmax(q·kᵀ/√d + mask)`, the attention weights, masked as in [`attend`] (causal aligned at
/// the bottom right; a row with every key masked is all zeros, not NaN).
///
/// # Shapes
/// - `q`: `[batch, heads, s_q, d]`; `k`: `[batch, heads, s_k, d]`
/// - `mask`: `[batch or 1, heads or 1, s_q or 1, s_k]`
/// - output: `[batch, heads, s_q, s_k]`
pub(crate) fn attention_weights<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    causal: bool,
) -> Tensor<B, 4> {
    let [batch, heads, s_q, d_head] = q.dims();
    let s_k = k.dims()[2];
    let mask = expand_mask(mask, [batch, heads, s_q, s_k]);
    let scores = q
        .matmul(k.swap_dims(2, 3))
        .mul_scalar(1.0 / (d_head as f64).sqrt()); // [batch, heads, s_q, s_k]
    if mask.is_none() && (!causal || s_k >= s_q) {
        // No row can be fully masked: every query sees at least the key at its own position.
        let scores = match causal {
            // Flat rows of s_q·s_k: Flex adds a bias shared by every row with one SIMD pass,
            // while a [1, 1, s_q, s_k] bias takes its strided path (~10% of a training step).
            true => {
                let bias = causal_bias::<B>(s_q, s_k, &scores.device())
                    .cast(FloatDType::from(scores.dtype()))
                    .reshape([1, s_q * s_k]);
                (scores.reshape([batch * heads, s_q * s_k]) + bias)
                    .reshape([batch, heads, s_q, s_k])
            }
            false => scores,
        };
        return softmax(scores, 3);
    }
    let mask = match (mask, causal) {
        (mask, false) => mask,
        (mask, true) => {
            let future = future_mask::<B>(s_q, s_k, &scores.device())
                .unsqueeze::<4>()
                .expand([batch, heads, s_q, s_k]);
            Some(match mask {
                Some(mask) => mask.bool_or(future),
                None => future,
            })
        }
    };
    match mask {
        None => softmax(scores, 3),
        Some(mask) => {
            // A row with every key masked would be softmax(-inf, …) = NaN: score it as zeros
            // (finite), then zero its weights.
            let dead = mask.clone().all_dim(3); // [batch, heads, s_q, 1]
            let scores = scores
                .mask_fill(mask, f32::NEG_INFINITY)
                .mask_fill(dead.clone().expand([batch, heads, s_q, s_k]), 0.0);
            softmax(scores, 3).mask_fill(dead.expand([batch, heads, s_q, s_k]), 0.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::nn::DropoutConfig;
    use burn::tensor::{Distribution, TensorData, Tolerance};

    type TestBackend = Flex;

    /// The explicit path (used under dropout) agrees with Burn's op, masks and causality
    /// included, fully masked rows included.
    #[test]
    fn explicit_scoring_matches_the_attention_op() {
        let device = Default::default();
        let no_dropout = DropoutConfig::new(0.0).init();
        for (s_q, s_k) in [(5, 5), (2, 5), (1, 4)] {
            let q =
                Tensor::<TestBackend, 4>::random([2, 3, s_q, 8], Distribution::Default, &device);
            let k =
                Tensor::<TestBackend, 4>::random([2, 3, s_k, 8], Distribution::Default, &device);
            let v =
                Tensor::<TestBackend, 4>::random([2, 3, s_k, 8], Distribution::Default, &device);
            let mut bits = vec![false; 2 * 3 * s_q * s_k];
            bits[..s_k].fill(true); // row 0 of batch 0, head 0: fully masked
            bits[s_k * s_q + 1] = true;
            let mask = Tensor::<TestBackend, 4, Bool>::from_bool(
                TensorData::new(bits, [2, 3, s_q, s_k]),
                &device,
            );
            for causal in [false, true] {
                for mask in [None, Some(mask.clone())] {
                    let options = AttentionModuleOptions {
                        scale: None,
                        softcap: None,
                        is_causal: causal,
                    };
                    let expected =
                        attention(q.clone(), k.clone(), v.clone(), mask.clone(), None, options);
                    let got =
                        attend_explicit(q.clone(), k.clone(), v.clone(), mask, causal, &no_dropout);
                    got.into_data()
                        .assert_approx_eq::<f32>(&expected.into_data(), Tolerance::default());
                }
            }
        }
    }

    /// Without autodiff `attend` calls Burn's op; a cached decode (`s_q < s_k`) and a mask
    /// broadcast over heads (or queries) give what the explicit path gives, causality aligned at
    /// the bottom right, whatever alignment the backend's kernel would choose for `is_causal`.
    #[test]
    fn the_attention_op_path_aligns_a_cached_decode_at_the_bottom_right() {
        let device = Default::default();
        let no_dropout = DropoutConfig::new(0.0).init();
        for (s_q, s_k) in [(1, 6), (2, 6), (6, 6)] {
            let random =
                |s| Tensor::<TestBackend, 4>::random([2, 3, s, 8], Distribution::Default, &device);
            let (q, k, v) = (random(s_q), random(s_k), random(s_k));
            let bits: Vec<bool> = (0..2 * s_k).map(|i| i == 1 || i == s_k + 3).collect();
            let padding = Tensor::<TestBackend, 4, Bool>::from_bool(
                TensorData::new(bits, [2, 1, 1, s_k]),
                &device,
            );
            for mask in [None, Some(padding)] {
                let got = attend(
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    mask.clone(),
                    true,
                    &no_dropout,
                    AttentionKernel::Flash,
                );
                let expected =
                    attend_explicit(q.clone(), k.clone(), v.clone(), mask, true, &no_dropout);
                got.into_data()
                    .assert_approx_eq::<f32>(&expected.into_data(), Tolerance::default());
            }
        }
    }

    /// Under autodiff `attend` takes its own path (causal mask as a broadcast bias); its
    /// gradients equal those of Burn's attention op, which autodiff decomposes.
    #[test]
    fn gradients_under_autodiff_match_the_attention_op() {
        type Ad = burn::backend::Autodiff<Flex>;
        let device = Default::default();
        let no_dropout = DropoutConfig::new(0.0).init();
        for (s_q, s_k) in [(6, 6), (2, 6)] {
            let leaf = |s| {
                Tensor::<Ad, 4>::random([2, 3, s, 8], Distribution::Default, &device).require_grad()
            };
            let (q, k, v) = (leaf(s_q), leaf(s_k), leaf(s_k));
            let w = Tensor::<Ad, 4>::random([2, 3, s_q, 8], Distribution::Default, &device);
            let grads_of = |out: Tensor<Ad, 4>| {
                let grads = (out * w.clone()).sum().backward();
                [&q, &k, &v].map(|t| t.grad(&grads).expect("a leaf gets a gradient"))
            };
            let options = AttentionModuleOptions {
                scale: None,
                softcap: None,
                is_causal: true,
            };
            let expected = grads_of(attention(
                q.clone(),
                k.clone(),
                v.clone(),
                None,
                None,
                options,
            ));
            let got = grads_of(attend(
                q.clone(),
                k.clone(),
                v.clone(),
                None,
                true,
                &no_dropout,
                AttentionKernel::Explicit,
            ));
            for (got, expected) in got.into_iter().zip(expected) {
                got.into_data()
                    .assert_approx_eq::<f32>(&expected.into_data(), Tolerance::default());
            }
        }
    }
}
