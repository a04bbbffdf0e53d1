//! The attention layer: baselines as special cases, causality, the cache, masks, bad input.

mod common;

use burn::module::{Module, Param};
use burn::tensor::{Bool, Distribution, Tensor};
use common::*;
use coupled_qk::integrator::{Integrator, PhaseSpace};
use coupled_qk::{
    AttentionInput, CoupledQkAttention, CoupledQkAttentionConfig, CoupledQkCache, DynamicsConfig,
    Identity, QkDynamics, RotaryConfig, RotaryPosition, StepSizeConfig,
};
use proptest::prelude::*;
use std::sync::Arc;

type B = Cpu;

fn random(shape: [usize; 3], seed: u64) -> Tensor<B, 3> {
    use burn::tensor::backend::Backend;
    let device = Default::default();
    B::seed(&device, seed);
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), &device)
}

fn variants() -> Vec<DynamicsConfig> {
    vec![
        DynamicsConfig::Standard,
        DynamicsConfig::MlpOnly,
        DynamicsConfig::euler(1),
        DynamicsConfig::euler(2),
        DynamicsConfig::leapfrog(1),
        DynamicsConfig::leapfrog(3),
        DynamicsConfig::affine(2),
        DynamicsConfig::affine_uncoupled(1),
    ]
}

fn rotaries() -> Vec<Option<RotaryConfig>> {
    vec![
        None,
        Some(RotaryConfig::new(64).with_position(RotaryPosition::BeforeDynamics)),
        Some(RotaryConfig::new(64).with_position(RotaryPosition::AfterDynamics)),
    ]
}

/// A layer with a large enough dt that the dynamics visibly matter.
fn layer(
    dynamics: DynamicsConfig,
    rotary: Option<RotaryConfig>,
    seed: u64,
) -> CoupledQkAttention<B> {
    use burn::tensor::backend::Backend;
    let device = Default::default();
    B::seed(&device, seed);
    let mut layer = CoupledQkAttentionConfig::new(16, 2)
        .with_dynamics(dynamics)
        .with_dt(StepSizeConfig::new().with_init(0.7))
        .with_rotary(rotary)
        .with_causal(true)
        .init(&device);
    // The affine coupling starts as the identity: give its nets output layers.
    if let QkDynamics::Affine(affine) = &mut layer.dynamics {
        for l in &mut affine.layers {
            for net in [
                &mut l.key_scale,
                &mut l.key_shift,
                &mut l.query_scale,
                &mut l.query_shift,
            ] {
                let dist = burn::tensor::Distribution::Uniform(-0.3, 0.3);
                net.w2 = Param::from_tensor(Tensor::random(net.w2.dims(), dist, &device));
                net.b2 = Param::from_tensor(Tensor::random(net.b2.dims(), dist, &device));
            }
        }
    }
    layer
}

/// The same projections with standard attention.
fn as_standard(layer: &CoupledQkAttention<B>) -> CoupledQkAttention<B> {
    CoupledQkAttention {
        dynamics: QkDynamics::Standard(Identity),
        ..layer.clone()
    }
}

fn assert_equal(a: Tensor<B, 3>, b: Tensor<B, 3>) {
    a.into_data().assert_eq(&b.into_data(), true);
}

fn assert_close(a: Tensor<B, 3>, b: Tensor<B, 3>, tol: f64, what: &str) {
    let (a, b) = (values(a), values(b));
    let err = max_abs_diff(&a, &b);
    assert!(err < tol, "{what}: max |Δ| = {err}");
}

// ---------------------------------------------------------------------------------------------
// Baselines as special cases.

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// dt = 0 turns every coupled variant into standard attention, exactly.
    #[test]
    fn zero_dt_is_standard_attention(seed in 0u64..1000, batch in 1usize..3, seq in 1usize..9, steps in 1usize..4) {
        for integrator in [DynamicsConfig::euler(steps), DynamicsConfig::leapfrog(steps)] {
            let mut coupled = layer(integrator, None, seed);
            let QkDynamics::Coupled(dynamics) = &mut coupled.dynamics else { unreachable!() };
            let dt = &mut dynamics.step_size;
            dt.dt = Param::from_tensor(dt.dt.val().zeros_like());
            let x = random([batch, seq, 16], seed + 1);
            assert_equal(coupled.forward(x.clone()), as_standard(&coupled).forward(x));
        }
    }

    /// MLP-only with a zeroed output layer is standard attention, exactly.
    #[test]
    fn mlp_only_with_zero_output_layer_is_standard_attention(seed in 0u64..1000, seq in 1usize..9) {
        let mut mlp = layer(DynamicsConfig::MlpOnly, None, seed);
        let QkDynamics::MlpOnly(net) = &mut mlp.dynamics else { unreachable!() };
        net.w2 = Param::from_tensor(net.w2.val().zeros_like());
        net.b2 = Param::from_tensor(net.b2.val().zeros_like());
        let x = random([2, seq, 16], seed + 1);
        assert_equal(mlp.forward(x.clone()), as_standard(&mlp).forward(x));
    }

    /// The affine coupling and its uncoupled control as initialised (zero output layers) are
    /// standard attention, exactly.
    #[test]
    fn a_fresh_affine_coupling_is_standard_attention(seed in 0u64..1000, seq in 1usize..9, layers in 1usize..3) {
        use burn::tensor::backend::Backend;
        let device = Default::default();
        for dynamics in [DynamicsConfig::affine(layers), DynamicsConfig::affine_uncoupled(layers)] {
            B::seed(&device, seed);
            let affine = CoupledQkAttentionConfig::new(16, 2)
                .with_dynamics(dynamics)
                .with_causal(true)
                .init::<B>(&device);
            let x = random([2, seq, 16], seed + 1);
            assert_equal(affine.forward(x.clone()), as_standard(&affine).forward(x));
        }
    }

    /// With the causal mask, the output at t does not depend on tokens after t.
    #[test]
    fn outputs_do_not_depend_on_the_future(seed in 0u64..1000, seq in 2usize..10, cut in 0usize..9) {
        let t = cut % (seq - 1); // 0..seq-1: at least one future token
        for dynamics in variants() {
            for rotary in rotaries() {
                let layer = layer(dynamics.clone(), rotary, seed);
                let x = random([2, seq, 16], seed + 1);
                let noise = random([2, seq - t - 1, 16], seed + 2);
                let changed = Tensor::cat(vec![x.clone().slice([0..2, 0..t + 1]), noise], 1);
                let before = layer.forward(x).slice([0..2, 0..t + 1]);
                let after = layer.forward(changed).slice([0..2, 0..t + 1]);
                assert_close(before, after, 1e-5, &dynamics.to_string());
            }
        }
    }

    /// Decoding through the cache of evolved keys, in chunks of any size, equals the full
    /// forward pass.
    #[test]
    fn cached_decoding_equals_the_full_forward(seed in 0u64..1000, chunks in prop::collection::vec(1usize..4, 1..5)) {
        let seq: usize = chunks.iter().sum();
        for dynamics in variants() {
            for rotary in rotaries() {
                let layer = layer(dynamics.clone(), rotary, seed);
                let x = random([2, seq, 16], seed + 1);
                let full = layer.forward(x.clone());
                let mut cache = CoupledQkCache::new();
                let mut start = 0;
                let mut parts = Vec::new();
                for &n in &chunks {
                    parts.push(layer.forward_cache(x.clone().slice([0..2, start..start + n]), &mut cache));
                    start += n;
                }
                prop_assert_eq!(cache.len(), seq);
                assert_close(Tensor::cat(parts, 1), full, 1e-5, &dynamics.to_string());
            }
        }
    }
}

#[test]
fn the_dynamics_change_the_output() {
    // Guards the tests above against a layer whose dynamics do nothing.
    let x = random([2, 6, 16], 7);
    for dynamics in variants().into_iter().skip(1) {
        let layer = layer(dynamics.clone(), None, 3);
        let diff = max_abs_diff(
            &values(layer.forward(x.clone())),
            &values(as_standard(&layer).forward(x.clone())),
        );
        assert!(diff > 1e-3, "{dynamics}: output moved only {diff}");
    }
}

#[test]
fn rotary_before_and_after_the_dynamics_differ() {
    let x = random([1, 6, 16], 11);
    let before = layer(DynamicsConfig::euler(1), rotaries()[1].clone(), 5).forward(x.clone());
    let after = layer(DynamicsConfig::euler(1), rotaries()[2].clone(), 5).forward(x);
    assert!(max_abs_diff(&values(before), &values(after)) > 1e-4);
}

// ---------------------------------------------------------------------------------------------
// Masks.

#[test]
fn padded_keys_are_ignored() {
    let layer = layer(DynamicsConfig::leapfrog(1), None, 1);
    let device = Default::default();
    let x = random([1, 5, 16], 2);
    let pad = Tensor::<B, 2, Bool>::from_bool(
        burn::tensor::TensorData::new(vec![false, false, false, true, true], [1, 5]),
        &device,
    );
    let changed = Tensor::cat(
        vec![x.clone().slice([0..1, 0..3]), random([1, 2, 16], 3)],
        1,
    );
    let out = |x| layer.forward(AttentionInput::new(x).mask_pad(pad.clone()));
    assert_close(
        out(x).slice([0..1, 0..3]),
        out(changed).slice([0..1, 0..3]),
        1e-5,
        "padded keys leaked into unpadded rows",
    );
}

#[test]
fn a_fully_masked_row_gives_zeros_not_nan() {
    let layer = CoupledQkAttentionConfig::new(16, 2)
        .with_dynamics(DynamicsConfig::euler(1))
        .init::<B>(&Default::default());
    let device = Default::default();
    let mut mask = vec![false; 4 * 4];
    mask[4..8].fill(true); // query 1 sees nothing
    let mask =
        Tensor::<B, 3, Bool>::from_bool(burn::tensor::TensorData::new(mask, [1, 4, 4]), &device);
    let out = values(layer.forward(AttentionInput::new(random([1, 4, 16], 4)).mask_attn(mask)));
    assert!(out.iter().all(|v| v.is_finite()), "{out:?}");
}

// ---------------------------------------------------------------------------------------------
// Configuration.

#[test]
fn extra_parameters_are_the_coupling_net_and_dt() {
    let device = Default::default();
    let config = CoupledQkAttentionConfig::new(576, 9); // the 60m preset's layer: d_head 64
    let standard = config
        .clone()
        .with_dynamics(DynamicsConfig::Standard)
        .init::<B>(&device);
    let euler = config.clone().init::<B>(&device);
    let mlp = config
        .clone()
        .with_dynamics(DynamicsConfig::MlpOnly)
        .init::<B>(&device);
    let per_head = config
        .clone()
        .with_coupling_per_head(true)
        .with_dt(StepSizeConfig::new().with_per_head(true))
        .init::<B>(&device);
    let net = 64 * 64 * 2 + 64 + 64;
    assert_eq!(standard.extra_num_params(), 0);
    assert_eq!(euler.extra_num_params(), net + 1);
    assert_eq!(mlp.extra_num_params(), net);
    assert_eq!(per_head.extra_num_params(), 9 * net + 9);
    assert_eq!(euler.num_params(), standard.num_params() + net + 1);
    // The affine coupling's control has its parameters exactly: four nets a layer.
    for dynamics in [
        DynamicsConfig::affine(2),
        DynamicsConfig::affine_uncoupled(2),
    ] {
        let layer = config.clone().with_dynamics(dynamics).init::<B>(&device);
        assert_eq!(layer.extra_num_params(), 2 * 4 * net);
    }
}

#[test]
fn a_fixed_dt_gets_no_gradient_and_a_learned_one_does() {
    use burn::backend::Autodiff;
    let device = Default::default();
    for learned in [true, false] {
        let layer = CoupledQkAttentionConfig::new(16, 2)
            .with_dt(
                StepSizeConfig::new()
                    .with_learned(learned)
                    .with_per_head(true),
            )
            .init::<Autodiff<B>>(&device);
        let x = Tensor::random([1, 3, 16], Distribution::Default, &device);
        let grads = layer.forward(x).sum().backward();
        let dt = &layer.dynamics.step_size().unwrap().dt;
        assert_eq!(dt.dims(), [2]);
        assert_eq!(dt.grad(&grads).is_some(), learned, "learned = {learned}");
    }
}

/// A user's integrator: symplectic Euler, one file, no change to the attention code.
#[derive(Debug)]
struct SymplecticEuler;

impl Integrator for SymplecticEuler {
    fn name(&self) -> &str {
        "symplectic-euler"
    }
    fn step(&self, space: &mut dyn PhaseSpace) {
        let force = space.force();
        space.kick(1.0, force);
        space.drift(1.0);
    }
}

#[test]
fn a_users_integrator_plugs_in() {
    let euler = layer(DynamicsConfig::euler(1), None, 9);
    let custom = euler.clone().with_integrator(Arc::new(SymplecticEuler));
    let x = random([1, 5, 16], 10);
    let (a, b) = (values(euler.forward(x.clone())), values(custom.forward(x)));
    assert!(max_abs_diff(&a, &b) > 1e-4);
}

fn error_of(config: CoupledQkAttentionConfig) -> coupled_qk::ConfigError {
    config.try_init::<B>(&Default::default()).unwrap_err()
}

#[test]
fn every_invalid_field_is_named() {
    let base = CoupledQkAttentionConfig::new(16, 2);
    let cases = [
        (CoupledQkAttentionConfig::new(0, 2), "d_model"),
        (CoupledQkAttentionConfig::new(16, 0), "n_heads"),
        (CoupledQkAttentionConfig::new(16, 3), "d_model"),
        (base.clone().with_dropout(1.0), "dropout"),
        (base.clone().with_dropout(-0.1), "dropout"),
        (base.clone().with_dropout(f64::NAN), "dropout"),
        (
            base.clone().with_dynamics(DynamicsConfig::euler(0)),
            "steps",
        ),
        (
            base.clone().with_dt(StepSizeConfig::new().with_init(-0.1)),
            "init",
        ),
        (
            base.clone()
                .with_dt(StepSizeConfig::new().with_init(f64::INFINITY)),
            "init",
        ),
        (base.clone().with_coupling_hidden(Some(0)), "d_hidden"),
        (
            CoupledQkAttentionConfig::new(18, 2).with_rotary(Some(RotaryConfig::new(8))),
            "rotary",
        ),
        (
            base.clone().with_rotary(Some(RotaryConfig::new(0))),
            "rotary.max_seq_len",
        ),
    ];
    for (config, field) in cases {
        let err = error_of(config);
        assert_eq!(err.field, field, "{err}");
        assert!(err.to_string().contains(&format!("`{field}`")), "{err}");
    }
    // Standard attention does not validate a dt it does not have.
    assert!(
        base.with_dynamics(DynamicsConfig::Standard)
            .with_dt(StepSizeConfig::new().with_init(-1.0))
            .try_init::<B>(&Default::default())
            .is_ok()
    );
}

#[test]
#[should_panic(
    expected = "invalid CoupledQkAttentionConfig: `d_model` = 16: must be divisible by n_heads = 3"
)]
fn init_panics_with_the_validation_message() {
    CoupledQkAttentionConfig::new(16, 3).init::<B>(&Default::default());
}

#[test]
#[should_panic(expected = "expected input [batch, seq, d_model = 16], got [1, 4, 8]")]
fn a_wrong_input_width_names_the_expected_shape() {
    layer(DynamicsConfig::euler(1), None, 0).forward(random([1, 4, 8], 0));
}

#[test]
#[should_panic(expected = "max_seq_len = 64")]
fn decoding_past_the_rotary_table_says_so() {
    let layer = layer(DynamicsConfig::euler(1), rotaries()[2].clone(), 0);
    let mut cache = CoupledQkCache::new();
    layer.forward_cache(random([1, 60, 16], 0), &mut cache);
    layer.forward_cache(random([1, 5, 16], 1), &mut cache);
}

/// The flash kernel applies no attention dropout: a config asking for both is refused naming the
/// field, and so is switching a built layer with dropout to it.
#[test]
fn the_flash_kernel_refuses_attention_dropout() {
    use coupled_qk::AttentionKernel;
    let config = CoupledQkAttentionConfig::new(64, 4)
        .with_dropout(0.1)
        .with_kernel(AttentionKernel::Flash);
    let err = config.validate().unwrap_err();
    assert_eq!(err.field, "dropout", "{err}");
    let layer = config
        .with_kernel(AttentionKernel::Explicit)
        .init::<B>(&Default::default());
    let switched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        layer.with_kernel(AttentionKernel::Flash)
    }));
    assert!(
        switched.is_err(),
        "a layer with dropout switched to the flash kernel"
    );
}
