//! The invertible affine coupling of queries and keys: the direction of the later version of
//! Gahtan & Bronstein's paper ("Invertible Query-Key Coupling Composes with Attention
//! Mechanisms"), built from RealNVP's alternating affine maps (Dinh et al. 2017).
//!
//! Per token and head, each of `n` layers applies
//!
//! ```text
//! k ← k ⊙ exp(s₁(q)) + t₁(q)        then        q ← q ⊙ exp(s₂(k)) + t₂(k)
//! ```
//!
//! with `s`, `t` small MLPs of the [`CouplingNet`] shape and `s = B·tanh(raw/B)` bounded by
//! `B =` [`SCALE_BOUND`]. Each map changes one of `q`, `k` as a function of the other, so the
//! whole transform is invertible in closed form ([`AffineCoupling::inverse`]) and its Jacobian
//! determinant is `exp(Σ s)` ([`AffineCoupling::forward_with_log_det`]). The output layers of
//! `s` and `t` start at zero: at initialisation the layer is standard attention exactly.
//!
//! The paper does not publish its scale bound, net sizes or number of layers; these defaults are
//! this crate's.
//!
//! **The uncoupled control** ([`AffineCoupling::coupled`] `false`, the variant
//! `affine-uncoupled`) has the same four nets and bounded scales per layer, but moves each of `q`
//! and `k` by a function of itself, with no exchange between them:
//!
//! ```text
//! k ← k ⊙ exp(s₁(k)) + t₁(k)        then        q ← q ⊙ exp(s₂(q)) + t₂(q)
//! ```
//!
//! It is the affine family's counterpart of the paper's MLP-only control: the same parameters and
//! the same identity at initialisation, so a gain of the coupling over it is the exchange itself,
//! not capacity. It is not invertible in closed form, and has no [`inverse`](AffineCoupling::inverse)
//! or log-determinant.

use super::super::coupling::{CouplingNet, CouplingNetConfig};
use crate::error::ConfigError;
use burn::module::{Initializer, Module};
use burn::tensor::{Tensor, backend::Backend};

/// The default bound `B` of the log-scales: `s ∈ (−2, 2)`, so each map scales a coordinate by a
/// factor in `(e⁻², e²) ≈ (0.14, 7.4)`: enough to reshape the scores, not enough to blow them up
/// in the first steps of training.
pub const SCALE_BOUND: f64 = 2.0;

/// One affine layer: `k` moved by nets of `q`, then `q` by nets of the new `k`.
#[derive(Module, Debug)]
pub struct AffineLayer<B: Backend> {
    /// `s₁(q)`, the log-scale of the keys.
    pub key_scale: CouplingNet<B>,
    /// `t₁(q)`, the shift of the keys.
    pub key_shift: CouplingNet<B>,
    /// `s₂(k)`, the log-scale of the queries.
    pub query_scale: CouplingNet<B>,
    /// `t₂(k)`, the shift of the queries.
    pub query_shift: CouplingNet<B>,
}

/// The invertible affine coupling of a layer's queries and keys, or its uncoupled control (see
/// the module docs).
///
/// # Params
/// Four [`CouplingNet`]s per layer (shared by the heads, or one per head).
#[derive(Module, Debug)]
pub struct AffineCoupling<B: Backend> {
    /// The layers, applied in order.
    pub layers: Vec<AffineLayer<B>>,
    /// The bound `B` of the log-scales, `s = B·tanh(raw/B)`.
    pub scale_bound: f64,
    /// Whether keys are moved by nets of the queries and queries by nets of the keys (the
    /// coupling), or each by nets of itself (the uncoupled control).
    pub coupled: bool,
}

impl<B: Backend> AffineCoupling<B> {
    /// `layers` affine layers of nets shaped by `coupling`, their output layers zero (the
    /// identity), the scales bounded by [`SCALE_BOUND`]; `coupled` chooses the coupling or the
    /// uncoupled control.
    pub fn try_init(
        layers: usize,
        coupled: bool,
        coupling: &CouplingNetConfig,
        device: &B::Device,
    ) -> Result<Self, ConfigError> {
        let net = || -> Result<CouplingNet<B>, ConfigError> {
            let mut net = coupling.try_init(device)?;
            let [n, h, d] = net.w2.dims();
            net.w2 = Initializer::Zeros.init([n, h, d], device);
            net.b2 = Initializer::Zeros.init([n, d], device);
            Ok(net)
        };
        let layers = (0..layers)
            .map(|_| {
                Ok(AffineLayer {
                    key_scale: net()?,
                    key_shift: net()?,
                    query_scale: net()?,
                    query_shift: net()?,
                })
            })
            .collect::<Result<_, ConfigError>>()?;
        Ok(Self {
            layers,
            scale_bound: SCALE_BOUND,
            coupled,
        })
    }

    /// The bounded log-scale `B·tanh(raw/B)`.
    fn log_scale(&self, net: &CouplingNet<B>, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let b = self.scale_bound;
        net.forward(x).div_scalar(b).tanh().mul_scalar(b)
    }

    /// Transforms `q` and `k`.
    ///
    /// # Shapes
    /// - `q`, `k`: `[batch, seq, heads, d_head]`, and the same on output.
    ///
    /// # Panics
    /// If `d_head` is not the nets', or the nets are per head and `heads` differs.
    pub fn forward(
        &self,
        mut q: Tensor<B, 4>,
        mut k: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        for layer in &self.layers {
            #[cfg(feature = "autodiff")]
            if let Some(out) = super::fused::affine_layer(self, layer, &q, &k) {
                (q, k) = out;
                continue;
            }
            let (q1, k1, _) = self.layer(layer, q, k);
            (q, k) = (q1, k1);
        }
        (q, k)
    }

    /// [`forward`](Self::forward) as Burn tensor ops on every backend: the reference the fused
    /// op of host backends (Flex, NdArray) is tested against.
    pub fn forward_with_tensor_ops(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (q, k, _) = self.run(q, k, false);
        (q, k)
    }

    /// [`forward`](Self::forward), and the log-determinant of its Jacobian per token and head:
    /// `Σ s₁ + Σ s₂` over the layers and the `d_head` coordinates.
    ///
    /// # Shapes
    /// - `q`, `k`: `[batch, seq, heads, d_head]`; log-determinant: `[batch, seq, heads]`
    ///
    /// # Panics
    /// For the uncoupled control, whose Jacobian is not triangular.
    pub fn forward_with_log_det(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 3>) {
        assert!(
            self.coupled,
            "forward_with_log_det: the uncoupled control's log-determinant is not Σ s"
        );
        let (q, k, log_det) = self.run(q, k, true);
        (q, k, log_det.expect("asked for"))
    }

    fn run(
        &self,
        mut q: Tensor<B, 4>,
        mut k: Tensor<B, 4>,
        with_log_det: bool,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Option<Tensor<B, 3>>) {
        // Zeros of q's float type (f32 or f64).
        let mut log_det =
            with_log_det.then(|| q.clone().zeros_like().sum_dim(3).squeeze_dim::<3>(3));
        for layer in &self.layers {
            let (q1, k1, [s1, s2]) = self.layer(layer, q, k);
            (q, k) = (q1, k1);
            if let Some(total) = log_det.take() {
                let sum = |s: Tensor<B, 4>| s.sum_dim(3).squeeze_dim::<3>(3);
                log_det = Some(total + sum(s1) + sum(s2));
            }
        }
        (q, k, log_det)
    }

    /// One layer as tensor ops: the new `(q, k)` and the log-scales `[s₁, s₂]`.
    fn layer(
        &self,
        layer: &AffineLayer<B>,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, [Tensor<B, 4>; 2]) {
        // The coupling moves each of k, q by nets of the other; the control by nets of itself.
        let by = if self.coupled { q.clone() } else { k.clone() };
        let s1 = self.log_scale(&layer.key_scale, by.clone());
        let k = k * s1.clone().exp() + layer.key_shift.forward(by);
        let by = if self.coupled { k.clone() } else { q.clone() };
        let s2 = self.log_scale(&layer.query_scale, by.clone());
        let q = q * s2.clone().exp() + layer.query_shift.forward(by);
        (q, k, [s1, s2])
    }

    /// The exact inverse of [`forward`](Self::forward): the layers undone in reverse order.
    ///
    /// # Shapes
    /// - `q`, `k`: `[batch, seq, heads, d_head]`, and the same on output.
    ///
    /// # Panics
    /// For the uncoupled control, which has no inverse in closed form.
    pub fn inverse(
        &self,
        mut q: Tensor<B, 4>,
        mut k: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        assert!(
            self.coupled,
            "inverse: the uncoupled control has no inverse in closed form"
        );
        for layer in self.layers.iter().rev() {
            let s2 = self.log_scale(&layer.query_scale, k.clone());
            q = (q - layer.query_shift.forward(k.clone())) * s2.neg().exp();
            let s1 = self.log_scale(&layer.key_scale, q.clone());
            k = (k - layer.key_shift.forward(q.clone())) * s1.neg().exp();
        }
        (q, k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::module::Param;
    use burn::tensor::{Distribution, TensorData, Tolerance};

    type TestBackend = Flex;

    fn random_nets(mut coupling: AffineCoupling<TestBackend>) -> AffineCoupling<TestBackend> {
        let device = Default::default();
        let randomize = |net: &mut CouplingNet<TestBackend>| {
            let dist = Distribution::Uniform(-0.5, 0.5);
            net.w2 = Param::from_tensor(Tensor::random(net.w2.dims(), dist, &device));
            net.b2 = Param::from_tensor(Tensor::random(net.b2.dims(), dist, &device));
        };
        for layer in &mut coupling.layers {
            randomize(&mut layer.key_scale);
            randomize(&mut layer.key_shift);
            randomize(&mut layer.query_scale);
            randomize(&mut layer.query_shift);
        }
        coupling
    }

    #[test]
    fn at_initialisation_it_is_the_identity_exactly() {
        let device = Default::default();
        let q = Tensor::<TestBackend, 4>::random([2, 3, 2, 4], Distribution::Default, &device);
        let k = Tensor::<TestBackend, 4>::random([2, 3, 2, 4], Distribution::Default, &device);
        for coupled in [true, false] {
            let coupling = AffineCoupling::<TestBackend>::try_init(
                2,
                coupled,
                &CouplingNetConfig::new(4),
                &device,
            )
            .unwrap();
            let (q1, k1) = coupling.forward(q.clone(), k.clone());
            q1.into_data().assert_eq(&q.clone().into_data(), true);
            k1.into_data().assert_eq(&k.clone().into_data(), true);
            if coupled {
                let (_, _, log_det) = coupling.forward_with_log_det(q.clone(), k.clone());
                log_det
                    .into_data()
                    .assert_eq(&TensorData::zeros::<f32, _>([2, 3, 2]), true);
            }
        }
    }

    #[test]
    fn the_inverse_undoes_the_forward_map() {
        let device = Default::default();
        for n_nets in [1, 2] {
            let config = CouplingNetConfig::new(4).with_n_nets(n_nets);
            let coupling = random_nets(
                AffineCoupling::<TestBackend>::try_init(3, true, &config, &device).unwrap(),
            );
            let q = Tensor::<TestBackend, 4>::random([2, 5, 2, 4], Distribution::Default, &device);
            let k = Tensor::<TestBackend, 4>::random([2, 5, 2, 4], Distribution::Default, &device);
            let (q1, k1) = coupling.forward(q.clone(), k.clone());
            let moved = (q1.clone() - q.clone()).abs().max().into_scalar();
            assert!(moved > 0.1, "the random nets move q: {moved}");
            let (q0, k0) = coupling.inverse(q1, k1);
            let tol = Tolerance::absolute(1e-5);
            q0.into_data().assert_approx_eq::<f32>(&q.into_data(), tol);
            k0.into_data().assert_approx_eq::<f32>(&k.into_data(), tol);
        }
    }

    #[test]
    fn the_uncoupled_control_moves_each_of_q_and_k_by_itself_alone() {
        // With random nets, the control's new k depends on k only and its new q on q only; the
        // coupling's depend on the other. Perturbing one input shows which.
        let device = Default::default();
        let q = Tensor::<TestBackend, 4>::random([1, 4, 2, 4], Distribution::Default, &device);
        let k = Tensor::<TestBackend, 4>::random([1, 4, 2, 4], Distribution::Default, &device);
        let bump = Tensor::<TestBackend, 4>::random([1, 4, 2, 4], Distribution::Default, &device);
        let config = CouplingNetConfig::new(4);
        let change = |a: Tensor<TestBackend, 4>, b: Tensor<TestBackend, 4>| {
            (a - b).abs().max().into_scalar()
        };
        for coupled in [true, false] {
            let c = random_nets(
                AffineCoupling::<TestBackend>::try_init(1, coupled, &config, &device).unwrap(),
            );
            let (q1, k1) = c.forward(q.clone(), k.clone());
            let (q_of_k, _) = c.forward(q.clone(), k.clone() + bump.clone());
            let (_, k_of_q) = c.forward(q.clone() + bump.clone(), k.clone());
            let (q_moved, k_moved) = (change(q_of_k, q1), change(k_of_q, k1));
            if coupled {
                assert!(q_moved > 1e-3 && k_moved > 1e-3, "{q_moved} {k_moved}");
            } else {
                assert_eq!(
                    (q_moved, k_moved),
                    (0.0, 0.0),
                    "no exchange between q and k"
                );
            }
        }
    }
}
