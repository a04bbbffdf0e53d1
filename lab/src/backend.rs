//! Which backend an example trains on: `--backend flex|ndarray|wgpu|cuda|auto`. Flex is always
//! compiled in; the others exist only when the crate is built with their feature
//! (`--features ndarray`, `--features wgpu`, `--features cuda`).
//! [`dispatch_devices`] runs a task on one or several devices of one backend (`--devices N` of
//! the programs that train: data-parallel training over GPUs, or over workers sharing the CPU).

use coupled_qk::model::FusedOps;
use std::str::FromStr;

/// A backend choice from the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// The best compiled and working one: CUDA, then WGPU when its adapter is a GPU (not a CPU
    /// driver such as llvmpipe), then Flex.
    Auto,
    /// Flex, the fastest CPU backend (results/performance.md compares it with NdArray).
    Flex,
    /// NdArray, Burn's other CPU backend: needs `--features ndarray`.
    NdArray,
    /// WGPU (Vulkan, Metal, DX12): needs `--features wgpu`.
    Wgpu,
    /// CUDA: needs `--features cuda` and an NVIDIA GPU.
    Cuda,
}

impl FromStr for BackendChoice {
    type Err = BackendError;
    fn from_str(s: &str) -> Result<Self, BackendError> {
        match s {
            "auto" => Ok(Self::Auto),
            "flex" | "cpu" => Ok(Self::Flex),
            "ndarray" => Ok(Self::NdArray),
            "wgpu" => Ok(Self::Wgpu),
            "cuda" => Ok(Self::Cuda),
            other => Err(BackendError::Unknown(other.to_string())),
        }
    }
}

/// Why a backend cannot run ([`cli::advice`](crate::cli::advice) says which flag of the programs
/// changes it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// Not a backend name.
    #[error("unknown backend `{0}`: expected auto, flex, ndarray, wgpu or cuda")]
    Unknown(String),
    /// No device asked for.
    #[error("at least one device is needed")]
    NoDevices,
    /// The backend is not in this build.
    #[error("this build has no {backend} backend: rebuild with the cargo feature `{feature}`")]
    NotCompiled {
        /// The backend's name.
        backend: &'static str,
        /// The feature that compiles it.
        feature: &'static str,
    },
    /// CUDA did not start: no device answers, or its driver library cannot be loaded.
    #[error("CUDA did not start: {0}")]
    NoCuda(String),
    /// NVRTC, CUDA's run-time compiler, cannot compile a kernel (its library `libnvrtc` is not
    /// found, or does not match the driver): every kernel of Burn's CUDA backend is compiled
    /// with it.
    #[error("CUDA's run-time compiler NVRTC does not work: {0}")]
    NoNvrtc(String),
    /// WGPU has no adapter.
    #[error("{0}")]
    NoWgpuAdapter(String),
    /// One of several devices does not answer.
    #[error("{backend} device {index} of the {count} asked for does not answer ({hint})")]
    DeviceMissing {
        /// The backend's name.
        backend: &'static str,
        /// The device that does not answer.
        index: usize,
        /// How many were asked for.
        count: usize,
        /// What to check.
        hint: &'static str,
    },
}

/// Work generic over the backend (closures cannot be), on one or several devices of it.
pub trait MultiDeviceTask {
    /// What the work returns.
    type Output;
    /// Runs on backend `B` over `devices` (at least one; the first is the main device); `name`
    /// says which backend, `gpu` whether it is a GPU backend. Every backend it is given is
    /// Burn's `Autodiff` over one, so it has the fused loss and flash attention
    /// ([`FusedOps`]).
    fn run<B: FusedOps>(
        self,
        devices: Vec<B::Device>,
        name: &'static str,
        gpu: bool,
    ) -> Self::Output;
}

/// Runs `task` on `count` devices of the chosen backend, printing the choice. One device is the
/// backend's default one; several are CUDA devices `0..count` (`CudaDevice::new(i)`) or WGPU's
/// discrete GPUs `0..count` (`WgpuDevice::DiscreteGpu(i)`). On a CPU backend (Flex, NdArray)
/// they are its one device named `count` times: `count` workers sharing the cores, which is
/// faster than one because Flex runs its elementwise kernels on one thread.
///
/// # Errors
/// `count` 0; the chosen backend not compiled in; (CUDA, WGPU) a device that does not answer.
pub fn dispatch_devices<T: MultiDeviceTask>(
    choice: BackendChoice,
    count: usize,
    task: T,
) -> Result<T::Output, BackendError> {
    dispatch_devices_from(choice, 0, count, task)
}

/// [`dispatch_devices`] on the GPUs `first..first + count` (CUDA devices, or WGPU's discrete
/// GPUs): the devices of one of several ranks on a machine, rank `i` of the machine taking
/// `first = i · count`. CPU backends ignore `first`.
///
/// # Errors
/// Those of [`dispatch_devices`].
pub fn dispatch_devices_from<T: MultiDeviceTask>(
    choice: BackendChoice,
    first: usize,
    count: usize,
    task: T,
) -> Result<T::Output, BackendError> {
    if count == 0 {
        return Err(BackendError::NoDevices);
    }
    let chosen = match choice {
        BackendChoice::Auto => choose_automatically(),
        other => other,
    };
    match chosen {
        BackendChoice::Cuda => run_cuda(task, first, count),
        BackendChoice::Wgpu => run_wgpu(task, first, count),
        BackendChoice::NdArray => run_ndarray(task, count),
        _ => {
            eprintln!("backend: Flex (CPU, {})", cpu_workers(count));
            Ok(task.run::<burn::backend::Autodiff<burn::backend::Flex>>(
                vec![Default::default(); count],
                "flex",
                false,
            ))
        }
    }
}

/// `--backend auto`: CUDA if it starts, else WGPU if its adapter is a GPU, else Flex. Says what
/// it tried and, for each backend passed over, why.
fn choose_automatically() -> BackendChoice {
    match cuda_start() {
        Ok(()) => return BackendChoice::Cuda,
        Err(why) => eprintln!("backend auto: not CUDA: {why}"),
    }
    match wgpu_gpu_adapter() {
        Ok(()) => return BackendChoice::Wgpu,
        Err(why) => eprintln!("backend auto: not WGPU: {why}"),
    }
    eprintln!("backend auto: choosing Flex (the CPU)");
    BackendChoice::Flex
}

/// How a CPU backend's `count` devices run: the one CPU device, named `count` times, is `count`
/// data-parallel worker threads sharing the cores (see `lm::sharded_gradients`).
fn cpu_workers(count: usize) -> String {
    let threads = rayon::current_num_threads();
    match count {
        1 if threads > 1 => format!(
            "{threads} threads; several data-parallel workers are faster on a CPU (2 on 2 cores \
             measured: results/performance.md; their count must divide the batch size)"
        ),
        1 => format!("{threads} threads"),
        n => format!("{threads} threads; {n} data-parallel workers share them"),
    }
}

#[cfg(feature = "ndarray")]
fn run_ndarray<T: MultiDeviceTask>(task: T, count: usize) -> Result<T::Output, BackendError> {
    eprintln!("backend: NdArray (CPU, {})", cpu_workers(count));
    Ok(task.run::<burn::backend::Autodiff<burn::backend::NdArray>>(
        vec![Default::default(); count],
        "ndarray",
        false,
    ))
}

#[cfg(not(feature = "ndarray"))]
fn run_ndarray<T: MultiDeviceTask>(_task: T, _count: usize) -> Result<T::Output, BackendError> {
    Err(BackendError::NotCompiled {
        backend: "NdArray",
        feature: "ndarray",
    })
}

/// Whether CUDA starts: NVRTC compiles a kernel (checked first: without it no kernel of Burn's
/// CUDA backend runs, and cudarc's panic would come from deep inside the first op), then a first
/// op runs on the default device (without a GPU or its driver it panics; that is the probe).
///
/// # Errors
/// The cause, in the words of the library that failed.
#[cfg(feature = "cuda")]
fn cuda_start() -> Result<(), BackendError> {
    use burn::backend::Cuda;
    use burn::tensor::Tensor;
    static STARTED: std::sync::OnceLock<Result<(), BackendError>> = std::sync::OnceLock::new();
    STARTED
        .get_or_init(|| {
            let mut compiled = Ok(());
            probe_quietly(|| {
                compiled = cudarc::nvrtc::compile_ptx("extern \"C\" __global__ void probe() {}")
                    .map(|_| ())
                    .map_err(|e| format!("{e:?}"));
            })
            .and(compiled)
            .map_err(BackendError::NoNvrtc)?;
            probe_quietly(|| {
                let device = burn::backend::cuda::CudaDevice::default();
                Tensor::<Cuda, 1>::ones([1], &device).into_data();
            })
            .map_err(BackendError::NoCuda)
        })
        .clone()
}

#[cfg(not(feature = "cuda"))]
fn cuda_start() -> Result<(), BackendError> {
    Err(BackendError::NotCompiled {
        backend: "CUDA",
        feature: "cuda",
    })
}

/// Runs `probe`; a panic (a missing device, driver or library) is caught and returned as the
/// first line of its message instead of being printed (the panic hook is swapped out meanwhile,
/// one probe at a time, since the hook belongs to the whole process).
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn probe_quietly(probe: impl FnOnce()) -> Result<(), String> {
    static PROBING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = PROBING.lock().unwrap_or_else(|p| p.into_inner());
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(probe));
    std::panic::set_hook(hook);
    result.map_err(|payload| {
        let detail = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("it panicked without a message");
        detail.lines().next().unwrap_or(detail).to_string()
    })
}

/// Whether a first op on `device` runs (a missing device panics; that is the probe).
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn answers<B: burn::tensor::backend::Backend>(device: &B::Device) -> bool {
    use burn::tensor::Tensor;
    probe_quietly(|| {
        Tensor::<B, 1>::ones([1], device).into_data();
    })
    .is_ok()
}

#[cfg(feature = "cuda")]
fn run_cuda<T: MultiDeviceTask>(
    task: T,
    first: usize,
    count: usize,
) -> Result<T::Output, BackendError> {
    use burn::backend::cuda::CudaDevice;
    cuda_start()?;
    let devices: Vec<CudaDevice> = (first..first + count).map(CudaDevice::new).collect();
    if let Some(missing) = devices.iter().find(|d| !answers::<burn::backend::Cuda>(d)) {
        return Err(BackendError::DeviceMissing {
            backend: "CUDA",
            index: missing.index,
            count,
            hint: "check nvidia-smi and CUDA_VISIBLE_DEVICES",
        });
    }
    if count == 1 {
        eprintln!("backend: CUDA (device {first})");
    } else {
        eprintln!(
            "backend: CUDA (devices {first}..{}, data-parallel; device {first} is the main one)",
            first + count
        );
    }
    Ok(task.run::<burn::backend::Autodiff<burn::backend::Cuda>>(devices, "cuda", true))
}

#[cfg(not(feature = "cuda"))]
fn run_cuda<T: MultiDeviceTask>(
    _task: T,
    _first: usize,
    _count: usize,
) -> Result<T::Output, BackendError> {
    Err(BackendError::NotCompiled {
        backend: "CUDA",
        feature: "cuda",
    })
}

#[cfg(feature = "wgpu")]
fn run_wgpu<T: MultiDeviceTask>(
    task: T,
    first: usize,
    count: usize,
) -> Result<T::Output, BackendError> {
    use burn::backend::wgpu::WgpuDevice;
    if count == 1 && first == 0 {
        match wgpu_default_adapter() {
            Ok(adapter) if adapter.is_cpu => eprintln!(
                "backend: WGPU on {} — a CPU driver, not a GPU: expect it to be slower than \
                 --backend flex",
                adapter.description
            ),
            Ok(adapter) => eprintln!("backend: WGPU on {}", adapter.description),
            Err(why) => return Err(BackendError::NoWgpuAdapter(why)),
        }
        return Ok(task.run::<burn::backend::Autodiff<burn::backend::Wgpu>>(
            vec![WgpuDevice::default()],
            "wgpu",
            true,
        ));
    }
    let devices: Vec<WgpuDevice> = (first..first + count)
        .map(WgpuDevice::DiscreteGpu)
        .collect();
    if let Some(missing) = devices
        .iter()
        .position(|d| !answers::<burn::backend::Wgpu>(d))
    {
        return Err(BackendError::DeviceMissing {
            backend: "WGPU discrete GPU",
            index: first + missing,
            count,
            hint: "several devices, or a rank's devices, are WGPU's discrete GPUs",
        });
    }
    eprintln!(
        "backend: WGPU (discrete GPUs {first}..{}, data-parallel; GPU {first} is the main one)",
        first + count
    );
    Ok(task.run::<burn::backend::Autodiff<burn::backend::Wgpu>>(devices, "wgpu", true))
}

/// WGPU's default adapter, as Burn will use it.
#[cfg(feature = "wgpu")]
#[derive(Clone)]
struct WgpuAdapter {
    description: String,
    is_cpu: bool,
}

/// Sets up WGPU's default device once (Burn then trains on that setup) and says what adapter it
/// got. A machine without a GPU may still offer a CPU driver (Mesa's llvmpipe or lavapipe,
/// Microsoft's WARP), which would train far slower than Flex.
#[cfg(feature = "wgpu")]
fn wgpu_default_adapter() -> Result<WgpuAdapter, String> {
    use burn::backend::wgpu::{RuntimeOptions, WgpuDevice, graphics::AutoGraphicsApi, init_setup};
    static ADAPTER: std::sync::OnceLock<Result<WgpuAdapter, String>> = std::sync::OnceLock::new();
    ADAPTER
        .get_or_init(|| {
            // cubecl panics when there is no adapter; keep its backtrace off the terminal and say
            // what happened in one line instead.
            let mut setup = None;
            probe_quietly(|| {
                setup = Some(init_setup::<AutoGraphicsApi>(
                    &WgpuDevice::DefaultDevice,
                    RuntimeOptions::default(),
                ));
            })
            .map_err(|detail| {
                format!(
                    "WGPU found no usable adapter (no GPU driver for Vulkan, Metal or DX12: \
                     {detail})"
                )
            })?;
            let setup = setup.expect("the probe returned");
            let info = setup.adapter.get_info();
            // wgpu::DeviceType, named through Debug to keep wgpu out of the dependencies.
            let kind = format!("{:?}", info.device_type);
            Ok(WgpuAdapter {
                description: format!("`{}` ({kind}, {:?})", info.name, info.backend),
                is_cpu: kind == "Cpu",
            })
        })
        .clone()
}

/// Whether `auto` should take WGPU: compiled in, and its default adapter is a GPU.
///
/// # Errors
/// Why not, in words: not compiled, no adapter (and WGPU's reason), or a CPU driver.
fn wgpu_gpu_adapter() -> Result<(), String> {
    #[cfg(feature = "wgpu")]
    {
        match wgpu_default_adapter() {
            Ok(adapter) if !adapter.is_cpu => Ok(()),
            Ok(adapter) => Err(format!(
                "its adapter is {}, a CPU driver (slower than Flex)",
                adapter.description
            )),
            Err(why) => Err(why),
        }
    }
    #[cfg(not(feature = "wgpu"))]
    Err(BackendError::NotCompiled {
        backend: "WGPU",
        feature: "wgpu",
    }
    .to_string())
}

#[cfg(not(feature = "wgpu"))]
fn run_wgpu<T: MultiDeviceTask>(
    _task: T,
    _first: usize,
    _count: usize,
) -> Result<T::Output, BackendError> {
    Err(BackendError::NotCompiled {
        backend: "WGPU",
        feature: "wgpu",
    })
}
