//! Trains a GPT with coupled query-key attention (or a baseline) on WikiText-103: the paper's 60M
//! experiment (WikiText-103 perplexity 22.55 with one Euler step vs 24.22 standard).
//!
//! ```sh
//! cargo run --release --features cuda --example wikitext_60m -- --attention euler
//! cargo run --release --features cuda --example wikitext_60m -- --attention standard
//! # data-parallel on 4 GPUs (CUDA devices 0..4; batch_size must be divisible by 4):
//! cargo run --release --features cuda --example wikitext_60m -- --attention euler --devices 4
//! # CPU scale, offline, on the corpus shipped with the harness:
//! cargo run --release --example wikitext_60m -- --preset tiny --tokenizer bytes \
//!     --corpus shakespeare --max-steps 300 --devices 2
//! # data-parallel over MPI ranks, one GPU each (any number of machines; docs/training.md):
//! mpiexec -n 8 cargo run --release --features cuda,mpi --example wikitext_60m -- --attention euler
//! ```
//!
//! Defaults and which of them the paper states: docs/reproducing.md. Outputs (config.json,
//! metrics.csv, summary.json, loss.svg, checkpoints/) go to `--out`; `--resume` continues a run.

use clap::Parser;
use coupled_qk::AttentionKernel;
use coupled_qk::model::{AttentionVariant, GptConfig, Preset};
use coupled_qk_lab::backend::{BackendChoice, dispatch_devices_from};
use coupled_qk_lab::data::{CorpusSource, LoadOptions, SplitOptions, TokenizerKind, load_corpus};
use coupled_qk_lab::experiment::{ExperimentArgs, parse_args};
use coupled_qk_lab::lm::{LossKind, RunOptions, TrainConfig, TrainingRun};
use coupled_qk_lab::suite::variant_with_steps;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(about = "Train a GPT with coupled QK attention on WikiText-103 (or another corpus)")]
struct Args {
    /// Attention variant: standard, mlp-only, euler, leapfrog, affine or diff (differential
    /// attention), and diff+ any of the others (`diff+euler`); `euler3` names a step count,
    /// `affine2` a layer count.
    #[arg(long, default_value = "euler", value_parser = |s: &str| s.parse::<AttentionVariant>().map(|_| s.to_string()))]
    attention: String,
    /// Integrator steps of euler/leapfrog (the paper finds one enough); the same as a step count
    /// in the name (`--attention euler3`).
    #[arg(long)]
    steps: Option<usize>,
    /// Model preset: tiny, 60m, 150m, 350m.
    #[arg(long, default_value = "60m")]
    preset: Preset,
    /// `wikitext-103`, `wikitext-2`, `shakespeare` (shipped), `sotu` or `brown` (docs/data.md), a
    /// WikiText folder, a .jsonl file or a text file.
    #[arg(long, default_value = "wikitext-103")]
    corpus: String,
    /// A folder with wiki.{train,valid}.{raw,tokens}: WikiText from disk instead of the Hub.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// gpt2 (50257 ids, the paper's) or bytes (256 ids).
    #[arg(long, default_value = "gpt2")]
    tokenizer: TokenizerKind,
    /// Optimiser steps (default: by preset, see docs/reproducing.md).
    #[arg(long)]
    max_steps: Option<usize>,
    /// Training tokens in all; sets the steps from the tokens per step.
    #[arg(long, conflicts_with = "max_steps")]
    tokens: Option<u64>,
    /// Tokens per window (default: the preset's context).
    #[arg(long)]
    seq_len: Option<usize>,
    /// Windows per micro-batch.
    #[arg(long)]
    batch_size: Option<usize>,
    /// Micro-batches per step (gradient accumulation).
    #[arg(long)]
    grad_accum: Option<usize>,
    /// Peak learning rate.
    #[arg(long)]
    lr: Option<f64>,
    /// Warmup steps.
    #[arg(long)]
    warmup: Option<usize>,
    /// Evaluate every this many steps.
    #[arg(long)]
    eval_every: Option<usize>,
    /// At most this many validation windows per evaluation (default: all).
    #[arg(long)]
    eval_windows: Option<usize>,
    /// Checkpoint every this many steps.
    #[arg(long)]
    checkpoint_every: Option<usize>,
    /// Seed of initialisation and data order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output folder (default: runs/<corpus>-<preset>-<attention>-seed<seed>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in --out from its newest checkpoint.
    #[arg(long)]
    resume: bool,
    /// Start a fresh run in an --out folder that is not empty and holds no run (files of the same
    /// names are overwritten).
    #[arg(long)]
    force: bool,
    /// Stop after this step as if interrupted (the schedule still spans all steps); --resume continues.
    #[arg(long)]
    stop_at: Option<usize>,
    /// auto (CUDA, then WGPU, then Flex), flex, ndarray, wgpu or cuda.
    #[arg(long, default_value = "auto")]
    backend: BackendChoice,
    /// Train data-parallel on this many devices (CUDA devices 0..N, or WGPU's discrete GPUs 0..N;
    /// on the CPU, N worker threads sharing it, faster than one: Flex runs elementwise kernels on
    /// one thread, see results/performance.md). Each takes batch_size / N rows of every micro-batch.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    devices: u16,
    /// Under an MPI launcher (a build with --features mpi): how long a rank waits for the others
    /// in one exchange before it decides one died or hangs and stops the job, in seconds. It must
    /// exceed what the others wait for: each rank's corpus load, rank 0's evaluations and
    /// checkpoints.
    #[arg(long, default_value_t = coupled_qk_lab::dist::DEFAULT_COLLECTIVE_TIMEOUT.as_secs())]
    collective_timeout: u64,
    /// Under an MPI launcher: how the ranks sum their gradients. auto: NCCL on the GPUs where
    /// every rank trains on CUDA and can load NCCL (a build with --features mpi,cuda), MPI
    /// through the host otherwise; nccl: NCCL or an error; mpi: MPI through the host.
    #[arg(long, default_value = "auto")]
    collective: coupled_qk_lab::dist::Collective,
    /// Token cache folder (default: $COUPLED_QK_CACHE or ~/.cache/coupled-qk).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// How the token loss is computed: fused (the LM head and cross-entropy over row chunks,
    /// never holding the [tokens, vocab] logits) or explicit (log_softmax of the full logits).
    /// The same loss either way; a resume may change it.
    #[arg(long, default_value = "fused")]
    loss: LossKind,
    /// How attention scores are computed in training: flash (recomputed blockwise in the backward
    /// pass, memory linear in --seq-len) or explicit (the [batch, heads, seq, seq] weights kept
    /// for it). The same function either way; a resume may
    /// change it.
    #[arg(long, default_value = "flash")]
    attention_kernel: AttentionKernel,
    /// Fraction of documents held out for validation (JSONL and text corpora).
    #[arg(long, default_value_t = 0.1)]
    valid_fraction: f64,
    #[command(flatten)]
    experiment: ExperimentArgs,
}

/// Applies the flags to the preset's defaults. A flag that breaks a rule is refused; a preset
/// default that does not fit the flags is lowered, and the returned notes say which.
fn apply_flags(args: &Args, config: &mut TrainConfig) -> Result<Vec<String>, String> {
    let positive = |flag: &str, value: Option<usize>| match value {
        Some(0) => Err(format!("{flag} 0: must be at least 1")),
        _ => Ok(value),
    };
    config.seed = args.seed;
    config.loss = args.loss;
    config.attention_kernel = args.attention_kernel;
    if let Some(v) = positive("--seq-len", args.seq_len)? {
        config.seq_len = v;
    }
    if let Some(v) = positive("--batch-size", args.batch_size)? {
        config.batch_size = v;
    }
    if let Some(v) = positive("--grad-accum", args.grad_accum)? {
        config.grad_accum = v;
    }
    if let Some(v) = args.lr {
        config.lr = v;
    }
    config.eval_windows = positive("--eval-windows", args.eval_windows)?;
    if let Some(v) = positive("--max-steps", args.max_steps)? {
        config.max_steps = v;
    }
    let Some(per_step) = config.checked_tokens_per_step() else {
        return Err(format!(
            "--batch-size {} × --grad-accum {} × --seq-len {}: the tokens per step overflow a \
             64-bit count; give smaller values",
            config.batch_size, config.grad_accum, config.seq_len
        ));
    };
    if let Some(tokens) = args.tokens {
        if tokens < per_step {
            return Err(format!(
                "--tokens {tokens}: fewer than one step of {per_step} tokens (batch size × \
                 grad accum × seq len); give at least {per_step}"
            ));
        }
        config.max_steps = usize::try_from(tokens.div_ceil(per_step)).map_err(|_| {
            format!(
                "--tokens {tokens}: more steps of {per_step} tokens than this machine can count"
            )
        })?;
    }
    let steps = config.max_steps;
    let mut notes = Vec::new();
    match args.warmup {
        Some(v) if v > steps => {
            return Err(format!(
                "--warmup {v}: must be at most the {steps} training steps"
            ));
        }
        Some(v) => config.warmup_steps = v,
        None if config.warmup_steps > steps / 2 => {
            notes.push(format!(
                "the preset's {} warmup steps lowered to {} (half of {steps} steps)",
                config.warmup_steps,
                steps / 2
            ));
            config.warmup_steps = steps / 2;
        }
        None => {}
    }
    for (flag, given, field) in [
        ("--eval-every", args.eval_every, &mut config.eval_every),
        (
            "--checkpoint-every",
            args.checkpoint_every,
            &mut config.checkpoint_every,
        ),
    ] {
        match positive(flag, given)? {
            Some(v) => *field = v,
            None if *field > steps => {
                notes.push(format!(
                    "the preset's {flag} {} lowered to the {steps} training steps",
                    *field
                ));
                *field = steps;
            }
            None => {}
        }
    }
    Ok(notes)
}

/// `warmup_steps` of the run in `out`, if it has a readable config.json.
fn run_warmup(out: &std::path::Path) -> Option<usize> {
    let text = std::fs::read_to_string(out.join("config.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    usize::try_from(json.get("warmup_steps")?.as_u64()?).ok()
}

/// The last line of a failed download: what runs with no network.
const OFFLINE: &str = "offline, the same program trains at CPU scale on the corpus shipped with \
the harness:\n  cargo run --release --example wikitext_60m -- --preset tiny --tokenizer bytes \
--corpus shakespeare --max-steps 300 --devices 2";

fn main() {
    let args = parse_args::<Args>("wikitext_60m");
    if let Err(e) = run(args) {
        coupled_qk_lab::cli::exit_with(&*e);
    }
}

/// Per-preset defaults: our reconstruction (the paper gives none of these), see docs/reproducing.md.
fn preset_defaults(preset: Preset, config: &mut TrainConfig) {
    let (batch, lr, warmup, steps, eval_every, checkpoint) = match preset {
        Preset::Tiny | Preset::Small => (16, 1e-3, 100, 1000, 100, 250),
        Preset::M60 => (32, 6e-4, 1000, 20_000, 500, 1000),
        Preset::M150 | Preset::M350 => (32, 3e-4, 2000, 20_000, 500, 1000),
    };
    config.batch_size = batch;
    config.lr = lr;
    config.warmup_steps = warmup;
    config.max_steps = steps;
    config.eval_every = eval_every;
    config.checkpoint_every = checkpoint;
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    // One rank alone unless started by an MPI launcher (and built with --features mpi).
    let group = coupled_qk_lab::dist::from_environment(
        Duration::from_secs(args.collective_timeout),
        args.collective,
    )?;
    let ranks = group.world_size();
    if ranks > 1 {
        eprintln!("{}: --devices {} each", group.describe(), args.devices);
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
    // Every flag is checked before the (possibly long) corpus load or download: the model's
    // vocabulary is the tokenizer's.
    let vocab_size = args.tokenizer.build().vocab_size();
    let model = GptConfig::preset(args.preset, vocab_size).with_attention(
        variant_with_steps(&args.attention, args.steps)
            .map_err(|e| format!("--attention {} --steps: {e}", args.attention))?,
    );
    let mut config = TrainConfig::new(model);
    preset_defaults(args.preset, &mut config);
    let notes = apply_flags(&args, &mut config)?;
    config.validate()?;
    // Every device takes an equal share of each micro-batch.
    let shares = usize::from(args.devices) * ranks;
    if !config.batch_size.is_multiple_of(shares) {
        return Err(format!(
            "--devices {} over {ranks} rank(s): the batch size ({}) must be divisible by the \
             devices of all ranks; set --batch-size to a multiple of {shares} (and --grad-accum \
             to keep the tokens per step)",
            args.devices, config.batch_size
        )
        .into());
    }
    for note in notes {
        eprintln!("note: {note}");
    }
    let corpus = match load_corpus(&source, args.tokenizer, &options) {
        Ok(loaded) => loaded.corpus,
        Err(e) if e.is_download() => return Err(format!("{e}\n{OFFLINE}").into()),
        Err(e) => return Err(e.into()),
    };
    config.validate_for(&corpus)?;

    let attention = config.model.attention.clone();
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "runs/{}-{}-{attention}-seed{}",
            corpus.name,
            preset_name(args.preset),
            args.seed
        ))
    });
    // A resume keeps the warmup the run started with when --warmup is not given: the default
    // derived from a new --max-steps would otherwise refuse the resume as a changed schedule.
    // The run folder is rank 0's: the other ranks take its answer.
    let mut warmup = match group.rank() {
        0 => run_warmup(&out).map_or(Vec::new(), |w| w.to_le_bytes().to_vec()),
        _ => Vec::new(),
    };
    group.broadcast_bytes(&mut warmup)?;
    let run_warmup = <[u8; 8]>::try_from(warmup.as_slice())
        .ok()
        .map(usize::from_le_bytes);
    if let (true, None, Some(old)) = (args.resume, args.warmup, run_warmup)
        && old != config.warmup_steps
        && old <= config.max_steps
    {
        eprintln!(
            "note: resuming with the run's {old} warmup steps (the default for {} steps would be \
             {}; --warmup sets it)",
            config.max_steps, config.warmup_steps
        );
        config.warmup_steps = old;
    }
    eprintln!(
        "run: {} preset, {attention} attention, {} steps × {} tokens = {:.1}M tokens → {}",
        preset_name(args.preset),
        config.max_steps,
        config.tokens_per_step(),
        (config.max_steps as u64 * config.tokens_per_step()) as f64 / 1e6,
        out.display()
    );
    let cpu_note = (args.preset != Preset::Tiny).then(|| {
        format!(
            "training the {} preset on the CPU: the progress bar's ETA shows how long the full \
             budget would take; build with --features cuda on a GPU machine for real runs",
            preset_name(args.preset)
        )
    });
    let local_rank = group.local_rank();
    let task = TrainingRun {
        config,
        corpus,
        out,
        cpu_note,
        group,
        options: RunOptions {
            resume: args.resume,
            stop_at: args.stop_at,
            force: args.force,
            // A resume may change the optimiser settings whose flags it gives (a lower --lr
            // after a divergence, ...); anything else that differs is still refused.
            allow_changes: [
                (args.lr.is_some(), "lr"),
                (args.warmup.is_some(), "warmup_steps"),
                (
                    args.max_steps.is_some() || args.tokens.is_some(),
                    "max_steps",
                ),
            ]
            .into_iter()
            .filter_map(|(given, field)| given.then_some(field))
            .collect(),
            ..RunOptions::default()
        },
    };
    // Each rank of a machine takes its own GPUs: local rank i the devices i·N..(i+1)·N.
    let devices = usize::from(args.devices);
    dispatch_devices_from(args.backend, local_rank * devices, devices, task)?
}

fn preset_name(preset: Preset) -> &'static str {
    match preset {
        Preset::Tiny => "tiny",
        Preset::Small => "small",
        Preset::M60 => "60m",
        Preset::M150 => "150m",
        Preset::M350 => "350m",
    }
}
