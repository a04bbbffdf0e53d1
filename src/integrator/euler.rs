use super::{Integrator, PhaseSpace};

/// Forward Euler: both updates from the old state.
///
/// ```text
/// q₁ = q₀ + dt·k₀
/// k₁ = k₀ + dt·f(q₀)
/// ```
///
/// First order. Its Jacobian has determinant `det(I − dt²·J_f(q₀))`, not 1 in general: it does
/// not preserve phase-space volume, and `step(−dt)` does not undo `step(dt)`. One force evaluation
/// per step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Euler;

impl Integrator for Euler {
    fn name(&self) -> &str {
        "euler"
    }

    fn step(&self, space: &mut dyn PhaseSpace) {
        // The force of the old query, taken before q moves.
        let force = space.force();
        space.drift(1.0);
        space.kick(1.0, force);
    }
}
