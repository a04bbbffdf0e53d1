//! The fused kernels as Burn ops: a plain function for inference backends and one custom
//! autodiff op for `Autodiff<B, C>` (the pattern of Burn's
//! `examples/custom-cubecl-kernel/src/backward.rs`), whose backward pass recomputes what it needs
//! (the coupled trajectory, the nets' hidden activations) from the inputs it keeps.
//!
//! Every input and output travels flattened to rank 1, with the shapes in the [`Kernel`].

use super::affine::AffineMove;
use super::coupled::Coupled;
use super::net::{Layout, NetWeights};
use super::program::Program;
use crate::host_tensor::{HostValues, owned, read_all, tensor};
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use std::sync::Arc;

/// What a fused op computes, with the sizes of its inputs.
#[derive(Clone, Debug)]
pub(crate) enum Kernel {
    /// Inputs `q, k, w1, b1, w2, b2, dt`; output `[q', k']`.
    Coupled {
        layout: Layout,
        program: Arc<Program>,
    },
    /// Inputs `x, a`, then `w1, b1, w2, b2` of the nets `s` and `t`; output
    /// `y = x ⊙ exp(B·tanh(s(a)/B)) + t(a)`.
    AffineMove { layout: Layout, bound: f32 },
}

/// The gradients of a kernel's inputs: the first `leading_inputs` share one buffer, in equal
/// parts (the coupled dynamics compute those of `q` and `k` in place of `[grad q', grad k']`).
struct InputGrads {
    leading: Vec<f32>,
    leading_inputs: usize,
    rest: Vec<Vec<f32>>,
}

impl Kernel {
    /// The output of the inputs.
    fn forward(&self, inputs: &[&[f32]]) -> Vec<f32> {
        match self {
            Kernel::Coupled { layout, program } => {
                coupled(layout, program, inputs).forward(inputs[0], inputs[1])
            }
            Kernel::AffineMove { layout, bound } => {
                affine_move(layout, *bound, inputs).forward(inputs[0], inputs[1])
            }
        }
    }

    /// The gradient of every input, given the output's.
    fn backward(&self, inputs: &[&[f32]], grad: Vec<f32>) -> InputGrads {
        match self {
            Kernel::Coupled { layout, program } => {
                let g = coupled(layout, program, inputs).backward(inputs[0], inputs[1], grad);
                InputGrads {
                    leading: g.q_and_k,
                    leading_inputs: 2,
                    rest: vec![g.net.w1, g.net.b1, g.net.w2, g.net.b2, g.dt],
                }
            }
            Kernel::AffineMove { layout, bound } => {
                let g = affine_move(layout, *bound, inputs).backward(inputs[0], inputs[1], &grad);
                let mut rest = vec![g.by];
                for net in g.nets {
                    rest.extend([net.w1, net.b1, net.w2, net.b2]);
                }
                InputGrads {
                    leading: g.x,
                    leading_inputs: 1,
                    rest,
                }
            }
        }
    }

    /// How many inputs the kernel takes.
    fn inputs(&self) -> usize {
        match self {
            Kernel::Coupled { .. } => 7,
            Kernel::AffineMove { .. } => 10,
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

fn affine_move<'a>(layout: &Layout, bound: f32, inputs: &[&'a [f32]]) -> AffineMove<'a> {
    AffineMove {
        layout: *layout,
        nets: [net(&inputs[2..6]), net(&inputs[6..10])],
        bound,
    }
}

/// The kernel without autodiff.
pub(crate) fn run_plain<B: Backend>(kernel: &Kernel, inputs: Vec<Tensor<B, 1>>) -> Tensor<B, 1> {
    let device = inputs[0].device();
    let data = read_all(inputs);
    let views: Vec<&[f32]> = data.iter().map(HostValues::values).collect();
    tensor(kernel.forward(&views), &device)
}

/// What the backward pass keeps: the inputs (shared with the graph's other holders; read to the
/// host again there) and the kernel.
#[derive(Clone, Debug)]
struct Saved<B: Backend> {
    inputs: Vec<FloatTensor<B>>,
    kernel: Kernel,
}

#[derive(Debug)]
struct FusedBackward;

impl<B: Backend, const N: usize> Backward<B, N> for FusedBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad =
            Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(grads.consume::<B>(&ops.node)));
        let device = grad.device();
        let Saved { inputs, kernel } = ops.state;
        let data = read_all(
            inputs
                .into_iter()
                .map(|p| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(p))),
        );
        let views: Vec<&[f32]> = data.iter().map(HostValues::values).collect();
        let input_grads = kernel.backward(&views, owned(grad.into_data()));
        drop(data);
        // The leading inputs' gradients as views of one tensor: no copy.
        let leading = tensor::<B>(input_grads.leading, &device);
        let part = leading.dims()[0] / input_grads.leading_inputs;
        let leading =
            (0..input_grads.leading_inputs).map(|i| leading.clone().narrow(0, i * part, part));
        let rest = input_grads
            .rest
            .into_iter()
            .map(|g| tensor::<B>(g, &device));
        for (parent, g) in ops.parents.into_iter().zip(leading.chain(rest)) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, g.into_primitive().tensor());
            }
        }
    }
}

/// The kernel as one autodiff op over `N` inputs.
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
    let data = read_all(primitives.iter().map(inner));
    let views: Vec<&[f32]> = data.iter().map(HostValues::values).collect();
    let output = tensor::<B>(kernel.forward(&views), &device)
        .into_primitive()
        .tensor();
    drop(data);
    let nodes = primitives.clone().map(|p| p.node);
    let output = match FusedBackward.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(
            Saved {
                inputs: primitives.into_iter().map(|p| p.primitive).collect(),
                kernel: kernel.clone(),
            },
            output,
        ),
        OpsKind::UnTracked(prep) => prep.finish(output),
    };
    Tensor::from_primitive(TensorPrimitive::Float(output))
}

/// [`run_autodiff`] for the kernel's number of inputs.
pub(crate) fn run_tracked<B: Backend, C: CheckpointStrategy>(
    kernel: &Kernel,
    inputs: Vec<Tensor<Autodiff<B, C>, 1>>,
) -> Tensor<Autodiff<B, C>, 1> {
    assert_eq!(inputs.len(), kernel.inputs(), "the inputs of {kernel:?}");
    match kernel {
        Kernel::Coupled { .. } => run_autodiff::<B, C, 7>(kernel, inputs),
        Kernel::AffineMove { .. } => run_autodiff::<B, C, 10>(kernel, inputs),
    }
}
