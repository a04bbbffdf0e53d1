//! The gradient all-reduce and the weights' digest, both over a module's parameters in visiting
//! order.

use super::{CollectiveError, ProcessGroup};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};

/// The mean over the ranks of `grads` (the gradients of `module`'s parameters), on every rank,
/// with its global L2 norm, and the sum over the ranks of `extra` (written back into it: losses,
/// flags).
///
/// The gradients are flattened in `module`'s visiting order into one buffer on the device, summed
/// with one `f32` all-reduce (on the devices where the group can, otherwise one copy to the host
/// and one back) and divided by the number of ranks; `extra` and one presence count per parameter
/// go through one `f64` all-reduce. A parameter without a gradient on a rank counts as zero there; one without a gradient on every
/// rank gets none. Every rank gets the same norm: computed on the host from the summed buffer, in
/// `f64` and in a fixed order; or, where the group sums on the devices
/// ([`ProcessGroup::all_reduce_sum_on_device`]: NCCL), computed on rank 0's device and sent to
/// the others (clipping by norms that differ in the last bit would scale each rank's update
/// differently). With one rank, `grads` are returned untouched, with no norm.
///
/// # Errors
/// A collective that does not complete.
pub fn all_reduce_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    mut grads: GradientsParams,
    extra: &mut [f64],
    group: &dyn ProcessGroup,
) -> Result<(GradientsParams, Option<f64>), CollectiveError> {
    if group.world_size() == 1 {
        return Ok((grads, None));
    }
    let mut flatten = Flatten::<B> {
        grads: &mut grads,
        parts: Vec::new(),
        present: Vec::new(),
    };
    module.visit(&mut flatten);
    let Flatten { parts, present, .. } = flatten;
    let mut counts: Vec<f64> = extra.iter().copied().chain(present).collect();
    group.all_reduce_sum_f64(&mut counts)?;
    extra.copy_from_slice(&counts[..extra.len()]);
    let Some(device) = parts.first().map(Tensor::device) else {
        return Ok((grads, Some(0.0)));
    };
    let world = group.world_size() as f32;
    let mut flat = Tensor::cat(parts, 0);
    let (flat, norm) = if group.all_reduce_sum_on_device(&mut flat)? {
        let mean = flat.div_scalar(world);
        // Rank 0's norm for all: GPUs' reductions need not agree to the bit, and clipping by
        // different norms would scale each rank's update differently. Only rank 0 computes it.
        let mut bytes = match group.rank() {
            0 => {
                let squares = mean.clone().powi_scalar(2).sum().into_scalar();
                squares.elem::<f64>().sqrt().to_le_bytes().to_vec()
            }
            _ => Vec::new(),
        };
        group.broadcast_bytes(&mut bytes)?;
        let norm = bytes
            .try_into()
            .map(f64::from_le_bytes)
            .map_err(|_| CollectiveError::Device("rank 0's gradient norm did not arrive".into()))?;
        (mean, norm)
    } else {
        let mut values = flat
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("converted to f32");
        group.all_reduce_sum_f32(&mut values)?;
        for value in &mut values {
            *value /= world;
        }
        let norm = values
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>()
            .sqrt();
        let len = values.len();
        (
            Tensor::from_data(TensorData::new(values, [len]), &device),
            norm,
        )
    };
    let mut unflatten = Unflatten::<B> {
        grads: &mut grads,
        flat,
        offset: 0,
        present: counts[extra.len()..].iter(),
    };
    module.visit(&mut unflatten);
    Ok((grads, Some(norm)))
}

/// Takes every parameter's gradient out of `grads`, flattened (zeros where there is none).
struct Flatten<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    parts: Vec<Tensor<B::InnerBackend, 1>>,
    present: Vec<f64>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let len = param.lazy_shape().num_elements();
        let part = match self.grads.remove::<B::InnerBackend, D>(param.id) {
            Some(grad) => {
                self.present.push(1.0);
                grad.reshape([len])
            }
            None => {
                self.present.push(0.0);
                Tensor::zeros([len], &param.val().device())
            }
        };
        self.parts.push(part);
    }
}

/// Puts the summed gradients back, shaped as their parameters, where some rank had one.
struct Unflatten<'a, 'p, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    flat: Tensor<B::InnerBackend, 1>,
    offset: usize,
    present: std::slice::Iter<'p, f64>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unflatten<'_, '_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let shape = param.lazy_shape();
        let len = shape.num_elements();
        let start = self.offset;
        self.offset += len;
        if self.present.next().copied().unwrap_or(0.0) > 0.0 {
            let grad = self.flat.clone().slice(start..start + len).reshape(shape);
            self.grads.register::<B::InnerBackend, D>(param.id, grad);
        }
    }
}

/// The XXH64 digest of `module`'s float parameters, in visiting order, as little-endian `f32`:
/// equal on two ranks exactly when their weights are bitwise equal (up to a hash collision).
pub fn weights_digest<B: Backend, M: Module<B>>(module: &M) -> u64 {
    struct Collect<B: Backend> {
        parts: Vec<Tensor<B, 1>>,
    }
    impl<B: Backend> ModuleVisitor<B> for Collect<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            let len = value.shape().num_elements();
            self.parts.push(value.reshape([len]));
        }
    }
    let mut collect = Collect::<B> { parts: Vec::new() };
    module.visit(&mut collect);
    if collect.parts.is_empty() {
        return twox_hash::XxHash64::oneshot(0, &[]);
    }
    let values = Tensor::cat(collect.parts, 0)
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("converted to f32");
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    twox_hash::XxHash64::oneshot(0, &bytes)
}
