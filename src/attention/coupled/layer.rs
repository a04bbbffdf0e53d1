use crate::attention::cache::CoupledQkCache;
use crate::attention::input::validate_kernel;
use crate::attention::input::{AttentionInput, check_input};
use crate::attention::kernel::AttentionKernel;
use crate::attention::qk::evolve_and_rotate;
use crate::attention::rotary::RotaryPosition;
use crate::attention::sdpa::attend;
use crate::dynamics::QkDynamics;
use crate::error::or_panic;
use crate::integrator::Integrator;
use burn::module::Module;
use burn::nn::{Dropout, Linear, RotaryEncoding};
use burn::tensor::{Tensor, backend::Backend};
use std::sync::Arc;

/// Multi-head self-attention with **coupled query-key dynamics**, from *Coupled Query-Key
/// Dynamics for Attention* (Gahtan & Bronstein, 2026, arXiv:2604.01683).
///
/// Before scoring, each token's query and key evolve jointly under
///
/// ```text
/// dq/dt = k,    dk/dt = f(q)
/// ```
///
/// for a few steps of a learned `dt` (one forward-Euler step by default:
/// `q ← q + dt·k`, `k ← k + dt·f(q)`), with `f` a small [`CouplingNet`](crate::CouplingNet)
/// shared by the heads. Then `softmax(q·kᵀ/√d_head)·v` as usual. The dynamics act on each token
/// alone, so causal masking and caching work as in standard attention. The same layer is the
/// standard and MLP-only baselines, chosen by [`DynamicsConfig`](crate::DynamicsConfig).
///
/// Built by [`CoupledQkAttentionConfig`](super::CoupledQkAttentionConfig).
///
/// # Params
/// - `query`, `key`, `value`, `output`: [`Linear`], `d_model → d_model`
/// - `dynamics`: the coupling net and `dt` (see [`extra_num_params`](Self::extra_num_params))
#[derive(Module, Debug)]
pub struct CoupledQkAttention<B: Backend> {
    /// Projects the input to queries.
    pub query: Linear<B>,
    /// Projects the input to keys.
    pub key: Linear<B>,
    /// Projects the input to values.
    pub value: Linear<B>,
    /// Projects the merged heads back to `d_model`.
    pub output: Linear<B>,
    /// The pre-scoring dynamics.
    pub dynamics: QkDynamics<B>,
    /// Rotary position embedding over `d_head`, if configured.
    pub rotary: Option<RotaryEncoding<B>>,
    /// Where the rotary embedding acts.
    pub rotary_position: RotaryPosition,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// The number of heads.
    pub n_heads: usize,
    /// The size of each head.
    pub d_head: usize,
    /// Whether future positions are masked.
    pub causal: bool,
    /// How scores are computed under autodiff.
    pub kernel: AttentionKernel,
}

const NAME: &str = "CoupledQkAttention";

impl<B: Backend> CoupledQkAttention<B> {
    /// Self-attention over a whole sequence.
    ///
    /// # Shapes
    /// - `input.x`: `[batch, seq, d_model]`
    /// - `input.mask_pad`: `[batch, seq]`; `input.mask_attn`: `[batch, seq, seq]`
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// If a shape differs from the above (the message names the expected shape), the sequence
    /// is longer than the rotary embedding's `max_seq_len`, or the kernel is
    /// [`Flash`](AttentionKernel::Flash) under an autodiff backend without the op registered.
    pub fn forward(&self, input: impl Into<AttentionInput<B>>) -> Tensor<B, 3> {
        let (x, mask) = input.into().unpack(NAME, self.d_model());
        let (q, k, v) = self.project(x, 0);
        let context = attend(q, k, v, mask, self.causal, &self.dropout, self.kernel);
        self.merge_heads(context)
    }

    /// Self-attention over new positions, given the cache of earlier ones: for autoregressive
    /// decoding. Feeding a sequence in chunks (one token at a time or more) through the same cache
    /// gives the outputs of [`forward`](Self::forward) on the whole sequence, when the layer is
    /// causal.
    ///
    /// # Shapes
    /// - `x`: `[batch, new, d_model]`
    /// - output: `[batch, new, d_model]`
    ///
    /// # Panics
    /// If `x` is not `[batch, new, d_model]` with the cache's batch size, or the cached and new
    /// positions exceed the rotary embedding's `max_seq_len`.
    pub fn forward_cache(&self, x: Tensor<B, 3>, cache: &mut CoupledQkCache<B>) -> Tensor<B, 3> {
        let [batch, _, _] = check_input(NAME, &x, self.d_model());
        if let Some(keys) = &cache.keys {
            let cached = keys.dims()[0];
            assert_eq!(
                batch, cached,
                "{NAME}::forward_cache: the cache holds batch size {cached}, got input batch size {batch}"
            );
        }
        let (q, k, v) = self.project(x, cache.len());
        let (k, v) = cache.append(k, v);
        let context = attend(q, k, v, None, self.causal, &self.dropout, self.kernel);
        self.merge_heads(context)
    }

    /// The same layer with another integrator, for example one of the user's own: implement
    /// [`Integrator`] and pass it here; the attention code does not change.
    ///
    /// # Panics
    /// If the layer's dynamics are not coupled.
    pub fn with_integrator(mut self, integrator: Arc<dyn Integrator>) -> Self {
        self.dynamics = self.dynamics.with_integrator(integrator);
        self
    }

    /// The same layer scoring with `kernel` under autodiff (the weights are unchanged).
    ///
    /// # Panics
    /// If `kernel` is [`Flash`](AttentionKernel::Flash) and the layer has attention dropout,
    /// which the flash kernel does not apply.
    pub fn with_kernel(mut self, kernel: AttentionKernel) -> Self {
        or_panic(validate_kernel(NAME, kernel, self.dropout.prob));
        self.kernel = kernel;
        self
    }

    /// The parameters the dynamics add over a standard attention layer of the same shape: the
    /// coupling net and `dt` (counted even when `dt` is fixed). Zero for standard attention.
    pub fn extra_num_params(&self) -> usize {
        self.dynamics.num_params()
    }

    /// `d_model`.
    pub fn d_model(&self) -> usize {
        self.n_heads * self.d_head
    }

    /// Projects to heads, then applies the dynamics and the rotary embedding in the configured
    /// order. Returns `(q, k, v)`, each `[batch, heads, seq, d_head]`.
    fn project(&self, x: Tensor<B, 3>, start: usize) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        self.project_with(x, start, &self.dynamics)
    }

    /// [`project`](Self::project) with other dynamics (the probe compares with none).
    pub(super) fn project_with(
        &self,
        x: Tensor<B, 3>,
        start: usize,
        dynamics: &QkDynamics<B>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        // Token-major [batch, seq, heads, d_head]: contiguous, where the dynamics run fastest.
        let q = self.split_heads(self.query.forward(x.clone()));
        let k = self.split_heads(self.key.forward(x.clone()));
        let v = self.split_heads(self.value.forward(x)).swap_dims(1, 2);
        let (q, k) = evolve_and_rotate(
            NAME,
            dynamics,
            self.rotary.as_ref(),
            self.rotary_position,
            (q, k),
            start,
        );
        (q, k, v)
    }

    /// `[batch, seq, d_model]` → `[batch, seq, heads, d_head]` (a reshape, no copy).
    pub(super) fn split_heads(&self, x: Tensor<B, 3>) -> Tensor<B, 4> {
        let [batch, seq, _] = x.dims();
        x.reshape([batch, seq, self.n_heads, self.d_head])
    }

    /// `[batch, heads, seq, d_head]` → output projection of `[batch, seq, d_model]`.
    fn merge_heads(&self, context: Tensor<B, 4>) -> Tensor<B, 3> {
        let [batch, _, seq, _] = context.dims();
        let merged = context
            .swap_dims(1, 2)
            .reshape([batch, seq, self.d_model()]);
        self.output.forward(merged)
    }
}
