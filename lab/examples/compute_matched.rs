//! Sample efficiency: standard attention trained on k× the tokens of a coupled run. How many tokens
//! (and how much wall-clock) does it need to reach the coupled run's final validation loss? The
//! paper reports about 2.4× the tokens.
//!
//! ```sh
//! cargo run --release --example compute_matched                       # CPU scale, WikiText-2
//! cargo run --release --example compute_matched -- --corpus sotu --factor 3 --seeds 0
//! ```
//!
//! Writes `results.md`, `results.json` and `curves.svg` to `--out`.

use clap::Parser;
use coupled_qk::model::AttentionVariant;
use coupled_qk_lab::experiment::{ExperimentArgs, parse_args};
use coupled_qk_lab::suite::{Budget, command_line, first_reach, seed_table, write_report};
use std::fmt::Write;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    about = "Tokens and wall-clock standard attention needs to match a coupled run's validation loss"
)]
struct Args {
    /// `wikitext-103`, `wikitext-2`, a WikiText folder, a .jsonl or a text file.
    #[arg(long, default_value = "wikitext-2")]
    corpus: String,
    /// A local WikiText folder instead of the Hub.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The coupled variant.
    #[arg(long, default_value = "euler1")]
    coupled: AttentionVariant,
    /// The baseline trained longer.
    #[arg(long, default_value = "standard")]
    baseline: AttentionVariant,
    /// The baseline's budget as a multiple of the coupled run's steps (a real number: `1.25`
    /// matches a coupled step that takes 1.25× the time of the baseline's).
    #[arg(long, default_value_t = 3.0)]
    factor: f64,
    /// Seeds.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    seeds: Vec<u64>,
    /// Output folder.
    #[arg(long, default_value = "runs/compute_matched")]
    out: PathBuf,
    #[command(flatten)]
    budget: Budget,
    #[command(flatten)]
    experiment: ExperimentArgs,
}

/// The last line of a failed download: what runs with no network.
const OFFLINE: &str = "offline, the same comparison runs at CPU scale on the corpus shipped with \
the harness:\n  cargo run --release --example compute_matched -- --corpus shakespeare --seeds 0 \
--devices 2";

fn main() {
    if let Err(e) = run(parse_args::<Args>("compute_matched")) {
        coupled_qk_lab::cli::exit_with(&*e);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if !args.factor.is_finite() || args.factor < 1.0 {
        return Err(format!(
            "--factor {} must be a finite number of at least 1 (the baseline's steps as a multiple \
             of the coupled run's)",
            args.factor
        )
        .into());
    }
    args.budget
        .check(&[args.coupled.clone(), args.baseline.clone()])?;
    let corpus = args
        .budget
        .load(&args.corpus, args.data_dir.as_ref())
        .map_err(|e| match e.is_download() {
            true => format!("{e}\n{OFFLINE}"),
            false => e.to_string(),
        })?;
    let suite = args.budget.suite(&args.out);
    let coupled_label = args.coupled.to_string();
    let baseline_label = format!("{}-x{}", args.baseline, args.factor);
    let mut cells = Vec::new();
    for &seed in &args.seeds {
        let coupled = args
            .budget
            .train_config(corpus.vocab_size, &args.coupled, seed);
        let mut long = args
            .budget
            .train_config(corpus.vocab_size, &args.baseline, seed);
        long.max_steps = (coupled.max_steps as f64 * args.factor).round() as usize;
        long.eval_every = coupled.eval_every;
        long.warmup_steps = coupled.warmup_steps;
        long.checkpoint_every = (long.max_steps / 4).max(1);
        cells.push((&corpus, coupled_label.clone(), coupled));
        cells.push((&corpus, baseline_label.clone(), long));
    }
    let Some(outcome) = args.budget.train(&suite, cells)? else {
        return Ok(());
    };
    let results = &outcome.results;
    let Some(coupled_tokens) = results
        .iter()
        .find(|r| r.variant == coupled_label)
        .map(|r| r.tokens)
    else {
        outcome.check()?;
        return Err("no coupled cell finished".into());
    };
    let mut md = format!(
        "# Compute-matched comparison on {}\n\n`{}` for {} tokens against `{}` for {}× as many. Command: \
         `{}`\n\n\
         | seed | {} final val loss | tokens | wall s | {} reaches it at tokens | wall s | token ratio | wall-clock ratio | {} final val loss | coupled − baseline |\n|---|---|---|---|---|---|---|---|---|---|\n",
        corpus.name,
        args.coupled,
        coupled_tokens,
        args.baseline,
        args.factor,
        command_line("compute_matched"),
        args.coupled,
        args.baseline,
        baseline_label,
    );
    let mut rows = Vec::new();
    for &seed in &args.seeds {
        let find = |label: &str| {
            results
                .iter()
                .find(|r| r.seed == seed && r.variant == label)
        };
        let (Some(c), Some(b)) = (find(&coupled_label), find(&baseline_label)) else {
            continue;
        };
        let reached = first_reach(&b.curve, c.val_loss);
        let (tokens, wall, token_ratio, wall_ratio) = match reached {
            Some((t, w)) => (
                format!("{t:.0}"),
                format!("{w:.0}"),
                format!("{:.2}×", t / c.tokens as f64),
                format!("{:.2}×", w / c.wall_s),
            ),
            None => (
                "not reached".into(),
                "–".into(),
                format!("> {}×", args.factor),
                "–".into(),
            ),
        };
        let _ = writeln!(
            md,
            "| {seed} | {:.4} | {} | {:.0} | {tokens} | {wall} | {token_ratio} | {wall_ratio} | {:.4} | {:+.4} |",
            c.val_loss,
            c.tokens,
            c.wall_s,
            b.val_loss,
            c.val_loss - b.val_loss
        );
        rows.push(serde_json::json!({
            "seed": seed, "coupled_loss": c.val_loss, "coupled_tokens": c.tokens, "coupled_wall_s": c.wall_s,
            "baseline_tokens_to_match": reached.map(|r| r.0), "baseline_wall_s_to_match": reached.map(|r| r.1),
            "baseline_loss": b.val_loss, "baseline_tokens": b.tokens,
        }));
    }
    md.push_str(
        "\nThe paper: standard attention needs about 2.4× the tokens of the coupled model to match it.\n\n\
         Caveat: the baseline runs one warmup-cosine schedule over its whole budget, so where it crosses \
         the coupled run's loss its learning rate has not annealed as a run sized to exactly that many \
         tokens would have. That can move the crossing either way (annealing lowers the loss; a longer \
         high-rate phase can learn faster); compare with a standard run of the coupled run's budget.\n",
    );
    md.push_str(&format!("\n## Per run\n\n{}", seed_table(results)));
    write_report(&args.out, &md, &outcome, serde_json::Value::Array(rows))?;
    Ok(outcome.check()?)
}
