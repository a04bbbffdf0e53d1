//! One MQAR training run: a small attention model trained until it recalls (accuracy ≥ 0.99)
//! or its step budget ends.

use super::data::{IGNORE, MqarBatch, MqarTask};
use crate::lm::sharded_gradients;
use crate::schedule::WarmupCosine;
use burn::module::AutodiffModule;
use burn::optim::grad_clipping::GradientClippingConfig;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use coupled_qk::model::AttentionVariant;
use coupled_qk::model::{Gpt, GptConfig, masked_cross_entropy};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Everything that defines one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MqarRun {
    pub task: MqarTask,
    pub variant: AttentionVariant,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_layers: usize,
    /// Blocks with a GELU MLP (Zoology's figure 2 has none).
    pub mlp: bool,
    pub lr: f64,
    pub weight_decay: f64,
    pub batch_size: usize,
    pub train_examples: usize,
    pub test_examples: usize,
    /// Training steps at most (the cosine schedule spans them).
    pub steps: usize,
    /// Evaluate every this many steps; stop once test accuracy ≥ 0.99.
    pub eval_every: usize,
    pub seed: u64,
}

/// What a run measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainOutcome {
    /// The best test accuracy seen (mean over query positions).
    pub accuracy: f64,
    /// The first evaluated step with accuracy ≥ 0.99, if any.
    pub steps_to_99: Option<usize>,
    /// Steps run.
    pub steps: usize,
    /// The training loss at the last evaluation; `None` before any evaluation or when it was
    /// not finite.
    pub final_loss: Option<f64>,
    /// Whether the run stopped at a non-finite training loss (`false` in results written before
    /// the field existed: those runs were not checked).
    #[serde(default)]
    pub diverged: bool,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Parameters of the model, and those the dynamics add.
    pub params: usize,
    pub extra_params: usize,
}

/// Inputs `[n, L]`, targets `[n·L]` (ignored positions set to 0) and weights `[n·L]`.
fn tensors<B: Backend>(
    batch: &MqarBatch,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 1, Int>, Tensor<B, 1>) {
    let shape = [batch.n, batch.seq_len];
    let n = batch.n * batch.seq_len;
    let inputs = Tensor::from_data(TensorData::new(batch.inputs.clone(), shape), device);
    let targets: Vec<i64> = batch.labels.iter().map(|&l| l.max(0)).collect();
    let weight: Vec<f32> = batch
        .labels
        .iter()
        .map(|&l| if l == IGNORE { 0.0 } else { 1.0 })
        .collect();
    (
        inputs,
        Tensor::from_data(TensorData::new(targets, [n]), device),
        Tensor::from_data(TensorData::new(weight, [n]), device),
    )
}

/// The gradient of `batch`'s masked cross-entropy over `devices`, and its loss (read when asked:
/// with one device the value stays on the device until then).
///
/// With several devices the examples are split into equal shards and go through
/// [`sharded_gradients`]; shard `k`'s loss is its own mean weighted by its share `W_k / W` of the
/// batch's query positions, so the shards' gradients sum to the one-device gradient (up to float
/// rounding) even when the shards hold different numbers of queries. A shard's non-finite loss
/// skips the step's update there (its value is reported), where one device applies whatever its
/// backward gives: either way the run's accuracy shows it.
///
/// # Panics
/// If `devices` is empty or does not divide `batch.n`.
pub fn batch_gradients<'a, B: AutodiffBackend>(
    model: &Gpt<B>,
    batch: &MqarBatch,
    devices: &'a [B::Device],
) -> (Box<dyn FnOnce() -> f64 + 'a>, GradientsParams) {
    let loss = |model: &Gpt<B>, batch: &MqarBatch, device: &B::Device| {
        let (inputs, targets, weight) = tensors::<B>(batch, device);
        let logits = model.forward(inputs); // [n, L, V]
        let [n, l, vocab] = logits.dims();
        masked_cross_entropy(logits.reshape([n * l, vocab]), targets, weight)
    };
    if let [device] = devices {
        let loss = loss(model, batch, device);
        let grads = GradientsParams::from_grads(loss.backward(), model);
        return (Box::new(move || loss.into_scalar().elem::<f64>()), grads);
    }
    assert!(
        !devices.is_empty() && batch.n.is_multiple_of(devices.len()),
        "{} examples do not split over {} devices",
        batch.n,
        devices.len()
    );
    let rows = batch.n / devices.len();
    let shards: Vec<MqarBatch> = (0..devices.len())
        .map(|k| batch.slice(k * rows..(k + 1) * rows))
        .collect();
    let queries = |b: &MqarBatch| b.labels.iter().filter(|&&l| l != IGNORE).count() as f64;
    let total = queries(batch).max(1.0);
    let weighted = |model: &Gpt<B>, shard: &MqarBatch, device: &B::Device| {
        loss(model, shard, device) * (queries(shard) / total)
    };
    let (value, grads) = sharded_gradients(model, &shards, devices, 1.0, weighted)
        .unwrap_or_else(|value| (value, GradientsParams::new()));
    (Box::new(move || value), grads)
}

/// Accuracy over the query positions of `data`.
pub fn accuracy<B: Backend>(model: &Gpt<B>, data: &MqarBatch, batch_size: usize) -> f64 {
    let device = model.tokens.weight.device();
    let (mut correct, mut total) = (0.0, 0.0);
    for start in (0..data.n).step_by(batch_size) {
        let batch = data.slice(start..(start + batch_size).min(data.n));
        let (inputs, targets, weight) = tensors::<B>(&batch, &device);
        let n = batch.n * batch.seq_len;
        let predicted = model.forward(inputs).argmax(2).reshape([n]); // [n·L]
        let hits = predicted.equal(targets).float() * weight.clone();
        correct += hits.sum().into_scalar().elem::<f64>();
        total += weight.sum().into_scalar().elem::<f64>();
    }
    correct / total.max(1.0)
}

/// Trains one model on `run` over `devices` (the first is the main one; several train
/// data-parallel: each takes `batch_size / devices.len()` examples of every batch), reporting to
/// `progress` (its length is set to the step budget).
///
/// # Panics
/// If `devices` is empty or does not divide `run.batch_size` (the program checks both first).
pub fn train<B: AutodiffBackend>(
    run: &MqarRun,
    devices: &[B::Device],
    progress: &ProgressBar,
) -> TrainOutcome {
    assert!(
        !devices.is_empty() && run.batch_size.is_multiple_of(devices.len()),
        "batch size {} does not split over {} devices",
        run.batch_size,
        devices.len()
    );
    let device = &devices[0];
    let started = Instant::now();
    B::seed(device, run.seed);
    // Disjoint seeds for the two sets.
    let train_set = run
        .task
        .generate(run.train_examples, run.seed.wrapping_mul(2));
    let test_set = run
        .task
        .generate(run.test_examples, run.seed.wrapping_mul(2) + 1);
    let config = GptConfig::new(
        run.task.vocab,
        run.d_model,
        run.n_layers,
        run.n_heads,
        run.task.seq_len,
    )
    .with_attention(run.variant.clone())
    .with_mlp_ratio(if run.mlp { 4 } else { 0 });
    let mut model: Gpt<B> = config.init(device);
    let (params, extra_params) = (
        burn::module::Module::num_params(&model),
        model.extra_num_params(),
    );
    // Burn's AdamW defaults (ε 1e-5) and per-tensor clipping, unlike the language-model loop's
    // ε 1e-8 and global-norm clipping: the MQAR results of results/results.md were trained so, and
    // changing it would make them irreproducible.
    let mut optimizer = AdamWConfig::new()
        .with_weight_decay(run.weight_decay as f32)
        .with_grad_clipping(Some(GradientClippingConfig::Norm(1.0)))
        .init();
    let schedule = WarmupCosine {
        peak: run.lr,
        warmup: (run.steps / 10).max(1),
        total: run.steps,
        min_ratio: 0.0,
    };
    progress.set_length(run.steps as u64);
    progress.set_position(0);
    let batches_per_epoch = (run.train_examples / run.batch_size).max(1);
    let (mut best, mut steps_to_99, mut final_loss, mut steps) = (0.0f64, None, None, 0);
    let mut diverged = false;
    for step in 0..run.steps {
        let b = step % batches_per_epoch;
        let batch =
            train_set.slice(b * run.batch_size..((b + 1) * run.batch_size).min(train_set.n));
        let (loss, grads) = batch_gradients(&model, &batch, devices);
        model = optimizer.step(schedule.at(step), model, grads);
        steps = step + 1;
        if steps % run.eval_every == 0 || steps == run.steps {
            let value = loss();
            if !value.is_finite() {
                diverged = true;
                final_loss = None;
                progress.set_message(format!("diverged: loss {value} at step {steps}"));
                break;
            }
            final_loss = Some(value);
            let acc = accuracy(&model.valid(), &test_set, 256);
            best = best.max(acc);
            progress.set_message(format!("loss {value:.3} acc {acc:.3}"));
            if acc >= 0.99 {
                steps_to_99 = Some(steps);
                break;
            }
        }
        progress.set_position(steps as u64);
    }
    TrainOutcome {
        accuracy: best,
        steps_to_99,
        steps,
        final_loss,
        diverged,
        seconds: started.elapsed().as_secs_f64(),
        params,
        extra_params,
    }
}
