//! Training entry points ([`train`], [`train_with`], [`train_on_devices`]) over a
//! [`Trainer`], the options of a run and its summary.

use super::checkpoint::list_checkpoints;
use super::config::{FieldChange, OPTIMISER_FIELDS, RecordedChange, RunConfig, differing_fields};
use super::trainer::Trainer;
use super::{TrainConfig, TrainError};
use crate::data::TokenizedCorpus;
use coupled_qk::model::FusedOps;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// How to run [`train_with`], beyond the config.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Continue from the newest complete checkpoint in the output folder. With none there, a
    /// fresh run starts (and says so): a job script can always pass it.
    pub resume: bool,
    /// Stop after this step (checkpointing there) as if interrupted, the schedule still spanning
    /// `max_steps`: for time-boxed jobs; a later `resume` continues exactly.
    pub stop_at: Option<usize>,
    /// On resume, accept changes of these settings of the optimiser (names of
    /// [`OPTIMISER_FIELDS`], e.g. `lr` to lower the learning rate after a divergence); they are
    /// printed and recorded in `config.json` with the step they apply from. Changes of any other
    /// field are still refused.
    pub allow_changes: Vec<&'static str>,
    /// On resume, accept any config that differs from the run's `config.json` (printed,
    /// recorded). The checkpoint must still fit the model: parameter shapes are checked. The run
    /// is then no longer the one an uninterrupted run of either config would give.
    pub allow_config_change: bool,
    /// No progress bar and no messages.
    pub quiet: bool,
    /// Start a fresh run in a folder that is not empty and holds no run (its files of the same
    /// names are overwritten). Without it such a folder is refused.
    pub force: bool,
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
    /// What each layer's dynamics did at the last evaluation (see `dynamics.csv`).
    #[serde(default)]
    pub dynamics: Vec<super::DynamicsRow>,
}

/// Trains `config.model` on `corpus`, writing `config.json`, `metrics.csv`, `loss.svg`,
/// `summary.json` and `checkpoints/` into `out_dir`; `resume` continues the run there.
pub fn train<B: FusedOps>(
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
pub fn train_with<B: FusedOps>(
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
pub fn train_on_devices<B: FusedOps>(
    config: &TrainConfig,
    corpus: &TokenizedCorpus,
    out_dir: &Path,
    options: &RunOptions,
    devices: &[B::Device],
) -> Result<RunSummary, TrainError> {
    Trainer::<B>::prepare(config, corpus, out_dir, options, devices)?.run()
}

/// Where a run starts, as [`resolve_start`] decides it.
pub(super) struct Start {
    /// The complete checkpoints to resume from, oldest first (the newest one that verifies is
    /// taken), or `None` for a fresh start.
    pub checkpoints: Option<Vec<(usize, PathBuf)>>,
    /// The settings this resume changes.
    pub changes: Vec<FieldChange>,
    /// The settings changed by earlier resumes.
    pub history: Vec<RecordedChange>,
}

/// Decides between a fresh run and a resume, checking the folder and the config: the complete
/// checkpoints to resume from (or `None` for a fresh start), the settings this resume changes,
/// and the record of earlier changes.
pub(super) fn resolve_start(
    out_dir: &Path,
    run_config: &RunConfig,
    options: &RunOptions,
    say: &dyn Fn(String),
) -> Result<Start, TrainError> {
    let config_path = out_dir.join("config.json");
    let checkpoints = list_checkpoints(out_dir)?;
    let fresh = Start {
        checkpoints: None,
        changes: Vec::new(),
        history: Vec::new(),
    };
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
        let foreign = std::fs::read_dir(out_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .find(|name| name != super::trainer::LOCK_FILE);
        if let (false, Some(first)) = (options.force, foreign) {
            return Err(TrainError::FolderNotEmpty {
                path: out_dir.to_path_buf(),
                first,
            });
        }
        return Ok(fresh);
    }
    if checkpoints.is_empty() {
        say(format!(
            "no complete checkpoint in {}: starting a fresh run",
            out_dir.display()
        ));
        return Ok(fresh);
    }
    let new: serde_json::Value =
        serde_json::from_str(&run_config.to_json()).expect("our own JSON parses");
    let old: Option<serde_json::Value> = match std::fs::read_to_string(&config_path) {
        Ok(text) => Some(
            serde_json::from_str(&text).map_err(|e| TrainError::Corrupt {
                path: config_path.clone(),
                message: e.to_string(),
                hint: "restore it from a copy, or train into a new folder",
            })?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && options.allow_config_change => None,
        Err(e) => return Err(TrainError::io("read", &config_path, e)),
    };
    let history: Vec<RecordedChange> = old
        .as_ref()
        .and_then(|old| old.get("changes"))
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default();
    let changes = old.map_or_else(Vec::new, |old| differing_fields(&old, &new));
    if !changes.is_empty() {
        let allowed = options.allow_config_change
            || changes.iter().all(|c| {
                let field = c.field.as_str();
                OPTIMISER_FIELDS.contains(&field) && options.allow_changes.contains(&field)
            });
        if !allowed {
            return Err(TrainError::ConfigMismatch {
                path: config_path,
                changes,
            });
        }
    }
    Ok(Start {
        checkpoints: Some(checkpoints),
        changes,
        history,
    })
}

pub(super) fn progress_bar(quiet: bool, stop: usize, position: usize) -> ProgressBar {
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
