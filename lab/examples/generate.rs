//! Generates text with a trained model: a run folder (its `config.json`, its tokenizer and its
//! newest checkpoint) or a GPT-2 checkpoint (a folder, or a Hub model id). Continues `--prompt`,
//! prints the text as it is generated, and reports tokens per second with the cache and, for
//! comparison, without it. `--export FILE` also writes the model's weights as safetensors.
//!
//! ```sh
//! cargo run --release --example wikitext_60m -- --preset tiny --tokenizer bytes \
//!     --corpus shakespeare --max-steps 300 --out runs/tiny-shakespeare
//! cargo run --release --example generate -- --run runs/tiny-shakespeare --prompt "ROMEO:"
//! cargo run --release --example generate -- --gpt2 openai-community/gpt2 --prompt "The"
//! ```

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use clap::Parser;
use coupled_qk::model::{Gpt, SamplerConfig};
use coupled_qk_lab::data::{Hub, TokenizerKind};
use coupled_qk_lab::lm::load_trained;
use coupled_qk_lab::pretrained::Gpt2Checkpoint;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Generate text with a model trained by this harness")]
struct Args {
    /// A run folder written by wikitext_60m, retrofit or a suite.
    #[arg(long, required_unless_present = "gpt2", conflicts_with = "gpt2")]
    run: Option<PathBuf>,
    /// A GPT-2 checkpoint instead: a folder with model.safetensors and config.json, or a Hub
    /// model id (e.g. openai-community/gpt2).
    #[arg(long)]
    gpt2: Option<String>,
    /// The tokenizer of a --gpt2 checkpoint: gpt2 or bytes.
    #[arg(long, default_value = "gpt2")]
    tokenizer: TokenizerKind,
    /// Also write the model's weights to this file as safetensors (the crate's names; load with
    /// `Gpt::load_safetensors`).
    #[arg(long)]
    export: Option<PathBuf>,
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
        coupled_qk_lab::cli::exit_with(&*e);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = Default::default();
    let (model, tokenizer) = match (&args.run, &args.gpt2) {
        (Some(run), _) => {
            let (model, config, step) = load_trained::<Flex>(run, &device)?;
            eprintln!(
                "{} attention, step {step} of {}",
                config.train.model.attention, config.train.max_steps,
            );
            (model, config.corpus.tokenizer.parse::<TokenizerKind>()?)
        }
        (None, Some(from)) => {
            let hub = Hub {
                progress: true,
                ..Hub::default()
            };
            let checkpoint = Gpt2Checkpoint::locate(from, &hub)?;
            let model = checkpoint
                .config
                .init::<Flex>(&device)
                .load_gpt2_safetensors(&checkpoint.weights)?;
            eprintln!("GPT-2 from {}", checkpoint.weights.display());
            (model, args.tokenizer)
        }
        (None, None) => unreachable!("clap requires --run or --gpt2"),
    };
    let tokenizer = tokenizer.build();
    if tokenizer.vocab_size() > model.tokens.weight.dims()[0] {
        return Err(format!(
            "the {} tokenizer has {} ids but the model only {}: pass --tokenizer bytes or gpt2 to match",
            tokenizer.id(),
            tokenizer.vocab_size(),
            model.tokens.weight.dims()[0]
        )
        .into());
    }
    eprintln!(
        "{} parameters, {} tokenizer",
        burn::module::Module::num_params(&model),
        tokenizer.id()
    );
    if let Some(path) = &args.export {
        model.save_safetensors(path)?;
        eprintln!("wrote {}", path.display());
    }
    let prompt = tokenizer.encode(&args.prompt);
    // Decoding stops when the context is full: the prompt and every new token but the last fill it.
    let room = (model.context + 1).saturating_sub(prompt.len());
    if args.max_new_tokens > room {
        eprintln!(
            "note: --max-new-tokens {}: after the {}-token prompt the model's context of {} has room \
             for {room} more; generation stops there",
            args.max_new_tokens,
            prompt.len(),
            model.context
        );
    }
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
