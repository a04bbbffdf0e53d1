//! Retrofits coupled QK dynamics into a pretrained GPT-2 and fine-tunes it. Every layer of the
//! checkpoint becomes the chosen variant (Euler or leapfrog with `dt = 0` by default, or the
//! affine coupling, whose nets start at zero), where it computes exactly what GPT-2 does;
//! fine-tuning then learns `dt` and the coupling net with the rest. `--attention standard`
//! fine-tunes the same model unchanged: the baseline.
//!
//! ```sh
//! # GPT-2 small from the Hugging Face Hub, on a GPU:
//! cargo run --release --features cuda --example retrofit -- --from openai-community/gpt2 \
//!     --attention euler --corpus wikitext-103
//! # a local checkpoint (a folder with model.safetensors and config.json), bytes as tokens:
//! cargo run --release --example retrofit -- --from tests/fixtures/gpt2-tiny --tokenizer bytes \
//!     --corpus shakespeare --max-steps 50
//! ```
//!
//! Writes the usual run folder (config.json, which records the starting weights, metrics.csv,
//! summary.json, checkpoints/); `--resume` continues it.

use clap::Parser;
use coupled_qk::model::AttentionVariant;
use coupled_qk::{DynamicsConfig, StepSizeConfig};
use coupled_qk_lab::backend::{BackendChoice, dispatch_devices};
use coupled_qk_lab::data::{
    CorpusSource, Hub, LoadOptions, SplitOptions, TokenizerKind, load_corpus,
};
use coupled_qk_lab::lm::{InitWeights, RunOptions, TrainConfig, TrainingRun};
use coupled_qk_lab::pretrained::Gpt2Checkpoint;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(about = "Retrofit coupled QK attention into a pretrained GPT-2 and fine-tune it")]
struct Args {
    /// The checkpoint: a folder with model.safetensors and config.json, a .safetensors file with
    /// config.json beside it, or a Hub model id (e.g. openai-community/gpt2).
    #[arg(long)]
    from: String,
    /// The attention every layer gets: standard (the baseline), euler, leapfrog or affine (with
    /// step or layer counts: euler3, affine2).
    #[arg(long, default_value = "euler")]
    attention: AttentionVariant,
    /// The initial dt of coupled variants: 0 starts exactly at the pretrained model.
    #[arg(long, default_value_t = 0.0)]
    dt: f64,
    /// `wikitext-103`, `wikitext-2`, a WikiText folder, a .jsonl file or a text file.
    #[arg(long, default_value = "wikitext-103")]
    corpus: String,
    /// A folder with wiki.{train,valid}.{raw,tokens}: WikiText from disk instead of the Hub.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// gpt2 (GPT-2's own, 50257 ids) or bytes (256 ids: for checkpoints with that vocabulary).
    #[arg(long, default_value = "gpt2")]
    tokenizer: TokenizerKind,
    /// Optimiser steps.
    #[arg(long, default_value_t = 1000)]
    max_steps: usize,
    /// Tokens per window (default: the checkpoint's context, at most 512).
    #[arg(long)]
    seq_len: Option<usize>,
    /// Windows per step.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// Peak learning rate (fine-tuning: lower than from scratch).
    #[arg(long, default_value_t = 1e-4)]
    lr: f64,
    /// Warmup steps (default: a tenth of the steps).
    #[arg(long)]
    warmup: Option<usize>,
    /// Evaluate every this many steps (and at the end).
    #[arg(long, default_value_t = 100)]
    eval_every: usize,
    /// At most this many validation windows per evaluation (default: all).
    #[arg(long)]
    eval_windows: Option<usize>,
    /// Seed of the new parameters' initialisation and of the data order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output folder (default: runs/retrofit-<corpus>-<attention>-seed<seed>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in --out from its newest checkpoint.
    #[arg(long)]
    resume: bool,
    /// Start a fresh run in an --out folder that is not empty and holds no run.
    #[arg(long)]
    force: bool,
    /// auto (CUDA, then WGPU, then Flex), flex, ndarray, wgpu or cuda.
    #[arg(long, default_value = "auto")]
    backend: BackendChoice,
    /// Train data-parallel on this many devices (see `wikitext_60m --help`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    devices: u16,
    /// Token cache folder (default: $COUPLED_QK_CACHE or ~/.cache/coupled-qk).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Fraction of documents held out for validation (JSONL and text corpora).
    #[arg(long, default_value_t = 0.1)]
    valid_fraction: f64,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        coupled_qk_lab::cli::exit_with(&*e);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    match &args.attention {
        AttentionVariant::Differential(_) => {
            return Err(
                "--attention diff: differential attention has other projections than \
                        GPT-2's; retrofit euler, leapfrog, affine or standard"
                    .into(),
            );
        }
        AttentionVariant::Coupled(DynamicsConfig::MlpOnly) => {
            return Err(
                "--attention mlp-only: `q + f(q)` has no dt, so it cannot start at the \
                        pretrained model; retrofit euler, leapfrog, affine or standard"
                    .into(),
            );
        }
        AttentionVariant::Coupled(_) => {}
    }
    let hub = Hub {
        progress: true,
        ..Hub::default()
    };
    let checkpoint = Gpt2Checkpoint::locate(&args.from, &hub)?;
    let seq_len = args.seq_len.unwrap_or(checkpoint.config.context.min(512));
    if seq_len == 0 || seq_len > checkpoint.config.context {
        return Err(format!(
            "--seq-len {seq_len}: must be between 1 and the checkpoint's context ({})",
            checkpoint.config.context
        )
        .into());
    }
    let warmup = args.warmup.unwrap_or(args.max_steps / 10);
    if args.max_steps == 0 || warmup > args.max_steps || args.eval_every == 0 {
        return Err(format!(
            "--max-steps {} --warmup {warmup} --eval-every {}: steps and evaluation interval \
             must be at least 1, warmup at most the steps",
            args.max_steps, args.eval_every
        )
        .into());
    }

    let source = args
        .corpus
        .parse::<CorpusSource>()?
        .with_data_dir(args.data_dir.clone())?;
    let split = SplitOptions {
        valid_fraction: args.valid_fraction,
        seed: 0,
    };
    let options = LoadOptions::for_program(args.cache_dir.clone(), split);
    let corpus = load_corpus(&source, args.tokenizer, &options)?.corpus;

    let model = checkpoint
        .config
        .clone()
        .with_attention(args.attention.clone())
        .with_dt(StepSizeConfig::new().with_init(args.dt));
    let mut config = TrainConfig::new(model);
    config.seq_len = seq_len;
    config.batch_size = args.batch_size;
    config.max_steps = args.max_steps;
    config.lr = args.lr;
    config.warmup_steps = warmup;
    config.eval_every = args.eval_every.min(args.max_steps);
    config.checkpoint_every = config.eval_every;
    config.eval_windows = args.eval_windows;
    config.seed = args.seed;
    config.init_weights = Some(InitWeights::Gpt2(checkpoint.weights.clone()));

    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "runs/retrofit-{}-{}-seed{}",
            corpus.name, args.attention, args.seed
        ))
    });
    eprintln!(
        "retrofit: {} ({} layers, d {}) with {} attention, dt {} → {} steps on {} → {}",
        checkpoint.weights.display(),
        config.model.n_layers,
        config.model.d_model,
        args.attention,
        args.dt,
        config.max_steps,
        corpus.name,
        out.display()
    );
    let options = RunOptions {
        resume: args.resume,
        force: args.force,
        ..RunOptions::default()
    };
    let task = TrainingRun::new(config, corpus, out, options);
    dispatch_devices(args.backend, usize::from(args.devices), task)?
}
