//! A run folder: its lock, what a killed run left in it, and whether a run starts fresh there or
//! resumes (and with which changes).

use super::checkpoint::{all_checkpoint_dirs, interrupted_writes, list_checkpoints};
use super::config::{FieldChange, OPTIMISER_FIELDS, RecordedChange, RunConfig, differing_fields};
use super::{RunOptions, TrainError};
use crate::atomic;
use std::path::{Path, PathBuf};

/// The lock file of a run folder.
pub const LOCK_FILE: &str = ".lock";

/// Takes the exclusive lock of a run folder (an OS lock on its `.lock` file, released when the
/// file is closed, also by a crash) and writes this process's id into it.
///
/// # Errors
/// [`TrainError::RunInUse`] when another process holds it.
fn lock_folder(out_dir: &Path) -> Result<std::fs::File, TrainError> {
    use std::io::{Read, Seek, Write};
    let path = out_dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| TrainError::io("open", &path, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(TrainError::RunInUse {
                path: out_dir.to_path_buf(),
                holder: match holder.trim() {
                    "" => "another process".to_string(),
                    pid => format!("process {pid}"),
                },
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(TrainError::io("lock", &path, e)),
    }
    let written = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| write!(file, "{}", std::process::id()));
    written.map_err(|e| TrainError::io("write", &path, e))?;
    Ok(file)
}

/// Removes what a killed run left in its folder: temporary files of interrupted writes and
/// checkpoint folders whose write was interrupted (`step-N.partial`, `step-N.superseded`: never
/// a `step-N` folder, which is only ever a finished write). Only with the folder's lock held,
/// when no live process writes there.
fn remove_leftovers(out_dir: &Path, say: &dyn Fn(String)) -> Result<(), TrainError> {
    let clean = |dir: &Path| {
        atomic::remove_stale_temps(dir)
            .map(drop)
            .map_err(|e| TrainError::io("clean", dir, e))
    };
    clean(out_dir)?;
    for (_, dir) in all_checkpoint_dirs(out_dir)? {
        clean(&dir)?;
    }
    for dir in interrupted_writes(out_dir)? {
        std::fs::remove_dir_all(&dir).map_err(|e| TrainError::io("remove", &dir, e))?;
        say(format!(
            "note: removed {}, a checkpoint write that was interrupted",
            dir.display()
        ));
    }
    Ok(())
}

/// Locks `out_dir` (creating it) and decides how the run starts there ([`resolve_start`]);
/// removes what a killed run left before a resume. A folder that is refused keeps nothing of
/// this attempt (the lock file is removed again if it was new).
///
/// # Errors
/// Those of [`lock_folder`] and [`resolve_start`], and I/O errors.
pub(super) fn open_run_folder(
    out_dir: &Path,
    run_config: &RunConfig,
    options: &RunOptions,
    say: &dyn Fn(String),
) -> Result<(std::fs::File, Start), TrainError> {
    let lock_path = out_dir.join(LOCK_FILE);
    let had_lock_file = lock_path.exists();
    std::fs::create_dir_all(out_dir).map_err(|e| TrainError::io("create", out_dir, e))?;
    let lock = lock_folder(out_dir)?;
    let start = match resolve_start(out_dir, run_config, options, say) {
        Ok(start) => start,
        Err(e) => {
            if !had_lock_file {
                drop(lock);
                let _ = std::fs::remove_file(&lock_path);
            }
            return Err(e);
        }
    };
    if options.resume {
        remove_leftovers(out_dir, say)?;
    }
    Ok((lock, start))
}

/// Where a run starts, as [`resolve_start`] decides it.
pub(super) struct Start {
    /// The complete checkpoints to resume from, oldest first (the newest one that verifies is
    /// taken), or `None` for a fresh start.
    pub checkpoints: Option<Vec<(usize, PathBuf)>>,
    /// The settings this resume changes.
    pub changes: Vec<FieldChange>,
    /// The settings changed by earlier resumes.
    pub history: Vec<RecordedChange>,
}

impl Start {
    /// A fresh start.
    pub fn fresh() -> Self {
        Start {
            checkpoints: None,
            changes: Vec::new(),
            history: Vec::new(),
        }
    }
}

/// Refuses a folder holding files of something else than a run, unless forced: a run would
/// overwrite them (`metrics.csv`, `summary.json`, `loss.svg`).
fn refuse_foreign_files(out_dir: &Path, options: &RunOptions) -> Result<(), TrainError> {
    let foreign = std::fs::read_dir(out_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .find(|name| name != LOCK_FILE);
    match (options.force, foreign) {
        (false, Some(first)) => Err(TrainError::FolderNotEmpty {
            path: out_dir.to_path_buf(),
            first,
        }),
        _ => Ok(()),
    }
}

/// Decides between a fresh run and a resume, checking the folder and the config: the complete
/// checkpoints to resume from (or `None` for a fresh start), the settings this resume changes,
/// and the record of earlier changes.
fn resolve_start(
    out_dir: &Path,
    run_config: &RunConfig,
    options: &RunOptions,
    say: &dyn Fn(String),
) -> Result<Start, TrainError> {
    let config_path = out_dir.join("config.json");
    let checkpoints = list_checkpoints(out_dir)?;
    let fresh = Start::fresh();
    if !options.resume && (config_path.exists() || !checkpoints.is_empty()) {
        let what = match checkpoints.last() {
            Some((step, _)) => format!("checkpoints up to step {step}"),
            None => "a config.json".to_string(),
        };
        return Err(TrainError::RunExists {
            path: out_dir.to_path_buf(),
            what,
        });
    }
    if checkpoints.is_empty() {
        // A run killed before its first checkpoint (it has its config.json) starts again; a
        // folder of anything else is refused as for a fresh run, resume or not.
        if !config_path.exists() {
            refuse_foreign_files(out_dir, options)?;
        }
        if options.resume {
            say(format!(
                "no complete checkpoint in {}: starting a fresh run",
                out_dir.display()
            ));
        }
        return Ok(fresh);
    }
    let new: serde_json::Value =
        serde_json::from_str(&run_config.to_json()).expect("our own JSON parses");
    let old: Option<serde_json::Value> = match std::fs::read_to_string(&config_path) {
        Ok(text) => Some(
            serde_json::from_str(&text).map_err(|e| TrainError::Corrupt {
                path: config_path.clone(),
                message: e.to_string(),
                hint: "restore it from a copy, or train into a new folder",
            })?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && options.allow_config_change => None,
        Err(e) => return Err(TrainError::io("read", &config_path, e)),
    };
    let history: Vec<RecordedChange> = old
        .as_ref()
        .and_then(|old| old.get("changes"))
        .and_then(|c| serde_json::from_value(c.clone()).ok())
        .unwrap_or_default();
    let changes = old.map_or_else(Vec::new, |old| differing_fields(&old, &new));
    if !changes.is_empty() {
        let allowed = options.allow_config_change
            || changes.iter().all(|c| {
                let field = c.field.as_str();
                OPTIMISER_FIELDS.contains(&field) && options.allow_changes.contains(&field)
            });
        if !allowed {
            return Err(TrainError::ConfigMismatch {
                path: config_path,
                changes,
            });
        }
    }
    Ok(Start {
        checkpoints: Some(checkpoints),
        changes,
        history,
    })
}
