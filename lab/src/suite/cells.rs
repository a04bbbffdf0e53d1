//! One cell of a suite (a corpus × variant × seed): a run folder of the LM harness, trained unless
//! it already finished, then read back.

use crate::data::TokenizedCorpus;
use crate::lm::{
    RunConfig, RunOptions, RunSummary, TrainConfig, TrainError, differing_fields, read_metrics,
    train_on_devices,
};
use burn::tensor::backend::AutodiffBackend;
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
    /// The run folder.
    pub dir: PathBuf,
}

/// Where a suite's runs live and how they are shown.
#[derive(Clone, Debug)]
pub struct Suite {
    /// Where run folders go: `<runs>/<corpus>/<variant>/seed<k>`. Programs that share it train
    /// each equal cell once.
    pub runs: PathBuf,
    /// Hide progress bars and messages of the harness.
    pub quiet: bool,
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
pub fn run_cell<B: AutodiffBackend>(
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
