use burn::tensor::{Tensor, backend::Backend};

/// The keys and values a [`CoupledQkAttention`](super::CoupledQkAttention) has seen, for
/// incremental decoding.
///
/// The keys are stored **evolved** (after the dynamics and, if configured, the rotary embedding):
/// the dynamics act on each token alone, so a token's evolved key never changes once computed, and
/// decoding with this cache equals the full forward pass.
#[derive(Debug, Clone)]
pub struct CoupledQkCache<B: Backend> {
    /// `[batch, heads, len, d_head]`
    pub(crate) keys: Option<Tensor<B, 4>>,
    /// `[batch, heads, len, d_head]`
    pub(crate) values: Option<Tensor<B, 4>>,
}

impl<B: Backend> Default for CoupledQkCache<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Backend> CoupledQkCache<B> {
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
