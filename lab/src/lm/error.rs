//! What can stop a training run, each naming the path involved and what to do about it.

use super::{Damage, FieldChange};
use crate::data::DataError;
use std::path::PathBuf;

/// An error of the training harness.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The ranks of a data-parallel group disagree, or another rank failed.
    #[error("{0}")]
    Group(String),
    /// A collective operation between the ranks did not complete.
    #[error("the ranks could not exchange their state: {0}")]
    Collective(#[from] crate::dist::CollectiveError),
    /// A setting that cannot work.
    #[error("invalid training config: {field} = {value}: {message}")]
    Config {
        /// The field (a dotted path for nested ones).
        field: String,
        /// Its value.
        value: String,
        /// What it must be.
        message: String,
    },
    /// A model config that cannot be built.
    #[error("invalid model config: {0}")]
    Model(#[from] coupled_qk::ConfigError),
    /// The corpus cannot give the windows the config asks for.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The weights a run starts from do not load.
    #[error("cannot start from these weights: {0}")]
    Weights(#[from] coupled_qk::model::WeightsError),
    /// Reading or writing a file failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done (read, write, …).
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A fresh run into a folder that already holds one.
    #[error(
        "{} already holds a run ({}); resume it or choose another output folder",
        path.display(),
        what
    )]
    RunExists {
        /// The output folder.
        path: PathBuf,
        /// What was found there.
        what: String,
    },
    /// A fresh run into a folder that holds files of something else: the run would overwrite
    /// them (`metrics.csv`, `summary.json`, `loss.svg`) and prune checkpoints it did not write.
    #[error(
        "{} is not empty and holds no run ({} among its files); choose an empty or new output \
         folder, or force the run into it",
        path.display(),
        first
    )]
    FolderNotEmpty {
        /// The output folder.
        path: PathBuf,
        /// One of the entries found there.
        first: String,
    },
    /// Another process trains in the same folder (it holds the folder's lock).
    #[error(
        "{} is in use by {}: two processes must not train one run; wait for it to end or \
         stop it, or choose another output folder",
        path.display(),
        holder
    )]
    RunInUse {
        /// The output folder.
        path: PathBuf,
        /// Who holds it, as its lock file says (`process 1234`).
        holder: String,
    },
    /// A resume whose config differs from the one the run was started with.
    #[error(
        "cannot resume the run in {}: the new config differs from its config.json in {}. \
         Resume with the run's own settings, or start a new output folder (the optimiser's \
         settings, lr, warmup_steps, grad_clip, max_steps, min_lr_ratio and weight_decay, may \
         change on resume where the program allows it)",
        path.display(),
        changes.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
    )]
    ConfigMismatch {
        /// The run's `config.json`.
        path: PathBuf,
        /// The fields that differ.
        changes: Vec<FieldChange>,
    },
    /// A file of the run that does not parse (config.json, metrics.csv, a checkpoint).
    #[error("{} is unreadable: {message}. {hint}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
        /// What to do.
        hint: &'static str,
    },
    /// A checkpoint file whose bytes are not those its manifest records, or that does not
    /// decode: the checkpoint is not used.
    #[error(
        "checkpoint file {} is {damage}. This checkpoint cannot be used: delete its folder to \
         fall back to the previous checkpoint (a resume skips it by itself)",
        path.display()
    )]
    CheckpointCorrupt {
        /// The damaged file (the manifest, where it is the manifest that is damaged).
        path: PathBuf,
        /// What is wrong with it.
        damage: Damage,
    },
    /// A resume where every checkpoint of the run is damaged.
    #[error(
        "cannot resume the run in {}: none of its checkpoints verifies ({}). Restore the \
         checkpoints from a copy, or start the run afresh in a new folder",
        path.display(),
        rejected
            .iter()
            .map(|(file, damage)| format!("{} is {damage}", file.display()))
            .collect::<Vec<_>>()
            .join("; ")
    )]
    NoGoodCheckpoint {
        /// The run's folder.
        path: PathBuf,
        /// Each checkpoint's damaged file and its damage, newest first.
        rejected: Vec<(PathBuf, Damage)>,
    },
    /// A checkpoint whose model is not the one the run's config describes (an edited
    /// `config.json`, or a checkpoint copied from another run).
    #[error(
        "the checkpoint {} holds another model than {} describes, in {} (the checkpoint's \
         value first). Restore the config the run was trained with, or start a new run",
        checkpoint.display(),
        config.display(),
        changes.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
    )]
    CheckpointMismatch {
        /// The checkpoint folder.
        checkpoint: PathBuf,
        /// The config it was compared with.
        config: PathBuf,
        /// The model fields that differ.
        changes: Vec<FieldChange>,
    },
    /// A non-finite training (or final validation) loss: the run stops before its state is
    /// checkpointed.
    #[error(
        "the loss is {loss} at step {step}: training stopped. {}",
        match checkpoint {
            Some(path) => format!(
                "The last good checkpoint, {}, is kept; resume from it with a lower learning \
                 rate or a longer warmup",
                path.display()
            ),
            None => "No checkpoint was written before it; lower the learning rate (or raise the \
                     warmup) and start again"
                .to_string(),
        }
    )]
    NonFinite {
        /// The step (1-based) whose loss was not finite.
        step: usize,
        /// The loss.
        loss: f64,
        /// The newest checkpoint on disk that verifies against its manifest (all checkpoints'
        /// weights gave finite losses).
        checkpoint: Option<PathBuf>,
    },
    /// The loss plot could not be drawn.
    #[error("cannot draw the loss plot {}: {message}", path.display())]
    Plot {
        /// The plot's path.
        path: PathBuf,
        /// The cause.
        message: String,
    },
}

impl TrainError {
    /// An I/O error on `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TrainError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
