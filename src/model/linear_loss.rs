//! Cross-entropy of a linear head's logits computed in row chunks, so that the `[n, vocab]`
//! logits and log-probabilities are never held at once: the forward pass for evaluation (any
//! backend, no gradient), and the chunk arithmetic that the fused autodiff op
//! ([`fused_linear_cross_entropy`](super::fused_linear_cross_entropy)) shares with it.
//!
//! Shapes in comments: `n` rows, `c` rows of a chunk, `d` hidden width, `v` vocabulary.

#[cfg(feature = "autodiff")]
use burn::tensor::IndexingUpdateOp;
use burn::tensor::{ElementConversion, FloatDType, Int, Tensor, backend::Backend};
use core::ops::Range;

/// The logit floats a chunk holds with [`default_chunk_rows`]: 32M (128 MB in f32).
pub const CHUNK_FLOATS: usize = 1 << 25;

/// Rows per chunk such that a chunk's `[rows, vocab]` logits hold about [`CHUNK_FLOATS`] floats
/// (at least one row). With GPT-2's vocabulary (50257) that is 667 rows; with a vocabulary of a
/// few hundred a whole batch is one chunk.
pub fn default_chunk_rows(vocab: usize) -> usize {
    (CHUNK_FLOATS / vocab.max(1)).max(1)
}

/// `Σ_i weight_i · (−log softmax(hidden_i · headᵀ + bias)[target_i])`: the summed token loss of a
/// linear head, computed `chunk_rows` rows at a time. Without `weight` every row counts once;
/// divide by `n` (or by `Σ weight`) for the mean.
///
/// This is the forward pass only. On an autodiff backend it is still differentiable, but the
/// graph keeps every chunk's logits for the backward pass, so it saves no memory there: train
/// with [`fused_linear_cross_entropy`](super::fused_linear_cross_entropy), which computes the
/// gradients chunk by chunk in its forward pass instead.
///
/// # Shapes
/// - `hidden`: `[n, d]`; `head`: `[vocab, d]`; `bias`: `[vocab]`
/// - `targets`: `[n]`, each in `0..vocab` (see [`mask_ignored_targets`] for an ignore index);
///   `weight`: `[n]`
/// - output: `[1]`
///
/// # Panics
/// If the shapes do not match, `n` is 0, `chunk_rows` is 0, or a target is outside `0..vocab`
/// (the message names it and its row; checking reads one value back from the device).
pub fn linear_cross_entropy<B: Backend>(
    hidden: Tensor<B, 2>,
    head: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    targets: Tensor<B, 1, Int>,
    weight: Option<Tensor<B, 1>>,
    chunk_rows: usize,
) -> Tensor<B, 1> {
    LinearLoss::new(hidden, head, bias, targets, weight, chunk_rows).forward()
}

/// Targets with an ignore index (PyTorch's `ignore_index`, e.g. `-100` at padding) as the losses
/// take them: each row whose target is `ignore_index` gets weight 0 (times `weight`'s, where
/// given) and target 0, so that it adds nothing to the loss or the gradients. Pass both to
/// [`linear_cross_entropy`] or [`fused_linear_cross_entropy`](super::fused_linear_cross_entropy)
/// and divide by the weights' sum for the mean over the kept rows.
///
/// # Shapes
/// - `targets`, `weight` and both outputs: `[n]`
pub fn mask_ignored_targets<B: Backend>(
    targets: Tensor<B, 1, Int>,
    weight: Option<Tensor<B, 1>>,
    ignore_index: i64,
) -> (Tensor<B, 1, Int>, Tensor<B, 1>) {
    let ignored = targets.clone().equal_elem(ignore_index);
    let kept = ignored.clone().bool_not().float();
    let weight = match weight {
        Some(weight) => {
            let dtype = FloatDType::from(weight.dtype());
            weight * kept.cast(dtype)
        }
        None => kept,
    };
    (targets.mask_fill(ignored, 0), weight)
}

/// Panics with a message naming the first target outside `0..vocab`, if any (one read of the
/// device: Flex would otherwise panic on an index out of bounds, a GPU read other memory).
fn check_targets<B: Backend>(targets: &Tensor<B, 1, Int>, vocab: usize) {
    let outside = targets
        .clone()
        .lower_elem(0)
        .bool_or(targets.clone().greater_equal_elem(vocab as i64));
    if outside.clone().int().sum().into_scalar().elem::<i64>() == 0 {
        return;
    }
    let row = outside.int().argmax(0).into_scalar().elem::<i64>() as usize;
    let target = targets
        .clone()
        .narrow(0, row, 1)
        .into_scalar()
        .elem::<i64>();
    panic!(
        "linear cross-entropy: target {target} of row {row} is outside the vocabulary 0..{vocab}; \
         for rows to ignore (padding marked -100), pass the targets through \
         mask_ignored_targets(targets, weight, -100) first"
    );
}

/// The inputs of a chunked linear cross-entropy, checked, and its per-chunk passes.
#[derive(Clone, Debug)]
pub(crate) struct LinearLoss<B: Backend> {
    /// `[n, d]`.
    pub hidden: Tensor<B, 2>,
    /// `[v, d]`.
    pub head: Tensor<B, 2>,
    /// `[v]`.
    pub bias: Option<Tensor<B, 1>>,
    /// `[n]`.
    pub targets: Tensor<B, 1, Int>,
    /// `[n]`.
    pub weight: Option<Tensor<B, 1>>,
    pub chunk_rows: usize,
}

/// Which gradients [`LinearLoss::forward_with_grads`] computes.
#[cfg(feature = "autodiff")]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Wanted {
    pub hidden: bool,
    pub head: bool,
    pub bias: bool,
}

/// The gradients of the summed loss, those that were [`Wanted`].
#[cfg(feature = "autodiff")]
pub(crate) struct LinearLossGrads<B: Backend> {
    /// `[n, d]`.
    pub hidden: Option<Tensor<B, 2>>,
    /// `[v, d]`.
    pub head: Option<Tensor<B, 2>>,
    /// `[v]`.
    pub bias: Option<Tensor<B, 1>>,
}

impl<B: Backend> LinearLoss<B> {
    /// Checks the shapes (see [`linear_cross_entropy`] for them and the panics).
    pub fn new(
        hidden: Tensor<B, 2>,
        head: Tensor<B, 2>,
        bias: Option<Tensor<B, 1>>,
        targets: Tensor<B, 1, Int>,
        weight: Option<Tensor<B, 1>>,
        chunk_rows: usize,
    ) -> Self {
        let [n, d] = hidden.dims();
        let [v, head_d] = head.dims();
        assert!(n > 0, "linear cross-entropy: no rows");
        assert!(
            chunk_rows > 0,
            "linear cross-entropy: chunk_rows must be at least 1"
        );
        assert_eq!(
            head_d, d,
            "linear cross-entropy: head [{v}, {head_d}] does not match hidden [{n}, {d}]"
        );
        if let Some(bias) = &bias {
            assert_eq!(bias.dims(), [v], "linear cross-entropy: bias is not [{v}]");
        }
        assert_eq!(
            targets.dims(),
            [n],
            "linear cross-entropy: targets are not [{n}]"
        );
        if let Some(weight) = &weight {
            assert_eq!(
                weight.dims(),
                [n],
                "linear cross-entropy: weight is not [{n}]"
            );
        }
        check_targets(&targets, v);
        Self {
            hidden,
            head,
            bias,
            targets,
            weight,
            chunk_rows,
        }
    }

    fn rows(&self) -> usize {
        self.hidden.dims()[0]
    }

    /// The row ranges of the chunks, the last one shorter when `chunk_rows` does not divide `n`.
    fn chunks(&self) -> impl Iterator<Item = Range<usize>> + use<B> {
        let (n, step) = (self.rows(), self.chunk_rows);
        (0..n)
            .step_by(step)
            .map(move |start| start..(start + step).min(n))
    }

    /// The logits of the rows `h`: `[c, d]` → `[c, v]`.
    fn logits(&self, h: Tensor<B, 2>) -> Tensor<B, 2> {
        let z = h.matmul(self.head.clone().transpose()); // [c, v]
        match &self.bias {
            Some(bias) => z + bias.clone().unsqueeze::<2>(),
            None => z,
        }
    }

    /// The target of each row of a chunk, `[c, 1]`.
    fn chunk_targets(&self, rows: &Range<usize>) -> Tensor<B, 2, Int> {
        let c = rows.len();
        self.targets
            .clone()
            .narrow(0, rows.start, c)
            .reshape([c, 1])
    }

    /// A chunk's shifted logits `z − max` `[c, v]`, their exponentials `[c, v]` and the rows'
    /// sums of those `[c, 1]`. Shifted by the row's maximum as log_softmax is, so that exp cannot
    /// overflow.
    fn shifted_logits(&self, rows: &Range<usize>) -> (Tensor<B, 2>, Tensor<B, 2>, Tensor<B, 2>) {
        let z = self.logits(self.hidden.clone().narrow(0, rows.start, rows.len())); // [c, v]
        let shifted = z.clone() - z.max_dim(1);
        let exp = shifted.clone().exp();
        let sum = exp.clone().sum_dim(1);
        (shifted, exp, sum)
    }

    /// A chunk's weighted token losses `[c]` from its shifted logits and log-normalisers.
    fn chunk_nats(
        &self,
        rows: &Range<usize>,
        shifted: Tensor<B, 2>,
        log_norm: Tensor<B, 2>,
    ) -> Tensor<B, 1> {
        let c = rows.len();
        let nats = (log_norm - shifted.gather(1, self.chunk_targets(rows))).reshape([c]);
        match &self.weight {
            Some(weight) => nats * weight.clone().narrow(0, rows.start, c),
            None => nats,
        }
    }

    /// The weighted summed loss `[1]`.
    pub fn forward(&self) -> Tensor<B, 1> {
        let mut total = Tensor::zeros([1], &self.hidden.device());
        for rows in self.chunks() {
            let (shifted, _, sum) = self.shifted_logits(&rows);
            total = total + self.chunk_nats(&rows, shifted, sum.log()).sum();
        }
        total
    }

    /// The weighted summed loss `[1]` and its gradients (those `wanted`), computed in the same
    /// pass: per chunk, `dz = weight · (softmax − onehot(target))` `[c, v]` from the forward
    /// pass's own exponentials, `dhidden = dz · head`, `dhead += dzᵀ · hidden`,
    /// `dbias += Σ_rows dz`. These are the gradients for an upstream gradient of 1; the loss is a
    /// scalar, so its backward pass only scales them by the gradient that reaches it. A chunk
    /// thus costs three `[c, d] × [d, v]`-sized products, as an explicit loss does, and no
    /// recomputation of its logits.
    #[cfg(feature = "autodiff")]
    pub fn forward_with_grads(&self, wanted: Wanted) -> (Tensor<B, 1>, LinearLossGrads<B>) {
        let mut total = Tensor::zeros([1], &self.hidden.device());
        let mut hidden_chunks = Vec::new();
        let (mut head, mut bias): (Option<Tensor<B, 2>>, Option<Tensor<B, 1>>) = (None, None);
        for rows in self.chunks() {
            let c = rows.len();
            let (shifted, exp, sum) = self.shifted_logits(&rows);
            let softmax = exp / sum.clone(); // [c, v]
            total = total + self.chunk_nats(&rows, shifted, sum.clone().log()).sum();
            let scale = match &self.weight {
                Some(weight) => weight.clone().narrow(0, rows.start, c).reshape([c, 1]),
                None => sum.ones_like(),
            }; // [c, 1]
            // The one-hot term touches one logit per row: a scatter, not a [c, v] one-hot.
            let dz = (softmax * scale.clone()).scatter(
                1,
                self.chunk_targets(&rows),
                scale.neg(),
                IndexingUpdateOp::Add,
            );
            if wanted.hidden {
                hidden_chunks.push(dz.clone().matmul(self.head.clone())); // [c, d]
            }
            if wanted.head {
                let h = self.hidden.clone().narrow(0, rows.start, c); // [c, d]
                let part = dz.clone().transpose().matmul(h); // [v, d]
                head = Some(match head {
                    Some(sum) => sum + part,
                    None => part,
                });
            }
            if wanted.bias {
                let part = dz.sum_dim(0).squeeze_dim::<1>(0); // [v]
                bias = Some(match bias {
                    Some(sum) => sum + part,
                    None => part,
                });
            }
        }
        let grads = LinearLossGrads {
            hidden: wanted.hidden.then(|| Tensor::cat(hidden_chunks, 0)),
            head,
            bias,
        };
        (total, grads)
    }
}
