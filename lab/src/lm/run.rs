//! What a run is asked beyond its config ([`RunOptions`]) and what it reports ([`RunSummary`]).

use serde::{Deserialize, Serialize};

/// How to run a training run, beyond the config.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Continue from the newest complete checkpoint in the output folder. With none there, a
    /// fresh run starts (and says so): a job script can always pass it.
    pub resume: bool,
    /// Stop after this step (checkpointing there) as if interrupted, the schedule still spanning
    /// `max_steps`: for time-boxed jobs; a later `resume` continues exactly.
    pub stop_at: Option<usize>,
    /// On resume, accept changes of these settings of the optimiser (names of
    /// [`OPTIMISER_FIELDS`](super::OPTIMISER_FIELDS), e.g. `lr` to lower the learning rate after a divergence); they are
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
    /// Each layer's attention diagnostics at the last evaluation (see `attention.csv`); empty in
    /// the summaries of runs made before they were measured.
    #[serde(default)]
    pub attention: Vec<super::AttentionRow>,
}
