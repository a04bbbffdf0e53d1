//! One attention layer at `batch 8, seq 256, d_model 512, 8 heads` (causal) on Flex: forward,
//! and forward + backward under autodiff, for each variant and for burn-nn's
//! `MultiHeadAttention` as the baseline. Prints the medians and their ratios to standard.
//!
//! Run: `cargo bench --bench attention` (criterion's own flags follow `--`).

use burn::backend::{Autodiff, Flex};
use burn::nn::attention::{MhaInput, MultiHeadAttentionConfig, generate_autoregressive_mask};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};
use coupled_qk::{CoupledQkAttentionConfig, DynamicsConfig};
use criterion::Criterion;
use std::time::Duration;

// As in the example programs (lab/src/alloc.rs): glibc's malloc maps and unmaps every
// large tensor, and the page faults would dominate the figures.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 8;
const SEQ: usize = 256;
const D_MODEL: usize = 512;
const HEADS: usize = 8;

fn variants() -> [DynamicsConfig; 6] {
    [
        DynamicsConfig::Standard,
        DynamicsConfig::MlpOnly,
        DynamicsConfig::euler(1),
        DynamicsConfig::euler(3),
        DynamicsConfig::leapfrog(1),
        DynamicsConfig::leapfrog(3),
    ]
}

/// A layer under test, as a function from input to output.
type Layer<B> = Box<dyn Fn(Tensor<B, 3>) -> Tensor<B, 3>>;

/// Every layer under test, by name.
fn layers<B: Backend>(device: &B::Device) -> Vec<(String, Layer<B>)> {
    let mut out: Vec<(String, Layer<B>)> = Vec::new();
    for dynamics in variants() {
        let name = dynamics.to_string();
        let layer = CoupledQkAttentionConfig::new(D_MODEL, HEADS)
            .with_dynamics(dynamics)
            .with_causal(true)
            .init::<B>(device);
        out.push((name, Box::new(move |x| layer.forward(x))));
    }
    let mha = MultiHeadAttentionConfig::new(D_MODEL, HEADS)
        .with_dropout(0.0)
        .init::<B>(device);
    let mask = generate_autoregressive_mask::<B>(BATCH, SEQ, device);
    out.push((
        "burn-nn-mha".to_string(),
        Box::new(move |x| {
            mha.forward(MhaInput::self_attn(x).mask_attn(mask.clone()))
                .context
        }),
    ));
    out
}

fn configure<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(6));
    group
}

fn forward(c: &mut Criterion) {
    let device = Default::default();
    let x = Tensor::<Flex, 3>::random(
        [BATCH, SEQ, D_MODEL],
        Distribution::Normal(0.0, 1.0),
        &device,
    );
    let mut group = configure(c, "forward");
    for (name, layer) in layers::<Flex>(&device) {
        group.bench_function(&name, |b| b.iter(|| layer(x.clone()).sum().into_scalar()));
    }
    group.finish();
}

fn forward_backward<B: AutodiffBackend>(c: &mut Criterion) {
    let device = Default::default();
    let x = Tensor::<B, 3>::random(
        [BATCH, SEQ, D_MODEL],
        Distribution::Normal(0.0, 1.0),
        &device,
    );
    let mut group = configure(c, "forward_backward");
    for (name, layer) in layers::<B>(&device) {
        group.bench_function(&name, |b| b.iter(|| layer(x.clone()).sum().backward()));
    }
    group.finish();
}

/// Reads criterion's medians back and prints them with their ratio to `standard`.
fn print_ratios() {
    let dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    println!("\n| group | variant | median (ms) | ratio to standard |\n|---|---|---|---|");
    for group in ["forward", "forward_backward"] {
        let median = |name: &str| -> Option<f64> {
            let path = format!("{dir}/criterion/{group}/{name}/new/estimates.json");
            let json: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
            Some(json["median"]["point_estimate"].as_f64()? / 1e6)
        };
        let Some(standard) = median("standard") else {
            continue;
        };
        let names: Vec<String> = variants()
            .iter()
            .map(|v| v.to_string())
            .chain(["burn-nn-mha".to_string()])
            .collect();
        for name in names {
            if let Some(m) = median(&name) {
                println!("| {group} | {name} | {m:.1} | {:.3} |", m / standard);
            }
        }
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    forward(&mut c);
    forward_backward::<Autodiff<Flex>>(&mut c);
    c.final_summary();
    print_ratios();
}
