//! The coupling net `f(x) = W₂·silu(W₁·x + b₁) + b₂` on host slices: forward, and backward with
//! the hidden activations recomputed, for the rows of one chunk of tokens.
//!
//! A chunk holds `tokens × heads` rows of `d_head` floats, token-major (`[tokens, heads, d]`,
//! the layer's layout). A net shared by the heads runs once over all rows; one net per head runs
//! over every `heads`-th row, read with a row stride, so no row is ever copied to group them.

use crate::host_math::{Mat, exp_in_place, gemm};

/// The sizes of the nets and of the rows they act on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) heads: usize,
    pub(crate) d: usize,
    pub(crate) hidden: usize,
    /// 1 (shared by the heads) or `heads`.
    pub(crate) n_nets: usize,
}

/// The rows of a chunk one net acts on: `rows` rows of `d` floats from `offset`, `stride` apart.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Group {
    pub(crate) net: usize,
    pub(crate) offset: usize,
    pub(crate) stride: usize,
    pub(crate) rows: usize,
}

impl Layout {
    /// The groups of a chunk of `tokens` tokens: one for a shared net, one per head otherwise.
    pub(crate) fn groups(&self, tokens: usize) -> Vec<Group> {
        let (heads, d) = (self.heads, self.d);
        if self.n_nets == 1 {
            vec![Group {
                net: 0,
                offset: 0,
                stride: d,
                rows: tokens * heads,
            }]
        } else {
            (0..heads)
                .map(|h| Group {
                    net: h,
                    offset: h * d,
                    stride: heads * d,
                    rows: tokens,
                })
                .collect()
        }
    }
}

impl Group {
    /// This group's rows of a chunk buffer, as a matrix.
    fn of<'a>(&self, buffer: &'a [f32]) -> Mat<'a> {
        Mat {
            data: &buffer[self.offset..],
            row_stride: self.stride,
            col_stride: 1,
        }
    }

    /// The transpose of [`of`](Self::of).
    fn transposed<'a>(&self, buffer: &'a [f32]) -> Mat<'a> {
        Mat {
            data: &buffer[self.offset..],
            row_stride: 1,
            col_stride: self.stride,
        }
    }

    /// This group's rows of a chunk buffer, `d` floats each.
    fn rows_mut<'a>(&self, buffer: &'a mut [f32], d: usize) -> impl Iterator<Item = &'a mut [f32]> {
        let (stride, rows) = (self.stride, self.rows);
        buffer[self.offset..]
            .chunks_mut(stride)
            .take(rows)
            .map(move |row| &mut row[..d])
    }

    fn rows<'a>(&self, buffer: &'a [f32], d: usize) -> impl Iterator<Item = &'a [f32]> {
        let (stride, rows) = (self.stride, self.rows);
        buffer[self.offset..]
            .chunks(stride)
            .take(rows)
            .map(move |row| &row[..d])
    }
}

/// The parameters of `n_nets` nets, as the [`CouplingNet`](crate::CouplingNet) stores them:
/// `w1` `[n, d, hidden]`, `b1` `[n, hidden]`, `w2` `[n, hidden, d]`, `b2` `[n, d]`, row-major.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NetWeights<'a> {
    pub(crate) w1: &'a [f32],
    pub(crate) b1: &'a [f32],
    pub(crate) w2: &'a [f32],
    pub(crate) b2: &'a [f32],
}

/// The gradients of the parameters of a [`NetWeights`], in the same layout.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NetGrads {
    pub(crate) w1: Vec<f32>,
    pub(crate) b1: Vec<f32>,
    pub(crate) w2: Vec<f32>,
    pub(crate) b2: Vec<f32>,
}

impl NetGrads {
    pub(crate) fn zeros(layout: &Layout) -> Self {
        let (n, d, h) = (layout.n_nets, layout.d, layout.hidden);
        NetGrads {
            w1: vec![0.0; n * d * h],
            b1: vec![0.0; n * h],
            w2: vec![0.0; n * h * d],
            b2: vec![0.0; n * d],
        }
    }

    /// `self += other`.
    pub(crate) fn add(&mut self, other: &NetGrads) {
        for (mine, theirs) in [
            (&mut self.w1, &other.w1),
            (&mut self.b1, &other.b1),
            (&mut self.w2, &other.w2),
            (&mut self.b2, &other.b2),
        ] {
            mine.iter_mut().zip(theirs).for_each(|(a, b)| *a += b);
        }
    }
}

/// Buffers of one group's hidden activations, reused across calls.
#[derive(Default)]
pub(crate) struct Scratch {
    pre: Vec<f32>,
    sigmoid: Vec<f32>,
    hidden: Vec<f32>,
}

impl Scratch {
    /// `pre = x·W₁ + b₁`, `sigmoid = σ(pre)`, `hidden = pre·σ(pre)` for a group's rows.
    fn hidden_layer(&mut self, weights: &NetWeights, layout: &Layout, group: &Group, x: &[f32]) {
        let (d, h, rows) = (layout.d, layout.hidden, group.rows);
        for buffer in [&mut self.pre, &mut self.sigmoid, &mut self.hidden] {
            buffer.resize(rows * h, 0.0);
        }
        let b1 = &weights.b1[group.net * h..][..h];
        self.pre
            .chunks_exact_mut(h)
            .for_each(|row| row.copy_from_slice(b1));
        let w1 = Mat::rows(&weights.w1[group.net * d * h..][..d * h], h);
        gemm(&mut self.pre, h, true, group.of(x), w1, [rows, h, d], 1.0);
        self.sigmoid
            .iter_mut()
            .zip(&self.pre)
            .for_each(|(s, &p)| *s = -p);
        exp_in_place(&mut self.sigmoid);
        for ((s, hidden), &p) in self.sigmoid.iter_mut().zip(&mut self.hidden).zip(&self.pre) {
            *s = 1.0 / (1.0 + *s);
            *hidden = p * *s;
        }
    }
}

/// `out = f(x)` over a group's rows of the chunk buffers `x` and `out` (the other groups' rows
/// of `out` are left as they are).
pub(crate) fn forward(
    weights: &NetWeights,
    layout: &Layout,
    group: &Group,
    x: &[f32],
    out: &mut [f32],
    scratch: &mut Scratch,
) {
    let (d, h) = (layout.d, layout.hidden);
    scratch.hidden_layer(weights, layout, group, x);
    let b2 = &weights.b2[group.net * d..][..d];
    group
        .rows_mut(out, d)
        .for_each(|row| row.copy_from_slice(b2));
    let w2 = Mat::rows(&weights.w2[group.net * h * d..][..h * d], d);
    let hidden = Mat::rows(&scratch.hidden, h);
    gemm(
        &mut out[group.offset..],
        group.stride,
        true,
        hidden,
        w2,
        [group.rows, d, h],
        1.0,
    );
}

/// The backward pass of [`forward`] over a group's rows: given the gradient `grad_out` of
/// `f(x)`, adds the gradient of `x` to `grad_x` and those of the parameters to `grads`.
// The arguments are the gemm operands and their destinations; a struct would only rename them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    weights: &NetWeights,
    layout: &Layout,
    group: &Group,
    x: &[f32],
    grad_out: &[f32],
    grad_x: &mut [f32],
    grads: &mut NetGrads,
    scratch: &mut Scratch,
) {
    let (d, h, rows, net) = (layout.d, layout.hidden, group.rows, group.net);
    scratch.hidden_layer(weights, layout, group, x);
    let out = group.of(grad_out);
    // W₂ and b₂.
    gemm(
        &mut grads.w2[net * h * d..][..h * d],
        d,
        true,
        Mat::transposed(&scratch.hidden, h),
        out,
        [h, d, rows],
        1.0,
    );
    let b2 = &mut grads.b2[net * d..][..d];
    for row in group.rows(grad_out, d) {
        b2.iter_mut().zip(row).for_each(|(b, g)| *b += g);
    }
    // Through W₂ and the SiLU: silu'(p) = σ(p)·(1 + p·(1 − σ(p))). `hidden` becomes the
    // gradient of the pre-activations.
    let w2_t = Mat::transposed(&weights.w2[net * h * d..][..h * d], d);
    gemm(&mut scratch.hidden, h, false, out, w2_t, [rows, h, d], 1.0);
    for ((g, &s), &p) in scratch
        .hidden
        .iter_mut()
        .zip(&scratch.sigmoid)
        .zip(&scratch.pre)
    {
        *g *= s * (1.0 + p * (1.0 - s));
    }
    let grad_pre = Mat::rows(&scratch.hidden, h);
    // W₁, b₁ and x.
    gemm(
        &mut grads.w1[net * d * h..][..d * h],
        h,
        true,
        group.transposed(x),
        grad_pre,
        [d, h, rows],
        1.0,
    );
    let b1 = &mut grads.b1[net * h..][..h];
    for row in scratch.hidden.chunks_exact(h) {
        b1.iter_mut().zip(row).for_each(|(b, g)| *b += g);
    }
    let w1_t = Mat::transposed(&weights.w1[net * d * h..][..d * h], h);
    gemm(
        &mut grad_x[group.offset..],
        group.stride,
        true,
        grad_pre,
        w1_t,
        [rows, d, h],
        1.0,
    );
}
