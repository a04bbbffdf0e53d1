//! The flash scorer for training: scaled dot-product attention as one autodiff op whose backward
//! pass recomputes the attention probabilities block by block ([`blockwise`](super::blockwise)),
//! so that the graph keeps `q`, `k`, `v`, the output and one log-normaliser per query, never a
//! `[batch, heads, s_q, s_k]` tensor.
//!
//! It is a custom op of Burn's [`Autodiff`] backend, written with the inner backend's tensor ops
//! (the pattern of Burn's `examples/custom-cubecl-kernel/src/backward.rs`), so it runs on every
//! backend that Autodiff wraps; [`FlashAttention`] exposes it, with a blanket implementation for
//! `Autodiff<B, C>`.

use super::blockwise::{Blockwise, default_block_rows};
use burn::backend::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::{BoolTensor, FloatTensor};
use burn::tensor::{Bool, Tensor, TensorPrimitive};

/// An autodiff backend with the flash scorer: every `Autodiff<B, C>`.
pub trait FlashAttention: AutodiffBackend {
    /// [`flash_attention`] on primitives (shapes already checked).
    fn flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: Option<BoolTensor<Self>>,
        causal: bool,
        block_rows: usize,
    ) -> FloatTensor<Self>;
}

/// `softmax(q·kᵀ/√d + mask)·v` with `true` in `mask` meaning "masked out", as one autodiff op
/// whose backward pass recomputes the probabilities `block_rows` queries at a time (`None`:
/// [`default_block_rows`]). Its values and gradients are those of the explicit scoring, within
/// float rounding: causality aligned at the bottom right (query `i` sees keys
/// `j ≤ i + s_k − s_q`), and a query that sees no key gets a zero output and zero gradients.
///
/// The graph keeps `q`, `k`, `v`, the output and `[batch, heads, s_q]` log-normalisers; the
/// forward and backward passes each hold one block's `[batch, heads, block_rows, s_k]` scores
/// and probabilities at a time, and a causal block scores only the keys it can see. A mask is
/// read as it is given, broadcast over the dimensions where it has size 1: a padding mask
/// `[batch, 1, 1, s_k]` costs `batch · s_k` bools, never `batch · heads · s_q · s_k`.
///
/// # Shapes
/// - `q`: `[batch, heads, s_q, d]`; `k`: `[batch, heads, s_k, d]`; `v`: `[batch, heads, s_k, d_v]`
/// - `mask`: `[batch or 1, heads or 1, s_q or 1, s_k]`
/// - output: `[batch, heads, s_q, d_v]`
///
/// # Panics
/// If the shapes do not match, or `block_rows` is `Some(0)`.
pub fn flash_attention<B: FlashAttention>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    causal: bool,
    block_rows: Option<usize>,
) -> Tensor<B, 4> {
    let [batch, heads, s_q, d] = q.dims();
    let [_, _, s_k, _] = k.dims();
    assert_eq!(
        k.dims(),
        [batch, heads, s_k, d],
        "flash_attention: k must be [batch, heads, s_k, d] = [{batch}, {heads}, s_k, {d}], got {:?}",
        k.dims()
    );
    let d_v = v.dims()[3];
    assert_eq!(
        v.dims(),
        [batch, heads, s_k, d_v],
        "flash_attention: v must be [batch, heads, s_k, d_v] = [{batch}, {heads}, {s_k}, d_v], got {:?}",
        v.dims()
    );
    if let Some(mask) = &mask {
        let [mb, mh, mq, mk] = mask.dims();
        assert!(
            [mb, mh, mq]
                .iter()
                .zip([batch, heads, s_q])
                .all(|(&m, full)| m == full || m == 1)
                && mk == s_k,
            "flash_attention: mask must be [batch or 1, heads or 1, s_q or 1, s_k] = \
             [{batch}, {heads}, {s_q}, {s_k}], got {:?}",
            mask.dims()
        );
    }
    assert_ne!(
        block_rows,
        Some(0),
        "flash_attention: block_rows must be at least 1"
    );
    let block_rows = block_rows.unwrap_or_else(|| default_block_rows(batch * heads, s_k));
    let float = |t: Tensor<B, 4>| t.into_primitive().tensor();
    Tensor::from_primitive(TensorPrimitive::Float(B::flash_attention(
        float(q),
        float(k),
        float(v),
        mask.map(Tensor::into_primitive),
        causal,
        block_rows,
    )))
}

/// What the backward pass keeps: the inputs' checkpoints, the output and the log-normalisers.
#[derive(Clone, Debug)]
struct Saved<B: Backend> {
    q: NodeId,
    k: NodeId,
    v: NodeId,
    mask: Option<BoolTensor<B>>,
    output: FloatTensor<B>,
    /// `[batch, heads, s_q, 1]`.
    lse: FloatTensor<B>,
    causal: bool,
    block_rows: usize,
}

/// The backward step; its parents are `[q, k, v]`.
#[derive(Debug)]
struct FlashBackward;

impl<B: Backend> Backward<B, 3> for FlashBackward {
    type State = Saved<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [q_node, k_node, v_node] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let saved = ops.state;
        let float = |t: FloatTensor<B>| Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(t));
        let blockwise = Blockwise {
            q: float(checkpointer.retrieve_node_output(saved.q)),
            k: float(checkpointer.retrieve_node_output(saved.k)),
            v: float(checkpointer.retrieve_node_output(saved.v)),
            mask: saved.mask.map(Tensor::from_primitive),
            causal: saved.causal,
            block_rows: saved.block_rows,
        };
        let out = blockwise.backward(float(saved.output), float(saved.lse), float(grad));
        for (node, g) in [(q_node, out.q), (k_node, out.k), (v_node, out.v)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, g.into_primitive().tensor());
            }
        }
    }
}

impl<B: Backend, C: CheckpointStrategy> FlashAttention for Autodiff<B, C> {
    fn flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: Option<BoolTensor<Self>>,
        causal: bool,
        block_rows: usize,
    ) -> FloatTensor<Self> {
        let inner = |t: &FloatTensor<Self>| {
            Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(t.primitive.clone()))
        };
        let blockwise = Blockwise {
            q: inner(&q),
            k: inner(&k),
            v: inner(&v),
            mask: mask.clone().map(Tensor::from_primitive),
            causal,
            block_rows,
        };
        let (output, lse) = blockwise.forward();
        match FlashBackward
            .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let output = output.into_primitive().tensor();
                let saved = Saved {
                    q: prep.checkpoint(&q),
                    k: prep.checkpoint(&k),
                    v: prep.checkpoint(&v),
                    mask,
                    output: output.clone(),
                    lse: lse.into_primitive().tensor(),
                    causal,
                    block_rows,
                };
                prep.finish(saved, output)
            }
            OpsKind::UnTracked(prep) => prep.finish(output.into_primitive().tensor()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::sdpa::attend_explicit;
    use burn::backend::Flex;
    use burn::nn::DropoutConfig;
    use burn::tensor::{Distribution, TensorData};

    type Ad = Autodiff<Flex>;

    /// Values and gradients of `q`, `k`, `v` through the flash op equal those of the explicit
    /// scoring: causal and not, `s_q` below, equal to and above `s_k`, with a mask that hides
    /// whole rows, for block sizes that split the queries unevenly, one row per block and all
    /// rows in one block.
    #[test]
    fn values_and_gradients_equal_the_explicit_scoring() {
        let device = Default::default();
        let no_dropout = DropoutConfig::new(0.0).init();
        for (s_q, s_k) in [(7, 7), (3, 7), (7, 4)] {
            let data = |s: usize| {
                Tensor::<Flex, 4>::random([2, 3, s, 8], Distribution::Normal(0.0, 1.0), &device)
                    .into_data()
                    .to_vec::<f32>()
                    .expect("f32 data")
            };
            let (qd, kd, vd, wd) = (data(s_q), data(s_k), data(s_k), data(s_q));
            let mut bits = vec![false; 2 * 3 * s_q * s_k];
            bits[..s_k].fill(true); // row 0 of batch 0, head 0: fully masked
            bits[s_k * s_q + 1] = true;
            bits[2 * s_k * s_q + s_k + 2] = true;
            let mask =
                Tensor::<Ad, 4, Bool>::from_bool(TensorData::new(bits, [2, 3, s_q, s_k]), &device);
            for causal in [false, true] {
                for mask in [None, Some(mask.clone())] {
                    for block_rows in [1, 3, 64] {
                        let leaf = |d: &Vec<f32>, s| {
                            Tensor::<Ad, 4>::from_data(
                                TensorData::new(d.clone(), [2, 3, s, 8]),
                                &device,
                            )
                            .require_grad()
                        };
                        let weight = Tensor::<Ad, 4>::from_data(
                            TensorData::new(wd.clone(), [2, 3, s_q, 8]),
                            &device,
                        );
                        let run = |flash: bool| {
                            let (q, k, v) = (leaf(&qd, s_q), leaf(&kd, s_k), leaf(&vd, s_k));
                            let out = match flash {
                                true => flash_attention(
                                    q.clone(),
                                    k.clone(),
                                    v.clone(),
                                    mask.clone(),
                                    causal,
                                    Some(block_rows),
                                ),
                                false => attend_explicit(
                                    q.clone(),
                                    k.clone(),
                                    v.clone(),
                                    mask.clone(),
                                    causal,
                                    &no_dropout,
                                ),
                            };
                            let grads = (out.clone() * weight.clone()).sum().backward();
                            let grad =
                                |t: &Tensor<Ad, 4>| t.grad(&grads).expect("a leaf gets a gradient");
                            [out.inner(), grad(&q), grad(&k), grad(&v)]
                        };
                        for (got, expected) in run(true).into_iter().zip(run(false)) {
                            let what =
                                format!("({s_q}, {s_k}), causal {causal}, blocks of {block_rows}");
                            crate::attention::host::assert_close_to_scale(got, expected, &what);
                        }
                    }
                }
            }
        }
    }
}
