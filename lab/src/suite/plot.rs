//! An overlay of validation curves: one line per variant (mean over seeds at each evaluation).

use super::CellResult;
use crate::atomic;
use plotters::prelude::*;
use std::path::Path;

/// Draws validation loss against training tokens (millions) for each variant of `results` (in
/// order of first appearance), averaging seeds at equal steps, and writes the SVG atomically.
pub fn write_curves_plot(results: &[CellResult], title: &str, path: &Path) -> Result<(), String> {
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
                .filter(|p| p.1.is_finite())
                .collect();
            (v, points)
        })
        .collect();
    let all = lines.iter().flat_map(|(_, p)| p.iter());
    let (x_max, lo, hi) = all.fold(
        (0f64, f64::INFINITY, f64::NEG_INFINITY),
        |(x, lo, hi), p| (x.max(p.0), lo.min(p.1), hi.max(p.1)),
    );
    if !lo.is_finite() {
        return Err("no validation points to plot".into());
    }
    let pad = ((hi - lo) * 0.05).max(1e-3);
    let mut svg = String::new();
    {
        let err = |e: &dyn std::fmt::Display| e.to_string();
        let root = SVGBackend::with_string(&mut svg, (760, 460)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..x_max.max(1e-6), (lo - pad)..(hi + pad))
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("training tokens (millions)")
            .y_desc("validation loss (nats per token)")
            .draw()
            .map_err(|e| err(&e))?;
        for (i, (label, points)) in lines.into_iter().enumerate() {
            let color = Palette99::pick(i).mix(0.9);
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 2, color.filled())),
                )
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    atomic::write(path, svg.as_bytes()).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
