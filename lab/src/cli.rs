//! What the example programs tell their users: an error, then what to change on their command
//! line. The library's errors name settings and files; only this module speaks of the programs'
//! flags (beside the flag definitions themselves, such as [`Budget`](crate::suite::Budget)'s).

use crate::backend::BackendError;
use crate::data::DataError;
use crate::lm::TrainError;
use crate::suite::SuiteError;
use std::error::Error;

/// What to change on the programs' command line for `error`, if anything: for the harness's own
/// errors (training, data, backend, suite), found through the error's sources.
pub fn advice(error: &(dyn Error + 'static)) -> Option<String> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(e) = e.downcast_ref::<TrainError>() {
            return train_advice(e);
        }
        if let Some(e) = e.downcast_ref::<DataError>() {
            return data_advice(e);
        }
        if let Some(e) = e.downcast_ref::<BackendError>() {
            return backend_advice(e).map(str::to_string);
        }
        if let Some(e) = e.downcast_ref::<SuiteError>() {
            return suite_advice(e).map(str::to_string);
        }
        current = e.source();
    }
    None
}

/// Prints `error: …` and its [`advice`] on stderr, and exits with status 1.
pub fn exit_with(error: &(dyn Error + 'static)) -> ! {
    eprintln!("error: {error}");
    if let Some(advice) = advice(error) {
        eprintln!("{advice}");
    }
    std::process::exit(1)
}

/// What to change for a backend that cannot run: `--backend` or `--devices`.
pub fn backend_advice(e: &BackendError) -> Option<&'static str> {
    match e {
        BackendError::Unknown(_) => None,
        BackendError::NoDevices => Some("give --devices 1 or more"),
        BackendError::NotCompiled { .. } => Some("or use --backend flex (the CPU)"),
        BackendError::NoCuda(_) => Some(
            "check the NVIDIA driver (`nvidia-smi` lists the GPU; libcuda.so.1 is the driver's) \
             and CUDA_VISIBLE_DEVICES, or use --backend flex (the CPU)",
        ),
        BackendError::NoNvrtc(_) => Some(
            "install CUDA's run-time compiler for the driver's CUDA version (the toolkit, or the \
             package libnvrtc / cuda-nvrtc; `nvidia-smi` names the version) and make libnvrtc.so \
             findable (LD_LIBRARY_PATH), or use --backend flex (the CPU)",
        ),
        BackendError::NoWgpuAdapter(_) => Some(
            "install a Vulkan driver for the GPU (the vendor's, or Mesa's: Debian's \
             mesa-vulkan-drivers; `vulkaninfo --summary` lists what Vulkan sees), or use \
             --backend flex (the CPU)",
        ),
        BackendError::DeviceMissing { .. } => Some("lower --devices"),
    }
}

/// What to do about a suite's error, in terms of the suite programs' flags. `--retry-failed`
/// is advised only for cells whose failure is recorded (a divergence): the others (a damaged
/// checkpoint, a changed setting, a folder in use) are tried again by any rerun.
pub fn suite_advice(e: &SuiteError) -> Option<&'static str> {
    match e {
        SuiteError::Failed(cells) => {
            let recorded = cells
                .iter()
                .filter(|c| crate::suite::FailedCell::recorded(&c.dir).is_some())
                .count();
            Some(match (recorded, cells.len() - recorded) {
                (0, _) => {
                    "fix what each message names, then rerun: these cells are tried again (and \
                     resumed where they have a checkpoint) without --retry-failed"
                }
                (_, 0) => {
                    "for a divergence, lower --lr (or lengthen --warmup), then rerun with \
                     --retry-failed to train those cells again from scratch"
                }
                _ => {
                    "fix what each message names and rerun; the cells that diverged are trained \
                     again only with --retry-failed (from scratch, with a lower --lr or a \
                     longer --warmup)"
                }
            })
        }
        SuiteError::NoSuchCell { .. } => Some("--list-cells lists them"),
        SuiteError::Backend(e) => backend_advice(e),
    }
}

fn train_advice(e: &TrainError) -> Option<String> {
    Some(match e {
        TrainError::RunExists { .. } => "continue it with --resume, or give another --out".into(),
        TrainError::FolderNotEmpty { .. } => {
            "give an empty or new --out, or pass --force to train into this one".into()
        }
        TrainError::ConfigMismatch { .. } => "wikitext_60m may change --lr, --warmup and \
             --max-steps (or --tokens) on --resume; other changes need a new --out"
            .into(),
        TrainError::NonFinite {
            checkpoint: Some(_),
            ..
        } => "--resume with a lower --lr (or a longer --warmup)".into(),
        TrainError::NonFinite { .. } => "start again with a lower --lr or a longer --warmup".into(),
        TrainError::Data(e) => return data_advice(e),
        _ => return None,
    })
}

fn data_advice(e: &DataError) -> Option<String> {
    match e {
        // The hint WikiText's loaders give (not a word searched in any hint).
        DataError::NotFound { hint, .. } | DataError::Download { hint, .. }
            if *hint == crate::data::wikitext_hint() =>
        {
            Some(
                "offline: give the folder of WikiText's wiki.train.raw and wiki.valid.raw with \
                 --data-dir DIR, or another corpus with --corpus (shakespeare ships with the \
                 repository)"
                    .into(),
            )
        }
        _ => None,
    }
}
