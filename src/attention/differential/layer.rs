use crate::attention::cache::KvCache;
use crate::attention::input::validate_kernel;
use crate::attention::input::{AttentionInput, check_input};
use crate::attention::kernel::AttentionKernel;
use crate::attention::qk::evolve_and_rotate;
use crate::attention::rotary::RotaryPosition;
use crate::attention::sdpa::{attend, attention_weights};
use crate::dynamics::QkDynamics;
use crate::error::or_panic;
use burn::module::{Module, Param};
use burn::nn::{Dropout, Linear, RmsNorm, RotaryEncoding};
use burn::tensor::{Bool, Tensor, backend::Backend};

/// Multi-head **differential attention**, from *Differential Transformer* (Ye et al. 2024,
/// arXiv:2410.05258, V1).
///
/// Each head scores two softmax maps and attends with their difference, cancelling the
/// attention noise common to both:
///
/// ```text
/// [Q₁ Q₂] = x·W_q,  [K₁ K₂] = x·W_k,  V = x·W_v          (per head: d_map, d_map; 2·d_map)
/// Aᵢ = softmax(Qᵢ·Kᵢᵀ/√d_map)
/// λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init,  λ_init = 0.8 − 0.6·exp(−0.3·layer_index)
/// headᵢ = (1 − λ_init)·RMSNorm((A₁ − λ·A₂)·V)
/// output = [head₁ … head_h]·W_o
/// ```
///
/// The four λ vectors (width `d_map`) are learned and shared by the layer's heads, as is the
/// RMSNorm's weight (over `2·d_map`), following the reference code. The projections have the
/// parameters of a standard layer; [`extra_num_params`](Self::extra_num_params) counts the rest.
///
/// **With query-key dynamics** (`dynamics` other than standard), each pair `(Qᵢ, Kᵢ)` of every
/// head evolves before scoring exactly as a coupled layer's heads do (Euler or leapfrog steps of
/// `q ← q + dt·k`, `k ← k + dt·f(q)`, MLP-only, or the invertible affine coupling), with one
/// coupling net shared by all maps: the composition of coupling with differential attention of
/// *Invertible Query-Key Coupling Composes with Attention Mechanisms* (Gahtan & Bronstein,
/// arXiv:2604.01683, later version). `dt = 0` (or a zero-initialised affine net) is plain differential
/// attention exactly.
///
/// Built by [`DifferentialAttentionConfig`](super::DifferentialAttentionConfig).
///
/// # Params
/// - `query`, `key`, `value`, `output`: [`Linear`], `d_model → d_model`
/// - `lambda_q1`, `lambda_k1`, `lambda_q2`, `lambda_k2`: `[d_map]`
/// - `norm`: [`RmsNorm`] over `2·d_map`
#[derive(Module, Debug)]
pub struct DifferentialAttention<B: Backend> {
    /// Projects the input to the two query maps of every head.
    pub query: Linear<B>,
    /// Projects the input to the two key maps of every head.
    pub key: Linear<B>,
    /// Projects the input to the values (`2·d_map` per head).
    pub value: Linear<B>,
    /// Projects the merged heads back to `d_model`.
    pub output: Linear<B>,
    /// `λ_q1`, `[d_map]`.
    pub lambda_q1: Param<Tensor<B, 1>>,
    /// `λ_k1`, `[d_map]`.
    pub lambda_k1: Param<Tensor<B, 1>>,
    /// `λ_q2`, `[d_map]`.
    pub lambda_q2: Param<Tensor<B, 1>>,
    /// `λ_k2`, `[d_map]`.
    pub lambda_k2: Param<Tensor<B, 1>>,
    /// The per-head RMSNorm over `2·d_map`, its weight shared by the heads.
    pub norm: RmsNorm<B>,
    /// Rotary position embedding over `d_map`, if configured.
    pub rotary: Option<RotaryEncoding<B>>,
    /// Where the rotary embedding acts.
    pub rotary_position: RotaryPosition,
    /// The query-key dynamics of every map pair (standard: none).
    pub dynamics: QkDynamics<B>,
    /// Dropout on the differential map `A₁ − λ·A₂`.
    pub dropout: Dropout,
    /// The number of differential heads.
    pub n_heads: usize,
    /// The width of each query and key map.
    pub d_map: usize,
    /// `λ_init` of this layer.
    pub lambda_init: f64,
    /// Whether future positions are masked.
    pub causal: bool,
    /// How scores are computed under autodiff.
    pub kernel: AttentionKernel,
}

const NAME: &str = "DifferentialAttention";

impl<B: Backend> DifferentialAttention<B> {
    /// Self-attention over a whole sequence.
    ///
    /// # Shapes
    /// - `input.x`: `[batch, seq, d_model]`
    /// - `input.mask_pad`: `[batch, seq]`; `input.mask_attn`: `[batch, seq, seq]` (`true`:
    ///   masked out)
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// If a shape differs from the above (the message names the expected shape), or the sequence
    /// is longer than the rotary embedding's `max_seq_len`.
    pub fn forward(&self, input: impl Into<AttentionInput<B>>) -> Tensor<B, 3> {
        let (x, mask) = input.into().unpack(NAME, self.d_model());
        let (q, k, v) = self.project(x, 0);
        self.attend(q, k, v, mask)
    }

    /// Self-attention over new positions, given the cache of earlier ones: for autoregressive
    /// decoding. Feeding a sequence in chunks through the same cache gives the outputs of
    /// [`forward`](Self::forward) on the whole sequence, when the layer is causal.
    ///
    /// # Shapes
    /// - `x`: `[batch, new, d_model]`
    /// - output: `[batch, new, d_model]`
    ///
    /// # Panics
    /// If `x` is not `[batch, new, d_model]` with the cache's batch size, or the cached and new
    /// positions exceed the rotary embedding's `max_seq_len`.
    pub fn forward_cache(&self, x: Tensor<B, 3>, cache: &mut KvCache<B>) -> Tensor<B, 3> {
        let [batch, _, _] = check_input(NAME, &x, self.d_model());
        if let Some(cached) = cache.batch() {
            assert_eq!(
                batch, cached,
                "{NAME}::forward_cache: the cache holds batch size {cached}, got input batch size {batch}"
            );
        }
        let (q, k, v) = self.project(x, cache.len());
        let (k, v) = cache.append(k, v);
        self.attend(q, k, v, None)
    }

    /// The query and key maps (rotated as positions `start..`) and the values.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    /// - output: `q`, `k`: `[batch, 2·heads, seq, d_map]` (map `2h` and `2h + 1` are head `h`'s
    ///   first and second, the reference code's layout); `v`: `[batch, heads, seq, 2·d_map]`
    fn project(&self, x: Tensor<B, 3>, start: usize) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        self.project_with(x, start, &self.dynamics)
    }

    /// [`project`](Self::project) with the given dynamics in place of the layer's.
    pub(super) fn project_with(
        &self,
        x: Tensor<B, 3>,
        start: usize,
        dynamics: &QkDynamics<B>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        let (heads, d_map) = (self.n_heads, self.d_map);
        let [batch, seq, _] = x.dims();
        // Token-major [batch, seq, 2·heads, d_map] for the dynamics.
        let maps = |t: Tensor<B, 3>| t.reshape([batch, seq, 2 * heads, d_map]);
        let (q, k) = evolve_and_rotate(
            NAME,
            dynamics,
            self.rotary.as_ref(),
            self.rotary_position,
            (
                maps(self.query.forward(x.clone())),
                maps(self.key.forward(x.clone())),
            ),
            start,
        );
        let v = self
            .value
            .forward(x)
            .reshape([batch, seq, heads, 2 * d_map])
            .swap_dims(1, 2);
        (q, k, v)
    }

    /// `(1 − λ_init)·RMSNorm((A₁ − λ·A₂)·V)` per head, merged and projected.
    ///
    /// # Shapes
    /// - `q`: `[batch, 2·heads, s_q, d_map]`; `k`: `[batch, 2·heads, s_k, d_map]`;
    ///   `v`: `[batch, heads, s_k, 2·d_map]`; `mask`: `[batch, 1, s_q or 1, s_k]` (every head's)
    /// - output: `[batch, s_q, d_model]`
    fn attend(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        mask: Option<Tensor<B, 4, Bool>>,
    ) -> Tensor<B, 3> {
        let heads = self.n_heads;
        let [batch, _, s_q, d_map] = q.dims();
        let s_k = k.dims()[2];
        let lambda = self.lambda().reshape([1, 1, 1, 1]);
        let context = match self.kernel {
            AttentionKernel::Explicit => {
                let weights =
                    attention_weights(q, k, mask, self.causal).reshape([batch, heads, 2, s_q, s_k]);
                let [a1, a2] = [0, 1].map(|i| {
                    weights
                        .clone()
                        .narrow(2, i, 1)
                        .reshape([batch, heads, s_q, s_k])
                });
                self.dropout.forward(a1 - a2 * lambda).matmul(v) // [b, h, s_q, 2·d_map]
            }
            // (A₁ − λ·A₂)·V = A₁·V − λ·(A₂·V): two attentions, neither keeping its weights.
            AttentionKernel::Flash => {
                let (q, k) = (
                    q.reshape([batch, heads, 2, s_q, d_map]),
                    k.reshape([batch, heads, 2, s_k, d_map]),
                );
                // The mask is shared by every head, so by both maps of a head.
                let [c1, c2] = [0, 1].map(|i| {
                    let map = |t: &Tensor<B, 5>, s| {
                        t.clone().narrow(2, i, 1).reshape([batch, heads, s, d_map])
                    };
                    attend(
                        map(&q, s_q),
                        map(&k, s_k),
                        v.clone(),
                        mask.clone(),
                        self.causal,
                        &self.dropout,
                        self.kernel,
                    )
                });
                c1 - c2 * lambda
            }
        };
        let context = self
            .norm
            .forward(context)
            .mul_scalar(1.0 - self.lambda_init);
        let merged = context
            .swap_dims(1, 2)
            .reshape([batch, s_q, self.d_model()]);
        self.output.forward(merged)
    }

    /// The same layer scoring with `kernel` under autodiff (the weights are unchanged).
    ///
    /// # Panics
    /// If `kernel` is [`Flash`](AttentionKernel::Flash) and the layer has dropout, which the
    /// flash kernel does not apply.
    pub fn with_kernel(mut self, kernel: AttentionKernel) -> Self {
        or_panic(validate_kernel(NAME, kernel, self.dropout.prob));
        self.kernel = kernel;
        self
    }

    /// `λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init`, shape `[1]`.
    pub fn lambda(&self) -> Tensor<B, 1> {
        let dot = |a: &Param<Tensor<B, 1>>, b: &Param<Tensor<B, 1>>| (a.val() * b.val()).sum();
        (dot(&self.lambda_q1, &self.lambda_k1).exp() - dot(&self.lambda_q2, &self.lambda_k2).exp())
            .add_scalar(self.lambda_init)
    }

    /// The parameters the layer adds over a standard attention layer with the same projections:
    /// the four λ vectors and the RMSNorm's weight (`6·d_map`), and the dynamics'.
    pub fn extra_num_params(&self) -> usize {
        self.dynamics.num_params() + self.differential_num_params()
    }

    /// The four λ vectors and the RMSNorm's weight, `6·d_map`.
    fn differential_num_params(&self) -> usize {
        [
            &self.lambda_q1,
            &self.lambda_k1,
            &self.lambda_q2,
            &self.lambda_k2,
        ]
        .iter()
        .map(|p| p.num_params())
        .sum::<usize>()
            + self.norm.num_params()
    }

    /// `d_model = 2·n_heads·d_map`.
    pub fn d_model(&self) -> usize {
        2 * self.n_heads * self.d_map
    }
}
