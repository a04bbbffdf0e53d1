//! # coupled-qk
//!
//! **Coupled query-key dynamics** as a Burn attention layer, after *Coupled Query-Key Dynamics
//! for Attention* (Gahtan & Bronstein, 2026, arXiv:2604.01683).
//!
//! Standard attention scores static projections `q = x·W_q`, `k = x·W_k`. Coupled QK lets each
//! token's query and key evolve jointly for a step or a few before scoring,
//!
//! ```text
//! q ← q + dt·k
//! k ← k + dt·f(q)
//! ```
//!
//! with `f` a small learned MLP (the [`CouplingNet`], shared by a layer's heads) and `dt` learned,
//! integrated by forward [`Euler`] or [`Leapfrog`].
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::{Distribution, Tensor};
//! use coupled_qk::{CoupledQkAttentionConfig, DynamicsConfig};
//!
//! let device = Default::default();
//! let attention = CoupledQkAttentionConfig::new(64, 4)
//!     .with_dynamics(DynamicsConfig::leapfrog(1))
//!     .with_causal(true)
//!     .init::<Flex>(&device);
//! let x = Tensor::<Flex, 3>::random([2, 10, 64], Distribution::Default, &device);
//! let y = attention.forward(x); // [2, 10, 64]
//! assert_eq!(y.dims(), [2, 10, 64]);
//! // The coupling net (16·16·2 + 16 + 16) and dt (1) are all it adds.
//! assert_eq!(attention.extra_num_params(), 16 * 16 * 2 + 16 + 16 + 1);
//! ```
//!
//! The layer is generic over Burn's backend. The crate's features `flex`, `ndarray`, `wgpu`,
//! `cuda` and `autodiff` only forward to Burn's; the layer itself needs none of them. With
//! `autodiff` the crate also has the fused linear cross-entropy
//! ([`model::fused_linear_cross_entropy`]), a custom op of Burn's autodiff backend.

pub mod attention;
pub mod coupling;
pub mod dynamics;
pub mod error;
#[cfg(feature = "autodiff")]
mod host_math;
#[cfg(feature = "autodiff")]
mod host_tensor;
pub mod integrator;
pub mod model;
#[cfg(feature = "autodiff")]
mod op_table;

pub mod step_size;

pub use attention::{
    AttentionInput, AttentionKernel, CoupledQkAttention, CoupledQkAttentionConfig, CoupledQkCache,
    DifferentialAttention, DifferentialAttentionConfig, DynamicsStats, KvCache, QkStates,
    RotaryConfig, RotaryPosition,
};
pub use coupling::{CouplingNet, CouplingNetConfig};
pub use dynamics::{AffineCoupling, CoupledDynamics, DynamicsConfig, Identity, QkDynamics};
pub use error::{ConfigError, NameError};
pub use integrator::{
    Euler, Integrator, IntegratorKind, Leapfrog, PhaseSpace, RegisterError, register_integrator,
};
pub use model::AttentionVariant;
pub use step_size::{StepSize, StepSizeConfig};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
