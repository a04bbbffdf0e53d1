//! Does the gain depend on the corpus? The paper: coupled QK helps on coherent text (WikiText
//! −6.6%, PubMed −4.5% perplexity) and hurts on heterogeneous web text (OpenWebText +10.3%). Here:
//! coherent corpora (WikiText when reachable, State of the Union, tiny-shakespeare) against a
//! heterogeneous one (the Brown corpus, 15 genres). tiny-shakespeare is shipped with the harness;
//! State of the Union and Brown are fetched once (docs/data.md), WikiText-2 downloaded.
//!
//! ```sh
//! cargo run --release --example corpus_sensitivity
//! cargo run --release --example corpus_sensitivity -- --corpora brown,sotu --seeds 0
//! ```
//!
//! Writes `results.md`, `results.json` and one `curves-<corpus>.svg` per corpus to `--out`.

use clap::Parser;
use coupled_qk_lab::experiment::{ExperimentArgs, parse_args};
use coupled_qk_lab::suite::{
    Budget, aggregate, change_pct, command_line, paired, paired_table, parse_variants, seed_table,
    write_report,
};
use std::fmt::Write;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    about = "Change in perplexity from coupled QK attention on coherent and heterogeneous corpora"
)]
struct Args {
    /// Corpora (data-pipeline syntax). Default: wikitext-2, sotu, shakespeare and brown, each
    /// skipped with a note when it cannot be loaded (docs/data.md says how to get them).
    #[arg(long, value_delimiter = ',')]
    corpora: Option<Vec<String>>,
    /// Variants; the first is the baseline the change is measured against.
    #[arg(long, value_delimiter = ',', default_value = "standard,euler")]
    variants: Vec<String>,
    /// Seeds.
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    seeds: Vec<u64>,
    /// Output folder.
    #[arg(long, default_value = "runs/corpus_sensitivity")]
    out: PathBuf,
    #[command(flatten)]
    budget: Budget,
    #[command(flatten)]
    experiment: ExperimentArgs,
}

/// The paper's changes in perplexity of coupled QK over standard attention.
const PAPER: [(&str, &str, f64); 3] = [
    ("WikiText-103", "coherent", -6.6),
    ("PubMed", "coherent", -4.5),
    ("OpenWebText", "heterogeneous", 10.3),
];

fn main() {
    if let Err(e) = run(parse_args::<Args>("corpus_sensitivity")) {
        coupled_qk_lab::cli::exit_with(&*e);
    }
}

fn default_corpora() -> Vec<String> {
    ["wikitext-2", "sotu", "shakespeare", "brown"]
        .map(String::from)
        .to_vec()
}

fn kind(name: &str) -> &'static str {
    if name.contains("brown") {
        "heterogeneous (15 genres)"
    } else {
        "coherent"
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let variants = parse_variants(&args.variants, &[])?;
    args.budget.check(&variants)?;
    let requested = args.corpora.clone().unwrap_or_else(default_corpora);
    let mut corpora = Vec::new();
    for name in &requested {
        match args.budget.load(name, None) {
            Ok(corpus) => corpora.push(corpus),
            Err(e) if args.corpora.is_none() => eprintln!("note: skipping {name}: {e}"),
            Err(e) => return Err(e.into()),
        }
    }
    if corpora.is_empty() {
        return Err("no corpus could be loaded; pass --corpora".into());
    }
    let suite = args.budget.suite(&args.out);
    let mut cells = Vec::new();
    for corpus in &corpora {
        for seed in &args.seeds {
            for variant in &variants {
                cells.push((
                    corpus,
                    variant.to_string(),
                    args.budget.train_config(corpus.vocab_size, variant, *seed),
                ));
            }
        }
    }
    let first = &cells[0].2;
    let mut md = format!(
        "# Corpus sensitivity\n\nPreset `{:?}`, tokenizer `{}`, {} steps × {} tokens per corpus, seeds {:?}. Command: \
         `{}`\n\n",
        args.budget.preset,
        args.budget.tokenizer.build().id(),
        first.max_steps,
        first.tokens_per_step(),
        args.seeds,
        command_line("corpus_sensitivity")
    );
    eprintln!(
        "{} runs: {} corpora × {} variants × {} seeds",
        cells.len(),
        corpora.len(),
        variants.len(),
        args.seeds.len()
    );
    let Some(outcome) = args.budget.train(&suite, cells)? else {
        return Ok(());
    };
    let results = &outcome.results;
    let aggregates = aggregate(results);
    let baseline = &variants[0].to_string();
    let mut columns = vec!["corpus".to_string(), "kind".to_string()];
    columns.extend(variants.iter().map(|v| format!("{v} ppl")));
    columns.extend(variants[1..].iter().map(|v| format!("Δ {v} vs {baseline}")));
    let _ = writeln!(
        md,
        "| {} |\n|{}",
        columns.join(" | "),
        "---|".repeat(columns.len())
    );
    let mut summary = Vec::new();
    for corpus in &corpora {
        let get = |label: &str| {
            aggregates
                .iter()
                .find(|a| a.corpus == corpus.name && a.variant == label)
        };
        let base = get(baseline).map(|a| a.ppl.0);
        let mut row = format!("| {} | {} |", corpus.name, kind(&corpus.name));
        for v in &variants {
            let cell = get(&v.to_string()).map_or("–".into(), |a| {
                format!(" {:.3} ± {:.3} |", a.ppl.0, a.ppl.1)
            });
            row.push_str(&cell);
        }
        for v in &variants[1..] {
            let delta = match (get(&v.to_string()), base) {
                (Some(a), Some(b)) => {
                    let d = change_pct(a.ppl.0, b);
                    summary.push(serde_json::json!({ "corpus": corpus.name, "variant": v.to_string(), "change_pct": d }));
                    format!(" {d:+.2}% |")
                }
                _ => " – |".into(),
            };
            row.push_str(&delta);
        }
        let _ = writeln!(md, "{row}");
    }
    md.push_str("\nThe paper (60M, change in perplexity of coupled QK vs standard):\n\n| corpus | kind | Δ ppl |\n|---|---|---|\n");
    for (corpus, kind, delta) in PAPER {
        let _ = writeln!(md, "| {corpus} | {kind} | {delta:+.1}% |");
    }
    md.push_str(&format!(
        "\n## Paired with {baseline}\n\nPer corpus, each variant's validation loss minus {baseline}'s on the \
         same seed, averaged over seeds, with Student's t 95% interval.\n\n{}",
        paired_table(&paired(results, baseline))
    ));
    md.push_str(&format!("\n## Per seed\n\n{}", seed_table(results)));
    write_report(&args.out, &md, &outcome, serde_json::Value::Array(summary))?;
    Ok(outcome.check()?)
}
