//! Checkpoints: `out_dir/checkpoints/step-0000100/{model.mpk, optimizer.mpk, state.json,
//! manifest.json}`.
//!
//! A checkpoint is written into `step-0000100.partial/` (each file synced, the manifest, the size
//! and XXH64 digest of the other files, see [`super::manifest`], last) and only then renamed to
//! `step-0000100/`, the folders synced around the rename: a `step-N` folder is always one that
//! was written to the end, and a `.partial` one is provably an interrupted write, the only kind
//! removed without a word. Every read compares the files with the manifest first, so a damaged
//! checkpoint is refused instead of decoding into other weights; a resume that falls back past a
//! damaged or unreadable checkpoint renames it aside to `step-N.rejected/` with a `REJECTED.txt`
//! saying why, so it is never taken for the newest again nor pruned in place of a good one.
//!
//! The digests protect against accidental damage (a flipped bit, a truncated copy, a file
//! swapped between checkpoints), not against deliberate edits: whoever can write the files can
//! write a matching manifest. Checkpoints written before manifests existed (`state.json` format
//! 3, which recorded no model config) still load, unchecked, with a warning; a checkpoint of a
//! later format without its manifest is damaged.
//!
//! The records are Burn's named MessagePack at full precision: bit-exact `f32` weights and
//! optimiser moments (exact resume needs both), and, unlike the bincode recorder, an error rather
//! than a panic on a damaged file.

use super::manifest::{
    CHECKPOINT_FILES, CheckedFolder, Damage, MANIFEST_FILE, Verification, write_manifest,
};
use super::{FieldChange, TrainError, differing_fields};
use crate::atomic;
use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;
use coupled_qk::model::{Gpt, GptConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const MODEL: &str = CHECKPOINT_FILES[0];
const OPTIMIZER: &str = CHECKPOINT_FILES[1];
const STATE: &str = CHECKPOINT_FILES[2];
/// The suffix of a checkpoint folder being written.
const PARTIAL: &str = "partial";
/// The suffix of a checkpoint folder being replaced by a new one of the same step.
const SUPERSEDED: &str = "superseded";
/// The suffix of a checkpoint folder set aside as damaged.
const REJECTED: &str = "rejected";
/// The note in a rejected checkpoint folder.
pub const REJECTED_NOTE: &str = "REJECTED.txt";
/// 4 since each checkpoint has a manifest and records its model's config; 3 (each coupled
/// layer's dynamics a `QkDynamics` enum) still loads, without either. Older records do not load.
const FORMAT: u32 = 4;
/// The last format without a manifest.
const FORMAT_WITHOUT_MANIFEST: u32 = 3;

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
    /// The config of the model whose records the checkpoint holds, so that a checkpoint read
    /// with another config (an edited `config.json`) is refused, naming the field: records of
    /// the same shapes (Euler's and leapfrog's) would otherwise load without a word. `None` in
    /// checkpoints written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<serde_json::Value>,
}

impl CheckpointState {
    /// Its file in a checkpoint folder.
    pub const FILE: &'static str = STATE;

    /// The state after `step` steps of training `model`.
    pub fn new(
        step: usize,
        tokens: u64,
        elapsed_s: f64,
        pending_losses: &[f64],
        model: &GptConfig,
    ) -> Self {
        CheckpointState {
            format: FORMAT,
            step,
            tokens,
            elapsed_s,
            pending_losses: pending_losses.iter().map(f64::to_string).collect(),
            model: Some(serde_json::to_value(model).expect("a GptConfig serialises")),
        }
    }

    /// The fields in which `config` differs from the model the checkpoint was written by (old:
    /// the checkpoint's value, new: the config's); none where the checkpoint does not record it.
    pub fn model_changes(&self, config: &GptConfig) -> Vec<FieldChange> {
        let Some(recorded) = &self.model else {
            return Vec::new();
        };
        let wrap = |model: serde_json::Value| serde_json::json!({ "model": model });
        differing_fields(
            &wrap(recorded.clone()),
            &wrap(serde_json::to_value(config).expect("a GptConfig serialises")),
        )
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

/// The checkpoints of a run, oldest first: its `step-N` folders that hold any file of a
/// checkpoint, each written to the end (or damaged since: reading one is refused, naming the
/// damage).
pub fn list_checkpoints(out_dir: &Path) -> Result<Vec<(usize, PathBuf)>, TrainError> {
    let mut found = all_checkpoint_dirs(out_dir)?;
    found.retain(|(_, dir)| {
        CHECKPOINT_FILES
            .iter()
            .chain([&MANIFEST_FILE])
            .any(|file| dir.join(file).exists())
    });
    Ok(found)
}

/// Whether a checkpoint folder has its manifest, or is one written before manifests (a
/// `state.json` of format 3, which recorded no model config). Anything else lacks a manifest it
/// should have.
pub(super) fn has_manifest_or_predates_them(dir: &Path) -> bool {
    if dir.join(MANIFEST_FILE).is_file() {
        return true;
    }
    #[derive(Deserialize)]
    struct Format {
        format: u32,
        model: Option<serde_json::Value>,
    }
    std::fs::read(dir.join(STATE))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Format>(&bytes).ok())
        .is_some_and(|state| predates_manifests(state.format, state.model.as_ref()))
}

/// Whether a state is one of a checkpoint written before manifests: format 3 did not record
/// its model, so a `state.json` that does was written with a manifest.
fn predates_manifests(format: u32, model: Option<&serde_json::Value>) -> bool {
    format == FORMAT_WITHOUT_MANIFEST && model.is_none()
}

/// The folders a checkpoint write left that hold no checkpoint (`step-N.partial`, an interrupted
/// write, and `step-N.superseded`, an older copy of a step written again).
pub(super) fn interrupted_writes(out_dir: &Path) -> Result<Vec<PathBuf>, TrainError> {
    let mut found: Vec<PathBuf> = checkpoint_entries(out_dir)?
        .into_iter()
        .filter(|(name, _)| {
            [PARTIAL, SUPERSEDED].iter().any(|suffix| {
                name.strip_prefix("step-")
                    .and_then(|rest| rest.strip_suffix(suffix)?.strip_suffix('.'))
                    .is_some_and(|digits| {
                        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
                    })
            })
        })
        .map(|(_, path)| path)
        .collect();
    found.sort();
    Ok(found)
}

/// The name and path of every entry of the run's `checkpoints/` (none when it does not exist).
fn checkpoint_entries(out_dir: &Path) -> Result<Vec<(String, PathBuf)>, TrainError> {
    let root = checkpoints_dir(out_dir);
    let entries = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TrainError::io("list", root, e)),
    };
    entries
        .map(|entry| {
            let entry = entry.map_err(|e| TrainError::io("list", &root, e))?;
            Ok((
                entry.file_name().to_string_lossy().into_owned(),
                entry.path(),
            ))
        })
        .collect()
}

/// Renames the checkpoint folder `dir` aside to `step-N.rejected` (or `.rejected-2`, ...) with
/// a note saying `why`, and returns the new folder. A rejected checkpoint is kept for the user
/// to inspect or delete, but no longer counts as a checkpoint.
pub(super) fn reject_checkpoint(dir: &Path, why: &str) -> Result<PathBuf, TrainError> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let parent = dir.parent().unwrap_or(Path::new("."));
    let aside = (1..)
        .map(|n| match n {
            1 => parent.join(format!("{name}.{REJECTED}")),
            n => parent.join(format!("{name}.{REJECTED}-{n}")),
        })
        .find(|p| !p.exists())
        .expect("an unused name");
    std::fs::rename(dir, &aside).map_err(|e| TrainError::io("set aside", dir, e))?;
    atomic::sync_dir(parent).map_err(|e| TrainError::io("sync", parent, e))?;
    // The note is a courtesy: the rename is what takes the checkpoint out of use.
    let _ = std::fs::write(
        aside.join(REJECTED_NOTE),
        format!(
            "This checkpoint was set aside as {} because {why}.\n\
             It is kept for you to inspect; delete this folder when you no longer need it.\n",
            dir.display()
        ),
    );
    Ok(aside)
}

/// Every checkpoint folder of a run (`step-N`), complete or not, oldest first.
pub(super) fn all_checkpoint_dirs(out_dir: &Path) -> Result<Vec<(usize, PathBuf)>, TrainError> {
    let mut found: Vec<(usize, PathBuf)> = checkpoint_entries(out_dir)?
        .into_iter()
        .filter_map(|(name, path)| Some((name.strip_prefix("step-")?.parse().ok()?, path)))
        .collect();
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
    let root = checkpoints_dir(out_dir);
    atomic::create_dir(&root).map_err(|e| TrainError::io("create", &root, e))?;
    let partial = sibling(&dir, PARTIAL);
    remove_dir_if_present(&partial)?;
    let (model_bytes, optimizer_bytes) = encode_records(model, optimizer, &dir)?;
    let state_json = serde_json::to_vec_pretty(state).expect("a CheckpointState always serialises");
    let files: [(&str, &[u8]); 3] = [
        (MODEL, &model_bytes),
        (OPTIMIZER, &optimizer_bytes),
        (STATE, &state_json),
    ];
    for (file, bytes) in files {
        let path = partial.join(file);
        atomic::write(&path, bytes).map_err(|e| TrainError::io("write", path, e))?;
    }
    write_manifest(&partial, &files)?;
    // A folder of the same step (written before a fallback to an older checkpoint) is moved
    // aside first: a folder cannot be renamed over a non-empty one.
    let superseded = sibling(&dir, SUPERSEDED);
    let had_old = dir.exists();
    if had_old {
        remove_dir_if_present(&superseded)?;
        std::fs::rename(&dir, &superseded).map_err(|e| TrainError::io("rename", &dir, e))?;
    }
    std::fs::rename(&partial, &dir).map_err(|e| TrainError::io("rename", &partial, e))?;
    atomic::sync_dir(&root).map_err(|e| TrainError::io("sync", &root, e))?;
    if had_old {
        remove_dir_if_present(&superseded)?;
    }
    Ok(dir)
}

/// `step-N.suffix` beside the checkpoint folder `dir` (`step-N`).
fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{suffix}"));
    dir.with_file_name(name)
}

fn remove_dir_if_present(dir: &Path) -> Result<(), TrainError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(TrainError::io("remove", dir, e)),
        _ => Ok(()),
    }
}

/// The records of `model` and `optimizer` as the bytes of a checkpoint's `model.mpk` and
/// `optimizer.mpk` (`dir` names the checkpoint in errors).
pub(super) fn encode_records<B, O>(
    model: &Gpt<B>,
    optimizer: &O,
    dir: &Path,
) -> Result<(Vec<u8>, Vec<u8>), TrainError>
where
    B: AutodiffBackend,
    O: Optimizer<Gpt<B>, B>,
{
    let record_error = |file: &str, e: burn::record::RecorderError| TrainError::Corrupt {
        path: dir.join(file),
        message: format!("cannot encode: {e}"),
        hint: "this is a bug; please report it",
    };
    let model_bytes = Recorder::<B>::record(&recorder(), model.clone().into_record(), ())
        .map_err(|e| record_error(MODEL, e))?;
    let optimizer_bytes = Recorder::<B>::record(&recorder(), optimizer.to_record(), ())
        .map_err(|e| record_error(OPTIMIZER, e))?;
    Ok((model_bytes, optimizer_bytes))
}

/// `model` and `optimizer` with the records of [`encode_records`]'s bytes (weights, parameter
/// ids, moments); `origin` names where the bytes came from in errors.
pub(super) fn decode_records<B, O>(
    model: Gpt<B>,
    optimizer: O,
    model_bytes: Vec<u8>,
    optimizer_bytes: Vec<u8>,
    origin: &Path,
    device: &B::Device,
) -> Result<(Gpt<B>, O), TrainError>
where
    B: AutodiffBackend,
    O: Optimizer<Gpt<B>, B>,
{
    let model_record = decode::<B, _>(model_bytes, origin, MODEL, device)?;
    let optimizer_record = decode::<B, _>(optimizer_bytes, origin, OPTIMIZER, device)?;
    let model = fit_record(model, model_record, &origin.join(MODEL))?;
    Ok((model, optimizer.load_record(optimizer_record)))
}

/// Loads the checkpoint in `dir` into `model` and `optimizer` (freshly built with the same
/// config: the records bring the weights, the parameter ids and the optimiser's moments), once
/// every file matches the manifest.
///
/// # Errors
/// [`TrainError::CheckpointCorrupt`] naming a file that does not match its manifest or does not
/// decode; [`TrainError::Corrupt`] for a checkpoint of another format or whose parameters do not
/// fit `model`; I/O errors.
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
    let mut folder = CheckedFolder::open(dir)?;
    let state = read_state(&mut folder, dir)?;
    let model_bytes = folder.read(MODEL)?;
    let optimizer_bytes = folder.read(OPTIMIZER)?;
    folder.check_rest()?;
    let (model, optimizer) =
        decode_records(model, optimizer, model_bytes, optimizer_bytes, dir, device)?;
    Ok((model, optimizer, state))
}

/// Loads the newest of `checkpoints` (oldest first) whose files all match their manifest,
/// skipping damaged ones with a note (a damaged checkpoint is never used): the model, the
/// optimiser (from `new_optimizer`), the state and the folder.
///
/// # Errors
/// [`TrainError::NoGoodCheckpoint`] when every checkpoint is damaged, and the errors of
/// [`load_checkpoint`] other than damage (a checkpoint of another architecture or format stops
/// the resume rather than silently falling back).
pub(super) fn load_newest_good<B, O>(
    out_dir: &Path,
    checkpoints: &[(usize, PathBuf)],
    model: Gpt<B>,
    new_optimizer: impl Fn() -> O,
    device: &B::Device,
    say: &dyn Fn(String),
) -> Result<(Gpt<B>, O, CheckpointState, PathBuf), TrainError>
where
    B: AutodiffBackend,
    O: Optimizer<Gpt<B>, B>,
{
    let mut rejected: Vec<(PathBuf, PathBuf, Damage)> = Vec::new();
    for (_, dir) in checkpoints.iter().rev() {
        match load_checkpoint(dir, model.clone(), new_optimizer(), device) {
            Ok((model, optimizer, state)) => {
                // Only now, with a good checkpoint to continue from, are the newer ones set
                // aside: left in place, the newest of them would still count as the run's newest
                // (and get a newer good checkpoint pruned in its favour). Older folders without
                // the manifest they should have are set aside too, rather than pruned unseen.
                rejected.extend(
                    checkpoints
                        .iter()
                        .take_while(|(_, older)| older != dir)
                        .filter(|(_, older)| !has_manifest_or_predates_them(older))
                        .map(|(_, older)| {
                            (older.clone(), older.join(MANIFEST_FILE), Damage::Missing)
                        }),
                );
                for (checkpoint, path, damage) in &rejected {
                    let why = format!("its file {} is {damage}", path.display());
                    let aside = reject_checkpoint(checkpoint, &why)?;
                    say(format!(
                        "note: set the damaged checkpoint {} aside as {} (kept for you to \
                         inspect or delete)",
                        checkpoint.display(),
                        aside.display()
                    ));
                }
                if !rejected.is_empty() {
                    say(format!(
                        "note: resuming from {} instead, the newest checkpoint that verifies",
                        dir.display()
                    ));
                }
                if state.format == FORMAT_WITHOUT_MANIFEST {
                    say(unverified_warning(dir));
                }
                return Ok((model, optimizer, state, dir.clone()));
            }
            Err(TrainError::CheckpointCorrupt { path, damage }) => {
                say(skipping(&path, &damage, dir));
                rejected.push((dir.clone(), path, damage));
            }
            Err(e) => return Err(e),
        }
    }
    Err(TrainError::NoGoodCheckpoint {
        path: out_dir.to_path_buf(),
        rejected: rejected
            .into_iter()
            .map(|(_, path, damage)| (path, damage))
            .collect(),
    })
}

/// The note for a damaged checkpoint that a load skips.
fn skipping(path: &Path, damage: &Damage, dir: &Path) -> String {
    format!(
        "note: checkpoint file {} is {damage}: skipping the checkpoint {}",
        path.display(),
        dir.display()
    )
}

/// The message of a checkpoint read without a manifest, for the programs to print.
pub fn unverified_warning(dir: &Path) -> String {
    format!(
        "warning: checkpoint {} has no {MANIFEST_FILE} (it was written before checkpoints were \
         checksummed): its files are used without a check",
        dir.display()
    )
}

/// The checkpoint's `state.json`, read through the manifest, of a format this build reads.
fn read_state(folder: &mut CheckedFolder, dir: &Path) -> Result<CheckpointState, TrainError> {
    let bytes = folder.read(STATE)?;
    let state: CheckpointState =
        serde_json::from_slice(&bytes).map_err(|_| TrainError::CheckpointCorrupt {
            path: dir.join(STATE),
            damage: Damage::Undecodable("state"),
        })?;
    let readable = match folder.verification() {
        Verification::Verified => state.format == FORMAT,
        Verification::NoManifest
            if !predates_manifests(state.format, state.model.as_ref())
                && state.format >= FORMAT_WITHOUT_MANIFEST =>
        {
            // Written with a manifest (its format, or the model config it records, says so),
            // and the manifest is gone.
            return Err(TrainError::CheckpointCorrupt {
                path: dir.join(MANIFEST_FILE),
                damage: Damage::Missing,
            });
        }
        Verification::NoManifest => state.format == FORMAT_WITHOUT_MANIFEST,
    };
    if !readable {
        // Format 1 stored each block's attention as a plain struct; since BlockAttention (an enum
        // of coupled and differential attention) its records do not load.
        return Err(TrainError::Corrupt {
            path: dir.join(STATE),
            message: format!(
                "checkpoint format {} (this build reads {FORMAT_WITHOUT_MANIFEST} and {FORMAT})",
                state.format
            ),
            hint: "it was written by another version of the harness; start the run afresh in a new folder",
        });
    }
    Ok(state)
}

/// Decodes a record, Burn's error (which speaks of record formats of old Burn versions) replaced
/// by what it means here: the file is cut short or damaged.
fn decode<B: burn::tensor::backend::Backend, R: burn::record::Record<B>>(
    bytes: Vec<u8>,
    dir: &Path,
    file: &str,
    device: &B::Device,
) -> Result<R, TrainError> {
    Recorder::<B>::load(&recorder(), bytes, device).map_err(|_| TrainError::CheckpointCorrupt {
        path: dir.join(file),
        damage: Damage::Undecodable(if file == MODEL {
            "model record"
        } else {
            "optimiser record"
        }),
    })
}

/// `model` with the weights of `record`, once every parameter's shape is the model's.
fn fit_record<B: burn::tensor::backend::Backend>(
    model: Gpt<B>,
    record: <Gpt<B> as Module<B>>::Record,
    path: &Path,
) -> Result<Gpt<B>, TrainError> {
    // Burn's `load_record` takes a tensor of any shape (and panics on a different number of
    // blocks): compare every parameter with the model the config builds.
    let mismatch = |message: String| TrainError::Corrupt {
        path: path.to_path_buf(),
        message: format!("{message}: the checkpoint belongs to another architecture"),
        hint: "load it with the model settings of the run's config.json, or start a new folder",
    };
    let expected = param_shapes(&model);
    let model = crate::dist::catch_expected_panic(|| model.load_record(record))
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
    Ok(model)
}

/// The trained model of a run folder, for inference on any backend: the model its `config.json`
/// describes, with the weights of its newest checkpoint whose files all match the checkpoint's
/// manifest (the optimiser state is checked, not decoded). A damaged or unreadable newer
/// checkpoint is skipped with a note on stderr naming it and its damage. Returns the run's config
/// and the step of the checkpoint taken.
///
/// # Errors
/// A folder without `config.json` or without a checkpoint; [`TrainError::NoGoodCheckpoint`] when
/// none verifies; [`TrainError::CheckpointMismatch`] for a `config.json` that describes another
/// model than the checkpoint's; unreadable files.
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
    let checkpoints = list_checkpoints(out_dir)?;
    if checkpoints.is_empty() {
        return Err(TrainError::Corrupt {
            path: checkpoints_dir(out_dir),
            message: "holds no complete checkpoint".into(),
            hint: "train the run (or resume it) until it writes one",
        });
    }
    let mut rejected = Vec::new();
    for (step, dir) in checkpoints.into_iter().rev() {
        let read = (|| {
            let mut folder = CheckedFolder::open(&dir)?;
            let state = read_state(&mut folder, &dir)?;
            let model_bytes = folder.read(MODEL)?;
            let verification = folder.check_rest()?;
            let record = decode::<B, _>(model_bytes, &dir, MODEL, device)?;
            Ok::<_, TrainError>((state, record, verification))
        })();
        let (state, record, verification) = match read {
            Ok(read) => read,
            Err(TrainError::CheckpointCorrupt { path, damage }) => {
                eprintln!("{}", skipping(&path, &damage, &dir));
                rejected.push((path, damage));
                continue;
            }
            Err(e) => return Err(e),
        };
        if verification == Verification::NoManifest {
            eprintln!("{}", unverified_warning(&dir));
        }
        let changes = state.model_changes(&config.train.model);
        if !changes.is_empty() {
            return Err(TrainError::CheckpointMismatch {
                checkpoint: dir,
                config: config_path,
                changes,
            });
        }
        let model: Gpt<B> = config.train.model.try_init(device)?;
        let model = fit_record(model, record, &dir.join(MODEL))?;
        if !rejected.is_empty() {
            eprintln!(
                "note: using {} instead, the newest checkpoint that verifies",
                dir.display()
            );
        }
        return Ok((model, config, step));
    }
    Err(TrainError::NoGoodCheckpoint {
        path: out_dir.to_path_buf(),
        rejected,
    })
}

/// The newest checkpoint of the run in `out_dir`, at most `up_to` steps, whose files all match
/// its manifest (or that predates manifests): the one a divergence may name as good.
pub(super) fn newest_good_checkpoint(out_dir: &Path, up_to: usize) -> Option<PathBuf> {
    let checkpoints = list_checkpoints(out_dir).ok()?;
    checkpoints
        .into_iter()
        .rev()
        .filter(|(step, _)| *step <= up_to)
        .find(|(_, dir)| super::verify_checkpoint(dir).is_ok())
        .map(|(_, dir)| dir)
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

/// Deletes all but the newest `keep` checkpoints (rejected ones, set aside, are not counted and
/// not touched).
pub fn prune_checkpoints(out_dir: &Path, keep: usize) -> Result<(), TrainError> {
    let all = list_checkpoints(out_dir)?;
    let prune = all.len().saturating_sub(keep.max(1));
    for (_, dir) in &all[..prune] {
        // The manifest and state.json first, so a folder half-deleted by an interrupt no longer
        // counts as a checkpoint that verifies.
        let _ = std::fs::remove_file(dir.join(MANIFEST_FILE));
        let _ = std::fs::remove_file(dir.join(STATE));
        std::fs::remove_dir_all(dir).map_err(|e| TrainError::io("remove", dir, e))?;
    }
    if prune > 0 {
        let root = checkpoints_dir(out_dir);
        atomic::sync_dir(&root).map_err(|e| TrainError::io("sync", &root, e))?;
    }
    Ok(())
}
