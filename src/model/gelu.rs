//! The MLP's GELU. On backends whose tensors live in host memory (Flex, NdArray) it runs as one
//! op with `erf` (or, for the tanh form, `exp`) vectorised, forward and backward, where Burn's
//! op calls a scalar `erf` per element; elsewhere, and for float types other than `f32`, it is
//! Burn's [`Gelu`].

use burn::nn::Gelu;
use burn::tensor::{Tensor, backend::Backend};

/// `gelu(x)` in the form `gelu` names (exact, or GPT-2's tanh approximation).
pub(crate) fn gelu<B: Backend, const D: usize>(gelu: &Gelu, x: Tensor<B, D>) -> Tensor<B, D> {
    #[cfg(feature = "autodiff")]
    if let Some(op) = host::op_for::<B>()
        && x.dtype() == burn::tensor::DType::F32
    {
        let dims = x.dims();
        let n = x.shape().num_elements();
        return op(x.reshape([n]), gelu.approximate).reshape(dims);
    }
    gelu.forward(x)
}

#[cfg(feature = "autodiff")]
mod host {
    use crate::host_math;
    use crate::host_tensor::{HostValues, owned, tensor};
    use crate::op_table::{OpTable, register_host_ops};
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::tensor::ops::FloatTensor;
    use burn::tensor::{Tensor, TensorPrimitive, backend::Backend};
    use rayon::prelude::*;
    use std::sync::OnceLock;

    /// A backend's GELU op over flat tensors, given whether it is the tanh form.
    type GeluFn<B> = fn(Tensor<B, 1>, bool) -> Tensor<B, 1>;

    /// Elements per parallel task: enough to amortise the task, small enough to spread a
    /// layer's activations over the threads.
    const CHUNK: usize = 1 << 14;

    pub(super) fn op_for<B: Backend>() -> Option<GeluFn<B>> {
        static TABLE: OnceLock<OpTable> = OnceLock::new();
        TABLE
            .get_or_init(|| {
                #[allow(unused_mut)]
                let mut table = OpTable::default();
                register_host_ops!(table, GeluFn, plain, tracked);
                table
            })
            .get::<B, GeluFn<B>>()
    }

    /// `gelu(x)` on the host, in parallel chunks.
    fn forward(x: &[f32], approximate: bool) -> Vec<f32> {
        let mut y = vec![0.0; x.len()];
        y.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK))
            .for_each(|(y, x)| host_math::gelu(x, y, approximate));
        y
    }

    fn plain<B: Backend>(x: Tensor<B, 1>, approximate: bool) -> Tensor<B, 1> {
        let device = x.device();
        tensor(forward(HostValues::read(x).values(), approximate), &device)
    }

    #[derive(Debug)]
    struct GeluBackward;

    impl<B: Backend> Backward<B, 1> for GeluBackward {
        /// The input, and whether the form is the tanh one.
        type State = (FloatTensor<B>, bool);

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let [parent] = ops.parents;
            let grad = grads.consume::<B>(&ops.node);
            let Some(parent) = parent else { return };
            let (x, approximate) = ops.state;
            let float = |t| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t));
            let grad = float(grad);
            let device = grad.device();
            let x = HostValues::read(float(x));
            let x = x.values();
            let mut grad = owned(grad.into_data());
            grad.par_chunks_mut(CHUNK)
                .zip(x.par_chunks(CHUNK))
                .for_each(|(g, x)| host_math::gelu_backward(x, g, approximate));
            grads.register::<B>(
                parent.id,
                tensor::<B>(grad, &device).into_primitive().tensor(),
            );
        }
    }

    fn tracked<B: Backend, C: CheckpointStrategy>(
        x: Tensor<Autodiff<B, C>, 1>,
        approximate: bool,
    ) -> Tensor<Autodiff<B, C>, 1> {
        let x = x.into_primitive().tensor();
        let inner = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(x.primitive.clone()));
        let device = inner.device();
        let y = tensor::<B>(
            forward(HostValues::read(inner).values(), approximate),
            &device,
        )
        .into_primitive()
        .tensor();
        let out = match GeluBackward
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((x.primitive, approximate), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        };
        Tensor::from_primitive(TensorPrimitive::Float(out))
    }
}

// The host op exists for Flex with autodiff: without those features there is nothing to test.
#[cfg(all(test, feature = "autodiff", feature = "flex"))]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::Distribution;

    /// The host op's values and gradients equal Burn's GELU, both forms, through autodiff and
    /// without it.
    #[test]
    fn host_gelu_equals_burns() {
        type Ad = Autodiff<Flex>;
        assert!(host::op_for::<Ad>().is_some() && host::op_for::<Flex>().is_some());
        let device = Default::default();
        for approximate in [false, true] {
            let module = Gelu { approximate };
            let data =
                Tensor::<Flex, 3>::random([3, 70, 50], Distribution::Normal(0.0, 3.0), &device);
            let weight = Tensor::<Ad, 3>::random([3, 70, 50], Distribution::Default, &device);
            let run = |host: bool| {
                let x = Tensor::<Ad, 3>::from_inner(data.clone()).require_grad();
                let y = if host {
                    gelu(&module, x.clone())
                } else {
                    module.forward(x.clone())
                };
                let grads = (y.clone() * weight.clone()).sum().backward();
                [y.inner(), x.grad(&grads).unwrap()]
            };
            for (got, expected) in run(true).into_iter().zip(run(false)) {
                crate::attention::host::assert_close_to_scale(
                    got.unsqueeze::<4>(),
                    expected.unsqueeze::<4>(),
                    &format!("approximate {approximate}"),
                );
            }
            let plain = gelu(&module, data.clone());
            crate::attention::host::assert_close_to_scale(
                plain.unsqueeze::<4>(),
                module.forward(data).unsqueeze::<4>(),
                "without autodiff",
            );
        }
    }
}
