//! The fused linear cross-entropy: the LM head and the token loss as one autodiff op that goes
//! over row chunks, so that it never holds the `[n, vocab]` logits or log-probabilities. The
//! loss is a scalar at the end of the graph, so its forward pass computes the gradients as well,
//! chunk by chunk, from each chunk's own softmax (three `[c, d] × [d, v]`-sized products per
//! chunk, as an explicit loss makes), and its backward pass scales them by the gradient that
//! reaches it.
//!
//! It is a custom op of Burn's [`Autodiff`] backend, written with the inner backend's tensor ops,
//! so it runs on every backend that Autodiff wraps; [`FusedLoss`] exposes it, with a blanket
//! implementation for `Autodiff<B, C>`.

use super::linear_loss::{LinearLoss, Wanted};
use crate::attention::FlashAttention;
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor, TensorPrimitive};

/// An autodiff backend with the fused linear cross-entropy: every `Autodiff<B, C>`.
pub trait FusedLoss: AutodiffBackend {
    /// [`fused_linear_cross_entropy`] on primitives (shapes already checked).
    fn fused_linear_cross_entropy(
        hidden: FloatTensor<Self>,
        head: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        targets: IntTensor<Self>,
        weight: Option<FloatTensor<Self>>,
        chunk_rows: usize,
    ) -> FloatTensor<Self>;
}

/// An autodiff backend with both of the crate's fused training ops, the loss ([`FusedLoss`]) and
/// attention ([`FlashAttention`]): every `Autodiff<B, C>`.
pub trait FusedOps: FusedLoss + FlashAttention {}

impl<B: FusedLoss + FlashAttention> FusedOps for B {}

/// `Σ_i weight_i · (−log softmax(hidden_i · headᵀ + bias)[target_i])`, the summed token loss of a
/// linear head, as one autodiff op that never holds more than `chunk_rows` rows of logits (see
/// [`default_chunk_rows`](super::default_chunk_rows)); the value of
/// [`linear_cross_entropy`](super::linear_cross_entropy), with gradients for `hidden`, `head` and
/// `bias`. Without `weight` every row counts once; divide by `n` (or `Σ weight`) for the mean.
/// `targets` and `weight` are constants: no gradient flows into `weight`.
///
/// Tracked by autodiff, the forward pass computes the gradients of the inputs that need one
/// (for an upstream gradient of 1), holding one chunk's `[chunk_rows, vocab]` logits and softmax
/// at a time; the graph keeps those gradients (the sizes of `hidden`, `head` and `bias`) until
/// it is dropped, and the backward pass scales them. So a tracked call costs its gradients' work
/// and memory whether or not `backward` follows: compute a loss that is only looked at (an
/// evaluation) on the inner backend (`model.valid()`), or with [`linear_cross_entropy`](super::linear_cross_entropy).
///
/// # Shapes
/// - `hidden`: `[n, d]`; `head`: `[vocab, d]`; `bias`: `[vocab]`
/// - `targets`: `[n]`, each in `0..vocab` (see
///   [`mask_ignored_targets`](super::mask_ignored_targets) for an ignore index); `weight`: `[n]`
/// - output: `[1]`
///
/// # Panics
/// If the shapes do not match, `n` is 0, `chunk_rows` is 0, or a target is outside `0..vocab`
/// (the message names it and its row; checking reads one value back from the device).
pub fn fused_linear_cross_entropy<B: FusedLoss>(
    hidden: Tensor<B, 2>,
    head: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    targets: Tensor<B, 1, Int>,
    weight: Option<Tensor<B, 1>>,
    chunk_rows: usize,
) -> Tensor<B, 1> {
    let checked = LinearLoss::new(hidden, head, bias, targets, weight, chunk_rows);
    let float = |t: Tensor<B, 2>| t.into_primitive().tensor();
    let vector = |t: Tensor<B, 1>| t.into_primitive().tensor();
    Tensor::from_primitive(TensorPrimitive::Float(B::fused_linear_cross_entropy(
        float(checked.hidden),
        float(checked.head),
        checked.bias.map(vector),
        checked.targets.into_primitive(),
        checked.weight.map(vector),
        checked.chunk_rows,
    )))
}

/// What the backward pass keeps: the gradients of the loss for an upstream gradient of 1, of
/// the parents that need one.
#[derive(Clone, Debug)]
struct Saved<B: Backend> {
    /// `[n, d]`.
    hidden: Option<FloatTensor<B>>,
    /// `[vocab, d]`.
    head: Option<FloatTensor<B>>,
    /// `[vocab]`.
    bias: Option<FloatTensor<B>>,
}

/// The backward step; its parents are `[hidden, head, bias]`.
#[derive(Debug)]
struct FusedLinearCrossEntropy;

impl<B: Backend> Backward<B, 3> for FusedLinearCrossEntropy {
    type State = Saved<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let [hidden_node, head_node, bias_node] = ops.parents;
        // The loss is `[1]`: the gradient reaching it is one number, which scales each saved one.
        let grad =
            Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(grads.consume::<B>(&ops.node)));
        let saved = ops.state;
        let matrix = |t: FloatTensor<B>| {
            let t = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t));
            (t * grad.clone().reshape([1, 1])).into_primitive().tensor()
        };
        if let (Some(node), Some(g)) = (hidden_node, saved.hidden) {
            grads.register::<B>(node.id, matrix(g));
        }
        if let (Some(node), Some(g)) = (head_node, saved.head) {
            grads.register::<B>(node.id, matrix(g));
        }
        if let (Some(node), Some(g)) = (bias_node, saved.bias) {
            let g = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(g)) * grad;
            grads.register::<B>(node.id, g.into_primitive().tensor());
        }
    }
}

impl<B: Backend, C: CheckpointStrategy> FusedLoss for Autodiff<B, C> {
    fn fused_linear_cross_entropy(
        hidden: FloatTensor<Self>,
        head: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        targets: IntTensor<Self>,
        weight: Option<FloatTensor<Self>>,
        chunk_rows: usize,
    ) -> FloatTensor<Self> {
        let float = |t: &FloatTensor<Self>| {
            Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t.primitive.clone()))
        };
        let vector = |t: &FloatTensor<Self>| {
            Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t.primitive.clone()))
        };
        let loss = LinearLoss {
            hidden: float(&hidden),
            head: float(&head),
            bias: bias.as_ref().map(vector),
            targets: Tensor::from_primitive(targets.clone()),
            // A constant: its graph (if any) is not followed.
            weight: weight.as_ref().map(vector),
            chunk_rows,
        };
        // The op has three parents; without a bias the third is a stand-in that never requires
        // a gradient (a fresh leaf on the hidden states' buffer, not a copy).
        let bias_parent = bias
            .clone()
            .unwrap_or_else(|| Self::from_inner(hidden.primitive.clone()));
        match FusedLinearCrossEntropy
            .prepare::<C>([
                hidden.node.clone(),
                head.node.clone(),
                bias_parent.node.clone(),
            ])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let wanted = Wanted {
                    hidden: !hidden.node.requirement.is_none(),
                    head: !head.node.requirement.is_none(),
                    bias: bias.as_ref().is_some_and(|b| !b.node.requirement.is_none()),
                };
                let (total, grads) = loss.forward_with_grads(wanted);
                let primitive = |t: Tensor<B, 2>| t.into_primitive().tensor();
                let saved = Saved {
                    hidden: grads.hidden.map(primitive),
                    head: grads.head.map(primitive),
                    bias: grads.bias.map(|t| t.into_primitive().tensor()),
                };
                prep.finish(saved, total.into_primitive().tensor())
            }
            OpsKind::UnTracked(prep) => prep.finish(loss.forward().into_primitive().tensor()),
        }
    }
}
