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

use super::checkpoint::{
    CheckpointState, checkpoint_dir, decode_records, encode_records, load_newest_good,
    newest_good_checkpoint, prune_checkpoints, save_checkpoint,
};
use super::clip::clip_global_norm;
use super::config::{InitWeights, RecordedChange, RunConfig};
use super::dynamics_log::{DynamicsLog, write_dynamics_plot};
use super::eval::{batch_nats, batch_tensors, evaluate};
use super::metrics::{MetricsLog, MetricsRow, read_metrics_until};
use super::parallel::batch_gradients;
use super::parallel::share_of_rows;
use super::plot::write_loss_plot;
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
    /// `dynamics.csv`; `None` on ranks other than 0.
    dynamics: Option<DynamicsLog>,
    /// The folder's lock, held until the trainer is dropped (or the process ends); `None` on
    /// ranks other than 0.
    _lock: Option<std::fs::File>,
}

impl<'a, B: FusedOps> Trainer<'a, B> {
    /// Checks the config against the corpus and the devices, decides between a fresh run and a
    /// resume (see [`RunOptions`]), writes `config.json`, and builds or loads the model and the
    /// optimiser.
    ///
    /// # Errors
    /// An invalid config, no device, a `batch_size` not divisible by the device count, a folder
    /// holding another run (or, on resume, a config that differs from it), and I/O errors.
    pub fn prepare(
        config: &TrainConfig,
        corpus: &'a TokenizedCorpus,
        out_dir: &Path,
        options: &RunOptions,
        devices: &'a [B::Device],
    ) -> Result<Self, TrainError> {
        Self::prepare_in_group(config, corpus, out_dir, options, devices, &SingleProcess)
    }

    /// [`prepare`](Self::prepare) as one rank of `group`: every rank of the group calls it with
    /// the same config, corpus and options. Rank 0 prepares the run folder as one process would
    /// and broadcasts its state (weights with their parameter ids, AdamW's moments, the step);
    /// the other ranks take it and never touch the folder, so a resume needs the folder on rank
    /// 0's machine only. Each micro-batch's `batch_size` rows are split into one equal share per
    /// rank (and each share over the rank's devices): the ranks together compute the gradient
    /// one process would compute over the whole micro-batch.
    ///
    /// # Errors
    /// Those of [`prepare`](Self::prepare) (on rank 0; the others then fail with
    /// [`TrainError::Group`] naming rank 0's error), a `batch_size` not divisible by the ranks
    /// times the devices, and a collective that does not complete.
    pub fn prepare_in_group(
        config: &TrainConfig,
        corpus: &'a TokenizedCorpus,
        out_dir: &Path,
        options: &RunOptions,
        devices: &'a [B::Device],
        group: &'a dyn ProcessGroup,
    ) -> Result<Self, TrainError> {
        config.validate_for(corpus)?;
        if devices.is_empty() {
            return Err(TrainError::Config {
                field: "devices".into(),
                value: "[]".into(),
                message: "at least one device is needed".into(),
            });
        }
        let shares = devices.len() * group.world_size();
        if !config.batch_size.is_multiple_of(shares) {
            let message = if group.world_size() == 1 {
                format!(
                    "must be divisible by the number of devices ({shares}): each device takes \
                     batch_size / {shares} rows of every micro-batch"
                )
            } else {
                format!(
                    "must be divisible by the ranks times the devices of each ({} × {} = \
                     {shares}): each device of each rank takes batch_size / {shares} rows of \
                     every micro-batch",
                    group.world_size(),
                    devices.len()
                )
            };
            return Err(TrainError::Config {
                field: "batch_size".into(),
                value: config.batch_size.to_string(),
                message,
            });
        }
        if options.stop_at == Some(0) {
            return Err(TrainError::Config {
                field: "stop_at".into(),
                value: "0".into(),
                message: "must be at least 1".into(),
            });
        }
        if group.world_size() == 1 {
            return Self::prepare_rank(config, corpus, out_dir, options, devices, group);
        }
        let quiet = RunOptions {
            quiet: true,
            ..options.clone()
        };
        let options = if group.rank() == 0 { options } else { &quiet };
        let local = Self::prepare_rank(config, corpus, out_dir, options, devices, group);
        // Rank 0 sends its state, or its error, which every rank then returns.
        let mut message = match (group.rank(), &local) {
            (0, Ok(trainer)) => trainer.encode_state()?,
            (0, Err(e)) => [&[0u8][..], e.to_string().as_bytes()].concat(),
            _ => Vec::new(),
        };
        group.broadcast_bytes(&mut message)?;
        let mut trainer = match (message.split_first(), group.rank()) {
            (Some((0, _)), 0) => return local,
            (Some((0, error)), _) => {
                return Err(TrainError::Group(format!(
                    "rank 0 could not start the run: {}",
                    String::from_utf8_lossy(error)
                )));
            }
            _ => local?,
        };
        if group.rank() != 0 {
            trainer.adopt_state(message)?;
        }
        trainer.check_ranks_agree()?;
        Ok(trainer)
    }

    /// One rank's preparation: rank 0's (or a single process's) with the run folder, the others'
    /// without (a fresh model and optimiser, replaced by rank 0's state).
    fn prepare_rank(
        config: &TrainConfig,
        corpus: &'a TokenizedCorpus,
        out_dir: &Path,
        options: &RunOptions,
        devices: &'a [B::Device],
        group: &'a dyn ProcessGroup,
    ) -> Result<Self, TrainError> {
        let device = &devices[0];
        let main = group.rank() == 0;
        let say = |message: String| {
            if !options.quiet {
                eprintln!("{message}");
            }
        };
        let stop = options
            .stop_at
            .map_or(config.max_steps, |s| s.min(config.max_steps));
        let mut run_config = RunConfig::new(config, corpus);
        run_config.backend = Some(B::name(device));
        let (lock, start) = if main {
            let (lock, start) = open_run_folder(out_dir, &run_config, options, &say)?;
            (Some(lock), start)
        } else {
            (None, Start::fresh())
        };

        let windows = TrainWindows::new(&corpus.train, config.seq_len, config.seed)?;
        let eval_set = if main {
            eval_batches(
                &corpus.valid,
                config.seq_len,
                config.eval_batch,
                config.eval_windows,
            )?
        } else {
            Vec::new()
        };

        B::seed(device, config.seed);
        coupled_qk::attention::register_flash_attention::<B>();
        let mut model: Gpt<B> = config
            .model
            .try_init(device)?
            .with_attention_kernel(config.attention_kernel);
        if start.checkpoints.is_none() && main {
            model = match &config.init_weights {
                None => model,
                Some(InitWeights::Safetensors(path)) => model.load_safetensors(path)?,
                Some(InitWeights::Gpt2(path)) => model.load_gpt2_safetensors(path)?,
            };
        }
        let (params, extra_params) = (model.num_params(), model.extra_num_params());
        let new_optimizer = || new_optimizer::<B>(config);

        let metrics_path = out_dir.join("metrics.csv");
        let (model, optimizer, state, rows, resumed_step) = match &start.checkpoints {
            Some(checkpoints) => {
                let (model, optimizer, state, dir) =
                    load_newest_good(out_dir, checkpoints, model, new_optimizer, device, &say)?;
                let changes = state.model_changes(&config.model);
                if !changes.is_empty() && !options.allow_config_change {
                    return Err(TrainError::CheckpointMismatch {
                        checkpoint: dir,
                        config: out_dir.join("config.json"),
                        changes,
                    });
                }
                let rows: Vec<MetricsRow> = if metrics_path.is_file() {
                    read_metrics_until(&metrics_path, state.step)?
                } else {
                    say(format!(
                        "{} is missing: starting a new one",
                        metrics_path.display()
                    ));
                    Vec::new()
                };
                say(format!(
                    "resuming from step {} ({})",
                    state.step,
                    dir.display()
                ));
                if !start.changes.is_empty() {
                    let list: Vec<String> = start.changes.iter().map(|c| c.to_string()).collect();
                    say(format!(
                        "resuming from step {} with changed settings: {}",
                        state.step,
                        list.join(", ")
                    ));
                }
                let step = state.step;
                (model, optimizer, state, rows, Some(step))
            }
            None => (
                model,
                new_optimizer(),
                CheckpointState::new(0, 0, 0.0, &[], &config.model),
                Vec::new(),
                None,
            ),
        };
        let (log, dynamics) = if main {
            run_config.changes = start.history;
            if let Some(step) = resumed_step {
                run_config
                    .changes
                    .extend(start.changes.into_iter().map(|c| RecordedChange {
                        step,
                        field: c.field,
                        old: c.old,
                        new: c.new,
                    }));
            }
            // Written once the checkpoint has loaded: a resume that fails leaves the run's record.
            let config_path = out_dir.join("config.json");
            atomic::write(&config_path, run_config.to_json().as_bytes())
                .map_err(|e| TrainError::io("write", &config_path, e))?;
            let log = MetricsLog::create(&metrics_path, &rows)?;
            let dynamics = DynamicsLog::open(&out_dir.join("dynamics.csv"), resumed_step)?;
            (Some(log), Some(dynamics))
        } else {
            (None, None)
        };
        say(format!(
            "training {} parameters ({} added by the attention variant) on {} ({} training \
             tokens, `{}` tokenizer): {} steps of {} tokens into {}",
            params,
            extra_params,
            corpus.name,
            corpus.train.len(),
            corpus.tokenizer,
            config.max_steps,
            config.tokens_per_step(),
            out_dir.display()
        ));
        if group.world_size() > 1 {
            say(format!(
                "data-parallel over {} ranks ({} rows each per micro-batch)",
                group.world_size(),
                config.batch_size / group.world_size()
            ));
        }
        if devices.len() > 1 {
            say(format!(
                "data-parallel over {} devices {:?} ({} rows each per micro-batch; main device \
                 {:?})",
                devices.len(),
                devices,
                config.batch_size / group.world_size() / devices.len(),
                device
            ));
        }
        let last_val = rows.iter().rev().find_map(|r| r.val);
        Ok(Self {
            config: config.clone(),
            corpus,
            devices,
            group,
            out_dir: out_dir.to_path_buf(),
            stop,
            windows,
            eval_set,
            model: Some(model),
            optimizer,
            params,
            extra_params,
            log,
            rows,
            resumed_step,
            step: state.step,
            tokens: state.tokens,
            pending_losses: state.losses(),
            elapsed_before: state.elapsed_s,
            started: Instant::now(),
            progress: progress_bar(options.quiet, stop, state.step),
            schedule: config.schedule(),
            plot_title: format!("{} on {}", config.model.attention, corpus.name),
            interval: (Duration::ZERO, 0),
            total: (Duration::ZERO, 0),
            pending_checkpoint: None,
            last_val,
            dynamics,
            _lock: lock,
        })
    }

    /// Rank 0's state for the other ranks: `1`, then the length-prefixed JSON of the
    /// checkpoint state, then the model's record (length-prefixed) and the optimiser's.
    fn encode_state(&self) -> Result<Vec<u8>, TrainError> {
        let state = serde_json::to_vec(&self.state()).expect("a CheckpointState serialises");
        let (model, optimizer) = encode_records(self.model(), &self.optimizer, &self.out_dir)?;
        let mut bytes = vec![1u8];
        for part in [&state, &model] {
            bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
            bytes.extend_from_slice(part);
        }
        bytes.extend_from_slice(&optimizer);
        Ok(bytes)
    }

    /// Takes rank 0's state, as [`encode_state`](Self::encode_state) wrote it.
    fn adopt_state(&mut self, message: Vec<u8>) -> Result<(), TrainError> {
        let malformed = || TrainError::Group("rank 0's state arrived cut short".into());
        let mut rest = message.get(1..).ok_or_else(malformed)?;
        let mut part = || -> Result<Vec<u8>, TrainError> {
            let (len, tail) = rest.split_first_chunk::<8>().ok_or_else(malformed)?;
            let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|_| malformed())?;
            let (part, tail) = tail.split_at_checked(len).ok_or_else(malformed)?;
            rest = tail;
            Ok(part.to_vec())
        };
        let state: CheckpointState = serde_json::from_slice(&part()?).map_err(|_| malformed())?;
        let model_bytes = part()?;
        let optimizer_bytes = rest.to_vec();
        let model = self
            .model
            .take()
            .expect("the model is only taken during an update");
        let optimizer = new_optimizer::<B>(&self.config);
        let origin = PathBuf::from("<rank 0>");
        let (model, optimizer) = decode_records(
            model,
            optimizer,
            model_bytes,
            optimizer_bytes,
            &origin,
            &self.devices[0],
        )?;
        self.model = Some(model);
        self.optimizer = optimizer;
        self.step = state.step;
        self.tokens = state.tokens;
        self.pending_losses = state.losses();
        self.elapsed_before = state.elapsed_s;
        self.resumed_step = (state.step > 0).then_some(state.step);
        self.progress.set_position(state.step as u64);
        Ok(())
    }

    /// Checks that every rank holds rank 0's weights, bit for bit (their digests): ranks that
    /// drifted apart would train different models without a word.
    ///
    /// # Errors
    /// [`TrainError::Group`] on every rank when one differs.
    fn check_ranks_agree(&self) -> Result<(), TrainError> {
        if self.group.world_size() == 1 {
            return Ok(());
        }
        let digest = weights_digest(&self.model().valid()).to_le_bytes();
        let mut rank0 = digest.to_vec();
        self.group.broadcast_bytes(&mut rank0)?;
        let mut differing = [f64::from(u8::from(rank0 != digest))];
        self.group.all_reduce_sum_f64(&mut differing)?;
        if differing[0] > 0.0 {
            return Err(TrainError::Group(format!(
                "at step {}, {} of {} ranks hold other weights than rank 0: their MPI library \
                 gives ranks different sums, or a rank was disturbed; resume from the last \
                 checkpoint",
                self.step,
                differing[0],
                self.group.world_size()
            )));
        }
        Ok(())
    }

    /// Rank 0's `ok` on every rank (each other rank's own `ok` is ignored).
    fn rank0_says(&self, ok: bool) -> Result<bool, TrainError> {
        if self.group.world_size() == 1 {
            return Ok(ok);
        }
        let mut flag = vec![u8::from(ok)];
        self.group.broadcast_bytes(&mut flag)?;
        Ok(flag == [1])
    }

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
        if ranks > 1 {
            // Every rank takes part even after a non-finite loss, so all stop together.
            let mut sums = [loss_sum, f64::from(u8::from(non_finite.is_some()))];
            grads = all_reduce_gradients(self.model(), grads, &mut sums, self.group)?;
            loss_sum = sums[0] / ranks as f64;
            if sums[1] > 0.0 {
                non_finite = Some(non_finite.unwrap_or(f64::NAN));
            }
        }
        if let Some(value) = non_finite {
            let what = if ranks > 1 && value.is_nan() {
                "loss (of another rank)"
            } else {
                "loss"
            };
            return Err(self.diverged(s, value, what));
        }
        // The previous step's weights gave finite losses: only now is its checkpoint written
        // (the model and optimiser still hold that step's state until the update below).
        if let Some(state) = self.pending_checkpoint.take() {
            let t = Instant::now();
            self.check_ranks_agree()?;
            if rank == 0 {
                self.write_checkpoint(&state)?;
            }
            side_time += t.elapsed();
        }
        if let Some(max_norm) = self.config.grad_clip {
            grads = clip_global_norm(self.model(), grads, max_norm).0;
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
        // Only rank 0 evaluates and writes; the others learn whether its loss was finite.
        let val = (due && rank == 0).then(|| self.evaluate());
        if due && rank == 0 {
            let stats = self.dynamics_stats();
            if let Some(dynamics) = self.dynamics.as_mut() {
                dynamics.record(s, stats)?;
            }
        }
        if rank == 0 && (val.is_some() || s.is_multiple_of(self.config.log_every)) {
            self.log_row(lr, val)?;
        }
        if let Some(v) = val {
            self.last_val = Some(v);
            self.plot();
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
        let path = self.out_dir.join("dynamics.svg");
        let dynamics = self.dynamics.as_ref().map_or(&[][..], DynamicsLog::rows);
        if let Err(e) = write_dynamics_plot(dynamics, &self.plot_title, &path) {
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
                .dynamics
                .as_ref()
                .map(DynamicsLog::last)
                .unwrap_or_default(),
        }
    }
}

/// The optimiser of every run, as `config` sets it: PyTorch's ε (Burn's default is 1e-5); no
/// clipping here, `clip_global_norm` does it.
fn new_optimizer<B: FusedOps>(config: &TrainConfig) -> Adam<B> {
    AdamWConfig::new()
        .with_beta_1(config.betas.0 as f32)
        .with_beta_2(config.betas.1 as f32)
        .with_epsilon(1e-8)
        .with_weight_decay(config.weight_decay as f32)
        .init::<B, Gpt<B>>()
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
