//! Which backend an example trains on: `--backend flex|wgpu|cuda|auto`. GPU backends exist only
//! when the crate is built with their feature (`--features cuda` or `--features wgpu`).

use burn::tensor::backend::AutodiffBackend;
use std::str::FromStr;

/// A backend choice from the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// The best compiled and working one: CUDA, then WGPU, then Flex.
    Auto,
    /// Flex, the fastest CPU backend.
    Flex,
    /// WGPU (Vulkan, Metal, DX12): needs `--features wgpu`.
    Wgpu,
    /// CUDA: needs `--features cuda` and an NVIDIA GPU.
    Cuda,
}

impl FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "flex" | "cpu" => Ok(Self::Flex),
            "wgpu" => Ok(Self::Wgpu),
            "cuda" => Ok(Self::Cuda),
            other => Err(format!("unknown backend `{other}`: expected auto, flex, wgpu or cuda")),
        }
    }
}

/// Work generic over the backend (closures cannot be).
pub trait BackendTask {
    /// What the work returns.
    type Output;
    /// Runs on backend `B`; `name` says which, `gpu` whether it is a GPU backend.
    fn run<B: AutodiffBackend>(self, device: B::Device, name: &'static str, gpu: bool) -> Self::Output;
}

/// Runs `task` on the chosen backend, printing the choice.
///
/// # Errors
/// If the chosen backend was not compiled in, or (CUDA) no device answers.
pub fn dispatch<T: BackendTask>(choice: BackendChoice, task: T) -> Result<T::Output, String> {
    let chosen = match choice {
        BackendChoice::Auto if cuda_works() => BackendChoice::Cuda,
        BackendChoice::Auto if cfg!(feature = "wgpu") => BackendChoice::Wgpu,
        BackendChoice::Auto => BackendChoice::Flex,
        other => other,
    };
    match chosen {
        BackendChoice::Cuda => run_cuda(task),
        BackendChoice::Wgpu => run_wgpu(task),
        _ => {
            eprintln!("backend: Flex (CPU, {} threads)", rayon::current_num_threads());
            Ok(task.run::<burn::backend::Autodiff<burn::backend::Flex>>(Default::default(), "flex", false))
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_works() -> bool {
    use burn::backend::Cuda;
    use burn::tensor::Tensor;
    // Without a GPU the first CUDA op panics; that is the probe.
    std::panic::catch_unwind(|| {
        let device = burn::backend::cuda::CudaDevice::default();
        Tensor::<Cuda, 1>::ones([1], &device).into_data();
    })
    .is_ok()
}

#[cfg(not(feature = "cuda"))]
fn cuda_works() -> bool {
    false
}

#[cfg(feature = "cuda")]
fn run_cuda<T: BackendTask>(task: T) -> Result<T::Output, String> {
    if !cuda_works() {
        return Err("no CUDA device answers: check the driver (nvidia-smi), or use --backend flex".into());
    }
    eprintln!("backend: CUDA (device 0)");
    Ok(task.run::<burn::backend::Autodiff<burn::backend::Cuda>>(Default::default(), "cuda", true))
}

#[cfg(not(feature = "cuda"))]
fn run_cuda<T: BackendTask>(_task: T) -> Result<T::Output, String> {
    Err("this build has no CUDA backend: rebuild with `--features cuda`, or use --backend flex".into())
}

#[cfg(feature = "wgpu")]
fn run_wgpu<T: BackendTask>(task: T) -> Result<T::Output, String> {
    eprintln!("backend: WGPU (default adapter; on a machine without a GPU this is a slow CPU driver)");
    Ok(task.run::<burn::backend::Autodiff<burn::backend::Wgpu>>(Default::default(), "wgpu", true))
}

#[cfg(not(feature = "wgpu"))]
fn run_wgpu<T: BackendTask>(_task: T) -> Result<T::Output, String> {
    Err("this build has no WGPU backend: rebuild with `--features wgpu`, or use --backend flex".into())
}
