//! An integrator's steps as a list of moves, read once by running it on a phase space that
//! records instead of computing. The [`Integrator`] trait gives `step` no values to branch on,
//! so the moves of `n` steps are the same for every input: the fused kernels replay them forward
//! and in reverse.

use crate::integrator::{Force, Integrator, PhaseSpace};

/// One move of the phase space, with `dt` applied by the kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Move {
    /// `F[id] = f(q)` at the current query.
    Force(usize),
    /// `k ← k + c·dt·F[id]`.
    Kick(f64, usize),
    /// `q ← q + c·dt·k`.
    Drift(f64),
}

/// The moves of `steps` steps of an integrator, and how many forces they evaluate.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Program {
    pub(crate) moves: Vec<Move>,
    pub(crate) forces: usize,
}

/// The id of a recorded force, the [`Force`] a [`Recorder`] hands out.
struct ForceId(usize);

/// A [`PhaseSpace`] that writes down the moves, with the memo of `TensorPhaseSpace`: a force
/// asked for twice between drifts is evaluated once.
#[derive(Default)]
struct Recorder {
    moves: Vec<Move>,
    forces: usize,
    memo: Option<usize>,
}

impl PhaseSpace for Recorder {
    fn force(&mut self) -> Force {
        let id = match self.memo {
            Some(id) => id,
            None => {
                let id = self.forces;
                self.forces += 1;
                self.moves.push(Move::Force(id));
                self.memo = Some(id);
                id
            }
        };
        Force(Box::new(ForceId(id)))
    }

    fn kick(&mut self, c: f64, force: Force) {
        let id = force.0.downcast::<ForceId>().unwrap_or_else(|_| {
            panic!("PhaseSpace::kick: the force was evaluated by another phase space")
        });
        self.moves.push(Move::Kick(c, id.0));
    }

    fn drift(&mut self, c: f64) {
        self.moves.push(Move::Drift(c));
        self.memo = None;
    }
}

impl Program {
    /// The moves of `steps` steps of `integrator`.
    pub(crate) fn record(integrator: &dyn Integrator, steps: usize) -> Self {
        let mut recorder = Recorder::default();
        for _ in 0..steps {
            integrator.step(&mut recorder);
        }
        Program {
            moves: recorder.moves,
            forces: recorder.forces,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::integrator::{Euler, Leapfrog};

    #[test]
    fn euler_kicks_with_the_force_of_the_old_query() {
        let program = Program::record(&Euler, 2);
        use Move::*;
        assert_eq!(
            program.moves,
            [
                Force(0),
                Drift(1.0),
                Kick(1.0, 0),
                Force(1),
                Drift(1.0),
                Kick(1.0, 1)
            ]
        );
        assert_eq!(program.forces, 2);
    }

    #[test]
    fn leapfrog_reuses_the_end_of_step_force() {
        let program = Program::record(&Leapfrog, 2);
        use Move::*;
        assert_eq!(
            program.moves,
            [
                Force(0),
                Kick(0.5, 0),
                Drift(1.0),
                Force(1),
                Kick(0.5, 1),
                Kick(0.5, 1),
                Drift(1.0),
                Force(2),
                Kick(0.5, 2),
            ]
        );
        assert_eq!(program.forces, 3, "n + 1 evaluations");
    }
}
