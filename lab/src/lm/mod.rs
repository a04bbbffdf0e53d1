//! Language-model training: a GPT on a tokenised corpus, with AdamW, warmup + cosine, gradient
//! accumulation, periodic evaluation, checkpoints with exact resume, and a folder of outputs per
//! run. See docs/training.md.

mod attention_diagnostics;
mod attention_log;
mod checkpoint;
mod clip;
mod config;
mod csv_row;
mod dynamics_log;
mod error;
mod eval;
mod eval_log;
mod loss;
mod manifest;
mod metrics;
mod parallel;
mod plot;
mod probe_logs;
mod run;
mod run_folder;
mod task;
mod train;
mod trainer;

pub use attention_diagnostics::{
    AttentionDiagnostics, DIAGNOSTIC_POSITIONS, DIAGNOSTIC_WINDOWS, MAX_LEADING_RATIO, diagnose,
    gpt_attention_diagnostics,
};
pub use attention_log::{ATTENTION_HEADER, AttentionLog, AttentionRow, write_attention_plot};
pub use checkpoint::{
    CheckpointState, REJECTED_NOTE, checkpoint_dir, checkpoints_dir, list_checkpoints,
    load_checkpoint, load_trained, prune_checkpoints, save_checkpoint, unverified_warning,
};
pub use clip::{clip_global_norm, clip_to_norm};
pub use config::{
    BOOKKEEPING_FIELDS, CorpusInfo, FieldChange, InitWeights, OPTIMISER_FIELDS, RecordedChange,
    RunConfig, TrainConfig, differing_fields, fill_model_defaults,
};
pub use csv_row::RowError;
pub use dynamics_log::{DYNAMICS_HEADER, DynamicsLog, DynamicsRow, write_dynamics_plot};
pub use error::TrainError;
pub use eval::{Validation, batch_loss, batch_nats, batch_tensors, evaluate};
pub use eval_log::{EvalLog, EvalRow};
pub use loss::{LossKind, UnknownLoss};
pub use manifest::{Damage, MANIFEST_FILE, Verification, verify_checkpoint};
pub use metrics::{HEADER, MetricsLog, MetricsRow, read_metrics, read_metrics_until};
pub use parallel::{batch_gradients, sharded_gradients, share_of_rows};
pub use plot::write_loss_plot;
pub use probe_logs::ProbeLogs;
pub use run::{RunOptions, RunSummary};
pub use task::TrainingRun;
pub use train::{train, train_in_group, train_on_devices, train_with};
pub use trainer::Trainer;
