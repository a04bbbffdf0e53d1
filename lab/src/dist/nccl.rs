//! [`NcclGroup`]: the ranks of an MPI job summing CUDA gradients on the GPUs with NCCL (features
//! `mpi` and `cuda`).
//!
//! The gradient buffer stays on the device: NCCL sums it in place, where the MPI path copies it
//! to the host and back. NCCL's unique id goes from rank 0 to the others over MPI; everything
//! else (losses, flags, broadcasts) stays on MPI, which also bounds every wait (the watchdog of
//! [`MpiGroup`]).

use super::{Collective, CollectiveError, MpiGroup, ProcessGroup};
use burn::backend::Cuda;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use cubecl_cuda::CudaRuntime;
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::{result, sys};
use std::any::Any;
use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex};

/// What [`Cuda`] (Burn's CUDA backend with operation fusion) holds its buffers with.
type CudaKernels = CubeBackend<CudaRuntime, f32, i32, u8>;

/// Largest difference, relative to the largest entry, between the first NCCL sum and MPI's sum
/// of the same buffers: the two add in different orders, so they agree to rounding only.
const FIRST_SUM_TOLERANCE: f64 = 1e-5;

/// MPI's ranks, with NCCL for [`ProcessGroup::all_reduce_sum_on_device`] on CUDA tensors.
///
/// NCCL starts at the first gradient sum, on the device of the tensor summed (each rank's own
/// GPU). With [`Collective::Auto`], a job where some rank cannot load NCCL or trains on another
/// backend sums through the host with MPI instead, and rank 0 says so once;
/// with [`Collective::Nccl`] that is an error. The first sum is checked against MPI's sum of the
/// same buffers, and the job stops if they differ by more than rounding.
///
/// NCCL is loaded at run time by cudarc, which looks for `libnccl.so` (the link NCCL's development
/// package installs) or `libnccl.so.<CUDA major>`, not `libnccl.so.2`: where only the runtime
/// library is installed (Debian's `libnccl2`, pip's `nvidia-nccl-cu12`), make a link named
/// `libnccl.so` to it in a folder on `LD_LIBRARY_PATH`.
///
/// An error that one rank meets alone while the others wait in NCCL ends the whole job
/// ([`ProcessGroup::abort`]) after printing it, so that no rank waits for it.
pub struct NcclGroup {
    // Dropped before `mpi`: NCCL's communicator ends before MPI does.
    state: Mutex<State>,
    mpi: MpiGroup,
    choice: Collective,
}

enum State {
    /// No gradient sum yet.
    Unopened,
    /// Every rank opened NCCL.
    Open(Communicator),
    /// Some rank could not: MPI sums every gradient.
    Declined,
}

/// One rank's NCCL communicator and the CUDA stream its sums run on.
struct Communicator {
    comm: sys::ncclComm_t,
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The first sum was checked against MPI's.
    checked: bool,
}

// SAFETY: the communicator is a pointer NCCL owns; it is only used under the group's mutex, so
// one thread at a time, and NCCL's communicators may be used from any thread.
unsafe impl Send for Communicator {}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Nothing is in flight: every sum was waited for, and a failed one ended the process.
        let _ = self.context.bind_to_thread();
        // SAFETY: `comm` came from a successful `comm_init_rank`, is destroyed once (here, as the
        // communicator is dropped), and no operation on it is in flight.
        let _ = unsafe { result::comm_destroy(self.comm) };
    }
}

impl NcclGroup {
    /// MPI's ranks summing CUDA gradients as `choice` says ([`Collective::Mpi`] never uses NCCL).
    pub fn new(mpi: MpiGroup, choice: Collective) -> Self {
        Self {
            state: Mutex::new(State::Unopened),
            mpi,
            choice,
        }
    }

    /// Opens NCCL on every rank on CUDA device `index`, or on none (a collective decision).
    fn open(&self, index: Option<usize>) -> Result<State, CollectiveError> {
        let local = index
            .ok_or_else(|| "the gradients are not f32 CUDA tensors".to_string())
            .and_then(|index| self.prepare(index));
        let mut failed = [f64::from(u8::from(local.is_err()))];
        self.mpi.all_reduce_sum_f64(&mut failed)?;
        let (context, stream, id) = match local {
            Ok(prepared) if failed[0] == 0.0 => prepared,
            outcome => {
                let reason = match outcome {
                    Err(reason) => reason,
                    Ok(_) => format!("{} other rank(s) cannot use it", failed[0]),
                };
                if self.choice == Collective::Nccl {
                    return Err(CollectiveError::Device(format!(
                        "{}: {reason}",
                        self.mpi.describe()
                    )));
                }
                // Said where it may surprise: rank 0 trains on CUDA.
                if self.mpi.rank() == 0 && index.is_some() {
                    eprintln!(
                        "NCCL is not used ({reason}): the ranks sum gradients through the host \
                         with MPI"
                    );
                }
                return Ok(State::Declined);
            }
        };
        let mut bytes: Vec<u8> = id.internal.iter().map(|&b| b as u8).collect();
        self.mpi.broadcast_bytes(&mut bytes)?;
        let internal: [u8; 128] = bytes
            .try_into()
            .map_err(|_| CollectiveError::Device("rank 0's NCCL id did not arrive".into()))?;
        let id = sys::ncclUniqueId {
            internal: internal.map(|b| b as std::ffi::c_char),
        };
        let (rank, world) = (self.mpi.rank() as i32, self.mpi.world_size() as i32);
        if let Err(e) = context.bind_to_thread() {
            self.alone(format!("cannot use the CUDA context: {e:?}"));
        }
        let mut comm = MaybeUninit::uninit();
        self.mpi
            .watched("NCCL's start", || {
                // SAFETY: `comm` is a valid place for NCCL to write the communicator; `id` is
                // rank 0's id, sent to every rank, and `rank` is this rank's place in `world`.
                unsafe { result::comm_init_rank(comm.as_mut_ptr(), world, id, rank) }
            })
            .map_err(|e| CollectiveError::Device(format!("cannot start NCCL: {e:?}")))?;
        Ok(State::Open(Communicator {
            // SAFETY: `comm_init_rank` returned success, so it wrote the communicator.
            comm: unsafe { comm.assume_init() },
            context,
            stream,
            checked: false,
        }))
    }

    /// Ends the job for an error met by this rank alone, whose peers wait in a collective.
    fn alone(&self, error: String) -> ! {
        eprintln!("error: {}: NCCL: {error}", self.mpi.describe());
        self.mpi.abort(3)
    }

    /// This rank's CUDA context and stream on device `index`, and (on rank 0) a fresh NCCL id.
    fn prepare(
        &self,
        index: usize,
    ) -> Result<(Arc<CudaContext>, Arc<CudaStream>, sys::ncclUniqueId), String> {
        // SAFETY: only tries to load the library (dlopen); nothing of it is called.
        if !unsafe { sys::is_culib_present() } {
            return Err(format!(
                "{} finds no NCCL library: cudarc opens `libnccl.so` (NCCL's development package) \
                 or `libnccl.so.<CUDA major>`; with only `libnccl.so.2`, link `libnccl.so` to it \
                 in a folder on LD_LIBRARY_PATH",
                self.mpi.describe()
            ));
        }
        let context = CudaContext::new(index).map_err(|e| format!("CUDA device {index}: {e:?}"))?;
        let stream = context
            .new_stream()
            .map_err(|e| format!("a CUDA stream on device {index}: {e:?}"))?;
        let id = if self.mpi.rank() == 0 {
            result::get_uniqueid().map_err(|e| format!("NCCL's id: {e:?}"))?
        } else {
            sys::ncclUniqueId { internal: [0; 128] }
        };
        Ok((context, stream, id))
    }

    /// Sums `flat` over the ranks in its own buffer with NCCL.
    fn sum(&self, flat: &Tensor<Cuda, 1>, comm: &mut Communicator) -> Result<(), CollectiveError> {
        let count = flat.shape().num_elements();
        // The first sum is also made through the host, to check NCCL's against it.
        let expected = match comm.checked {
            true => None,
            false => {
                let mut values = host_values(flat).unwrap_or_else(|e| self.alone(e));
                self.mpi.all_reduce_sum_f32(&mut values)?;
                Some(values)
            }
        };
        // A second handle on the same buffer: reading it makes Burn run every operation queued
        // for the tensor, and gives the buffer of the CUDA kernels underneath the fusion.
        let primitive = flat.clone().into_primitive().tensor();
        let client = primitive.client.clone();
        let kernels = client.resolve_tensor_float::<CudaKernels>(primitive);
        let (address, resource) = match ready_buffer(&kernels, count, &comm.context) {
            Ok(ready) => ready,
            Err(error) => self.alone(error),
        };
        let pointer = address as *mut c_void;
        let summed = self.mpi.watched("the NCCL gradient all-reduce", || {
            // SAFETY: `pointer` is the device address of `count` f32s that `resource` keeps
            // allocated until after the wait below; the sum is in place (same send and receive
            // buffer, which NCCL allows), on this communicator's own stream, in its context.
            unsafe {
                result::all_reduce(
                    pointer,
                    pointer,
                    count,
                    sys::ncclDataType_t::ncclFloat32,
                    sys::ncclRedOp_t::ncclSum,
                    comm.comm,
                    comm.stream.cu_stream() as sys::cudaStream_t,
                )
            }
            .map_err(|e| format!("{e:?}"))?;
            comm.stream.synchronize().map_err(|e| format!("{e:?}"))
        });
        drop(resource);
        drop(kernels);
        if let Err(error) = summed {
            self.alone(format!("the gradient all-reduce: {error}"));
        }
        if let Some(expected) = expected {
            let summed = host_values(flat).unwrap_or_else(|e| self.alone(e));
            let scale = expected
                .iter()
                .fold(0f64, |m, &v| m.max(f64::from(v).abs()))
                .max(1e-30);
            let gap = summed
                .iter()
                .zip(&expected)
                .fold(0f64, |m, (&a, &b)| m.max(f64::from(a - b).abs()));
            // Checked only where every rank's sums are finite (`max` passes over NaN); the
            // decision is every rank's, so that all make the host sum at the same step.
            let finite = summed.iter().chain(&expected).all(|v| v.is_finite());
            let mut bad = [
                f64::from(u8::from(finite && gap > FIRST_SUM_TOLERANCE * scale)),
                f64::from(u8::from(!finite)),
            ];
            self.mpi.all_reduce_sum_f64(&mut bad)?;
            if bad[0] > 0.0 {
                return Err(CollectiveError::Device(format!(
                    "{}: the first NCCL sum differs from MPI's by {:.2e} of the largest entry on \
                     {} rank(s); sum through the host with MPI instead",
                    self.mpi.describe(),
                    gap / scale,
                    bad[0]
                )));
            }
            comm.checked = bad[1] == 0.0;
        }
        Ok(())
    }
}

/// The device address of `kernels`' buffer once every kernel writing it has run, with what keeps
/// the buffer allocated while it is used, and the CUDA context bound for NCCL.
fn ready_buffer(
    kernels: &CubeTensor<CudaRuntime>,
    count: usize,
    context: &CudaContext,
) -> Result<(u64, impl Sized), String> {
    if kernels.dtype != DType::F32 || !kernels.is_contiguous() {
        return Err("the gradient buffer is not contiguous f32".into());
    }
    <CudaKernels as Backend>::sync(&kernels.device).map_err(|e| format!("CUDA: {e:?}"))?;
    let resource = kernels
        .client
        .get_resource(kernels.handle.clone())
        .map_err(|e| format!("the gradient buffer: {e:?}"))?;
    if (resource.resource().size as usize) < count * size_of::<f32>() {
        return Err("the gradient buffer is smaller than the tensor".into());
    }
    context
        .bind_to_thread()
        .map_err(|e| format!("cannot use the CUDA context: {e:?}"))?;
    Ok((resource.resource().ptr, resource))
}

fn host_values(flat: &Tensor<Cuda, 1>) -> Result<Vec<f32>, String> {
    flat.clone()
        .into_data()
        .into_vec::<f32>()
        .map_err(|e| format!("reading the gradients: {e:?}"))
}

impl ProcessGroup for NcclGroup {
    fn rank(&self) -> usize {
        self.mpi.rank()
    }
    fn world_size(&self) -> usize {
        self.mpi.world_size()
    }
    fn local_rank(&self) -> usize {
        self.mpi.local_rank()
    }
    fn all_reduce_sum_f32(&self, values: &mut [f32]) -> Result<(), CollectiveError> {
        self.mpi.all_reduce_sum_f32(values)
    }
    fn all_reduce_sum_f64(&self, values: &mut [f64]) -> Result<(), CollectiveError> {
        self.mpi.all_reduce_sum_f64(values)
    }
    fn broadcast_bytes(&self, bytes: &mut Vec<u8>) -> Result<(), CollectiveError> {
        self.mpi.broadcast_bytes(bytes)
    }
    fn all_reduce_sum_on_device(&self, flat: &mut dyn Any) -> Result<bool, CollectiveError> {
        if self.choice == Collective::Mpi {
            return Ok(false);
        }
        let flat = flat
            .downcast_ref::<Tensor<Cuda, 1>>()
            .filter(|t| t.dtype() == DType::F32);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(*state, State::Unopened) {
            *state = self.open(flat.map(|t| t.device().index))?;
        }
        match (&mut *state, flat) {
            (State::Open(comm), Some(flat)) => self.sum(flat, comm).map(|()| true),
            (State::Open(_), None) => Err(CollectiveError::Device(
                "NCCL was opened for CUDA gradients and was given others".into(),
            )),
            _ => Ok(false),
        }
    }
    fn collective(&self) -> String {
        self.choice.to_string()
    }
    fn abort(&self, code: i32) -> ! {
        self.mpi.abort(code)
    }
    fn describe(&self) -> String {
        self.mpi.describe()
    }
}
