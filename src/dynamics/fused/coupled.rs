//! The coupled dynamics `dq/dt = k`, `dk/dt = f(q)` on host slices: an integrator's recorded
//! moves replayed over chunks of tokens, each chunk in cache from the first move to the last.
//! The backward pass replays the moves of a chunk again, keeping the states the reverse sweep
//! reads, then runs them in reverse.

use super::net::{self, Group, Layout, NetGrads, NetWeights, Scratch};
use super::program::{Move, Program};
use rayon::prelude::*;

/// Rows (tokens × heads) per chunk, rounded up to whole tokens: with a few steps, a chunk's
/// states and forces (`rows × d_head` floats each) stay in a core's L2 cache.
const CHUNK_ROWS: usize = 512;

/// The coupled dynamics of one layer on host slices.
pub(crate) struct Coupled<'a> {
    pub(crate) layout: Layout,
    pub(crate) net: NetWeights<'a>,
    /// `[1]` or `[heads]`.
    pub(crate) dt: &'a [f32],
    pub(crate) program: &'a Program,
}

/// The gradients of the inputs and parameters of [`Coupled`].
pub(crate) struct CoupledGrads {
    /// `[grad q, grad k]`.
    pub(crate) q_and_k: Vec<f32>,
    pub(crate) net: NetGrads,
    pub(crate) dt: Vec<f32>,
}

/// A chunk's replayed states: the query at each force, the force, and the key at each drift.
struct Tape {
    query_at_force: Vec<Vec<f32>>,
    forces: Vec<Vec<f32>>,
    key_at_drift: Vec<Vec<f32>>,
}

impl Coupled<'_> {
    fn tokens_per_chunk(&self) -> usize {
        CHUNK_ROWS.div_ceil(self.layout.heads).max(1)
    }

    /// `dt` of row `r` (a head's, or the layer's).
    fn dt(&self, row: usize) -> f32 {
        if self.dt.len() == 1 {
            self.dt[0]
        } else {
            self.dt[row % self.layout.heads]
        }
    }

    /// The evolved `[q', k']` of `[tokens, heads, d]` inputs, one after the other.
    pub(crate) fn forward(&self, q: &[f32], k: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(2 * q.len());
        out.extend_from_slice(q);
        out.extend_from_slice(k);
        let (q, k) = out.split_at_mut(q.len());
        let chunk = self.tokens_per_chunk() * self.layout.heads * self.layout.d;
        q.par_chunks_mut(chunk)
            .zip(k.par_chunks_mut(chunk))
            .for_each(|(q, k)| {
                self.replay(q, k, None);
            });
        out
    }

    /// Runs the moves over one chunk in place; with a tape, records what the backward pass
    /// reads.
    fn replay(&self, q: &mut [f32], k: &mut [f32], mut tape: Option<&mut Tape>) {
        let d = self.layout.d;
        let tokens = q.len() / (self.layout.heads * d);
        let groups = self.layout.groups(tokens);
        let mut scratch = Scratch::default();
        let mut forces = vec![Vec::new(); self.program.forces];
        for &step in &self.program.moves {
            match step {
                Move::Force(id) => {
                    let mut force = vec![0.0; q.len()];
                    for group in &groups {
                        net::forward(&self.net, &self.layout, group, q, &mut force, &mut scratch);
                    }
                    if let Some(tape) = tape.as_deref_mut() {
                        tape.query_at_force[id] = q.to_vec();
                        tape.forces[id] = force.clone();
                    }
                    forces[id] = force;
                }
                Move::Kick(c, id) => {
                    let force = &forces[id];
                    for (r, (k, f)) in k.chunks_exact_mut(d).zip(force.chunks_exact(d)).enumerate()
                    {
                        let step = c as f32 * self.dt(r);
                        k.iter_mut().zip(f).for_each(|(k, f)| *k += step * f);
                    }
                }
                Move::Drift(c) => {
                    if let Some(tape) = tape.as_deref_mut() {
                        tape.key_at_drift.push(k.to_vec());
                    }
                    for (r, (q, k)) in q.chunks_exact_mut(d).zip(k.chunks_exact(d)).enumerate() {
                        let step = c as f32 * self.dt(r);
                        q.iter_mut().zip(k).for_each(|(q, k)| *q += step * k);
                    }
                }
            }
        }
    }

    /// The gradients of the inputs and parameters, given `[grad q', grad k']`, which become
    /// `[grad q, grad k]` in place.
    pub(crate) fn backward(&self, q: &[f32], k: &[f32], mut grad: Vec<f32>) -> CoupledGrads {
        let (heads, d) = (self.layout.heads, self.layout.d);
        let chunk = self.tokens_per_chunk() * heads * d;
        let (gq, gk) = grad.split_at_mut(q.len());
        let (net, dt) = gq
            .par_chunks_mut(chunk)
            .zip(gk.par_chunks_mut(chunk))
            .zip(q.par_chunks(chunk).zip(k.par_chunks(chunk)))
            .map(|((gq, gk), (q, k))| self.backward_chunk(q, k, gq, gk))
            .collect::<Vec<_>>()
            // Summed in chunk order, not in rayon's reduction tree (which depends on the thread
            // count and on work stealing): the parameters' gradients are the same bits at any
            // thread count, as resume's exactness needs.
            .into_iter()
            .fold(
                (NetGrads::zeros(&self.layout), vec![0.0f64; self.dt.len()]),
                |(mut net, mut dt), (other_net, other_dt)| {
                    net.add(&other_net);
                    dt.iter_mut().zip(other_dt).for_each(|(a, b)| *a += b);
                    (net, dt)
                },
            );
        CoupledGrads {
            q_and_k: grad,
            net,
            dt: dt.into_iter().map(|g| g as f32).collect(),
        }
    }

    /// One chunk's backward pass: `gq`, `gk` hold the gradients of the outputs on entry and
    /// those of the inputs on return; returns the chunk's parameter gradients.
    fn backward_chunk(
        &self,
        q: &[f32],
        k: &[f32],
        gq: &mut [f32],
        gk: &mut [f32],
    ) -> (NetGrads, Vec<f64>) {
        let d = self.layout.d;
        let tokens = q.len() / (self.layout.heads * d);
        let groups: Vec<Group> = self.layout.groups(tokens);
        let mut tape = Tape {
            query_at_force: vec![Vec::new(); self.program.forces],
            forces: vec![Vec::new(); self.program.forces],
            key_at_drift: Vec::new(),
        };
        self.replay(&mut q.to_vec(), &mut k.to_vec(), Some(&mut tape));
        let mut net_grads = NetGrads::zeros(&self.layout);
        let mut dt_grads = vec![0.0f64; self.dt.len()];
        let n_dt = self.dt.len();
        let mut grad_forces = vec![vec![0.0f32; q.len()]; self.program.forces];
        let mut scratch = Scratch::default();
        for &step in self.program.moves.iter().rev() {
            match step {
                Move::Drift(c) => {
                    // q ← q + c·dt·k
                    let key = tape.key_at_drift.pop().expect("one key per drift");
                    for (r, ((gq, gk), k)) in gq
                        .chunks_exact(d)
                        .zip(gk.chunks_exact_mut(d))
                        .zip(key.chunks_exact(d))
                        .enumerate()
                    {
                        let c = c as f32;
                        let step = c * self.dt(r);
                        gk.iter_mut().zip(gq).for_each(|(gk, gq)| *gk += step * gq);
                        let dot: f32 = gq.iter().zip(k).map(|(g, k)| g * k).sum();
                        dt_grads[r % n_dt] += (c * dot) as f64;
                    }
                }
                Move::Kick(c, id) => {
                    // k ← k + c·dt·F
                    let force = &tape.forces[id];
                    let grad_force = &mut grad_forces[id];
                    for (r, ((gk, gf), f)) in gk
                        .chunks_exact(d)
                        .zip(grad_force.chunks_exact_mut(d))
                        .zip(force.chunks_exact(d))
                        .enumerate()
                    {
                        let c = c as f32;
                        let step = c * self.dt(r);
                        gf.iter_mut().zip(gk).for_each(|(gf, gk)| *gf += step * gk);
                        let dot: f32 = gk.iter().zip(f).map(|(g, f)| g * f).sum();
                        dt_grads[r % n_dt] += (c * dot) as f64;
                    }
                }
                Move::Force(id) => {
                    let query = &tape.query_at_force[id];
                    for group in &groups {
                        net::backward(
                            &self.net,
                            &self.layout,
                            group,
                            query,
                            &grad_forces[id],
                            gq,
                            &mut net_grads,
                            &mut scratch,
                        );
                    }
                }
            }
        }
        (net_grads, dt_grads)
    }
}
