//! Training-step benchmark: forward + backward + AdamW of whole models and of one layer
//! of the `60m` shape, for each attention variant, as tokens per second, peak memory and ratios to
//! standard attention in one run.
//!
//! ```sh
//! cargo run --release --example train_step_bench                                 # Flex (CPU)
//! cargo run --release --features cuda --example train_step_bench -- --backend cuda --with-60m
//! ```
//!
//! Configurations: `tiny` (the preset: d 128, 4 layers, 4 heads, context 256; batch 16, vocab 256),
//! `torch-small` (d 128, 4 layers, 4 heads, seq 128, batch 16, vocab 512) and `torch-medium`
//! (d 256, 4 layers, 4 heads, seq 256, batch 8, vocab 8192), the two shapes of the PyTorch
//! eager reference figures in results/performance.md (11.8k and 2.1k tokens/s on 2 threads), `long`
//! (d 128, 4 layers, 4 heads, context 1024, batch 4, vocab 256), `layer-60m` (one attention layer of
//! the 60m preset, d 576, 9 heads, seq 512, batch 8, under AdamW with a squared-output loss; with
//! burn-nn's `MultiHeadAttention` beside the crate's variants), and with `--with-60m` the whole
//! `60m` preset (batch 8 × 512, GPT-2 vocabulary). The whole models train on the fused loss (as
//! the training loop does by default); `--loss explicit` takes the explicit `log_softmax` path
//! and `--loss fused,explicit` runs every variant with both (results/performance.md, "Fused linear
//! cross-entropy"). Attention is scored with the flash kernel, as in training;
//! `--attention-kernel explicit` keeps the weights for the backward pass (`explicit,flash`: both).
//!
//! Every variant of a configuration is built first and the timed steps go round-robin (the order
//! rotated each round), so a change in the machine's load falls on all variants alike. Each
//! figure is the median over `--reps` steps after `--warmup` untimed ones. Peak memory is counted
//! by this program's allocator: the most heap bytes held during a step above those held before it
//! (activations, gradients, temporaries; not the weights and optimiser state held between steps).
//! It is meaningful on CPU backends only; on a GPU it counts host memory.
//!
//! A program rather than a `cargo bench` target: it takes a backend, a device count and a
//! checkpointing strategy, runs for minutes per configuration, and writes a Markdown and JSON
//! report, none of which fits criterion's harness; `cargo bench --bench attention` is the
//! criterion benchmark of one layer.

use burn::module::AutodiffModule;
use burn::nn::attention::{MhaInput, MultiHeadAttentionConfig, generate_autoregressive_mask};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Distribution, Tensor};
use clap::Parser;
use coupled_qk::model::{AttentionVariant, FusedOps, Gpt, GptConfig, Preset};
use coupled_qk::{AttentionKernel, CoupledQkAttentionConfig};
use coupled_qk_lab::alloc::ALLOC;
use coupled_qk_lab::backend::{BackendChoice, MultiDeviceTask, dispatch_devices};
use coupled_qk_lab::data::TokenBatch;
use coupled_qk_lab::lm::{LossKind, batch_gradients, sharded_gradients};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Training-step throughput, peak memory and ratios of the attention variants")]
struct Args {
    /// auto, flex, ndarray, wgpu or cuda.
    #[arg(long, default_value = "auto")]
    backend: BackendChoice,
    /// Timed steps per variant (the median is reported; at least 1).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u64).range(1..10_000))]
    reps: u64,
    /// Untimed steps first, per variant.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Also the whole 60m preset (slow on a CPU: many seconds per step; `--only 60m` runs it too).
    #[arg(long)]
    with_60m: bool,
    /// Only these configurations (tiny, torch-small, torch-medium, long, layer-60m, 60m).
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Only these variants (by default standard, euler1, euler3, leapfrog1, mlp-only, affine1,
    /// diff, diff+euler1 and burn-mha; any attention variant's name is taken, e.g.
    /// affine-uncoupled1); standard is always run: the ratios are to it.
    #[arg(long, value_delimiter = ',')]
    variants: Option<Vec<String>>,
    /// Data-parallel workers per step: each takes batch / N rows (GPUs; on the CPU, N workers
    /// sharing it, as `wikitext_60m --devices N` does).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    devices: u16,
    /// Burn's autodiff checkpointing on Flex: `none` (Burn's default: keep what backward needs)
    /// or `balanced` (recompute memory-bound ops such as elementwise ones in the backward pass
    /// instead of keeping their outputs).
    #[arg(long, default_value = "none", value_parser = ["none", "balanced"])]
    checkpointing: String,
    /// How the whole models' loss is computed: fused, explicit, or both (`fused,explicit`: each
    /// variant once per loss, the ratios to the first row).
    #[arg(long, value_delimiter = ',', default_value = "fused")]
    loss: Vec<LossKind>,
    /// How attention is scored under autodiff: flash (as the training loop does by default),
    /// explicit, or both (`explicit,flash`: each variant once per kernel, the ratios to the first
    /// row).
    #[arg(long, value_delimiter = ',', default_value = "flash")]
    attention_kernel: Vec<AttentionKernel>,
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

/// Every configuration the benchmark knows, 60m last.
fn all_shapes() -> Vec<Shape> {
    let gpt = |vocab, d, layers, heads, context| GptConfig::new(vocab, d, layers, heads, context);
    vec![
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
            name: "long",
            model: Some(gpt(256, 128, 4, 4, 1024)),
            batch: 4,
            seq: 1024,
        },
        Shape {
            name: "layer-60m",
            model: None,
            batch: 8,
            seq: 512,
        },
        Shape {
            name: "60m",
            model: Some(GptConfig::preset(Preset::M60, 50257)),
            batch: 8,
            seq: 512,
        },
    ]
}

/// The configurations to run: those `--only` names, else all but 60m unless `--with-60m`.
fn shapes(args: &Args) -> Vec<Shape> {
    let mut shapes = all_shapes();
    match &args.only {
        Some(only) => shapes.retain(|s| only.iter().any(|o| o == s.name)),
        None => shapes.retain(|s| args.with_60m || s.name != "60m"),
    }
    shapes
}

/// What is compared: a variant of the crate's attention, or burn-nn's layer (layer shape only).
#[derive(Clone)]
enum Contender {
    Crate(AttentionVariant),
    BurnMha,
}

/// The variants to time, standard first; an unknown name is an error naming it.
fn contenders(args: &Args) -> Result<Vec<(String, Contender)>, String> {
    let crate_variants = [
        "standard",
        "euler1",
        "euler3",
        "leapfrog1",
        "mlp-only",
        "affine1",
        "diff",
        "diff+euler1",
    ];
    let mut all: Vec<(String, Contender)> = crate_variants
        .iter()
        .map(|name| {
            let variant: AttentionVariant = name.parse().expect("a variant name");
            (variant.to_string(), Contender::Crate(variant))
        })
        .collect();
    all.push(("burn-mha".to_string(), Contender::BurnMha));
    let Some(keep) = &args.variants else {
        return Ok(all);
    };
    let mut chosen = vec![all.swap_remove(0)];
    for name in keep {
        let contender = match name.as_str() {
            "burn-mha" => Contender::BurnMha,
            _ => Contender::Crate(
                name.parse()
                    .map_err(|e| format!("--variants: `{name}` is no attention variant: {e}"))?,
            ),
        };
        let label = match &contender {
            Contender::Crate(variant) => variant.to_string(),
            Contender::BurnMha => "burn-mha".to_string(),
        };
        if !chosen.iter().any(|(l, _)| *l == label) {
            chosen.push((label, contender));
        }
    }
    Ok(chosen)
}

/// One timed training step: seconds, and peak heap bytes above those held before it.
#[derive(Clone, Copy)]
struct Measure {
    secs: f64,
    peak_bytes: usize,
}

type Step<'a> = Box<dyn FnMut() -> Measure + 'a>;

fn measured<B: AutodiffBackend>(device: &B::Device, work: impl FnOnce()) -> Measure {
    let before = ALLOC.reset_peak();
    let start = Instant::now();
    work();
    B::sync(device).expect("the device finishes its work");
    Measure {
        secs: start.elapsed().as_secs_f64(),
        peak_bytes: ALLOC.peak().saturating_sub(before),
    }
}

fn model_step<'a, B: FusedOps>(
    config: GptConfig,
    shape: &Shape,
    devices: &'a [B::Device],
    loss: LossKind,
    kernel: AttentionKernel,
) -> Step<'a> {
    let device = &devices[0];
    B::seed(device, 0);
    coupled_qk::attention::register_flash_attention::<B>();
    let mut model = Some(config.init::<B>(device).with_attention_kernel(kernel));
    let mut optimizer = AdamWConfig::new().init::<B, Gpt<B>>();
    let mut rng = StdRng::seed_from_u64(0);
    let (rows, seq_len, vocab) = (shape.batch, shape.seq, config.vocab_size as i64);
    Box::new(move || {
        let n = rows * seq_len;
        let batch = TokenBatch {
            inputs: (0..n).map(|_| rng.random_range(0..vocab)).collect(),
            targets: (0..n).map(|_| rng.random_range(0..vocab)).collect(),
            rows,
            seq_len,
            target_bytes: n as u64,
        };
        measured::<B>(device, || {
            optimise(&mut model, &mut optimizer, |m| {
                batch_gradients(m, &batch, devices, 1, loss)
                    .expect("a finite loss")
                    .1
            })
        })
    })
}

/// One layer of the 60m shape (d 576, 9 heads, causal) under a squared-output loss.
fn layer_step<'a, B: FusedOps>(
    contender: &Contender,
    shape: &Shape,
    devices: &'a [B::Device],
    kernel: AttentionKernel,
) -> Option<Step<'a>> {
    let device = &devices[0];
    B::seed(device, 0);
    coupled_qk::attention::register_flash_attention::<B>();
    let (rows, seq) = (shape.batch, shape.seq);
    match contender {
        Contender::Crate(AttentionVariant::Coupled(dynamics)) => {
            let layer = CoupledQkAttentionConfig::new(576, 9)
                .with_dynamics(dynamics.clone())
                .with_causal(true)
                .with_kernel(kernel)
                .init::<B>(device);
            Some(train_layer(layer, |l, x| l.forward(x), rows, seq, devices))
        }
        Contender::BurnMha => {
            let layer = MultiHeadAttentionConfig::new(576, 9).init::<B>(device);
            let forward = move |l: &burn::nn::attention::MultiHeadAttention<B>, x: Tensor<B, 3>| {
                let [batch, seq, _] = x.dims(); // a worker's shard
                let mask = generate_autoregressive_mask::<B>(batch, seq, &x.device());
                l.forward(MhaInput::self_attn(x).mask_attn(mask)).context
            };
            Some(train_layer(layer, forward, rows, seq, devices))
        }
        Contender::Crate(AttentionVariant::Differential(_)) => None,
    }
}

fn train_layer<'a, B: AutodiffBackend, M: AutodiffModule<B> + Send + 'a>(
    layer: M,
    forward: impl Fn(&M, Tensor<B, 3>) -> Tensor<B, 3> + Sync + 'a,
    rows: usize,
    seq: usize,
    devices: &'a [B::Device],
) -> Step<'a> {
    let device = &devices[0];
    let mut layer = Some(layer);
    let mut optimizer = AdamWConfig::new().init::<B, M>();
    Box::new(move || {
        let x = Tensor::<B, 3>::random([rows, seq, 576], Distribution::Normal(0.0, 1.0), device);
        // One [rows / N, seq, 576] slice per worker, made before the clock starts; the mean of
        // their mean losses is the loss.
        let shards: Vec<Tensor<B, 3>> = x
            .chunk(devices.len(), 0)
            .into_iter()
            .zip(devices)
            .map(|(x, d)| x.to_device(d))
            .collect();
        measured::<B>(device, || {
            optimise(&mut layer, &mut optimizer, |l| {
                let loss = |l: &M, x: &Tensor<B, 3>, _: &B::Device| {
                    forward(l, x.clone()).powi_scalar(2).mean()
                };
                let divisor = devices.len() as f64;
                sharded_gradients(l, &shards, devices, divisor, loss)
                    .expect("a finite loss")
                    .1
            })
        })
    })
}

/// One AdamW step of the module in `slot` with the gradients `grads` computes (the optimiser
/// consumes the module and gives back the updated one, so it lives in an `Option` between steps).
fn optimise<B: AutodiffBackend, M: AutodiffModule<B>>(
    slot: &mut Option<M>,
    optimizer: &mut impl Optimizer<M, B>,
    grads: impl FnOnce(&M) -> GradientsParams,
) {
    let module = slot.take().expect("the module is put back after each step");
    let grads = grads(&module);
    *slot = Some(optimizer.step(1e-4, module, grads));
}

/// A `Vm…` line of /proc/self/status in KiB (Linux; `None` elsewhere).
fn rss_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

struct Bench<'a> {
    args: &'a Args,
}

impl MultiDeviceTask for Bench<'_> {
    type Output = serde_json::Value;

    fn run<B: FusedOps>(
        self,
        devices: Vec<B::Device>,
        name: &'static str,
        _gpu: bool,
    ) -> serde_json::Value {
        let args = self.args;
        let mut rows = Vec::new();
        // The process's resident memory before the first step of the first configuration: with
        // the peak (VmHWM) at the end, the memory counted the way benches/vs_pytorch counts
        // PyTorch's (one configuration and kernel per process there).
        let mut rss_before: Option<Option<u64>> = None;
        println!(
            "| config | variant | median step ms | tokens/s | ratio to standard | step peak MiB | memory ratio |\n|---|---|---|---|---|---|---|"
        );
        for shape in shapes(args) {
            let mut runners: Vec<(String, AttentionKernel, Step)> = Vec::new();
            for (label, contender) in contenders(args).expect("checked in main") {
                for &kernel in &args.attention_kernel {
                    // Rows are labelled by what varies: the loss, the kernel, or both.
                    let kernel_label =
                        (args.attention_kernel.len() > 1).then(|| format!("{kernel} kernel"));
                    match (&shape.model, &contender) {
                        (Some(model), Contender::Crate(variant)) => {
                            for &loss in &args.loss {
                                let step = model_step::<B>(
                                    model.clone().with_attention(variant.clone()),
                                    &shape,
                                    &devices,
                                    loss,
                                    kernel,
                                );
                                let loss_label =
                                    (args.loss.len() > 1).then(|| format!("{loss} loss"));
                                let notes: Vec<String> = [loss_label, kernel_label.clone()]
                                    .into_iter()
                                    .flatten()
                                    .collect();
                                let label = match notes.is_empty() {
                                    true => label.clone(),
                                    false => format!("{label} ({})", notes.join(", ")),
                                };
                                runners.push((label, kernel, step));
                            }
                        }
                        (Some(_), Contender::BurnMha) => {}
                        (None, Contender::BurnMha) if kernel != args.attention_kernel[0] => {}
                        (None, _) => {
                            if let Some(step) =
                                layer_step::<B>(&contender, &shape, &devices, kernel)
                            {
                                let label = match (&kernel_label, &contender) {
                                    (Some(k), Contender::Crate(_)) => format!("{label} ({k})"),
                                    _ => label.clone(),
                                };
                                runners.push((label, kernel, step));
                            }
                        }
                    }
                }
            }
            rss_before.get_or_insert(rss_kib("VmRSS").map(|k| k * 1024));
            for (_, _, step) in runners.iter_mut() {
                for _ in 0..args.warmup {
                    step();
                }
            }
            let n = runners.len();
            let mut measures = vec![Vec::new(); n];
            for rep in 0..args.reps {
                for i in 0..n {
                    let index = (i + rep as usize) % n;
                    measures[index].push((runners[index].2)());
                }
            }
            let (mut standard_s, mut standard_bytes) = (None, None);
            for ((label, kernel, _), measures) in runners.iter().zip(measures) {
                let times: Vec<f64> = measures.iter().map(|m| m.secs).collect();
                let bytes: Vec<f64> = measures.iter().map(|m| m.peak_bytes as f64).collect();
                let (step, peak) = (median(times.clone()), median(bytes));
                let standard_step = *standard_s.get_or_insert(step);
                let standard_peak = *standard_bytes.get_or_insert(peak);
                let tokens_per_s = (shape.batch * shape.seq) as f64 / step;
                println!(
                    "| {} | {label} | {:.1} | {tokens_per_s:.0} | {:.3} | {:.1} | {:.3} |",
                    shape.name,
                    step * 1e3,
                    step / standard_step,
                    peak / (1 << 20) as f64,
                    peak / standard_peak,
                );
                rows.push(serde_json::json!({
                    "config": shape.name, "variant": label, "attention_kernel": kernel.to_string(),
                    "batch": shape.batch, "seq": shape.seq,
                    "step_s_median": step, "step_s": times, "tokens_per_s": tokens_per_s,
                    "ratio_to_standard": step / standard_step,
                    "step_peak_bytes_median": peak, "memory_ratio_to_standard": peak / standard_peak,
                }));
            }
        }
        let losses: Vec<String> = args.loss.iter().map(LossKind::to_string).collect();
        let kernels: Vec<String> = args
            .attention_kernel
            .iter()
            .map(AttentionKernel::to_string)
            .collect();
        serde_json::json!({
            "backend": name, "dynamics_path": coupled_qk::dynamics::dynamics_path::<B>(),
            "devices": devices.len(), "reps": args.reps, "warmup": args.warmup,
            "losses": losses, "attention_kernels": kernels, "rows": rows,
            "rss_before_first_step_bytes": rss_before.flatten(), "peak_rss_bytes": rss_kib("VmHWM").map(|k| k * 1024),
        })
    }
}

fn main() {
    let args = Args::parse();
    let refuse = |message: String| -> ! {
        eprintln!("error: {message}");
        std::process::exit(2)
    };
    let known: Vec<&str> = all_shapes().iter().map(|s| s.name).collect();
    if let Some(unknown) = args
        .only
        .iter()
        .flatten()
        .find(|o| !known.contains(&o.as_str()))
    {
        refuse(format!(
            "--only: `{unknown}` is no configuration of this benchmark (it has {})",
            known.join(", ")
        ));
    }
    if let Err(message) = contenders(&args) {
        refuse(message);
    }
    let workers = usize::from(args.devices);
    if let Some(shape) = shapes(&args).iter().find(|s| s.batch % workers != 0) {
        eprintln!(
            "error: --devices {workers}: {}'s batch of {} rows does not split into {workers} equal \
             shards; use a divisor of it, or --only other configurations",
            shape.name, shape.batch
        );
        std::process::exit(2);
    }
    let bench = Bench { args: &args };
    let result = if args.checkpointing == "balanced" {
        if !matches!(args.backend, BackendChoice::Auto | BackendChoice::Flex) {
            eprintln!("error: --checkpointing balanced is wired for Flex only; add --backend flex");
            std::process::exit(2);
        }
        use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
        eprintln!("backend: Flex with BalancedCheckpointing ({workers} workers)");
        let devices = vec![Default::default(); workers];
        Ok(
            bench.run::<burn::backend::Autodiff<burn::backend::Flex, BalancedCheckpointing>>(
                devices,
                "flex-balanced",
                false,
            ),
        )
    } else {
        dispatch_devices(args.backend, workers, bench)
    };
    let result = match result {
        Ok(result) => result,
        Err(e) => {
            eprintln!("error: {e}");
            if let Some(advice) = coupled_qk_lab::cli::backend_advice(&e) {
                eprintln!("{advice}");
            }
            std::process::exit(1);
        }
    };
    if let Some(path) = &args.out {
        let text = serde_json::to_string_pretty(&result).expect("JSON");
        if let Err(e) = coupled_qk_lab::atomic::write(path, text.as_bytes()) {
            eprintln!("error: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}
