//! One move of the affine coupling on host slices,
//!
//! ```text
//! y = x ⊙ exp(s(a)) + t(a),        s = B·tanh(raw/B)
//! ```
//!
//! with `raw` and `t` two coupling nets of `a`. An affine layer is two moves: `k` moved by nets
//! of `q`, then `q` by nets of the new `k` (the uncoupled control: each by nets of itself, `a =
//! x`). Each move has one output, so each is one op. Chunks of tokens run in parallel; the
//! backward pass recomputes a chunk's nets and scales.

use super::net::{self, Layout, NetGrads, NetWeights, Scratch};
use crate::host_math::exp_in_place;
use rayon::prelude::*;

/// Rows (tokens × heads) per chunk, rounded up to whole tokens.
const CHUNK_ROWS: usize = 512;

/// One affine move of nets on host slices.
pub(crate) struct AffineMove<'a> {
    pub(crate) layout: Layout,
    /// The log-scale net `s` (before the bound) and the shift net `t`.
    pub(crate) nets: [NetWeights<'a>; 2],
    pub(crate) bound: f32,
}

/// The gradients of a move's inputs `x` and `a`, and of its two nets.
pub(crate) struct AffineMoveGrads {
    pub(crate) x: Vec<f32>,
    pub(crate) by: Vec<f32>,
    pub(crate) nets: [NetGrads; 2],
}

impl AffineMove<'_> {
    fn chunk_len(&self) -> usize {
        CHUNK_ROWS.div_ceil(self.layout.heads).max(1) * self.layout.heads * self.layout.d
    }

    /// The bounded log-scale `s` at a chunk's `by`, written into `log_scale`, and with `shift`
    /// the shift `t`.
    fn nets(
        &self,
        by: &[f32],
        log_scale: &mut [f32],
        mut shift: Option<&mut [f32]>,
        scratch: &mut Scratch,
    ) {
        let tokens = by.len() / (self.layout.heads * self.layout.d);
        for group in self.layout.groups(tokens) {
            let [s, t] = &self.nets;
            net::forward(s, &self.layout, &group, by, log_scale, scratch);
            if let Some(shift) = shift.as_deref_mut() {
                net::forward(t, &self.layout, &group, by, shift, scratch);
            }
        }
        // s = B·tanh(raw/B) = B·(1 − 2/(exp(2·raw/B) + 1)).
        let b = self.bound;
        log_scale.iter_mut().for_each(|x| *x *= 2.0 / b);
        exp_in_place(log_scale);
        log_scale
            .iter_mut()
            .for_each(|x| *x = b * (1.0 - 2.0 / (*x + 1.0)));
    }

    /// `y` of `[tokens, heads, d]` inputs `x` and `by`.
    pub(crate) fn forward(&self, x: &[f32], by: &[f32]) -> Vec<f32> {
        let mut y = vec![0.0; x.len()];
        let chunk = self.chunk_len();
        y.par_chunks_mut(chunk)
            .zip(x.par_chunks(chunk).zip(by.par_chunks(chunk)))
            .for_each(|(y, (x, by))| {
                let mut scratch = Scratch::default();
                let mut scale = vec![0.0; y.len()];
                self.nets(by, &mut scale, Some(y), &mut scratch);
                exp_in_place(&mut scale);
                // y holds t: y = x·exp(s) + t.
                for ((y, x), e) in y.iter_mut().zip(x).zip(&scale) {
                    *y += x * e;
                }
            });
        y
    }

    /// The gradients of the inputs and nets, given that of `y`.
    pub(crate) fn backward(&self, x: &[f32], by: &[f32], grad_y: &[f32]) -> AffineMoveGrads {
        let chunk = self.chunk_len();
        let mut grad_x = vec![0.0; x.len()];
        let mut grad_by = vec![0.0; x.len()];
        let nets = grad_x
            .par_chunks_mut(chunk)
            .zip(grad_by.par_chunks_mut(chunk))
            .zip(x.par_chunks(chunk).zip(by.par_chunks(chunk)))
            .zip(grad_y.par_chunks(chunk))
            .map(|(((gx, gby), (x, by)), gy)| self.backward_chunk(x, by, gy, gx, gby))
            .collect::<Vec<_>>()
            // Summed in chunk order: the same bits at any thread count (see `coupled.rs`).
            .into_iter()
            .fold(
                [NetGrads::zeros(&self.layout), NetGrads::zeros(&self.layout)],
                |[mut s, mut t], [other_s, other_t]| {
                    s.add(&other_s);
                    t.add(&other_t);
                    [s, t]
                },
            );
        AffineMoveGrads {
            x: grad_x,
            by: grad_by,
            nets,
        }
    }

    /// One chunk: writes the gradients of `x` and `by`, returns those of the nets.
    fn backward_chunk(
        &self,
        x: &[f32],
        by: &[f32],
        grad_y: &[f32],
        grad_x: &mut [f32],
        grad_by: &mut [f32],
    ) -> [NetGrads; 2] {
        let tokens = x.len() / (self.layout.heads * self.layout.d);
        let mut scratch = Scratch::default();
        let mut log_scale = vec![0.0; x.len()];
        self.nets(by, &mut log_scale, None, &mut scratch);
        let mut scale = log_scale.clone();
        exp_in_place(&mut scale);
        // y = x·e + t, e = exp(s), s = B·tanh(raw/B): ∂y/∂x = e, ∂y/∂raw = x·e·(1 − tanh²).
        // `log_scale` becomes the gradient of raw.
        let b = self.bound;
        for ((((s, gx), &e), &x), &gy) in log_scale
            .iter_mut()
            .zip(grad_x.iter_mut())
            .zip(&scale)
            .zip(x)
            .zip(grad_y)
        {
            let tanh = *s / b;
            *gx = gy * e;
            *s = gy * x * e * (1.0 - tanh * tanh);
        }
        let grad_raw = log_scale;
        let mut grads = [NetGrads::zeros(&self.layout), NetGrads::zeros(&self.layout)];
        let [gs, gt] = &mut grads;
        for group in self.layout.groups(tokens) {
            let [s, t] = &self.nets;
            net::backward(
                s,
                &self.layout,
                &group,
                by,
                &grad_raw,
                grad_by,
                gs,
                &mut scratch,
            );
            net::backward(
                t,
                &self.layout,
                &group,
                by,
                grad_y,
                grad_by,
                gt,
                &mut scratch,
            );
        }
        grads
    }
}
