//! The transformation of queries and keys before scoring: the one place that decides between
//! standard attention, the MLP-only baseline and the coupled dynamics.

use crate::coupling::{CouplingNet, CouplingNetConfig};
use crate::error::ConfigError;
use crate::integrator::{Integrator, IntegratorKind, TensorPhaseSpace, integrate};
use crate::step_size::{StepSize, StepSizeConfig};
use burn::module::Module;
use burn::tensor::{Tensor, backend::Backend};
use serde::{Deserialize, Serialize};
use std::str::FromStr;
use std::sync::Arc;

/// Which transformation a layer applies to `q` and `k` before scoring.
///
/// Serialised as `{"kind": "standard"}`, `{"kind": "mlp-only"}` or
/// `{"kind": "coupled", "integrator": "euler", "steps": 1}`; parsed from the names experiment
/// programs take on the command line: `standard`, `mlp-only`, `euler`, `leapfrog`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum DynamicsConfig {
    /// No dynamics: `q' = q`, `k' = k`.
    Standard,
    /// The uncoupled baseline of matched capacity: `q' = q + f(q)`, `k' = k`.
    MlpOnly,
    /// The coupled dynamics `dq/dt = k`, `dk/dt = f(q)`, integrated for `steps` steps.
    Coupled {
        /// The integrator.
        integrator: IntegratorKind,
        /// How many steps of size `dt` (the paper finds one enough).
        #[serde(default = "one")]
        steps: usize,
    },
}

fn one() -> usize {
    1
}

impl burn::config::Config for DynamicsConfig {}

impl Default for DynamicsConfig {
    /// One forward-Euler step, the paper's best 60M result.
    fn default() -> Self {
        Self::euler(1)
    }
}

impl DynamicsConfig {
    /// `steps` forward-Euler steps.
    pub fn euler(steps: usize) -> Self {
        Self::Coupled {
            integrator: IntegratorKind::Euler,
            steps,
        }
    }

    /// `steps` leapfrog steps.
    pub fn leapfrog(steps: usize) -> Self {
        Self::Coupled {
            integrator: IntegratorKind::Leapfrog,
            steps,
        }
    }

    /// The same dynamics with `steps` integrator steps; standard and MLP-only are unchanged.
    pub fn with_steps(self, steps: usize) -> Self {
        match self {
            Self::Coupled { integrator, .. } => Self::Coupled { integrator, steps },
            other => other,
        }
    }

    /// Whether the layer has a coupling net (every variant but standard).
    pub fn has_coupling_net(&self) -> bool {
        !matches!(self, Self::Standard)
    }

    /// The command-line name: `standard`, `mlp-only`, `euler`, `leapfrog`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Standard => "standard",
            Self::MlpOnly => "mlp-only",
            Self::Coupled {
                integrator: IntegratorKind::Euler,
                ..
            } => "euler",
            Self::Coupled {
                integrator: IntegratorKind::Leapfrog,
                ..
            } => "leapfrog",
        }
    }

    /// Checks the step count.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Self::Coupled { steps: 0, .. } => Err(ConfigError::new(
                "DynamicsConfig",
                "steps",
                0,
                "the coupled dynamics need at least 1 integrator step (use `standard` for none)",
            )),
            _ => Ok(()),
        }
    }
}

impl FromStr for DynamicsConfig {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "standard" => Ok(Self::Standard),
            "mlp-only" => Ok(Self::MlpOnly),
            "euler" => Ok(Self::euler(1)),
            "leapfrog" | "hamiltonian" => Ok(Self::leapfrog(1)),
            other => Err(format!(
                "unknown dynamics `{other}`: expected standard, mlp-only, euler or leapfrog"
            )),
        }
    }
}

/// How a built [`QkDynamics`] transforms `q` and `k`. Not a parameter: cloned as is.
#[derive(Clone, Debug)]
pub enum Scheme {
    /// Identity.
    Standard,
    /// `q' = q + f(q)`.
    MlpOnly,
    /// `steps` steps of `integrator`.
    Coupled {
        /// Any [`Integrator`], built in or the user's own.
        integrator: Arc<dyn Integrator>,
        /// Steps per forward pass.
        steps: usize,
    },
}

/// The pre-scoring dynamics of one attention layer: the coupling net, the step size and the
/// scheme that uses them.
///
/// Acts on each token independently (it never mixes positions), so it commutes with causal
/// masking and with a cache of evolved keys.
#[derive(Module, Debug)]
pub struct QkDynamics<B: Backend> {
    /// The force `f` (absent for standard attention).
    pub coupling: Option<CouplingNet<B>>,
    /// The step size `dt` (present for the coupled scheme only).
    pub step_size: Option<StepSize<B>>,
    /// What the forward pass does.
    pub scheme: Scheme,
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
        let coupling = match config.has_coupling_net() {
            true => Some(coupling.try_init(device)?),
            false => None,
        };
        let (scheme, step_size) = match config {
            DynamicsConfig::Standard => (Scheme::Standard, None),
            DynamicsConfig::MlpOnly => (Scheme::MlpOnly, None),
            DynamicsConfig::Coupled { integrator, steps } => (
                Scheme::Coupled {
                    integrator: integrator.build(),
                    steps: *steps,
                },
                Some(dt.try_init(n_heads, device)?),
            ),
        };
        Ok(Self {
            coupling,
            step_size,
            scheme,
        })
    }

    /// The same dynamics with another integrator (for example one of the user's own).
    ///
    /// # Panics
    /// If the dynamics are not coupled: standard and MLP-only have no integrator.
    pub fn with_integrator(mut self, integrator: Arc<dyn Integrator>) -> Self {
        match &mut self.scheme {
            Scheme::Coupled { integrator: i, .. } => *i = integrator,
            other => panic!(
                "with_integrator: the dynamics are {other:?}, which has no integrator; \
                 build the layer with DynamicsConfig::Coupled"
            ),
        }
        self
    }

    /// Whether the coupled dynamics fold `dt` into the coupling net's output layer
    /// ([`CouplingNet::forward_scaled`]) rather than multiplying every token's force by it: when
    /// there is one step size, or one per head with one net per head. `false` for the other
    /// schemes.
    pub fn folds_dt(&self) -> bool {
        match (&self.coupling, &self.step_size) {
            (Some(f), Some(dt)) => {
                let [n_dt] = dt.dt.dims();
                n_dt == 1 || n_dt == f.n_nets()
            }
            _ => false,
        }
    }

    /// Transforms `q` and `k`.
    ///
    /// # Shapes
    /// - `q`, `k`: `[batch, seq, heads, d_head]`, and the same on output. Token-major, the layout
    ///   the projections produce: the dynamics' elementwise work then runs on contiguous memory
    ///   (on Flex, strided elementwise ops are ~30× slower).
    ///
    /// # Panics
    /// If `heads` is not the number of heads the dynamics were built for (a per-head step size
    /// or per-head coupling nets), or `d_head` not the coupling net's.
    pub fn forward(&self, q: Tensor<B, 4>, k: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        match &self.scheme {
            Scheme::Standard => (q, k),
            Scheme::MlpOnly => {
                let f = self.coupling.as_ref().expect("MLP-only has a coupling net");
                (q.clone() + f.forward(q), k)
            }
            Scheme::Coupled { integrator, steps } => {
                let f = self.coupling.as_ref().expect("coupled has a coupling net");
                let dt = self.step_size.as_ref().expect("coupled has a step size");
                let [n_dt] = dt.dt.dims();
                let heads = q.dims()[2];
                assert!(
                    n_dt == 1 || n_dt == heads,
                    "QkDynamics: a step size per head for {n_dt} heads, but q and k have {heads} \
                     heads ([batch, seq, heads, d_head] = {:?})",
                    q.dims()
                );
                let out = if self.folds_dt() {
                    // dt folds into the net's output layer: one step size for all heads, or
                    // one per head with one net per head.
                    let force_dt = |q: Tensor<B, 4>| f.forward_scaled(q, dt.dt.val());
                    TensorPhaseSpace::with_force_times_dt(q, k, dt.broadcast(), &force_dt)
                        .advance(integrator.as_ref(), *steps)
                } else {
                    // A step size per head for a net shared by the heads.
                    let force = |q: Tensor<B, 4>| f.forward(q);
                    integrate(integrator.as_ref(), q, k, dt.broadcast(), &force, *steps)
                };
                (out.q, out.k)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert!(dynamics.step_size.is_none(), "MLP-only has no dt");
        let q = Tensor::<TestBackend, 4>::random([2, 2, 3, 4], Distribution::Default, &device);
        let k = Tensor::<TestBackend, 4>::random([2, 2, 3, 4], Distribution::Default, &device);
        let (q1, k1) = dynamics.forward(q.clone(), k.clone());
        let f = dynamics.coupling.as_ref().unwrap();
        let expected = q.clone() + f.forward(q);
        q1.into_data()
            .assert_approx_eq::<f32>(&expected.into_data(), Tolerance::default());
        k1.into_data().assert_eq(&k.into_data(), true);
    }

    #[test]
    fn names_round_trip_through_from_str() {
        for config in [
            DynamicsConfig::Standard,
            DynamicsConfig::MlpOnly,
            DynamicsConfig::euler(1),
            DynamicsConfig::leapfrog(1),
        ] {
            assert_eq!(config.name().parse::<DynamicsConfig>().unwrap(), config);
        }
        let err = "rk4".parse::<DynamicsConfig>().unwrap_err();
        assert!(err.contains("rk4") && err.contains("leapfrog"), "{err}");
    }

    #[test]
    fn serde_uses_the_experiment_names() {
        let json = serde_json::to_string(&DynamicsConfig::leapfrog(3)).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"coupled","integrator":"leapfrog","steps":3}"#
        );
        let parsed: DynamicsConfig =
            serde_json::from_str(r#"{"kind":"coupled","integrator":"euler"}"#).unwrap();
        assert_eq!(parsed, DynamicsConfig::euler(1));
        let parsed: DynamicsConfig = serde_json::from_str(r#"{"kind":"mlp-only"}"#).unwrap();
        assert_eq!(parsed, DynamicsConfig::MlpOnly);
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
            let mut dynamics = QkDynamics::<Ad>::try_init(
                &config,
                &CouplingNetConfig::new(4).with_n_nets(n_nets),
                &StepSizeConfig::new()
                    .with_per_head(per_head_dt)
                    .with_init(0.3),
                3,
                &device,
            )
            .unwrap();
            // Distinct step sizes per head, so that a head mixed up in the fold shows.
            if per_head_dt {
                let values = Tensor::<Ad, 1>::from_floats([0.3, -0.7, 1.1], &device);
                dynamics.step_size = Some(StepSize {
                    dt: burn::module::Param::from_tensor(values),
                });
            }
            assert_eq!(
                dynamics.folds_dt(),
                !per_head_dt || n_nets == 3,
                "per_head_dt {per_head_dt}, n_nets {n_nets}"
            );
            let q = Tensor::<Ad, 4>::random([2, 5, 3, 4], Distribution::Default, &device);
            let k = Tensor::<Ad, 4>::random([2, 5, 3, 4], Distribution::Default, &device);
            let (q1, k1) = dynamics.forward(q.clone(), k.clone());

            let Scheme::Coupled { integrator, steps } = &dynamics.scheme else {
                panic!("{config:?} is coupled")
            };
            let f = dynamics.coupling.as_ref().unwrap();
            let dt = dynamics.step_size.as_ref().unwrap();
            let force = |q: Tensor<Ad, 4>| f.forward(q);
            let by_hand = integrate(
                integrator.as_ref(),
                q.clone(),
                k.clone(),
                dt.broadcast(),
                &force,
                *steps,
            );
            let what = format!("per_head_dt {per_head_dt}, n_nets {n_nets}, {config:?}");
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
                (q_ref, k_ref) = match kind {
                    IntegratorKind::Euler => (
                        q_ref.clone() + dt4.clone() * k_ref.clone(),
                        k_ref + dt4.clone() * f.forward(q_ref),
                    ),
                    IntegratorKind::Leapfrog => {
                        let half = dt4.clone() / 2.0;
                        let k_half = k_ref + half.clone() * f.forward(q_ref.clone());
                        let q_next = q_ref + dt4.clone() * k_half.clone();
                        let k_next = k_half + half * f.forward(q_next.clone());
                        (q_next, k_next)
                    }
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

    #[test]
    fn zero_steps_is_rejected() {
        let err = DynamicsConfig::euler(0).validate().unwrap_err();
        assert_eq!(err.field, "steps");
    }
}
