//! An overlay of validation curves: one line per variant (mean over seeds at each evaluation).

use super::CellResult;
use crate::plot::{Chart, Line, PlotError, write_charts};
use std::path::Path;

/// Draws validation loss against training tokens (millions) for each variant of `results` (in
/// order of first appearance), averaging seeds at equal steps, and writes the SVG atomically.
pub fn write_curves_plot(
    results: &[CellResult],
    title: &str,
    path: &Path,
) -> Result<(), PlotError> {
    let mut variants: Vec<&str> = Vec::new();
    for r in results {
        if !variants.contains(&r.variant.as_str()) {
            variants.push(&r.variant);
        }
    }
    let lines: Vec<(&str, Vec<(f64, f64)>)> = variants
        .iter()
        .map(|&v| {
            let runs: Vec<&CellResult> = results.iter().filter(|r| r.variant == v).collect();
            let steps = &runs[0].curve;
            let points = steps
                .iter()
                .filter_map(|p| {
                    let at: Vec<f64> = runs
                        .iter()
                        .filter_map(|r| {
                            r.curve
                                .iter()
                                .find(|q| q.step == p.step)
                                .map(|q| q.val_loss)
                        })
                        .collect();
                    (at.len() == runs.len()).then(|| {
                        (
                            p.tokens as f64 / 1e6,
                            at.iter().sum::<f64>() / at.len() as f64,
                        )
                    })
                })
                .collect();
            (v, points)
        })
        .collect();
    let chart = Chart {
        title: title.to_string(),
        x_desc: "training tokens (millions)".into(),
        y_desc: "validation loss (nats per token)".into(),
        lines: lines
            .into_iter()
            .map(|(label, points)| Line {
                label: label.to_string(),
                points,
            })
            .collect(),
        ..Chart::default()
    };
    write_charts(path, &[chart], (760, 460))
}
