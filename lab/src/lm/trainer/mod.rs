//! [`Trainer`]: one training run as an object — prepared (fresh or resumed), stepped, evaluated,
//! checkpointed and finished.
//!
//! Exact resume rests on three things: the training windows of step `s` depend only on
//! `(seed, s)` (see [`TrainWindows`]); the backend's random generator is reseeded from
//! `(seed, s)` at the start of every step, so dropout (if any) does not depend on what ran before;
//! and a checkpoint holds the weights, the parameter ids and AdamW's moments at full precision.
//!
//! In a group of several ranks ([`ProcessGroup`]), every rank runs a trainer: rank 0 prepares the
//! run as one process would and broadcasts its state (weights, parameter ids, moments, step); each
//! rank takes its share of every micro-batch's rows; the gradients are averaged over the ranks
//! once per step ([`all_reduce_gradients`]); only rank 0 evaluates and writes the run folder.

use super::attention_diagnostics::{AttentionDiagnostics, gpt_attention_diagnostics};
use super::checkpoint::{
    CheckpointState, checkpoint_dir, decode_records, encode_records, load_newest_good,
    newest_good_checkpoint, prune_checkpoints, save_checkpoint,
};
use super::clip::{clip_global_norm, clip_to_norm};
use super::config::{InitWeights, RecordedChange, RunConfig};
use super::eval::{batch_nats, batch_tensors, evaluate};
use super::metrics::{MetricsLog, MetricsRow, read_metrics_until};
use super::parallel::batch_gradients;
use super::parallel::share_of_rows;
use super::plot::write_loss_plot;
use super::probe_logs::ProbeLogs;
use super::run_folder::{Start, open_run_folder};
use super::{RunOptions, RunSummary, TrainConfig, TrainError, Validation};
use crate::atomic;
use crate::data::{TokenBatch, TokenizedCorpus, TrainWindows, eval_batches};
use crate::dist::{ProcessGroup, SingleProcess, all_reduce_gradients, weights_digest};
use crate::schedule::WarmupCosine;
use burn::module::{AutodiffModule, Module};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsAccumulator, Optimizer};
use burn::tensor::ElementConversion;
use coupled_qk::model::{FusedOps, Gpt};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod prepare;
mod ranks;

use prepare::new_optimizer;

/// The optimiser of every run: AdamW over the GPT's parameters.
type Adam<B> = OptimizerAdaptor<AdamW, Gpt<B>, B>;

/// One training run of `config.model` on a corpus, writing `config.json`, `metrics.csv`,
/// `loss.svg`, `summary.json` and `checkpoints/` into its folder.
///
/// [`prepare`](Self::prepare) starts it fresh or resumes it from its newest checkpoint;
/// [`step`](Self::step) trains one optimiser step (evaluating and scheduling a checkpoint when
/// due); [`finish`](Self::finish) writes the final checkpoint and the summary. [`run`](Self::run)
/// does all of it, as [`train_on_devices`](super::train_on_devices) does.
///
/// Several devices change only how a micro-batch's gradient is computed: its rows are sharded
/// across the devices and the shards' gradients summed on the main device, `devices[0]`, which
/// also holds the optimiser state, evaluates and writes the checkpoints. Several ranks
/// ([`prepare_in_group`](Self::prepare_in_group)) split each micro-batch's rows between them
/// first.
pub struct Trainer<'a, B: FusedOps> {
    config: TrainConfig,
    corpus: &'a TokenizedCorpus,
    devices: &'a [B::Device],
    group: &'a dyn ProcessGroup,
    out_dir: PathBuf,
    /// The step this invocation stops at (`max_steps`, or earlier with `stop_at`).
    stop: usize,
    windows: TrainWindows<'a>,
    eval_set: Vec<TokenBatch>,
    /// `None` only while AdamW updates it (it takes the model by value, so that the weights are
    /// updated in place rather than copied).
    model: Option<Gpt<B>>,
    optimizer: Adam<B>,
    params: usize,
    extra_params: usize,
    /// `metrics.csv`; `None` on ranks other than 0, which write nothing.
    log: Option<MetricsLog>,
    rows: Vec<MetricsRow>,
    resumed_step: Option<usize>,
    step: usize,
    tokens: u64,
    /// Training losses of the steps since the last metrics row.
    pending_losses: Vec<f64>,
    elapsed_before: f64,
    started: Instant,
    progress: ProgressBar,
    schedule: WarmupCosine,
    plot_title: String,
    /// Training time (evaluation and checkpoints left out) and tokens since the last row.
    interval: (Duration, u64),
    /// The same over this invocation.
    total: (Duration, u64),
    /// A checkpoint of the last step, written once the next step's losses prove it finite.
    pending_checkpoint: Option<CheckpointState>,
    last_val: Option<Validation>,
    /// `dynamics.csv` and `attention.csv`; `None` on ranks other than 0.
    probes: Option<ProbeLogs>,
    /// The folder's lock, held until the trainer is dropped (or the process ends); `None` on
    /// ranks other than 0.
    _lock: Option<std::fs::File>,
}

impl<'a, B: FusedOps> Trainer<'a, B> {
    /// Trains until the stop step, then [`finish`](Self::finish)es.
    ///
    /// # Errors
    /// Those of [`step`](Self::step) and [`finish`](Self::finish).
    pub fn run(mut self) -> Result<RunSummary, TrainError> {
        while !self.is_done() {
            self.step()?;
        }
        self.finish()
    }

    /// Whether the run has reached the step this invocation stops at.
    pub fn is_done(&self) -> bool {
        self.step >= self.stop
    }

    /// Optimiser steps done.
    pub fn steps_done(&self) -> usize {
        self.step
    }

    /// The model as trained so far.
    pub fn model(&self) -> &Gpt<B> {
        self.model
            .as_ref()
            .expect("the model is only taken during an update")
    }

    /// The metrics rows so far (those of earlier invocations included).
    pub fn rows(&self) -> &[MetricsRow] {
        &self.rows
    }

    /// One optimiser step: the gradients of `grad_accum` micro-batches, clipping, AdamW; then a
    /// metrics row and an evaluation when due. Returns the step's training loss.
    ///
    /// # Errors
    /// [`TrainError::NonFinite`] when a loss is not finite (naming the last checkpoint written),
    /// and I/O errors of the metrics and checkpoint files.
    pub fn step(&mut self) -> Result<f64, TrainError> {
        let s = self.step + 1;
        let timer = Instant::now();
        let mut side_time = Duration::ZERO;
        let device = &self.devices[0];
        // Burn's Flex and CubeCL generators are process-global (the device is ignored): seeding
        // the main device seeds them all. With several devices, dropout (if any) draws from it
        // in whatever order the devices' threads run, so only then is a step's randomness not
        // reproducible. Each rank draws its own masks.
        let rank = self.group.rank() as u64;
        B::seed(device, step_seed(self.config.seed ^ rank, s as u64));
        let lr = self.schedule.at(self.step);
        let accum = self.config.grad_accum;
        let (rank, ranks) = (self.group.rank(), self.group.world_size());
        let mut accumulator = GradientsAccumulator::<Gpt<B>>::new();
        let mut loss_sum = 0.0;
        let mut non_finite = None;
        for i in 0..accum {
            let index = (self.step * accum + i) as u64;
            let batch = self.windows.batch(index, self.config.batch_size);
            let batch = if ranks == 1 {
                batch
            } else {
                share_of_rows(&batch, rank, ranks)
            };
            match batch_gradients(self.model(), &batch, self.devices, accum, self.config.loss) {
                Ok((value, grads)) => {
                    accumulator.accumulate(self.model(), grads);
                    loss_sum += value;
                }
                Err(value) => {
                    non_finite = Some(value);
                    break;
                }
            }
        }
        let mut grads = accumulator.grads();
        let own_non_finite = non_finite.is_some();
        let mut reduced_norm = None;
        if ranks > 1 {
            // Every rank takes part even after a non-finite loss, so all stop together.
            let mut sums = [loss_sum, f64::from(u8::from(own_non_finite))];
            let (reduced, norm) = all_reduce_gradients(self.model(), grads, &mut sums, self.group)?;
            (grads, reduced_norm) = (reduced, norm);
            loss_sum = sums[0] / ranks as f64;
            if sums[1] > 0.0 {
                non_finite = Some(non_finite.unwrap_or(f64::NAN));
            }
        }
        if let Some(value) = non_finite {
            let what = if own_non_finite {
                "loss"
            } else {
                "loss (of another rank)"
            };
            return Err(self.diverged(s, value, what));
        }
        // The previous step's weights gave finite losses: only now is its checkpoint written
        // (the model and optimiser still hold that step's state until the update below).
        if let Some(state) = self.pending_checkpoint.take() {
            let t = Instant::now();
            self.check_ranks_agree()?;
            let written = match rank {
                0 => self.write_checkpoint(&state).map(drop),
                _ => Ok(()),
            };
            self.rank0_result(written, "write its checkpoint")?;
            side_time += t.elapsed();
        }
        if let Some(max_norm) = self.config.grad_clip {
            grads = match reduced_norm {
                // The norm every rank shares, so that every rank scales alike.
                Some(norm) => clip_to_norm(self.model(), grads, norm, max_norm),
                None => clip_global_norm(self.model(), grads, max_norm).0,
            };
        }
        let model = self
            .model
            .take()
            .expect("the model is only taken during an update");
        self.model = Some(self.optimizer.step(lr, model, grads));
        self.step = s;
        let step_tokens = self.config.tokens_per_step();
        self.tokens += step_tokens;
        let step_loss = loss_sum / accum as f64;
        self.pending_losses.push(step_loss);
        let train_time = timer.elapsed() - side_time;
        self.interval = (self.interval.0 + train_time, self.interval.1 + step_tokens);
        self.total = (self.total.0 + train_time, self.total.1 + step_tokens);

        let due = s.is_multiple_of(self.config.eval_every) || s == self.config.max_steps;
        let logged = due || s.is_multiple_of(self.config.log_every);
        // Only rank 0 evaluates and writes; the others learn whether that went well.
        let val = (due && rank == 0).then(|| self.evaluate());
        let mut written = Ok(());
        if due && rank == 0 {
            let (inputs, _) = batch_tensors::<B::InnerBackend>(&self.eval_set[0], &self.devices[0]);
            let model = self.model().valid();
            if let Some(probes) = self.probes.as_mut() {
                written = probes.record(s, &model, inputs);
            }
        }
        if rank == 0 && logged && written.is_ok() {
            written = self.log_row(lr, val);
        }
        if let Some(v) = val {
            self.last_val = Some(v);
            self.plot();
        }
        if logged {
            self.rank0_result(written, "write its metrics")?;
        }
        if due {
            let finite = val.is_none_or(|v| v.loss.is_finite());
            if !self.rank0_says(finite)? {
                let loss = val.map_or(f64::NAN, |v| v.loss);
                return Err(self.diverged(s, loss, "validation loss"));
            }
        }
        self.show_progress(step_loss);
        if s.is_multiple_of(self.config.checkpoint_every) && s < self.stop {
            self.pending_checkpoint = Some(self.state());
        }
        Ok(step_loss)
    }

    /// What each layer's dynamics do to the first validation batch.
    pub fn dynamics_stats(&self) -> Vec<coupled_qk::DynamicsStats> {
        let device = &self.devices[0];
        let (inputs, _) = batch_tensors::<B::InnerBackend>(&self.eval_set[0], device);
        self.model().valid().dynamics_stats(inputs)
    }

    /// The attention diagnostics of each layer on the first validation batch (see
    /// [`gpt_attention_diagnostics`]).
    pub fn attention_diagnostics(&self) -> Vec<AttentionDiagnostics> {
        let device = &self.devices[0];
        let (inputs, _) = batch_tensors::<B::InnerBackend>(&self.eval_set[0], device);
        gpt_attention_diagnostics(&self.model().valid(), inputs)
    }

    /// The model's loss on the fixed validation set.
    pub fn evaluate(&self) -> Validation {
        evaluate(
            &self.model().valid(),
            &self.eval_set,
            &self.devices[0],
            self.config.loss,
        )
    }

    /// Writes a checkpoint of the current step (syncing the metrics first) and prunes old ones.
    /// In a group every rank calls it: the ranks first check that they hold the same weights,
    /// then rank 0 writes.
    ///
    /// # Errors
    /// I/O errors.
    pub fn checkpoint(&mut self) -> Result<PathBuf, TrainError> {
        let state = self.state();
        self.check_ranks_agree()?;
        if self.group.rank() == 0 {
            self.write_checkpoint(&state)
        } else {
            Ok(checkpoint_dir(&self.out_dir, state.step))
        }
    }

    /// Writes the final checkpoint (unless this invocation only reopened a run already at its
    /// stop step), the loss plot and `summary.json`.
    ///
    /// # Errors
    /// [`TrainError::NonFinite`] when the run stopped early and the next step's loss is not
    /// finite, and I/O errors.
    pub fn finish(mut self) -> Result<RunSummary, TrainError> {
        let main = self.group.rank() == 0;
        if self.resumed_step != Some(self.step) {
            if self.step < self.config.max_steps {
                // Stopped early: vouch for the weights with the loss of the next step's first
                // micro-batch (at max_steps the final validation loss, checked in `step`, does
                // it). One device's shard of rows: the whole micro-batch of a multi-GPU run may
                // not fit on one. Rank 0 checks for every rank.
                let next = if main { self.next_loss() } else { f64::NAN };
                if !self.rank0_says(next.is_finite())? {
                    return Err(self.diverged(self.step + 1, next, "loss"));
                }
            }
            self.checkpoint()?;
        }
        let summary = self.summary();
        if main {
            self.plot();
            let summary_path = self.out_dir.join("summary.json");
            let json =
                serde_json::to_string_pretty(&summary).expect("a RunSummary always serialises");
            atomic::write(&summary_path, json.as_bytes())
                .map_err(|e| TrainError::io("write", &summary_path, e))?;
        }
        self.progress.finish_with_message(match summary.val_loss {
            Some(v) => format!("val loss {v:.4}, {:.0} tok/s", summary.tokens_per_s),
            None => format!("{:.0} tok/s", summary.tokens_per_s),
        });
        Ok(summary)
    }

    /// The mean loss of one device's share of the next step's first micro-batch.
    fn next_loss(&self) -> f64 {
        let rows = self.config.batch_size / self.devices.len() / self.group.world_size();
        let index = (self.step * self.config.grad_accum) as u64;
        let batch = self.windows.batch(index, rows);
        let nats = batch_nats(
            &self.model().valid(),
            &batch,
            &self.devices[0],
            self.config.loss,
        );
        nats.into_scalar().elem::<f64>() / (batch.rows * batch.seq_len) as f64
    }

    fn elapsed(&self) -> f64 {
        self.elapsed_before + self.started.elapsed().as_secs_f64()
    }

    fn state(&self) -> CheckpointState {
        CheckpointState::new(
            self.step,
            self.tokens,
            self.elapsed(),
            &self.pending_losses,
            &self.config.model,
        )
    }

    fn write_checkpoint(&mut self, state: &CheckpointState) -> Result<PathBuf, TrainError> {
        if let Some(log) = &mut self.log {
            log.sync()?;
        }
        let dir = save_checkpoint(&self.out_dir, state, self.model(), &self.optimizer)?;
        prune_checkpoints(&self.out_dir, self.config.keep_checkpoints)?;
        Ok(dir)
    }

    fn log_row(&mut self, lr: f64, val: Option<Validation>) -> Result<(), TrainError> {
        let (time, tokens) = self.interval;
        let row = MetricsRow {
            step: self.step,
            tokens: self.tokens,
            lr,
            train_loss: self.pending_losses.iter().sum::<f64>() / self.pending_losses.len() as f64,
            val,
            tokens_per_s: tokens as f64 / time.as_secs_f64().max(1e-9),
            elapsed_s: self.elapsed(),
        };
        if let Some(log) = &mut self.log {
            log.append(&row)?;
        }
        self.rows.push(row);
        self.pending_losses.clear();
        self.interval = (Duration::ZERO, 0);
        Ok(())
    }

    /// Draws `loss.svg`. A plot that cannot be written is a warning, not a reason to stop
    /// training.
    fn plot(&self) {
        let path = self.out_dir.join("loss.svg");
        if let Err(e) = write_loss_plot(&self.rows, &self.plot_title, &path) {
            self.progress.suspend(|| eprintln!("warning: {e}"));
        }
        if let Some(Err(e)) = self.probes.as_ref().map(|p| p.plot(&self.plot_title)) {
            self.progress.suspend(|| eprintln!("warning: {e}"));
        }
    }

    fn throughput(&self) -> f64 {
        self.total.1 as f64 / self.total.0.as_secs_f64().max(1e-9)
    }

    fn show_progress(&self, step_loss: f64) {
        let throughput = self.throughput();
        self.progress.set_position(self.step as u64);
        self.progress.set_message(match self.last_val {
            Some(v) => format!(
                "loss {step_loss:.4} val {:.4} {throughput:.0} tok/s",
                v.loss
            ),
            None => format!("loss {step_loss:.4} {throughput:.0} tok/s"),
        });
    }

    /// The error of a non-finite `what` at `step`, naming the newest checkpoint that still
    /// verifies (checked now: one damaged since it was written is not "good").
    fn diverged(&self, step: usize, loss: f64, what: &str) -> TrainError {
        self.progress
            .abandon_with_message(format!("{what} {loss} at step {step}"));
        if self.group.rank() != 0 {
            // The run folder is rank 0's: it names the checkpoint to resume from.
            return TrainError::Group(format!(
                "the {what} is {loss} at step {step}: training stopped on every rank (rank 0 \
                 names the last good checkpoint)"
            ));
        }
        TrainError::NonFinite {
            step,
            loss,
            checkpoint: newest_good_checkpoint(&self.out_dir, self.step),
        }
    }

    fn summary(&self) -> RunSummary {
        let val_row = self.rows.iter().rev().find(|r| r.val.is_some());
        let val = val_row.and_then(|r| r.val);
        RunSummary {
            corpus: self.corpus.name.clone(),
            tokenizer: self.corpus.tokenizer.clone(),
            steps: self.step,
            max_steps: self.config.max_steps,
            finished: self.step >= self.config.max_steps,
            tokens: self.tokens,
            train_loss: self.rows.last().map(|r| r.train_loss),
            val_loss: val.map(|v| v.loss),
            val_ppl: val.map(|v| v.ppl),
            val_bpb: val.map(|v| v.bpb),
            val_step: val_row.map(|r| r.step),
            wall_s: self.elapsed(),
            tokens_per_s: self.throughput(),
            params: self.params,
            extra_params: self.extra_params,
            resumed_from: self.resumed_step,
            dynamics: self
                .probes
                .as_ref()
                .map(ProbeLogs::last_dynamics)
                .unwrap_or_default(),
            attention: self
                .probes
                .as_ref()
                .map(ProbeLogs::last_attention)
                .unwrap_or_default(),
        }
    }
}

fn progress_bar(quiet: bool, stop: usize, position: usize) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(stop as u64).with_style(
        ProgressStyle::with_template(
            "step {pos:>6}/{len} [{bar:30}] {elapsed_precise} eta {eta_precise} {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_position(position as u64);
    bar.reset_eta();
    bar
}

/// The seed of the backend's generator during step `step`: depends on nothing else, so a resumed
/// run draws what the uninterrupted one would (SplitMix64's finaliser).
pub(super) fn step_seed(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED_0F57_E95E_ED00;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
