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
/// GPU). With [`Collective::Auto`], a job where some rank cannot load NCCL (`libnccl.so.2`) or
/// trains on another backend sums through the host with MPI instead, and rank 0 says so once;
/// with [`Collective::Nccl`] that is an error. The first sum is checked against MPI's sum of the
/// same buffers, and the job stops if they differ by more than rounding.
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
    checked: bool,
}

// The communicator is a pointer NCCL owns; it is used under the group's mutex only.
unsafe impl Send for Communicator {}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Every sum was waited for, so nothing is in flight.
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
            .ok_or_else(|| "the gradients are not CUDA tensors".to_string())
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
        context
            .bind_to_thread()
            .map_err(|e| CollectiveError::Device(format!("cannot use the CUDA context: {e:?}")))?;
        let mut comm = MaybeUninit::uninit();
        self.mpi
            .watched("NCCL's start", || unsafe {
                result::comm_init_rank(comm.as_mut_ptr(), world, id, rank)
            })
            .map_err(|e| CollectiveError::Device(format!("cannot start NCCL: {e:?}")))?;
        Ok(State::Open(Communicator {
            comm: unsafe { comm.assume_init() },
            context,
            stream,
            checked: false,
        }))
    }

    /// This rank's CUDA context and stream on device `index`, and (on rank 0) a fresh NCCL id.
    fn prepare(
        &self,
        index: usize,
    ) -> Result<(Arc<CudaContext>, Arc<CudaStream>, sys::ncclUniqueId), String> {
        if !unsafe { sys::is_culib_present() } {
            return Err(format!(
                "{} finds no NCCL library (libnccl.so.2: install NCCL or put it on \
                 LD_LIBRARY_PATH)",
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
        let device_error = |what: &str| CollectiveError::Device(what.to_string());
        let count = flat.shape().num_elements();
        // The first sum is also made through the host, to check NCCL's against it.
        let expected = match comm.checked {
            true => None,
            false => {
                let mut values = host_values(flat)?;
                self.mpi.all_reduce_sum_f32(&mut values)?;
                Some(values)
            }
        };
        // A second handle on the same buffer: reading it makes Burn run every operation queued
        // for the tensor, and gives the buffer of the CUDA kernels underneath the fusion.
        let primitive = flat.clone().into_primitive().tensor();
        let client = primitive.client.clone();
        let kernels = client.resolve_tensor_float::<CudaKernels>(primitive);
        if kernels.dtype != DType::F32 || !kernels.is_contiguous() {
            return Err(device_error("the gradient buffer is not contiguous f32"));
        }
        <CudaKernels as Backend>::sync(&kernels.device)
            .map_err(|e| CollectiveError::Device(format!("CUDA: {e:?}")))?;
        let resource = kernels
            .client
            .get_resource(kernels.handle.clone())
            .map_err(|e| CollectiveError::Device(format!("the gradient buffer: {e:?}")))?;
        let buffer = resource.resource();
        if (buffer.size as usize) < count * size_of::<f32>() {
            return Err(device_error(
                "the gradient buffer is smaller than the tensor",
            ));
        }
        comm.context
            .bind_to_thread()
            .map_err(|e| CollectiveError::Device(format!("cannot use the CUDA context: {e:?}")))?;
        let pointer = buffer.ptr as *mut c_void;
        self.mpi
            .watched("the NCCL gradient all-reduce", || {
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
            })
            .map_err(|e| CollectiveError::Device(format!("the gradient all-reduce: {e}")))?;
        drop(resource);
        drop(kernels);
        if let Some(expected) = expected {
            let summed = host_values(flat)?;
            let scale = expected
                .iter()
                .fold(0f64, |m, &v| m.max(f64::from(v).abs()))
                .max(1e-30);
            let gap = summed
                .iter()
                .zip(&expected)
                .fold(0f64, |m, (&a, &b)| m.max(f64::from(a - b).abs()));
            let mut bad = [f64::from(u8::from(gap > FIRST_SUM_TOLERANCE * scale))];
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
            comm.checked = true;
        }
        Ok(())
    }
}

fn host_values(flat: &Tensor<Cuda, 1>) -> Result<Vec<f32>, CollectiveError> {
    flat.clone()
        .into_data()
        .into_vec::<f32>()
        .map_err(|e| CollectiveError::Device(format!("reading the gradients: {e:?}")))
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
        let flat = flat.downcast_ref::<Tensor<Cuda, 1>>();
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
    fn abort(&self, code: i32) -> ! {
        self.mpi.abort(code)
    }
    fn describe(&self) -> String {
        self.mpi.describe()
    }
}
