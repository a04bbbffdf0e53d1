//! One layer of the affine coupling on host slices,
//!
//! ```text
//! k ← k ⊙ exp(s₁(a)) + t₁(a)        then        q ← q ⊙ exp(s₂(b)) + t₂(b)
//! ```
//!
//! with `a = q`, `b` the new `k` (coupled) or `a = k`, `b = q` (the uncoupled control), and
//! `s = B·tanh(raw/B)`. Chunks of tokens run in parallel; the backward pass recomputes a chunk's
//! nets and scales.

use super::net::{self, Layout, NetGrads, NetWeights, Scratch};
use crate::host_math::exp_in_place;
use rayon::prelude::*;

/// Rows (tokens × heads) per chunk.
const CHUNK_ROWS: usize = 256;

/// One affine layer of nets on host slices.
pub(crate) struct Affine<'a> {
    pub(crate) layout: Layout,
    /// `s₁`, `t₁`, `s₂`, `t₂`.
    pub(crate) nets: [NetWeights<'a>; 4],
    pub(crate) bound: f32,
    pub(crate) coupled: bool,
}

/// The gradients of the inputs and of the four nets (in the order of [`Affine::nets`]).
pub(crate) struct AffineGrads {
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) nets: [NetGrads; 4],
}

/// A move's bounded log-scale `s`, its `exp(s)` and its shift `t` for a chunk's rows.
struct Move {
    log_scale: Vec<f32>,
    scale: Vec<f32>,
    shift: Vec<f32>,
}

impl Affine<'_> {
    fn chunk_len(&self) -> usize {
        CHUNK_ROWS.div_ceil(self.layout.heads).max(1) * self.layout.heads * self.layout.d
    }

    /// `s`, `exp(s)` and `t` of the nets `scale_net`, `scale_net + 1` at `by`.
    fn moves(&self, scale_net: usize, by: &[f32], scratch: &mut Scratch) -> Move {
        let tokens = by.len() / (self.layout.heads * self.layout.d);
        let mut log_scale = vec![0.0; by.len()];
        let mut shift = vec![0.0; by.len()];
        for group in self.layout.groups(tokens) {
            let (s, t) = (&self.nets[scale_net], &self.nets[scale_net + 1]);
            net::forward(s, &self.layout, &group, by, &mut log_scale, scratch);
            net::forward(t, &self.layout, &group, by, &mut shift, scratch);
        }
        // s = B·tanh(raw/B) = B·(1 − 2/(exp(2·raw/B) + 1)).
        let b = self.bound;
        log_scale.iter_mut().for_each(|x| *x *= 2.0 / b);
        exp_in_place(&mut log_scale);
        log_scale
            .iter_mut()
            .for_each(|x| *x = b * (1.0 - 2.0 / (*x + 1.0)));
        let mut scale = log_scale.clone();
        exp_in_place(&mut scale);
        Move {
            log_scale,
            scale,
            shift,
        }
    }

    /// `x ← x ⊙ exp(s) + t`.
    fn apply(x: &mut [f32], m: &Move) {
        for ((x, e), t) in x.iter_mut().zip(&m.scale).zip(&m.shift) {
            *x = *x * e + t;
        }
    }

    /// The transformed `(q, k)` of `[tokens, heads, d]` inputs.
    pub(crate) fn forward(&self, q: &[f32], k: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let (mut q, mut k) = (q.to_vec(), k.to_vec());
        let chunk = self.chunk_len();
        q.par_chunks_mut(chunk)
            .zip(k.par_chunks_mut(chunk))
            .for_each(|(q, k)| {
                let mut scratch = Scratch::default();
                let keys = self.moves(0, if self.coupled { q } else { k }, &mut scratch);
                Self::apply(k, &keys);
                let queries = self.moves(2, if self.coupled { k } else { q }, &mut scratch);
                Self::apply(q, &queries);
            });
        (q, k)
    }

    /// The gradients of the inputs and nets, given those of the outputs.
    pub(crate) fn backward(
        &self,
        q: &[f32],
        k: &[f32],
        grad_q: &[f32],
        grad_k: &[f32],
    ) -> AffineGrads {
        let chunk = self.chunk_len();
        let (mut gq, mut gk) = (grad_q.to_vec(), grad_k.to_vec());
        let zeros = || std::array::from_fn(|_| NetGrads::zeros(&self.layout));
        let nets = gq
            .par_chunks_mut(chunk)
            .zip(gk.par_chunks_mut(chunk))
            .zip(q.par_chunks(chunk).zip(k.par_chunks(chunk)))
            .map(|((gq, gk), (q, k))| self.backward_chunk(q, k, gq, gk))
            .reduce(zeros, |mut nets: [NetGrads; 4], other| {
                nets.iter_mut().zip(&other).for_each(|(a, b)| a.add(b));
                nets
            });
        AffineGrads { q: gq, k: gk, nets }
    }

    /// One chunk: `gq`, `gk` hold the outputs' gradients on entry, the inputs' on return.
    fn backward_chunk(
        &self,
        q: &[f32],
        k: &[f32],
        gq: &mut [f32],
        gk: &mut [f32],
    ) -> [NetGrads; 4] {
        let tokens = q.len() / (self.layout.heads * self.layout.d);
        let groups = self.layout.groups(tokens);
        let mut scratch = Scratch::default();
        let mut grads: [NetGrads; 4] = std::array::from_fn(|_| NetGrads::zeros(&self.layout));
        // The forward pass again: the new k, and each move's scales.
        let first_by = if self.coupled { q } else { k };
        let keys = self.moves(0, first_by, &mut scratch);
        let mut k1 = k.to_vec();
        Self::apply(&mut k1, &keys);
        let second_by: &[f32] = if self.coupled { &k1 } else { q };
        let queries = self.moves(2, second_by, &mut scratch);

        // q₁ = q ⊙ e₂ + t₂(b): back to q, s₂, t₂ and b.
        let mut grad_by = vec![0.0; q.len()];
        let (grad_log_scale, grad_shift) = self.move_backward(&queries, q, gq);
        for group in &groups {
            let s = (&self.nets[2], &grad_log_scale);
            let t = (&self.nets[3], &grad_shift);
            let [.., gs, gt] = &mut grads;
            for ((weights, grad_out), grads) in [s, t].into_iter().zip([gs, gt]) {
                net::backward(
                    weights,
                    &self.layout,
                    group,
                    second_by,
                    grad_out,
                    &mut grad_by,
                    grads,
                    &mut scratch,
                );
            }
        }
        // The query's own path: gq ← gq ⊙ e₂ (after the shift's gradient was taken).
        gq.iter_mut().zip(&queries.scale).for_each(|(g, e)| *g *= e);
        let into = if self.coupled { &mut *gk } else { &mut *gq };
        into.iter_mut().zip(&grad_by).for_each(|(g, b)| *g += b);

        // k₁ = k ⊙ e₁ + t₁(a).
        grad_by.fill(0.0);
        let (grad_log_scale, grad_shift) = self.move_backward(&keys, k, gk);
        for group in &groups {
            let s = (&self.nets[0], &grad_log_scale);
            let t = (&self.nets[1], &grad_shift);
            let [gs, gt, ..] = &mut grads;
            for ((weights, grad_out), grads) in [s, t].into_iter().zip([gs, gt]) {
                net::backward(
                    weights,
                    &self.layout,
                    group,
                    first_by,
                    grad_out,
                    &mut grad_by,
                    grads,
                    &mut scratch,
                );
            }
        }
        gk.iter_mut().zip(&keys.scale).for_each(|(g, e)| *g *= e);
        let into = if self.coupled { &mut *gq } else { &mut *gk };
        into.iter_mut().zip(&grad_by).for_each(|(g, b)| *g += b);
        grads
    }

    /// For `y = x ⊙ exp(s) + t` with `s = B·tanh(raw/B)`: the gradients of `raw` and of `t`
    /// (a copy of `grad_y`'s) given that of `y`.
    fn move_backward(&self, m: &Move, x: &[f32], grad_y: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let b = self.bound;
        let grad_raw = grad_y
            .iter()
            .zip(x)
            .zip(m.scale.iter().zip(&m.log_scale))
            .map(|((g, x), (e, s))| {
                let tanh = s / b;
                g * x * e * (1.0 - tanh * tanh)
            })
            .collect();
        (grad_raw, grad_y.to_vec())
    }
}
