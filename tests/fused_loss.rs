//! The fused linear cross-entropy against the explicit path (`log_softmax` of the full logits,
//! gathered at the targets) on Flex: the loss and the gradients of the hidden states, the head
//! and the bias, over chunk sizes that do and do not divide the rows, with and without a weight
//! mask; the GPT's loss through its final hidden states, tied and untied head, every parameter's
//! gradient; and the plain chunked forward. Needs the `autodiff` feature:
//! `cargo test -p coupled-qk --features flex,autodiff --test fused_loss`.
#![cfg(feature = "autodiff")]

mod common;

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use common::values;
use coupled_qk::model::{
    Gpt, GptConfig, default_chunk_rows, fused_linear_cross_entropy, linear_cross_entropy,
    mask_ignored_targets,
};

type Ad = Autodiff<Flex>;

/// Loss and gradients agree to this, relative to the largest magnitude of the reference.
const TOL: f64 = 1e-5;

const N: usize = 10;
const D: usize = 8;
const VOCAB: usize = 13;

/// Chunk sizes: single rows, sizes that leave a shorter last chunk (3, 4, 7), exactly `N`, more
/// than `N`, and the default.
fn chunk_sizes() -> [usize; 7] {
    [1, 3, 4, 7, N, 64, default_chunk_rows(VOCAB)]
}

/// A parameter's gradient whose every entry is below this fraction of the model's largest
/// gradient entry is zero up to f32 rounding.
const ZERO: f64 = 1e-5;

fn largest(values: &[f64]) -> f64 {
    values.iter().fold(0.0f64, |m, x| m.max(x.abs()))
}

/// `max |a − b| / max |reference|`, asserted to be at most [`TOL`].
fn assert_close(reference: &[f64], other: &[f64], what: &str) {
    assert_eq!(reference.len(), other.len(), "{what}: length");
    let scale = largest(reference);
    assert!(scale > 0.0, "{what}: the reference is all zeros");
    let err = common::max_abs_diff(reference, other) / scale;
    assert!(err <= TOL, "{what}: relative difference {err:e} > {TOL:e}");
}

/// Pseudo-random values of spread 1.5 from `seed` alone (splitmix64): the backend's seed is
/// global, and another test running at once could reseed it between a seed and a draw.
fn random<const R: usize>(shape: [usize; R], seed: u64) -> Tensor<Ad, R> {
    random_on::<Ad, R>(shape, seed)
}

fn random_on<B: Backend, const R: usize>(shape: [usize; R], seed: u64) -> Tensor<B, R> {
    common::fixed_uniform(shape, seed, 2.6, &Default::default()) // std 1.5
}

fn targets<B: Backend>(device: &B::Device) -> Tensor<B, 1, Int> {
    let ids: Vec<i64> = (0..N).map(|i| ((i * 5 + 2) % VOCAB) as i64).collect();
    Tensor::from_data(TensorData::new(ids, [N]), device)
}

/// A mask with ignored rows (0) and a fractional weight, to catch a weight applied in one pass
/// and not the other.
fn mask<B: Backend>(device: &B::Device) -> Tensor<B, 1> {
    let w: Vec<f32> = (0..N)
        .map(|i| match i % 4 {
            0 => 0.0,
            1 => 0.5,
            _ => 1.0,
        })
        .collect();
    Tensor::from_data(TensorData::new(w, [N]), device)
}

/// The explicit path: `Σ weight · (−log_softmax(hidden · headᵀ + bias)[target])`.
fn explicit<B: Backend>(
    hidden: Tensor<B, 2>,
    head: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    targets: Tensor<B, 1, Int>,
    weight: Option<Tensor<B, 1>>,
) -> Tensor<B, 1> {
    let [n, _] = hidden.dims();
    let logits = hidden.matmul(head.transpose());
    let logits = match bias {
        Some(bias) => logits + bias.unsqueeze(),
        None => logits,
    };
    let nats = log_softmax(logits, 1)
        .gather(1, targets.reshape([n, 1]))
        .reshape([n])
        .neg();
    match weight {
        Some(weight) => (nats * weight).sum(),
        None => nats.sum(),
    }
}

/// The loss and the gradients of hidden, head and bias, by `loss`.
fn loss_and_grads(
    with_bias: bool,
    with_mask: bool,
    loss: impl Fn(
        Tensor<Ad, 2>,
        Tensor<Ad, 2>,
        Option<Tensor<Ad, 1>>,
        Tensor<Ad, 1, Int>,
        Option<Tensor<Ad, 1>>,
    ) -> Tensor<Ad, 1>,
) -> Vec<Vec<f64>> {
    let device = Default::default();
    let hidden = random([N, D], 1).require_grad();
    let head = random([VOCAB, D], 2).require_grad();
    let bias = with_bias.then(|| random([VOCAB], 3).require_grad());
    let weight = with_mask.then(|| mask(&device));
    let out = loss(
        hidden.clone(),
        head.clone(),
        bias.clone(),
        targets(&device),
        weight,
    );
    let grads = out.backward();
    let mut found = vec![
        values(out),
        values(hidden.grad(&grads).expect("hidden gradient")),
        values(head.grad(&grads).expect("head gradient")),
    ];
    if let Some(bias) = bias {
        found.push(values(bias.grad(&grads).expect("bias gradient")));
    }
    found
}

#[test]
fn loss_and_gradients_equal_the_explicit_path_for_every_chunk_size() {
    for with_bias in [false, true] {
        for with_mask in [false, true] {
            let expected = loss_and_grads(with_bias, with_mask, explicit);
            for chunk in chunk_sizes() {
                let got = loss_and_grads(with_bias, with_mask, |h, w, b, t, m| {
                    fused_linear_cross_entropy(h, w, b, t, m, chunk)
                });
                let case = format!("chunk {chunk}, bias {with_bias}, mask {with_mask}");
                for (i, name) in ["loss", "hidden grad", "head grad", "bias grad"]
                    .iter()
                    .enumerate()
                    .take(expected.len())
                {
                    assert_close(&expected[i], &got[i], &format!("{case}: {name}"));
                }
            }
        }
    }
}

#[test]
fn the_mean_over_a_mask_and_a_scaled_loss_scale_the_gradients() {
    // What the training loop does: divide the sum by Σ weight (or n), then by more (gradient
    // accumulation). The incoming gradient must reach every term.
    let mean = |h, w, b, t, m: Option<Tensor<Ad, 1>>| {
        let total = m.clone().expect("a mask").sum();
        fused_linear_cross_entropy(h, w, b, t, m, 3) / total * 0.25
    };
    let reference = |h, w, b, t, m: Option<Tensor<Ad, 1>>| {
        let total = m.clone().expect("a mask").sum();
        explicit(h, w, b, t, m) / total * 0.25
    };
    let expected = loss_and_grads(true, true, reference);
    let got = loss_and_grads(true, true, mean);
    for (i, name) in ["loss", "hidden grad", "head grad", "bias grad"]
        .iter()
        .enumerate()
    {
        assert_close(&expected[i], &got[i], name);
    }
}

#[test]
fn only_the_inputs_that_require_a_gradient_get_one() {
    let device = Default::default();
    // A frozen head: the hidden states still get their gradient.
    let hidden = random([N, D], 1).require_grad();
    let head = random([VOCAB, D], 2);
    let loss = fused_linear_cross_entropy(
        hidden.clone(),
        head.clone(),
        None,
        targets(&device),
        None,
        4,
    );
    let grads = loss.backward();
    let expected = explicit(hidden.clone(), head.clone(), None, targets(&device), None).backward();
    assert!(head.grad(&grads).is_none());
    assert_close(
        &values(hidden.grad(&expected).unwrap()),
        &values(hidden.grad(&grads).unwrap()),
        "hidden grad with a frozen head",
    );
    // Constant hidden states (e.g. a frozen body): only the head learns.
    let hidden = random([N, D], 1);
    let head = random([VOCAB, D], 2).require_grad();
    let loss = fused_linear_cross_entropy(
        hidden.clone(),
        head.clone(),
        None,
        targets(&device),
        None,
        4,
    );
    let grads = loss.backward();
    let expected = explicit(hidden.clone(), head.clone(), None, targets(&device), None).backward();
    assert!(hidden.grad(&grads).is_none());
    assert_close(
        &values(head.grad(&expected).unwrap()),
        &values(head.grad(&grads).unwrap()),
        "head grad with constant hidden states",
    );
}

#[test]
fn the_plain_chunked_forward_equals_the_explicit_path() {
    let device = Default::default();
    Flex::seed(&device, 4);
    let hidden = random_on::<Flex, 2>([N, D], 11);
    let head = random_on::<Flex, 2>([VOCAB, D], 12);
    let bias = random_on::<Flex, 1>([VOCAB], 13);
    for weight in [None, Some(mask::<Flex>(&device))] {
        let expected = values(explicit(
            hidden.clone(),
            head.clone(),
            Some(bias.clone()),
            targets(&device),
            weight.clone(),
        ));
        for chunk in chunk_sizes() {
            let got = values(linear_cross_entropy(
                hidden.clone(),
                head.clone(),
                Some(bias.clone()),
                targets(&device),
                weight.clone(),
                chunk,
            ));
            assert_close(&expected, &got, &format!("plain forward, chunk {chunk}"));
        }
    }
}

#[test]
#[should_panic(expected = "does not match hidden")]
fn a_head_of_another_width_is_refused() {
    let device = Default::default();
    let _ = fused_linear_cross_entropy(
        random([N, D], 1),
        random([VOCAB, D + 1], 2),
        None,
        targets(&device),
        None,
        4,
    );
}

#[test]
fn a_target_outside_the_vocabulary_is_refused_naming_it_on_both_paths() {
    let device = Default::default();
    let bad: Vec<i64> = (0..N as i64)
        .map(|i| if i == 6 { VOCAB as i64 } else { i % 3 })
        .collect();
    let bad = Tensor::<Ad, 1, Int>::from_data(TensorData::new(bad, [N]), &device);
    let negative: Vec<i64> = (0..N as i64)
        .map(|i| if i == 2 { -100 } else { 1 })
        .collect();
    let negative = Tensor::<Ad, 1, Int>::from_data(TensorData::new(negative, [N]), &device);
    for (targets, expected) in [
        (
            bad,
            format!("target {VOCAB} of row 6 is outside the vocabulary 0..{VOCAB}"),
        ),
        (
            negative,
            format!("target -100 of row 2 is outside the vocabulary 0..{VOCAB}"),
        ),
    ] {
        for fused in [true, false] {
            let targets = targets.clone();
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                let (hidden, head) = (random([N, D], 1), random([VOCAB, D], 2));
                match fused {
                    true => fused_linear_cross_entropy(hidden, head, None, targets, None, 4),
                    false => linear_cross_entropy(hidden, head, None, targets, None, 4),
                }
            }))
            .expect_err("an out-of-range target was accepted");
            let message = panicked
                .downcast_ref::<String>()
                .expect("a formatted message");
            assert!(
                message.contains(&expected) && message.contains("mask_ignored_targets"),
                "{message}"
            );
        }
    }
}

#[test]
fn ignored_targets_add_nothing_to_the_loss_or_the_gradients() {
    // PyTorch's convention: -100 marks rows without a target. Through the weight mask, the loss
    // and gradients are those of the explicit loss over the kept rows alone.
    let device = Default::default();
    let ids: Vec<i64> = (0..N)
        .map(|i| {
            if i % 3 == 1 {
                -100
            } else {
                ((i * 5 + 2) % VOCAB) as i64
            }
        })
        .collect();
    let kept: Vec<f32> = ids
        .iter()
        .map(|&t| f32::from(u8::from(t != -100)))
        .collect();
    let with_ignored = Tensor::<Ad, 1, Int>::from_data(TensorData::new(ids.clone(), [N]), &device);
    let zeroed: Vec<i64> = ids.iter().map(|&t| t.max(0)).collect();
    let reference = |h, w, b, _t, _m| {
        let targets =
            Tensor::<Ad, 1, Int>::from_data(TensorData::new(zeroed.clone(), [N]), &device);
        let weight = Tensor::<Ad, 1>::from_data(TensorData::new(kept.clone(), [N]), &device);
        explicit(h, w, b, targets, Some(weight))
    };
    let masked = |h, w, b, _t, _m| {
        let (targets, weight) = mask_ignored_targets(with_ignored.clone(), None, -100);
        fused_linear_cross_entropy(h, w, b, targets, Some(weight), 3)
    };
    let expected = loss_and_grads(true, false, reference);
    let got = loss_and_grads(true, false, masked);
    for (i, name) in ["loss", "hidden grad", "head grad", "bias grad"]
        .iter()
        .enumerate()
    {
        assert_close(&expected[i], &got[i], name);
    }
    // A weight given as well multiplies in.
    let (_, weight) = mask_ignored_targets(with_ignored, Some(mask(&device)), -100);
    let expected: Vec<f64> = values(mask::<Ad>(&device))
        .iter()
        .zip(&kept)
        .map(|(w, k)| w * f64::from(*k))
        .collect();
    assert_eq!(values(weight), expected);
}

/// Every float parameter's gradient, in the module's visiting order.
struct Grads<'a> {
    grads: &'a <Ad as AutodiffBackend>::Gradients,
    found: Vec<Option<Vec<f64>>>,
}

impl ModuleVisitor<Ad> for Grads<'_> {
    fn visit_float<const R: usize>(&mut self, param: &Param<Tensor<Ad, R>>) {
        self.found.push(param.val().grad(self.grads).map(values));
    }
}

/// A small GPT with its head tied to the embedding or not. The only draw from the backend's
/// global seed in this file, so that it is the same model every run.
fn gpt(tied: bool) -> Gpt<Ad> {
    let device = Default::default();
    Ad::seed(&device, 9);
    common::materialised(
        GptConfig::new(VOCAB, 16, 2, 2, 8)
            .with_tie_embeddings(tied)
            .init::<Ad>(&device),
    )
}

/// The GPT's loss (`fused` or explicit) on a fixed batch, and every parameter's gradient. Both
/// paths take the same model: the backend's seed is shared by the tests that run at once.
fn gpt_loss(model: &Gpt<Ad>, fused: bool, chunk: usize) -> (Vec<f64>, Vec<Option<Vec<f64>>>) {
    let device = Default::default();
    let (rows, seq) = (2, 7);
    let ids: Vec<i64> = (0..rows * (seq + 1))
        .map(|i| ((i * 7 + 3) % VOCAB) as i64)
        .collect();
    let tokens = Tensor::<Ad, 2, Int>::from_data(TensorData::new(ids, [rows, seq + 1]), &device);
    let inputs = tokens.clone().slice([0..rows, 0..seq]);
    let targets = tokens.slice([0..rows, 1..seq + 1]).reshape([rows * seq]);
    let loss = if fused {
        let hidden = model.forward_hidden(inputs).reshape([rows * seq, 16]);
        fused_linear_cross_entropy(
            hidden,
            model.head_weight(),
            model.head_bias(),
            targets,
            None,
            chunk,
        )
    } else {
        let logits = model.forward(inputs).reshape([rows * seq, VOCAB]);
        log_softmax(logits, 1)
            .gather(1, targets.reshape([rows * seq, 1]))
            .sum()
            .neg()
    };
    let loss = loss / (rows * seq) as f64;
    let grads = loss.backward();
    let mut visitor = Grads {
        grads: &grads,
        found: Vec::new(),
    };
    model.visit(&mut visitor);
    (values(loss), visitor.found)
}

#[test]
fn the_gpt_loss_through_its_hidden_states_equals_its_logits_loss_tied_and_untied() {
    for tied in [true, false] {
        let model = gpt(tied);
        let (expected_loss, expected) = gpt_loss(&model, false, 0);
        let zero = ZERO
            * largest(
                &expected
                    .iter()
                    .flatten()
                    .flatten()
                    .copied()
                    .collect::<Vec<_>>(),
            );
        for chunk in [3, 5, 14] {
            let (loss, got) = gpt_loss(&model, true, chunk);
            let case = format!("tied {tied}, chunk {chunk}");
            assert_close(&expected_loss, &loss, &format!("{case}: loss"));
            assert_eq!(expected.len(), got.len(), "{case}: parameter count");
            for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
                let (Some(e), Some(g)) = (e, g) else {
                    panic!("{case}: parameter {i} has a gradient on one path only");
                };
                let what = format!("{case}: gradient of parameter {i}");
                if largest(e) < zero {
                    // A gradient that is zero but for rounding (a key bias: softmax ignores a
                    // shift of every score of a row) has no scale of its own: its rounding is
                    // that of the model's gradients, so the difference is measured against those.
                    let diff = common::max_abs_diff(e, g);
                    assert!(
                        diff <= TOL * zero / ZERO,
                        "{what}: differs by {diff:e} where 0"
                    );
                } else {
                    assert_close(e, g, &what);
                }
            }
        }
    }
}
