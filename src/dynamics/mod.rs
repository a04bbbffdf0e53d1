//! The transformation of queries and keys before scoring: the one place that decides between
//! standard attention, the MLP-only baseline and the coupled dynamics.

mod affine;
mod config;
#[cfg(feature = "autodiff")]
mod fused;

pub use affine::{AffineCoupling, AffineLayer, SCALE_BOUND};
pub use config::{DynamicsConfig, MAX_COUNT};

use crate::coupling::{CouplingNet, CouplingNetConfig};
use crate::error::ConfigError;
use crate::integrator::{Integrator, TensorPhaseSpace, integrate};
use crate::step_size::{StepSize, StepSizeConfig};
use burn::module::Module;
use burn::tensor::{Tensor, backend::Backend};
use std::sync::Arc;

/// The pre-scoring dynamics of one attention layer, built from a [`DynamicsConfig`].
///
/// Acts on each token independently (it never mixes positions), so it commutes with causal
/// masking and with a cache of evolved keys.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)] // one per layer: boxing would buy nothing
pub enum QkDynamics<B: Backend> {
    /// Identity: standard attention.
    Standard(Identity),
    /// `q' = q + f(q)`, `k' = k`: the uncoupled baseline.
    MlpOnly(CouplingNet<B>),
    /// `dq/dt = k`, `dk/dt = f(q)`, integrated.
    Coupled(CoupledDynamics<B>),
    /// The invertible affine coupling.
    Affine(AffineCoupling<B>),
}

/// The dynamics of standard attention: none. A module without parameters.
#[derive(Module, Clone, Debug, Default)]
pub struct Identity;

/// The coupled dynamics `dq/dt = k`, `dk/dt = f(q)`: the force, the step size and the integrator.
#[derive(Module, Debug)]
pub struct CoupledDynamics<B: Backend> {
    /// The force `f`.
    pub coupling: CouplingNet<B>,
    /// The step size `dt`.
    pub step_size: StepSize<B>,
    /// Any [`Integrator`], built in or the user's own.
    pub integrator: Arc<dyn Integrator>,
    /// Steps per forward pass.
    pub steps: usize,
}

/// Whether the dynamics of layers on backend `B` run as fused ops: the coupled dynamics (any
/// integrator, any number of steps) and the affine coupling, for `f32` tensors, on Flex and
/// NdArray with or without `Autodiff` (needs the `autodiff` feature). Elsewhere they run as
/// Burn tensor ops; the two compute the same values and gradients within float rounding.
pub fn runs_fused<B: Backend>() -> bool {
    #[cfg(feature = "autodiff")]
    {
        fused::runs_fused::<B>()
    }
    #[cfg(not(feature = "autodiff"))]
    {
        false
    }
}

/// Which path the dynamics of layers on backend `B` run on, as runs record it: `"fused"` (see
/// [`runs_fused`]) or `"tensor-ops"`.
pub fn dynamics_path<B: Backend>() -> &'static str {
    if runs_fused::<B>() {
        "fused"
    } else {
        "tensor-ops"
    }
}

impl<B: Backend> QkDynamics<B> {
    /// Builds the dynamics a config names, for a layer of `n_heads` heads.
    pub fn try_init(
        config: &DynamicsConfig,
        coupling: &CouplingNetConfig,
        dt: &StepSizeConfig,
        n_heads: usize,
        device: &B::Device,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(match config {
            DynamicsConfig::Standard => Self::Standard(Identity),
            DynamicsConfig::MlpOnly => Self::MlpOnly(coupling.try_init(device)?),
            DynamicsConfig::Affine { layers, coupled } => Self::Affine(AffineCoupling::try_init(
                *layers, *coupled, coupling, device,
            )?),
            DynamicsConfig::Coupled { integrator, steps } => Self::Coupled(CoupledDynamics {
                coupling: coupling.try_init(device)?,
                step_size: dt.try_init(n_heads, device)?,
                integrator: integrator.build(),
                steps: *steps,
            }),
        })
    }

    /// The same dynamics with another integrator (for example one of the user's own).
    ///
    /// # Panics
    /// If the dynamics are not coupled: standard and MLP-only have no integrator.
    pub fn with_integrator(self, integrator: Arc<dyn Integrator>) -> Self {
        match self {
            Self::Coupled(coupled) => Self::Coupled(CoupledDynamics {
                integrator,
                ..coupled
            }),
            _ => panic!(
                "with_integrator: standard, MLP-only and affine dynamics have no integrator; \
                 build the layer with DynamicsConfig::Coupled"
            ),
        }
    }

    /// The coupling net `f`, if the dynamics have one (the affine coupling has several).
    pub fn coupling(&self) -> Option<&CouplingNet<B>> {
        match self {
            Self::Standard(_) | Self::Affine(_) => None,
            Self::MlpOnly(f) => Some(f),
            Self::Coupled(coupled) => Some(&coupled.coupling),
        }
    }

    /// The step size `dt`, if the dynamics are coupled.
    pub fn step_size(&self) -> Option<&StepSize<B>> {
        match self {
            Self::Coupled(coupled) => Some(&coupled.step_size),
            _ => None,
        }
    }

    /// Transforms `q` and `k`.
    ///
    /// # Shapes
    /// - `q`, `k`: `[batch, seq, heads, d_head]`, and the same on output. Token-major, the layout
    ///   the projections produce: the dynamics' elementwise work then runs on contiguous memory
    ///   (on Flex, strided elementwise ops are much slower).
    ///
    /// # Panics
    /// If `heads` is not the number of heads the dynamics were built for (a per-head step size
    /// or per-head coupling nets), or `d_head` not the coupling net's.
    pub fn forward(&self, q: Tensor<B, 4>, k: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        match self {
            Self::Standard(_) => (q, k),
            Self::MlpOnly(f) => (q.clone() + f.forward(q), k),
            Self::Coupled(coupled) => coupled.forward(q, k),
            Self::Affine(affine) => affine.forward(q, k),
        }
    }
}

impl<B: Backend> CoupledDynamics<B> {
    /// Whether `dt` folds into the coupling net's output layer
    /// ([`CouplingNet::forward_scaled`]) rather than multiplying every token's force: when there
    /// is one step size, or one per head with one net per head.
    pub fn folds_dt(&self) -> bool {
        let [n_dt] = self.step_size.dt.dims();
        n_dt == 1 || n_dt == self.coupling.n_nets()
    }

    /// Integrates `steps` steps; see [`QkDynamics::forward`] for shapes and panics.
    ///
    /// On Flex and NdArray (see [`runs_fused`]) with `f32` tensors, the integration runs as one
    /// fused op; elsewhere as [`forward_with_tensor_ops`](Self::forward_with_tensor_ops).
    pub fn forward(&self, q: Tensor<B, 4>, k: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        self.check_heads(&q);
        #[cfg(feature = "autodiff")]
        if let Some(out) = fused::coupled(self, &q, &k) {
            return out;
        }
        self.forward_with_tensor_ops(q, k)
    }

    fn check_heads(&self, q: &Tensor<B, 4>) {
        let [n_dt] = self.step_size.dt.dims();
        let heads = q.dims()[2];
        assert!(
            n_dt == 1 || n_dt == heads,
            "QkDynamics: a step size per head for {n_dt} heads, but q and k have {heads} \
             heads ([batch, seq, heads, d_head] = {:?})",
            q.dims()
        );
    }

    /// [`forward`](Self::forward) as Burn tensor ops on every backend, through the
    /// [`PhaseSpace`](crate::integrator::PhaseSpace) of tensors: the reference the fused op of
    /// host backends is tested against.
    pub fn forward_with_tensor_ops(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        self.check_heads(&q);
        let (f, dt) = (&self.coupling, &self.step_size);
        let integrator = self.integrator.as_ref();
        let out = if self.folds_dt() {
            // dt folds into the net's output layer: one step size for all heads, or one per head
            // with one net per head.
            let force_dt = |q: Tensor<B, 4>| f.forward_scaled(q, dt.dt.val());
            TensorPhaseSpace::with_force_times_dt(q, k, dt.broadcast(), &force_dt)
                .advance(integrator, self.steps)
        } else {
            // A step size per head for a net shared by the heads.
            let force = |q: Tensor<B, 4>| f.forward(q);
            integrate(integrator, q, k, dt.broadcast(), &force, self.steps)
        };
        (out.q, out.k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::integrator::IntegratorKind;
    use burn::backend::Flex;
    use burn::tensor::{Distribution, Tolerance};

    type TestBackend = Flex;

    #[test]
    fn mlp_only_moves_the_query_by_f_and_leaves_the_key() {
        let device = Default::default();
        let dynamics = QkDynamics::<TestBackend>::try_init(
            &DynamicsConfig::MlpOnly,
            &CouplingNetConfig::new(4),
            &StepSizeConfig::new(),
            2,
            &device,
        )
        .unwrap();
        assert!(dynamics.step_size().is_none(), "MLP-only has no dt");
        let q = Tensor::<TestBackend, 4>::random([2, 2, 3, 4], Distribution::Default, &device);
        let k = Tensor::<TestBackend, 4>::random([2, 2, 3, 4], Distribution::Default, &device);
        let (q1, k1) = dynamics.forward(q.clone(), k.clone());
        let f = dynamics.coupling().unwrap();
        let expected = q.clone() + f.forward(q);
        q1.into_data()
            .assert_approx_eq::<f32>(&expected.into_data(), Tolerance::default());
        k1.into_data().assert_eq(&k.into_data(), true);
    }

    #[test]
    fn the_coupled_path_equals_integrating_dt_times_f_by_hand() {
        // The layer folds dt into the coupling net where it can (one dt; or one per head with
        // a net per head) and multiplies by it where it cannot (one dt per head, one shared
        // net). Every case must give the dynamics of `integrate` with `f`, and the same dt
        // gradient.
        type Ad = burn::backend::Autodiff<TestBackend>;
        let device = Default::default();
        let cases = [
            (false, 1, DynamicsConfig::euler(2)),
            (false, 3, DynamicsConfig::leapfrog(2)),
            (true, 3, DynamicsConfig::leapfrog(2)),
            (true, 1, DynamicsConfig::euler(1)),
        ];
        for (per_head_dt, n_nets, config) in cases {
            let QkDynamics::Coupled(mut dynamics) = QkDynamics::<Ad>::try_init(
                &config,
                &CouplingNetConfig::new(4).with_n_nets(n_nets),
                &StepSizeConfig::new()
                    .with_per_head(per_head_dt)
                    .with_init(0.3),
                3,
                &device,
            )
            .unwrap() else {
                panic!("{config} is coupled")
            };
            // Distinct step sizes per head, so that a head mixed up in the fold shows.
            if per_head_dt {
                let values = Tensor::<Ad, 1>::from_floats([0.3, -0.7, 1.1], &device);
                dynamics.step_size = StepSize {
                    dt: burn::module::Param::from_tensor(values),
                };
            }
            assert_eq!(
                dynamics.folds_dt(),
                !per_head_dt || n_nets == 3,
                "per_head_dt {per_head_dt}, n_nets {n_nets}"
            );
            let q = Tensor::<Ad, 4>::random([2, 5, 3, 4], Distribution::Default, &device);
            let k = Tensor::<Ad, 4>::random([2, 5, 3, 4], Distribution::Default, &device);
            let (q1, k1) = dynamics.forward(q.clone(), k.clone());

            let (integrator, steps) = (&dynamics.integrator, &dynamics.steps);
            let f = &dynamics.coupling;
            let dt = &dynamics.step_size;
            let force = |q: Tensor<Ad, 4>| f.forward(q);
            let by_hand = integrate(
                integrator.as_ref(),
                q.clone(),
                k.clone(),
                dt.broadcast(),
                &force,
                *steps,
            );
            let what = format!("per_head_dt {per_head_dt}, n_nets {n_nets}, {config}");
            // The update rules written out, with dt broadcast over the head axis: a reference
            // that shares no code with the layer's path or with `integrate`.
            let dt4 = {
                let dt = dt.dt.val();
                let heads = dt.dims()[0];
                dt.reshape([1, 1, heads, 1])
            };
            let (mut q_ref, mut k_ref) = (q.clone(), k.clone());
            let DynamicsConfig::Coupled {
                integrator: kind, ..
            } = config
            else {
                unreachable!()
            };
            for _ in 0..*steps {
                (q_ref, k_ref) = if kind == IntegratorKind::EULER {
                    (
                        q_ref.clone() + dt4.clone() * k_ref.clone(),
                        k_ref + dt4.clone() * f.forward(q_ref),
                    )
                } else {
                    assert_eq!(kind, IntegratorKind::LEAPFROG);
                    let half = dt4.clone() / 2.0;
                    let k_half = k_ref + half.clone() * f.forward(q_ref.clone());
                    let q_next = q_ref + dt4.clone() * k_half.clone();
                    let k_next = k_half + half * f.forward(q_next.clone());
                    (q_next, k_next)
                };
            }
            for (got, expected) in [(&q1, &q_ref), (&k1, &k_ref)] {
                got.clone().inner().into_data().assert_approx_eq::<f32>(
                    &expected.clone().inner().into_data(),
                    Tolerance::rel_abs(1e-5, 1e-6),
                );
            }
            for (got, expected) in [(&q1, &by_hand.q), (&k1, &by_hand.k)] {
                got.clone().inner().into_data().assert_approx_eq::<f32>(
                    &expected.clone().inner().into_data(),
                    Tolerance::rel_abs(1e-5, 1e-6),
                );
            }
            let grad = |out: Tensor<Ad, 4>| {
                let grads = out.sum().backward();
                dt.dt.grad(&grads).expect("dt is learned").into_data()
            };
            let (folded, unfolded) = (grad(q1 + k1), grad(by_hand.q + by_hand.k));
            assert!(
                folded.iter::<f32>().all(|g| g != 0.0),
                "{what}: dt gets a gradient"
            );
            folded.assert_approx_eq::<f32>(&unfolded, Tolerance::rel_abs(1e-4, 1e-5));
        }
    }
}
