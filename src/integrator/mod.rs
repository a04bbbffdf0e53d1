//! Integrators of the coupled query-key dynamics.
//!
//! The dynamics of *Coupled Query-Key Dynamics for Attention* (Gahtan & Bronstein, 2026) treat
//! each token's query as a position and its key as a momentum:
//!
//! ```text
//! dq/dt = k,    dk/dt = f(q)
//! ```
//!
//! with `f` the [`CouplingNet`](crate::CouplingNet). An [`Integrator`] advances that system by
//! one step of size `dt`, written in terms of two backend-independent moves on a [`PhaseSpace`]:
//! a *drift* (`q ← q + c·dt·k`) and a *kick* (`k ← k + c·dt·f(q_F)`, with `F` a force taken by
//! [`PhaseSpace::force`] at the query `q_F`). Because the trait never sees a tensor, one implementation serves every
//! Burn backend, and a new integrator is one file implementing [`Integrator::step`]: the attention
//! code does not change (see [`CoupledQkAttention::with_integrator`](crate::CoupledQkAttention::with_integrator)).
//!
//! Built in: [`Euler`] (forward Euler, first order) and [`Leapfrog`] (kick-drift-kick, second
//! order, volume-preserving and time-reversible for any `f`). `n` steps repeat `step`; forces are
//! memoised while `q` does not move, so `n` leapfrog steps cost `n + 1` force evaluations.

mod euler;
mod leapfrog;
mod phase;
mod registry;

pub use euler::Euler;
pub use leapfrog::Leapfrog;
pub use phase::{Integration, TensorPhaseSpace, integrate};
pub use registry::{IntegratorBuilder, IntegratorKind, RegisterError, register_integrator};

use std::any::Any;
use std::fmt::Debug;

/// A force `F = f(q)` evaluated by a [`PhaseSpace`], to be applied by [`PhaseSpace::kick`].
///
/// Opaque: it holds the backend's tensor, so an integrator can keep a force across moves (forward
/// Euler applies the force of the *old* query after the query has drifted).
pub struct Force(pub(crate) Box<dyn Any + Send>);

impl Debug for Force {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Force(..)")
    }
}

/// The state `(q, k)` an [`Integrator`] moves, with its step size `dt` and force `f`.
///
/// Implemented by [`TensorPhaseSpace`] for every backend; object-safe so that integrators need
/// not be generic over the backend.
pub trait PhaseSpace {
    /// The force `f(q)` at the current query, opaque to the integrator (a phase space may hold it
    /// with `dt` already applied). Memoised: a second call before the next
    /// [`drift`](PhaseSpace::drift) returns the same force without evaluating `f` again.
    fn force(&mut self) -> Force;

    /// `k ← k + c·dt·f(q_F)`, where `force` was taken at the query `q_F`.
    ///
    /// # Panics
    /// If `force` came from a phase space of another backend.
    fn kick(&mut self, c: f64, force: Force);

    /// `q ← q + c·dt·k`.
    fn drift(&mut self, c: f64);
}

/// One step of an integrator of `dq/dt = k, dk/dt = f(q)`.
///
/// Implement [`step`](Integrator::step) with the moves of [`PhaseSpace`]; the phase space applies
/// `dt`, so a step with `-dt` is the same code.
///
/// ```
/// use coupled_qk::integrator::{Integrator, PhaseSpace};
///
/// /// Symplectic (semi-implicit) Euler: kick with the old query, then drift with the new key.
/// #[derive(Debug)]
/// struct SymplecticEuler;
///
/// impl Integrator for SymplecticEuler {
///     fn name(&self) -> &str {
///         "symplectic-euler"
///     }
///     fn step(&self, space: &mut dyn PhaseSpace) {
///         let force = space.force();
///         space.kick(1.0, force);
///         space.drift(1.0);
///     }
/// }
/// ```
pub trait Integrator: Debug + Send + Sync {
    /// A short name, used in displays and reports.
    fn name(&self) -> &str;

    /// Advances `space` by one step of its `dt`.
    fn step(&self, space: &mut dyn PhaseSpace);
}
