//! Tokenises a corpus once and stores its token cache, reporting counts and speed, so that training
//! runs start at once (WikiText-103 under GPT-2 takes minutes).
//!
//! ```sh
//! cargo run --release --example prepare_data -- --corpus wikitext-103 --tokenizer gpt2
//! cargo run --release --example prepare_data -- --corpus sotu --tokenizer gpt2 --no-cache
//! ```

use clap::Parser;
use coupled_qk_lab::data::{
    CorpusSource, LoadOptions, SplitOptions, TokenCache, TokenizerKind, load_corpus,
};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(about = "Tokenise a corpus into the token cache and report token counts and speed")]
struct Args {
    /// `wikitext-103`, `wikitext-2`, a WikiText folder, a .jsonl file or a text file.
    #[arg(long, default_value = "wikitext-103")]
    corpus: String,
    /// A local folder with wiki.{train,valid}.{raw,tokens}, used instead of the Hub.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// `gpt2` or `bytes`.
    #[arg(long, default_value = "gpt2")]
    tokenizer: String,
    /// Token cache folder (default: $COUPLED_QK_CACHE or ~/.cache/coupled-qk).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Tokenise into a fresh temporary cache (to measure speed).
    #[arg(long)]
    no_cache: bool,
    /// Fraction of documents held out for validation (JSONL and text corpora).
    #[arg(long, default_value_t = 0.1)]
    valid_fraction: f64,
    /// Seed of the document split.
    #[arg(long, default_value_t = 0)]
    split_seed: u64,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        coupled_qk_lab::cli::exit_with(&*e);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let source = args
        .corpus
        .parse::<CorpusSource>()?
        .with_data_dir(args.data_dir.clone())?;
    let tokenizer: TokenizerKind = args.tokenizer.parse()?;
    let scratch = std::env::temp_dir().join(format!("coupled-qk-prepare-{}", std::process::id()));
    let cache_dir = if args.no_cache {
        scratch.clone()
    } else {
        args.cache_dir.unwrap_or_else(TokenCache::default_dir)
    };
    let split = SplitOptions {
        valid_fraction: args.valid_fraction,
        seed: args.split_seed,
    };
    let options = LoadOptions::for_program(Some(cache_dir.clone()), split);
    let loaded = load_corpus(&source, tokenizer, &options)?;
    let corpus = &loaded.corpus;
    let bytes = corpus.train.total_bytes() + corpus.valid.total_bytes();
    println!("corpus      {}", corpus.name);
    println!(
        "tokenizer   {} ({} ids)",
        corpus.tokenizer, corpus.vocab_size
    );
    println!(
        "train       {} tokens, {} bytes",
        corpus.train.len(),
        corpus.train.total_bytes()
    );
    println!(
        "valid       {} tokens, {} bytes",
        corpus.valid.len(),
        corpus.valid.total_bytes()
    );
    println!(
        "bytes/token {:.3}",
        bytes as f64 / (corpus.train.len() + corpus.valid.len()) as f64
    );
    if loaded.tokenised_bytes > 0 {
        println!(
            "tokenised   {:.2} MB in {:.2} s: {:.2} MB/s on {} threads",
            loaded.tokenised_bytes as f64 / 1e6,
            loaded.tokenise_seconds,
            loaded.tokenised_bytes as f64 / 1e6 / loaded.tokenise_seconds,
            rayon::current_num_threads()
        );
    } else {
        println!(
            "tokenised   nothing: both splits came from the token cache in {}",
            cache_dir.display()
        );
    }
    if args.no_cache {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    Ok(())
}
