//! Markdown tables of suite results beside the paper's numbers.

use super::{Aggregate, CellResult, mean_std};
use crate::atomic;
use crate::lm::{AttentionDiagnostics, DynamicsRow};
use crate::plot::PlotError;
use std::fmt::Write;
use std::path::Path;

/// The paper's 60M WikiText-103 validation perplexities (mean, std over seeds where given).
pub const PAPER_60M: [(&str, f64, Option<f64>); 4] = [
    ("standard", 24.22, None),
    ("mlp-only", 23.81, Some(0.31)),
    ("euler1", 22.55, Some(0.04)),
    ("leapfrog1", 22.62, Some(0.04)),
];

fn pm((mean, std): (f64, f64), digits: usize) -> String {
    format!("{mean:.digits$} ± {std:.digits$}")
}

/// Change of `value` relative to `base`, in percent.
pub fn change_pct(value: f64, base: f64) -> f64 {
    100.0 * (value - base) / base
}

/// The ablation table: one row per variant of `corpus`, with the change in perplexity relative to
/// `standard` (when it was run) and the paper's 60M WikiText-103 column.
pub fn ablation_table(aggregates: &[Aggregate], corpus: &str) -> String {
    let base = aggregates
        .iter()
        .find(|a| a.corpus == corpus && a.variant == "standard")
        .map(|a| a.ppl.0);
    let mut md = String::from(
        "| variant | seeds | val loss | val ppl | bits/byte | Δ ppl vs standard | extra params | train tokens/s | paper 60M ppl (Δ) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for a in aggregates.iter().filter(|a| a.corpus == corpus) {
        let delta = base.map_or("–".into(), |b| format!("{:+.2}%", change_pct(a.ppl.0, b)));
        let paper = PAPER_60M
            .iter()
            .find(|p| p.0 == a.variant)
            .map_or("–".to_string(), |p| {
                let std = p.2.map_or(String::new(), |s| format!(" ± {s}"));
                format!("{}{std} ({:+.1}%)", p.1, change_pct(p.1, PAPER_60M[0].1))
            });
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {delta} | {} | {:.0} | {paper} |",
            a.variant,
            a.seeds,
            pm(a.loss, 4),
            pm(a.ppl, 3),
            pm(a.bpb, 4),
            a.extra_params,
            a.tokens_per_s
        );
    }
    md
}

/// The paired comparison table: per variant, the mean per-seed difference of validation loss to
/// the baseline with its 95% interval, and on how many seeds the variant was ahead.
pub fn paired_table(paired: &[super::Paired]) -> String {
    let mut md = String::from(
        "| corpus | variant | vs | seeds | Δ val loss (mean) | 95% interval | seeds ahead |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for p in paired {
        let interval = p.ci95.map_or("–".to_string(), |(lo, hi)| {
            format!("[{lo:+.4}, {hi:+.4}]")
        });
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:+.4} | {interval} | {} of {} |",
            p.corpus, p.variant, p.baseline, p.seeds, p.mean_diff, p.ahead, p.seeds
        );
    }
    md
}

/// The seed-spread table: per pair, both standard deviations over the shared seeds, their
/// variance ratio and the F test's two-sided p-value.
pub fn spread_table(tests: &[super::SpreadTest]) -> String {
    let mut md = String::from(
        "| corpus | variant | vs | seeds | std | baseline std | variance ratio | p (F test, two-sided) |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for t in tests {
        let p = t.p.map_or("–".to_string(), |p| format!("{p:.3}"));
        // One seed has no spread: its ratio (0/0) is no number to print.
        let ratio = match t.ratio.is_finite() {
            true => format!("{:.2}", t.ratio),
            false => "–".to_string(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.4} | {:.4} | {ratio} | {p} |",
            t.corpus, t.variant, t.baseline, t.seeds, t.std, t.baseline_std
        );
    }
    md
}

/// What the dynamics did by the end of training: per corpus, variant and layer, the mean over
/// seeds of the learned `dt` (averaged over heads), the relative moves of queries and keys, and
/// the change of attention entropy against the same layer with the dynamics off. Variants whose
/// dynamics move nothing (standard and plain differential attention) have no rows.
pub fn dynamics_table(results: &[CellResult]) -> String {
    let mut md = String::from(
        "| corpus | variant | layer | seeds | dt | ‖q₁ − q₀‖ / ‖q₀‖ | ‖k₁ − k₀‖ / ‖k₀‖ | entropy − standard's (nats) |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let mut groups: Vec<(&str, &str, usize)> = Vec::new();
    // Standard and plain differential attention log rows that move nothing.
    let moves = |row: &DynamicsRow| {
        !row.stats.dt.is_empty() || row.stats.q_change != 0.0 || row.stats.k_change != 0.0
    };
    for r in results.iter().filter(|r| r.dynamics.iter().any(moves)) {
        for row in &r.dynamics {
            let key = (r.corpus.as_str(), r.variant.as_str(), row.layer);
            if !groups.contains(&key) {
                groups.push(key);
            }
        }
    }
    for (corpus, variant, layer) in groups {
        let rows: Vec<_> = results
            .iter()
            .filter(|r| r.corpus == corpus && r.variant == variant)
            .filter_map(|r| r.dynamics.iter().find(|row| row.layer == layer))
            .collect();
        let mean = |f: &dyn Fn(&DynamicsRow) -> Option<f64>| {
            let values: Vec<f64> = rows.iter().filter_map(|r| f(r)).collect();
            (!values.is_empty()).then(|| mean_std(&values).0)
        };
        let show = |v: Option<f64>, sign: bool| match (v, sign) {
            (None, _) => "–".to_string(),
            (Some(v), true) => format!("{v:+.3}"),
            (Some(v), false) => format!("{v:.3}"),
        };
        let _ = writeln!(
            md,
            "| {corpus} | {variant} | {layer} | {} | {} | {} | {} | {} |",
            rows.len(),
            show(mean(&|r| r.dt_mean()), false),
            show(mean(&|r| Some(r.stats.q_change)), false),
            show(mean(&|r| Some(r.stats.k_change)), false),
            show(
                mean(&|r| Some(r.stats.entropy - r.stats.entropy_standard)),
                true
            ),
        );
    }
    md
}

/// The attention diagnostics at the end of training (see `attention.csv`): per corpus, variant
/// and layer, the mean over seeds of the normalised entropy, the distance from uniform, the
/// effective rank and `σ₁ / σ₂` (its geometric mean). Cells without diagnostics (runs made before
/// they were measured) are left out, and `seeds` says how many were averaged.
pub fn attention_table(results: &[CellResult]) -> String {
    let mut md = String::from(
        "| corpus | variant | layer | seeds | entropy / uniform's | distance from uniform | effective rank | σ₁ / σ₂ |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let mut groups: Vec<(&str, &str, usize)> = Vec::new();
    for r in results {
        for row in &r.attention {
            let key = (r.corpus.as_str(), r.variant.as_str(), row.layer);
            if !groups.contains(&key) {
                groups.push(key);
            }
        }
    }
    for (corpus, variant, layer) in groups {
        let rows: Vec<&AttentionDiagnostics> = results
            .iter()
            .filter(|r| r.corpus == corpus && r.variant == variant)
            .filter_map(|r| r.attention.iter().find(|row| row.layer == layer))
            .map(|row| &row.diagnostics)
            .collect();
        let mean = |f: fn(&AttentionDiagnostics) -> f64| {
            rows.iter().map(|d| f(d)).sum::<f64>() / rows.len() as f64
        };
        let _ = writeln!(
            md,
            "| {corpus} | {variant} | {layer} | {} | {:.3} | {:.3} | {:.1} | {:.2} |",
            rows.len(),
            mean(|d| d.normalised_entropy),
            mean(|d| d.distance_from_uniform),
            mean(|d| d.effective_rank),
            mean(|d| d.leading_ratio.ln()).exp(),
        );
    }
    md
}

/// Per-seed results, for the record.
pub fn seed_table(results: &[CellResult]) -> String {
    let mut md = String::from(
        "| corpus | variant | seed | val loss | val ppl | bits/byte | tokens | wall s |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.4} | {:.3} | {:.4} | {} | {:.0} |",
            r.corpus, r.variant, r.seed, r.val_loss, r.val_ppl, r.val_bpb, r.tokens, r.wall_s
        );
    }
    md
}

/// A report that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file or folder could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file or folder.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A plot could not be drawn.
    #[error(transparent)]
    Plot(#[from] PlotError),
}

fn write_error(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a Markdown file atomically.
pub fn write_markdown(path: &Path, text: &str) -> Result<(), ReportError> {
    atomic::write(path, text.as_bytes()).map_err(write_error(path))
}

/// Writes a suite's outputs into `out` and prints its Markdown: `results.md` (`markdown`),
/// `results.json` (every cell, the aggregates over seeds and the program's `summary`), and the
/// validation curves, `curves.svg` for one corpus or `curves-<corpus>.svg` for each of several.
///
/// Failed cells are listed in both files (a Markdown section and a `failed` array).
pub fn write_report(
    out: &Path,
    markdown: &str,
    outcome: &super::SuiteOutcome,
    summary: serde_json::Value,
) -> Result<(), ReportError> {
    let results = &outcome.results;
    let mut markdown = markdown.to_string();
    if !outcome.failed.is_empty() {
        markdown.push_str(
            "\n## Failed cells\n\nNot in the tables above; a suite that retries failed cells \
             (`Suite::retry_failed`) trains them again from scratch.\n\n\
             | corpus | variant | seed | error |\n|---|---|---|---|\n",
        );
        for f in &outcome.failed {
            let error = f.error.replace('|', "\\|").replace('\n', " ");
            markdown.push_str(&format!(
                "| {} | {} | {} | {error} |\n",
                f.corpus, f.variant, f.seed
            ));
        }
    }
    std::fs::create_dir_all(out).map_err(write_error(out))?;
    write_markdown(&out.join("results.md"), &markdown)?;
    let json = serde_json::json!({
        "cells": results,
        "aggregates": super::aggregate(results),
        "failed": outcome.failed,
        "summary": summary,
    });
    let text = serde_json::to_string_pretty(&json).expect("a JSON value serialises");
    let path = out.join("results.json");
    atomic::write(&path, text.as_bytes()).map_err(write_error(&path))?;
    let mut corpora: Vec<&str> = Vec::new();
    for r in results {
        if !corpora.contains(&r.corpus.as_str()) {
            corpora.push(&r.corpus);
        }
    }
    for corpus in &corpora {
        let of_corpus: Vec<CellResult> = results
            .iter()
            .filter(|r| r.corpus == *corpus)
            .cloned()
            .collect();
        let file = match corpora.len() {
            1 => "curves.svg".to_string(),
            _ => format!("curves-{corpus}.svg"),
        };
        super::write_curves_plot(
            &of_corpus,
            &format!("validation loss on {corpus}"),
            &out.join(file),
        )?;
    }
    println!("{markdown}");
    Ok(())
}

/// The command that ran this program, for the reports: `cargo run --release --example
/// <program> -- <its arguments>`.
pub fn command_line(program: &str) -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.is_empty() {
        true => format!("cargo run --release --example {program}"),
        false => format!(
            "cargo run --release --example {program} -- {}",
            args.join(" ")
        ),
    }
}
