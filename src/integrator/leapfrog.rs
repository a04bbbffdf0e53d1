use super::{Integrator, PhaseSpace};

/// Leapfrog (Störmer–Verlet, kick-drift-kick): the paper's "Hamiltonian" integrator.
///
/// ```text
/// k½ = k₀ + (dt/2)·f(q₀)
/// q₁ = q₀ + dt·k½
/// k₁ = k½ + (dt/2)·f(q₁)
/// ```
///
/// Second order. Every sub-step is a shear, so the map has Jacobian determinant 1
/// (volume-preserving) and `step(−dt)` undoes `step(dt)` (time-reversible) for **any** `f`; it is
/// symplectic when `f = −∇V`. Over `n` steps the force at the end of one step is the force at the
/// start of the next, and the [`PhaseSpace`] memoises it: `n + 1` evaluations, not `2n`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Leapfrog;

impl Integrator for Leapfrog {
    fn name(&self) -> &str {
        "leapfrog"
    }

    fn step(&self, space: &mut dyn PhaseSpace) {
        let force = space.force();
        space.kick(0.5, force);
        space.drift(1.0);
        let force = space.force();
        space.kick(0.5, force);
    }
}
