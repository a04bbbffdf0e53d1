//! The built-in dynamics as fused ops for backends whose tensors live in host memory (Flex,
//! NdArray), as the flash scorer's kernel is for scoring.
//!
//! Written as tensor ops, one coupled layer is dozens of small passes over `[batch, seq, heads,
//! d_head]` memory (each net a product, a bias, a SiLU, a product, a bias; every move an
//! elementwise op), and autodiff keeps every intermediate. Here the coupled dynamics (any
//! integrator, any number of steps) is one op and each move of an affine layer one: chunks of tokens go
//! through every move in cache, the nets' products run on `gemm` and their exponentials
//! vectorised, and the backward pass recomputes the trajectory and the nets' hidden activations
//! from the op's inputs (`q`, `k`, the nets' parameters, `dt`), which are all the graph keeps.
//!
//! The arithmetic is that of the tensor-op path ([`CoupledDynamics::forward_with_tensor_ops`],
//! [`AffineCoupling::forward_with_tensor_ops`]), which the tests compare with, values and every
//! gradient. Other backends, and tensors of other float types, run the tensor-op path.

mod affine;
mod coupled;
mod net;
mod op;
mod program;

use super::{AffineCoupling, AffineLayer, CoupledDynamics};
use crate::coupling::CouplingNet;
use crate::op_table::{OpTable, register_host_ops};
use burn::tensor::{DType, Tensor, backend::Backend};
use net::Layout;
use op::Kernel;
use program::Program;
use std::sync::{Arc, OnceLock};

/// A backend's fused op: the kernel over flattened inputs, its output flat.
type FusedFn<B> = fn(&Kernel, Vec<Tensor<B, 1>>) -> Tensor<B, 1>;

fn fused_for<B: Backend>() -> Option<FusedFn<B>> {
    static TABLE: OnceLock<OpTable> = OnceLock::new();
    TABLE
        .get_or_init(|| {
            #[allow(unused_mut)]
            let mut table = OpTable::default();
            use op::{run_plain, run_tracked};
            register_host_ops!(table, FusedFn, run_plain, run_tracked);
            table
        })
        .get::<B, FusedFn<B>>()
}

/// Whether the built-in dynamics of a layer on backend `B` run as fused ops (for `f32`
/// tensors): `B` is Flex or NdArray, with or without `Autodiff`.
pub fn runs_fused<B: Backend>() -> bool {
    fused_for::<B>().is_some()
}

/// The layout of nets `net` acting on `q`, if the fused op computes it: `f32` everywhere, no
/// empty dimension, and shapes the tensor-op path accepts (it raises the errors otherwise).
fn layout<B: Backend>(net: &CouplingNet<B>, q: &Tensor<B, 4>, k: &Tensor<B, 4>) -> Option<Layout> {
    let [n_nets, d, hidden] = net.w1.dims();
    let [batch, seq, heads, d_in] = q.dims();
    let fits = k.dims() == q.dims()
        && d_in == d
        && (n_nets == 1 || n_nets == heads)
        && [batch, seq, heads, d, hidden].iter().all(|&n| n > 0)
        && net.b1.dims() == [n_nets, hidden]
        && net.w2.dims() == [n_nets, hidden, d]
        && net.b2.dims() == [n_nets, d];
    let f32s = [
        q.dtype(),
        k.dtype(),
        net.w1.val().dtype(),
        net.b1.val().dtype(),
        net.w2.val().dtype(),
        net.b2.val().dtype(),
    ]
    .iter()
    .all(|&t| t == DType::F32);
    (fits && f32s).then_some(Layout {
        heads,
        d,
        hidden,
        n_nets,
    })
}

fn flat<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, 1> {
    let n = t.shape().num_elements();
    t.reshape([n])
}

fn net_inputs<B: Backend>(net: &CouplingNet<B>) -> [Tensor<B, 1>; 4] {
    [
        flat(net.w1.val()),
        flat(net.b1.val()),
        flat(net.w2.val()),
        flat(net.b2.val()),
    ]
}

/// `[q', k']` flat, back to two tensors of `q`'s shape.
fn split<B: Backend>(out: Tensor<B, 1>, dims: [usize; 4]) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let n = dims.iter().product::<usize>();
    (
        out.clone().narrow(0, 0, n).reshape(dims),
        out.narrow(0, n, n).reshape(dims),
    )
}

/// The coupled dynamics as one fused op, or `None` where it does not apply.
pub(super) fn coupled<B: Backend>(
    dynamics: &CoupledDynamics<B>,
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
    let run = fused_for::<B>()?;
    let layout = layout(&dynamics.coupling, q, k)?;
    let dt = dynamics.step_size.dt.val();
    let [n_dt] = dt.dims();
    if !(n_dt == 1 || n_dt == layout.heads) || dt.dtype() != DType::F32 {
        return None;
    }
    let kernel = Kernel::Coupled {
        layout,
        program: Arc::new(Program::record(
            dynamics.integrator.as_ref(),
            dynamics.steps,
        )),
    };
    let mut inputs = vec![flat(q.clone()), flat(k.clone())];
    inputs.extend(net_inputs(&dynamics.coupling));
    inputs.push(dt);
    Some(split(run(&kernel, inputs), q.dims()))
}

/// One affine layer as two fused ops (`k`'s move, then `q`'s), or `None` where they do not
/// apply.
pub(super) fn affine_layer<B: Backend>(
    coupling: &AffineCoupling<B>,
    layer: &AffineLayer<B>,
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
    let run = fused_for::<B>()?;
    let nets = [
        &layer.key_scale,
        &layer.key_shift,
        &layer.query_scale,
        &layer.query_shift,
    ];
    let layout = layout(nets[0], q, k)?;
    let same = |net: &&CouplingNet<B>| {
        net.w1.dims() == nets[0].w1.dims() && self::layout(net, q, k).is_some()
    };
    // Written so that a NaN bound also falls back to the tensor-op path.
    let bound_positive = coupling.scale_bound > 0.0;
    if !nets.iter().all(same) || !bound_positive {
        return None;
    }
    let kernel = Kernel::AffineMove {
        layout,
        bound: coupling.scale_bound as f32,
    };
    let dims = q.dims();
    let affine_move = |x: &Tensor<B, 4>, by: &Tensor<B, 4>, s, t| {
        let mut inputs = vec![flat(x.clone()), flat(by.clone())];
        inputs.extend(net_inputs(s));
        inputs.extend(net_inputs(t));
        run(&kernel, inputs).reshape(dims)
    };
    // The coupling moves each of k, q by nets of the other; the control by nets of itself.
    let by = if coupling.coupled { q } else { k };
    let k = affine_move(k, by, nets[0], nets[1]);
    let by = if coupling.coupled { &k } else { q };
    let q = affine_move(q, by, nets[2], nets[3]);
    Some((q, k))
}
