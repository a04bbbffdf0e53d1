//! `loss.svg`: training and validation loss against step.

use super::{MetricsRow, TrainError};
use crate::plot::{Chart, Line, write_charts};
use std::path::Path;

/// Draws the training loss (every metrics row) and the validation loss (every evaluation)
/// against step, and writes the SVG atomically.
pub fn write_loss_plot(rows: &[MetricsRow], title: &str, path: &Path) -> Result<(), TrainError> {
    let train = rows.iter().map(|r| (r.step as f64, r.train_loss)).collect();
    let val = rows
        .iter()
        .filter_map(|r| Some((r.step as f64, r.val?.loss)))
        .collect();
    let chart = Chart {
        title: title.to_string(),
        x_desc: "step".into(),
        y_desc: "loss (nats per token)".into(),
        lines: vec![
            Line {
                label: "train".into(),
                points: train,
            },
            Line {
                label: "validation".into(),
                points: val,
            },
        ],
        ..Chart::default()
    };
    write_charts(path, &[chart], (720, 420)).map_err(|e| TrainError::Plot {
        path: e.path,
        message: e.message,
    })
}
