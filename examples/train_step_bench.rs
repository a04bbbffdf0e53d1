//! Training-step benchmark (issue 7): forward + backward + AdamW of whole models and of one layer
//! of the `60m` shape, for each attention variant, as tokens per second and as ratios to standard
//! attention in one run (medians over repetitions, warm-up excluded).
//!
//! ```sh
//! cargo run --release --example train_step_bench                                 # Flex (CPU)
//! cargo run --release --features cuda --example train_step_bench -- --backend cuda --with-60m
//! ```
//!
//! Configurations: `tiny` (the preset: d 128, 4 layers, 4 heads, context 256; batch 16, vocab 256),
//! `torch-small` (d 128, 4 layers, 4 heads, seq 128, batch 16, vocab 512) and `torch-medium`
//! (d 256, 4 layers, 4 heads, seq 256, batch 8, vocab 8192), the two shapes issue 7 gives PyTorch
//! eager figures for (11.8k and 2.1k tokens/s on 2 threads), `layer-60m` (one attention layer of
//! the 60m preset, d 576, 9 heads, seq 512, batch 8, under AdamW with a squared-output loss), and
//! with `--with-60m` the whole `60m` preset (batch 8 × 512, GPT-2 vocabulary).

mod common;

use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Tensor};
use clap::Parser;
use common::backend::{BackendChoice, BackendTask, dispatch};
use common::data::TokenBatch;
use common::lm::batch_loss;
use coupled_qk::model::{AttentionVariant, GptConfig, Preset};
use coupled_qk::{CoupledQkAttentionConfig, DynamicsConfig};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Training-step throughput and ratios of the attention variants")]
struct Args {
    /// auto, flex, wgpu or cuda.
    #[arg(long, default_value = "auto")]
    backend: BackendChoice,
    /// Timed steps per measurement (the median is reported).
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// Untimed steps first.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Also the whole 60m preset (slow on a CPU: minutes per step).
    #[arg(long)]
    with_60m: bool,
    /// Only these configurations (tiny, torch-small, torch-medium, layer-60m, 60m).
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Write the figures as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// A model shape and batch.
struct Shape {
    name: &'static str,
    model: Option<GptConfig>,
    batch: usize,
    seq: usize,
}

fn shapes(args: &Args) -> Vec<Shape> {
    let gpt = |vocab, d, layers, heads, context| GptConfig::new(vocab, d, layers, heads, context);
    let mut shapes = vec![
        Shape {
            name: "tiny",
            model: Some(GptConfig::preset(Preset::Tiny, 256)),
            batch: 16,
            seq: 256,
        },
        Shape {
            name: "torch-small",
            model: Some(gpt(512, 128, 4, 4, 128)),
            batch: 16,
            seq: 128,
        },
        Shape {
            name: "torch-medium",
            model: Some(gpt(8192, 256, 4, 4, 256)),
            batch: 8,
            seq: 256,
        },
        Shape {
            name: "layer-60m",
            model: None,
            batch: 8,
            seq: 512,
        },
    ];
    if args.with_60m {
        shapes.push(Shape {
            name: "60m",
            model: Some(GptConfig::preset(Preset::M60, 50257)),
            batch: 8,
            seq: 512,
        });
    }
    if let Some(only) = &args.only {
        shapes.retain(|s| only.iter().any(|o| o == s.name));
    }
    shapes
}

fn variants() -> Vec<(&'static str, AttentionVariant)> {
    vec![
        ("standard", DynamicsConfig::Standard.into()),
        ("euler1", DynamicsConfig::euler(1).into()),
        ("euler3", DynamicsConfig::euler(3).into()),
        ("leapfrog1", DynamicsConfig::leapfrog(1).into()),
        ("mlp-only", DynamicsConfig::MlpOnly.into()),
        ("diff", AttentionVariant::Differential),
    ]
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Seconds of each timed training step of `model` on random tokens.
fn time_model<B: AutodiffBackend>(
    config: &GptConfig,
    shape: &Shape,
    args: &Args,
    device: &B::Device,
) -> Vec<f64> {
    B::seed(device, 0);
    let mut model = config.init::<B>(device);
    let mut optimizer = AdamWConfig::new().init::<B, coupled_qk::model::Gpt<B>>();
    let mut rng = StdRng::seed_from_u64(0);
    let vocab = config.vocab_size as i64;
    let mut times = Vec::new();
    for i in 0..args.warmup + args.reps {
        let n = shape.batch * shape.seq;
        let batch = TokenBatch {
            inputs: (0..n).map(|_| rng.random_range(0..vocab)).collect(),
            targets: (0..n).map(|_| rng.random_range(0..vocab)).collect(),
            rows: shape.batch,
            seq_len: shape.seq,
            target_bytes: n as u64,
        };
        let start = Instant::now();
        let loss = batch_loss(&model, &batch, device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(1e-4, model, grads);
        B::sync(device).expect("the device finishes its work");
        if i >= args.warmup {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    times
}

/// Seconds of each timed training step of one attention layer of the 60m shape.
fn time_layer<B: AutodiffBackend>(
    variant: &AttentionVariant,
    shape: &Shape,
    args: &Args,
    device: &B::Device,
) -> Option<Vec<f64>> {
    let AttentionVariant::Dynamics(dynamics) = variant else {
        return None;
    };
    B::seed(device, 0);
    let mut layer = CoupledQkAttentionConfig::new(576, 9)
        .with_dynamics(dynamics.clone())
        .with_causal(true)
        .init::<B>(device);
    let mut optimizer = AdamWConfig::new().init::<B, coupled_qk::CoupledQkAttention<B>>();
    let mut times = Vec::new();
    for i in 0..args.warmup + args.reps {
        let x = Tensor::<B, 3>::random(
            [shape.batch, shape.seq, 576],
            Distribution::Normal(0.0, 1.0),
            device,
        );
        let start = Instant::now();
        let loss = layer.forward(x).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &layer);
        layer = optimizer.step(1e-4, layer, grads);
        B::sync(device).expect("the device finishes its work");
        if i >= args.warmup {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    Some(times)
}

struct Bench<'a> {
    args: &'a Args,
}

impl BackendTask for Bench<'_> {
    type Output = serde_json::Value;
    fn run<B: AutodiffBackend>(
        self,
        device: B::Device,
        name: &'static str,
        _gpu: bool,
    ) -> serde_json::Value {
        let args = self.args;
        let mut rows = Vec::new();
        println!(
            "| config | variant | median step ms | tokens/s | ratio to standard |\n|---|---|---|---|---|"
        );
        for shape in shapes(args) {
            let mut standard = None;
            for (label, variant) in variants() {
                let times = match &shape.model {
                    Some(model) => Some(time_model::<B>(
                        &model.clone().with_variant(variant.clone()),
                        &shape,
                        args,
                        &device,
                    )),
                    None => time_layer::<B>(&variant, &shape, args, &device),
                };
                let Some(times) = times else { continue };
                let step = median(times.clone());
                let standard_step = *standard.get_or_insert(step);
                let tokens_per_s = (shape.batch * shape.seq) as f64 / step;
                println!(
                    "| {} | {label} | {:.1} | {tokens_per_s:.0} | {:.3} |",
                    shape.name,
                    step * 1e3,
                    step / standard_step
                );
                rows.push(serde_json::json!({
                    "config": shape.name, "variant": label, "batch": shape.batch, "seq": shape.seq,
                    "step_s_median": step, "step_s": times, "tokens_per_s": tokens_per_s,
                    "ratio_to_standard": step / standard_step,
                }));
            }
        }
        serde_json::json!({ "backend": name, "reps": args.reps, "warmup": args.warmup, "rows": rows })
    }
}

fn main() {
    let args = Args::parse();
    let result = match dispatch(args.backend, Bench { args: &args }) {
        Ok(result) => result,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    if let Some(path) = &args.out {
        let text = serde_json::to_string_pretty(&result).expect("JSON");
        if let Err(e) = common::atomic::write(path, text.as_bytes()) {
            eprintln!("error: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}
