//! The same numbers on every backend. Each model is built on Flex (the reference), its record is
//! copied to the backend under test, and both compute from the same inputs: every attention
//! variant's forward pass (masks, rotary positions, cached decoding), the gradients of every
//! parameter, Burn's fused attention op against the explicit path, the fused linear
//! cross-entropy (with `--features autodiff`), and three training steps of the `tiny` GPT.
//!
//! Backends: NdArray with `--features ndarray`, WGPU with `--features wgpu`, CUDA with
//! `--features cuda`. WGPU needs an adapter (a GPU, or a CPU driver such as Mesa's lavapipe:
//! `apt-get install mesa-vulkan-drivers`); without one its tests print why and return, unless
//! `COUPLED_QK_REQUIRE_WGPU=1` (set by CI), which makes a missing adapter a failure. CUDA alike:
//! without a device that answers its tests print why and return, unless `COUPLED_QK_REQUIRE_CUDA=1`
//! (set by `scripts/gpu_check.sh`). Shapes are small: a CPU Vulkan driver compiles every new kernel.

// Without a backend feature nothing instantiates the checks below.
#![cfg_attr(
    not(any(feature = "ndarray", feature = "wgpu", feature = "cuda")),
    allow(dead_code, unused_imports, unused_macros)
)]

mod common;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Distribution, Int, Tensor, TensorData};
use common::{materialised, max_abs_diff, values};
use coupled_qk::model::{BlockAttention, GptCache, GptConfig, Preset, masked_cross_entropy};
use coupled_qk::{
    AttentionInput, AttentionVariant, CoupledQkAttentionConfig, DifferentialAttentionConfig,
    DynamicsConfig, KvCache, QkDynamics, RotaryConfig, RotaryPosition, StepSizeConfig,
};

/// The reference backend.
type Ref = burn::backend::Flex;
type RefAd = burn::backend::Autodiff<Ref>;

const D_MODEL: usize = 16;
const HEADS: usize = 2;
const BATCH: usize = 2;
const SEQ: usize = 6;

/// Forward passes and cached decoding agree to this (absolute, on outputs of order 1).
const FORWARD_TOL: f64 = 1e-4;
/// Gradients agree to this, relative to the largest gradient of the parameter (at least 1).
const GRAD_TOL: f64 = 1e-4;
/// Training losses agree to this at every step.
const LOSS_TOL: f64 = 1e-3;

/// The variants under test: every dynamics with one and several steps, and differential attention.
fn variants() -> Vec<AttentionVariant> {
    let mut variants: Vec<AttentionVariant> = [
        DynamicsConfig::Standard,
        DynamicsConfig::MlpOnly,
        DynamicsConfig::euler(1),
        DynamicsConfig::euler(3),
        DynamicsConfig::leapfrog(1),
        DynamicsConfig::leapfrog(3),
        DynamicsConfig::affine(2),
        DynamicsConfig::affine_uncoupled(1),
    ]
    .into_iter()
    .map(AttentionVariant::Coupled)
    .collect();
    variants.push(AttentionVariant::differential());
    variants.push(AttentionVariant::Differential(DynamicsConfig::euler(1)));
    variants.push(AttentionVariant::Differential(DynamicsConfig::affine(1)));
    variants
}

/// A causal layer of `variant` on the reference backend, with a `dt` and affine nets large
/// enough that the dynamics change the output visibly.
fn reference_layer(
    variant: &AttentionVariant,
    rotary: Option<RotaryConfig>,
    causal: bool,
    seed: u64,
) -> BlockAttention<Ref> {
    let device = Default::default();
    Ref::seed(&device, seed);
    match variant {
        AttentionVariant::Coupled(dynamics) => {
            let mut layer = CoupledQkAttentionConfig::new(D_MODEL, HEADS)
                .with_dynamics(dynamics.clone())
                .with_dt(StepSizeConfig::new().with_init(0.5))
                .with_rotary(rotary)
                .with_causal(causal)
                .init::<Ref>(&device);
            give_affine_nets_outputs(&mut layer.dynamics, &device);
            materialised(BlockAttention::Coupled(layer))
        }
        AttentionVariant::Differential(dynamics) => {
            let mut layer = DifferentialAttentionConfig::new(D_MODEL, 1)
                .with_dynamics(dynamics.clone())
                .with_dt(StepSizeConfig::new().with_init(0.5))
                .with_rotary(rotary)
                .with_causal(causal)
                .init::<Ref>(&device);
            give_affine_nets_outputs(&mut layer.dynamics, &device);
            materialised(BlockAttention::Differential(layer))
        }
    }
}

/// The affine coupling starts as the identity: give its nets output layers.
fn give_affine_nets_outputs<B: Backend>(dynamics: &mut QkDynamics<B>, device: &B::Device) {
    if let QkDynamics::Affine(affine) = dynamics {
        for l in &mut affine.layers {
            for net in [
                &mut l.key_scale,
                &mut l.key_shift,
                &mut l.query_scale,
                &mut l.query_shift,
            ] {
                let dist = Distribution::Uniform(-0.3, 0.3);
                net.w2 = Param::from_tensor(Tensor::random(net.w2.dims(), dist, device));
                net.b2 = Param::from_tensor(Tensor::random(net.b2.dims(), dist, device));
            }
        }
    }
}

/// The same architecture initialised (randomly) on another backend.
fn empty_layer<B: Backend>(
    variant: &AttentionVariant,
    rotary: Option<RotaryConfig>,
    causal: bool,
    device: &B::Device,
) -> BlockAttention<B> {
    match variant {
        AttentionVariant::Coupled(dynamics) => BlockAttention::Coupled(
            CoupledQkAttentionConfig::new(D_MODEL, HEADS)
                .with_dynamics(dynamics.clone())
                .with_rotary(rotary)
                .with_causal(causal)
                .init(device),
        ),
        AttentionVariant::Differential(dynamics) => BlockAttention::Differential(
            DifferentialAttentionConfig::new(D_MODEL, 1)
                .with_dynamics(dynamics.clone())
                .with_rotary(rotary)
                .with_causal(causal)
                .init(device),
        ),
    }
}

/// `to` with the weights of `from`, through Burn's recorder (full precision), as a checkpoint
/// written on one backend and read on another would be.
fn copy_weights<A: Backend, B: Backend, M: Module<A>, N: Module<B>>(
    from: M,
    to: N,
    device: &B::Device,
) -> N {
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = Recorder::<A>::record(&recorder, from.into_record(), ()).expect("record");
    let record: N::Record = Recorder::<B>::load(&recorder, bytes, device).expect("load record");
    to.load_record(record)
}

/// A tensor with the values of `t`, on another backend.
fn move_to<A: Backend, B: Backend, const D: usize, K>(
    t: Tensor<A, D, K>,
    device: &B::Device,
) -> Tensor<B, D, K>
where
    K: burn::tensor::TensorKind<A> + burn::tensor::TensorKind<B> + burn::tensor::BasicOps<A>,
    K: burn::tensor::BasicOps<B>,
{
    Tensor::from_data(t.into_data(), device)
}

fn input(seed: u64) -> Tensor<Ref, 3> {
    let device = Default::default();
    Ref::seed(&device, seed);
    Tensor::random(
        [BATCH, SEQ, D_MODEL],
        Distribution::Normal(0.0, 1.0),
        &device,
    )
}

/// A padding mask and an attention mask, each optional.
type Masks = (Option<Tensor<Ref, 2, Bool>>, Option<Tensor<Ref, 3, Bool>>);

/// Padding: the second sequence's last two positions are padding (`true` = masked out).
fn padding() -> Tensor<Ref, 2, Bool> {
    let mut pad = vec![false; BATCH * SEQ];
    pad[2 * SEQ - 2..].fill(true);
    Tensor::from_data(TensorData::new(pad, [BATCH, SEQ]), &Default::default())
}

/// An attention mask hiding a few (query, key) pairs, no row fully.
fn attention_mask() -> Tensor<Ref, 3, Bool> {
    let mask: Vec<bool> = (0..BATCH * SEQ * SEQ)
        .map(|i| i % 5 == 1 && i % SEQ != i / SEQ % SEQ)
        .collect();
    Tensor::from_data(
        TensorData::new(mask, [BATCH, SEQ, SEQ]),
        &Default::default(),
    )
}

/// The layer's forward pass with optional masks.
fn forward<B: Backend>(
    layer: &BlockAttention<B>,
    x: Tensor<B, 3>,
    pad: Option<Tensor<B, 2, Bool>>,
    attn: Option<Tensor<B, 3, Bool>>,
) -> Tensor<B, 3> {
    let mut input = AttentionInput::new(x);
    if let Some(pad) = pad {
        input = input.mask_pad(pad);
    }
    if let Some(attn) = attn {
        input = input.mask_attn(attn);
    }
    match layer {
        BlockAttention::Coupled(layer) => layer.forward(input),
        BlockAttention::Differential(layer) => layer.forward(input),
    }
}

/// The largest difference, after checking it against `tol`.
fn assert_close(reference: Vec<f64>, other: Vec<f64>, tol: f64, what: &str) -> f64 {
    let err = max_abs_diff(&reference, &other);
    assert!(
        err <= tol,
        "{what}: max |Δ| = {err:e} > {tol:e} against Flex"
    );
    err
}

/// One line on stderr, outside the test harness's capture: the largest difference a check saw.
fn report<B: Backend>(device: &B::Device, check: &str, worst: f64) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "{}: {check}: largest difference to Flex {worst:.1e}",
        B::name(device)
    );
}

/// Every float parameter's gradient, in the module's visiting order (the same on every backend).
struct Gradients<'a, B: AutodiffBackend> {
    grads: &'a B::Gradients,
    found: Vec<Option<Vec<f64>>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Gradients<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.found.push(param.val().grad(self.grads).map(values));
    }
}

fn gradients<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &B::Gradients,
) -> Vec<Option<Vec<f64>>> {
    let mut visitor = Gradients {
        grads,
        found: Vec::new(),
    };
    module.visit(&mut visitor);
    visitor.found
}

// ---------------------------------------------------------------------------------------------
// The checks, generic over the backend under test.

/// Every variant, causal or not, with padding and attention masks and rotary positions before and
/// after the dynamics: the forward pass equals Flex's.
fn check_forward<B: Backend>(device: &B::Device) {
    let mut worst = 0.0f64;
    let rotaries = [
        None,
        Some(RotaryConfig::new(SEQ).with_position(RotaryPosition::BeforeDynamics)),
        Some(RotaryConfig::new(SEQ).with_position(RotaryPosition::AfterDynamics)),
    ];
    for (v, variant) in variants().iter().enumerate() {
        for (r, rotary) in rotaries.iter().enumerate() {
            let no_dynamics = variant.dynamics() == &DynamicsConfig::Standard;
            if r == 1 && no_dynamics {
                continue; // the rotary position matters only with dynamics
            }
            for causal in [true, false] {
                let seed = 100 * v as u64 + 10 * r as u64 + causal as u64;
                let reference = reference_layer(variant, rotary.clone(), causal, seed);
                let layer = copy_weights(
                    reference.clone(),
                    empty_layer::<B>(variant, rotary.clone(), causal, device),
                    device,
                );
                let x = input(seed + 1);
                let masks: [Masks; 3] = [
                    (None, None),
                    (Some(padding()), None),
                    (None, Some(attention_mask())),
                ];
                for (m, (pad, attn)) in masks.into_iter().enumerate() {
                    let expected = forward(&reference, x.clone(), pad.clone(), attn.clone());
                    let got = forward(
                        &layer,
                        move_to(x.clone(), device),
                        pad.map(|p| move_to(p, device)),
                        attn.map(|a| move_to(a, device)),
                    );
                    worst = worst.max(assert_close(
                        values(expected),
                        values(got),
                        FORWARD_TOL,
                        &format!("{variant}, rotary {r}, causal {causal}, masks {m}: forward"),
                    ));
                }
            }
        }
    }
    report::<B>(
        device,
        "forward of every variant, with masks and rotary",
        worst,
    );
}

/// The comparison sees a small change: `dt` moved by 0.01 on the backend under test is caught.
fn check_sensitivity<B: Backend>(device: &B::Device) {
    let variant = AttentionVariant::Coupled(DynamicsConfig::euler(1));
    let reference = reference_layer(&variant, None, true, 1);
    let mut layer = copy_weights(
        reference.clone(),
        empty_layer::<B>(&variant, None, true, device),
        device,
    );
    let BlockAttention::Coupled(coupled) = &mut layer else {
        unreachable!()
    };
    let QkDynamics::Coupled(dynamics) = &mut coupled.dynamics else {
        unreachable!()
    };
    let dt = &mut dynamics.step_size.dt;
    *dt = Param::from_tensor(dt.val().add_scalar(0.01));
    let x = input(2);
    let expected = values(forward(&reference, x.clone(), None, None));
    let got = values(forward(&layer, move_to(x, device), None, None));
    let err = max_abs_diff(&expected, &got);
    assert!(
        err > FORWARD_TOL,
        "a dt off by 0.01 changes the output by only {err:e}: the forward comparison could not see it"
    );
}

/// Decoding through the cache, in chunks of 1, 2 and 3 positions, equals Flex's full pass.
fn check_cached_decoding<B: Backend>(device: &B::Device) {
    let mut worst = 0.0f64;
    let rotary = Some(RotaryConfig::new(SEQ));
    for (v, variant) in variants().iter().enumerate() {
        let seed = 7 + v as u64;
        let reference = reference_layer(variant, rotary.clone(), true, seed);
        let layer = copy_weights(
            reference.clone(),
            empty_layer::<B>(variant, rotary.clone(), true, device),
            device,
        );
        let x = input(seed + 1);
        let expected = values(forward(&reference, x.clone(), None, None));
        let x = move_to::<Ref, B, 3, burn::tensor::Float>(x, device);
        let mut cache = KvCache::new();
        let mut outputs = Vec::new();
        let mut start = 0;
        for chunk in [1, 2, 3] {
            let part = x
                .clone()
                .slice([0..BATCH, start..start + chunk, 0..D_MODEL]);
            let out = match &layer {
                BlockAttention::Coupled(layer) => layer.forward_cache(part, &mut cache),
                BlockAttention::Differential(layer) => layer.forward_cache(part, &mut cache),
            };
            outputs.push(out);
            start += chunk;
        }
        assert_eq!(start, SEQ);
        let got = values(Tensor::cat(outputs, 1));
        worst = worst.max(assert_close(
            expected,
            got,
            FORWARD_TOL,
            &format!("{variant}: cached decoding"),
        ));
    }
    report::<B>(device, "cached decoding of every variant", worst);
}

/// Under autodiff, the gradient of every parameter (`dt`, the coupling and affine nets, λ of
/// differential attention, the projections) and of the input equals Flex's.
fn check_gradients<B: AutodiffBackend>(device: &B::Device) {
    let mut worst = 0.0f64;
    for (v, variant) in variants().iter().enumerate() {
        let seed = 31 + v as u64;
        let rotary = Some(RotaryConfig::new(SEQ));
        let reference = reference_layer(variant, rotary.clone(), true, seed);
        let weights = input(seed + 1); // the loss is Σ output ⊙ weights
        let x = input(seed + 2);

        let on_ref: BlockAttention<RefAd> = copy_weights(
            reference.clone(),
            empty_layer::<RefAd>(variant, rotary.clone(), true, &Default::default()),
            &Default::default(),
        );
        let x_ref = move_to::<Ref, RefAd, 3, burn::tensor::Float>(x.clone(), &Default::default())
            .require_grad();
        let loss = (forward(
            &on_ref,
            x_ref.clone(),
            Some(move_to(padding(), &Default::default())),
            None,
        ) * move_to::<Ref, RefAd, 3, burn::tensor::Float>(
            weights.clone(),
            &Default::default(),
        ))
        .sum();
        let grads_ref = loss.backward();
        let expected = gradients(&on_ref, &grads_ref);
        let expected_x = values(x_ref.grad(&grads_ref).expect("input gradient"));

        let layer = copy_weights(
            reference,
            empty_layer::<B>(variant, rotary, true, device),
            device,
        );
        let x_b = move_to::<Ref, B, 3, burn::tensor::Float>(x, device).require_grad();
        let loss = (forward(&layer, x_b.clone(), Some(move_to(padding(), device)), None)
            * move_to::<Ref, B, 3, burn::tensor::Float>(weights, device))
        .sum();
        let grads = loss.backward();
        let got = gradients(&layer, &grads);
        let got_x = values(x_b.grad(&grads).expect("input gradient"));

        worst = worst.max(assert_close(
            expected_x,
            got_x,
            GRAD_TOL,
            &format!("{variant}: input gradient"),
        ));
        assert_eq!(expected.len(), got.len(), "{variant}: parameter count");
        for (i, (e, g)) in expected.into_iter().zip(got).enumerate() {
            let (Some(e), Some(g)) = (e, g) else {
                panic!("{variant}: parameter {i} has a gradient on one backend only");
            };
            let scale = e.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            worst = worst.max(
                assert_close(
                    e,
                    g,
                    GRAD_TOL * scale,
                    &format!("{variant}: gradient of parameter {i}"),
                ) / scale,
            );
        }
    }
    report::<B>(
        device,
        "gradients (relative to the largest of each parameter)",
        worst,
    );
}

/// Without autodiff the layers score with Burn's fused `attention` op; under autodiff, explicitly.
/// Both paths, on the backend under test, give the same output.
fn check_fused_against_explicit<B: AutodiffBackend>(device: &B::Device) {
    let mut worst = 0.0f64;
    for (v, variant) in variants().iter().enumerate() {
        for causal in [true, false] {
            let seed = 57 + 2 * v as u64 + causal as u64;
            let reference = reference_layer(variant, None, causal, seed);
            let fused = copy_weights(
                reference.clone(),
                empty_layer::<B::InnerBackend>(variant, None, causal, device),
                device,
            );
            let explicit = copy_weights(
                reference,
                empty_layer::<B>(variant, None, causal, device),
                device,
            );
            let x = input(seed + 1);
            for (pad, what) in [(None, "no mask"), (Some(padding()), "padding")] {
                let a = forward(
                    &fused,
                    move_to(x.clone(), device),
                    pad.clone().map(|p| move_to(p, device)),
                    None,
                );
                let b = forward(
                    &explicit,
                    move_to(x.clone(), device),
                    pad.map(|p| move_to(p, device)),
                    None,
                );
                worst = worst.max(assert_close(
                    values(a),
                    values(b),
                    FORWARD_TOL,
                    &format!(
                        "{variant}, causal {causal}, {what}: fused op against explicit scores"
                    ),
                ));
            }
        }
    }
    report::<B>(
        device,
        "fused attention op against explicit scores (both on this backend)",
        worst,
    );
}

/// Three AdamW steps of the `tiny` GPT from the same weights on the same batches: the loss of
/// every step equals Flex's.
fn check_training_steps<B: AutodiffBackend>(device: &B::Device) {
    const VOCAB: usize = 64;
    const SEQ_LEN: usize = 16;
    let config = GptConfig::preset(Preset::Tiny, VOCAB)
        .with_attention(AttentionVariant::Coupled(DynamicsConfig::euler(1)));
    let ref_device = Default::default();
    RefAd::seed(&ref_device, 3);
    let reference = materialised(config.init::<RefAd>(&ref_device));
    let model = copy_weights(reference.clone(), config.init::<B>(device), device);

    let batches: Vec<Vec<i64>> = (0..3)
        .map(|step| {
            (0..BATCH * (SEQ_LEN + 1))
                .map(|i| ((i * 7 + step * 13 + i * i) % VOCAB) as i64)
                .collect()
        })
        .collect();
    let expected = train(reference, &batches, SEQ_LEN, &ref_device);
    let got = train(model, &batches, SEQ_LEN, device);
    let mut worst = 0.0f64;
    for (step, (e, g)) in expected.iter().zip(&got).enumerate() {
        assert!(
            (e - g).abs() <= LOSS_TOL,
            "training step {step}: loss {g} against Flex's {e}"
        );
        worst = worst.max((e - g).abs());
    }
    report::<B>(device, "losses of three training steps", worst);
}

/// The losses of AdamW steps, one per batch of `[BATCH, seq + 1]` tokens.
fn train<B: AutodiffBackend>(
    mut model: coupled_qk::model::Gpt<B>,
    batches: &[Vec<i64>],
    seq: usize,
    device: &B::Device,
) -> Vec<f64> {
    let mut optimizer = AdamWConfig::new().init();
    let mut losses = Vec::new();
    for batch in batches {
        let tokens = Tensor::<B, 2, Int>::from_data(
            TensorData::new(batch.clone(), [BATCH, seq + 1]),
            device,
        );
        let inputs = tokens.clone().slice([0..BATCH, 0..seq]);
        let targets = tokens.slice([0..BATCH, 1..seq + 1]).reshape([BATCH * seq]);
        let logits = model.forward(inputs); // [BATCH, seq, vocab]
        let vocab = logits.dims()[2];
        let loss = masked_cross_entropy(
            logits.reshape([BATCH * seq, vocab]),
            targets,
            Tensor::ones([BATCH * seq], device),
        );
        losses.push(values(loss.clone())[0]);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(1e-2, model, grads);
    }
    losses
}

/// Within float rounding of each other on one backend: flash and explicit scoring compute the
/// same function in another order (relative to the largest value of each compared tensor, at
/// least 1).
#[cfg(feature = "autodiff")]
const FLASH_TOL: f64 = 1e-5;

/// Under autodiff the flash kernel gives the explicit kernel's outputs and gradients (input and
/// every parameter) on the backend under test: every variant, causal and not, with padding and
/// attention masks, rotary positions after the dynamics (causal) and before them (not causal).
#[cfg(feature = "autodiff")]
fn check_flash_against_explicit<B: coupled_qk::attention::FlashAttention>(device: &B::Device) {
    use coupled_qk::AttentionKernel;
    coupled_qk::attention::register_flash_attention::<B>();
    let mut worst = 0.0f64;
    for (v, variant) in variants().iter().enumerate() {
        for (causal, position) in [
            (true, RotaryPosition::AfterDynamics),
            (false, RotaryPosition::BeforeDynamics),
        ] {
            let seed = 71 + v as u64;
            let rotary = Some(RotaryConfig::new(SEQ).with_position(position));
            let reference = reference_layer(variant, rotary.clone(), causal, seed);
            let layer = copy_weights(
                reference,
                empty_layer::<B>(variant, rotary, causal, device),
                device,
            );
            let (x, weights) = (input(seed + 1), input(seed + 2));
            let run = |kernel: AttentionKernel| {
                let layer = layer.clone().with_kernel(kernel);
                let x = move_to::<Ref, B, 3, burn::tensor::Float>(x.clone(), device).require_grad();
                let out = forward(
                    &layer,
                    x.clone(),
                    Some(move_to(padding(), device)),
                    Some(move_to(attention_mask(), device)),
                );
                let weights = move_to::<Ref, B, 3, burn::tensor::Float>(weights.clone(), device);
                let grads = (out.clone() * weights).sum().backward();
                let mut all = vec![Some(values(out)), x.grad(&grads).map(values)];
                all.extend(gradients(&layer, &grads));
                all
            };
            let (explicit, flash) = (run(AttentionKernel::Explicit), run(AttentionKernel::Flash));
            assert_eq!(explicit.len(), flash.len());
            for (i, (e, f)) in explicit.into_iter().zip(flash).enumerate() {
                let what = match i {
                    0 => "output".to_string(),
                    1 => "input gradient".to_string(),
                    i => format!("gradient of parameter {}", i - 2),
                };
                let (Some(e), Some(f)) = (e, f) else {
                    panic!("{variant}: {what} exists with one kernel only");
                };
                let scale = e.iter().fold(1.0f64, |m, x| m.max(x.abs()));
                let err = max_abs_diff(&e, &f);
                assert!(
                    err <= FLASH_TOL * scale,
                    "{variant} (causal {causal}): {what}: flash differs from explicit by {err:e} > {:e}",
                    FLASH_TOL * scale
                );
                worst = worst.max(err / scale);
            }
        }
    }
    report::<B>(
        device,
        "flash kernel against explicit, outputs and gradients (same backend, relative)",
        worst,
    );
}

/// Three AdamW steps of the `tiny` GPT (Euler and differential+Euler attention) give the same
/// losses with the flash kernel as with the explicit one, on the backend under test, within
/// [`LOSS_TOL`]: AdamW's first steps move every weight by about the learning rate whatever the
/// gradient's size, so rounding differences of 1e-6 grow to ~1e-4 in the loss by the third step
/// (measured on NdArray).
#[cfg(feature = "autodiff")]
fn check_training_steps_with_flash<B: coupled_qk::attention::FlashAttention>(device: &B::Device) {
    use coupled_qk::AttentionKernel;
    const VOCAB: usize = 64;
    const SEQ_LEN: usize = 16;
    coupled_qk::attention::register_flash_attention::<B>();
    let batches: Vec<Vec<i64>> = (0..3)
        .map(|step| {
            (0..BATCH * (SEQ_LEN + 1))
                .map(|i| ((i * 5 + step * 11 + i * i) % VOCAB) as i64)
                .collect()
        })
        .collect();
    let mut worst = 0.0f64;
    for variant in [
        AttentionVariant::Coupled(DynamicsConfig::euler(1)),
        AttentionVariant::Differential(DynamicsConfig::euler(1)),
    ] {
        let config = GptConfig::preset(Preset::Tiny, VOCAB).with_attention(variant.clone());
        let ref_device = Default::default();
        RefAd::seed(&ref_device, 5);
        let reference = materialised(config.init::<RefAd>(&ref_device));
        let model = copy_weights(reference, config.init::<B>(device), device);
        let explicit = train(model.clone(), &batches, SEQ_LEN, device);
        let flash = train(
            model.with_attention_kernel(AttentionKernel::Flash),
            &batches,
            SEQ_LEN,
            device,
        );
        for (step, (e, f)) in explicit.iter().zip(&flash).enumerate() {
            let err = (e - f).abs();
            assert!(
                err <= LOSS_TOL,
                "{variant}: training step {step}: loss {f} with the flash kernel, {e} with the explicit one"
            );
            worst = worst.max(err);
        }
    }
    report::<B>(
        device,
        "losses of three training steps, flash kernel against explicit (same backend)",
        worst,
    );
}

/// The fused linear cross-entropy (chunks of 3 rows over 10, a weight mask, a bias): its loss and
/// the gradients of the hidden states, head and bias on the backend under test equal Flex's.
#[cfg(feature = "autodiff")]
fn check_fused_linear_cross_entropy<B: coupled_qk::model::FusedLoss>(device: &B::Device) {
    let mut worst = 0.0f64;
    // One draw for both backends: the global seed is shared with the tests running at once.
    let on_ref = Default::default();
    Ref::seed(&on_ref, 3);
    let normal = Distribution::Normal(0.0, 1.5);
    let inputs = [
        [ROWS_FUSED, D_MODEL],
        [VOCAB_FUSED, D_MODEL],
        [1, VOCAB_FUSED],
    ]
    .map(|shape| Tensor::<Ref, 2>::random(shape, normal, &on_ref));
    let expected = fused_loss_outputs::<RefAd>(&inputs, &Default::default());
    let got = fused_loss_outputs::<B>(&inputs, device);
    for (i, (e, g)) in expected.into_iter().zip(got).enumerate() {
        let scale = e.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        worst = worst.max(
            assert_close(
                e,
                g,
                GRAD_TOL * scale,
                &format!("fused linear cross-entropy: output {i}"),
            ) / scale,
        );
    }
    report::<B>(
        device,
        "fused linear cross-entropy (relative to the largest of each output)",
        worst,
    );
}

/// Rows and vocabulary of the fused linear cross-entropy's parity check.
#[cfg(feature = "autodiff")]
const ROWS_FUSED: usize = 10;
#[cfg(feature = "autodiff")]
const VOCAB_FUSED: usize = 13;

/// The loss and the gradients of hidden states, head and bias of the fused linear cross-entropy
/// on `device`, from the same values (drawn on Flex) whatever the backend.
#[cfg(feature = "autodiff")]
fn fused_loss_outputs<B: coupled_qk::model::FusedLoss>(
    inputs: &[Tensor<Ref, 2>; 3],
    device: &B::Device,
) -> Vec<Vec<f64>> {
    use burn::tensor::Float;
    use coupled_qk::model::fused_linear_cross_entropy;
    const ROWS: usize = ROWS_FUSED;
    const VOCAB: usize = VOCAB_FUSED;
    let to = |t: &Tensor<Ref, 2>| move_to::<Ref, B, 2, Float>(t.clone(), device).require_grad();
    let (hidden, head) = (to(&inputs[0]), to(&inputs[1]));
    let bias =
        move_to::<Ref, B, 1, Float>(inputs[2].clone().reshape([VOCAB]), device).require_grad();
    let targets: Vec<i64> = (0..ROWS).map(|i| ((i * 5 + 2) % VOCAB) as i64).collect();
    let weight: Vec<f32> = (0..ROWS).map(|i| [0.0, 0.5, 1.0][i % 3]).collect();
    let loss = fused_linear_cross_entropy(
        hidden.clone(),
        head.clone(),
        Some(bias.clone()),
        Tensor::from_data(TensorData::new(targets, [ROWS]), device),
        Some(Tensor::from_data(TensorData::new(weight, [ROWS]), device)),
        3,
    );
    let grads = loss.backward();
    vec![
        values(loss),
        values(hidden.grad(&grads).expect("hidden gradient")),
        values(head.grad(&grads).expect("head gradient")),
        values(bias.grad(&grads).expect("bias gradient")),
    ]
}

/// The GPT's cached decoding on the backend under test equals Flex's full pass, for every variant.
fn check_gpt_cached_decoding<B: Backend>(device: &B::Device) {
    let mut worst = 0.0f64;
    const VOCAB: usize = 32;
    for variant in variants() {
        let config = GptConfig::new(VOCAB, D_MODEL, 2, HEADS, 8).with_attention(variant.clone());
        Ref::seed(&Default::default(), 5);
        let reference = materialised(config.init::<Ref>(&Default::default()));
        let model = copy_weights(reference.clone(), config.init::<B>(device), device);
        let tokens: Vec<i64> = (0..BATCH * SEQ)
            .map(|i| ((i * 5 + 3) % VOCAB) as i64)
            .collect();
        let tokens = TensorData::new(tokens, [BATCH, SEQ]);
        let expected =
            values(reference.forward(Tensor::from_data(tokens.clone(), &Default::default())));
        let tokens = Tensor::<B, 2, Int>::from_data(tokens, device);
        let mut cache = GptCache::new();
        let logits: Vec<_> = (0..SEQ)
            .map(|i| model.forward_cache(tokens.clone().slice([0..BATCH, i..i + 1]), &mut cache))
            .collect();
        let got = values(Tensor::cat(logits, 1));
        worst = worst.max(assert_close(
            expected,
            got,
            FORWARD_TOL,
            &format!("{variant}: GPT cached decoding"),
        ));
    }
    report::<B>(device, "GPT cached decoding of every variant", worst);
}

// ---------------------------------------------------------------------------------------------
// The backends.

/// One test per check for a backend, skipped (with a line on stderr) when `device` is `None`.
macro_rules! backend_tests {
    ($name:ident, $backend:ty, $device:expr) => {
        mod $name {
            use super::*;
            type B = $backend;
            type Ad = burn::backend::Autodiff<B>;

            #[test]
            fn forward_of_every_variant_with_masks_and_rotary_equals_flex() {
                if let Some(device) = $device {
                    check_sensitivity::<B>(&device);
                    check_forward::<B>(&device);
                }
            }

            #[test]
            fn cached_decoding_of_every_variant_equals_flex_full_pass() {
                if let Some(device) = $device {
                    check_cached_decoding::<B>(&device);
                }
            }

            #[test]
            fn gpt_cached_decoding_of_every_variant_equals_flex_full_pass() {
                if let Some(device) = $device {
                    check_gpt_cached_decoding::<B>(&device);
                }
            }

            #[test]
            fn gradients_of_every_parameter_equal_flex() {
                if let Some(device) = $device {
                    check_gradients::<Ad>(&device);
                }
            }

            #[test]
            fn fused_attention_op_equals_explicit_scores() {
                if let Some(device) = $device {
                    check_fused_against_explicit::<Ad>(&device);
                }
            }

            #[cfg(feature = "autodiff")]
            #[test]
            fn fused_linear_cross_entropy_equals_flex() {
                if let Some(device) = $device {
                    check_fused_linear_cross_entropy::<Ad>(&device);
                }
            }

            #[cfg(feature = "autodiff")]
            #[test]
            fn flash_kernel_equals_explicit_scoring() {
                if let Some(device) = $device {
                    check_flash_against_explicit::<Ad>(&device);
                    check_training_steps_with_flash::<Ad>(&device);
                }
            }

            #[test]
            fn three_training_steps_of_the_tiny_gpt_equal_flex() {
                if let Some(device) = $device {
                    check_training_steps::<Ad>(&device);
                }
            }
        }
    };
}

/// Flex, the reference backend, has the flash kernel too.
#[cfg(feature = "autodiff")]
#[test]
fn flex_flash_kernel_equals_explicit_scoring() {
    check_flash_against_explicit::<RefAd>(&Default::default());
    check_training_steps_with_flash::<RefAd>(&Default::default());
}

#[cfg(feature = "ndarray")]
backend_tests!(
    ndarray,
    burn::backend::NdArray,
    Some(burn::backend::ndarray::NdArrayDevice::Cpu)
);

#[cfg(feature = "wgpu")]
backend_tests!(wgpu, burn::backend::Wgpu, wgpu_adapter::device());

#[cfg(feature = "cuda")]
backend_tests!(cuda, burn::backend::Cuda, cuda_device::device());

#[cfg(not(feature = "ndarray"))]
#[test]
#[ignore = "NdArray is not compiled: run with `--features ndarray`"]
fn ndarray_parity() {}

#[cfg(not(feature = "wgpu"))]
#[test]
#[ignore = "WGPU is not compiled: run with `--features wgpu` (and a Vulkan driver)"]
fn wgpu_parity() {}

/// The first line of a caught panic's message: why a backend's probe failed.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn panic_line(payload: &(dyn std::any::Any + Send)) -> String {
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("no detail");
    message.lines().next().unwrap_or("").to_string()
}

#[cfg(feature = "wgpu")]
mod wgpu_adapter {
    use burn::backend::wgpu::{RuntimeOptions, WgpuDevice, graphics::AutoGraphicsApi, init_setup};
    use std::io::Write;
    use std::sync::OnceLock;

    /// WGPU's default device once it has an adapter; `None` (with a line on stderr, outside the
    /// test harness's capture) when there is none, or a panic when `COUPLED_QK_REQUIRE_WGPU=1`.
    pub fn device() -> Option<WgpuDevice> {
        static ADAPTER: OnceLock<Result<String, String>> = OnceLock::new();
        let adapter = ADAPTER.get_or_init(|| {
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(|_| {}));
            let setup = std::panic::catch_unwind(|| {
                init_setup::<AutoGraphicsApi>(&WgpuDevice::DefaultDevice, RuntimeOptions::default())
            });
            std::panic::set_hook(hook);
            match setup {
                Ok(setup) => {
                    let info = setup.adapter.get_info();
                    let line =
                        format!("{} ({:?}, {:?})", info.name, info.device_type, info.backend);
                    let _ = writeln!(std::io::stderr(), "WGPU parity tests on {line}");
                    Ok(line)
                }
                Err(payload) => Err(super::panic_line(payload.as_ref())),
            }
        });
        match adapter {
            Ok(_) => Some(WgpuDevice::DefaultDevice),
            Err(why) if std::env::var("COUPLED_QK_REQUIRE_WGPU").as_deref() == Ok("1") => panic!(
                "COUPLED_QK_REQUIRE_WGPU=1 but WGPU has no adapter ({why}): install a Vulkan driver \
                 (Debian: apt-get install mesa-vulkan-drivers libvulkan1)"
            ),
            Err(why) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "skipped: WGPU has no adapter ({why}); install a Vulkan driver, e.g. \
                     mesa-vulkan-drivers, to run the WGPU parity tests"
                );
                None
            }
        }
    }
}

#[cfg(feature = "cuda")]
mod cuda_device {
    use burn::backend::Cuda;
    use burn::backend::cuda::CudaDevice;
    use burn::tensor::Tensor;
    use std::io::Write;
    use std::sync::OnceLock;

    /// CUDA's default device once a first op runs on it; `None` (with a line on stderr) when it
    /// does not, or a panic when `COUPLED_QK_REQUIRE_CUDA=1`.
    pub fn device() -> Option<CudaDevice> {
        static STARTED: OnceLock<Result<(), String>> = OnceLock::new();
        let started = STARTED.get_or_init(|| {
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(|_| {}));
            let probe = std::panic::catch_unwind(|| {
                Tensor::<Cuda, 1>::ones([1], &CudaDevice::default()).into_data();
            });
            std::panic::set_hook(hook);
            probe.map_err(|payload| super::panic_line(payload.as_ref()))
        });
        match started {
            Ok(()) => Some(CudaDevice::default()),
            Err(why) if std::env::var("COUPLED_QK_REQUIRE_CUDA").as_deref() == Ok("1") => panic!(
                "COUPLED_QK_REQUIRE_CUDA=1 but CUDA does not start ({why}): check the driver \
                 (nvidia-smi) and that libnvrtc can be loaded"
            ),
            Err(why) => {
                let _ = writeln!(std::io::stderr(), "skipped: CUDA does not start ({why})");
                None
            }
        }
    }
}
