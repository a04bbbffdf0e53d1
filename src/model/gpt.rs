//! A GPT-style decoder: embeddings, pre-norm blocks of attention ([`CoupledQkAttention`] or
//! [`DifferentialAttention`]) and a GELU MLP, a final norm and an LM head tied to the token
//! embedding. Shapes in comments: `b` batch,
//! `s` sequence, `d` d_model, `v` vocabulary.

use crate::attention::{
    AttentionKernel, CoupledQkAttention, DifferentialAttention, DynamicsStats, KvCache,
};
use burn::module::Module;
use burn::nn::{Embedding, Gelu, LayerNorm, Linear, RmsNorm};
use burn::tensor::{Int, Tensor, backend::Backend};

/// LayerNorm or RmsNorm.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Norm<B: Backend> {
    /// Burn's `LayerNorm`.
    Layer(LayerNorm<B>),
    /// Burn's `RmsNorm`.
    Rms(RmsNorm<B>),
}

impl<B: Backend> Norm<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match self {
            Norm::Layer(norm) => norm.forward(x),
            Norm::Rms(norm) => norm.forward(x),
        }
    }
}

/// A block's attention layer, chosen by [`GptConfig::attention`](super::GptConfig).
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum BlockAttention<B: Backend> {
    /// Coupled QK attention (and its standard and MLP-only baselines).
    Coupled(CoupledQkAttention<B>),
    /// Differential attention (Ye et al. 2024).
    Differential(DifferentialAttention<B>),
}

impl<B: Backend> BlockAttention<B> {
    /// Causal self-attention.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    /// - output: `[batch, seq, d_model]`
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match self {
            Self::Coupled(attention) => attention.forward(x),
            Self::Differential(attention) => attention.forward(x),
        }
    }

    /// Causal self-attention over new positions, given the cache of earlier ones.
    ///
    /// # Shapes
    /// - `x`: `[batch, new, d_model]`
    /// - output: `[batch, new, d_model]`
    pub fn forward_cache(&self, x: Tensor<B, 3>, cache: &mut KvCache<B>) -> Tensor<B, 3> {
        match self {
            Self::Coupled(attention) => attention.forward_cache(x, cache),
            Self::Differential(attention) => attention.forward_cache(x, cache),
        }
    }

    /// The same layer scoring with `kernel` under autodiff.
    ///
    /// # Panics
    /// If `kernel` is [`Flash`](AttentionKernel::Flash) and the layer has attention dropout.
    pub fn with_kernel(self, kernel: AttentionKernel) -> Self {
        match self {
            Self::Coupled(attention) => Self::Coupled(attention.with_kernel(kernel)),
            Self::Differential(attention) => Self::Differential(attention.with_kernel(kernel)),
        }
    }

    /// The parameters the layer adds over standard attention with the same projections.
    pub fn extra_num_params(&self) -> usize {
        match self {
            Self::Coupled(attention) => attention.extra_num_params(),
            Self::Differential(attention) => attention.extra_num_params(),
        }
    }
}

/// The caches of a [`Gpt`]'s layers, for [`Gpt::forward_cache`]: one [`KvCache`] per block.
#[derive(Debug, Clone)]
pub struct GptCache<B: Backend> {
    layers: Vec<KvCache<B>>,
}

impl<B: Backend> Default for GptCache<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Backend> GptCache<B> {
    /// An empty cache (sized to the model on first use).
    pub fn new() -> Self {
        Self { layers: Vec::new() }
    }

    /// How many positions it holds.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, KvCache::len)
    }

    /// Whether it holds no position.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every position.
    pub fn clear(&mut self) {
        self.layers.clear();
    }
}

/// `d → r·d → d` with GELU.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// `d → r·d`.
    pub up: Linear<B>,
    /// `r·d → d`, into the residual stream.
    pub down: Linear<B>,
    /// The activation.
    pub gelu: Gelu,
}

/// `x + attention(norm(x))`, then `x + mlp(norm(x))` when the block has an MLP.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    /// Before attention.
    pub norm_attention: Norm<B>,
    /// Causal self-attention, any variant.
    pub attention: BlockAttention<B>,
    /// Before the MLP.
    pub norm_mlp: Option<Norm<B>>,
    /// The MLP (absent in attention-only models).
    pub mlp: Option<Mlp<B>>,
}

impl<B: Backend> Block<B> {
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let x = x.clone() + self.attention.forward(self.norm_attention.forward(x)); // [b, s, d]
        self.forward_mlp(x)
    }

    fn forward_cache(&self, x: Tensor<B, 3>, cache: &mut KvCache<B>) -> Tensor<B, 3> {
        let h = self.norm_attention.forward(x.clone());
        let x = x + self.attention.forward_cache(h, cache); // [b, new, d]
        self.forward_mlp(x)
    }

    fn forward_mlp(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match (&self.norm_mlp, &self.mlp) {
            (Some(norm), Some(mlp)) => {
                let h = super::gelu::gelu(&mlp.gelu, mlp.up.forward(norm.forward(x.clone()))); // [b, s, r·d]
                x + mlp.down.forward(h)
            }
            _ => x,
        }
    }
}

/// A GPT-style decoder built by [`GptConfig`](super::GptConfig).
#[derive(Module, Debug)]
pub struct Gpt<B: Backend> {
    /// Token embedding `[v, d]` (also the LM head when tied).
    pub tokens: Embedding<B>,
    /// Learned position embedding `[context, d]`, absent with rotary positions.
    pub positions: Option<Embedding<B>>,
    /// The blocks.
    pub blocks: Vec<Block<B>>,
    /// The final norm.
    pub norm: Norm<B>,
    /// An untied LM head `d → v`; `None` when tied to the token embedding.
    pub head: Option<Linear<B>>,
    /// The longest sequence the model reads.
    pub context: usize,
}

impl<B: Backend> Gpt<B> {
    /// Token (and learned position) embeddings of positions `start..start + seq`,
    /// `[batch, seq]` → `[batch, seq, d]`.
    fn embed(&self, tokens: Tensor<B, 2, Int>, start: usize) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        assert!(
            start + seq <= self.context,
            "Gpt: {} positions exceed the context of {}",
            start + seq,
            self.context
        );
        let device = tokens.device();
        let x = self.tokens.forward(tokens); // [b, s, d]
        match &self.positions {
            Some(positions) => {
                let index =
                    Tensor::<B, 1, Int>::arange(start as i64..(start + seq) as i64, &device)
                        .reshape([1, seq])
                        .expand([batch, seq]);
                x + positions.forward(index) // [b, s, d]
            }
            None => x,
        }
    }

    /// The same model with every attention layer scoring with `kernel` under autodiff
    /// ([`AttentionKernel::Flash`] to train with memory linear in the sequence length). The
    /// weights, outputs and saved configs are unchanged: the kernel is how the model runs, not
    /// what it is.
    ///
    /// # Panics
    /// If `kernel` is [`Flash`](AttentionKernel::Flash) and the attention layers have dropout.
    pub fn with_attention_kernel(mut self, kernel: AttentionKernel) -> Self {
        self.blocks = self
            .blocks
            .into_iter()
            .map(|block| Block {
                attention: block.attention.with_kernel(kernel),
                ..block
            })
            .collect();
        self
    }

    /// Next-token logits.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`, `seq <= context`
    /// - output: `[batch, seq, vocab]`
    ///
    /// # Panics
    /// If `seq` exceeds the context.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.project(self.forward_hidden(tokens))
    }

    /// The final hidden states, after the final norm: what the LM head reads. With
    /// [`head_weight`](Self::head_weight) and [`head_bias`](Self::head_bias) they give the
    /// logits of [`forward`](Self::forward), or a loss that never forms them
    /// ([`linear_cross_entropy`](super::linear_cross_entropy)).
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`, `seq <= context`
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// If `seq` exceeds the context.
    pub fn forward_hidden(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let mut x = self.embed(tokens, 0); // [b, s, d]
        for block in &self.blocks {
            x = block.forward(x);
        }
        self.norm.forward(x)
    }

    /// The LM head's weight, one row per token: the token embedding when tied, else the untied
    /// head's weight transposed (Burn's `Linear` stores `[d, v]`).
    ///
    /// # Shapes
    /// - output: `[vocab, d_model]`
    pub fn head_weight(&self) -> Tensor<B, 2> {
        match &self.head {
            Some(head) => head.weight.val().transpose(),
            None => self.tokens.weight.val(),
        }
    }

    /// The LM head's bias, if it has one (only an untied head can).
    ///
    /// # Shapes
    /// - output: `[vocab]`
    pub fn head_bias(&self) -> Option<Tensor<B, 1>> {
        self.head
            .as_ref()
            .and_then(|head| head.bias.as_ref().map(|bias| bias.val()))
    }

    /// Next-token logits of new positions, given the cache of earlier ones: incremental decoding.
    /// Feeding a sequence in chunks (a prompt, then one token at a time) through one cache gives
    /// the logits of [`forward`](Self::forward) on the whole sequence.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, new]`
    /// - output: `[batch, new, vocab]`
    ///
    /// # Panics
    /// If the cached and new positions exceed the context, or the batch size is not the cache's.
    pub fn forward_cache(
        &self,
        tokens: Tensor<B, 2, Int>,
        cache: &mut GptCache<B>,
    ) -> Tensor<B, 3> {
        if cache.layers.len() != self.blocks.len() {
            cache.layers = (0..self.blocks.len()).map(|_| KvCache::new()).collect();
        }
        let start = cache.len();
        let mut x = self.embed(tokens, start); // [b, new, d]
        for (block, layer_cache) in self.blocks.iter().zip(&mut cache.layers) {
            x = block.forward_cache(x, layer_cache);
        }
        self.project(self.norm.forward(x))
    }

    /// The LM head on normed hidden states: `[batch, seq, d]` → `[batch, seq, vocab]`.
    fn project(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match &self.head {
            Some(head) => head.forward(x),
            None => {
                let [b, s, d] = x.dims();
                let table = self.tokens.weight.val(); // [v, d]
                let v = table.dims()[0];
                x.reshape([b * s, d])
                    .matmul(table.transpose())
                    .reshape([b, s, v])
            }
        }
    }

    /// What each block's query-key dynamics do to `tokens` (see
    /// [`CoupledQkAttention::dynamics_stats`] and [`DifferentialAttention::dynamics_stats`]): one
    /// entry per block. A diagnostic for training runs: one forward pass, no gradients needed.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`, `seq <= context`
    ///
    /// # Panics
    /// If `seq` exceeds the context.
    pub fn dynamics_stats(&self, tokens: Tensor<B, 2, Int>) -> Vec<DynamicsStats> {
        self.probe_blocks(tokens, |attention, x| match attention {
            BlockAttention::Coupled(attention) => attention.dynamics_stats(x),
            BlockAttention::Differential(attention) => attention.dynamics_stats(x),
        })
    }

    /// The attention weights each block scores `tokens` with (see
    /// [`CoupledQkAttention::attention_maps`] and [`DifferentialAttention::attention_maps`]): one
    /// entry per block, causal, rows summing to 1. A diagnostic of what attention does (its
    /// entropy, rank, singular values): one forward pass, no gradients needed.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]`, `seq <= context`
    /// - each entry: `[batch, maps, seq, seq]`, `maps` the heads; for differential attention
    ///   both softmax maps of each of its heads
    ///   ([`differential_heads`](crate::model::GptConfig::differential_heads))
    ///
    /// # Panics
    /// If `seq` exceeds the context.
    pub fn attention_maps(&self, tokens: Tensor<B, 2, Int>) -> Vec<Tensor<B, 4>> {
        self.probe_blocks(tokens, |attention, x| match attention {
            BlockAttention::Coupled(attention) => attention.attention_maps(x),
            BlockAttention::Differential(attention) => attention.attention_maps(x),
        })
    }

    /// `probe` of each block's attention on the input it sees (after the block's norm), block by
    /// block through the model.
    fn probe_blocks<T>(
        &self,
        tokens: Tensor<B, 2, Int>,
        probe: impl Fn(&BlockAttention<B>, Tensor<B, 3>) -> T,
    ) -> Vec<T> {
        let mut x = self.embed(tokens, 0);
        let mut found = Vec::with_capacity(self.blocks.len());
        for block in &self.blocks {
            found.push(probe(
                &block.attention,
                block.norm_attention.forward(x.clone()),
            ));
            x = block.forward(x);
        }
        found
    }

    /// The parameters the attention variant adds over the same model with standard attention:
    /// the coupling nets and step sizes of the coupled variants, or the λ vectors and per-head
    /// norms of differential attention.
    pub fn extra_num_params(&self) -> usize {
        self.blocks
            .iter()
            .map(|b| b.attention.extra_num_params())
            .sum()
    }
}
