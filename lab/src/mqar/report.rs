//! The sweep's human-readable outputs: a Markdown table and an SVG plot.

use super::sweep::{RunResult, SweepResults};
use crate::atomic;
use crate::plot::{Chart, Line, PlotError, write_charts};
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
pub fn write_plot(results: &SweepResults, path: &Path) -> Result<(), PlotError> {
    let s = &results.sweep;
    let names = variant_names(results);
    let ticks: Vec<String> = s
        .tasks
        .iter()
        .map(|t| format!("L{} D{}", t.0, t.1))
        .collect();
    let charts: Vec<Chart> = s
        .d_models
        .iter()
        .map(|&d_model| Chart {
            title: format!("MQAR, d_model {d_model}"),
            x_desc: String::new(),
            y_desc: "test accuracy (mean over seeds)".into(),
            lines: names
                .iter()
                .map(|name| Line {
                    label: name.clone(),
                    points: s
                        .tasks
                        .iter()
                        .enumerate()
                        .filter_map(|(i, &t)| {
                            mean_accuracy(&per_seed(results, name, t, d_model))
                                .map(|a| (i as f64, a))
                        })
                        .collect(),
                })
                .collect(),
            y_range: Some(0.0..1.02),
            x_ticks: Some(ticks.clone()),
            legend_lower_left: true,
        })
        .collect();
    write_charts(path, &charts, (480, 360))
}
