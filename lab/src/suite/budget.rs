//! The model and training budget every suite program shares, as command-line flags. The defaults
//! are a CPU-scale cell: the `tiny` preset with the byte tokenizer, about 10 minutes on 2 cores.

use super::{CellResult, CellState, FailedCell, Selection, Suite, cell_state, run_cell};
use crate::backend::{BackendChoice, BackendError, MultiDeviceTask};
use crate::data::{
    CorpusSource, DataError, LoadOptions, SplitOptions, TokenizedCorpus, TokenizerKind, load_corpus,
};
use crate::lm::{TrainConfig, TrainError};
use coupled_qk::AttentionKernel;
use coupled_qk::model::AttentionVariant;
use coupled_qk::model::FusedOps;
use coupled_qk::model::{GptConfig, Preset};
use std::path::PathBuf;

/// Model and budget flags.
#[derive(clap::Args, Clone, Debug)]
pub struct Budget {
    /// Model preset: tiny, small, 60m, 150m, 350m.
    #[arg(long, default_value = "tiny")]
    pub preset: Preset,
    /// bytes (256 ids) or gpt2 (50257 ids).
    #[arg(long, default_value = "bytes")]
    pub tokenizer: TokenizerKind,
    /// Optimiser steps per run.
    #[arg(long, default_value_t = 400)]
    pub max_steps: usize,
    /// Tokens per window (default: the preset's context).
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Windows per step.
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Micro-batches per step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Warmup steps (default: a tenth of the steps).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Evaluate every this many steps (default: an eighth of the steps).
    #[arg(long)]
    pub eval_every: Option<usize>,
    /// Validation windows per evaluation (default 64; 0 = all).
    #[arg(long, default_value_t = 64)]
    pub eval_windows: usize,
    /// auto, flex, ndarray, wgpu or cuda.
    #[arg(long, default_value = "auto")]
    pub backend: BackendChoice,
    /// Train each cell data-parallel on this many devices (GPUs; on the CPU, worker threads
    /// sharing it, faster than one: see results/performance.md). The batch size must divide by it.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub devices: u16,
    /// Token cache folder (default: $COUPLED_QK_CACHE or ~/.cache/coupled-qk).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// How attention scores are computed in training: flash (recomputed blockwise in the backward
    /// pass: memory linear in the sequence length) or explicit (the weights kept for it). The same
    /// function either way: it does not change a cell's identity.
    #[arg(long, default_value = "flash")]
    pub attention_kernel: AttentionKernel,
    /// Where run folders go (default: `<out>/runs`). Programs given the same folder train each
    /// equal cell (corpus, variant, seed, budget) once.
    #[arg(long)]
    pub runs_dir: Option<PathBuf>,
    /// Train the cells that failed before again, from scratch (their folders are deleted).
    #[arg(long)]
    pub retry_failed: bool,
    /// List the cells (index, corpus, variant, seed, state, folder) and stop.
    #[arg(long)]
    pub list_cells: bool,
    /// Train only cell N of the list (0-based) and stop without a report: one cell per process,
    /// e.g. `--cell $SLURM_ARRAY_TASK_ID` in an array job over a shared --runs-dir.
    #[arg(long, value_name = "N", conflicts_with = "list_cells")]
    pub cell: Option<usize>,
    /// Train nothing: write the report from the cells finished so far (in --runs-dir); the
    /// others are listed as not trained.
    #[arg(long, conflicts_with_all = ["list_cells", "cell"])]
    pub report_only: bool,
}

impl Budget {
    /// The suite whose report goes to `out`.
    pub fn suite(&self, out: &std::path::Path) -> Suite {
        Suite {
            runs: self.runs_dir.clone().unwrap_or_else(|| out.join("runs")),
            quiet: false,
            retry_failed: self.retry_failed,
            selection: match (self.list_cells, self.cell, self.report_only) {
                (true, _, _) => Selection::List,
                (_, Some(n), _) => Selection::One(n),
                (_, _, true) => Selection::ReportOnly,
                _ => Selection::All,
            },
        }
    }

    /// Checks the config of every cell of `variants` (seed 0 stands for every seed) with the
    /// tokenizer's vocabulary, before any corpus is loaded or downloaded: a flag that cannot work
    /// is refused at once, not after the corpus.
    ///
    /// # Errors
    /// The first config that [`TrainConfig::validate`] refuses.
    pub fn check(&self, variants: &[AttentionVariant]) -> Result<(), TrainError> {
        let vocab_size = self.tokenizer.build().vocab_size();
        variants
            .iter()
            .try_for_each(|variant| self.train_config(vocab_size, variant, 0).validate())
    }

    /// The training config of one cell.
    pub fn train_config(
        &self,
        vocab_size: usize,
        variant: &AttentionVariant,
        seed: u64,
    ) -> TrainConfig {
        let model = GptConfig::preset(self.preset, vocab_size).with_attention(variant.clone());
        let mut config = TrainConfig::new(model);
        if let Some(seq_len) = self.seq_len {
            config.seq_len = seq_len;
        }
        config.batch_size = self.batch_size;
        config.grad_accum = self.grad_accum;
        config.max_steps = self.max_steps;
        config.lr = self.lr;
        config.warmup_steps = self.warmup.unwrap_or(self.max_steps / 10);
        config.eval_every = self.eval_every.unwrap_or((self.max_steps / 8).max(1));
        config.eval_windows = (self.eval_windows > 0).then_some(self.eval_windows);
        config.checkpoint_every = (self.max_steps / 4).max(1);
        config.keep_checkpoints = 1;
        config.seed = seed;
        config.attention_kernel = self.attention_kernel;
        config
    }

    /// Trains (or reads back) `cells` under `suite` on this budget's backend and devices, as
    /// `suite.selection` says: the outcome to report, or `None` when there is nothing to report
    /// (the cells were listed, or one cell trained).
    ///
    /// # Errors
    /// When the backend cannot run (no such device, or not compiled in), or the selected cell
    /// is not in the list.
    pub fn train(
        &self,
        suite: &Suite,
        cells: Vec<(&TokenizedCorpus, String, TrainConfig)>,
    ) -> Result<Option<SuiteOutcome>, SuiteError> {
        if let Selection::One(n) = suite.selection
            && n >= cells.len()
        {
            return Err(SuiteError::NoSuchCell {
                cell: n,
                cells: cells.len(),
            });
        }
        let outcome = crate::backend::dispatch_devices(
            self.backend,
            usize::from(self.devices),
            Cells { suite, cells },
        )?;
        Ok(match suite.selection {
            Selection::All | Selection::ReportOnly => Some(outcome),
            Selection::One(_) | Selection::List => {
                // One cell's failure is still the process's failure (its exit status).
                outcome.check()?;
                None
            }
        })
    }

    /// Loads a corpus (`--corpus` syntax of the data pipeline) with this budget's tokenizer.
    ///
    /// # Errors
    /// The corpus cannot be found, downloaded or read.
    pub fn load(
        &self,
        corpus: &str,
        data_dir: Option<&PathBuf>,
    ) -> Result<TokenizedCorpus, DataError> {
        let source = corpus
            .parse::<CorpusSource>()?
            .with_data_dir(data_dir.cloned())?;
        let options = LoadOptions::for_program(self.cache_dir.clone(), SplitOptions::default());
        Ok(load_corpus(&source, self.tokenizer, &options)?.corpus)
    }
}

/// Cells to train: each a corpus, a variant and a training config.
pub struct Cells<'a> {
    /// Where runs go.
    pub suite: &'a Suite,
    /// `(corpus, label, config)` in the order to run; the label (the variant's name, or another
    /// such as `standard-x10`) names the cell's folder and its rows in reports.
    pub cells: Vec<(&'a TokenizedCorpus, String, TrainConfig)>,
}

/// What a suite's cells gave: the finished ones and the failed ones.
#[derive(Clone, Debug, Default)]
pub struct SuiteOutcome {
    /// Every finished cell, in order.
    pub results: Vec<CellResult>,
    /// Every cell that failed, now or before (see [`Suite::retry_failed`]).
    pub failed: Vec<FailedCell>,
}

impl SuiteOutcome {
    /// `Err` naming every failed cell, `Ok` when none failed: a program's last word, after its
    /// report is written.
    pub fn check(&self) -> Result<(), SuiteError> {
        match self.failed.is_empty() {
            true => Ok(()),
            false => Err(SuiteError::Failed(self.failed.clone())),
        }
    }
}

/// Why a suite did not give a full outcome.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// The backend cannot run.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The selected cell is not in the list.
    #[error("cell {cell}: the suite has {cells} cells, numbered from 0")]
    NoSuchCell {
        /// The cell asked for.
        cell: usize,
        /// How many there are.
        cells: usize,
    },
    /// Cells failed (diverged now or before, or could not be trained or read back).
    #[error("{} cell(s) failed: {}; the report lists them", .0.len(), failed_list(.0))]
    Failed(Vec<FailedCell>),
}

fn failed_list(failed: &[FailedCell]) -> String {
    failed
        .iter()
        .map(|f| {
            format!(
                "{} · {} · seed {} ({})",
                f.corpus, f.variant, f.seed, f.error
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl MultiDeviceTask for Cells<'_> {
    type Output = SuiteOutcome;
    fn run<B: FusedOps>(
        self,
        devices: Vec<B::Device>,
        _name: &'static str,
        _gpu: bool,
    ) -> Self::Output {
        let total = self.cells.len();
        let mut outcome = SuiteOutcome::default();
        let selection = self.suite.selection;
        if selection == Selection::List {
            for (i, (corpus, label, config)) in self.cells.iter().enumerate() {
                let dir = self.suite.cell_dir(&corpus.name, label, config.seed);
                let state = cell_state(&dir, config, corpus);
                println!(
                    "{i}\t{}\t{label}\tseed {}\t{state}\t{}",
                    corpus.name,
                    config.seed,
                    dir.display()
                );
            }
            return outcome;
        }
        for (i, (corpus, label, config)) in self.cells.into_iter().enumerate() {
            if matches!(selection, Selection::One(n) if n != i) {
                continue;
            }
            if selection == Selection::ReportOnly {
                let dir = self.suite.cell_dir(&corpus.name, &label, config.seed);
                let state = cell_state(&dir, &config, corpus);
                if state != CellState::Finished {
                    outcome.failed.push(FailedCell {
                        corpus: corpus.name.clone(),
                        variant: label,
                        seed: config.seed,
                        error: format!("not trained yet (cell {i} of the list: {state})"),
                        dir,
                    });
                    continue;
                }
            }
            eprintln!(
                "[{}/{total}] {} · {} · seed {}",
                i + 1,
                corpus.name,
                label,
                config.seed
            );
            let dir = self.suite.cell_dir(&corpus.name, &label, config.seed);
            if let Some(failed) = FailedCell::recorded(&dir) {
                if !self.suite.retry_failed {
                    eprintln!(
                        "{}: failed before ({}); skipped (a retry of the failed cells trains it again)",
                        dir.display(),
                        failed.error
                    );
                    outcome.failed.push(failed);
                    continue;
                }
                eprintln!(
                    "{}: failed before; trained again from scratch",
                    dir.display()
                );
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    outcome.failed.push(FailedCell {
                        error: format!("cannot delete {} to retry it: {e}", dir.display()),
                        ..failed
                    });
                    continue;
                }
            }
            match run_cell::<B>(self.suite, &label, &config, corpus, &devices) {
                Ok(result) => outcome.results.push(result),
                Err(e) => {
                    eprintln!("{}: failed: {e}", dir.display());
                    // Only a divergence is the cell's own: recorded, it is not trained again
                    // until retried. Other errors (a changed config, a folder in use, I/O) say
                    // nothing about the cell and are only reported.
                    let diverged = matches!(e, TrainError::NonFinite { .. });
                    let failed = FailedCell {
                        corpus: corpus.name.clone(),
                        variant: label,
                        seed: config.seed,
                        error: e.to_string(),
                        dir,
                    };
                    if diverged && let Err(e) = failed.record() {
                        eprintln!("warning: cannot record the failure: {e}");
                    }
                    outcome.failed.push(failed);
                }
            }
        }
        outcome
    }
}
