//! [`KvCache`]: the keys and values an attention layer has seen, for incremental decoding.

use burn::tensor::{Tensor, backend::Backend};

/// The keys and values an attention layer has seen, for incremental decoding with
/// [`CoupledQkAttention::forward_cache`](super::CoupledQkAttention::forward_cache) or
/// [`DifferentialAttention::forward_cache`](super::DifferentialAttention::forward_cache).
///
/// The keys are stored as scored: for the coupled layer **evolved** (after the dynamics and, if
/// configured, the rotary embedding). The dynamics act on each token alone, so a token's evolved
/// key never changes once computed, and decoding with this cache equals the full forward pass.
/// One cache per layer.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    /// `[batch, key heads, len, d_key]`
    pub(crate) keys: Option<Tensor<B, 4>>,
    /// `[batch, value heads, len, d_value]`
    pub(crate) values: Option<Tensor<B, 4>>,
}

/// The cache of a [`CoupledQkAttention`](super::CoupledQkAttention) layer.
pub type CoupledQkCache<B> = KvCache<B>;

impl<B: Backend> Default for KvCache<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Backend> KvCache<B> {
    /// An empty cache.
    pub fn new() -> Self {
        Self {
            keys: None,
            values: None,
        }
    }

    /// How many positions the cache holds.
    pub fn len(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.dims()[2])
    }

    /// Whether the cache holds no position.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every position.
    pub fn clear(&mut self) {
        *self = Self::new();
    }

    /// The batch size of the cached positions, if any.
    pub(crate) fn batch(&self) -> Option<usize> {
        self.keys.as_ref().map(|k| k.dims()[0])
    }

    /// Appends new keys and values and returns all of them.
    pub(crate) fn append(
        &mut self,
        keys: Tensor<B, 4>,
        values: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let keys = match self.keys.take() {
            Some(old) => Tensor::cat(vec![old, keys], 2),
            None => keys,
        };
        let values = match self.values.take() {
            Some(old) => Tensor::cat(vec![old, values], 2),
            None => values,
        };
        self.keys = Some(keys.clone());
        self.values = Some(values.clone());
        (keys, values)
    }
}
