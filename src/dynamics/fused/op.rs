//! The fused kernels as Burn ops: a plain function for inference backends and one custom
//! autodiff op for `Autodiff<B, C>` (the pattern of Burn's
//! `examples/custom-cubecl-kernel/src/backward.rs`), whose backward pass recomputes the nets'
//! hidden activations from the inputs it keeps.
//!
//! Every input travels flattened to rank 1 (`q`, `k`, then the parameters), with the shapes in
//! the [`Kernel`]; the output is `q'` then `k'`, flat.

use super::affine::Affine;
use super::coupled::Coupled;
use super::net::{Layout, NetWeights};
use super::program::Program;
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use std::sync::Arc;

/// What a fused op computes, with the sizes of its inputs.
#[derive(Clone, Debug)]
pub(crate) enum Kernel {
    /// Inputs `q, k, w1, b1, w2, b2, dt`.
    Coupled {
        layout: Layout,
        program: Arc<Program>,
    },
    /// Inputs `q, k`, then `w1, b1, w2, b2` of `s₁, t₁, s₂, t₂`.
    Affine {
        layout: Layout,
        bound: f32,
        coupled: bool,
    },
}

impl Kernel {
    /// `(q', k')` of the inputs.
    fn forward(&self, inputs: &[&[f32]]) -> (Vec<f32>, Vec<f32>) {
        match self {
            Kernel::Coupled { layout, program } => {
                coupled(layout, program, inputs).forward(inputs[0], inputs[1])
            }
            Kernel::Affine {
                layout,
                bound,
                coupled,
            } => affine(layout, *bound, *coupled, inputs).forward(inputs[0], inputs[1]),
        }
    }

    /// The gradient of every input, in the inputs' order.
    fn backward(&self, inputs: &[&[f32]], grad_q: &[f32], grad_k: &[f32]) -> Vec<Vec<f32>> {
        let (q, k) = (inputs[0], inputs[1]);
        match self {
            Kernel::Coupled { layout, program } => {
                let g = coupled(layout, program, inputs).backward(q, k, grad_q, grad_k);
                vec![g.q, g.k, g.net.w1, g.net.b1, g.net.w2, g.net.b2, g.dt]
            }
            Kernel::Affine {
                layout,
                bound,
                coupled,
            } => {
                let g = affine(layout, *bound, *coupled, inputs).backward(q, k, grad_q, grad_k);
                let mut grads = vec![g.q, g.k];
                for net in g.nets {
                    grads.extend([net.w1, net.b1, net.w2, net.b2]);
                }
                grads
            }
        }
    }
}

fn net<'a>(params: &[&'a [f32]]) -> NetWeights<'a> {
    NetWeights {
        w1: params[0],
        b1: params[1],
        w2: params[2],
        b2: params[3],
    }
}

fn coupled<'a>(layout: &Layout, program: &'a Program, inputs: &[&'a [f32]]) -> Coupled<'a> {
    Coupled {
        layout: *layout,
        net: net(&inputs[2..6]),
        dt: inputs[6],
        program,
    }
}

fn affine<'a>(layout: &Layout, bound: f32, coupled: bool, inputs: &[&'a [f32]]) -> Affine<'a> {
    Affine {
        layout: *layout,
        nets: std::array::from_fn(|i| net(&inputs[2 + 4 * i..])),
        bound,
        coupled,
    }
}

fn floats<B: Backend>(t: Tensor<B, 1>) -> Vec<f32> {
    t.into_data()
        .into_vec::<f32>()
        .expect("the fused dynamics run on f32 tensors only")
}

fn tensor<B: Backend>(data: Vec<f32>, device: &B::Device) -> Tensor<B, 1> {
    let n = data.len();
    Tensor::from_data(TensorData::new(data, [n]), device)
}

fn concat(q: Vec<f32>, k: Vec<f32>) -> Vec<f32> {
    let mut out = q;
    out.extend(k);
    out
}

/// The kernel without autodiff: `[q', k']` flat.
pub(crate) fn run_plain<B: Backend>(kernel: &Kernel, inputs: Vec<Tensor<B, 1>>) -> Tensor<B, 1> {
    let device = inputs[0].device();
    let data: Vec<Vec<f32>> = inputs.into_iter().map(floats).collect();
    let views: Vec<&[f32]> = data.iter().map(Vec::as_slice).collect();
    let (q, k) = kernel.forward(&views);
    tensor(concat(q, k), &device)
}

/// What the backward pass keeps: the inputs' values on the host, and the kernel.
#[derive(Clone, Debug)]
struct Saved {
    inputs: Arc<Vec<Vec<f32>>>,
    kernel: Kernel,
}

#[derive(Debug)]
struct FusedBackward;

impl<B: Backend, const N: usize> Backward<B, N> for FusedBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad =
            Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(grads.consume::<B>(&ops.node)));
        let device = grad.device();
        let grad = floats(grad);
        let (grad_q, grad_k) = grad.split_at(grad.len() / 2);
        let Saved { inputs, kernel } = ops.state;
        let views: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let input_grads = kernel.backward(&views, grad_q, grad_k);
        for (parent, g) in ops.parents.into_iter().zip(input_grads) {
            if let Some(node) = parent {
                let g = tensor::<B>(g, &device).into_primitive().tensor();
                grads.register::<B>(node.id, g);
            }
        }
    }
}

/// The kernel as one autodiff op over `N` inputs: `[q', k']` flat.
fn run_autodiff<B: Backend, C: CheckpointStrategy, const N: usize>(
    kernel: &Kernel,
    inputs: Vec<Tensor<Autodiff<B, C>, 1>>,
) -> Tensor<Autodiff<B, C>, 1> {
    let primitives: [_; N] = inputs
        .into_iter()
        .map(|t| t.into_primitive().tensor())
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or_else(|_| panic!("the fused op of this kernel takes {N} inputs"));
    let inner = |p: &FloatTensor<Autodiff<B, C>>| {
        Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(p.primitive.clone()))
    };
    let device = inner(&primitives[0]).device();
    let data: Vec<Vec<f32>> = primitives.iter().map(|p| floats(inner(p))).collect();
    let views: Vec<&[f32]> = data.iter().map(Vec::as_slice).collect();
    let (q, k) = kernel.forward(&views);
    let output = tensor::<B>(concat(q, k), &device).into_primitive().tensor();
    let nodes = primitives.map(|p| p.node.clone());
    let output = match FusedBackward.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(
            Saved {
                inputs: Arc::new(data),
                kernel: kernel.clone(),
            },
            output,
        ),
        OpsKind::UnTracked(prep) => prep.finish(output),
    };
    Tensor::from_primitive(TensorPrimitive::Float(output))
}

/// [`run_autodiff`] for the coupled dynamics (7 inputs) or an affine layer (18).
pub(crate) fn run_tracked<B: Backend, C: CheckpointStrategy>(
    kernel: &Kernel,
    inputs: Vec<Tensor<Autodiff<B, C>, 1>>,
) -> Tensor<Autodiff<B, C>, 1> {
    match kernel {
        Kernel::Coupled { .. } => run_autodiff::<B, C, 7>(kernel, inputs),
        Kernel::Affine { .. } => run_autodiff::<B, C, 18>(kernel, inputs),
    }
}
