use super::{Force, Integrator, PhaseSpace};
use burn::tensor::{Tensor, backend::Backend};

/// The [`PhaseSpace`] of Burn tensors: queries and keys of any rank-4 layout (the attention
/// layer uses `[batch, seq, heads, d_head]`).
///
/// `dt` is a tensor that broadcasts against them (`[1, 1, heads, 1]` for a step per head,
/// `[1, 1, 1, 1]` for one per layer), so that gradients reach a learned step size.
pub struct TensorPhaseSpace<'a, B: Backend> {
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    dt: Tensor<B, 4>,
    f: &'a dyn Fn(Tensor<B, 4>) -> Tensor<B, 4>,
    /// Whether `f` returns `dt·f(q)` (the step size folded into the force, see
    /// [`with_force_times_dt`](Self::with_force_times_dt)), so that a kick adds `c·F`.
    force_times_dt: bool,
    /// The force for the current `q`, until the next drift.
    memo: Option<Tensor<B, 4>>,
    evaluations: usize,
}

impl<'a, B: Backend> TensorPhaseSpace<'a, B> {
    /// A phase space at `(q, k)` with step `dt` and force `f`.
    pub fn new(
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        dt: Tensor<B, 4>,
        f: &'a dyn Fn(Tensor<B, 4>) -> Tensor<B, 4>,
    ) -> Self {
        Self {
            q,
            k,
            dt,
            f,
            force_times_dt: false,
            memo: None,
            evaluations: 0,
        }
    }

    /// A phase space whose force function `f_dt` returns `dt·f(q)` rather than `f(q)`: the same
    /// dynamics, but a kick adds `c·f_dt(q)`. The attention layer uses it to fold `dt` into the
    /// coupling net's output layer (a `[d_hidden, d_head]` product instead of one over every
    /// token), which also spares autodiff from keeping `f(q)` for `dt`'s gradient.
    ///
    /// `f_dt` must apply the same `dt` that is passed here (drifts use this one): nothing can
    /// check that.
    ///
    /// # Shapes
    /// - `q`, `k`: the same rank-4 shape, e.g. `[batch, seq, heads, d_head]`
    /// - `dt`: broadcastable to `q` (`[1, 1, heads, 1]` or `[1, 1, 1, 1]`)
    /// - `f_dt`: maps `q`'s shape to itself
    pub fn with_force_times_dt(
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        dt: Tensor<B, 4>,
        f_dt: &'a dyn Fn(Tensor<B, 4>) -> Tensor<B, 4>,
    ) -> Self {
        Self {
            force_times_dt: true,
            ..Self::new(q, k, dt, f_dt)
        }
    }

    /// Takes `steps` steps of `integrator` and returns the final state.
    pub fn advance(mut self, integrator: &dyn Integrator, steps: usize) -> Integration<B> {
        for _ in 0..steps {
            integrator.step(&mut self);
        }
        self.finish()
    }

    /// The current state and the number of force evaluations so far.
    pub fn finish(self) -> Integration<B> {
        Integration {
            q: self.q,
            k: self.k,
            evaluations: self.evaluations,
        }
    }

    fn scaled_dt(&self, c: f64) -> Tensor<B, 4> {
        if c == 1.0 {
            self.dt.clone()
        } else {
            self.dt.clone().mul_scalar(c)
        }
    }
}

impl<B: Backend> PhaseSpace for TensorPhaseSpace<'_, B> {
    fn force(&mut self) -> Force {
        let force = match &self.memo {
            Some(force) => force.clone(),
            None => {
                let force = (self.f)(self.q.clone());
                self.evaluations += 1;
                self.memo = Some(force.clone());
                force
            }
        };
        Force(Box::new(force))
    }

    fn kick(&mut self, c: f64, force: Force) {
        let force = force.0.downcast::<Tensor<B, 4>>().unwrap_or_else(|_| {
            panic!("PhaseSpace::kick: the force was evaluated by a phase space of another backend")
        });
        let step = match (self.force_times_dt, c == 1.0) {
            (true, true) => *force,
            (true, false) => force.mul_scalar(c),
            (false, _) => *force * self.scaled_dt(c),
        };
        self.k = self.k.clone() + step;
    }

    fn drift(&mut self, c: f64) {
        self.q = self.q.clone() + self.k.clone() * self.scaled_dt(c);
        self.memo = None;
    }
}

/// The result of [`integrate`].
#[derive(Debug, Clone)]
pub struct Integration<B: Backend> {
    /// The evolved queries.
    pub q: Tensor<B, 4>,
    /// The evolved keys.
    pub k: Tensor<B, 4>,
    /// How many times the force was evaluated.
    pub evaluations: usize,
}

/// Advances `(q, k)` by `steps` steps of `integrator`, each of size `dt`, under the force `f`.
///
/// # Shapes
/// - `q`, `k`: the same rank-4 shape, e.g. `[batch, seq, heads, d_head]`
/// - `dt`: broadcastable to `q` (`[1, 1, heads, 1]` or `[1, 1, 1, 1]`)
/// - `f`: maps `q`'s shape to itself
pub fn integrate<B: Backend>(
    integrator: &dyn Integrator,
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    dt: Tensor<B, 4>,
    f: &dyn Fn(Tensor<B, 4>) -> Tensor<B, 4>,
    steps: usize,
) -> Integration<B> {
    TensorPhaseSpace::new(q, k, dt, f).advance(integrator, steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::integrator::{Euler, Leapfrog};
    use burn::backend::Flex;
    use burn::tensor::{Distribution, Tolerance};

    type TestBackend = Flex;

    fn state() -> (
        Tensor<TestBackend, 4>,
        Tensor<TestBackend, 4>,
        Tensor<TestBackend, 4>,
    ) {
        let device = Default::default();
        let q = Tensor::random([2, 3, 4, 5], Distribution::Normal(0.0, 1.0), &device);
        let k = Tensor::random([2, 3, 4, 5], Distribution::Normal(0.0, 1.0), &device);
        let dt = Tensor::from_floats([[[[0.3]]]], &device);
        (q, k, dt)
    }

    #[test]
    fn leapfrog_evaluates_the_force_n_plus_one_times() {
        let (q, k, dt) = state();
        let f = |q: Tensor<TestBackend, 4>| q.tanh();
        for steps in 1..=4 {
            let out = integrate(&Leapfrog, q.clone(), k.clone(), dt.clone(), &f, steps);
            assert_eq!(out.evaluations, steps + 1, "leapfrog with {steps} steps");
            let out = integrate(&Euler, q.clone(), k.clone(), dt.clone(), &f, steps);
            assert_eq!(out.evaluations, steps, "euler with {steps} steps");
        }
    }

    #[test]
    fn zero_steps_is_the_identity() {
        let (q, k, dt) = state();
        let f = |q: Tensor<TestBackend, 4>| q.tanh();
        let out = integrate(&Leapfrog, q.clone(), k.clone(), dt, &f, 0);
        out.q.into_data().assert_eq(&q.into_data(), true);
        out.k.into_data().assert_eq(&k.into_data(), true);
    }

    #[test]
    fn memoised_leapfrog_equals_two_evaluations_per_step() {
        // The reuse of the end-of-step force must not change the result.
        let (q, k, dt) = state();
        let f = |q: Tensor<TestBackend, 4>| q.tanh().mul_scalar(-1.5);
        let fused = integrate(&Leapfrog, q.clone(), k.clone(), dt.clone(), &f, 3);
        let (mut q, mut k) = (q, k);
        for _ in 0..3 {
            let half = dt.clone().mul_scalar(0.5);
            k = k + f(q.clone()) * half.clone();
            q = q + k.clone() * dt.clone();
            k = k + f(q.clone()) * half;
        }
        fused
            .q
            .into_data()
            .assert_approx_eq::<f32>(&q.into_data(), Tolerance::default());
        fused
            .k
            .into_data()
            .assert_approx_eq::<f32>(&k.into_data(), Tolerance::default());
    }
}
