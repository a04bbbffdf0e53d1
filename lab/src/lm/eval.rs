//! The language-modelling loss, and evaluation on the fixed validation batches.

use crate::data::{TokenBatch, bits_per_byte};
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use coupled_qk::model::Gpt;
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

/// `−log p(target)` summed over every position of the batch.
///
/// # Shapes
/// - output: `[1]`
pub fn batch_nats<B: Backend>(
    model: &Gpt<B>,
    batch: &TokenBatch,
    device: &B::Device,
) -> Tensor<B, 1> {
    let (inputs, targets) = batch_tensors::<B>(batch, device);
    let n = batch.rows * batch.seq_len;
    let logits = model.forward(inputs); // [rows, seq_len, vocab]
    let vocab = logits.dims()[2];
    log_softmax(logits.reshape([n, vocab]), 1)
        .gather(1, targets.reshape([n, 1]))
        .sum()
        .neg()
}

/// The mean token loss of a training batch (what the optimiser minimises).
///
/// # Shapes
/// - output: `[1]`
pub fn batch_loss<B: Backend>(
    model: &Gpt<B>,
    batch: &TokenBatch,
    device: &B::Device,
) -> Tensor<B, 1> {
    batch_nats(model, batch, device) / (batch.rows * batch.seq_len) as f64
}

/// Loss, perplexity and bits per byte over `batches` (give it `model.valid()`: no autodiff).
///
/// The nats of each batch are summed in `f64`, so the result does not depend on how the windows
/// are split into batches beyond float rounding inside one batch.
pub fn evaluate<B: Backend>(
    model: &Gpt<B>,
    batches: &[TokenBatch],
    device: &B::Device,
) -> Validation {
    let (mut nats, mut tokens, mut bytes) = (0.0f64, 0u64, 0u64);
    for batch in batches {
        nats += batch_nats(model, batch, device).into_scalar().elem::<f64>();
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
