//! The flash scorer's kernel for backends whose tensors live in host memory (Flex, NdArray): the
//! passes of [`blockwise`](super::blockwise) as one loop nest per (batch, head) over `f32`
//! slices, the block products on `gemm` and the exponentials vectorised, so a block's scores stay
//! in cache and never become a tensor.
//!
//! Written as tensor ops, a block is a dozen passes over `[batch, heads, rows, keys]` memory and
//! Flex evaluates `exp` with scalar calls (results/performance.md); here a block of [`ROWS`]
//! queries holds two `ROWS × s_k` scratch rows. The arithmetic and its conventions (causality
//! aligned at the bottom right; a query that sees no key gets a zero output, zero gradients and
//! the log-normaliser `ln f32::MIN_POSITIVE`, that of an empty sum clamped) are those of the tensor-op version, which the tests
//! compare it with.

use super::blockwise::{Blockwise, BlockwiseGrads};
use crate::host_math::{Mat, exp, gemm};
use crate::host_tensor::HostValues;
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use rayon::prelude::*;

/// Query rows per block: a block's scores and their gradient, `ROWS × s_k` floats each, stay in a
/// core's L2 cache for contexts of a few thousand keys.
const ROWS: usize = 64;

/// Whether `B` keeps its tensors in host memory, so that the flash op runs on this kernel.
pub(crate) fn runs_on_host<B: Backend>(device: &B::Device) -> bool {
    matches!(B::name(device).as_str(), "flex" | "ndarray")
}

/// Whether this kernel computes `blockwise`: a host backend, `f32` tensors and heads of some
/// width (a zero-width head is left to the tensor-op passes).
pub(crate) fn applies<B: Backend>(blockwise: &Blockwise<B>) -> bool {
    runs_on_host::<B>(&blockwise.q.device())
        && blockwise.q.dims()[3] > 0
        && blockwise.v.dims()[3] > 0
        && [&blockwise.q, &blockwise.k, &blockwise.v]
            .iter()
            .all(|t| t.dtype() == DType::F32)
}

/// [`Blockwise::forward`] on this kernel: the output and the log-normalisers `[b, h, s_q, 1]`.
pub(crate) fn forward<B: Backend>(blockwise: &Blockwise<B>) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let dims = Dims::of(blockwise);
    let mask = blockwise.mask.clone().map(MaskData::read);
    let (output, lse) = forward_host(
        &floats(blockwise.q.clone()),
        &floats(blockwise.k.clone()),
        &floats(blockwise.v.clone()),
        mask.as_ref().map(MaskData::view),
        dims,
    );
    let [batch, heads, s_q, _] = blockwise.q.dims();
    let device = blockwise.q.device();
    (
        tensor(output, [batch, heads, s_q, dims.d_v], &device),
        tensor(lse, [batch, heads, s_q, 1], &device),
    )
}

/// [`Blockwise::backward`] on this kernel.
pub(crate) fn backward<B: Backend>(
    blockwise: &Blockwise<B>,
    output: Tensor<B, 4>,
    lse: Tensor<B, 4>,
    grad_output: Tensor<B, 4>,
) -> BlockwiseGrads<B> {
    let dims = Dims::of(blockwise);
    let mask = blockwise.mask.clone().map(MaskData::read);
    let grads = backward_host(
        Inputs {
            q: &floats(blockwise.q.clone()),
            k: &floats(blockwise.k.clone()),
            v: &floats(blockwise.v.clone()),
            mask: mask.as_ref().map(MaskData::view),
        },
        &floats(output),
        &floats(lse),
        &floats(grad_output),
        dims,
    );
    let device = blockwise.q.device();
    BlockwiseGrads {
        q: tensor(grads.q, blockwise.q.dims(), &device),
        k: tensor(grads.k, blockwise.k.dims(), &device),
        v: tensor(grads.v, blockwise.v.dims(), &device),
    }
}

/// `t`'s values head-major, `[b, h, s, d]` flat. Read token-major (`[b, s, h, d]`), where the
/// layers keep their queries, keys and values (their `[b, h, s, d]` views are transposes): on
/// Flex that read is one contiguous copy, where a head-major read gathers element by element.
fn floats<B: Backend>(t: Tensor<B, 4>) -> Vec<f32> {
    let [batch, heads, seq, d] = t.dims();
    let token_major = HostValues::read(t.swap_dims(1, 2).reshape([batch * seq * heads * d]));
    swap_middle(token_major.values(), [batch, seq, heads, d])
}

/// A `[b, h, s, d]` tensor of head-major values, stored token-major (the layout [`floats`] reads
/// fastest and the layers reshape without a copy).
fn tensor<B: Backend>(data: Vec<f32>, shape: [usize; 4], device: &B::Device) -> Tensor<B, 4> {
    let [batch, heads, seq, d] = shape;
    let token_major = swap_middle(&data, shape);
    Tensor::<B, 4>::from_data(TensorData::new(token_major, [batch, seq, heads, d]), device)
        .swap_dims(1, 2)
}

/// `[a, x, y, d]` → `[a, y, x, d]`, rows of `d` at a time.
fn swap_middle(data: &[f32], [_, x, y, d]: [usize; 4]) -> Vec<f32> {
    let mut out = vec![0.0; data.len()];
    if data.is_empty() {
        return out;
    }
    for (outer, out) in out.chunks_exact_mut(x * y * d).enumerate() {
        let data = &data[outer * x * y * d..][..x * y * d];
        for (row, out) in out.chunks_exact_mut(d).enumerate() {
            let (j, i) = (row / x, row % x); // out row (j, i) is data row (i, j)
            out.copy_from_slice(&data[(i * y + j) * d..][..d]);
        }
    }
    out
}

/// A mask as it was given, `[b or 1, h or 1, s_q or 1, s_k]`: read without broadcasting it, so
/// that a padding mask costs `b · s_k` bools here, not `b · h · s_q · s_k`.
struct MaskData {
    bits: Vec<bool>,
    dims: [usize; 4],
}

impl MaskData {
    fn read<B: Backend>(t: Tensor<B, 4, burn::tensor::Bool>) -> Self {
        let dims = t.dims();
        let bits = t
            .into_data()
            .into_vec::<bool>()
            .expect("a bool tensor's data are bools");
        MaskData { bits, dims }
    }

    fn view(&self) -> Mask<'_> {
        Mask {
            bits: &self.bits,
            dims: self.dims,
        }
    }
}

/// A view of a [`MaskData`], or of one (batch, head)'s part of it (`dims[0] = dims[1] = 1`).
#[derive(Clone, Copy)]
struct Mask<'a> {
    bits: &'a [bool],
    /// `[b or 1, h or 1, s_q or 1, s_k]`.
    dims: [usize; 4],
}

impl<'a> Mask<'a> {
    /// The part of (batch, head) `h`, counted over `batch × heads`.
    fn head(&self, h: usize, heads: usize) -> Mask<'a> {
        let [mb, mh, mq, s_k] = self.dims;
        let b = if mb == 1 { 0 } else { h / heads };
        let head = if mh == 1 { 0 } else { h % heads };
        Mask {
            bits: &self.bits[(b * mh + head) * mq * s_k..][..mq * s_k],
            dims: [1, 1, mq, s_k],
        }
    }

    /// Query `i`'s row over the first `keys` keys.
    fn row(&self, i: usize, keys: usize) -> &'a [bool] {
        let [_, _, mq, s_k] = self.dims;
        let row = if mq == 1 { 0 } else { i };
        &self.bits[row * s_k..][..keys]
    }
}

/// Sizes of one attention, with `bh` = batch × heads.
#[derive(Clone, Copy, Debug)]
struct Dims {
    bh: usize,
    heads: usize,
    s_q: usize,
    s_k: usize,
    d: usize,
    d_v: usize,
    causal: bool,
    scale: f32,
}

impl Dims {
    fn of<B: Backend>(blockwise: &Blockwise<B>) -> Self {
        let [batch, heads, s_q, d] = blockwise.q.dims();
        let [_, _, s_k, d_v] = blockwise.v.dims();
        Dims {
            bh: batch * heads,
            heads,
            s_q,
            s_k,
            d,
            d_v,
            causal: blockwise.causal,
            scale: (1.0 / (d as f64).sqrt()) as f32,
        }
    }

    /// How many leading keys query `i` sees.
    fn visible(&self, i: usize) -> usize {
        match self.causal {
            true => (i + 1 + self.s_k).saturating_sub(self.s_q).min(self.s_k),
            false => self.s_k,
        }
    }
}

/// One (batch, head)'s inputs, or all of them.
#[derive(Clone, Copy)]
struct Inputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    mask: Option<Mask<'a>>,
}

impl<'a> Inputs<'a> {
    /// The slices of (batch, head) `h`.
    fn head(&self, h: usize, dims: Dims) -> Inputs<'a> {
        let Dims {
            s_q, s_k, d, d_v, ..
        } = dims;
        Inputs {
            q: &self.q[h * s_q * d..][..s_q * d],
            k: &self.k[h * s_k * d..][..s_k * d],
            v: &self.v[h * s_k * d_v..][..s_k * d_v],
            mask: self.mask.map(|m| m.head(h, dims.heads)),
        }
    }

    /// `scale · q[start..start + n] · k[..keys]ᵀ` into `scores` (`n × keys`, row-major).
    fn scores(&self, scores: &mut [f32], start: usize, n: usize, keys: usize, dims: Dims) {
        let d = dims.d;
        let q = Mat::rows(&self.q[start * d..][..n * d], d);
        let k_t = Mat::transposed(&self.k[..keys * d], d);
        gemm(scores, keys, false, q, k_t, [n, keys, d], dims.scale);
    }

    /// The mask of query `i` over the first `keys` keys (`true`: hidden).
    fn mask_row(&self, i: usize, keys: usize) -> Option<&'a [bool]> {
        self.mask.map(|m| m.row(i, keys))
    }
}

/// The forward pass: the output `[bh, s_q, d_v]` and the log-normalisers `[bh, s_q]`.
fn forward_host(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<Mask<'_>>,
    dims: Dims,
) -> (Vec<f32>, Vec<f32>) {
    let Dims { bh, s_q, d_v, .. } = dims;
    let all = Inputs { q, k, v, mask };
    let mut output = vec![0.0; bh * s_q * d_v];
    let mut lse = vec![0.0; bh * s_q];
    if s_q == 0 {
        return (output, lse);
    }
    // Every (head, block of queries) is independent: one task each.
    output
        .par_chunks_mut(s_q * d_v)
        .zip(lse.par_chunks_mut(s_q))
        .enumerate()
        .flat_map(|(h, (output, lse))| {
            output
                .par_chunks_mut(ROWS * d_v)
                .zip(lse.par_chunks_mut(ROWS))
                .enumerate()
                .map(move |(b, (output, lse))| (h, b * ROWS, output, lse))
        })
        .for_each(|(h, start, output, lse)| {
            let head = all.head(h, dims);
            let n = lse.len();
            let keys = dims.visible(start + n - 1);
            if keys == 0 {
                lse.fill(f32::MIN_POSITIVE.ln());
                return;
            }
            let mut weights = vec![0.0; n * keys];
            head.scores(&mut weights, start, n, keys, dims);
            pulp::Arch::new().dispatch(BlockRows {
                weights: &mut weights,
                lse: Lse::Write(lse),
                keys,
                start,
                head,
                dims,
            });
            let v = Mat::rows(&head.v[..keys * d_v], d_v);
            gemm(
                output,
                d_v,
                false,
                Mat::rows(&weights, keys),
                v,
                [n, d_v, keys],
                1.0,
            );
        });
    (output, lse)
}

/// The gradients of `q`, `k` and `v`.
struct Grads {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// The backward pass: each (batch, head) recomputes its blocks' probabilities from `q`, `k` and
/// the log-normalisers, and sums its blocks' key and value gradients in place.
fn backward_host(
    all: Inputs<'_>,
    output: &[f32],
    lse: &[f32],
    grad_output: &[f32],
    dims: Dims,
) -> Grads {
    let Dims {
        bh,
        s_q,
        s_k,
        d,
        d_v,
        ..
    } = dims;
    let mut grads = Grads {
        q: vec![0.0; bh * s_q * d],
        k: vec![0.0; bh * s_k * d],
        v: vec![0.0; bh * s_k * d_v],
    };
    if s_q == 0 || s_k == 0 {
        return grads;
    }
    grads
        .q
        .par_chunks_mut(s_q * d)
        .zip(grads.k.par_chunks_mut(s_k * d))
        .zip(grads.v.par_chunks_mut(s_k * d_v))
        .enumerate()
        .for_each(|(h, ((grad_q, grad_k), grad_v))| {
            let head = all.head(h, dims);
            let output = &output[h * s_q * d_v..][..s_q * d_v];
            let grad_output = &grad_output[h * s_q * d_v..][..s_q * d_v];
            let lse = &lse[h * s_q..][..s_q];
            // D_i = Σ_c dO_ic·O_ic = Σ_j P_ij·dP_ij, the softmax backward's row term.
            let delta: Vec<f32> = grad_output
                .chunks_exact(d_v)
                .zip(output.chunks_exact(d_v))
                .map(|(g, o)| g.iter().zip(o).map(|(g, o)| g * o).sum())
                .collect();
            let mut weights = Vec::new();
            let mut grad_scores = Vec::new();
            for start in (0..s_q).step_by(ROWS) {
                let n = ROWS.min(s_q - start);
                let keys = dims.visible(start + n - 1);
                if keys == 0 {
                    continue;
                }
                weights.resize(n * keys, 0.0);
                grad_scores.resize(n * keys, 0.0);
                head.scores(&mut weights, start, n, keys, dims);
                pulp::Arch::new().dispatch(BlockRows {
                    weights: &mut weights,
                    lse: Lse::Read(&lse[start..start + n]),
                    keys,
                    start,
                    head,
                    dims,
                });
                let grad_out = Mat::rows(&grad_output[start * d_v..][..n * d_v], d_v);
                // dV[..keys] += Pᵀ·dO
                let weights_t = Mat::transposed(&weights, keys);
                gemm(grad_v, d_v, true, weights_t, grad_out, [keys, d_v, n], 1.0);
                // dP = dO·Vᵀ, then dS = P ⊙ (dP − D) in its place.
                let v_t = Mat::transposed(&head.v[..keys * d_v], d_v);
                gemm(
                    &mut grad_scores,
                    keys,
                    false,
                    grad_out,
                    v_t,
                    [n, keys, d_v],
                    1.0,
                );
                for ((ds, p), delta) in grad_scores
                    .chunks_exact_mut(keys)
                    .zip(weights.chunks_exact(keys))
                    .zip(&delta[start..start + n])
                {
                    ds.iter_mut()
                        .zip(p)
                        .for_each(|(ds, p)| *ds = p * (*ds - delta));
                }
                // dQ = scale·dS·K, dK[..keys] += scale·dSᵀ·Q
                let k = Mat::rows(&head.k[..keys * d], d);
                let grad_q = &mut grad_q[start * d..][..n * d];
                let ds = Mat::rows(&grad_scores, keys);
                gemm(grad_q, d, false, ds, k, [n, d, keys], dims.scale);
                let q = Mat::rows(&head.q[start * d..][..n * d], d);
                let ds_t = Mat::transposed(&grad_scores, keys);
                gemm(grad_k, d, true, ds_t, q, [keys, d, n], dims.scale);
            }
        });
    grads
}

/// What a block's rows do with the log-normalisers: the forward pass writes them, the backward
/// pass reads the forward pass's.
enum Lse<'a> {
    Write(&'a mut [f32]),
    Read(&'a [f32]),
}

/// A block's rows: scores to probabilities in place. Forward: normalised by their own sums, whose
/// logs are written; backward: `exp(s − lse)` from the forward pass's log-normalisers.
struct BlockRows<'a> {
    weights: &'a mut [f32],
    lse: Lse<'a>,
    keys: usize,
    start: usize,
    head: Inputs<'a>,
    dims: Dims,
}

impl pulp::WithSimd for BlockRows<'_> {
    type Output = ();

    // Inlined into pulp's `#[target_feature]` entry point with the helpers it calls, so that their
    // vector ops are the machine's (AVX2 and FMA on x86-64 where present).
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        let BlockRows {
            weights,
            mut lse,
            keys,
            start,
            head,
            dims,
        } = self;
        for (r, row) in weights.chunks_exact_mut(keys).enumerate() {
            let i = start + r;
            let max = hide(row, dims.visible(i), head.mask_row(i, keys));
            match &mut lse {
                Lse::Read(lse) => {
                    exp_shifted(simd, row, lse[r]);
                }
                Lse::Write(lse) => {
                    // A row that sees no key is shifted by 0: its exponentials of −∞ are all 0.
                    let shift = max.unwrap_or(0.0);
                    let sum = exp_shifted(simd, row, shift).max(f32::MIN_POSITIVE);
                    lse[r] = shift + sum.ln();
                    let inverse = 1.0 / sum;
                    row.iter_mut().for_each(|p| *p *= inverse);
                }
            }
        }
    }
}

/// Sets a score row's hidden entries (from `visible` on, or `true` in `mask`) to `−∞` and
/// returns the largest score it sees (`None` when it sees none).
#[inline(always)]
fn hide(row: &mut [f32], visible: usize, mask: Option<&[bool]>) -> Option<f32> {
    row[visible..].fill(f32::NEG_INFINITY);
    let row = &mut row[..visible];
    if let Some(mask) = mask {
        for (s, &masked) in row.iter_mut().zip(mask) {
            *s = if masked { f32::NEG_INFINITY } else { *s };
        }
    }
    // Eight running maxima, a vector's lanes, so that the loop vectorises.
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = row.chunks_exact(8);
    for chunk in &mut chunks {
        for (max, &s) in lanes.iter_mut().zip(chunk) {
            *max = max.max(s);
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    (max > f32::NEG_INFINITY).then_some(max)
}

/// `x ← exp(x − shift)` over `row`, a vector at a time; returns `Σ x`.
#[inline(always)]
fn exp_shifted<S: pulp::Simd>(simd: S, row: &mut [f32], shift: f32) -> f32 {
    let (vectors, tail) = S::as_mut_simd_f32s(row);
    let shift_v = simd.splat_f32s(shift);
    let mut sum = simd.splat_f32s(0.0);
    for x in vectors {
        *x = exp(simd, simd.sub_f32s(*x, shift_v));
        sum = simd.add_f32s(sum, *x);
    }
    let scalar = pulp::Scalar::new();
    let mut tail_sum = 0.0;
    for x in tail {
        *x = exp(scalar, *x - shift);
        tail_sum += *x;
    }
    simd.reduce_sum_f32s(sum) + tail_sum
}

/// Asserts that `got` equals `expected` within 1e-5 of `expected`'s largest value (at least 1):
/// the flash passes and the explicit scoring sum in other orders, so an element's rounding is
/// that of its tensor's scale, not of its own size.
#[cfg(test)]
pub(crate) fn assert_close_to_scale<B: Backend>(
    got: Tensor<B, 4>,
    expected: Tensor<B, 4>,
    what: &str,
) {
    let got = got.into_data().to_vec::<f32>().expect("f32");
    let expected = expected.into_data().to_vec::<f32>().expect("f32");
    let scale = expected.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    let diff = got
        .iter()
        .zip(&expected)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        diff <= 1e-5 * scale,
        "{what}: differs by {diff:e}, scale {scale:e}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::{Bool, Distribution};

    /// Flex's tensors are in host memory: its flash op runs on this kernel.
    #[test]
    fn flex_runs_on_the_host_kernel() {
        let device = Default::default();
        let q = Tensor::<Flex, 4>::zeros([1, 1, 2, 4], &device);
        let blockwise = Blockwise {
            q: q.clone(),
            k: q.clone(),
            v: q,
            mask: None,
            causal: true,
            block_rows: 1,
        };
        assert!(applies(&blockwise));
    }

    /// The kernel's output, log-normalisers and gradients equal the tensor-op passes': causal and
    /// not, with fewer, as many and more queries than keys, several blocks and a partial last
    /// one, a value width unlike the key width, and a mask that hides whole rows.
    #[test]
    fn kernel_equals_the_tensor_op_passes() {
        let device = Default::default();
        let random = |shape: [usize; 4]| {
            Tensor::<Flex, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device)
        };
        for (s_q, s_k) in [(150, 150), (70, 150), (150, 97), (5, 5)] {
            let (d, d_v) = (8, 12);
            let len = 2 * 3 * s_q * s_k;
            let mut bits = vec![false; len];
            bits[..s_k].fill(true); // query 0 of (batch 0, head 0) sees nothing
            bits[70 * s_k % len] = true;
            bits[(5 * s_q * s_k + 3) % len] = true;
            let mask = Tensor::<Flex, 4, Bool>::from_bool(
                TensorData::new(bits, [2, 3, s_q, s_k]),
                &device,
            );
            for causal in [false, true] {
                for mask in [None, Some(mask.clone())] {
                    let blockwise = Blockwise {
                        q: random([2, 3, s_q, d]),
                        k: random([2, 3, s_k, d]),
                        v: random([2, 3, s_k, d_v]),
                        mask,
                        causal,
                        block_rows: 16,
                    };
                    let grad_output = random([2, 3, s_q, d_v]);
                    let (output, lse) = forward(&blockwise);
                    let (expected_output, expected_lse) = blockwise.forward_tensor_ops();
                    let grads =
                        backward(&blockwise, output.clone(), lse.clone(), grad_output.clone());
                    let expected =
                        blockwise.backward_tensor_ops(output.clone(), lse.clone(), grad_output);
                    let pairs = [
                        (output, expected_output),
                        (lse, expected_lse),
                        (grads.q, expected.q),
                        (grads.k, expected.k),
                        (grads.v, expected.v),
                    ];
                    for (name, (got, expected)) in
                        ["output", "lse", "dq", "dk", "dv"].iter().zip(pairs)
                    {
                        let what = format!("{name} ({s_q}, {s_k}, causal {causal})");
                        assert_close_to_scale(got, expected, &what);
                    }
                }
            }
        }
    }

    /// A mask broadcast over batch, heads or queries gives what the same mask expanded to
    /// `[b, h, s_q, s_k]` gives, on the kernel and on the tensor-op passes.
    #[test]
    fn a_broadcast_mask_is_the_expanded_mask() {
        let device = Default::default();
        let random = |shape: [usize; 4]| {
            Tensor::<Flex, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device)
        };
        let (s_q, s_k, d) = (70, 90, 8);
        for shape in [
            [2, 1, 1, s_k],
            [1, 3, 1, s_k],
            [2, 1, s_q, s_k],
            [1, 1, 1, s_k],
        ] {
            let len: usize = shape.iter().product();
            let bits: Vec<bool> = (0..len).map(|i| (i * 7 + i / 13) % 5 == 0).collect();
            let mask = Tensor::<Flex, 4, Bool>::from_bool(TensorData::new(bits, shape), &device);
            let full = mask.clone().expand([2, 3, s_q, s_k]);
            let (q, k, v) = (
                random([2, 3, s_q, d]),
                random([2, 3, s_k, d]),
                random([2, 3, s_k, d]),
            );
            let grad_output = random([2, 3, s_q, d]);
            let passes = |mask: Tensor<Flex, 4, Bool>, host: bool| {
                let blockwise = Blockwise {
                    q: q.clone(),
                    k: k.clone(),
                    v: v.clone(),
                    mask: Some(mask),
                    causal: true,
                    block_rows: 16,
                };
                let (output, lse) = match host {
                    true => forward(&blockwise),
                    false => blockwise.forward_tensor_ops(),
                };
                let grads = match host {
                    true => backward(&blockwise, output.clone(), lse.clone(), grad_output.clone()),
                    false => blockwise.backward_tensor_ops(
                        output.clone(),
                        lse.clone(),
                        grad_output.clone(),
                    ),
                };
                [output, lse, grads.q, grads.k, grads.v]
            };
            let expected = passes(full, true);
            for host in [true, false] {
                for (name, (got, expected)) in ["output", "lse", "dq", "dk", "dv"]
                    .iter()
                    .zip(passes(mask.clone(), host).into_iter().zip(expected.clone()))
                {
                    let what = format!("{name}, mask {shape:?}, host kernel {host}");
                    assert_close_to_scale(got, expected, &what);
                }
            }
        }
    }

    /// `exp_shifted` exponentiates every element with the machine's vectors, the remainder past
    /// the last full vector too, and returns their sum.
    #[test]
    fn exp_shifted_covers_every_element() {
        let mut row: Vec<f32> = (0..19).map(|i| i as f32 * 0.25).collect();
        struct ExpShifted<'a>(&'a mut [f32]);
        impl pulp::WithSimd for ExpShifted<'_> {
            type Output = f32;
            fn with_simd<S: pulp::Simd>(self, simd: S) -> f32 {
                exp_shifted(simd, self.0, 1.0)
            }
        }
        let sum = pulp::Arch::new().dispatch(ExpShifted(&mut row));
        for (i, x) in row.iter().enumerate() {
            let expected = (i as f32 * 0.25 - 1.0).exp();
            assert!(
                (x - expected).abs() <= 1e-6 * expected,
                "element {i}: {x} vs {expected}"
            );
        }
        let expected: f32 = (0..19).map(|i| (i as f32 * 0.25 - 1.0).exp()).sum();
        assert!((sum - expected).abs() <= 1e-5 * expected);
    }
}
