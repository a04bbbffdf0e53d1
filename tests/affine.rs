//! The invertible affine coupling's invariants, in f64 on random nets: its inverse undoes it,
//! its log-determinant is log|det J| of its Jacobian, and autodiff gradients agree with finite
//! differences. Its values match an independent Python computation.

mod common;

use burn::tensor::Tensor;
use common::{Ad64, Cpu64, det, net, net_size, tensor, values};
use coupled_qk::dynamics::{AffineCoupling, AffineLayer, SCALE_BOUND};
use proptest::prelude::*;

/// A coupling of `layers` layers of nets `d → h → d` with the given weights (four nets a layer).
fn coupling<B: burn::tensor::backend::Backend>(
    d: usize,
    h: usize,
    weights: &[f64],
    device: &B::Device,
) -> AffineCoupling<B> {
    let size = net_size(d, h);
    let layers = weights
        .chunks(4 * size)
        .map(|w| AffineLayer {
            key_scale: net(d, h, &w[..size], device),
            key_shift: net(d, h, &w[size..2 * size], device),
            query_scale: net(d, h, &w[2 * size..3 * size], device),
            query_shift: net(d, h, &w[3 * size..], device),
        })
        .collect();
    AffineCoupling {
        layers,
        scale_bound: SCALE_BOUND,
        coupled: true,
    }
}

#[derive(Debug, Clone)]
struct Problem {
    d: usize,
    h: usize,
    layers: usize,
    weights: Vec<f64>,
    q: Vec<f64>,
    k: Vec<f64>,
}

fn problem() -> impl Strategy<Value = Problem> {
    (1usize..4, 1usize..4, 1usize..3).prop_flat_map(|(d, h, layers)| {
        let n = 4 * layers * net_size(d, h);
        (
            prop::collection::vec(-1.0f64..1.0, n),
            prop::collection::vec(-2.0f64..2.0, d),
            prop::collection::vec(-2.0f64..2.0, d),
        )
            .prop_map(move |(weights, q, k)| Problem {
                d,
                h,
                layers,
                weights,
                q,
                k,
            })
    })
}

impl Problem {
    fn state<B: burn::tensor::backend::Backend>(
        &self,
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let shape = [1, 1, 1, self.d];
        (
            tensor(&self.q, shape, device),
            tensor(&self.k, shape, device),
        )
    }

    /// The map as a function of the `2d` inputs, in f64.
    fn map(&self, x: &[f64]) -> Vec<f64> {
        let device = Default::default();
        let c = coupling::<Cpu64>(self.d, self.h, &self.weights, &device);
        let shape = [1, 1, 1, self.d];
        let (q, k) = c.forward(
            tensor(&x[..self.d], shape, &device),
            tensor(&x[self.d..], shape, &device),
        );
        let mut out = values(q);
        out.extend(values(k));
        out
    }

    /// The Jacobian by central differences.
    fn jacobian(&self) -> Vec<Vec<f64>> {
        let x: Vec<f64> = self.q.iter().chain(&self.k).copied().collect();
        let eps = 1e-6;
        let n = x.len();
        let mut jac = vec![vec![0.0; n]; n];
        for col in 0..n {
            let (mut plus, mut minus) = (x.clone(), x.clone());
            plus[col] += eps;
            minus[col] -= eps;
            let (fp, fm) = (self.map(&plus), self.map(&minus));
            for row in 0..n {
                jac[row][col] = (fp[row] - fm[row]) / (2.0 * eps);
            }
        }
        jac
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// `inverse(forward(q, k)) = (q, k)` for any nets.
    #[test]
    fn the_inverse_undoes_the_map(p in problem()) {
        let device = Default::default();
        let c = coupling::<Cpu64>(p.d, p.h, &p.weights, &device);
        let (q, k) = p.state::<Cpu64>(&device);
        let (q1, k1) = c.forward(q, k);
        let (q0, k0) = c.inverse(q1, k1);
        let back: Vec<f64> = values(q0).into_iter().chain(values(k0)).collect();
        let start: Vec<f64> = p.q.iter().chain(&p.k).copied().collect();
        let err = common::max_abs_diff(&back, &start);
        prop_assert!(err < 1e-10, "{} layers: |Δ| = {err}", p.layers);
    }

    /// The log-determinant is `Σ s`, and equals `log|det J|` of the map's Jacobian.
    #[test]
    fn the_log_determinant_is_that_of_the_jacobian(p in problem()) {
        let device = Default::default();
        let c = coupling::<Cpu64>(p.d, p.h, &p.weights, &device);
        let (q, k) = p.state::<Cpu64>(&device);
        let (_, _, log_det) = c.forward_with_log_det(q, k);
        let got = values(log_det)[0];
        let expected = det(p.jacobian()).abs().ln();
        prop_assert!((got - expected).abs() < 1e-6, "log_det {got}, log|det J| {expected}");
    }
}

/// Reference values: tests/reference/affine.py computes them with plain Python floats, for the
/// nets whose weights are `0.6·sin(1.7·j + 0.3)` in order (layer 0's s₁, t₁, s₂, t₂, then layer
/// 1's; each net w1, b1, w2, b2) and two tokens (here two heads sharing the nets).
#[test]
fn affine_matches_the_reference_values() {
    let (d, h) = (2, 2);
    let device = Default::default();
    // (layers, q, k, log-determinant per token)
    type Case = (usize, [f64; 4], [f64; 4], [f64; 2]);
    let cases: [Case; 2] = [
        (
            1,
            [0.793776648, -1.592118098, -2.279174265, -0.032011365],
            [-0.133795681, 2.079812210, 0.291378938, 0.098167605],
            [-0.146854289, -0.132184762],
        ),
        (
            2,
            [1.459821673, -3.070522952, -4.075038496, -0.476195050],
            [-0.729391390, 3.692311775, 0.175602536, 0.565147425],
            [-0.540256301, -0.330741944],
        ),
    ];
    for (layers, q_ref, k_ref, log_det_ref) in cases {
        let weights: Vec<f64> = (0..4 * layers * net_size(d, h))
            .map(|j| 0.6 * (1.7 * j as f64 + 0.3).sin())
            .collect();
        let c = coupling::<Cpu64>(d, h, &weights, &device);
        let q = tensor::<Cpu64, 4>(&[0.4, -0.7, -1.2, 0.3], [1, 1, 2, 2], &device);
        let k = tensor::<Cpu64, 4>(&[0.2, 0.9, 0.5, -0.4], [1, 1, 2, 2], &device);
        let (q, k, log_det) = c.forward_with_log_det(q, k);
        for (what, got, expected) in [
            ("q", values(q), q_ref.to_vec()),
            ("k", values(k), k_ref.to_vec()),
            ("log_det", values(log_det), log_det_ref.to_vec()),
        ] {
            let err = common::max_abs_diff(&got, &expected);
            assert!(
                err < 1e-8,
                "affine x{layers} {what}: got {got:?}, expected {expected:?}"
            );
        }
    }
}

/// The sum of the outputs weighted by fixed coefficients, a scalar to differentiate.
fn objective<B: burn::tensor::backend::Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>) -> Tensor<B, 1> {
    let device = q.device();
    let n = q.dims()[3];
    let w: Vec<f64> = (0..n).map(|i| 0.3 + 0.7 * i as f64).collect();
    let w = tensor::<B, 4>(&w, [1, 1, 1, n], &device);
    (q * w.clone() + k * w.mul_scalar(-0.5)).sum()
}

#[test]
fn autodiff_gradients_match_finite_differences() {
    let (d, h) = (3, 2);
    let weights: Vec<f64> = (0..8 * net_size(d, h))
        .map(|i| 0.8 * (1.3 * i as f64 + 0.4).sin())
        .collect();
    let q = [0.5, -1.2, 0.8];
    let k = [-0.3, 0.9, 1.1];
    let device = Default::default();

    // Autodiff: the inputs and the first layer's key-scale net.
    let c = coupling::<Ad64>(d, h, &weights, &device);
    let qt = tensor::<Ad64, 4>(&q, [1, 1, 1, d], &device).require_grad();
    let kt = tensor::<Ad64, 4>(&k, [1, 1, 1, d], &device).require_grad();
    let (q1, k1) = c.forward(qt.clone(), kt.clone());
    let grads = objective(q1, k1).backward();
    let mut autodiff = values(qt.grad(&grads).unwrap());
    autodiff.extend(values(kt.grad(&grads).unwrap()));
    autodiff.extend(values(c.layers[0].key_scale.w1.grad(&grads).unwrap()));
    autodiff.extend(values(c.layers[1].query_shift.b2.grad(&grads).unwrap()));

    // Finite differences over the same numbers.
    let size = net_size(d, h);
    let query_shift_b2 = 4 * size + 3 * size + d * h + h + h * d; // layer 1, its 4th net's b2
    let eval = |q: &[f64], k: &[f64], w: &[f64]| {
        let c = coupling::<Cpu64>(d, h, w, &device);
        let (q1, k1) = c.forward(
            tensor(q, [1, 1, 1, d], &device),
            tensor(k, [1, 1, 1, d], &device),
        );
        values(objective(q1, k1))[0]
    };
    let eps = 1e-6;
    let mut numeric = Vec::new();
    for i in 0..2 * d {
        let mut x: Vec<f64> = q.iter().chain(&k).copied().collect();
        x[i] += eps;
        let plus = eval(&x[..d], &x[d..], &weights);
        x[i] -= 2.0 * eps;
        let minus = eval(&x[..d], &x[d..], &weights);
        numeric.push((plus - minus) / (2.0 * eps));
    }
    for i in (0..d * h).chain(query_shift_b2..query_shift_b2 + d) {
        let mut w = weights.clone();
        w[i] += eps;
        let plus = eval(&q, &k, &w);
        w[i] -= 2.0 * eps;
        let minus = eval(&q, &k, &w);
        numeric.push((plus - minus) / (2.0 * eps));
    }
    assert_eq!(autodiff.len(), numeric.len());
    let err = common::max_abs_diff(&autodiff, &numeric);
    assert!(
        err < 1e-6,
        "autodiff vs finite differences: {err}\n{autodiff:?}\n{numeric:?}"
    );
}
