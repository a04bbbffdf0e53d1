//! Which scorer turns queries and keys into context when gradients are tracked, and how a layer
//! generic over `Backend` reaches the flash op of its autodiff backend.
//!
//! Without autodiff both kernels call Burn's `attention` op (fused where the backend has a
//! kernel); the choice matters in training only, where Burn's op has no backward pass of its own.

use burn::tensor::{Bool, Tensor, backend::Backend};
use serde::{Deserialize, Serialize};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{OnceLock, RwLock};

/// How an attention layer scores under autodiff (training).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionKernel {
    /// Scores, softmax and weights as tensors of the graph: the backward pass keeps
    /// `[batch, heads, s_q, s_k]` weights per layer. Supports attention dropout. Default.
    #[default]
    Explicit,
    /// [`flash_attention`](super::flash_attention): one autodiff op that recomputes the weights
    /// blockwise in the backward pass, so memory grows with `s` instead of `s²`; no attention
    /// dropout. Needs an autodiff backend with the op: every `Autodiff<B, C>` of the backends this
    /// crate's features name, and others after
    /// [`register_flash_attention`](super::register_flash_attention).
    Flash,
}

impl AttentionKernel {
    /// Every kernel, in the order of the docs.
    pub const ALL: [AttentionKernel; 2] = [AttentionKernel::Explicit, AttentionKernel::Flash];

    /// The kernel's name, as parsed.
    pub fn name(self) -> &'static str {
        match self {
            AttentionKernel::Explicit => "explicit",
            AttentionKernel::Flash => "flash",
        }
    }
}

impl fmt::Display for AttentionKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An attention kernel name that is not one of [`AttentionKernel::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown attention kernel `{0}`: expected explicit or flash")]
pub struct UnknownKernel(pub String);

impl FromStr for AttentionKernel {
    type Err = UnknownKernel;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownKernel(s.to_string()))
    }
}

/// The flash op of one backend, as a layer generic over `Backend` calls it.
pub(crate) type FlashFn<B> =
    fn(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>, Option<Tensor<B, 4, Bool>>, bool) -> Tensor<B, 4>;

/// `TypeId` of a backend → its `FlashFn`, boxed. A layer is generic over `Backend`, which says
/// nothing of autodiff; this table is how it finds the op of the backend it runs on.
type Registry = RwLock<HashMap<TypeId, Box<dyn Any + Send + Sync>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(builtin()))
}

/// Makes [`AttentionKernel::Flash`] usable on the autodiff backend `B`. The autodiff backends of
/// the backends this crate's features name are registered already (`Autodiff<Flex>`,
/// `Autodiff<NdArray>`, `Autodiff<Wgpu>`, `Autodiff<Cuda>`, each with and without
/// `BalancedCheckpointing`); call this once for any other, before its first forward pass.
#[cfg(feature = "autodiff")]
pub fn register_flash_attention<B: super::FlashAttention>() {
    let mut table = registry().write().unwrap_or_else(|e| e.into_inner());
    table.insert(TypeId::of::<B>(), Box::new(flash_fn::<B>()));
}

#[cfg(feature = "autodiff")]
fn flash_fn<B: super::FlashAttention>() -> FlashFn<B> {
    |q, k, v, mask, causal| super::flash_attention(q, k, v, mask, causal, None)
}

/// The flash op of `B`, if it has one.
pub(crate) fn flash_for<B: Backend>() -> Option<FlashFn<B>> {
    let table = registry().read().unwrap_or_else(|e| e.into_inner());
    table
        .get(&TypeId::of::<B>())
        .and_then(|f| f.downcast_ref::<FlashFn<B>>())
        .copied()
}

#[allow(unused_mut)]
fn builtin() -> HashMap<TypeId, Box<dyn Any + Send + Sync>> {
    let mut table: HashMap<TypeId, Box<dyn Any + Send + Sync>> = HashMap::new();
    #[cfg(feature = "autodiff")]
    {
        // Used by the backends the features name; with none of them the table starts empty.
        #[allow(unused_imports)]
        use burn::backend::Autodiff;
        #[allow(unused_imports)]
        use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
        #[allow(unused_macros)]
        macro_rules! register {
            ($backend:ty) => {
                table.insert(
                    TypeId::of::<Autodiff<$backend>>(),
                    Box::new(flash_fn::<Autodiff<$backend>>()),
                );
                table.insert(
                    TypeId::of::<Autodiff<$backend, BalancedCheckpointing>>(),
                    Box::new(flash_fn::<Autodiff<$backend, BalancedCheckpointing>>()),
                );
            };
        }
        #[cfg(feature = "flex")]
        register!(burn::backend::Flex);
        #[cfg(feature = "ndarray")]
        register!(burn::backend::NdArray);
        #[cfg(feature = "wgpu")]
        register!(burn::backend::Wgpu);
        #[cfg(feature = "cuda")]
        register!(burn::backend::Cuda);
    }
    table
}
