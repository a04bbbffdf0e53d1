//! The fused dynamics of host backends (Flex, NdArray) against the tensor-op path: values and
//! every gradient (inputs, each net's weights and biases, `dt`), over the built-in integrators
//! and the affine coupling, shared and per-head nets, one `dt` or one per head; and the
//! integrators' invariants on the fused path.

use burn::backend::{Autodiff, Flex};
use burn::module::Param;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};
use common::fixed_uniform;
use coupled_qk::dynamics::runs_fused;
use coupled_qk::integrator::{Integrator, PhaseSpace};
use coupled_qk::{CouplingNet, CouplingNetConfig, DynamicsConfig, QkDynamics, StepSizeConfig};
use std::sync::Arc;

mod common;

const HEADS: usize = 3;
/// Enough rows (tokens × heads, 900) for two of the kernels' chunks (512 rows, rounded up to
/// whole tokens), so that the chunks' parameter gradients are summed.
const SHAPE: [usize; 4] = [2, 150, HEADS, 8];

/// Every parameter of `net` from its own fixed stream (`stream`, `stream + 1`, …).
fn randomize<B: Backend>(net: &mut CouplingNet<B>, stream: u64, device: &B::Device) {
    net.w1 = Param::from_tensor(fixed_uniform(net.w1.dims(), stream, 0.6, device));
    net.b1 = Param::from_tensor(fixed_uniform(net.b1.dims(), stream + 1, 0.6, device));
    net.w2 = Param::from_tensor(fixed_uniform(net.w2.dims(), stream + 2, 0.6, device));
    net.b2 = Param::from_tensor(fixed_uniform(net.b2.dims(), stream + 3, 0.6, device));
}

fn nets<B: Backend>(dynamics: &QkDynamics<B>) -> Vec<&CouplingNet<B>> {
    match dynamics {
        QkDynamics::Coupled(c) => vec![&c.coupling],
        QkDynamics::Affine(a) => a
            .layers
            .iter()
            .flat_map(|l| [&l.key_scale, &l.key_shift, &l.query_scale, &l.query_shift])
            .collect(),
        _ => vec![],
    }
}

/// Dynamics with every parameter random (the affine output layers start at zero otherwise) and,
/// with a step per head, distinct steps of both signs.
fn dynamics<B: Backend>(
    config: &DynamicsConfig,
    n_nets: usize,
    per_head_dt: bool,
    device: &B::Device,
) -> QkDynamics<B> {
    let coupling = CouplingNetConfig::new(SHAPE[3])
        .with_d_hidden(Some(6))
        .with_n_nets(n_nets);
    let dt = StepSizeConfig::new()
        .with_per_head(per_head_dt)
        .with_init(0.3);
    let mut dynamics = QkDynamics::try_init(config, &coupling, &dt, HEADS, device).unwrap();
    match &mut dynamics {
        QkDynamics::Coupled(c) => {
            randomize(&mut c.coupling, 100, device);
            if per_head_dt {
                let steps = Tensor::from_floats([0.3, -0.7, 1.1], device);
                c.step_size.dt = Param::from_tensor(steps);
            }
        }
        QkDynamics::Affine(a) => {
            for (i, layer) in a.layers.iter_mut().enumerate() {
                for (j, net) in [
                    &mut layer.key_scale,
                    &mut layer.key_shift,
                    &mut layer.query_scale,
                    &mut layer.query_shift,
                ]
                .into_iter()
                .enumerate()
                {
                    randomize(net, 100 + 4 * (4 * i + j) as u64, device);
                }
            }
        }
        _ => unreachable!("only the coupled and affine dynamics are fused"),
    }
    dynamics
}

/// The tensor-op path of the same dynamics.
fn with_tensor_ops<B: Backend>(
    dynamics: &QkDynamics<B>,
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    match dynamics {
        QkDynamics::Coupled(c) => c.forward_with_tensor_ops(q, k),
        QkDynamics::Affine(a) => a.forward_with_tensor_ops(q, k),
        _ => unreachable!(),
    }
}

/// Relative tolerance of every comparison with the tensor ops. The weights and inputs are fixed:
/// `dt`'s gradient sums 900 rows' dot products, which can cancel, and at Burn's random weights
/// the f32 reference differed from the fused sum by 1.1e-5 to 4.2e-5 of it in 3 of 12 runs.
const TOLERANCE: f32 = 1e-5;

/// `got` equals `expected` within [`TOLERANCE`] of `expected`'s largest magnitude.
fn assert_close(got: Vec<f32>, expected: Vec<f32>, what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: lengths");
    let scale = expected.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
    let diff = got
        .iter()
        .zip(&expected)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        diff <= TOLERANCE * scale,
        "{what}: differs by {diff:e}, scale {scale:e}"
    );
}

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().unwrap()
}

/// The outputs, then the gradients of q, k, each net's w1, b1, w2, b2 and dt, of
/// `Σ q'·a + k'·b` for fixed random `a`, `b`.
fn outputs_and_grads<B: AutodiffBackend>(
    dynamics: &QkDynamics<B>,
    fused: bool,
    shape: [usize; 4],
) -> Vec<(String, Vec<f32>)> {
    let device = Default::default();
    let q = fixed_uniform::<B, 4>(shape, 1, 1.7, &device).require_grad();
    let k = fixed_uniform::<B, 4>(shape, 2, 1.7, &device).require_grad();
    let (a, b) = (
        fixed_uniform::<B, 4>(shape, 3, 1.7, &device),
        fixed_uniform::<B, 4>(shape, 4, 1.7, &device),
    );
    let (q1, k1) = if fused {
        dynamics.forward(q.clone(), k.clone())
    } else {
        with_tensor_ops(dynamics, q.clone(), k.clone())
    };
    let grads = (q1.clone() * a + k1.clone() * b).sum().backward();
    let mut out = vec![
        ("q'".to_string(), values(q1.inner())),
        ("k'".to_string(), values(k1.inner())),
        ("grad q".to_string(), values(q.grad(&grads).unwrap())),
        ("grad k".to_string(), values(k.grad(&grads).unwrap())),
    ];
    for (i, net) in nets(dynamics).into_iter().enumerate() {
        let grad = |name: &str, g: Option<Vec<f32>>| (format!("net {i} grad {name}"), g.unwrap());
        out.push(grad("w1", net.w1.val().grad(&grads).map(values)));
        out.push(grad("b1", net.b1.val().grad(&grads).map(values)));
        out.push(grad("w2", net.w2.val().grad(&grads).map(values)));
        out.push(grad("b2", net.b2.val().grad(&grads).map(values)));
    }
    if let Some(dt) = dynamics.step_size() {
        out.push(("grad dt".into(), values(dt.dt.val().grad(&grads).unwrap())));
    }
    out
}

fn cases() -> Vec<(DynamicsConfig, usize, bool)> {
    let mut cases = Vec::new();
    for config in [
        DynamicsConfig::euler(1),
        DynamicsConfig::euler(3),
        DynamicsConfig::leapfrog(1),
        DynamicsConfig::leapfrog(2),
    ] {
        for (n_nets, per_head_dt) in [(1, false), (1, true), (HEADS, false), (HEADS, true)] {
            cases.push((config.clone(), n_nets, per_head_dt));
        }
    }
    for layers in [1, 2] {
        for coupled in [true, false] {
            for n_nets in [1, HEADS] {
                cases.push((DynamicsConfig::Affine { layers, coupled }, n_nets, false));
            }
        }
    }
    cases
}

fn fused_equals_tensor_ops<B: AutodiffBackend>() {
    assert!(
        runs_fused::<B>(),
        "{} runs the fused dynamics",
        B::name(&Default::default())
    );
    let device = Default::default();
    for (config, n_nets, per_head_dt) in cases() {
        let dynamics = dynamics::<B>(&config, n_nets, per_head_dt, &device);
        let fused = outputs_and_grads(&dynamics, true, SHAPE);
        let reference = outputs_and_grads(&dynamics, false, SHAPE);
        for ((name, got), (_, expected)) in fused.into_iter().zip(reference) {
            let what = format!("{config}, {n_nets} nets, dt per head {per_head_dt}: {name}");
            assert!(expected.iter().any(|&x| x != 0.0), "{what}: all zero");
            assert_close(got, expected, &what);
        }
    }
}

#[test]
fn fused_dynamics_equal_the_tensor_ops_on_flex() {
    fused_equals_tensor_ops::<Autodiff<Flex>>();
}

#[cfg(feature = "ndarray")]
#[test]
fn fused_dynamics_equal_the_tensor_ops_on_ndarray() {
    fused_equals_tensor_ops::<Autodiff<burn::backend::NdArray>>();
}

/// Without autodiff (inference), the fused forward pass gives the tensor ops' values.
#[test]
fn the_fused_inference_pass_equals_the_tensor_ops() {
    assert!(runs_fused::<Flex>());
    let device = Default::default();
    let normal = Distribution::Normal(0.0, 1.0);
    for (config, n_nets, per_head_dt) in cases() {
        let dynamics = dynamics::<Flex>(&config, n_nets, per_head_dt, &device);
        let q = Tensor::<Flex, 4>::random(SHAPE, normal, &device);
        let k = Tensor::<Flex, 4>::random(SHAPE, normal, &device);
        let (q1, k1) = dynamics.forward(q.clone(), k.clone());
        let (q2, k2) = with_tensor_ops(&dynamics, q, k);
        assert_close(values(q1), values(q2), &format!("{config}: q'"));
        assert_close(values(k1), values(k2), &format!("{config}: k'"));
    }
}

/// Leapfrog on the fused path: `n` steps with `−dt` undo `n` steps with `dt`; Euler's do not.
#[test]
fn fused_leapfrog_is_time_reversible_and_euler_is_not() {
    let device = Default::default();
    let normal = Distribution::Normal(0.0, 1.0);
    let q = Tensor::<Flex, 4>::random(SHAPE, normal, &device);
    let k = Tensor::<Flex, 4>::random(SHAPE, normal, &device);
    for (config, reversible) in [
        (DynamicsConfig::leapfrog(3), true),
        (DynamicsConfig::euler(3), false),
    ] {
        let QkDynamics::Coupled(mut c) = dynamics::<Flex>(&config, HEADS, true, &device) else {
            unreachable!()
        };
        let (q1, k1) = c.forward(q.clone(), k.clone());
        c.step_size.dt = Param::from_tensor(c.step_size.dt.val().neg());
        let (q0, k0) = c.forward(q1, k1);
        let error = (q0 - q.clone())
            .abs()
            .max()
            .max_pair((k0 - k.clone()).abs().max())
            .into_scalar();
        if reversible {
            assert!(error < 1e-4, "{config}: back within {error}");
        } else {
            assert!(error > 1e-2, "{config}: not reversible, error {error}");
        }
    }
}

/// `dt = 0` on the fused path leaves `q` and `k` exactly as they are.
#[test]
fn fused_dynamics_with_zero_dt_are_the_identity_exactly() {
    let device = Default::default();
    let normal = Distribution::Normal(0.0, 1.0);
    let q = Tensor::<Flex, 4>::random(SHAPE, normal, &device);
    let k = Tensor::<Flex, 4>::random(SHAPE, normal, &device);
    for config in [DynamicsConfig::euler(2), DynamicsConfig::leapfrog(2)] {
        let QkDynamics::Coupled(mut c) = dynamics::<Flex>(&config, 1, false, &device) else {
            unreachable!()
        };
        c.step_size.dt = Param::from_tensor(Tensor::zeros([1], &device));
        let (q1, k1) = c.forward(q.clone(), k.clone());
        q1.into_data().assert_eq(&q.clone().into_data(), true);
        k1.into_data().assert_eq(&k.clone().into_data(), true);
    }
}

/// A user's integrator runs fused too: its moves are recorded and replayed.
#[test]
fn a_users_integrator_runs_fused_with_the_tensor_ops_values_and_gradients() {
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
    type B = Autodiff<Flex>;
    let device = Default::default();
    let dynamics = dynamics::<B>(&DynamicsConfig::euler(2), 1, true, &device)
        .with_integrator(Arc::new(SymplecticEuler));
    let fused = outputs_and_grads(&dynamics, true, SHAPE);
    let reference = outputs_and_grads(&dynamics, false, SHAPE);
    for ((name, got), (_, expected)) in fused.into_iter().zip(reference) {
        let what = format!("symplectic Euler: {name}");
        assert_close(got, expected, &what);
    }
}

/// The parameters' gradients are summed over chunks in a fixed order: the fused path gives the
/// same bits on one thread as on three (resume's bitwise exactness needs it).
#[test]
fn fused_gradients_are_the_same_bits_at_any_thread_count() {
    type B = Autodiff<Flex>;
    let device = Default::default();
    // 4 × 200 tokens × 3 heads: 2,400 rows, five chunks.
    let shape = [4, 200, HEADS, SHAPE[3]];
    for config in [
        DynamicsConfig::euler(1),
        DynamicsConfig::Affine {
            layers: 1,
            coupled: true,
        },
    ] {
        let dynamics = dynamics::<B>(&config, HEADS, false, &device);
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| outputs_and_grads(&dynamics, true, shape))
        };
        let bits = |values: Vec<(String, Vec<f32>)>| {
            values
                .into_iter()
                .map(|(name, v)| (name, v.into_iter().map(f32::to_bits).collect::<Vec<_>>()))
                .collect::<Vec<_>>()
        };
        let (one, three) = (bits(on(1)), bits(on(3)));
        for ((name, a), (_, b)) in one.iter().zip(&three) {
            assert!(a == b, "{config}: {name} differs between 1 and 3 threads");
        }
    }
}
