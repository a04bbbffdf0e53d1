//! The paper's structural ablation: standard, MLP-only, Euler, Leapfrog, the affine coupling and
//! differential attention (plain and composed with Euler or affine coupling),
//! integrator steps 1/3/5/7, over seeds; mean ± std of validation loss, perplexity and bits per
//! byte beside the paper's 60M WikiText-103 column.
//!
//! ```sh
//! cargo run --release --example ablations                                   # CPU scale, WikiText-2
//! cargo run --release --example ablations -- --corpus shakespeare --steps 1 --seeds 0,1   # offline
//! cargo run --release --features cuda --example ablations -- --preset 60m --tokenizer gpt2 \
//!     --corpus wikitext-103 --max-steps 20000 --batch-size 32 --lr 6e-4 --eval-windows 0
//! ```
//!
//! Writes `results.md`, `results.json` and `curves.svg` to `--out`; finished runs are skipped
//! when the program is run again, interrupted ones resume.

use clap::Parser;
use coupled_qk_lab::experiment::{ExperimentArgs, parse_args};
use coupled_qk_lab::suite::{
    Budget, ablation_table, aggregate, attention_table, command_line, dynamics_table, paired_table,
    paired_to_baselines, parse_variants, seed_table, spread_table, spread_tests, write_report,
};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    about = "Structural ablation of coupled QK attention over variants, integrator steps and seeds"
)]
struct Args {
    /// `wikitext-103`, `wikitext-2`, `shakespeare` (shipped), `sotu` or `brown` (docs/data.md),
    /// a WikiText folder, a .jsonl or a text file.
    #[arg(long, default_value = "wikitext-2")]
    corpus: String,
    /// A local WikiText folder (wiki.{train,valid}.raw) instead of the Hub.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Variants: standard, mlp-only, euler, leapfrog, affine, diff, and diff+ any of the others
    /// (differential attention with those dynamics); euler3 etc. name a step count.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "standard,mlp-only,euler,leapfrog,affine,diff,diff+euler,diff+affine"
    )]
    variants: Vec<String>,
    /// Integrator steps of euler and leapfrog, each a variant of its own.
    #[arg(long, value_delimiter = ',', default_value = "1,3,5,7")]
    steps: Vec<usize>,
    /// Seeds.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
    seeds: Vec<u64>,
    /// Output folder.
    #[arg(long, default_value = "runs/ablations")]
    out: PathBuf,
    #[command(flatten)]
    budget: Budget,
    #[command(flatten)]
    experiment: ExperimentArgs,
}

/// The last line of a failed download: what runs with no network.
const OFFLINE: &str = "offline, the same ablation runs at CPU scale on the corpus shipped with \
the harness:\n  cargo run --release --example ablations -- --corpus shakespeare --variants \
standard,euler --steps 1 --seeds 0 --max-steps 500 --devices 2";

fn main() {
    if let Err(e) = run(parse_args::<Args>("ablations")) {
        coupled_qk_lab::cli::exit_with(&*e);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let variants = parse_variants(&args.variants, &args.steps)?;
    args.budget.check(&variants)?;
    let corpus = args
        .budget
        .load(&args.corpus, args.data_dir.as_ref())
        .map_err(|e| match e.is_download() {
            true => format!("{e}\n{OFFLINE}"),
            false => e.to_string(),
        })?;
    let suite = args.budget.suite(&args.out);
    let mut cells = Vec::new();
    for seed in &args.seeds {
        for variant in &variants {
            let config = args.budget.train_config(corpus.vocab_size, variant, *seed);
            cells.push((&corpus, variant.to_string(), config));
        }
    }
    let first = &cells[0].2;
    let header = format!(
        "# Ablations on {}\n\nPreset `{:?}`, tokenizer `{}`, {} steps × {} tokens, seeds {:?}. Command: `{}`\n\n",
        corpus.name,
        args.budget.preset,
        corpus.tokenizer,
        first.max_steps,
        first.tokens_per_step(),
        args.seeds,
        command_line("ablations")
    );
    eprintln!(
        "{} runs: {} variants × {} seeds",
        cells.len(),
        variants.len(),
        args.seeds.len()
    );
    let Some(outcome) = args.budget.train(&suite, cells)? else {
        return Ok(());
    };
    let results = &outcome.results;
    let aggregates = aggregate(results);
    let paired_all = paired_to_baselines(results);
    let spreads = spread_tests(results, &paired_all);
    let md = format!(
        "{header}{}\nThe paper's column is its 60M model on WikiText-103 (validation perplexity, std over seeds); \
         Δ is relative to standard. Runs here are far smaller: compare directions and spreads, not values.\n\n\
         ## Paired differences\n\nEach variant's validation loss minus the baseline's on the same seed (same \
         initialisation of the shared parts, same data order), averaged over seeds, with Student's t 95% \
         interval: an interval that excludes 0 is a difference the seeds resolve. Coupled differential \
         attention (`diff+…`) is paired with plain `diff` too, each affine coupling with its \
         uncoupled control when both ran, and MLP-only and leapfrog with Euler (the paper's structural \
         ablation).\n\n{}\n\
         ## Seed spreads\n\nEach variant's standard deviation over the shared seeds against the \
         baseline's, and the F test of their ratio (two-sided; a p below 0.05 is a spread the seeds \
         resolve).\n\n{}\n\
         ## Dynamics at the end of training\n\nFrom each run's last evaluation (`dynamics.csv`, on one \
         validation batch), mean over seeds.\n\n{}\n\
         ## Attention at the end of training\n\nThe attention diagnostics of each run's last evaluation \
         (`attention.csv`: the first 128 positions of 4 validation windows, over heads), mean over \
         seeds: how close attention is to uniform and to rank one.\n\n{}\n## Per seed\n\n{}",
        ablation_table(&aggregates, &corpus.name),
        paired_table(&paired_all),
        spread_table(&spreads),
        dynamics_table(results),
        attention_table(results),
        seed_table(results)
    );
    write_report(
        &args.out,
        &md,
        &outcome,
        serde_json::json!({ "corpus": corpus.name, "paired": paired_all, "spreads": spreads }),
    )?;
    Ok(outcome.check()?)
}
