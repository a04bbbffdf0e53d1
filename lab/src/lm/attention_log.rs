//! `attention.csv` and `attention.svg`: the attention diagnostics of each layer during training
//! (entropy, distance from uniform, effective rank, leading singular-value ratio), measured at
//! every evaluation on the first windows of the first validation batch (see
//! [`attention_diagnostics`](super::attention_diagnostics)).

use super::attention_diagnostics::AttentionDiagnostics;
use super::csv_row::{RowError, fields, number};
use super::eval_log::{EvalLog, EvalRow, layer_chart};
use crate::plot::{PlotError, write_charts};
use std::path::Path;

/// The header of `attention.csv`, exactly.
pub const ATTENTION_HEADER: &str = "step,layer,entropy,normalised_entropy,effective_rank,\
                                    leading_ratio,distance_from_uniform";

/// One row of `attention.csv`: one layer at one evaluation.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AttentionRow {
    /// Steps done.
    pub step: usize,
    /// The block, 0-based.
    pub layer: usize,
    /// Its attention's diagnostics.
    pub diagnostics: AttentionDiagnostics,
}

impl EvalRow for AttentionRow {
    type Stats = AttentionDiagnostics;
    const HEADER: &'static str = ATTENTION_HEADER;

    fn new(step: usize, layer: usize, diagnostics: AttentionDiagnostics) -> Self {
        AttentionRow {
            step,
            layer,
            diagnostics,
        }
    }

    fn step(&self) -> usize {
        self.step
    }

    fn layer(&self) -> usize {
        self.layer
    }

    fn to_csv(&self) -> String {
        let d = &self.diagnostics;
        format!(
            "{},{},{},{},{},{},{}",
            self.step,
            self.layer,
            d.entropy,
            d.normalised_entropy,
            d.effective_rank,
            d.leading_ratio,
            d.distance_from_uniform
        )
    }

    fn parse(line: &str) -> Result<Self, RowError> {
        let f = fields(line, 7)?;
        Ok(AttentionRow {
            step: number("step", f[0])?,
            layer: number("layer", f[1])?,
            diagnostics: AttentionDiagnostics {
                entropy: number("entropy", f[2])?,
                normalised_entropy: number("normalised_entropy", f[3])?,
                effective_rank: number("effective_rank", f[4])?,
                leading_ratio: number("leading_ratio", f[5])?,
                distance_from_uniform: number("distance_from_uniform", f[6])?,
            },
        })
    }
}

/// `attention.csv` of a run.
pub type AttentionLog = EvalLog<AttentionRow>;

/// `attention.svg`: the diagnostics against step, one line per layer.
pub fn write_attention_plot(
    rows: &[AttentionRow],
    title: &str,
    path: &Path,
) -> Result<(), PlotError> {
    let panel = |name: &str, value: fn(&AttentionDiagnostics) -> f64| {
        layer_chart(rows, title, name, &|r: &AttentionRow| {
            Some(value(&r.diagnostics))
        })
    };
    let charts = [
        panel("entropy / uniform's", |d| d.normalised_entropy),
        panel("distance from uniform", |d| d.distance_from_uniform),
        panel("effective rank", |d| d.effective_rank),
        panel("ln(σ₁ / σ₂)", |d| d.leading_ratio.ln()),
    ];
    write_charts(path, &charts, (420, 340))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: usize, layer: usize) -> AttentionRow {
        AttentionRow {
            step,
            layer,
            diagnostics: AttentionDiagnostics {
                entropy: 2.5,
                normalised_entropy: 0.75,
                effective_rank: 40.125,
                leading_ratio: 3.5,
                distance_from_uniform: 0.375,
            },
        }
    }

    #[test]
    fn rows_round_trip_and_a_resumed_log_keeps_its_rows() {
        let r = row(10, 2);
        assert_eq!(AttentionRow::parse(&r.to_csv()), Ok(r));
        assert!(AttentionRow::parse("1,2,3").is_err());
        let dir = std::env::temp_dir().join(format!("coupled-qk-att-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("attention.csv");
        let mut log = AttentionLog::open(&path, None).unwrap();
        log.record(5, vec![row(5, 0).diagnostics, row(5, 1).diagnostics])
            .unwrap();
        log.record(10, vec![row(10, 0).diagnostics]).unwrap();
        assert_eq!(log.last(), [row(10, 0)]);
        let resumed = AttentionLog::open(&path, Some(7)).unwrap();
        assert_eq!(resumed.rows(), [row(5, 0), row(5, 1)]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().next(), Some(ATTENTION_HEADER));
        write_attention_plot(log.rows(), "test", &dir.join("attention.svg")).unwrap();
        let svg = std::fs::read_to_string(dir.join("attention.svg")).unwrap();
        assert!(svg.contains("layer 1"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
