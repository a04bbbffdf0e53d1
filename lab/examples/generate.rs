//! Generates text with a trained model: loads a run folder (its `config.json`, its tokenizer and
//! its newest checkpoint), continues `--prompt`, prints the text as it is generated, and reports
//! tokens per second with the cache and, for comparison, without it.
//!
//! ```sh
//! cargo run --release --example wikitext_60m -- --preset tiny --tokenizer bytes \
//!     --corpus ../shared/data/tinyshakespeare/input.txt --max-steps 300 --out runs/tiny-shakespeare
//! cargo run --release --example generate -- --run runs/tiny-shakespeare --prompt "ROMEO:"
//! ```

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use clap::Parser;
use coupled_qk::model::{Gpt, SamplerConfig};
use coupled_qk_lab::data::TokenizerKind;
use coupled_qk_lab::lm::load_trained;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Generate text with a model trained by this harness")]
struct Args {
    /// A run folder written by wikitext_60m (or a suite cell).
    #[arg(long)]
    run: PathBuf,
    /// The text to continue.
    #[arg(long, default_value = "\n")]
    prompt: String,
    /// New tokens at most.
    #[arg(long, default_value_t = 200)]
    max_new_tokens: usize,
    /// Softmax temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Sample among the k most likely tokens only.
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample among the most likely tokens that make up this probability (nucleus).
    #[arg(long)]
    top_p: Option<f64>,
    /// The sampler's seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Skip the timing of generation without the cache.
    #[arg(long)]
    no_compare: bool,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = Default::default();
    let (model, config, step) = load_trained::<Flex>(&args.run, &device)?;
    let tokenizer = config.corpus.tokenizer.parse::<TokenizerKind>()?.build();
    eprintln!(
        "{} attention, {} parameters, step {step} of {} ({} tokenizer)",
        config.train.model.attention,
        burn::module::Module::num_params(&model),
        config.train.max_steps,
        tokenizer.id()
    );
    let prompt = tokenizer.encode(&args.prompt);
    let sampler = SamplerConfig::new()
        .with_max_new_tokens(args.max_new_tokens)
        .with_temperature(args.temperature)
        .with_top_k(args.top_k)
        .with_top_p(args.top_p)
        .with_seed(args.seed);

    print!("{}", args.prompt);
    let mut pending: Vec<u8> = Vec::new();
    let started = Instant::now();
    let out = model.generate(&prompt, &sampler, |token| {
        // A GPT-2 token may end in the middle of a character: print whole characters only.
        pending.extend(tokenizer.decode_bytes(&[token]));
        let valid = match std::str::from_utf8(&pending) {
            Ok(text) => text.len(),
            Err(e) => e.valid_up_to(),
        };
        print!("{}", String::from_utf8_lossy(&pending[..valid]));
        let _ = std::io::stdout().flush();
        pending.drain(..valid);
    })?;
    let cached = started.elapsed().as_secs_f64();
    println!("{}", String::from_utf8_lossy(&pending));
    eprintln!(
        "\n{} tokens in {cached:.2} s with the cache: {:.1} tokens/s",
        out.len(),
        out.len() as f64 / cached
    );
    if !args.no_compare && !out.is_empty() {
        let uncached = without_cache(&model, &prompt, out.len());
        eprintln!(
            "{} tokens in {uncached:.2} s without it (the whole sequence each step, greedy): {:.1} \
             tokens/s",
            out.len(),
            out.len() as f64 / uncached
        );
    }
    Ok(())
}

/// Seconds to generate `n` tokens greedily by running the whole sequence through the model for
/// each one: what decoding costs without a cache.
fn without_cache(model: &Gpt<Flex>, prompt: &[u32], n: usize) -> f64 {
    let device = Default::default();
    let mut ids: Vec<i64> = prompt.iter().map(|&t| t as i64).collect();
    let started = Instant::now();
    for _ in 0..n {
        if ids.len() > model.context {
            break;
        }
        let len = ids.len();
        let input =
            Tensor::<Flex, 2, Int>::from_data(TensorData::new(ids.clone(), [1, len]), &device);
        let logits = model.forward(input).slice([0..1, len - 1..len]);
        let next = logits.argmax(2).into_scalar();
        ids.push(burn::tensor::ElementConversion::elem::<i64>(next));
    }
    started.elapsed().as_secs_f64()
}
