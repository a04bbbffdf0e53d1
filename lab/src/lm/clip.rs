//! Clipping of the gradient's global norm.
//!
//! Burn's `GradientClippingConfig::Norm` clips each parameter tensor by its own norm, which
//! changes the direction of the update and is not what "clip the gradient to norm 1" means in
//! GPT-2/nanoGPT-style training (and, we assume, in the paper): there the norm is taken over all
//! parameters together and the whole gradient is scaled by one factor. So we do that here, before
//! handing the gradients to AdamW (which is configured without clipping).

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor};
use std::marker::PhantomData;

/// Scales `grads` so that their global L2 norm is at most `max_norm`; returns the norm before
/// clipping. A non-finite norm leaves the gradients as they are (the next loss will show it).
pub fn clip_global_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: GradientsParams,
    max_norm: f64,
) -> (GradientsParams, f64) {
    let mut sum = SumSquares::<B> {
        grads: &grads,
        total: None,
    };
    module.visit(&mut sum);
    let norm = sum
        .total
        .map_or(0.0, |t| t.into_scalar().elem::<f64>().sqrt());
    (clip_to_norm(module, grads, norm, max_norm), norm)
}

/// Scales `grads`, whose global L2 norm is `norm` (computed elsewhere, e.g. by
/// [`all_reduce_gradients`](crate::dist::all_reduce_gradients) the same on every rank), so that
/// it is at most `max_norm`. A non-finite norm leaves them as they are.
pub fn clip_to_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    mut grads: GradientsParams,
    norm: f64,
    max_norm: f64,
) -> GradientsParams {
    if norm.is_finite() && norm > max_norm {
        // The same small guard as Burn's per-tensor clipping, so a norm at the threshold is kept.
        let scale = max_norm / (norm + 1e-6);
        let mut scaler = Scale::<B> {
            grads: &mut grads,
            scale,
            backend: PhantomData,
        };
        module.visit(&mut scaler);
    }
    grads
}

struct SumSquares<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    total: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SumSquares<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let squares = grad.square().sum();
            self.total = Some(match self.total.take() {
                Some(total) => total + squares,
                None => squares,
            });
        }
    }
}

struct Scale<'a, B: Backend> {
    grads: &'a mut GradientsParams,
    scale: f64,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.grads
                .register::<B::InnerBackend, D>(param.id, grad.mul_scalar(self.scale));
        }
    }
}
