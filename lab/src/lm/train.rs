//! Training entry points ([`train`], [`train_with`], [`train_on_devices`],
//! [`train_in_group`]) over a [`Trainer`].

use super::trainer::Trainer;
use super::{RunOptions, RunSummary, TrainConfig, TrainError};
use crate::data::TokenizedCorpus;
use crate::dist::ProcessGroup;
use coupled_qk::model::FusedOps;
use std::path::Path;

/// Trains `config.model` on `corpus`, writing `config.json`, `metrics.csv`, `loss.svg`,
/// `summary.json` and `checkpoints/` into `out_dir`; `resume` continues the run there.
pub fn train<B: FusedOps>(
    config: &TrainConfig,
    corpus: &TokenizedCorpus,
    out_dir: &Path,
    resume: bool,
    device: &B::Device,
) -> Result<RunSummary, TrainError> {
    let options = RunOptions {
        resume,
        ..Default::default()
    };
    train_with::<B>(config, corpus, out_dir, &options, device)
}

/// [`train`] with all its options: [`train_on_devices`] on one device.
pub fn train_with<B: FusedOps>(
    config: &TrainConfig,
    corpus: &TokenizedCorpus,
    out_dir: &Path,
    options: &RunOptions,
    device: &B::Device,
) -> Result<RunSummary, TrainError> {
    train_on_devices::<B>(
        config,
        corpus,
        out_dir,
        options,
        std::slice::from_ref(device),
    )
}

/// [`train_with`] data-parallel over several devices of one backend.
///
/// Every micro-batch's `batch_size` rows are split into `devices.len()` equal shards (so
/// `batch_size` must be divisible by the device count); each device runs forward and backward on
/// its shard with a fork of the model, at once on the threads of rayon's pool
/// ([`sharded_gradients`](super::sharded_gradients)), its loss scaled so
/// that the shards' gradients sum to the one-device gradient of the whole micro-batch. The
/// gradients are moved to the main device, `devices[0]`, and summed there; clipping and the
/// AdamW step then run once, on the main device, which also holds the optimiser state, evaluates
/// and writes the checkpoints. Data order, schedule, checkpoints and resume are those of one
/// device; with one device this is exactly [`train_with`].
///
/// # Errors
/// Those of [`train_with`], and [`TrainError::Config`] for no device or a `batch_size` not
/// divisible by the device count.
pub fn train_on_devices<B: FusedOps>(
    config: &TrainConfig,
    corpus: &TokenizedCorpus,
    out_dir: &Path,
    options: &RunOptions,
    devices: &[B::Device],
) -> Result<RunSummary, TrainError> {
    Trainer::<B>::prepare(config, corpus, out_dir, options, devices)?.run()
}

/// [`train_on_devices`] as one rank of a data-parallel `group` (see
/// [`Trainer::prepare_in_group`]): every rank calls it with the same arguments; each computes
/// the gradient of its share of every micro-batch over its `devices`, the ranks average their
/// gradients once per optimiser step, and rank 0 alone evaluates and writes `out_dir`. Every
/// rank returns a summary of the run (rank 0's has the metrics and validation; the others' only
/// the counts).
///
/// # Errors
/// Those of [`train_on_devices`] on every rank (a non-finite loss on any rank stops all of them),
/// and [`TrainError::Group`] or [`TrainError::Collective`] when the ranks disagree or cannot
/// exchange their state.
pub fn train_in_group<B: FusedOps>(
    config: &TrainConfig,
    corpus: &TokenizedCorpus,
    out_dir: &Path,
    options: &RunOptions,
    devices: &[B::Device],
    group: &dyn ProcessGroup,
) -> Result<RunSummary, TrainError> {
    Trainer::<B>::prepare_in_group(config, corpus, out_dir, options, devices, group)?.run()
}
