//! The per-evaluation logs of a run folder (`dynamics.csv`, `attention.csv`): a row per layer at
//! every evaluation, kept in memory and rewritten atomically after each evaluation (a few rows
//! each time, so rewriting costs nothing and never tears a row).

use super::TrainError;
use super::csv_row::RowError;
use crate::plot::{Chart, Line};
use std::path::{Path, PathBuf};

/// A row of a per-evaluation log: one layer at one evaluation.
pub trait EvalRow: Clone + Sized {
    /// What one layer's measurement holds.
    type Stats;
    /// The file's header, exactly.
    const HEADER: &'static str;
    /// The row of `layer` measured at `step`.
    fn new(step: usize, layer: usize, stats: Self::Stats) -> Self;
    /// Steps done when it was measured.
    fn step(&self) -> usize;
    /// The block it measured, 0-based.
    fn layer(&self) -> usize;
    /// The CSV line, without its newline.
    fn to_csv(&self) -> String;
    /// Parses a line written by [`to_csv`](Self::to_csv).
    ///
    /// # Errors
    /// A row of another field count, or a field that is not a number.
    fn parse(line: &str) -> Result<Self, RowError>;
}

/// A per-evaluation log of a run: its rows in memory, the file rewritten after each evaluation.
pub struct EvalLog<R> {
    path: PathBuf,
    rows: Vec<R>,
}

impl<R: EvalRow> EvalLog<R> {
    /// A fresh log, or on resume the rows of `path` up to step `last_step` (rows past it belong to
    /// steps that will run again; unreadable rows are dropped with a warning: the file is a
    /// diagnostic, not the run's record).
    pub fn open(path: &Path, resume_from: Option<usize>) -> Result<Self, TrainError> {
        let mut rows = Vec::new();
        if let Some(last_step) = resume_from
            && let Ok(text) = std::fs::read_to_string(path)
        {
            for (i, line) in text.lines().enumerate().skip(1) {
                match R::parse(line) {
                    Ok(row) if row.step() <= last_step => rows.push(row),
                    Ok(_) => {}
                    Err(e) => eprintln!("warning: {} line {}: {e}; dropped", path.display(), i + 1),
                }
            }
        }
        let log = EvalLog {
            path: path.to_path_buf(),
            rows,
        };
        log.write()?;
        Ok(log)
    }

    /// The rows so far.
    pub fn rows(&self) -> &[R] {
        &self.rows
    }

    /// Records one evaluation: a row per layer.
    pub fn record(&mut self, step: usize, layers: Vec<R::Stats>) -> Result<(), TrainError> {
        for (layer, stats) in layers.into_iter().enumerate() {
            self.rows.push(R::new(step, layer, stats));
        }
        self.write()
    }

    /// The newest row of each layer, in layer order.
    pub fn last(&self) -> Vec<R> {
        let Some(step) = self.rows.last().map(R::step) else {
            return Vec::new();
        };
        self.rows
            .iter()
            .filter(|r| r.step() == step)
            .cloned()
            .collect()
    }

    fn write(&self) -> Result<(), TrainError> {
        let mut text = format!("{}\n", R::HEADER);
        for row in &self.rows {
            text.push_str(&row.to_csv());
            text.push('\n');
        }
        crate::atomic::write(&self.path, text.as_bytes())
            .map_err(|e| TrainError::io("write", &self.path, e))
    }
}

/// One panel of a per-evaluation plot: `value` of each row against step, a line per layer
/// (rows where it is `None` left out).
pub(super) fn layer_chart<R: EvalRow>(
    rows: &[R],
    title: &str,
    name: &str,
    value: &dyn Fn(&R) -> Option<f64>,
) -> Chart {
    let mut layers: Vec<usize> = rows.iter().map(R::layer).collect();
    layers.sort_unstable();
    layers.dedup();
    Chart {
        title: format!("{title}: {name}"),
        x_desc: "step".into(),
        y_desc: name.into(),
        lines: layers
            .iter()
            .map(|&layer| Line {
                label: format!("layer {layer}"),
                points: rows
                    .iter()
                    .filter(|r| r.layer() == layer)
                    .filter_map(|r| Some((r.step() as f64, value(r)?)))
                    .collect(),
            })
            .collect(),
        ..Chart::default()
    }
}
