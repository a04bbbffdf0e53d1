//! [`LossKind`]: how the token loss is computed from the model's final hidden states.

use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// How the token loss is computed: the same function either way, with different memory, time and
/// float rounding (a resume may switch, as it may switch backends).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossKind {
    /// The LM head and the cross-entropy as one op over row chunks
    /// ([`fused_linear_cross_entropy`](coupled_qk::model::fused_linear_cross_entropy)): never
    /// holds the `[tokens, vocab]` logits; the backward pass recomputes them chunk by chunk.
    /// Evaluation uses the chunked forward
    /// ([`linear_cross_entropy`](coupled_qk::model::linear_cross_entropy)).
    #[default]
    Fused,
    /// `log_softmax` of the full `[tokens, vocab]` logits, gathered at the targets (what every
    /// run computed before the fused loss existed).
    Explicit,
}

/// A name that is no [`LossKind`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown loss `{0}`: expected fused or explicit")]
pub struct UnknownLoss(pub String);

impl FromStr for LossKind {
    type Err = UnknownLoss;
    fn from_str(s: &str) -> Result<Self, UnknownLoss> {
        match s {
            "fused" => Ok(Self::Fused),
            "explicit" => Ok(Self::Explicit),
            other => Err(UnknownLoss(other.to_string())),
        }
    }
}

impl std::fmt::Display for LossKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Fused => "fused",
            Self::Explicit => "explicit",
        })
    }
}
