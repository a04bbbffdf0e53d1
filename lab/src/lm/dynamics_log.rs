//! `dynamics.csv` and `dynamics.svg`: what each layer's query-key dynamics do during training,
//! measured at every evaluation on the first validation batch (see
//! [`Gpt::dynamics_stats`](coupled_qk::model::Gpt::dynamics_stats)).

use super::csv_row::{RowError, fields, number};
use super::eval_log::{EvalLog, EvalRow, layer_chart};
use crate::plot::{PlotError, write_charts};
use coupled_qk::DynamicsStats;
use std::path::Path;

/// The header of `dynamics.csv`, exactly. `dt` is the mean over heads (empty without coupled
/// dynamics), `dt_heads` every head's, separated by `;`.
pub const DYNAMICS_HEADER: &str =
    "step,layer,dt,dt_heads,q_change,k_change,entropy,entropy_standard";

/// One row of `dynamics.csv`: one layer at one evaluation.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DynamicsRow {
    /// Steps done.
    pub step: usize,
    /// The block, 0-based.
    pub layer: usize,
    /// What its dynamics did.
    pub stats: DynamicsStats,
}

impl DynamicsRow {
    /// The mean step size over heads, if the layer has one.
    pub fn dt_mean(&self) -> Option<f64> {
        let dt = &self.stats.dt;
        (!dt.is_empty()).then(|| dt.iter().sum::<f64>() / dt.len() as f64)
    }
}

impl EvalRow for DynamicsRow {
    type Stats = DynamicsStats;
    const HEADER: &'static str = DYNAMICS_HEADER;

    fn new(step: usize, layer: usize, stats: DynamicsStats) -> Self {
        DynamicsRow { step, layer, stats }
    }

    fn step(&self) -> usize {
        self.step
    }

    fn layer(&self) -> usize {
        self.layer
    }

    fn to_csv(&self) -> String {
        let s = &self.stats;
        let heads: Vec<String> = s.dt.iter().map(f64::to_string).collect();
        format!(
            "{},{},{},{},{},{},{},{}",
            self.step,
            self.layer,
            self.dt_mean().map_or(String::new(), |d| d.to_string()),
            heads.join(";"),
            s.q_change,
            s.k_change,
            s.entropy,
            s.entropy_standard
        )
    }

    fn parse(line: &str) -> Result<Self, RowError> {
        let f = fields(line, 8)?;
        let dt = match f[3] {
            "" => Vec::new(),
            heads => heads
                .split(';')
                .map(|h| number("dt_heads", h))
                .collect::<Result<_, _>>()?,
        };
        Ok(DynamicsRow {
            step: number("step", f[0])?,
            layer: number("layer", f[1])?,
            stats: DynamicsStats {
                dt,
                q_change: number("q_change", f[4])?,
                k_change: number("k_change", f[5])?,
                entropy: number("entropy", f[6])?,
                entropy_standard: number("entropy_standard", f[7])?,
            },
        })
    }
}

/// `dynamics.csv` of a run.
pub type DynamicsLog = EvalLog<DynamicsRow>;

/// `dynamics.svg`: the mean `dt`, the relative changes of queries and keys, and the change of
/// the attention entropy against standard attention, against step; one line per layer.
pub fn write_dynamics_plot(
    rows: &[DynamicsRow],
    title: &str,
    path: &Path,
) -> Result<(), PlotError> {
    let panel = |name: &str, value: &dyn Fn(&DynamicsRow) -> Option<f64>| {
        layer_chart(rows, title, name, value)
    };
    let charts = [
        panel("dt (mean over heads)", &|r| r.dt_mean()),
        panel("‖q₁ − q₀‖ / ‖q₀‖", &|r| {
            Some(r.stats.q_change)
        }),
        panel("‖k₁ − k₀‖ / ‖k₀‖", &|r| {
            Some(r.stats.k_change)
        }),
        panel("entropy − standard's (nats)", &|r| {
            Some(r.stats.entropy - r.stats.entropy_standard)
        }),
    ];
    write_charts(path, &charts, (420, 340))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: usize, layer: usize, dt: Vec<f64>) -> DynamicsRow {
        DynamicsRow {
            step,
            layer,
            stats: DynamicsStats {
                dt,
                q_change: 0.125,
                k_change: 1e-3,
                entropy: 2.5,
                entropy_standard: 2.625,
            },
        }
    }

    #[test]
    fn rows_round_trip_with_and_without_dt() {
        for r in [row(10, 0, vec![0.1, 0.2]), row(20, 3, vec![])] {
            assert_eq!(DynamicsRow::parse(&r.to_csv()), Ok(r.clone()));
        }
        assert_eq!(row(1, 0, vec![0.5, 0.25]).dt_mean(), Some(0.375));
        assert!(DynamicsRow::parse("1,2,3").is_err());
    }

    #[test]
    fn a_resumed_log_keeps_the_rows_up_to_its_checkpoint() {
        let dir = std::env::temp_dir().join(format!("coupled-qk-dyn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("dynamics.csv");
        let mut log = DynamicsLog::open(&path, None).unwrap();
        log.record(5, vec![row(5, 0, vec![0.1]).stats]).unwrap();
        log.record(10, vec![row(10, 0, vec![0.2]).stats]).unwrap();
        assert_eq!(log.last(), [row(10, 0, vec![0.2])]);
        let resumed = DynamicsLog::open(&path, Some(7)).unwrap();
        assert_eq!(resumed.rows(), [row(5, 0, vec![0.1])]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        write_dynamics_plot(log.rows(), "test", &dir.join("dynamics.svg")).unwrap();
        let svg = std::fs::read_to_string(dir.join("dynamics.svg")).unwrap();
        assert!(svg.contains("layer 0"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
