//! `loss.svg`: training and validation loss against step.

use super::{MetricsRow, TrainError};
use crate::atomic;
use plotters::prelude::*;
use std::path::Path;

/// Draws the training loss (a line through every metrics row) and the validation loss (a line
/// with a dot per evaluation) against step, and writes the SVG atomically.
pub fn write_loss_plot(rows: &[MetricsRow], title: &str, path: &Path) -> Result<(), TrainError> {
    let plot_error = |message: String| TrainError::Plot {
        path: path.to_path_buf(),
        message,
    };
    let train: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r.train_loss.is_finite())
        .map(|r| (r.step as f64, r.train_loss))
        .collect();
    let val: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| Some((r.step as f64, r.val?.loss)))
        .filter(|(_, l)| l.is_finite())
        .collect();
    let losses = train.iter().chain(&val).map(|p| p.1);
    let (lo, hi) = losses.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), l| {
        (lo.min(l), hi.max(l))
    });
    let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) };
    let pad = ((hi - lo) * 0.05).max(1e-3);
    let last_step = rows.last().map_or(1, |r| r.step).max(1) as f64;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (720, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_error(e.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..last_step, (lo - pad)..(hi + pad))
            .map_err(|e| plot_error(e.to_string()))?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("loss (nats per token)")
            .draw()
            .map_err(|e| plot_error(e.to_string()))?;
        let train_color = BLUE.mix(0.8);
        chart
            .draw_series(LineSeries::new(train.clone(), train_color.stroke_width(2)))
            .map_err(|e| plot_error(e.to_string()))?
            .label("train")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], train_color.stroke_width(2))
            });
        let val_color = RED.mix(0.9);
        chart
            .draw_series(LineSeries::new(val.clone(), val_color.stroke_width(2)))
            .map_err(|e| plot_error(e.to_string()))?
            .label("validation")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], val_color.stroke_width(2))
            });
        chart
            .draw_series(
                val.into_iter()
                    .map(|p| Circle::new(p, 3, val_color.filled())),
            )
            .map_err(|e| plot_error(e.to_string()))?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| plot_error(e.to_string()))?;
        root.present().map_err(|e| plot_error(e.to_string()))?;
    }
    atomic::write(path, svg.as_bytes()).map_err(|e| TrainError::io("write", path, e))
}
