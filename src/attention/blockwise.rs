//! Scaled dot-product attention computed one block of queries at a time, forward and backward,
//! on any backend: the arithmetic of the flash scorer ([`flash_attention`](super::flash_attention)).
//!
//! The forward pass keeps, besides the output, each query's log-normaliser
//! `lse = log Σ_j exp(s_j)`; the backward pass recomputes a block's probabilities
//! `P = exp(S − lse)` from `q`, `k` and `lse` instead of keeping them (FlashAttention-2, Dao 2023).
//! So nothing of size `[batch, heads, s_q, s_k]` outlives a block, and a causal block scores only
//! the keys its queries can see: the fully masked key blocks are skipped, not computed.
//!
//! Shapes in comments: `b` batch, `h` heads, `n` queries of a block, `j` keys it sees, `d` width.

use burn::tensor::{Bool, FloatDType, Tensor, backend::Backend};
use core::ops::Range;

/// The score floats a block holds with [`default_block_rows`]: 16M (64 MB in f32). On Flex a
/// whole `[batch·heads, s, s]` score matrix up to this size as one block is faster than smaller
/// blocks that skip the masked half of a causal matrix (results/performance.md).
pub const BLOCK_FLOATS: usize = 1 << 24;

/// Query rows per block such that a block's `[batch·heads, rows, s_k]` scores hold about
/// [`BLOCK_FLOATS`] floats: at least 16 rows (all of them if fewer).
pub fn default_block_rows(batch_heads: usize, s_k: usize) -> usize {
    (BLOCK_FLOATS / (batch_heads * s_k).max(1)).max(16)
}

/// The inputs of a blockwise attention, and its two passes.
#[derive(Clone, Debug)]
pub(crate) struct Blockwise<B: Backend> {
    /// `[b, h, s_q, d]`.
    pub q: Tensor<B, 4>,
    /// `[b, h, s_k, d]`.
    pub k: Tensor<B, 4>,
    /// `[b, h, s_k, d_v]`.
    pub v: Tensor<B, 4>,
    /// `[b or 1, h or 1, s_q or 1, s_k]`, `true` = masked out, broadcast where it has size 1.
    pub mask: Option<Tensor<B, 4, Bool>>,
    /// Query `i` sees keys `j ≤ i + s_k − s_q` (aligned at the bottom right).
    pub causal: bool,
    /// Query rows per block.
    pub block_rows: usize,
}

/// The gradients of [`Blockwise::backward`].
pub(crate) struct BlockwiseGrads<B: Backend> {
    pub q: Tensor<B, 4>,
    pub k: Tensor<B, 4>,
    pub v: Tensor<B, 4>,
}

impl<B: Backend> Blockwise<B> {
    fn scale(&self) -> f64 {
        1.0 / (self.q.dims()[3] as f64).sqrt()
    }

    /// Each block's query rows and the number of leading keys they can see (all keys unless
    /// causal; zero for queries before the first key when `s_q > s_k`).
    fn blocks(&self) -> Vec<(Range<usize>, usize)> {
        let (s_q, s_k) = (self.q.dims()[2], self.k.dims()[2]);
        let rows = self.block_rows.max(1);
        (0..s_q)
            .step_by(rows)
            .map(|start| {
                let end = (start + rows).min(s_q);
                let keys = match self.causal {
                    // The block's last query sees keys up to (end − 1) + s_k − s_q.
                    true => (end + s_k).saturating_sub(s_q).min(s_k),
                    false => s_k,
                };
                (start..end, keys)
            })
            .collect()
    }

    /// The block's scaled scores over its first `keys` keys, masked with `−∞`: `[b, h, n, j]`.
    fn scores(&self, rows: &Range<usize>, keys: usize) -> Tensor<B, 4> {
        let [batch, heads, s_q, _] = self.q.dims();
        let s_k = self.k.dims()[2];
        let n = rows.len();
        let q = self.q.clone().narrow(2, rows.start, n);
        let k = self.k.clone().narrow(2, 0, keys);
        let scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(self.scale());
        // Query `start + r` sees keys `j ≤ r + offset`. A block needs a causal bias unless its
        // first query already sees all of its `keys`.
        let offset = rows.start as i64 + s_k as i64 - s_q as i64;
        let scores = match self.causal && offset + 1 < keys as i64 {
            true => {
                let future = Tensor::<B, 2, Bool>::tril_mask([n, keys], offset, &scores.device());
                let bias = Tensor::<B, 2>::zeros([n, keys], &scores.device())
                    .cast(FloatDType::from(scores.dtype()))
                    .mask_fill(future, f32::NEG_INFINITY)
                    .reshape([1, n * keys]);
                // Flat rows: Flex adds a bias shared by every row in one pass.
                (scores.reshape([batch * heads, n * keys]) + bias).reshape([batch, heads, n, keys])
            }
            false => scores,
        };
        match &self.mask {
            Some(mask) => {
                let [mb, mh, mq, _] = mask.dims();
                let rows = match mq {
                    1 => 0..1,
                    _ => rows.clone(),
                };
                let mask = mask
                    .clone()
                    .slice([0..mb, 0..mh, rows, 0..keys])
                    .expand([batch, heads, n, keys]);
                scores.mask_fill(mask, f32::NEG_INFINITY)
            }
            None => scores,
        }
    }

    /// The output `[b, h, s_q, d_v]` and each query's log-normaliser `[b, h, s_q, 1]`. A query
    /// that sees no key gets a zero output (not NaN), as the explicit path gives. On host-memory
    /// backends (Flex, NdArray) the loop runs as one kernel ([`host`](super::host)).
    pub fn forward(&self) -> (Tensor<B, 4>, Tensor<B, 4>) {
        if super::host::applies(self) {
            return super::host::forward(self);
        }
        self.forward_tensor_ops()
    }

    /// [`forward`](Self::forward) as tensor ops of `B`, block by block.
    pub fn forward_tensor_ops(&self) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let [batch, heads, _, _] = self.q.dims();
        let d_v = self.v.dims()[3];
        let device = self.q.device();
        let (mut outputs, mut lses) = (Vec::new(), Vec::new());
        for (rows, keys) in self.blocks() {
            let n = rows.len();
            if keys == 0 {
                outputs.push(Tensor::zeros([batch, heads, n, d_v], &device));
                // As a fully masked row within a block gets below.
                lses.push(Tensor::full(
                    [batch, heads, n, 1],
                    f32::MIN_POSITIVE.ln(),
                    &device,
                ));
                continue;
            }
            let scores = self.scores(&rows, keys);
            // A fully masked row has max −∞: shift it by 0 so that its exponentials are 0.
            let max = scores.clone().max_dim(3);
            let max = max.clone().mask_fill(max.is_inf(), 0.0);
            let weights = (scores - max.clone()).exp(); // [b, h, n, j]
            let sum = weights.clone().sum_dim(3).clamp_min(f32::MIN_POSITIVE);
            let v = self.v.clone().narrow(2, 0, keys);
            outputs.push(weights.matmul(v) / sum.clone());
            // A fully masked row gets lse = log(MIN_POSITIVE): finite, so exp(−∞ − lse) = 0.
            lses.push(max + sum.log());
        }
        (Tensor::cat(outputs, 2), Tensor::cat(lses, 2))
    }

    /// The gradients of `Σ grad_output ⊙ output` with respect to `q`, `k` and `v`, given the
    /// forward pass's `output` and `lse` (on host-memory backends as one kernel, as
    /// [`forward`](Self::forward)).
    pub fn backward(
        &self,
        output: Tensor<B, 4>,
        lse: Tensor<B, 4>,
        grad_output: Tensor<B, 4>,
    ) -> BlockwiseGrads<B> {
        let f32_grads = [&output, &lse, &grad_output]
            .iter()
            .all(|t| t.dtype() == burn::tensor::DType::F32);
        if f32_grads && super::host::applies(self) {
            return super::host::backward(self, output, lse, grad_output);
        }
        self.backward_tensor_ops(output, lse, grad_output)
    }

    /// [`backward`](Self::backward) as tensor ops of `B`, block by block.
    pub fn backward_tensor_ops(
        &self,
        output: Tensor<B, 4>,
        lse: Tensor<B, 4>,
        grad_output: Tensor<B, 4>,
    ) -> BlockwiseGrads<B> {
        let [batch, heads, _, d] = self.q.dims();
        let device = self.q.device();
        let scale = self.scale();
        // D_i = Σ_c dO_ic·O_ic = Σ_j P_ij·dP_ij, the softmax backward's row term: [b, h, s_q, 1].
        let delta = (grad_output.clone() * output).sum_dim(3);
        let mut grad_k = Tensor::<B, 4>::zeros(self.k.dims(), &device);
        let mut grad_v = Tensor::<B, 4>::zeros(self.v.dims(), &device);
        let mut grad_q = Vec::new();
        for (rows, keys) in self.blocks() {
            let n = rows.len();
            if keys == 0 {
                grad_q.push(Tensor::zeros([batch, heads, n, d], &device));
                continue;
            }
            let weights = (self.scores(&rows, keys) - lse.clone().narrow(2, rows.start, n)).exp();
            let grad_out = grad_output.clone().narrow(2, rows.start, n); // [b, h, n, d_v]
            let k = self.k.clone().narrow(2, 0, keys);
            let v = self.v.clone().narrow(2, 0, keys);
            let q = self.q.clone().narrow(2, rows.start, n);
            let block_grad_v = weights.clone().swap_dims(2, 3).matmul(grad_out.clone());
            let grad_weights = grad_out.matmul(v.swap_dims(2, 3)); // [b, h, n, j]
            let grad_scores = weights * (grad_weights - delta.clone().narrow(2, rows.start, n));
            grad_q.push(grad_scores.clone().matmul(k).mul_scalar(scale));
            let block_grad_k = grad_scores.swap_dims(2, 3).matmul(q).mul_scalar(scale);
            grad_k = add_leading(grad_k, block_grad_k, keys);
            grad_v = add_leading(grad_v, block_grad_v, keys);
        }
        BlockwiseGrads {
            q: Tensor::cat(grad_q, 2),
            k: grad_k,
            v: grad_v,
        }
    }
}

/// `total[:, :, ..keys] += part`.
fn add_leading<B: Backend>(total: Tensor<B, 4>, part: Tensor<B, 4>, keys: usize) -> Tensor<B, 4> {
    let [batch, heads, s_k, d] = total.dims();
    if keys == s_k {
        return total + part;
    }
    let ranges = [0..batch, 0..heads, 0..keys, 0..d];
    let sum = total.clone().slice(ranges.clone()) + part;
    total.slice_assign(ranges, sum)
}
