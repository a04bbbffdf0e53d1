use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, backend::Backend};

/// Mean cross-entropy over the positions where `weight` is non-zero (1 = counted, 0 = ignored):
/// `Σ weight·(−log p(target)) / Σ weight`. Targets at ignored positions may be any valid index.
///
/// # Shapes
/// - `logits`: `[n, vocab]`; `targets`: `[n]`; `weight`: `[n]`
/// - output: `[1]`
pub fn masked_cross_entropy<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    weight: Tensor<B, 1>,
) -> Tensor<B, 1> {
    let [n, _] = logits.dims();
    let log_p = log_softmax(logits, 1)
        .gather(1, targets.reshape([n, 1]))
        .reshape([n]); // [n]
    let total = weight.clone().sum().clamp_min(1.0);
    (log_p * weight).sum().neg() / total
}
