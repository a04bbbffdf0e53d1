//! Data-parallel training across processes: a [`ProcessGroup`] of ranks that sum their gradients
//! once per optimiser step.
//!
//! Each rank is one process (on one machine or many), with its own devices (`--devices N` inside
//! a rank works as in one process). Every rank computes the gradient of its share of every
//! micro-batch; once per optimiser step, after gradient accumulation and before clipping,
//! [`all_reduce_gradients`] flattens the gradients in the model's visiting order (parameter ids
//! are random per process, so they are never used to match tensors across ranks), sums them over
//! the ranks with one all-reduce and divides by the number of ranks. Clipping and the AdamW step
//! then run identically on every rank. The trainer ([`crate::lm::Trainer`]) does the rest: rank
//! 0's initial (or resumed) state is broadcast to the others, only rank 0 evaluates and writes
//! the run folder, and a non-finite loss on any rank stops all of them together.
//!
//! Implementations: [`SingleProcess`] (one rank: every operation is the identity); with the
//! lab's cargo feature `mpi`, `MpiGroup` over the MPI library the job was launched with
//! (`mpiexec`, `srun`), which sums gradients on the host; with `mpi` and `cuda`, `NcclGroup`, the
//! same ranks summing CUDA gradients on the GPUs with NCCL. [`from_environment`] picks the right
//! one for a program, as [`Collective`] says.

mod gradients;
#[cfg(feature = "mpi")]
mod mpi_group;
#[cfg(all(feature = "mpi", feature = "cuda"))]
mod nccl;

pub use gradients::{all_reduce_gradients, weights_digest};
#[cfg(feature = "mpi")]
pub use mpi_group::MpiGroup;
#[cfg(all(feature = "mpi", feature = "cuda"))]
pub use nccl::NcclGroup;

use std::any::Any;
use std::time::Duration;

/// Which collective sums the gradients of ranks that train on GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Collective {
    /// NCCL where the gradients are CUDA tensors and every rank can load NCCL, MPI (through the
    /// host) otherwise.
    #[default]
    Auto,
    /// NCCL, or an error where it cannot be used.
    Nccl,
    /// MPI through the host, always.
    Mpi,
}

/// A collective name that is not one of [`Collective`]'s.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown collective `{0}`: auto, nccl or mpi")]
pub struct UnknownCollective(pub String);

impl std::str::FromStr for Collective {
    type Err = UnknownCollective;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "nccl" => Ok(Self::Nccl),
            "mpi" => Ok(Self::Mpi),
            other => Err(UnknownCollective(other.to_string())),
        }
    }
}

impl std::fmt::Display for Collective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Nccl => "nccl",
            Self::Mpi => "mpi",
        })
    }
}

/// A collective operation that did not complete.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    /// The group cannot be created.
    #[error("cannot start the process group: {0}")]
    Start(String),
    /// The collective on the GPUs (NCCL) cannot be used or failed.
    #[error("NCCL: {0}")]
    Device(String),
}

/// The ranks of a data-parallel job and the three collectives its training needs.
///
/// Every rank must call the same operations in the same order with buffers of the same length;
/// a rank that stops calling makes the others wait (an implementation bounds the wait, see
/// `MpiGroup`).
pub trait ProcessGroup {
    /// This process's rank, `0..world_size()`; rank 0 is the one that writes.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn world_size(&self) -> usize;
    /// This process's index among the ranks on its machine: the GPU it should use when each
    /// rank drives one.
    fn local_rank(&self) -> usize;
    /// Replaces `values` by their elementwise sum over the ranks (every rank receives the same
    /// sum).
    ///
    /// # Errors
    /// The operation does not complete.
    fn all_reduce_sum_f32(&self, values: &mut [f32]) -> Result<(), CollectiveError>;
    /// [`all_reduce_sum_f32`](Self::all_reduce_sum_f32) in `f64` (losses, flags, counts).
    ///
    /// # Errors
    /// The operation does not complete.
    fn all_reduce_sum_f64(&self, values: &mut [f64]) -> Result<(), CollectiveError>;
    /// Replaces `bytes` on every rank by rank 0's (of any length).
    ///
    /// # Errors
    /// The operation does not complete.
    fn broadcast_bytes(&self, bytes: &mut Vec<u8>) -> Result<(), CollectiveError>;
    /// Sums `flat` over the ranks on its device, where this group has a collective for its
    /// backend (NCCL for CUDA: `NcclGroup`), and returns `true`; `false` (every other group and
    /// backend) leaves it to the caller to sum through the host with
    /// [`all_reduce_sum_f32`](Self::all_reduce_sum_f32). Every rank must make the same call.
    ///
    /// `flat` is a `Tensor<B, 1>` of `f32` (any backend `B`, hence `Any`) that no other tensor
    /// shares a buffer with, such as a fresh concatenation: the sum is written into its buffer.
    ///
    /// # Errors
    /// The device collective was asked for and cannot be used, or did not complete.
    fn all_reduce_sum_on_device(&self, flat: &mut dyn Any) -> Result<bool, CollectiveError> {
        let _ = flat;
        Ok(false)
    }
    /// Ends this process with `code` and, in a job of several ranks, the whole job: for an error
    /// the other ranks may not share (they would otherwise wait in their next collective).
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
    /// How this rank sums gradients, as `--collective` chose it (`mpi`, `auto`, `nccl`; `host`
    /// for a group with no choice): ranks that differ would issue different collectives, which
    /// MPI does not define (a truncation abort or a hang), so the ranks compare it before they
    /// train.
    fn collective(&self) -> String {
        "host".into()
    }
    /// A name of this rank for messages, e.g. `rank 1 of 4 (node07)`.
    fn describe(&self) -> String {
        format!("rank {} of {}", self.rank(), self.world_size())
    }
}

/// One process alone: rank 0 of 1, every collective the identity.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleProcess;

impl ProcessGroup for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn local_rank(&self) -> usize {
        0
    }
    fn all_reduce_sum_f32(&self, _values: &mut [f32]) -> Result<(), CollectiveError> {
        Ok(())
    }
    fn all_reduce_sum_f64(&self, _values: &mut [f64]) -> Result<(), CollectiveError> {
        Ok(())
    }
    fn broadcast_bytes(&self, _bytes: &mut Vec<u8>) -> Result<(), CollectiveError> {
        Ok(())
    }
}

thread_local! {
    /// How many [`catch_expected_panic`] calls this thread is inside.
    static EXPECTING_PANIC: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs `f`, catching a panic it is known to raise on bad input (Burn's record loading, a GPU
/// backend's start-up probe) as `std::panic::catch_unwind` does. Only such panics are caught
/// without ending a job of several ranks: every other panic aborts the whole job (see
/// `MpiGroup::new`).
pub fn catch_expected_panic<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    EXPECTING_PANIC.with(|n| n.set(n.get() + 1));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    EXPECTING_PANIC.with(|n| n.set(n.get() - 1));
    result
}

/// Whether this thread is inside [`catch_expected_panic`].
pub fn panic_is_expected() -> bool {
    EXPECTING_PANIC.with(|n| n.get() > 0)
}

/// How long a rank waits in one collective before it decides that another rank has died or hangs
/// and stops the job (see `MpiGroup::new`): long enough for rank 0's evaluation and checkpoint,
/// which the others wait for.
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The process group a program runs in: with the `mpi` feature, MPI's world (one rank when the
/// program was not started by an MPI launcher), summing CUDA gradients as `collective` says
/// (NCCL needs the `cuda` feature as well); without it, [`SingleProcess`].
///
/// # Errors
/// MPI cannot be initialised, or `collective` is [`Collective::Nccl`] in a build without NCCL.
pub fn from_environment(
    timeout: Duration,
    collective: Collective,
) -> Result<Box<dyn ProcessGroup>, CollectiveError> {
    #[cfg(all(feature = "mpi", feature = "cuda"))]
    {
        let group = MpiGroup::new(timeout)?;
        if collective == Collective::Mpi || group.world_size() == 1 {
            return Ok(Box::new(group));
        }
        Ok(Box::new(NcclGroup::new(group, collective)))
    }
    #[cfg(not(all(feature = "mpi", feature = "cuda")))]
    {
        if collective == Collective::Nccl {
            return Err(CollectiveError::Device(
                "this build has no NCCL: it needs the harness's features `mpi` and `cuda`".into(),
            ));
        }
        #[cfg(feature = "mpi")]
        {
            Ok(Box::new(MpiGroup::new(timeout)?))
        }
        #[cfg(not(feature = "mpi"))]
        {
            let _ = timeout;
            Ok(Box::new(SingleProcess))
        }
    }
}
