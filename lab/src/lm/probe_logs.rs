//! What attention does during a run, logged at every evaluation: `dynamics.csv` (what the
//! query-key dynamics do) and `attention.csv` (the attention diagnostics), with their plots.

use super::TrainError;
use super::attention_diagnostics::gpt_attention_diagnostics;
use super::attention_log::{AttentionLog, AttentionRow, write_attention_plot};
use super::dynamics_log::{DynamicsLog, DynamicsRow, write_dynamics_plot};
use crate::plot::PlotError;
use burn::tensor::{Int, Tensor, backend::Backend};
use coupled_qk::model::Gpt;
use std::path::{Path, PathBuf};

/// The per-evaluation logs of a run folder.
pub struct ProbeLogs {
    out_dir: PathBuf,
    dynamics: DynamicsLog,
    attention: AttentionLog,
}

impl ProbeLogs {
    /// Fresh logs in `out_dir`, or on resume their rows up to `resumed_step`.
    pub fn open(out_dir: &Path, resumed_step: Option<usize>) -> Result<Self, TrainError> {
        Ok(ProbeLogs {
            out_dir: out_dir.to_path_buf(),
            dynamics: DynamicsLog::open(&out_dir.join("dynamics.csv"), resumed_step)?,
            attention: AttentionLog::open(&out_dir.join("attention.csv"), resumed_step)?,
        })
    }

    /// Probes `model` on `tokens` (the first validation batch) after `step` steps and writes
    /// both logs.
    pub fn record<B: Backend>(
        &mut self,
        step: usize,
        model: &Gpt<B>,
        tokens: Tensor<B, 2, Int>,
    ) -> Result<(), TrainError> {
        self.dynamics
            .record(step, model.dynamics_stats(tokens.clone()))?;
        self.attention
            .record(step, gpt_attention_diagnostics(model, tokens))
    }

    /// Draws `dynamics.svg` and `attention.svg`.
    pub fn plot(&self, title: &str) -> Result<(), PlotError> {
        let dynamics = self.out_dir.join("dynamics.svg");
        write_dynamics_plot(self.dynamics.rows(), title, &dynamics)?;
        let attention = self.out_dir.join("attention.svg");
        write_attention_plot(self.attention.rows(), title, &attention)
    }

    /// The newest `dynamics.csv` row of each layer.
    pub fn last_dynamics(&self) -> Vec<DynamicsRow> {
        self.dynamics.last()
    }

    /// The newest `attention.csv` row of each layer.
    pub fn last_attention(&self) -> Vec<AttentionRow> {
        self.attention.last()
    }
}
