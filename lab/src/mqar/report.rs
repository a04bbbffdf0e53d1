//! The sweep's human-readable outputs: a Markdown table and an SVG plot.

use super::sweep::{RunResult, SweepResults};
use crate::atomic;
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;

/// The best run (highest accuracy, then fewest steps) over learning rates, per cell and seed.
fn best<'a>(
    results: &'a SweepResults,
    variant: &str,
    task: (usize, usize),
    d_model: usize,
    seed: u64,
) -> Option<&'a RunResult> {
    results
        .runs
        .iter()
        .filter(|r| {
            r.key.variant.to_string() == variant
                && (r.key.seq_len, r.key.kv_pairs) == task
                && r.key.d_model == d_model
                && r.key.seed == seed
        })
        .max_by(|a, b| {
            (a.outcome.accuracy, -(a.outcome.steps as f64))
                .partial_cmp(&(b.outcome.accuracy, -(b.outcome.steps as f64)))
                .unwrap()
        })
}

/// The per-seed best runs of a cell.
fn per_seed<'a>(
    results: &'a SweepResults,
    variant: &str,
    task: (usize, usize),
    d_model: usize,
) -> Vec<&'a RunResult> {
    results
        .sweep
        .seeds
        .iter()
        .filter_map(|&seed| best(results, variant, task, d_model, seed))
        .collect()
}

/// Mean best accuracy over the seeds that ran.
fn mean_accuracy(runs: &[&RunResult]) -> Option<f64> {
    (!runs.is_empty())
        .then(|| runs.iter().map(|r| r.outcome.accuracy).sum::<f64>() / runs.len() as f64)
}

fn variant_names(results: &SweepResults) -> Vec<String> {
    results
        .sweep
        .variants
        .iter()
        .map(|v| v.to_string())
        .collect()
}

/// `results.md`: test accuracy per cell (best learning rate), with the steps it took to reach
/// 0.99 where it did.
pub fn write_markdown(results: &SweepResults, path: &Path, header: &str) -> std::io::Result<()> {
    let s = &results.sweep;
    let names = variant_names(results);
    let mut md = String::new();
    writeln!(md, "{header}\n").unwrap();
    writeln!(
        md,
        "Vocabulary {}, {} layers, {} head(s), {}, batch {}, {} training / {} test examples, \
         at most {} steps, learning rates {:?}, weight decay 0.1, seeds {:?}. Each cell: per \
         seed, the best test accuracy over learning rates (mean over query positions) with the \
         steps to reach 0.99 in brackets (— if never); then the mean over seeds and how many \
         seeds reached 0.99.\n",
        s.vocab,
        s.n_layers,
        s.n_heads,
        if s.mlp {
            "with MLP"
        } else {
            "attention only (no MLP)"
        },
        s.batch_size,
        s.train_examples,
        s.test_examples,
        s.steps,
        s.lrs,
        s.seeds
    )
    .unwrap();
    for &d_model in &s.d_models {
        writeln!(md, "### d_model = {d_model}\n").unwrap();
        writeln!(md, "| seq_len | kv_pairs | {} |", names.join(" | ")).unwrap();
        writeln!(md, "|---|---|{}", "---|".repeat(names.len())).unwrap();
        for &task in &s.tasks {
            let cells: Vec<String> = names
                .iter()
                .map(|v| {
                    let runs = per_seed(results, v, task, d_model);
                    let Some(mean) = mean_accuracy(&runs) else {
                        return "not run".to_string();
                    };
                    let each: Vec<String> = runs
                        .iter()
                        .map(|r| {
                            let steps =
                                r.outcome.steps_to_99.map_or("—".into(), |n| n.to_string());
                            format!("{:.3} ({steps})", r.outcome.accuracy)
                        })
                        .collect();
                    let solved = runs
                        .iter()
                        .filter(|r| r.outcome.steps_to_99.is_some())
                        .count();
                    format!(
                        "{}; mean {mean:.3}, {solved}/{} ≥ 0.99",
                        each.join(", "),
                        runs.len()
                    )
                })
                .collect();
            writeln!(md, "| {} | {} | {} |", task.0, task.1, cells.join(" | ")).unwrap();
        }
        writeln!(md).unwrap();
    }
    atomic::write(path, md.as_bytes())
}

/// `accuracy.svg`: mean (over seeds) best accuracy per task (easy to hard) for each variant, one
/// panel per width.
pub fn write_plot(results: &SweepResults, path: &Path) -> Result<(), String> {
    let s = &results.sweep;
    let names = variant_names(results);
    let width = 480 * s.d_models.len() as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width.max(480), 360)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let panels = root.split_evenly((1, s.d_models.len()));
        for (panel, &d_model) in panels.iter().zip(&s.d_models) {
            let n = s.tasks.len();
            let mut chart = ChartBuilder::on(panel)
                .caption(format!("MQAR, d_model {d_model}"), ("sans-serif", 18))
                .margin(10)
                .x_label_area_size(40)
                .y_label_area_size(45)
                .build_cartesian_2d(-0.2f64..(n as f64 - 0.8), 0f64..1.02)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_labels(n)
                .x_label_formatter(&|x| {
                    let i = x.round() as usize;
                    if (x - i as f64).abs() < 1e-6 && i < n {
                        format!("L{} D{}", s.tasks[i].0, s.tasks[i].1)
                    } else {
                        String::new()
                    }
                })
                .y_desc("test accuracy (mean over seeds)")
                .draw()
                .map_err(|e| e.to_string())?;
            for (c, name) in names.iter().enumerate() {
                let color = Palette99::pick(c).to_rgba();
                let points: Vec<(f64, f64)> = s
                    .tasks
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &t)| {
                        mean_accuracy(&per_seed(results, name, t, d_model)).map(|a| (i as f64, a))
                    })
                    .collect();
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                    .map_err(|e| e.to_string())?
                    .label(*name)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(
                        points
                            .into_iter()
                            .map(|p| Circle::new(p, 3, color.filled())),
                    )
                    .map_err(|e| e.to_string())?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    atomic::write(path, svg.as_bytes()).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
