//! What can stop an MQAR task or sweep, naming the field of [`Sweep`](super::Sweep) or
//! [`MqarTask`](super::MqarTask) involved; the program turns fields into its flags.

use std::path::PathBuf;

/// An error of the MQAR benchmark.
#[derive(Debug, thiserror::Error)]
pub enum MqarError {
    /// A task that breaks Zoology's constraints.
    #[error("MQAR task (vocab {vocab}, seq_len {seq_len}, kv_pairs {kv_pairs}): {rule}")]
    Task {
        /// The vocabulary size.
        vocab: usize,
        /// The sequence length.
        seq_len: usize,
        /// The key-value pairs.
        kv_pairs: usize,
        /// The rule broken.
        rule: TaskRule,
    },
    /// A count that must be at least 1.
    #[error("{field} = 0: must be at least 1")]
    Zero {
        /// The sweep's field.
        field: &'static str,
    },
    /// A list that must not be empty.
    #[error("{field}: give at least one value")]
    Empty {
        /// The sweep's field.
        field: &'static str,
    },
    /// A batch size outside `1..=train_examples`.
    #[error(
        "batch_size = {batch_size}: must be at least 1 and at most train_examples = {train_examples}"
    )]
    BatchSize {
        /// The batch size.
        batch_size: usize,
        /// The training examples.
        train_examples: usize,
    },
    /// A width that does not split into the heads.
    #[error("d_models: {d_model} must be a positive multiple of n_heads = {n_heads}")]
    Width {
        /// The width.
        d_model: usize,
        /// The heads.
        n_heads: usize,
    },
    /// A learning rate that is not finite and positive.
    #[error("lrs: {lr} is not a learning rate (finite and > 0)")]
    LearningRate {
        /// The value.
        lr: f64,
    },
    /// A variant whose dynamics cannot be built.
    #[error("variants: {variant}: {source}")]
    Variant {
        /// The variant's name.
        variant: String,
        /// Why.
        source: coupled_qk::ConfigError,
    },
    /// A batch that does not split over the devices.
    #[error("batch_size = {batch_size}: must be divisible by the number of devices ({devices})")]
    Devices {
        /// The batch size.
        batch_size: usize,
        /// The devices.
        devices: usize,
    },
    /// The output folder holds the results of a sweep with other settings.
    #[error("{} holds a different sweep (other settings)", path.display())]
    OtherSweep {
        /// Its `results.json`.
        path: PathBuf,
    },
    /// The output folder holds a `results.json` that is not one.
    #[error("{} is not a results file of an MQAR sweep: {message}", path.display())]
    NotResults {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// Reading or writing failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Which of Zoology's constraints an [`MqarTask`](super::MqarTask) breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TaskRule {
    /// `seq_len` must be even and positive.
    #[error("seq_len must be even and > 0")]
    SeqLen,
    /// `vocab` must exceed `seq_len`.
    #[error("vocab must exceed seq_len (Zoology's constraint)")]
    Vocab,
    /// `kv_pairs` must be in `1..=seq_len / 4` (then the keys, fewer than a quarter of the
    /// vocabulary, always fit in its half).
    #[error("kv_pairs must be in 1..=seq_len/4")]
    KvPairs,
}
