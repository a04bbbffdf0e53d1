//! The integrators' mathematical invariants and reference values.

mod common;

use burn::tensor::Tensor;
use common::*;
use coupled_qk::integrator::{Euler, Integrator, Leapfrog, integrate};
use proptest::prelude::*;

/// `integrate` with a coupling net as the force.
fn evolve<B: burn::tensor::backend::Backend>(
    integrator: &dyn Integrator,
    net: &coupled_qk::CouplingNet<B>,
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    dt: Tensor<B, 4>,
    steps: usize,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let f = |q: Tensor<B, 4>| net.forward(q);
    let out = integrate(integrator, q, k, dt, &f, steps);
    (out.q, out.k)
}

// ---------------------------------------------------------------------------------------------
// Reference values: tests/reference/integrators.py computes them with plain Python floats.

const W: [f64; 12] = [
    0.5, -0.3, 0.2, 0.8, // w1 [2, 2]
    0.1, -0.2, // b1
    1.0, -0.5, 0.3, 0.7, // w2 [2, 2]
    0.05, -0.1, // b2
];

fn reference_case(integrator: &dyn Integrator, steps: usize) -> (Vec<f64>, Vec<f64>) {
    let device = Default::default();
    let net = net::<Cpu64>(2, 2, &W, &device);
    let q = tensor::<Cpu64, 4>(&[0.4, -0.7, -1.2, 0.3], [1, 1, 2, 2], &device);
    let k = tensor::<Cpu64, 4>(&[0.2, 0.9, 0.5, -0.4], [1, 1, 2, 2], &device);
    let dt = tensor::<Cpu64, 4>(&[0.25], [1, 1, 1, 1], &device);
    let (q, k) = evolve(integrator, &net, q, k, dt, steps);
    (values(q), values(k))
}

fn assert_close(got: &[f64], expected: &[f64], what: &str) {
    let err = max_abs_diff(got, expected);
    assert!(err < 1e-8, "{what}: got {got:?}, expected {expected:?}");
}

#[test]
fn euler_matches_the_reference_values() {
    let (q, k) = reference_case(&Euler, 1);
    assert_close(&q, &[0.45, -0.475, -1.075, 0.2], "euler x1 q");
    assert_close(
        &k,
        &[0.214746862, 0.819052324, 0.487369123, -0.361546110],
        "euler x1 k",
    );
    let (q, k) = reference_case(&Euler, 2);
    assert_close(
        &q,
        &[0.503686715, -0.270236919, -0.953157719, 0.109613472],
        "euler x2 q",
    );
    assert_close(
        &k,
        &[0.241673071, 0.736928516, 0.472009249, -0.338388815],
        "euler x2 k",
    );
}

#[test]
fn leapfrog_matches_the_reference_values() {
    let (q, k) = reference_case(&Leapfrog, 1);
    assert_close(
        &q,
        &[0.451843358, -0.485118459, -1.076578860, 0.204806736],
        "leapfrog x1 q",
    );
    assert_close(
        &k,
        &[0.220697154, 0.818378570, 0.486114936, -0.368955670],
        "leapfrog x1 k",
    );
    let (q, k) = reference_case(&Leapfrog, 2);
    assert_close(
        &q,
        &[0.510348577, -0.290810715, -0.956942532, 0.115522165],
        "leapfrog x2 q",
    );
    assert_close(
        &k,
        &[0.253715638, 0.735752292, 0.470157187, -0.351929695],
        "leapfrog x2 k",
    );
}

// ---------------------------------------------------------------------------------------------
// Random small problems.

/// A random problem: `d_head`, hidden width, net weights, `tokens` query-key pairs, dt, steps.
#[derive(Debug, Clone)]
struct Problem {
    d: usize,
    h: usize,
    weights: Vec<f64>,
    q: Vec<f64>,
    k: Vec<f64>,
    tokens: usize,
    dt: f64,
    steps: usize,
}

fn problem(max_tokens: usize) -> impl Strategy<Value = Problem> {
    (1..=3usize, 1..=4usize, 1..=max_tokens, 1..=3usize)
        .prop_flat_map(|(d, h, tokens, steps)| {
            (
                Just((d, h, tokens, steps)),
                prop::collection::vec(-1.5f64..1.5, net_size(d, h)),
                prop::collection::vec(-2.0f64..2.0, tokens * d),
                prop::collection::vec(-2.0f64..2.0, tokens * d),
                0.05f64..0.8,
            )
        })
        .prop_map(|((d, h, tokens, steps), weights, q, k, dt)| Problem {
            d,
            h,
            weights,
            q,
            k,
            tokens,
            dt,
            steps,
        })
}

impl Problem {
    fn run<B: burn::tensor::backend::Backend>(
        &self,
        integrator: &dyn Integrator,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        dt: f64,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let device = q.device();
        let net = net::<B>(self.d, self.h, &self.weights, &device);
        let dt = tensor::<B, 4>(&[dt], [1, 1, 1, 1], &device);
        evolve(integrator, &net, q, k, dt, self.steps)
    }

    fn state<B: burn::tensor::backend::Backend>(&self) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let device = Default::default();
        let shape = [1, 1, self.tokens, self.d];
        (
            tensor(&self.q, shape, &device),
            tensor(&self.k, shape, &device),
        )
    }

    /// The Jacobian of the n-step map at one token, by autodiff (rows: outputs q₁, k₁).
    fn jacobian(&self, integrator: &dyn Integrator) -> Vec<Vec<f64>> {
        let device = Default::default();
        let d = self.d;
        let mut rows = Vec::with_capacity(2 * d);
        for out in 0..2 * d {
            let q = tensor::<Ad64, 4>(&self.q[..d], [1, 1, 1, d], &device).require_grad();
            let k = tensor::<Ad64, 4>(&self.k[..d], [1, 1, 1, d], &device).require_grad();
            let (q1, k1) = self.run(integrator, q.clone(), k.clone(), self.dt);
            let both = Tensor::cat(vec![q1, k1], 3).reshape([2 * d]);
            let grads = both.slice(out..out + 1).sum().backward();
            let mut row = values(q.grad(&grads).unwrap());
            row.extend(values(k.grad(&grads).unwrap()));
            rows.push(row);
        }
        rows
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Leapfrog: n steps of -dt undo n steps of dt, for any force.
    #[test]
    fn leapfrog_is_time_reversible(p in problem(4)) {
        let (q0, k0) = p.state::<Cpu64>();
        let (q1, k1) = p.run(&Leapfrog, q0.clone(), k0.clone(), p.dt);
        let (q2, k2) = p.run(&Leapfrog, q1, k1, -p.dt);
        prop_assert!(max_abs_diff(&values(q2), &values(q0)) < 1e-10);
        prop_assert!(max_abs_diff(&values(k2), &values(k0)) < 1e-10);
    }

    /// Leapfrog: |det J| = 1 for any force (every sub-step is a shear).
    #[test]
    fn leapfrog_preserves_volume(p in problem(1)) {
        let det = det(p.jacobian(&Leapfrog));
        prop_assert!((det - 1.0).abs() < 1e-9, "det J = {det}");
    }

    /// Euler: det J = det(I − dt²·J_f(q₀)) for one step, which is what makes it not
    /// volume-preserving.
    #[test]
    fn euler_jacobian_is_i_minus_dt2_jf(mut p in problem(1)) {
        p.steps = 1;
        let d = p.d;
        let det_map = det(p.jacobian(&Euler));
        // J_f by autodiff of the net alone.
        let device = Default::default();
        let net = net::<Ad64>(d, p.h, &p.weights, &device);
        let mut m = vec![vec![0.0; d]; d];
        for (i, row) in m.iter_mut().enumerate() {
            let q = tensor::<Ad64, 4>(&p.q[..d], [1, 1, 1, d], &device).require_grad();
            let grads = net.forward(q.clone()).reshape([d]).slice(i..i + 1).sum().backward();
            let jf_row = values(q.grad(&grads).unwrap());
            for (j, v) in jf_row.iter().enumerate() {
                row[j] = if i == j { 1.0 } else { 0.0 } - p.dt * p.dt * v;
            }
        }
        let expected = det(m);
        prop_assert!((det_map - expected).abs() < 1e-9, "det J = {det_map}, det(I − dt²J_f) = {expected}");
    }
}

/// Euler is neither volume-preserving nor reversible for a generic force: the same checks that
/// leapfrog passes fail here, so the property tests above can fail.
#[test]
fn euler_fails_the_leapfrog_properties() {
    let p = Problem {
        d: 2,
        h: 3,
        weights: (0..net_size(2, 3))
            .map(|i| ((i * 7919) % 13) as f64 / 6.0 - 1.0)
            .collect(),
        q: vec![0.3, -0.8],
        k: vec![1.1, 0.4],
        tokens: 1,
        dt: 0.6,
        steps: 2,
    };
    let det = det(p.jacobian(&Euler));
    assert!((det - 1.0).abs() > 1e-2, "Euler det J = {det}");
    let (q0, k0) = p.state::<Cpu64>();
    let (q1, k1) = p.run(&Euler, q0.clone(), k0, p.dt);
    let (q2, _) = p.run(&Euler, q1, k1, -p.dt);
    assert!(max_abs_diff(&values(q2), &values(q0)) > 1e-3);
}

// ---------------------------------------------------------------------------------------------
// Harmonic oscillator: f(q) = −ω²q, exact q(t) = q₀cos ωt + (k₀/ω) sin ωt.

const OMEGA: f64 = 1.3;

fn oscillator(integrator: &dyn Integrator, dt: f64, steps: usize) -> (f64, f64) {
    let device = Default::default();
    let q = tensor::<Cpu64, 4>(&[1.0], [1, 1, 1, 1], &device);
    let k = tensor::<Cpu64, 4>(&[0.5], [1, 1, 1, 1], &device);
    let dt = tensor::<Cpu64, 4>(&[dt], [1, 1, 1, 1], &device);
    let f = |q: Tensor<Cpu64, 4>| q.mul_scalar(-OMEGA * OMEGA);
    let out = integrate(integrator, q, k, dt, &f, steps);
    (values(out.q)[0], values(out.k)[0])
}

fn global_error(integrator: &dyn Integrator, dt: f64) -> f64 {
    let t = 2.0;
    let steps = (t / dt).round() as usize;
    let (q, _) = oscillator(integrator, dt, steps);
    let exact = (OMEGA * t).cos() + 0.5 / OMEGA * (OMEGA * t).sin();
    (q - exact).abs()
}

#[test]
fn halving_dt_halves_euler_error_and_quarters_leapfrog_error() {
    for (integrator, order) in [(&Euler as &dyn Integrator, 1), (&Leapfrog, 2)] {
        for dt in [0.02, 0.01] {
            let ratio = global_error(integrator, dt) / global_error(integrator, dt / 2.0);
            let expected = 2f64.powi(order);
            assert!(
                (ratio / expected - 1.0).abs() < 0.1,
                "{}: error ratio {ratio} at dt = {dt}, expected ≈ {expected}",
                integrator.name()
            );
        }
    }
}

#[test]
fn leapfrog_energy_stays_bounded_and_euler_energy_grows() {
    // H = ½k² + ½ω²q², f = −∇V.
    let energy = |(q, k): (f64, f64)| 0.5 * k * k + 0.5 * OMEGA * OMEGA * q * q;
    let h0 = energy((1.0, 0.5));
    let dt = 0.1;
    let mut worst = 0.0f64;
    for steps in (100..=2000).step_by(100) {
        let drift = (energy(oscillator(&Leapfrog, dt, steps)) - h0).abs() / h0;
        worst = worst.max(drift);
    }
    assert!(
        worst < 0.01,
        "leapfrog relative energy error reached {worst}"
    );
    let euler = energy(oscillator(&Euler, dt, 2000)) / h0;
    assert!(euler > 100.0, "Euler energy grew only {euler}×");
}

// ---------------------------------------------------------------------------------------------
// Gradients: autodiff against central finite differences, in f64.

/// A scalar loss of (q₀, k₀, dt, weights), packed in that order into one vector.
fn loss_at<B: burn::tensor::backend::Backend>(
    integrator: &dyn Integrator,
    shape: (usize, usize, usize),
    x: &[f64],
    steps: usize,
) -> f64 {
    let (t, d, h) = shape;
    let device = Default::default();
    let (q, rest) = x.split_at(t * d);
    let (k, rest) = rest.split_at(t * d);
    let (dt, w) = rest.split_at(1);
    let net = net::<B>(d, h, w, &device);
    let q = tensor::<B, 4>(q, [1, 1, t, d], &device);
    let k = tensor::<B, 4>(k, [1, 1, t, d], &device);
    let dt = tensor::<B, 4>(dt, [1, 1, 1, 1], &device);
    let (q1, k1) = evolve(integrator, &net, q, k, dt, steps);
    values(objective(q1, k1))[0]
}

/// A loss in which every output matters differently.
fn objective<B: burn::tensor::backend::Backend>(
    q1: Tensor<B, 4>,
    k1: Tensor<B, 4>,
) -> Tensor<B, 1> {
    let dims = q1.dims();
    let n = dims.iter().product::<usize>();
    let w: Vec<f64> = (0..n).map(|i| 0.3 + 0.17 * i as f64).collect();
    let w = tensor::<B, 4>(&w, dims, &q1.device());
    (q1 * w.clone()).sum() + (k1.powf_scalar(2.0) * w).sum()
}

#[test]
fn autodiff_gradients_match_finite_differences() {
    let (t, d, h) = (2, 2, 3);
    let x: Vec<f64> = (0..2 * t * d + 1 + net_size(d, h))
        .map(|i| ((i * 37) % 17) as f64 / 10.0 - 0.8)
        .collect();
    for integrator in [&Euler as &dyn Integrator, &Leapfrog] {
        for steps in [1, 3] {
            // Autodiff.
            let device = Default::default();
            let (q, rest) = x.split_at(t * d);
            let (k, rest) = rest.split_at(t * d);
            let (dt, w) = rest.split_at(1);
            let net = net::<Ad64>(d, h, w, &device);
            let q = tensor::<Ad64, 4>(q, [1, 1, t, d], &device).require_grad();
            let k = tensor::<Ad64, 4>(k, [1, 1, t, d], &device).require_grad();
            let dt = tensor::<Ad64, 4>(dt, [1, 1, 1, 1], &device).require_grad();
            let (q1, k1) = evolve(integrator, &net, q.clone(), k.clone(), dt.clone(), steps);
            let grads = objective(q1, k1).backward();
            let mut autodiff = values(q.grad(&grads).unwrap());
            autodiff.extend(values(k.grad(&grads).unwrap()));
            autodiff.extend(values(dt.grad(&grads).unwrap()));
            for p in [
                values(net.w1.grad(&grads).unwrap()),
                values(net.b1.grad(&grads).unwrap()),
                values(net.w2.grad(&grads).unwrap()),
                values(net.b2.grad(&grads).unwrap()),
            ] {
                autodiff.extend(p);
            }
            // Central differences.
            let eps = 1e-6;
            for (i, &g) in autodiff.iter().enumerate() {
                let mut plus = x.clone();
                plus[i] += eps;
                let mut minus = x.clone();
                minus[i] -= eps;
                let fd = (loss_at::<Cpu64>(integrator, (t, d, h), &plus, steps)
                    - loss_at::<Cpu64>(integrator, (t, d, h), &minus, steps))
                    / (2.0 * eps);
                assert!(
                    (g - fd).abs() < 1e-6 * (1.0 + fd.abs()),
                    "{} x{steps}: d loss / d x[{i}]: autodiff {g}, finite differences {fd}",
                    integrator.name()
                );
            }
        }
    }
}
