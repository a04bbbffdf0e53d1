//! One MQAR training run: a small attention model trained until it recalls (accuracy ≥ 0.99)
//! or its step budget ends.

use super::data::{IGNORE, MqarBatch, MqarTask};
use crate::common::schedule::WarmupCosine;
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
    /// The training loss at the end.
    pub final_loss: f64,
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

/// Trains one model on `run`, reporting to `progress` (its length is set to the step budget).
pub fn train<B: AutodiffBackend>(
    run: &MqarRun,
    device: &B::Device,
    progress: &ProgressBar,
) -> TrainOutcome {
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
    .with_variant(run.variant.clone())
    .with_mlp_ratio(if run.mlp { 4 } else { 0 });
    let mut model: Gpt<B> = config.init(device);
    let (params, extra_params) = (
        burn::module::Module::num_params(&model),
        model.extra_num_params(),
    );
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
    let (mut best, mut steps_to_99, mut final_loss, mut steps) = (0.0f64, None, f64::NAN, 0);
    for step in 0..run.steps {
        let b = step % batches_per_epoch;
        let batch =
            train_set.slice(b * run.batch_size..((b + 1) * run.batch_size).min(train_set.n));
        let (inputs, targets, weight) = tensors::<B>(&batch, device);
        let n = batch.n * batch.seq_len;
        let logits = model.forward(inputs).reshape([n, run.task.vocab]); // [n·L, V]
        let loss = masked_cross_entropy(logits, targets, weight);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(schedule.at(step), model, grads);
        steps = step + 1;
        if steps % run.eval_every == 0 || steps == run.steps {
            final_loss = loss.into_scalar().elem::<f64>();
            let acc = accuracy(&model.valid(), &test_set, 256);
            best = best.max(acc);
            progress.set_message(format!("loss {final_loss:.3} acc {acc:.3}"));
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
        seconds: started.elapsed().as_secs_f64(),
        params,
        extra_params,
    }
}
