//! The training loop: AdamW, warmup + cosine, gradient accumulation and global-norm clipping,
//! periodic evaluation, checkpoints with exact resume, and the run's output files.
//!
//! Exact resume rests on three things: the training windows of step `s` depend only on
//! `(seed, s)` (see [`TrainWindows`]); the backend's random generator is reseeded from
//! `(seed, s)` at the start of every step, so dropout (if any) does not depend on what ran before;
//! and a checkpoint holds the weights, the parameter ids and AdamW's moments at full precision.
//!
//! Several devices ([`train_on_devices`]) change only how a micro-batch's gradient is computed:
//! its rows are sharded across the devices and the shards' gradients summed on the main device.

use super::checkpoint::{
    CheckpointState, list_checkpoints, load_checkpoint, prune_checkpoints, save_checkpoint,
};
use super::clip::clip_global_norm;
use super::config::{RunConfig, differing_fields};
use super::eval::{batch_loss, evaluate};
use super::metrics::{MetricsLog, MetricsRow, read_metrics};
use super::parallel::batch_gradients;
use super::plot::write_loss_plot;
use super::{TrainConfig, TrainError, Validation};
use crate::common::atomic;
use crate::common::data::{TokenizedCorpus, TrainWindows, eval_batches};
use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamWConfig, GradientsAccumulator, Optimizer};
use burn::tensor::ElementConversion;
use burn::tensor::backend::AutodiffBackend;
use coupled_qk::model::Gpt;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How to run [`train_with`], beyond the config.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Continue from the newest complete checkpoint in the output folder. With none there, a
    /// fresh run starts (and says so): a job script can always pass it.
    pub resume: bool,
    /// Stop after this step (checkpointing there) as if interrupted, the schedule still spanning
    /// `max_steps`: for time-boxed jobs; a later `resume` continues exactly.
    pub stop_at: Option<usize>,
    /// On resume, accept a config that differs from the run's `config.json` (it is printed and
    /// replaces it): e.g. a lower learning rate after a divergence. The run is then no longer the
    /// one an uninterrupted run of either config would give.
    pub allow_config_change: bool,
    /// No progress bar and no messages.
    pub quiet: bool,
}

/// What a run reports at its end (also written as `summary.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunSummary {
    /// The corpus's name.
    pub corpus: String,
    /// The tokenizer's id.
    pub tokenizer: String,
    /// Steps done.
    pub steps: usize,
    /// Steps the config asks for.
    pub max_steps: usize,
    /// Whether all `max_steps` are done (false after a `stop_at`).
    pub finished: bool,
    /// Training tokens seen.
    pub tokens: u64,
    /// The training loss of the last metrics row.
    pub train_loss: Option<f64>,
    /// Validation loss (nats per token) at the last evaluation (at `max_steps` once finished).
    pub val_loss: Option<f64>,
    /// Validation perplexity there.
    pub val_ppl: Option<f64>,
    /// Validation bits per byte there.
    pub val_bpb: Option<f64>,
    /// The step of that evaluation.
    pub val_step: Option<usize>,
    /// Wall-clock seconds of the run, summed over resumes.
    pub wall_s: f64,
    /// Training throughput of this invocation (tokens per second of training).
    pub tokens_per_s: f64,
    /// Parameters of the model.
    pub params: usize,
    /// Parameters the attention variant adds (coupling nets and step sizes).
    pub extra_params: usize,
    /// The checkpoint step this invocation resumed from.
    pub resumed_from: Option<usize>,
}

/// Trains `config.model` on `corpus`, writing `config.json`, `metrics.csv`, `loss.svg`,
/// `summary.json` and `checkpoints/` into `out_dir`; `resume` continues the run there.
pub fn train<B: AutodiffBackend>(
    config: &TrainConfig,
    corpus: &TokenizedCorpus,
    out_dir: &Path,
    resume: bool,
    device: &B::Device,
) -> Result<RunSummary, TrainError> {
    let options = RunOptions {
        resume,
        ..Default::default()
    };
    train_with::<B>(config, corpus, out_dir, &options, device)
}

/// [`train`] with all its options: [`train_on_devices`] on one device.
pub fn train_with<B: AutodiffBackend>(
    config: &TrainConfig,
    corpus: &TokenizedCorpus,
    out_dir: &Path,
    options: &RunOptions,
    device: &B::Device,
) -> Result<RunSummary, TrainError> {
    train_on_devices::<B>(
        config,
        corpus,
        out_dir,
        options,
        std::slice::from_ref(device),
    )
}

/// [`train_with`] data-parallel over several devices of one backend.
///
/// Every micro-batch's `batch_size` rows are split into `devices.len()` equal shards (so
/// `batch_size` must be divisible by the device count); each device runs forward and backward on
/// its shard with a fork of the model, at once on the threads of rayon's pool
/// ([`sharded_gradients`](super::sharded_gradients)), its loss scaled so
/// that the shards' gradients sum to the one-device gradient of the whole micro-batch. The
/// gradients are moved to the main device, `devices[0]`, and summed there; clipping and the
/// AdamW step then run once, on the main device, which also holds the optimiser state, evaluates
/// and writes the checkpoints. Data order, schedule, checkpoints and resume are those of one
/// device; with one device this is exactly [`train_with`].
///
/// # Errors
/// Those of [`train_with`], and [`TrainError::Config`] for no device or a `batch_size` not
/// divisible by the device count.
pub fn train_on_devices<B: AutodiffBackend>(
    config: &TrainConfig,
    corpus: &TokenizedCorpus,
    out_dir: &Path,
    options: &RunOptions,
    devices: &[B::Device],
) -> Result<RunSummary, TrainError> {
    config.validate_for(corpus)?;
    let Some(device) = devices.first() else {
        return Err(TrainError::Config {
            field: "devices".into(),
            value: "[]".into(),
            message: "at least one device is needed".into(),
        });
    };
    if !config.batch_size.is_multiple_of(devices.len()) {
        return Err(TrainError::Config {
            field: "batch_size".into(),
            value: config.batch_size.to_string(),
            message: format!(
                "must be divisible by the number of devices ({n}): each device takes \
                 batch_size / {n} rows of every micro-batch",
                n = devices.len()
            ),
        });
    }
    if options.stop_at == Some(0) {
        return Err(TrainError::Config {
            field: "stop_at".into(),
            value: "0".into(),
            message: "must be at least 1".into(),
        });
    }
    let say = |message: String| {
        if !options.quiet {
            eprintln!("{message}");
        }
    };
    let stop = options
        .stop_at
        .map_or(config.max_steps, |s| s.min(config.max_steps));
    let run_config = RunConfig::new(config, corpus);
    let resume_from = resolve_start(out_dir, &run_config, options, &say)?;
    std::fs::create_dir_all(out_dir).map_err(|e| TrainError::io("create", out_dir, e))?;
    let config_path = out_dir.join("config.json");
    atomic::write(&config_path, run_config.to_json().as_bytes())
        .map_err(|e| TrainError::io("write", &config_path, e))?;

    let windows = TrainWindows::new(&corpus.train, config.seq_len, config.seed)?;
    let eval_set = eval_batches(
        &corpus.valid,
        config.seq_len,
        config.eval_batch,
        config.eval_windows,
    )?;

    B::seed(device, config.seed);
    let model: Gpt<B> = config.model.try_init(device)?;
    let (params, extra_params) = (model.num_params(), model.extra_num_params());
    // PyTorch's ε (Burn's default is 1e-5); no clipping here: `clip_global_norm` does it.
    let optimizer = AdamWConfig::new()
        .with_beta_1(config.betas.0 as f32)
        .with_beta_2(config.betas.1 as f32)
        .with_epsilon(1e-8)
        .with_weight_decay(config.weight_decay as f32)
        .init::<B, Gpt<B>>();

    let metrics_path = out_dir.join("metrics.csv");
    let (mut model, mut optimizer, state, mut rows, mut last_checkpoint) = match &resume_from {
        Some((_, dir)) => {
            let (model, optimizer, state) = load_checkpoint(dir, model, optimizer, device)?;
            let rows: Vec<MetricsRow> = if metrics_path.is_file() {
                read_metrics(&metrics_path)?
                    .into_iter()
                    .filter(|r| r.step <= state.step)
                    .collect()
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
            (model, optimizer, state, rows, Some(dir.clone()))
        }
        None => (
            model,
            optimizer,
            CheckpointState::new(0, 0, 0.0, &[]),
            Vec::new(),
            None,
        ),
    };
    let mut log = MetricsLog::create(&metrics_path, &rows)?;
    let resumed_step = resume_from.as_ref().map(|(step, _)| *step);
    let (mut step, mut tokens, mut pending_losses) = (state.step, state.tokens, state.losses());
    let (elapsed_before, started) = (state.elapsed_s, Instant::now());
    let elapsed = || elapsed_before + started.elapsed().as_secs_f64();

    say(format!(
        "training {} parameters ({} added by the attention variant) on {} ({} training tokens, \
         `{}` tokenizer): {} steps of {} tokens into {}",
        params,
        extra_params,
        corpus.name,
        corpus.train.len(),
        corpus.tokenizer,
        config.max_steps,
        config.tokens_per_step(),
        out_dir.display()
    ));
    if devices.len() > 1 {
        say(format!(
            "data-parallel over {} devices {:?} ({} rows each per micro-batch; main device {:?})",
            devices.len(),
            devices,
            config.batch_size / devices.len(),
            device
        ));
    }
    let progress = progress_bar(options.quiet, stop, step);
    let schedule = config.schedule();
    let plot_title = format!("{} on {}", config.model.variant().name(), corpus.name);
    let plot_path = out_dir.join("loss.svg");
    // Training time (evaluation and checkpoints left out): since the last row, and in all.
    let (mut interval_time, mut interval_tokens) = (Duration::ZERO, 0u64);
    let (mut total_time, mut total_tokens) = (Duration::ZERO, 0u64);
    let mut pending_checkpoint: Option<CheckpointState> = None;
    let mut last_val: Option<Validation> = rows.iter().rev().find_map(|r| r.val);

    while step < stop {
        let s = step + 1;
        let timer = Instant::now();
        let mut side_time = Duration::ZERO;
        // Burn's Flex and CubeCL generators are process-global (the device is ignored): seeding
        // the main device seeds them all. With several devices, dropout (if any) draws from it
        // in whatever order the devices' threads run, so only then is a step's randomness not
        // reproducible.
        B::seed(device, step_seed(config.seed, s as u64));
        let lr = schedule.at(step);
        let mut accumulator = GradientsAccumulator::<Gpt<B>>::new();
        let mut loss_sum = 0.0;
        for i in 0..config.grad_accum {
            let index = (step * config.grad_accum + i) as u64;
            let batch = windows.batch(index, config.batch_size);
            let value = match batch_gradients(&model, &batch, devices, config.grad_accum) {
                Ok((value, grads)) => {
                    accumulator.accumulate(&model, grads);
                    value
                }
                Err(value) => {
                    progress.abandon_with_message(format!("loss {value} at step {s}"));
                    return Err(TrainError::NonFinite {
                        step: s,
                        loss: value,
                        checkpoint: last_checkpoint,
                    });
                }
            };
            loss_sum += value;
        }
        // The previous step's weights gave finite losses: only now is its checkpoint written
        // (the model and optimiser still hold that step's state until the update below).
        if let Some(state) = pending_checkpoint.take() {
            let t = Instant::now();
            log.sync()?;
            last_checkpoint = Some(save_checkpoint(out_dir, &state, &model, &optimizer)?);
            prune_checkpoints(out_dir, config.keep_checkpoints)?;
            side_time += t.elapsed();
        }
        let mut grads = accumulator.grads();
        if let Some(max_norm) = config.grad_clip {
            grads = clip_global_norm(&model, grads, max_norm).0;
        }
        model = optimizer.step(lr, model, grads);
        step = s;
        tokens += config.tokens_per_step();
        let step_loss = loss_sum / config.grad_accum as f64;
        pending_losses.push(step_loss);
        let train_time = timer.elapsed() - side_time;
        interval_time += train_time;
        total_time += train_time;
        interval_tokens += config.tokens_per_step();
        total_tokens += config.tokens_per_step();

        let val = (s % config.eval_every == 0 || s == config.max_steps)
            .then(|| evaluate(&model.valid(), &eval_set, device));
        if val.is_some() || s % config.log_every == 0 {
            let row = MetricsRow {
                step: s,
                tokens,
                lr,
                train_loss: pending_losses.iter().sum::<f64>() / pending_losses.len() as f64,
                val,
                tokens_per_s: interval_tokens as f64 / interval_time.as_secs_f64().max(1e-9),
                elapsed_s: elapsed(),
            };
            log.append(&row)?;
            rows.push(row);
            pending_losses.clear();
            (interval_time, interval_tokens) = (Duration::ZERO, 0);
        }
        if let Some(v) = val {
            last_val = Some(v);
            write_loss_plot(&rows, &plot_title, &plot_path)?;
            if !v.loss.is_finite() {
                progress.abandon_with_message(format!("validation loss {} at step {s}", v.loss));
                return Err(TrainError::NonFinite {
                    step: s,
                    loss: v.loss,
                    checkpoint: last_checkpoint,
                });
            }
        }
        let throughput = total_tokens as f64 / total_time.as_secs_f64().max(1e-9);
        progress.set_position(s as u64);
        progress.set_message(match last_val {
            Some(v) => format!(
                "loss {step_loss:.4} val {:.4} {throughput:.0} tok/s",
                v.loss
            ),
            None => format!("loss {step_loss:.4} {throughput:.0} tok/s"),
        });
        if s % config.checkpoint_every == 0 && s < stop {
            pending_checkpoint = Some(CheckpointState::new(s, tokens, elapsed(), &pending_losses));
        }
    }

    // The final checkpoint, unless this invocation only reopened a run already at `stop`.
    if resumed_step != Some(step) {
        if step < config.max_steps {
            // Stopped early: vouch for the weights with the loss of the next step's first micro-batch
            // (at max_steps the final validation loss, checked above, does it).
            // One device's shard of rows: the whole micro-batch of a multi-GPU run may not fit on one.
            let rows = config.batch_size / devices.len();
            let batch = windows.batch((step * config.grad_accum) as u64, rows);
            let next = batch_loss(&model.valid(), &batch, device)
                .into_scalar()
                .elem::<f64>();
            if !next.is_finite() {
                progress.abandon_with_message(format!("loss {next} at step {}", step + 1));
                return Err(TrainError::NonFinite {
                    step: step + 1,
                    loss: next,
                    checkpoint: last_checkpoint,
                });
            }
        }
        log.sync()?;
        let state = CheckpointState::new(step, tokens, elapsed(), &pending_losses);
        save_checkpoint(out_dir, &state, &model, &optimizer)?;
        prune_checkpoints(out_dir, config.keep_checkpoints)?;
    }
    write_loss_plot(&rows, &plot_title, &plot_path)?;

    let val_row = rows.iter().rev().find(|r| r.val.is_some());
    let summary = RunSummary {
        corpus: corpus.name.clone(),
        tokenizer: corpus.tokenizer.clone(),
        steps: step,
        max_steps: config.max_steps,
        finished: step >= config.max_steps,
        tokens,
        train_loss: rows.last().map(|r| r.train_loss),
        val_loss: val_row.and_then(|r| r.val).map(|v| v.loss),
        val_ppl: val_row.and_then(|r| r.val).map(|v| v.ppl),
        val_bpb: val_row.and_then(|r| r.val).map(|v| v.bpb),
        val_step: val_row.map(|r| r.step),
        wall_s: elapsed(),
        tokens_per_s: total_tokens as f64 / total_time.as_secs_f64().max(1e-9),
        params,
        extra_params,
        resumed_from: resumed_step,
    };
    let summary_path = out_dir.join("summary.json");
    let json = serde_json::to_string_pretty(&summary).expect("a RunSummary always serialises");
    atomic::write(&summary_path, json.as_bytes())
        .map_err(|e| TrainError::io("write", &summary_path, e))?;
    progress.finish_with_message(match summary.val_loss {
        Some(v) => format!("val loss {v:.4}, {:.0} tok/s", summary.tokens_per_s),
        None => format!("{:.0} tok/s", summary.tokens_per_s),
    });
    Ok(summary)
}

/// Decides between a fresh run and a resume, checking the folder and the config: the newest
/// complete checkpoint to resume from, or `None` for a fresh start.
fn resolve_start(
    out_dir: &Path,
    run_config: &RunConfig,
    options: &RunOptions,
    say: &dyn Fn(String),
) -> Result<Option<(usize, PathBuf)>, TrainError> {
    let config_path = out_dir.join("config.json");
    let checkpoints = list_checkpoints(out_dir)?;
    if !options.resume {
        if config_path.exists() || !checkpoints.is_empty() {
            let what = match checkpoints.last() {
                Some((step, _)) => format!("checkpoints up to step {step}"),
                None => "a config.json".to_string(),
            };
            return Err(TrainError::RunExists {
                path: out_dir.to_path_buf(),
                what,
            });
        }
        return Ok(None);
    }
    let Some(newest) = checkpoints.last().cloned() else {
        say(format!(
            "no complete checkpoint in {}: starting a fresh run",
            out_dir.display()
        ));
        return Ok(None);
    };
    let new: serde_json::Value =
        serde_json::from_str(&run_config.to_json()).expect("our own JSON parses");
    let old: Option<serde_json::Value> = match std::fs::read_to_string(&config_path) {
        Ok(text) => Some(
            serde_json::from_str(&text).map_err(|e| TrainError::Corrupt {
                path: config_path.clone(),
                message: e.to_string(),
                hint: "restore it, or resume with allow_config_change to replace it",
            })?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && options.allow_config_change => None,
        Err(e) => return Err(TrainError::io("read", &config_path, e)),
    };
    let changes = old.map_or_else(Vec::new, |old| differing_fields(&old, &new));
    if !changes.is_empty() {
        if !options.allow_config_change {
            return Err(TrainError::ConfigMismatch {
                path: config_path,
                changes,
            });
        }
        let list: Vec<String> = changes.iter().map(|c| c.to_string()).collect();
        say(format!(
            "resuming with a changed config: {}",
            list.join(", ")
        ));
    }
    Ok(Some(newest))
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
fn step_seed(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED_0F57_E95E_ED00;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
