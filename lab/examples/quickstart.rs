//! The first run: standard attention against one Euler step of coupled QK dynamics, trained side by
//! side on tiny-shakespeare (shipped with the harness) at CPU scale, ending with a table and a
//! plot of the validation loss. About five minutes on 2 cores; no network, no GPU, no data files.
//!
//! ```sh
//! cargo run --release --example quickstart
//! cargo run --release --example quickstart -- --max-steps 1500 --seeds 0,1,2   # longer, paired
//! ```
//!
//! The same cells as `ablations --corpus shakespeare --variants standard,euler --steps 1 --seeds 0
//! --max-steps 500 --devices 2`: `tiny` preset (d 128, 4 layers, 4 heads, context 256), byte
//! tokenizer, 16 windows × 256 tokens a step. Writes `results.md`, `results.json` and
//! `curves.svg` to `--out`; finished cells are read back when it is run again.

use clap::Parser;
use coupled_qk::model::Preset;
use coupled_qk_lab::backend::BackendChoice;
use coupled_qk_lab::data::TokenizerKind;
use coupled_qk_lab::suite::{
    Budget, ablation_table, aggregate, command_line, paired_table, paired_to_baselines,
    parse_variants, seed_table, write_report,
};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    about = "Standard attention vs one Euler step of coupled QK on tiny-shakespeare, on the CPU"
)]
struct Args {
    /// Optimiser steps of each run (500 ≈ 2.5 minutes a run on 2 cores).
    #[arg(long, default_value_t = 500)]
    max_steps: usize,
    /// Seeds; more than one adds a paired comparison with its 95% interval.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    seeds: Vec<u64>,
    /// Corpus (`shakespeare` is shipped; any `--corpus` of the other programs works).
    #[arg(long, default_value = "shakespeare")]
    corpus: String,
    /// Output folder.
    #[arg(long, default_value = "runs/quickstart")]
    out: PathBuf,
    /// Data-parallel workers (on the CPU, threads sharing it: 2 is fastest on 2 cores).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    devices: u16,
    /// auto, flex, ndarray, wgpu or cuda.
    #[arg(long, default_value = "auto")]
    backend: BackendChoice,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        coupled_qk_lab::cli::exit_with(&*e);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let budget = Budget {
        preset: Preset::Tiny,
        tokenizer: TokenizerKind::Bytes,
        max_steps: args.max_steps,
        seq_len: None,
        batch_size: 16,
        grad_accum: 1,
        lr: 1e-3,
        warmup: None,
        eval_every: None,
        eval_windows: 64,
        backend: args.backend,
        devices: args.devices,
        cache_dir: None,
        attention_kernel: coupled_qk::AttentionKernel::Flash,
        runs_dir: None,
        retry_failed: false,
        list_cells: false,
        cell: None,
        report_only: false,
    };
    let variants = parse_variants(&["standard".into(), "euler1".into()], &[])?;
    let corpus = budget.load(&args.corpus, None).map_err(|e| e.to_string())?;
    let suite = budget.suite(&args.out);
    let mut cells = Vec::new();
    for seed in &args.seeds {
        for variant in &variants {
            let config = budget.train_config(corpus.vocab_size, variant, *seed);
            cells.push((&corpus, variant.to_string(), config));
        }
    }
    let first = &cells[0].2;
    eprintln!(
        "{} runs on {}: standard and euler1, {} steps × {} tokens each",
        cells.len(),
        corpus.name,
        first.max_steps,
        first.tokens_per_step()
    );
    let header = format!(
        "# Quick start: standard vs Euler 1 step on {}\n\n`tiny` preset, bytes, {} steps × {} \
         tokens, seeds {:?}. Command: `{}`\n\n",
        corpus.name,
        first.max_steps,
        first.tokens_per_step(),
        args.seeds,
        command_line("quickstart")
    );
    let Some(outcome) = budget.train(&suite, cells)? else {
        return Ok(());
    };
    let results = &outcome.results;
    let paired = paired_to_baselines(results);
    let md = format!(
        "{header}{}\nΔ is relative to standard; the paper's column is its 60M model on \
         WikiText-103, far larger than this run: compare directions, not values.\n\n\
         ## Paired differences\n\nEuler's validation loss minus standard's on the same seed \
         (an interval needs two seeds or more).\n\n{}\n## Per seed\n\n{}",
        ablation_table(&aggregate(results), &corpus.name),
        paired_table(&paired),
        seed_table(results)
    );
    write_report(
        &args.out,
        &md,
        &outcome,
        serde_json::json!({ "corpus": corpus.name, "paired": paired }),
    )?;
    outcome.check()?;
    println!(
        "plot of the validation loss: {}",
        args.out.join("curves.svg").display()
    );
    Ok(())
}
