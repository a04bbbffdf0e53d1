//! A sweep of MQAR runs over variants, tasks, widths and learning rates, resumable: every
//! finished run is saved at once, and a rerun skips it.

use super::data::MqarTask;
use super::error::MqarError;
use super::train::{MqarRun, TrainOutcome, train};
use crate::atomic;
use burn::tensor::backend::AutodiffBackend;
use coupled_qk::model::AttentionVariant;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What the sweep varies, and what it holds fixed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    pub vocab: usize,
    /// `(seq_len, kv_pairs)` cells, easy to hard.
    pub tasks: Vec<(usize, usize)>,
    pub variants: Vec<AttentionVariant>,
    pub d_models: Vec<usize>,
    pub lrs: Vec<f64>,
    pub n_heads: usize,
    pub n_layers: usize,
    pub mlp: bool,
    pub batch_size: usize,
    pub train_examples: usize,
    pub test_examples: usize,
    pub steps: usize,
    pub eval_every: usize,
    /// Every cell runs once per seed: whether and when a run leaves the MQAR plateau varies from
    /// seed to seed, so one seed says little.
    pub seeds: Vec<u64>,
}

/// Identifies one run of a sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunKey {
    pub variant: AttentionVariant,
    pub seq_len: usize,
    pub kv_pairs: usize,
    pub d_model: usize,
    pub lr: f64,
    pub seed: u64,
}

/// One finished run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    pub key: RunKey,
    pub outcome: TrainOutcome,
    /// The backend it trained on, as Burn names it (e.g. `autodiff<flex>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// How it ran the attention dynamics: `fused` or `tensor-ops` (absent: tensor ops).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamics_path: Option<String>,
}

/// The sweep and every finished run: the content of `results.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepResults {
    pub sweep: Sweep,
    pub runs: Vec<RunResult>,
}

impl Sweep {
    /// Every run of the sweep, in order: task, width, seed, variant, learning rate (so that an
    /// interrupted sweep has compared the variants on the first seeds).
    pub fn keys(&self) -> Vec<RunKey> {
        let mut keys = Vec::new();
        for &(seq_len, kv_pairs) in &self.tasks {
            for &d_model in &self.d_models {
                for &seed in &self.seeds {
                    for variant in &self.variants {
                        for &lr in &self.lrs {
                            keys.push(RunKey {
                                variant: variant.clone(),
                                seq_len,
                                kv_pairs,
                                d_model,
                                lr,
                                seed,
                            });
                        }
                    }
                }
            }
        }
        keys
    }

    /// Checks every setting before any run starts.
    ///
    /// # Errors
    /// The first setting that cannot work, naming its field.
    pub fn validate(&self) -> Result<(), MqarError> {
        for (field, value) in [
            ("n_heads", self.n_heads),
            ("n_layers", self.n_layers),
            ("steps", self.steps),
            ("test_examples", self.test_examples),
            ("eval_every", self.eval_every),
        ] {
            if value == 0 {
                return Err(MqarError::Zero { field });
            }
        }
        for (field, len) in [
            ("tasks", self.tasks.len()),
            ("variants", self.variants.len()),
            ("d_models", self.d_models.len()),
            ("lrs", self.lrs.len()),
            ("seeds", self.seeds.len()),
        ] {
            if len == 0 {
                return Err(MqarError::Empty { field });
            }
        }
        for &(seq_len, kv_pairs) in &self.tasks {
            MqarTask::new(self.vocab, seq_len, kv_pairs).validate()?;
        }
        if self.batch_size == 0 || self.train_examples < self.batch_size {
            return Err(MqarError::BatchSize {
                batch_size: self.batch_size,
                train_examples: self.train_examples,
            });
        }
        if let Some(&d_model) = self
            .d_models
            .iter()
            .find(|&&d| d == 0 || !d.is_multiple_of(self.n_heads))
        {
            return Err(MqarError::Width {
                d_model,
                n_heads: self.n_heads,
            });
        }
        if let Some(&lr) = self.lrs.iter().find(|lr| !(lr.is_finite() && **lr > 0.0)) {
            return Err(MqarError::LearningRate { lr });
        }
        for variant in &self.variants {
            if let Err(source) = variant.dynamics().validate() {
                return Err(MqarError::Variant {
                    variant: variant.to_string(),
                    source,
                });
            }
        }
        Ok(())
    }

    fn run(&self, key: &RunKey) -> MqarRun {
        MqarRun {
            task: MqarTask::new(self.vocab, key.seq_len, key.kv_pairs),
            variant: key.variant.clone(),
            d_model: key.d_model,
            n_heads: self.n_heads,
            n_layers: self.n_layers,
            mlp: self.mlp,
            lr: key.lr,
            weight_decay: 0.1,
            batch_size: self.batch_size,
            train_examples: self.train_examples,
            test_examples: self.test_examples,
            steps: self.steps,
            eval_every: self.eval_every,
            seed: key.seed,
        }
    }

    /// Runs what `out/results.json` does not hold yet on `devices` (several: data-parallel),
    /// saving after every run.
    ///
    /// # Errors
    /// An invalid sweep, a batch that does not split over the devices, an output folder holding
    /// another sweep, and I/O errors.
    pub fn execute<B: AutodiffBackend>(
        &self,
        out: &Path,
        devices: &[B::Device],
    ) -> Result<SweepResults, MqarError> {
        self.validate()?;
        if devices.is_empty() || !self.batch_size.is_multiple_of(devices.len()) {
            return Err(MqarError::Devices {
                batch_size: self.batch_size,
                devices: devices.len(),
            });
        }
        let path = out.join("results.json");
        let mut results = load(&path)?.unwrap_or_else(|| SweepResults {
            sweep: self.clone(),
            runs: Vec::new(),
        });
        if results.sweep != *self {
            return Err(MqarError::OtherSweep { path });
        }
        let keys = self.keys();
        let todo: Vec<&RunKey> = keys
            .iter()
            .filter(|k| !results.runs.iter().any(|r| &r.key == *k))
            .collect();
        eprintln!(
            "MQAR sweep: {} runs, {} done, {} to go; results in {}",
            keys.len(),
            keys.len() - todo.len(),
            todo.len(),
            path.display()
        );
        let style = ProgressStyle::with_template(
            "{prefix:>34} [{bar:24}] {pos:>5}/{len} {elapsed:>4} eta {eta:>4} {msg}",
        )
        .unwrap()
        .progress_chars("=> ");
        for (i, key) in todo.iter().enumerate() {
            let progress = ProgressBar::new(self.steps as u64).with_style(style.clone());
            progress.set_prefix(format!(
                "{}/{} {} L{} D{} d{} lr{:.0e} s{}",
                i + 1,
                todo.len(),
                key.variant,
                key.seq_len,
                key.kv_pairs,
                key.d_model,
                key.lr,
                key.seed
            ));
            let outcome = train::<B>(&self.run(key), devices, &progress);
            progress.finish_with_message(format!(
                "acc {:.3} in {} steps, {:.0}s{}",
                outcome.accuracy,
                outcome.steps,
                outcome.seconds,
                if outcome.diverged { ", diverged" } else { "" }
            ));
            results.runs.push(RunResult {
                key: (*key).clone(),
                outcome,
                backend: Some(B::name(&devices[0])),
                dynamics_path: Some(coupled_qk::dynamics::dynamics_path::<B>().to_string()),
            });
            save(&path, &results)?;
        }
        Ok(results)
    }
}

fn load(path: &Path) -> Result<Option<SweepResults>, MqarError> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| MqarError::NotResults {
                path: path.to_path_buf(),
                message: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(MqarError::Io {
            action: "read",
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn save(path: &Path, results: &SweepResults) -> Result<(), MqarError> {
    let json = serde_json::to_vec_pretty(results).expect("results serialise");
    atomic::write(path, &json).map_err(|source| MqarError::Io {
        action: "write",
        path: path.to_path_buf(),
        source,
    })
}
