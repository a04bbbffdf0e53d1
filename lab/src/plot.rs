//! The one way the programs draw: line charts (one or more panels side by side) written as an
//! SVG file, atomically.

use crate::atomic;
use plotters::prelude::*;
use std::ops::Range;
use std::path::Path;

/// One line of a chart: points joined by a line, with a dot at each.
#[derive(Clone, Debug)]
pub struct Line {
    /// The legend's label.
    pub label: String,
    /// `(x, y)` in order of x; non-finite points are left out.
    pub points: Vec<(f64, f64)>,
}

/// One panel: a title, axes and lines.
#[derive(Clone, Debug, Default)]
pub struct Chart {
    /// The caption.
    pub title: String,
    /// The x axis's description.
    pub x_desc: String,
    /// The y axis's description.
    pub y_desc: String,
    /// The lines, coloured in order.
    pub lines: Vec<Line>,
    /// The y range; `None`: the data's, padded by 5%.
    pub y_range: Option<Range<f64>>,
    /// Labels of the integer x positions `0, 1, …` instead of numbers (a categorical axis).
    pub x_ticks: Option<Vec<String>>,
    /// The legend at the lower left instead of the upper right.
    pub legend_lower_left: bool,
}

/// A chart that could not be drawn or written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot draw {}: {message}", path.display())]
pub struct PlotError {
    /// The file.
    pub path: std::path::PathBuf,
    /// The cause.
    pub message: String,
}

/// Draws `charts` side by side, each `panel` pixels, and writes the SVG to `path` atomically.
///
/// A chart without finite points is drawn with empty axes (a run that diverged at once still
/// gets its plot).
///
/// # Errors
/// When drawing or writing fails; the error names `path`.
pub fn write_charts(path: &Path, charts: &[Chart], panel: (u32, u32)) -> Result<(), PlotError> {
    let err = |e: &dyn std::fmt::Display| PlotError {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let finite = |c: &Chart| -> Vec<Vec<(f64, f64)>> {
        c.lines
            .iter()
            .map(|l| {
                l.points
                    .iter()
                    .copied()
                    .filter(|(x, y)| x.is_finite() && y.is_finite())
                    .collect()
            })
            .collect()
    };
    let width = panel.0 * charts.len().max(1) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, panel.1)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let areas = root.split_evenly((1, charts.len().max(1)));
        for (area, chart) in areas.iter().zip(charts) {
            let lines = finite(chart);
            let all = lines.iter().flatten();
            let (x_lo, x_hi, y_lo, y_hi) = all.fold(
                (
                    f64::INFINITY,
                    f64::NEG_INFINITY,
                    f64::INFINITY,
                    f64::NEG_INFINITY,
                ),
                |(a, b, c, d), &(x, y)| (a.min(x), b.max(x), c.min(y), d.max(y)),
            );
            let (x_lo, x_hi) = match &chart.x_ticks {
                Some(ticks) => (-0.2, ticks.len() as f64 - 0.8),
                None if x_lo.is_finite() => (x_lo.min(0.0), x_hi.max(x_lo + 1e-6)),
                None => (0.0, 1.0),
            };
            let y = chart.y_range.clone().unwrap_or_else(|| {
                if y_lo.is_finite() {
                    let pad = ((y_hi - y_lo) * 0.05).max(1e-3);
                    (y_lo - pad)..(y_hi + pad)
                } else {
                    0.0..1.0
                }
            });
            let mut plot = ChartBuilder::on(area)
                .caption(&chart.title, ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(55)
                .build_cartesian_2d(x_lo..x_hi, y)
                .map_err(|e| err(&e))?;
            let tick_label = |x: &f64| match &chart.x_ticks {
                Some(ticks) => {
                    let i = x.round() as usize;
                    match (x - i as f64).abs() < 1e-6 {
                        true => ticks.get(i).cloned().unwrap_or_default(),
                        false => String::new(),
                    }
                }
                None => format!("{x}"),
            };
            let mut mesh = plot.configure_mesh();
            mesh.x_desc(&chart.x_desc).y_desc(&chart.y_desc);
            if let Some(ticks) = &chart.x_ticks {
                mesh.x_labels(ticks.len()).x_label_formatter(&tick_label);
            }
            mesh.draw().map_err(|e| err(&e))?;
            for (i, (line, points)) in chart.lines.iter().zip(lines).enumerate() {
                let color = Palette99::pick(i).mix(0.9);
                plot.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(&line.label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                    });
                plot.draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 2, color.filled())),
                )
                .map_err(|e| err(&e))?;
            }
            plot.configure_series_labels()
                .position(match chart.legend_lower_left {
                    true => SeriesLabelPosition::LowerLeft,
                    false => SeriesLabelPosition::UpperRight,
                })
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    atomic::write(path, svg.as_bytes()).map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("coupled-qk-plot-{name}-{}.svg", std::process::id()))
    }

    #[test]
    fn draws_every_line_with_its_label() {
        let path = temp("lines");
        let chart = Chart {
            title: "loss".into(),
            lines: vec![
                Line {
                    label: "train-line".into(),
                    points: vec![(1.0, 3.0), (2.0, 2.5), (3.0, f64::NAN)],
                },
                Line {
                    label: "valid-line".into(),
                    points: vec![(2.0, 2.7)],
                },
            ],
            ..Chart::default()
        };
        write_charts(&path, &[chart.clone(), chart], (300, 200)).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            svg.matches("train-line").count(),
            2,
            "one legend entry a panel"
        );
        assert!(svg.contains("valid-line"));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_chart_without_finite_points_is_still_written() {
        let path = temp("empty");
        let chart = Chart {
            lines: vec![Line {
                label: "diverged".into(),
                points: vec![(1.0, f64::INFINITY)],
            }],
            ..Chart::default()
        };
        write_charts(&path, &[chart], (300, 200)).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().contains("diverged"));
        let _ = std::fs::remove_file(path);
    }
}
