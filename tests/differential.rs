//! Differential attention (Ye et al. 2024) against its equations written out by hand, and its
//! masking, causality and parameter count.

mod common;

use burn::backend::Flex;
use burn::module::{Module, Param};
use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Distribution, Tensor, TensorData};
use common::max_abs_diff;
use coupled_qk::{
    AttentionInput, CoupledQkAttentionConfig, DifferentialAttention, DifferentialAttentionConfig,
    DynamicsConfig, Identity, KvCache, QkDynamics, RotaryConfig, RotaryPosition, StepSizeConfig,
};

type B = Flex;

fn tensor<const D: usize>(values: &[f64], shape: [usize; D]) -> Tensor<B, D> {
    common::tensor(values, shape, &Default::default())
}

fn values<const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    common::values(t)
}

/// `n` fixed values in (−scale, scale), different for every `seed`.
fn fixed(n: usize, seed: f64, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|i| scale * (1.7 * i as f64 + 3.1 * seed + 0.5).sin())
        .collect()
}

/// Every weight of a layer, row-major; projections `[d_in, d_out]` as in Burn's `Linear`.
struct Weights {
    w: [Vec<f64>; 4], // q, k, v, o
    b: [Vec<f64>; 4],
    lambda: [Vec<f64>; 4], // q1, k1, q2, k2
    gamma: Vec<f64>,
}

impl Weights {
    fn fixed(d: usize, d_map: usize) -> Self {
        Self {
            w: [0, 1, 2, 3].map(|i| fixed(d * d, i as f64, 0.8)),
            b: [0, 1, 2, 3].map(|i| fixed(d, 10.0 + i as f64, 0.3)),
            lambda: [0, 1, 2, 3].map(|i| fixed(d_map, 20.0 + i as f64, 0.5)),
            gamma: fixed(2 * d_map, 30.0, 0.5)
                .iter()
                .map(|g| 1.0 + g)
                .collect(),
        }
    }

    fn load(&self, mut layer: DifferentialAttention<B>) -> DifferentialAttention<B> {
        let d = layer.d_model();
        let linears = [
            &mut layer.query,
            &mut layer.key,
            &mut layer.value,
            &mut layer.output,
        ];
        for ((linear, w), b) in linears.into_iter().zip(&self.w).zip(&self.b) {
            linear.weight = Param::from_tensor(tensor(w, [d, d]));
            linear.bias = Some(Param::from_tensor(tensor(b, [d])));
        }
        let d_map = layer.d_map;
        let lambdas = [
            &mut layer.lambda_q1,
            &mut layer.lambda_k1,
            &mut layer.lambda_q2,
            &mut layer.lambda_k2,
        ];
        for (p, v) in lambdas.into_iter().zip(&self.lambda) {
            *p = Param::from_tensor(tensor(v, [d_map]));
        }
        layer.norm.gamma = Param::from_tensor(tensor(&self.gamma, [2 * d_map]));
        layer
    }
}

/// One forward-Euler step `q ← q + dt·k`, `k ← k + dt·f(q)` (both from the old state) of every
/// query/key map, with `f(q) = silu(q·W₁ + b₁)·W₂ + b₂` of the weights in `common::net`'s order.
struct EulerStep<'a> {
    dt: f64,
    net: &'a [f64],
    hidden: usize,
}

impl EulerStep<'_> {
    fn apply(&self, q: &mut [f64], k: &mut [f64], d_map: usize) {
        let h = self.hidden;
        let (w1, rest) = self.net.split_at(d_map * h);
        let (b1, rest) = rest.split_at(h);
        let (w2, b2) = rest.split_at(h * d_map);
        for (q, k) in q.chunks_mut(d_map).zip(k.chunks_mut(d_map)) {
            let hidden: Vec<f64> = (0..h)
                .map(|j| {
                    let z = b1[j] + (0..d_map).map(|i| q[i] * w1[i * h + j]).sum::<f64>();
                    z / (1.0 + (-z).exp())
                })
                .collect();
            let f: Vec<f64> = (0..d_map)
                .map(|i| b2[i] + (0..h).map(|j| hidden[j] * w2[j * d_map + i]).sum::<f64>())
                .collect();
            for i in 0..d_map {
                let (q0, k0) = (q[i], k[i]);
                q[i] = q0 + self.dt * k0;
                k[i] = k0 + self.dt * f[i];
            }
        }
    }
}

/// The layer's equations in plain f64, with loops: `x` is `[seq, d]` row-major.
fn reference(
    x: &[f64],
    w: &Weights,
    [seq, d, heads]: [usize; 3],
    lambda_init: f64,
    causal: bool,
) -> Vec<f64> {
    reference_with(x, w, [seq, d, heads], lambda_init, causal, None)
}

/// [`reference`] with an Euler step of every query/key map before scoring.
fn reference_with(
    x: &[f64],
    w: &Weights,
    [seq, d, heads]: [usize; 3],
    lambda_init: f64,
    causal: bool,
    dynamics: Option<&EulerStep>,
) -> Vec<f64> {
    let d_map = d / (2 * heads);
    let linear = |x: &[f64], w: &[f64], b: &[f64]| -> Vec<f64> {
        let mut y = vec![0.0; seq * d];
        for t in 0..seq {
            for j in 0..d {
                y[t * d + j] = b[j] + (0..d).map(|i| x[t * d + i] * w[i * d + j]).sum::<f64>();
            }
        }
        y
    };
    let (mut q, mut k, v) = (
        linear(x, &w.w[0], &w.b[0]),
        linear(x, &w.w[1], &w.b[1]),
        linear(x, &w.w[2], &w.b[2]),
    );
    if let Some(step) = dynamics {
        // Channels are [2·heads maps × d_map] per token: every d_map-chunk is one map.
        step.apply(&mut q, &mut k, d_map);
    }
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let lambda =
        dot(&w.lambda[0], &w.lambda[1]).exp() - dot(&w.lambda[2], &w.lambda[3]).exp() + lambda_init;
    let mut merged = vec![0.0; seq * d];
    for h in 0..heads {
        // Map m of head h: query/key channels (2h + m)·d_map .. (2h + m + 1)·d_map.
        let map = |m: usize| -> Vec<Vec<f64>> {
            let c0 = (2 * h + m) * d_map;
            (0..seq)
                .map(|t| {
                    let visible = if causal { t + 1 } else { seq };
                    let scores: Vec<f64> = (0..visible)
                        .map(|u| {
                            dot(
                                &q[t * d + c0..t * d + c0 + d_map],
                                &k[u * d + c0..u * d + c0 + d_map],
                            ) / (d_map as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let z: f64 = e.iter().sum();
                    let mut row: Vec<f64> = e.iter().map(|e| e / z).collect();
                    row.resize(seq, 0.0);
                    row
                })
                .collect()
        };
        let (a1, a2) = (map(0), map(1));
        for t in 0..seq {
            let o: Vec<f64> = (0..2 * d_map)
                .map(|c| {
                    (0..seq)
                        .map(|u| (a1[t][u] - lambda * a2[t][u]) * v[u * d + h * 2 * d_map + c])
                        .sum()
                })
                .collect();
            let rms = (o.iter().map(|o| o * o).sum::<f64>() / (2 * d_map) as f64 + 1e-5).sqrt();
            for c in 0..2 * d_map {
                merged[t * d + h * 2 * d_map + c] = o[c] / rms * w.gamma[c] * (1.0 - lambda_init);
            }
        }
    }
    linear(&merged, &w.w[3], &w.b[3])
}

#[test]
fn matches_the_equations_on_a_hand_built_layer() {
    // (seq, d_model, heads, layer_index, causal)
    for (seq, d, heads, layer, causal) in [(3, 4, 1, 1, true), (4, 8, 2, 5, false)] {
        let config = DifferentialAttentionConfig::new(d, heads)
            .with_layer_index(layer)
            .with_causal(causal);
        let weights = Weights::fixed(d, config.d_map());
        let layer = weights.load(config.init::<B>(&Default::default()));
        let x = fixed(seq * d, 40.0, 1.0);
        let got = values(layer.forward(tensor(&x, [1, seq, d])));
        let expected = reference(&x, &weights, [seq, d, heads], config.lambda_init(), causal);
        let err = max_abs_diff(&got, &expected);
        // RmsNorm computes the norm in f32.
        assert!(
            err < 1e-5,
            "heads {heads}: max |Δ| = {err}\n{got:?}\n{expected:?}"
        );
    }
}

#[test]
fn euler_coupling_on_differential_attention_matches_the_equations() {
    let (seq, d, heads, hidden, dt) = (4, 8, 2, 3, 0.4);
    let config = DifferentialAttentionConfig::new(d, heads)
        .with_layer_index(2)
        .with_causal(true)
        .with_dynamics(DynamicsConfig::euler(1))
        .with_coupling_hidden(Some(hidden))
        .with_dt(StepSizeConfig::new().with_init(dt));
    let d_map = config.d_map();
    let weights = Weights::fixed(d, d_map);
    let net_weights = fixed(common::net_size(d_map, hidden), 60.0, 0.7);
    let mut layer = weights.load(config.init::<B>(&Default::default()));
    let QkDynamics::Coupled(dynamics) = &mut layer.dynamics else {
        panic!("euler1 builds coupled dynamics")
    };
    // In f64, like the rest of the hand-built layer.
    dynamics.coupling = common::net(d_map, hidden, &net_weights, &Default::default());
    dynamics.step_size.dt = Param::from_tensor(tensor(&[dt], [1]));
    let x = fixed(seq * d, 70.0, 1.0);
    let got = values(layer.forward(tensor(&x, [1, seq, d])));
    let step = EulerStep {
        dt,
        net: &net_weights,
        hidden,
    };
    let expected = reference_with(
        &x,
        &weights,
        [seq, d, heads],
        config.lambda_init(),
        true,
        Some(&step),
    );
    let err = max_abs_diff(&got, &expected);
    assert!(err < 1e-5, "max |Δ| = {err}");
    // The step matters: plain differential attention is far from it.
    let plain = reference(&x, &weights, [seq, d, heads], config.lambda_init(), true);
    assert!(max_abs_diff(&got, &plain) > 1e-2);
}

#[test]
fn coupling_with_zero_dt_or_zero_affine_nets_is_plain_differential_attention_exactly() {
    use burn::tensor::Distribution;
    use burn::tensor::backend::Backend;
    let device = Default::default();
    for dynamics in [
        DynamicsConfig::euler(1),
        DynamicsConfig::leapfrog(2),
        DynamicsConfig::affine(2),
    ] {
        B::seed(&device, 9);
        let composed = common::materialised(
            DifferentialAttentionConfig::new(8, 1)
                .with_causal(true)
                .with_rotary(Some(RotaryConfig::new(16)))
                .with_dynamics(dynamics.clone())
                .with_dt(StepSizeConfig::new().with_init(0.0))
                .init::<B>(&device),
        );
        let plain = DifferentialAttention {
            dynamics: QkDynamics::Standard(Identity),
            ..composed.clone()
        };
        let x = Tensor::<B, 3>::random([2, 5, 8], Distribution::Normal(0.0, 1.0), &device);
        composed
            .forward(x.clone())
            .into_data()
            .assert_eq(&plain.forward(x).into_data(), true);
        assert!(
            composed.extra_num_params() > plain.extra_num_params(),
            "{dynamics}"
        );
    }
}

#[test]
fn composed_layers_decode_through_the_cache_as_the_full_pass() {
    use burn::tensor::Distribution;
    use burn::tensor::backend::Backend;
    let device = Default::default();
    for dynamics in [DynamicsConfig::euler(2), DynamicsConfig::affine(1)] {
        for position in [
            RotaryPosition::BeforeDynamics,
            RotaryPosition::AfterDynamics,
        ] {
            B::seed(&device, 4);
            let layer = DifferentialAttentionConfig::new(8, 2)
                .with_causal(true)
                .with_dynamics(dynamics.clone())
                .with_dt(StepSizeConfig::new().with_init(0.3))
                .with_rotary(Some(RotaryConfig::new(16).with_position(position)))
                .init::<B>(&device);
            let x = Tensor::<B, 3>::random([2, 6, 8], Distribution::Normal(0.0, 1.0), &device);
            let full = values(layer.forward(x.clone()));
            let mut cache = KvCache::new();
            let parts: Vec<_> = [(0, 1), (1, 3), (4, 2)]
                .into_iter()
                .map(|(start, len)| {
                    layer.forward_cache(x.clone().narrow(1, start, len), &mut cache)
                })
                .collect();
            let cached = values(Tensor::cat(parts, 1));
            let err = max_abs_diff(&full, &cached);
            assert!(err < 1e-5, "{dynamics}, {position:?}: max |Δ| = {err}");
        }
    }
}

#[test]
fn lambda_is_lambda_init_when_the_lambda_vectors_are_zero() {
    let config = DifferentialAttentionConfig::new(8, 1).with_layer_index(3);
    let mut layer = config.init::<B>(&Default::default());
    assert!((values(layer.lambda())[0] - config.lambda_init()).abs() > 1e-6);
    for p in [
        &mut layer.lambda_q1,
        &mut layer.lambda_k1,
        &mut layer.lambda_q2,
        &mut layer.lambda_k2,
    ] {
        *p = Param::from_tensor(tensor(&[0.0; 4], [4]));
    }
    // exp(0) − exp(0) + λ_init; λ_init(3) = 0.8 − 0.6·exp(−0.9) = 0.8 − 0.6·0.40656966 = 0.55605820
    let lambda = values(layer.lambda())[0];
    assert!((lambda - config.lambda_init()).abs() < 1e-12, "{lambda}");
    assert!((lambda - 0.556_058_204_2).abs() < 1e-9, "{lambda}");
}

/// With `λ = 0` the second map drops out: the layer is a standard head over the first maps
/// with a value twice as wide, RMS-normed and scaled by `1 − λ_init`.
#[test]
fn with_lambda_zero_the_second_map_is_irrelevant() {
    let (d, seq, layer_index) = (8, 5, 2);
    let config = DifferentialAttentionConfig::new(d, 1)
        .with_layer_index(layer_index)
        .with_causal(true);
    let d_map = config.d_map();
    let lambda_init = config.lambda_init();
    let mut weights = Weights::fixed(d, d_map);
    // exp(0·0) − exp(ln(1 + λ_init)·1) + λ_init = 1 − (1 + λ_init) + λ_init = 0.
    weights.lambda = [
        vec![0.0; d_map],
        vec![0.0; d_map],
        [(1.0 + lambda_init).ln()]
            .into_iter()
            .chain(vec![0.0; d_map - 1])
            .collect(),
        [1.0].into_iter().chain(vec![0.0; d_map - 1]).collect(),
    ];
    let layer = weights.load(config.init::<B>(&Default::default()));
    assert!(values(layer.lambda())[0].abs() < 1e-12);
    let x = tensor(&fixed(seq * d, 50.0, 1.0), [1, seq, d]);
    let got = layer.forward(x.clone());

    // Standard attention over the first query/key maps, with Burn ops.
    let q1 = layer.query.forward(x.clone()).narrow(2, 0, d_map);
    let k1 = layer.key.forward(x.clone()).narrow(2, 0, d_map);
    let v = layer.value.forward(x);
    let scores = q1
        .matmul(k1.swap_dims(1, 2))
        .div_scalar((d_map as f64).sqrt());
    let future = Tensor::<B, 2, Bool>::tril_mask([seq, seq], 0, &Default::default());
    let a = softmax(
        scores.mask_fill(future.unsqueeze::<3>(), f64::NEG_INFINITY),
        2,
    );
    let head = layer
        .norm
        .forward(a.matmul(v))
        .mul_scalar(1.0 - lambda_init);
    let expected = layer.output.forward(head);
    let err = max_abs_diff(&values(got.clone()), &values(expected.clone()));
    assert!(err < 1e-6, "max |Δ| = {err}");

    // The second maps' weights do not matter at λ = 0 ...
    let mut other = weights;
    other.w[0] = other.w[0]
        .iter()
        .enumerate()
        .map(|(i, w)| if i % d >= d_map { -3.0 * w + 0.1 } else { *w })
        .collect();
    let x = tensor(&fixed(seq * d, 50.0, 1.0), [1, seq, d]);
    let changed = other.load(config.init::<B>(&Default::default()));
    let err = max_abs_diff(
        &values(changed.forward(x.clone())),
        &values(expected.clone()),
    );
    assert!(err < 1e-6, "max |Δ| = {err}");
    // ... and do once λ ≠ 0.
    let mut changed = changed;
    changed.lambda_q2 = Param::from_tensor(tensor(&vec![0.0; d_map], [d_map]));
    let err = max_abs_diff(&values(changed.forward(x)), &values(expected));
    assert!(err > 1e-3, "max |Δ| = {err}");
}

#[test]
fn outputs_do_not_depend_on_later_tokens() {
    use burn::tensor::backend::Backend;
    let device = Default::default();
    B::seed(&device, 7);
    let layer = DifferentialAttentionConfig::new(16, 2)
        .with_causal(true)
        .with_rotary(Some(RotaryConfig::new(8)))
        .init::<B>(&device);
    let x = Tensor::<B, 3>::random([2, 6, 16], Distribution::Normal(0.0, 1.0), &device);
    let later = Tensor::<B, 3>::random([2, 2, 16], Distribution::Normal(0.0, 1.0), &device);
    let y = x.clone().slice_assign([0..2, 4..6, 0..16], later);
    let (a, b) = (layer.forward(x), layer.forward(y));
    let early = |t: Tensor<B, 3>| values(t.slice([0..2, 0..4, 0..16]));
    assert!(max_abs_diff(&early(a.clone()), &early(b.clone())) < 1e-6);
    let late = |t: Tensor<B, 3>| values(t.slice([0..2, 4..6, 0..16]));
    assert!(max_abs_diff(&late(a), &late(b)) > 1e-3);
}

#[test]
fn a_causal_attention_mask_equals_the_causal_flag_and_padding_hides_keys() {
    use burn::tensor::backend::Backend;
    let device = Default::default();
    B::seed(&device, 3);
    let config = DifferentialAttentionConfig::new(16, 2);
    let open = config.init::<B>(&device);
    let x = Tensor::<B, 3>::random([2, 5, 16], Distribution::Normal(0.0, 1.0), &device);
    // Burn's parameters are initialised lazily, and a clone of an uninitialised one draws
    // its own values: run the layer once before cloning it.
    open.forward(x.clone());
    let causal = DifferentialAttention {
        causal: true,
        ..open.clone()
    };
    let future = Tensor::<B, 2, Bool>::tril_mask([5, 5], 0, &device)
        .unsqueeze::<3>()
        .expand([2, 5, 5]);
    let masked = open.forward(AttentionInput::new(x.clone()).mask_attn(future));
    let err = max_abs_diff(&values(masked), &values(causal.forward(x.clone())));
    assert!(err < 1e-6, "{err}");
    // Padding the last key = dropping it, for the first four queries.
    let pad = Tensor::<B, 1, Bool>::from_bool(
        TensorData::new(vec![false, false, false, false, true], [5]),
        &device,
    )
    .unsqueeze::<2>()
    .expand([2, 5]);
    let padded = open.forward(AttentionInput::new(x.clone()).mask_pad(pad));
    let short = open.forward(x.slice([0..2, 0..4, 0..16]));
    let err = max_abs_diff(&values(padded.slice([0..2, 0..4, 0..16])), &values(short));
    assert!(err < 1e-6, "{err}");
}

#[test]
fn parameters_equal_a_standard_layer_plus_the_lambdas_and_the_norm() {
    let device = Default::default();
    // d_model 64, 4 differential heads: d_map = 64 / 8 = 8.
    let config = DifferentialAttentionConfig::new(64, 4);
    let layer = config.init::<B>(&device);
    // 4 projections of 64·64 + 64, then 4 λ vectors of 8 and a norm weight of 2·8.
    assert_eq!(layer.num_params(), 4 * (64 * 64 + 64) + 4 * 8 + 2 * 8);
    assert_eq!(layer.num_params(), 16_688);
    assert_eq!(layer.extra_num_params(), 48);
    assert_eq!(config.extra_num_params(), 48);
    let standard = CoupledQkAttentionConfig::new(64, 8)
        .with_dynamics(DynamicsConfig::Standard)
        .init::<B>(&device);
    assert_eq!(
        layer.num_params(),
        standard.num_params() + layer.extra_num_params()
    );
}

#[test]
#[should_panic(expected = "expected input [batch, seq, d_model = 16]")]
fn a_wrong_width_names_the_expected_shape() {
    let layer = DifferentialAttentionConfig::new(16, 2).init::<B>(&Default::default());
    layer.forward(Tensor::<B, 3>::zeros([1, 3, 8], &Default::default()));
}

#[test]
fn cached_decoding_equals_the_full_forward() {
    use coupled_qk::KvCache;
    let device = Default::default();
    for rotary in [None, Some(RotaryConfig::new(16))] {
        let layer = DifferentialAttentionConfig::new(16, 2)
            .with_layer_index(1)
            .with_rotary(rotary.clone())
            .with_causal(true)
            .init::<B>(&device);
        let x = Tensor::<B, 3>::random([2, 7, 16], Distribution::Default, &device);
        let full = layer.forward(x.clone());
        let mut cache = KvCache::new();
        let mut parts = Vec::new();
        let mut start = 0;
        for n in [3, 1, 2, 1] {
            parts.push(layer.forward_cache(x.clone().slice([0..2, start..start + n]), &mut cache));
            start += n;
        }
        assert_eq!(cache.len(), 7);
        let err = max_abs_diff(&values(Tensor::cat(parts, 1)), &values(full));
        assert!(err < 1e-5, "rotary {}: |Δ| = {err}", rotary.is_some());
    }
}
