//! One cell of a suite (a corpus × variant × seed): a run folder of the LM harness, trained unless
//! it already finished, then read back.

use crate::data::TokenizedCorpus;
use crate::lm::{
    AttentionRow, DynamicsRow, RunConfig, RunOptions, RunSummary, TrainConfig, TrainError,
    differing_fields, read_metrics, train_on_devices,
};
use coupled_qk::model::FusedOps;
use std::path::{Path, PathBuf};

/// A validation point of a run's curve.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CurvePoint {
    /// Steps done.
    pub step: usize,
    /// Training tokens seen.
    pub tokens: u64,
    /// Wall-clock seconds since the run began.
    pub elapsed_s: f64,
    /// Validation loss (nats per token).
    pub val_loss: f64,
}

/// What a suite keeps of one finished run.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CellResult {
    /// The corpus.
    pub corpus: String,
    /// The variant's label.
    pub variant: String,
    /// The seed.
    pub seed: u64,
    /// Final validation loss, perplexity and bits per byte.
    pub val_loss: f64,
    /// Final validation perplexity.
    pub val_ppl: f64,
    /// Final validation bits per byte.
    pub val_bpb: f64,
    /// Training tokens.
    pub tokens: u64,
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// Training tokens per second.
    pub tokens_per_s: f64,
    /// Parameters of the model.
    pub params: usize,
    /// Parameters the variant adds.
    pub extra_params: usize,
    /// The validation curve.
    pub curve: Vec<CurvePoint>,
    /// What each layer's dynamics did at the last evaluation, a row per layer (standard and
    /// plain differential attention move nothing).
    #[serde(default)]
    pub dynamics: Vec<DynamicsRow>,
    /// Each layer's attention diagnostics at the last evaluation (empty for runs made before
    /// they were measured).
    #[serde(default)]
    pub attention: Vec<AttentionRow>,
    /// The run folder.
    pub dir: PathBuf,
}

/// A cell whose training failed. A divergence is recorded in the cell's folder as `failed.json`
/// and skipped by later runs of the suite unless they retry failed cells; other errors are
/// reported only.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FailedCell {
    /// The corpus.
    pub corpus: String,
    /// The variant's label.
    pub variant: String,
    /// The seed.
    pub seed: u64,
    /// The error, as the harness reported it.
    pub error: String,
    /// The run folder.
    pub dir: PathBuf,
}

impl FailedCell {
    /// The marker file of a failed cell in its run folder.
    pub const FILE: &'static str = "failed.json";

    /// Records the failure in the cell's folder (atomically).
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn record(&self) -> std::io::Result<()> {
        let json = serde_json::to_string_pretty(self).expect("a FailedCell serialises");
        crate::atomic::write(&self.dir.join(Self::FILE), json.as_bytes())
    }

    /// The failure recorded in `dir`, if any (with `dir` as its folder, wherever it was
    /// recorded).
    pub fn recorded(dir: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(dir.join(Self::FILE)).ok()?;
        let failed: Self = serde_json::from_str(&text).ok()?;
        Some(Self {
            dir: dir.to_path_buf(),
            ..failed
        })
    }
}

/// Where a suite's runs live and how they are shown.
#[derive(Clone, Debug)]
pub struct Suite {
    /// Where run folders go: `<runs>/<corpus>/<variant>/seed<k>`. Programs that share it train
    /// each equal cell once.
    pub runs: PathBuf,
    /// Hide progress bars and messages of the harness.
    pub quiet: bool,
    /// Train cells that failed before again, from scratch (their folders are deleted first);
    /// otherwise they are reported as failed without training.
    pub retry_failed: bool,
    /// Which cells this process trains.
    pub selection: Selection,
}

/// Which of a suite's cells a process trains: all of them, or one per process so that a
/// scheduler's array job (Slurm `--array`, a Kubernetes indexed job) trains them on many machines
/// at once, then one process that reports what they wrote into the shared runs folder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Selection {
    /// Every cell (those that finished before are read back, not trained). Default.
    #[default]
    All,
    /// Only cell `n` of the list (0-based, in the suite's order); nothing is reported.
    One(usize),
    /// None: the finished cells are read back and reported, the others listed as not trained.
    ReportOnly,
    /// None: the cells are listed with their index, state and folder.
    List,
}

/// Where a cell stands in its folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellState {
    /// Finished with this config: read back, not trained again.
    Finished,
    /// A failure is recorded (see [`Suite::retry_failed`]).
    Failed,
    /// Begun and not finished: training resumes from its last checkpoint.
    Started,
    /// Nothing yet.
    ToTrain,
}

impl std::fmt::Display for CellState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Finished => "finished",
            Self::Failed => "failed",
            Self::Started => "started",
            Self::ToTrain => "to train",
        })
    }
}

/// The state of the cell whose folder is `dir`, for `config` on `corpus`.
pub fn cell_state(dir: &Path, config: &TrainConfig, corpus: &TokenizedCorpus) -> CellState {
    if FailedCell::recorded(dir).is_some() {
        CellState::Failed
    } else if finished_summary(dir).is_some() && same_config(dir, config, corpus) {
        CellState::Finished
    } else if dir.join("config.json").exists() {
        CellState::Started
    } else {
        CellState::ToTrain
    }
}

impl Suite {
    /// The folder of a cell.
    pub fn cell_dir(&self, corpus: &str, variant: &str, seed: u64) -> PathBuf {
        self.runs
            .join(corpus)
            .join(variant)
            .join(format!("seed{seed}"))
    }
}

/// Trains the cell on `devices` (data-parallel when several) unless its folder already holds a
/// finished run (then only reads it back); an interrupted cell resumes from its last checkpoint.
pub fn run_cell<B: FusedOps>(
    suite: &Suite,
    variant: &str,
    config: &TrainConfig,
    corpus: &TokenizedCorpus,
    devices: &[B::Device],
) -> Result<CellResult, TrainError> {
    let dir = suite.cell_dir(&corpus.name, variant, config.seed);
    // A finished run counts only if it was trained with exactly this config and corpus; otherwise
    // the harness's resume refuses it, naming the fields that differ.
    let summary = match finished_summary(&dir).filter(|_| same_config(&dir, config, corpus)) {
        Some(summary) => {
            eprintln!("{}: finished before, skipped", dir.display());
            summary
        }
        None => {
            eprintln!("{}: training", dir.display());
            let options = RunOptions {
                resume: true,
                quiet: suite.quiet,
                ..RunOptions::default()
            };
            train_on_devices::<B>(config, corpus, &dir, &options, devices)?
        }
    };
    let curve = read_metrics(&dir.join("metrics.csv"))?
        .into_iter()
        .filter_map(|r| {
            r.val.map(|v| CurvePoint {
                step: r.step,
                tokens: r.tokens,
                elapsed_s: r.elapsed_s,
                val_loss: v.loss,
            })
        })
        .collect();
    let missing = |what: &str| TrainError::Corrupt {
        path: dir.join("summary.json"),
        message: format!("has no {what}"),
        hint: "delete the run folder to train it again",
    };
    Ok(CellResult {
        corpus: corpus.name.clone(),
        variant: variant.into(),
        seed: config.seed,
        val_loss: summary.val_loss.ok_or_else(|| missing("validation loss"))?,
        val_ppl: summary
            .val_ppl
            .ok_or_else(|| missing("validation perplexity"))?,
        val_bpb: summary.val_bpb.ok_or_else(|| missing("bits per byte"))?,
        tokens: summary.tokens,
        wall_s: summary.wall_s,
        tokens_per_s: summary.tokens_per_s,
        params: summary.params,
        extra_params: summary.extra_params,
        curve,
        dynamics: summary.dynamics,
        attention: summary.attention,
        dir,
    })
}

fn same_config(dir: &Path, config: &TrainConfig, corpus: &TokenizedCorpus) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("config.json")) else {
        return false;
    };
    let (Ok(old), Ok(new)) = (
        serde_json::from_str::<serde_json::Value>(&text),
        serde_json::from_str::<serde_json::Value>(&RunConfig::new(config, corpus).to_json()),
    ) else {
        return false;
    };
    differing_fields(&old, &new).is_empty()
}

fn finished_summary(dir: &Path) -> Option<RunSummary> {
    let text = std::fs::read_to_string(dir.join("summary.json")).ok()?;
    let summary: RunSummary = serde_json::from_str(&text).ok()?;
    summary.finished.then_some(summary)
}
