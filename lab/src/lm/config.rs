//! What defines a language-model training run, and what must not change when it is resumed.

use super::{LossKind, TrainError};
use crate::data::TokenizedCorpus;
use crate::schedule::WarmupCosine;
use coupled_qk::AttentionKernel;
use coupled_qk::model::GptConfig;
use serde::{Deserialize, Serialize};

/// Everything that defines one training run (besides the corpus).
///
/// A step is one optimiser update on `batch_size × grad_accum` windows of `seq_len` tokens:
/// `grad_accum` micro-batches of `batch_size` rows each, their gradients summed before the update
/// (the loss of each is scaled by `1/grad_accum`, so the update equals that of one large batch).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainConfig {
    /// The model (its `vocab_size` must be the tokenizer's).
    pub model: GptConfig,
    /// Tokens per training and evaluation window (at most `model.context`).
    pub seq_len: usize,
    /// Rows per micro-batch.
    pub batch_size: usize,
    /// Micro-batches per optimiser step (gradient accumulation).
    pub grad_accum: usize,
    /// Optimiser steps in all; the cosine schedule ends here.
    pub max_steps: usize,
    /// The peak learning rate.
    pub lr: f64,
    /// Steps of linear warmup to the peak.
    pub warmup_steps: usize,
    /// The learning rate at `max_steps`, as a fraction of the peak (cosine decay to it).
    pub min_lr_ratio: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// AdamW's `(β₁, β₂)`.
    pub betas: (f64, f64),
    /// Clip the global L2 norm of the gradient (all parameters together) to this; `None`: no clipping.
    pub grad_clip: Option<f64>,
    /// Evaluate every this many steps (and always at `max_steps`).
    pub eval_every: usize,
    /// At most this many validation windows (`None`: all that fit in the validation stream).
    pub eval_windows: Option<usize>,
    /// Rows per evaluation batch.
    pub eval_batch: usize,
    /// Write a metrics row every this many steps (and at every evaluation).
    pub log_every: usize,
    /// Checkpoint every this many steps (and always at the end).
    pub checkpoint_every: usize,
    /// Keep the newest this many checkpoints.
    pub keep_checkpoints: usize,
    /// Seeds the model's initialisation, the order of the training windows and each step's
    /// randomness (dropout).
    pub seed: u64,
    /// Weights a fresh run starts from instead of the random initialisation (fine-tuning,
    /// retrofitting coupling into a pretrained model); a resume takes its checkpoint's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_weights: Option<InitWeights>,
    /// How the token loss is computed, in training and evaluation: the fused linear
    /// cross-entropy (the default) or the explicit `log_softmax` of the full logits. The same
    /// function either way, so a resume may change it (as it may change the backend); a
    /// `config.json` without it loads as `fused`.
    #[serde(default)]
    pub loss: LossKind,
    /// How attention scores are computed in training: flash (the default: recomputed blockwise
    /// in the backward pass, memory linear in `seq_len`; no attention dropout) or explicit
    /// (`[batch, heads, seq, seq]` weights kept per layer). The same function either way, so a
    /// resume may change it; a `config.json` without it loads as `explicit`.
    #[serde(default)]
    pub attention_kernel: AttentionKernel,
}

/// A safetensors file a run starts from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "format", content = "path", rename_all = "kebab-case")]
pub enum InitWeights {
    /// The crate's own names ([`Gpt::save_safetensors`](coupled_qk::model::Gpt::save_safetensors)).
    Safetensors(std::path::PathBuf),
    /// A Hugging Face GPT-2 checkpoint
    /// ([`Gpt::load_gpt2_safetensors`](coupled_qk::model::Gpt::load_gpt2_safetensors)).
    Gpt2(std::path::PathBuf),
}

/// Fields that only decide what is written, never the trajectory: a resume may change them.
pub const BOOKKEEPING_FIELDS: [&str; 4] = [
    "eval_every",
    "log_every",
    "checkpoint_every",
    "keep_checkpoints",
];

/// Fields that change the optimiser's course but not the model: a resume may change them when
/// allowed ([`RunOptions::allow_changes`](super::RunOptions)), e.g. a lower learning rate after
/// a divergence; `config.json` records each change with its step.
pub const OPTIMISER_FIELDS: [&str; 6] = [
    "lr",
    "warmup_steps",
    "grad_clip",
    "max_steps",
    "min_lr_ratio",
    "weight_decay",
];

impl TrainConfig {
    /// The defaults for `model`: a window of its full context, 32 rows, 1000 steps, peak lr 6e-4
    /// after 100 warmup steps, cosine to 10%, AdamW (0.9, 0.95) with weight decay 0.1, gradients
    /// clipped to norm 1, evaluation every 100 steps, checkpoints every 500 (3 kept), seed 0, the
    /// fused loss.
    pub fn new(model: GptConfig) -> Self {
        TrainConfig {
            seq_len: model.context,
            model,
            batch_size: 32,
            grad_accum: 1,
            max_steps: 1000,
            lr: 6e-4,
            warmup_steps: 100,
            min_lr_ratio: 0.1,
            weight_decay: 0.1,
            betas: (0.9, 0.95),
            grad_clip: Some(1.0),
            eval_every: 100,
            eval_windows: None,
            eval_batch: 32,
            log_every: 10,
            checkpoint_every: 500,
            keep_checkpoints: 3,
            seed: 0,
            init_weights: None,
            loss: LossKind::Fused,
            attention_kernel: AttentionKernel::Flash,
        }
    }

    /// Checks every field (the model's included), naming the first that cannot work.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |field: &str, value: String, message: String| {
            Err(TrainError::Config {
                field: field.to_string(),
                value,
                message,
            })
        };
        self.model.validate()?;
        if self.attention_kernel == AttentionKernel::Flash && self.model.dropout > 0.0 {
            return bad(
                "attention_kernel",
                "flash".into(),
                format!(
                    "has no attention dropout, and the model's dropout is {}: set \
                     attention_kernel to explicit, or the dropout to 0",
                    self.model.dropout
                ),
            );
        }
        if self.seq_len == 0 || self.seq_len > self.model.context {
            return bad(
                "seq_len",
                self.seq_len.to_string(),
                format!(
                    "must be between 1 and the model's context ({})",
                    self.model.context
                ),
            );
        }
        for (field, value) in [
            ("batch_size", self.batch_size),
            ("grad_accum", self.grad_accum),
            ("max_steps", self.max_steps),
            ("eval_every", self.eval_every),
            ("eval_batch", self.eval_batch),
            ("log_every", self.log_every),
            ("checkpoint_every", self.checkpoint_every),
            ("keep_checkpoints", self.keep_checkpoints),
        ] {
            if value == 0 {
                return bad(field, "0".into(), "must be at least 1".into());
            }
        }
        let Some(per_step) = self.checked_tokens_per_step() else {
            return bad(
                "batch_size",
                self.batch_size.to_string(),
                format!(
                    "batch_size × grad_accum × seq_len = {} × {} × {} tokens per step overflows \
                     a 64-bit count",
                    self.batch_size, self.grad_accum, self.seq_len
                ),
            );
        };
        if per_step.checked_mul(self.max_steps as u64).is_none() {
            return bad(
                "max_steps",
                self.max_steps.to_string(),
                format!(
                    "{} steps × {per_step} tokens per step overflows a 64-bit token count",
                    self.max_steps
                ),
            );
        }
        if self.eval_windows == Some(0) {
            return bad(
                "eval_windows",
                "0".into(),
                "must be at least 1 (or None for all)".into(),
            );
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(
                "lr",
                self.lr.to_string(),
                "must be a positive number".into(),
            );
        }
        if self.warmup_steps > self.max_steps {
            return bad(
                "warmup_steps",
                self.warmup_steps.to_string(),
                format!("must be at most max_steps ({})", self.max_steps),
            );
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return bad(
                "min_lr_ratio",
                self.min_lr_ratio.to_string(),
                "must be in [0, 1]".into(),
            );
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(
                "weight_decay",
                self.weight_decay.to_string(),
                "must be ≥ 0".into(),
            );
        }
        let (b1, b2) = self.betas;
        if !((0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2)) {
            return bad(
                "betas",
                format!("({b1}, {b2})"),
                "both must be in [0, 1)".into(),
            );
        }
        if let Some(clip) = self.grad_clip
            && !(clip.is_finite() && clip > 0.0)
        {
            return bad(
                "grad_clip",
                clip.to_string(),
                "must be positive (or None)".into(),
            );
        }
        Ok(())
    }

    /// Also checks the config against the corpus it will train on.
    pub fn validate_for(&self, corpus: &TokenizedCorpus) -> Result<(), TrainError> {
        self.validate()?;
        if self.model.vocab_size != corpus.vocab_size {
            return Err(TrainError::Config {
                field: "model.vocab_size".into(),
                value: self.model.vocab_size.to_string(),
                message: format!(
                    "must equal the vocabulary of the `{}` tokenizer ({})",
                    corpus.tokenizer, corpus.vocab_size
                ),
            });
        }
        corpus.check_context(self.seq_len)?;
        // Rows are drawn at random starts; a micro-batch longer than the whole training stream
        // only repeats it, and at absurd sizes runs out of memory before the first step.
        let train_tokens = corpus.train.len() as u64;
        let rows_that_fit = (train_tokens / self.seq_len as u64).max(1);
        if self.batch_size as u64 > rows_that_fit {
            return Err(TrainError::Config {
                field: "batch_size".into(),
                value: self.batch_size.to_string(),
                message: format!(
                    "a micro-batch of {} windows of {} tokens holds more than the {train_tokens} \
                     training tokens of `{}`: use at most {rows_that_fit} rows (and grad_accum for \
                     more tokens per step)",
                    self.batch_size, self.seq_len, corpus.name
                ),
            });
        }
        Ok(())
    }

    /// Training tokens per optimiser step.
    ///
    /// # Panics
    /// If the product overflows `u64` ([`validate`](Self::validate) refuses such a config).
    pub fn tokens_per_step(&self) -> u64 {
        self.checked_tokens_per_step()
            .expect("batch_size × grad_accum × seq_len fits in u64 (validate checks it)")
    }

    /// `batch_size × grad_accum × seq_len`, or `None` if it overflows `u64`.
    pub fn checked_tokens_per_step(&self) -> Option<u64> {
        [self.batch_size, self.grad_accum, self.seq_len]
            .into_iter()
            .try_fold(1u64, |product, n| {
                product.checked_mul(u64::try_from(n).ok()?)
            })
    }

    /// The learning-rate schedule (indexed by 0-based step).
    pub fn schedule(&self) -> WarmupCosine {
        WarmupCosine {
            peak: self.lr,
            warmup: self.warmup_steps,
            total: self.max_steps,
            min_ratio: self.min_lr_ratio,
        }
    }
}

/// What `config.json` holds: the resolved [`TrainConfig`] and the corpus it trains on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunConfig {
    /// The training config, its fields at the top level of the JSON.
    #[serde(flatten)]
    pub train: TrainConfig,
    /// The corpus.
    pub corpus: CorpusInfo,
    /// Settings changed on resume, in order (see [`OPTIMISER_FIELDS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<RecordedChange>,
    /// The backend of the latest start or resume, as Burn names it (e.g. `autodiff<flex>`); a
    /// run may resume on another backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// How that backend ran the attention dynamics: `fused` (one op per layer, on Flex and
    /// NdArray) or `tensor-ops` (Burn tensor ops; every run recorded before the fused ops
    /// existed, whose `config.json` lacks the field). The same function either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamics_path: Option<String>,
}

/// A setting changed when a run was resumed, as `config.json` records it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RecordedChange {
    /// The step the run was resumed from: the change applies to the steps after it.
    pub step: usize,
    /// The field.
    pub field: String,
    /// Its value before (JSON text).
    pub old: String,
    /// Its value from then on (JSON text).
    pub new: String,
}

/// The corpus a run trains on, as recorded in `config.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CorpusInfo {
    /// The corpus's name.
    pub name: String,
    /// The tokenizer's id.
    pub tokenizer: String,
    /// The tokenizer's vocabulary size.
    pub vocab_size: usize,
    /// Tokens in the training stream.
    pub train_tokens: usize,
    /// Tokens in the validation stream.
    pub valid_tokens: usize,
    /// XXH64 of the training ids (as little-endian u32s), hex: an edited corpus of the same
    /// length is another corpus. `None` in a `config.json` written before the hashes were
    /// recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_hash: Option<String>,
    /// The same of the validation ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_hash: Option<String>,
}

impl RunConfig {
    /// The record of `train` on `corpus`.
    pub fn new(train: &TrainConfig, corpus: &TokenizedCorpus) -> Self {
        RunConfig {
            train: train.clone(),
            corpus: CorpusInfo {
                name: corpus.name.clone(),
                tokenizer: corpus.tokenizer.clone(),
                vocab_size: corpus.vocab_size,
                train_tokens: corpus.train.len(),
                valid_tokens: corpus.valid.len(),
                train_hash: Some(ids_hash(&corpus.train.ids)),
                valid_hash: Some(ids_hash(&corpus.valid.ids)),
            },
            changes: Vec::new(),
            backend: None,
            dynamics_path: None,
        }
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a RunConfig always serialises")
    }
}

/// XXH64 of token ids as little-endian u32s, in hex (the same whatever width they are stored in).
pub fn ids_hash(ids: &crate::data::TokenIds) -> String {
    use std::hash::Hasher;
    let mut hasher = twox_hash::XxHash64::with_seed(0);
    for i in 0..ids.len() {
        hasher.write(&ids.get(i).to_le_bytes());
    }
    format!("{:016x}", hasher.finish())
}

/// Fills in the model fields that a `config.json` written before they existed lacks, with their
/// defaults (what such a run computed), so that older runs still resume, load and match.
pub fn fill_model_defaults(run: &mut serde_json::Value) {
    let Some(model) = run.get_mut("model").and_then(|m| m.as_object_mut()) else {
        return;
    };
    let size = |key: &str| model.get(key).and_then(|v| v.as_u64()).map(|v| v as usize);
    let (Some(vocab), Some(d), Some(layers), Some(heads), Some(context)) = (
        size("vocab_size"),
        size("d_model"),
        size("n_layers"),
        size("n_heads"),
        size("context"),
    ) else {
        return;
    };
    let defaults = GptConfig::new(vocab, d, layers, heads, context);
    if let Ok(serde_json::Value::Object(defaults)) = serde_json::to_value(defaults) {
        for (key, value) in defaults {
            model.entry(key).or_insert(value);
        }
    }
}

/// One field whose value differs between a run's `config.json` and a new config.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldChange {
    /// The dotted path, e.g. `lr`, `model.d_model`, `corpus.name`.
    pub field: String,
    /// The value in `config.json` (JSON text; `absent` if missing).
    pub old: String,
    /// The new value (JSON text; `absent` if missing).
    pub new: String,
}

impl std::fmt::Display for FieldChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} → {})", self.field, self.old, self.new)
    }
}

/// The fields whose values differ between two `config.json` texts, leaving out
/// [`BOOKKEEPING_FIELDS`], the record of earlier changes, the backend and its dynamics path, the attention kernel and the loss's
/// [`LossKind`] (ways of computing the same function), and the corpus hashes where the old text
/// has none (it was written before they were recorded).
///
/// Both sides are compared as parsed JSON, so numbers compare by the text they were written as.
pub fn differing_fields(old: &serde_json::Value, new: &serde_json::Value) -> Vec<FieldChange> {
    let mut old = old.clone();
    fill_model_defaults(&mut old);
    let mut out = Vec::new();
    diff("", Some(&old), Some(new), &mut out);
    out.retain(|c| {
        !BOOKKEEPING_FIELDS.contains(&c.field.as_str())
            && c.field != "changes"
            && c.field != "backend"
            && c.field != "dynamics_path"
            && c.field != "loss"
            && c.field != "attention_kernel"
            // A config.json written before the corpus hashes were recorded cannot be checked
            // against them; its corpus name, tokenizer and token counts still are.
            && !(CORPUS_HASH_FIELDS.contains(&c.field.as_str()) && c.old == ABSENT)
    });
    out
}

/// The hashes of the corpus's ids in `config.json`.
const CORPUS_HASH_FIELDS: [&str; 2] = ["corpus.train_hash", "corpus.valid_hash"];

/// How [`FieldChange`] writes a missing value.
const ABSENT: &str = "absent";

fn diff(
    path: &str,
    old: Option<&serde_json::Value>,
    new: Option<&serde_json::Value>,
    out: &mut Vec<FieldChange>,
) {
    use serde_json::Value::Object;
    match (old, new) {
        (Some(Object(a)), Some(Object(b))) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let sub = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                diff(&sub, a.get(key), b.get(key), out);
            }
        }
        (a, b) if a != b => {
            let text = |v: Option<&serde_json::Value>| v.map_or(ABSENT.into(), |v| v.to_string());
            out.push(FieldChange {
                field: path.to_string(),
                old: text(a),
                new: text(b),
            });
        }
        _ => {}
    }
}
