//! [`AttentionInput`]: the sequence and masks both attention layers take, and the checks of
//! their shapes and configs that the layers share.

use super::kernel::AttentionKernel;
use super::mask::combine_masks;
use crate::error::ConfigError;
use burn::tensor::{Bool, Tensor, backend::Backend};

/// The input of an attention layer's `forward`: the sequence and optional masks, `true` meaning
/// "masked out" (Burn's convention).
#[derive(Debug, Clone)]
pub struct AttentionInput<B: Backend> {
    pub(crate) x: Tensor<B, 3>,
    pub(crate) mask_pad: Option<Tensor<B, 2, Bool>>,
    pub(crate) mask_attn: Option<Tensor<B, 3, Bool>>,
}

impl<B: Backend> AttentionInput<B> {
    /// A sequence `[batch, seq, d_model]`, no mask.
    pub fn new(x: Tensor<B, 3>) -> Self {
        Self {
            x,
            mask_pad: None,
            mask_attn: None,
        }
    }

    /// Masks padded keys: `[batch, seq]`, `true` at padding.
    pub fn mask_pad(mut self, mask_pad: Tensor<B, 2, Bool>) -> Self {
        self.mask_pad = Some(mask_pad);
        self
    }

    /// Masks query-key pairs: `[batch, seq, seq]`, `true` where query `i` must not see key `j`.
    pub fn mask_attn(mut self, mask_attn: Tensor<B, 3, Bool>) -> Self {
        self.mask_attn = Some(mask_attn);
        self
    }

    /// The sequence, checked to be `[batch, seq, d_model]`, and its masks combined into one
    /// shared by the heads (`[batch, 1, 1 or seq, seq]`, see [`combine_masks`]).
    ///
    /// # Panics
    /// If a shape is wrong; the message starts with `layer` and names the expected shape.
    pub(crate) fn unpack(
        self,
        layer: &str,
        d_model: usize,
    ) -> (Tensor<B, 3>, Option<Tensor<B, 4, Bool>>) {
        let [batch, seq, _] = check_input(layer, &self.x, d_model);
        let mask = combine_masks(layer, self.mask_pad, self.mask_attn, [batch, seq]);
        (self.x, mask)
    }
}

impl<B: Backend> From<Tensor<B, 3>> for AttentionInput<B> {
    fn from(x: Tensor<B, 3>) -> Self {
        Self::new(x)
    }
}

/// The dims of `x`, checked to be `[batch, seq, d_model]`.
///
/// # Panics
/// If they are not; the message starts with `layer`.
pub(crate) fn check_input<B: Backend>(layer: &str, x: &Tensor<B, 3>, d_model: usize) -> [usize; 3] {
    let dims = x.dims();
    assert_eq!(
        dims[2], d_model,
        "{layer}: expected input [batch, seq, d_model = {d_model}], got {dims:?}"
    );
    dims
}

/// Checks the fields every attention config has: `d_model` and `n_heads` at least 1, `d_model`
/// a multiple of `maps_per_head · n_heads` (`maps_per_head` query/key maps per head), and
/// `dropout` in `[0, 1)`.
pub(crate) fn validate_heads_and_dropout(
    config: &'static str,
    d_model: usize,
    n_heads: usize,
    maps_per_head: usize,
    dropout: f64,
) -> Result<(), ConfigError> {
    for (field, value) in [("d_model", d_model), ("n_heads", n_heads)] {
        if value == 0 {
            return Err(ConfigError::new(config, field, 0, "must be at least 1"));
        }
    }
    let maps = maps_per_head * n_heads;
    if !d_model.is_multiple_of(maps) {
        let rule = match maps_per_head {
            1 => format!("must be divisible by n_heads = {n_heads}"),
            m => format!("must be divisible by {m}·n_heads = {maps} ({m} query/key maps per head)"),
        };
        return Err(ConfigError::new(config, "d_model", d_model, rule));
    }
    if !(0.0..1.0).contains(&dropout) {
        return Err(ConfigError::new(
            config,
            "dropout",
            dropout,
            "must be in [0, 1)",
        ));
    }
    Ok(())
}

/// Refuses the flash kernel with attention dropout, which it does not apply.
pub(crate) fn validate_kernel(
    config: &'static str,
    kernel: AttentionKernel,
    dropout: f64,
) -> Result<(), ConfigError> {
    if kernel == AttentionKernel::Flash && dropout > 0.0 {
        return Err(ConfigError::new(
            config,
            "dropout",
            dropout,
            "must be 0 with kernel = flash, which applies no attention dropout (use the explicit \
             kernel for dropout)",
        ));
    }
    Ok(())
}
