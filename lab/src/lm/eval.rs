//! The language-modelling loss, and evaluation on the fixed validation batches.

use super::LossKind;
use crate::data::{TokenBatch, bits_per_byte};
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use coupled_qk::model::{
    FusedOps, Gpt, default_chunk_rows, fused_linear_cross_entropy, linear_cross_entropy,
};
use serde::{Deserialize, Serialize};

/// Validation metrics.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Validation {
    /// Mean loss per target token (nats).
    pub loss: f64,
    /// Perplexity: `exp(loss)`.
    pub ppl: f64,
    /// Bits per UTF-8 byte of the target text: comparable across tokenizers.
    pub bpb: f64,
}

/// A batch's inputs `[rows, seq_len]` and targets `[rows·seq_len]` as tensors.
pub fn batch_tensors<B: Backend>(
    batch: &TokenBatch,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 1, Int>) {
    let n = batch.rows * batch.seq_len;
    (
        Tensor::from_data(
            TensorData::new(batch.inputs.clone(), [batch.rows, batch.seq_len]),
            device,
        ),
        Tensor::from_data(TensorData::new(batch.targets.clone(), [n]), device),
    )
}

/// `−log p(target)` summed over every position of the batch, computed as `loss` says: from the
/// full logits, or in row chunks that never hold them (the evaluation path; on an autodiff
/// backend the chunks' graph keeps every chunk's logits: train with [`batch_loss`]).
///
/// # Shapes
/// - output: `[1]`
pub fn batch_nats<B: Backend>(
    model: &Gpt<B>,
    batch: &TokenBatch,
    device: &B::Device,
    loss: LossKind,
) -> Tensor<B, 1> {
    let (inputs, targets) = batch_tensors::<B>(batch, device);
    let n = batch.rows * batch.seq_len;
    match loss {
        LossKind::Explicit => {
            let logits = model.forward(inputs); // [rows, seq_len, vocab]
            let vocab = logits.dims()[2];
            log_softmax(logits.reshape([n, vocab]), 1)
                .gather(1, targets.reshape([n, 1]))
                .sum()
                .neg()
        }
        LossKind::Fused => {
            let (hidden, head) = hidden_and_head(model, inputs, n);
            let chunk = default_chunk_rows(head.dims()[0]);
            linear_cross_entropy(hidden, head, model.head_bias(), targets, None, chunk)
        }
    }
}

/// The mean token loss of a training batch (what the optimiser minimises), computed as `loss`
/// says: with [`LossKind::Fused`] by the fused linear cross-entropy, whose forward and backward
/// passes never hold the `[tokens, vocab]` logits.
///
/// # Shapes
/// - output: `[1]`
pub fn batch_loss<B: FusedOps>(
    model: &Gpt<B>,
    batch: &TokenBatch,
    device: &B::Device,
    loss: LossKind,
) -> Tensor<B, 1> {
    let n = batch.rows * batch.seq_len;
    let nats = match loss {
        LossKind::Explicit => batch_nats(model, batch, device, loss),
        LossKind::Fused => {
            let (inputs, targets) = batch_tensors::<B>(batch, device);
            let (hidden, head) = hidden_and_head(model, inputs, n);
            let chunk = default_chunk_rows(head.dims()[0]);
            fused_linear_cross_entropy(hidden, head, model.head_bias(), targets, None, chunk)
        }
    };
    nats / n as f64
}

/// The final hidden states as rows `[n, d]` and the LM head's weight `[vocab, d]`.
fn hidden_and_head<B: Backend>(
    model: &Gpt<B>,
    inputs: Tensor<B, 2, Int>,
    n: usize,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let hidden = model.forward_hidden(inputs); // [rows, seq_len, d]
    let d = hidden.dims()[2];
    (hidden.reshape([n, d]), model.head_weight())
}

/// Loss, perplexity and bits per byte over `batches` (give it `model.valid()`: no autodiff), the
/// loss computed as `loss` says.
///
/// The nats of each batch are summed in `f64`, so the result does not depend on how the windows
/// are split into batches beyond float rounding inside one batch.
pub fn evaluate<B: Backend>(
    model: &Gpt<B>,
    batches: &[TokenBatch],
    device: &B::Device,
    loss: LossKind,
) -> Validation {
    let (mut nats, mut tokens, mut bytes) = (0.0f64, 0u64, 0u64);
    for batch in batches {
        nats += batch_nats(model, batch, device, loss)
            .into_scalar()
            .elem::<f64>();
        tokens += (batch.rows * batch.seq_len) as u64;
        bytes += batch.target_bytes;
    }
    let loss = nats / tokens.max(1) as f64;
    Validation {
        loss,
        ppl: loss.exp(),
        bpb: bits_per_byte(nats, bytes.max(1)),
    }
}
