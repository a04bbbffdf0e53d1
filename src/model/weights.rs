//! A [`Gpt`]'s weights as safetensors, through burn-store: the crate's own names in and out, and
//! Hugging Face GPT-2 checkpoints in (feature `safetensors`).
//!
//! The crate's names are the module paths without enum variants: `tokens.weight`,
//! `positions.weight`, `blocks.0.norm_attention.gamma`, `blocks.0.attention.query.weight`,
//! `blocks.0.attention.dynamics.coupling.w1`, `blocks.0.mlp.up.weight`, `norm.beta`, … Linear
//! weights are Burn's `[in, out]`.

use super::Gpt;
use burn::module::ParamId;
use burn::tensor::TensorData;
use burn::tensor::backend::Backend;
use burn_store::{ApplyResult, ModuleSnapshot, ModuleStore, SafetensorsStore, TensorSnapshot};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Why weights could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The file could not be written or read.
    #[error("{}: cannot {action}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not readable safetensors.
    #[error("{}: not a readable safetensors file: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// burn-store's message.
        message: String,
    },
    /// The file's tensors do not fit the model: names or shapes.
    #[error("{}: the weights do not fit the model: {}; {hint}", path.display(), problems.join("; "))]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// Each tensor that is missing, left over or of another shape.
        problems: Vec<String>,
        /// What to do.
        hint: &'static str,
    },
}

impl<B: Backend> Gpt<B> {
    /// Writes every parameter to `path` as safetensors, under the crate's names. The file appears
    /// whole or not at all (written beside it, then renamed).
    ///
    /// # Errors
    /// I/O errors, named with the path.
    pub fn save_safetensors(&self, path: &Path) -> Result<(), WeightsError> {
        let mut store = SafetensorsStore::from_bytes(None).skip_enum_variants(true);
        self.save_into(&mut store)
            .map_err(|e| format_error(path, e))?;
        let bytes = store.get_bytes().map_err(|e| format_error(path, e))?;
        write_atomically(path, &bytes)
    }

    /// This model with the parameters of a file written by
    /// [`save_safetensors`](Self::save_safetensors) for the same config.
    ///
    /// # Errors
    /// An unreadable file, and any tensor missing, left over or of another shape (all named).
    pub fn load_safetensors(mut self, path: &Path) -> Result<Self, WeightsError> {
        // Read only: `apply` takes its own settings (enum variants skipped, every problem kept).
        let mut store = SafetensorsStore::from_file(path);
        let snapshots = read_all(&mut store, path)?;
        let result = self.apply(snapshots, None, None, true);
        check(
            &result,
            path,
            |_| false,
            "save and load with the same GptConfig",
        )?;
        Ok(self)
    }

    /// This model with the weights of a Hugging Face GPT-2 checkpoint (`model.safetensors` of
    /// `GPT2LMHeadModel` or `GPT2Model`: `transformer.h.N.attn.c_attn.weight`, … with or without
    /// the `transformer.` prefix). The model must have GPT-2's shape
    /// ([`GptConfig::gpt2`](super::GptConfig::gpt2) with the checkpoint's sizes and
    /// `layer_norm_epsilon`). Conv1D weights are `[in, out]` like
    /// Burn's; the fused `c_attn` is split into the query, key and value projections; the head
    /// is tied to the token embedding, as in GPT-2. Parameters GPT-2 does not have (the coupling
    /// nets and `dt` of a coupled variant) keep their initial values: with `dt = 0` (Euler,
    /// leapfrog) or the affine coupling's zero-initialised nets the model computes exactly what
    /// GPT-2 does; MLP-only's `q + f(q)` has no `dt` and starts elsewhere.
    ///
    /// # Errors
    /// An unreadable file; a GPT-2 tensor with no place in the model, or of another shape; a
    /// parameter of the model's GPT-2 part that the file lacks.
    pub fn load_gpt2_safetensors(mut self, path: &Path) -> Result<Self, WeightsError> {
        let mut store = SafetensorsStore::from_file(path);
        let tensors = read_all(&mut store, path)?;
        let mut snapshots = Vec::new();
        let mut problems = Vec::new();
        for tensor in tensors {
            let name = tensor.full_path();
            let data = tensor.to_data().map_err(|e| WeightsError::Format {
                path: path.to_path_buf(),
                message: format!("tensor `{name}`: {e:?}"),
            })?;
            match gpt2_to_crate(&name, data) {
                Ok(mapped) => {
                    snapshots.extend(mapped.into_iter().map(|(ours, data)| snapshot(&ours, data)))
                }
                Err(problem) => problems.push(problem),
            }
        }
        if !problems.is_empty() {
            return Err(WeightsError::Mismatch {
                path: path.to_path_buf(),
                problems,
                hint: "is this a GPT-2 checkpoint (GPT2LMHeadModel's safetensors)?",
            });
        }
        let result = self.apply(snapshots, None, None, true);
        check(
            &result,
            path,
            |name| name.contains(".dynamics."),
            "build the model with GptConfig::gpt2 and the checkpoint's config.json sizes",
        )?;
        Ok(self)
    }
}

/// The crate's tensors for one GPT-2 tensor; `Ok(vec![])` for those it has no use for (the
/// causal-mask buffers of old checkpoints, a stored copy of the tied head); `Err` says why a
/// tensor has no place here.
fn gpt2_to_crate(name: &str, data: TensorData) -> Result<Vec<(String, TensorData)>, String> {
    // Whatever the file's precision (f16, bf16), the model's parameters are f32.
    let data = data.convert::<f32>();
    let short = name.strip_prefix("transformer.").unwrap_or(name);
    let one = |ours: String| Ok(vec![(ours, data.clone())]);
    let norm = |param: &str| match param {
        "weight" => Some("gamma"),
        "bias" => Some("beta"),
        _ => None,
    };
    let parts: Vec<&str> = short.split('.').collect();
    match parts.as_slice() {
        ["wte", "weight"] => one("tokens.weight".into()),
        ["wpe", "weight"] => one("positions.weight".into()),
        ["lm_head", "weight"] => Ok(vec![]), // tied: the token embedding
        ["ln_f", param] => match norm(param) {
            Some(ours) => one(format!("norm.{ours}")),
            None => Err(format!("unknown tensor `{name}`")),
        },
        ["h", layer, "attn", "bias" | "masked_bias"] if layer.parse::<usize>().is_ok() => {
            Ok(vec![])
        }
        ["h", layer, rest @ ..] if layer.parse::<usize>().is_ok() => {
            let block = format!("blocks.{layer}");
            match rest {
                ["ln_1", param] if norm(param).is_some() => {
                    one(format!("{block}.norm_attention.{}", norm(param).unwrap()))
                }
                ["ln_2", param] if norm(param).is_some() => {
                    one(format!("{block}.norm_mlp.{}", norm(param).unwrap()))
                }
                ["attn", "c_attn", param @ ("weight" | "bias")] => {
                    let [q, k, v] = split_last_dim_in_three(&data).ok_or_else(|| {
                        format!("`{name}`: shape {:?} does not split in three", data.shape)
                    })?;
                    Ok(["query", "key", "value"]
                        .into_iter()
                        .zip([q, k, v])
                        .map(|(proj, d)| (format!("{block}.attention.{proj}.{param}"), d))
                        .collect())
                }
                ["attn", "c_proj", param @ ("weight" | "bias")] => {
                    one(format!("{block}.attention.output.{param}"))
                }
                ["mlp", "c_fc", param @ ("weight" | "bias")] => {
                    one(format!("{block}.mlp.up.{param}"))
                }
                ["mlp", "c_proj", param @ ("weight" | "bias")] => {
                    one(format!("{block}.mlp.down.{param}"))
                }
                _ => Err(format!("unknown tensor `{name}`")),
            }
        }
        _ => Err(format!("unknown tensor `{name}`")),
    }
}

/// `[.., 3n]` → three `[.., n]` along the last dimension (GPT-2's fused q|k|v), as f32.
fn split_last_dim_in_three(data: &TensorData) -> Option<[TensorData; 3]> {
    let shape = data.shape.to_vec();
    let last = *shape.last()?;
    if last == 0 || !last.is_multiple_of(3) {
        return None;
    }
    let n = last / 3;
    let values = data.clone().convert::<f32>().to_vec::<f32>().ok()?;
    let mut parts = [Vec::new(), Vec::new(), Vec::new()];
    for row in values.chunks(last) {
        for (i, part) in parts.iter_mut().enumerate() {
            part.extend_from_slice(&row[i * n..(i + 1) * n]);
        }
    }
    let mut part_shape = shape;
    *part_shape.last_mut()? = n;
    Some(parts.map(|p| TensorData::new(p, part_shape.clone())))
}

fn snapshot(path: &str, data: TensorData) -> TensorSnapshot {
    let path_stack = path.split('.').map(str::to_string).collect();
    TensorSnapshot::from_data(data, path_stack, Vec::new(), ParamId::new())
}

fn read_all(
    store: &mut SafetensorsStore,
    path: &Path,
) -> Result<Vec<TensorSnapshot>, WeightsError> {
    if !path.is_file() {
        return Err(WeightsError::Io {
            path: path.to_path_buf(),
            action: "read",
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        });
    }
    let all: &BTreeMap<String, TensorSnapshot> = store
        .get_all_snapshots()
        .map_err(|e| format_error(path, e))?;
    Ok(all.values().cloned().collect())
}

/// Every error, every left-over tensor, and every missing parameter that `may_miss` does not
/// excuse, as one [`WeightsError::Mismatch`].
fn check(
    result: &ApplyResult,
    path: &Path,
    may_miss: impl Fn(&str) -> bool,
    hint: &'static str,
) -> Result<(), WeightsError> {
    let mut problems: Vec<String> = result.errors.iter().map(|e| format!("{e:?}")).collect();
    problems.extend(
        result
            .missing
            .iter()
            .filter(|(name, _)| !may_miss(name))
            .map(|(name, _)| format!("`{name}` is not in the file")),
    );
    problems.extend(
        result
            .unused
            .iter()
            .map(|name| format!("`{name}` has no place in the model")),
    );
    match problems.is_empty() {
        true => Ok(()),
        false => Err(WeightsError::Mismatch {
            path: path.to_path_buf(),
            problems,
            hint,
        }),
    }
}

fn format_error(path: &Path, error: impl std::fmt::Debug) -> WeightsError {
    WeightsError::Format {
        path: path.to_path_buf(),
        message: format!("{error:?}"),
    }
}

/// Writes `bytes` to a temporary file beside `path`, syncs it, renames it over `path` and syncs
/// the folder: a crash leaves the old file or the new one, never a torn one.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), WeightsError> {
    let io = |action, source| WeightsError::Io {
        path: path.to_path_buf(),
        action,
        source,
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io("write", std::io::Error::other("the path names no file")))?;
    let temp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = std::fs::File::create(&temp).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&temp, path)) {
        let _ = std::fs::remove_file(&temp);
        return Err(io("write", e));
    }
    // The rename is durable once the folder is synced (not possible on every platform).
    if let Ok(folder) = std::fs::File::open(&dir) {
        let _ = folder.sync_all();
    }
    Ok(())
}
