//! [`MpiGroup`]: the ranks of an MPI job (`mpiexec`, `srun`), over the MPI library the lab was
//! built against (feature `mpi`).

use super::{CollectiveError, ProcessGroup};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Elements per MPI call: counts are C `int`s, so larger buffers go in pieces.
const CHUNK: usize = 1 << 28;

/// MPI's world communicator as a [`ProcessGroup`].
///
/// A watchdog thread bounds every collective: a rank that waits in one longer than the timeout
/// given to [`new`](Self::new) prints which operation and how long, then aborts the whole job
/// (`MPI_Abort`), so that a rank that died or hangs never leaves the others waiting forever.
/// (Launchers also stop the job when a rank exits with an error: MPICH's `mpiexec` and Slurm's
/// `srun` kill the remaining ranks.)
pub struct MpiGroup {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    local_rank: usize,
    host: String,
    watch: Arc<Watch>,
    // Dropped last: finalises MPI.
    _universe: Universe,
}

/// The collective in progress, for the watchdog.
struct Watch {
    busy: Mutex<Option<(&'static str, Instant)>>,
    stop: AtomicBool,
}

impl MpiGroup {
    /// Initialises MPI (with `MPI_THREAD_MULTIPLE` where the library has it: the watchdog
    /// aborts from its own thread) and starts the watchdog. Run without a launcher, the program
    /// is rank 0 of 1.
    ///
    /// # Errors
    /// MPI was initialised already in this process.
    pub fn new(timeout: Duration) -> Result<Self, CollectiveError> {
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or_else(|| {
                CollectiveError::Start("MPI is initialised already in this process".into())
            })?;
        let world = universe.world();
        let rank = world.rank() as usize;
        let size = world.size() as usize;
        let local_rank = world.split_shared(world.rank()).rank() as usize;
        let host = mpi::environment::processor_name().unwrap_or_else(|_| "?".into());
        let watch = Arc::new(Watch {
            busy: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let name = format!("rank {rank} of {size} ({host})");
        let can_abort = threading == mpi::Threading::Multiple;
        if size > 1 {
            abort_job_on_panic(name.clone(), Arc::clone(&watch));
        }
        let watched = Arc::clone(&watch);
        std::thread::Builder::new()
            .name("collective-watchdog".into())
            .spawn(move || watchdog(&watched, timeout, &name, can_abort))
            .map_err(|e| CollectiveError::Start(format!("cannot start the watchdog: {e}")))?;
        Ok(Self {
            world,
            rank,
            size,
            local_rank,
            host,
            watch,
            _universe: universe,
        })
    }

    /// Sums `values` over the ranks in place, in pieces of [`CHUNK`], under the watchdog.
    fn all_reduce_sum<T: Equivalence + Clone>(&self, name: &'static str, values: &mut [T]) {
        self.watched(name, || {
            for chunk in values.chunks_mut(CHUNK) {
                let send = chunk.to_vec();
                self.world
                    .all_reduce_into(&send[..], chunk, SystemOperation::sum());
            }
        });
    }

    /// Runs `operation` (named `name`) under the watchdog.
    pub(super) fn watched<T>(&self, name: &'static str, operation: impl FnOnce() -> T) -> T {
        *self.watch.busy.lock().unwrap() = Some((name, Instant::now()));
        let result = operation();
        *self.watch.busy.lock().unwrap() = None;
        result
    }
}

/// Makes a panic on this rank (an assertion, a device out of memory) end the whole job at once,
/// after the panic's own message: unwinding would otherwise finalise MPI, a collective that waits
/// for ranks still training, and those would wait in their next collective until the watchdog's
/// timeout. Panics caught on purpose ([`super::catch_expected_panic`]) are left alone, and so is
/// every panic once the group is dropped (MPI is finalised then).
fn abort_job_on_panic(name: String, watch: Arc<Watch>) {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        if super::panic_is_expected() || watch.stop.load(Ordering::Relaxed) {
            return;
        }
        eprintln!(
            "error: {name} panicked: aborting the job (the run folder keeps its last checkpoint \
             to resume from)"
        );
        abort_world_after_output(4);
    }));
}

/// Aborts every rank with `code`. The launcher forwards each rank's output asynchronously, and an
/// abort can cut off what it has not forwarded yet: the message just printed is given a moment to
/// leave first.
fn abort_world_after_output(code: i32) -> ! {
    std::thread::sleep(Duration::from_millis(500));
    SimpleCommunicator::world().abort(code)
}

fn watchdog(watch: &Watch, timeout: Duration, name: &str, can_abort: bool) {
    let tick = (timeout / 10).clamp(Duration::from_millis(100), Duration::from_secs(5));
    while !watch.stop.load(Ordering::Relaxed) {
        std::thread::sleep(tick);
        let busy = *watch.busy.lock().unwrap();
        if let Some((operation, since)) = busy
            && since.elapsed() > timeout
        {
            eprintln!(
                "error: {name}: no answer from the other ranks for {:.0} s in {operation}: a \
                 rank has died or hangs; aborting the job (the run folder keeps its last \
                 checkpoint to resume from)",
                since.elapsed().as_secs_f64()
            );
            if can_abort {
                abort_world_after_output(3);
            }
            std::process::exit(3);
        }
    }
}

impl Drop for MpiGroup {
    fn drop(&mut self) {
        self.watch.stop.store(true, Ordering::Relaxed);
    }
}

impl ProcessGroup for MpiGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.size
    }
    fn local_rank(&self) -> usize {
        self.local_rank
    }
    fn all_reduce_sum_f32(&self, values: &mut [f32]) -> Result<(), CollectiveError> {
        self.all_reduce_sum("the gradient all-reduce", values);
        Ok(())
    }
    fn all_reduce_sum_f64(&self, values: &mut [f64]) -> Result<(), CollectiveError> {
        self.all_reduce_sum("an all-reduce of losses and flags", values);
        Ok(())
    }
    fn broadcast_bytes(&self, bytes: &mut Vec<u8>) -> Result<(), CollectiveError> {
        self.watched("a broadcast from rank 0", || {
            let root = self.world.process_at_rank(0);
            let mut len = bytes.len() as u64;
            root.broadcast_into(&mut len);
            bytes.resize(len as usize, 0);
            for chunk in bytes.chunks_mut(CHUNK) {
                root.broadcast_into(chunk);
            }
        });
        Ok(())
    }
    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
    fn collective(&self) -> String {
        "mpi".into()
    }
    fn describe(&self) -> String {
        format!("rank {} of {} ({})", self.rank, self.size, self.host)
    }
}
