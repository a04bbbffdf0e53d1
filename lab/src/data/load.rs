//! A corpus, tokenised: read the text, reuse the token cache when it matches, else tokenise in
//! parallel and cache.

use super::cache::{Stale, TokenCache, fnv1a64};
use super::hub::Hub;
use super::source::{CorpusSource, SplitOptions, read_corpus};
use super::tokenizer::{CHUNK_BYTES, Tokenizer, TokenizerKind, encode_parallel};
use super::{DataError, TokenIds, TokenStream, TokenizedCorpus};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// How to load a corpus.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Document split of JSONL and text corpora.
    pub split: SplitOptions,
    /// Where token caches live.
    pub cache: TokenCache,
    /// Hub access for WikiText.
    pub hub: Hub,
    /// Show progress bars and print what was done.
    pub verbose: bool,
}

impl LoadOptions {
    /// What the example programs use: progress bars and messages, Hub access with its defaults,
    /// the token cache in `cache_dir` (default: [`TokenCache::default_dir`]).
    pub fn for_program(cache_dir: Option<PathBuf>, split: SplitOptions) -> Self {
        LoadOptions {
            split,
            cache: TokenCache::new(cache_dir.unwrap_or_else(TokenCache::default_dir)),
            hub: Hub {
                progress: true,
                ..Hub::default()
            },
            verbose: true,
        }
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            split: SplitOptions::default(),
            cache: TokenCache::new(TokenCache::default_dir()),
            hub: Hub {
                progress: true,
                ..Hub::default()
            },
            verbose: true,
        }
    }
}

/// A loaded corpus and how it was obtained.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The corpus.
    pub corpus: TokenizedCorpus,
    /// Whether the training and validation ids came from the token cache.
    pub from_cache: [bool; 2],
    /// Bytes of text tokenised now (0 when both came from the cache).
    pub tokenised_bytes: usize,
    /// Seconds spent tokenising.
    pub tokenise_seconds: f64,
}

/// Reads `source`, splits it, and tokenises each split with `tokenizer` (or takes the ids from
/// the cache).
pub fn load_corpus(
    source: &CorpusSource,
    tokenizer: TokenizerKind,
    options: &LoadOptions,
) -> Result<Loaded, DataError> {
    let tokenizer = tokenizer.build();
    let text = read_corpus(source, options.split, &options.hub)?;
    // The key tells caches of different sources and splits apart; the hash inside says whether the
    // text is still the same.
    let descriptor = format!("{source:?}|{:?}", options.split);
    let tag = format!("{:08x}", fnv1a64(descriptor.as_bytes()) as u32);
    let name = source.name();
    let byte_lens = Arc::new(tokenizer.byte_lens());
    let mut from_cache = [false; 2];
    let mut tokenised_bytes = 0;
    let mut tokenise_seconds = 0.0;
    let mut streams = Vec::new();
    for (i, (split, text)) in [("train", &text.train), ("valid", &text.valid)]
        .into_iter()
        .enumerate()
    {
        let key = format!("{name}-{split}-{}-{tag}", tokenizer.id());
        let hash = fnv1a64(text.as_bytes());
        let ids = match options
            .cache
            .load(&key, tokenizer.id(), hash, tokenizer.vocab_size())
        {
            Ok(ids) => {
                from_cache[i] = true;
                ids
            }
            Err(stale) => {
                // A corrupt file is news even to a quiet caller; a stale one is expected.
                let corrupt = matches!(stale, Stale::Corrupt(_));
                if corrupt || (options.verbose && stale != Stale::Missing) {
                    eprintln!(
                        "{}token cache {} not used ({stale}); rebuilding",
                        if corrupt { "warning: " } else { "" },
                        options.cache.path(&key).display()
                    );
                }
                let start = Instant::now();
                let ids = tokenise(
                    tokenizer.as_ref(),
                    text,
                    options.verbose,
                    &format!("{name} {split}"),
                );
                tokenise_seconds += start.elapsed().as_secs_f64();
                tokenised_bytes += text.len();
                // Losing the cache costs the next run time, not this run its data.
                if let Err(e) = options.cache.store(&key, tokenizer.id(), hash, &ids) {
                    eprintln!(
                        "warning: {e}; continuing without a token cache (point the cache, COUPLED_QK_CACHE, at a writable folder)"
                    );
                }
                ids
            }
        };
        streams.push(TokenStream {
            ids,
            byte_lens: Arc::clone(&byte_lens),
        });
    }
    let valid = streams.pop().expect("two streams");
    let train = streams.pop().expect("two streams");
    if options.verbose {
        eprintln!(
            "corpus {name}: {} training and {} validation tokens ({}; {})",
            train.len(),
            valid.len(),
            tokenizer.id(),
            if from_cache == [true, true] {
                "from the token cache".to_string()
            } else {
                format!(
                    "tokenised {:.1} MB in {tokenise_seconds:.1} s",
                    tokenised_bytes as f64 / 1e6
                )
            }
        );
    }
    let corpus = TokenizedCorpus {
        name,
        tokenizer: tokenizer.id().into(),
        vocab_size: tokenizer.vocab_size(),
        train,
        valid,
    };
    Ok(Loaded {
        corpus,
        from_cache,
        tokenised_bytes,
        tokenise_seconds,
    })
}

/// Tokenises `text` in parallel, with a progress bar over bytes when `verbose`.
pub fn tokenise(tokenizer: &dyn Tokenizer, text: &str, verbose: bool, what: &str) -> TokenIds {
    let bar = if verbose && text.len() > 4 * CHUNK_BYTES {
        let bar = ProgressBar::new(text.len() as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "tokenising {msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("valid template"),
        );
        bar.set_message(what.to_string());
        bar
    } else {
        ProgressBar::hidden()
    };
    let ids = encode_parallel(tokenizer, text, CHUNK_BYTES, &|n| bar.inc(n as u64));
    bar.finish_and_clear();
    TokenIds::from_u32(ids, tokenizer.vocab_size())
}
