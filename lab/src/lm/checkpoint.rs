//! Checkpoints: `out_dir/checkpoints/step-0000100/{model.mpk, optimizer.mpk, state.json}`.
//!
//! Each file is written atomically (temporary file, sync, rename), and `state.json` last: a
//! checkpoint counts only once its `state.json` exists, so an interrupt at any moment leaves
//! either a complete checkpoint or one that is ignored (and later pruned).
//!
//! The records are Burn's named MessagePack at full precision: bit-exact `f32` weights and
//! optimiser moments (exact resume needs both), and, unlike the bincode recorder, an error rather
//! than a panic on a damaged file.

use super::TrainError;
use crate::atomic;
use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use coupled_qk::model::Gpt;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const MODEL: &str = "model.mpk";
const OPTIMIZER: &str = "optimizer.mpk";
const STATE: &str = "state.json";
/// 3 since each coupled layer's dynamics are a `QkDynamics` enum (older records do not load).
const FORMAT: u32 = 3;

/// The loop's own state at a checkpoint (the model and optimiser have their records).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CheckpointState {
    /// Version of this layout.
    pub format: u32,
    /// Steps done.
    pub step: usize,
    /// Training tokens seen.
    pub tokens: u64,
    /// Wall-clock seconds of the run so far.
    pub elapsed_s: f64,
    /// The training losses of the steps since the last metrics row, so a resumed run writes the
    /// same next row. Stored as text: JSON parsers need not round-trip floats exactly.
    pub pending_losses: Vec<String>,
}

impl CheckpointState {
    /// Its file in a checkpoint folder, written last: a folder without it is incomplete.
    pub const FILE: &'static str = STATE;

    /// The state after `step` steps.
    pub fn new(step: usize, tokens: u64, elapsed_s: f64, pending_losses: &[f64]) -> Self {
        CheckpointState {
            format: FORMAT,
            step,
            tokens,
            elapsed_s,
            pending_losses: pending_losses.iter().map(f64::to_string).collect(),
        }
    }

    /// The pending losses as numbers.
    pub fn losses(&self) -> Vec<f64> {
        self.pending_losses
            .iter()
            .map(|l| l.parse().unwrap_or(f64::NAN))
            .collect()
    }
}

/// The folder holding a run's checkpoints.
pub fn checkpoints_dir(out_dir: &Path) -> PathBuf {
    out_dir.join("checkpoints")
}

/// The folder of the checkpoint after `step` steps.
pub fn checkpoint_dir(out_dir: &Path, step: usize) -> PathBuf {
    checkpoints_dir(out_dir).join(format!("step-{step:07}"))
}

/// The complete checkpoints of a run (those with a `state.json`), oldest first.
pub fn list_checkpoints(out_dir: &Path) -> Result<Vec<(usize, PathBuf)>, TrainError> {
    Ok(all_checkpoint_dirs(out_dir)?
        .into_iter()
        .filter(|(_, dir)| dir.join(STATE).is_file())
        .collect())
}

/// Every `step-*` folder, complete or not, oldest first.
/// Every checkpoint folder of a run, complete or not, oldest first.
pub(super) fn all_checkpoint_dirs(out_dir: &Path) -> Result<Vec<(usize, PathBuf)>, TrainError> {
    let root = checkpoints_dir(out_dir);
    let entries = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TrainError::io("list", root, e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| TrainError::io("list", &root, e))?;
        let name = entry.file_name();
        if let Some(step) = name
            .to_str()
            .and_then(|n| n.strip_prefix("step-")?.parse().ok())
        {
            found.push((step, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

fn recorder() -> NamedMpkBytesRecorder<FullPrecisionSettings> {
    NamedMpkBytesRecorder::default()
}

/// Writes the checkpoint of `state.step` and returns its folder.
pub fn save_checkpoint<B, O>(
    out_dir: &Path,
    state: &CheckpointState,
    model: &Gpt<B>,
    optimizer: &O,
) -> Result<PathBuf, TrainError>
where
    B: AutodiffBackend,
    O: Optimizer<Gpt<B>, B>,
{
    let dir = checkpoint_dir(out_dir, state.step);
    // A folder left by an earlier attempt at this step stops counting before it is overwritten.
    match std::fs::remove_file(dir.join(STATE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(TrainError::io("remove", dir.join(STATE), e));
        }
        _ => {}
    }
    let record_error = |file: &str, e: burn::record::RecorderError| TrainError::Corrupt {
        path: dir.join(file),
        message: format!("cannot encode: {e}"),
        hint: "this is a bug; please report it",
    };
    let model_bytes = Recorder::<B>::record(&recorder(), model.clone().into_record(), ())
        .map_err(|e| record_error(MODEL, e))?;
    let optimizer_bytes = Recorder::<B>::record(&recorder(), optimizer.to_record(), ())
        .map_err(|e| record_error(OPTIMIZER, e))?;
    let state_json = serde_json::to_vec_pretty(state).expect("a CheckpointState always serialises");
    for (file, bytes) in [
        (MODEL, &model_bytes),
        (OPTIMIZER, &optimizer_bytes),
        (STATE, &state_json),
    ] {
        let path = dir.join(file);
        atomic::write(&path, bytes).map_err(|e| TrainError::io("write", path, e))?;
    }
    Ok(dir)
}

/// Loads the checkpoint in `dir` into `model` and `optimizer` (freshly built with the same
/// config: the records bring the weights, the parameter ids and the optimiser's moments).
pub fn load_checkpoint<B, O>(
    dir: &Path,
    model: Gpt<B>,
    optimizer: O,
    device: &B::Device,
) -> Result<(Gpt<B>, O, CheckpointState), TrainError>
where
    B: AutodiffBackend,
    O: Optimizer<Gpt<B>, B>,
{
    let corrupt = |file: &str, message: String| TrainError::Corrupt {
        path: dir.join(file),
        message,
        hint: "delete this checkpoint folder to resume from the previous one",
    };
    let read = |file: &str| {
        let path = dir.join(file);
        std::fs::read(&path).map_err(|e| TrainError::io("read", path, e))
    };
    let state: CheckpointState =
        serde_json::from_slice(&read(STATE)?).map_err(|e| corrupt(STATE, e.to_string()))?;
    if state.format != FORMAT {
        // Format 1 stored each block's attention as a plain struct; since BlockAttention (an enum
        // of coupled and differential attention) its records do not load.
        return Err(TrainError::Corrupt {
            path: dir.join(STATE),
            message: format!(
                "checkpoint format {} (this build reads {FORMAT})",
                state.format
            ),
            hint: "it was written by another version of the harness; start the run afresh in a new folder",
        });
    }
    let model_record = Recorder::<B>::load(&recorder(), read(MODEL)?, device).map_err(|e| {
        corrupt(
            MODEL,
            format!("{e} (was it written by a model of another config?)"),
        )
    })?;
    let optimizer_record = Recorder::<B>::load(&recorder(), read(OPTIMIZER)?, device)
        .map_err(|e| corrupt(OPTIMIZER, e.to_string()))?;
    // Burn's `load_record` takes a tensor of any shape (and panics on a different number of
    // blocks): compare every parameter with the model the config builds.
    let mismatch = |message: String| TrainError::Corrupt {
        path: dir.join(MODEL),
        message: format!("{message}: the checkpoint belongs to another architecture"),
        hint: "resume with the model settings of the run's config.json, or start a new folder",
    };
    let expected = param_shapes(&model);
    let model = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        model.load_record(model_record)
    }))
    .map_err(|_| mismatch("its record does not fit the model".into()))?;
    let loaded = param_shapes(&model);
    if loaded.len() != expected.len() {
        return Err(mismatch(format!(
            "it has {} parameters, the model built from the config {}",
            loaded.len(),
            expected.len()
        )));
    }
    if let Some((want, got)) = expected.iter().zip(&loaded).find(|(a, b)| a != b) {
        return Err(mismatch(format!(
            "parameter {} has shape {:?} in the checkpoint, but {:?} in the model built from \
             the config",
            want.0, got.1, want.1
        )));
    }
    Ok((model, optimizer.load_record(optimizer_record), state))
}

/// The trained model of a run folder, for inference on any backend: the model its `config.json`
/// describes, with the weights of its newest complete checkpoint (the optimiser state is not
/// read). Returns the run's config too.
///
/// # Errors
/// A folder without `config.json` or without a complete checkpoint, and unreadable files.
pub fn load_trained<B: burn::tensor::backend::Backend>(
    out_dir: &Path,
    device: &B::Device,
) -> Result<(Gpt<B>, super::RunConfig, usize), TrainError> {
    let config_path = out_dir.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| TrainError::io("read", &config_path, e))?;
    let corrupt = |e: serde_json::Error| TrainError::Corrupt {
        path: config_path.clone(),
        message: e.to_string(),
        hint: "not the config.json of a run of this harness",
    };
    let mut json: serde_json::Value = serde_json::from_str(&text).map_err(corrupt)?;
    super::config::fill_model_defaults(&mut json);
    let config: super::RunConfig = serde_json::from_value(json).map_err(corrupt)?;
    let Some((step, dir)) = list_checkpoints(out_dir)?.pop() else {
        return Err(TrainError::Corrupt {
            path: checkpoints_dir(out_dir),
            message: "holds no complete checkpoint".into(),
            hint: "train the run (or resume it) until it writes one",
        });
    };
    let model: Gpt<B> = config.train.model.try_init(device)?;
    let path = dir.join(MODEL);
    let bytes = std::fs::read(&path).map_err(|e| TrainError::io("read", &path, e))?;
    let record =
        Recorder::<B>::load(&recorder(), bytes, device).map_err(|e| TrainError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
            hint: "delete this checkpoint folder to use the previous one",
        })?;
    Ok((model.load_record(record), config, step))
}

/// Every float parameter's path and shape, in visiting order.
fn param_shapes<B: burn::tensor::backend::Backend>(model: &Gpt<B>) -> Vec<(String, Vec<usize>)> {
    #[derive(Default)]
    struct Shapes {
        path: Vec<String>,
        found: Vec<(String, Vec<usize>)>,
    }
    impl<B: burn::tensor::backend::Backend> burn::module::ModuleVisitor<B> for Shapes {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn::module::Param<burn::tensor::Tensor<B, D>>,
        ) {
            self.found
                .push((self.path.join("."), param.dims().to_vec()));
        }
    }
    let mut shapes = Shapes::default();
    model.visit(&mut shapes);
    shapes.found
}

/// Deletes all but the newest `keep` complete checkpoints, and incomplete ones older than the
/// newest complete one (left by an interrupt; a newer incomplete one may be being written).
pub fn prune_checkpoints(out_dir: &Path, keep: usize) -> Result<(), TrainError> {
    let all = all_checkpoint_dirs(out_dir)?;
    let complete: Vec<usize> = all
        .iter()
        .filter(|(_, dir)| dir.join(STATE).is_file())
        .map(|(step, _)| *step)
        .collect();
    let Some(&newest) = complete.last() else {
        return Ok(());
    };
    let kept = &complete[complete.len().saturating_sub(keep)..];
    for (step, dir) in all {
        if step < newest && !kept.contains(&step) {
            // state.json first, so a folder half-deleted by an interrupt no longer counts.
            let _ = std::fs::remove_file(dir.join(STATE));
            std::fs::remove_dir_all(&dir).map_err(|e| TrainError::io("remove", dir, e))?;
        }
    }
    Ok(())
}
