//! Pretrained GPT-2 checkpoints: where one lies (a file, a folder or a Hugging Face Hub model
//! id) and the [`GptConfig`] its `config.json` describes.

use crate::data::{DataError, Hub};
use coupled_qk::model::GptConfig;
use std::path::{Path, PathBuf};

/// A GPT-2 checkpoint on disk: its weights and the model they fit (standard attention).
#[derive(Clone, Debug)]
pub struct Gpt2Checkpoint {
    /// `model.safetensors` in Hugging Face's GPT-2 layout.
    pub weights: PathBuf,
    /// GPT-2's shape with the checkpoint's sizes ([`GptConfig::gpt2`]).
    pub config: GptConfig,
}

impl Gpt2Checkpoint {
    /// Finds a checkpoint: `from` is a `.safetensors` file with `config.json` beside it, a
    /// folder holding both, or (when no such path exists) a Hub model id such as
    /// `openai-community/gpt2`, whose two files are downloaded through `hub` (and cached).
    ///
    /// # Errors
    /// No such file, folder or Hub model; a `config.json` that is not GPT-2's or describes a
    /// variant the crate's GPT does not compute (another activation, an MLP width other than
    /// 4×, scaled attention by layer, untied embeddings).
    pub fn locate(from: &str, hub: &Hub) -> Result<Self, DataError> {
        let path = Path::new(from);
        let (weights, config_path) = if path.is_file() {
            let folder = path.parent().unwrap_or(Path::new("."));
            (path.to_path_buf(), folder.join("config.json"))
        } else if path.is_dir() {
            (path.join("model.safetensors"), path.join("config.json"))
        } else if is_hub_id(from) {
            (
                hub.model_file(from, "model.safetensors")?,
                hub.model_file(from, "config.json")?,
            )
        } else {
            return Err(DataError::Invalid(format!(
                "{from}: no such file or folder, and not a Hub model id (owner/name, e.g. \
                 openai-community/gpt2)"
            )));
        };
        for file in [&weights, &config_path] {
            if !file.is_file() {
                return Err(DataError::Invalid(format!(
                    "{}: missing; a GPT-2 checkpoint is model.safetensors and config.json in one folder",
                    file.display()
                )));
            }
        }
        let text = std::fs::read_to_string(&config_path)
            .map_err(|e| DataError::io("read", &config_path, e))?;
        let config = gpt2_config(&text)
            .map_err(|why| DataError::Invalid(format!("{}: {why}", config_path.display())))?;
        Ok(Self { weights, config })
    }
}

/// `owner/name`: one slash, neither part empty.
fn is_hub_id(s: &str) -> bool {
    let mut parts = s.split('/');
    matches!(
        (parts.next(), parts.next(), parts.next()),
        (Some(owner), Some(name), None) if !owner.is_empty() && !name.is_empty()
    )
}

/// Why a Hugging Face `config.json` does not give a GPT the crate computes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Gpt2ConfigError {
    /// Not JSON.
    #[error("not JSON: {0}")]
    NotJson(String),
    /// Another architecture.
    #[error("model_type is {0}, not \"gpt2\"")]
    NotGpt2(String),
    /// A size that is not a positive integer.
    #[error("`{key}` is {found}, expected a positive integer")]
    Size {
        /// The key.
        key: &'static str,
        /// Its value, as JSON.
        found: String,
    },
    /// A setting of GPT-2 that the crate's GPT does not compute.
    #[error("`{key}` is {found}; the crate's GPT computes {supported} only")]
    Unsupported {
        /// The key.
        key: &'static str,
        /// Its value, as JSON.
        found: String,
        /// What the crate computes.
        supported: &'static str,
    },
}

impl Gpt2ConfigError {
    /// The key of `config.json` involved, if one.
    pub fn key(&self) -> Option<&'static str> {
        match self {
            Self::NotJson(_) => None,
            Self::NotGpt2(_) => Some("model_type"),
            Self::Size { key, .. } | Self::Unsupported { key, .. } => Some(key),
        }
    }
}

/// The [`GptConfig`] of a Hugging Face GPT-2 `config.json`, or why the crate's GPT cannot
/// compute that model.
///
/// # Errors
/// Not JSON, not GPT-2, a size that is not a positive integer, or a setting the crate's GPT
/// does not compute.
pub fn gpt2_config(json: &str) -> Result<GptConfig, Gpt2ConfigError> {
    let c: serde_json::Value =
        serde_json::from_str(json).map_err(|e| Gpt2ConfigError::NotJson(e.to_string()))?;
    if c["model_type"].as_str() != Some("gpt2") {
        return Err(Gpt2ConfigError::NotGpt2(c["model_type"].to_string()));
    }
    let size = |key: &'static str| {
        c[key]
            .as_u64()
            .filter(|&v| v > 0)
            .map(|v| v as usize)
            .ok_or_else(|| Gpt2ConfigError::Size {
                key,
                found: c[key].to_string(),
            })
    };
    let (vocab, context, d, layers, heads) = (
        size("vocab_size")?,
        size("n_positions")?,
        size("n_embd")?,
        size("n_layer")?,
        size("n_head")?,
    );
    let unsupported = |key: &'static str, supported: &'static str| {
        Err(Gpt2ConfigError::Unsupported {
            key,
            found: c[key].to_string(),
            supported,
        })
    };
    match c["activation_function"].as_str() {
        None | Some("gelu_new") | Some("gelu_pytorch_tanh") => {}
        _ => return unsupported("activation_function", "gelu_new"),
    }
    if !(c["n_inner"].is_null() || c["n_inner"].as_u64() == Some(4 * d as u64)) {
        return unsupported("n_inner", "null (4 × n_embd)");
    }
    for key in ["scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"] {
        if c[key].as_bool().unwrap_or(false) {
            return unsupported(key, "false");
        }
    }
    if !c["tie_word_embeddings"].as_bool().unwrap_or(true) {
        return unsupported("tie_word_embeddings", "true");
    }
    let epsilon = c["layer_norm_epsilon"].as_f64().unwrap_or(1e-5);
    Ok(GptConfig::gpt2(vocab, context, d, layers, heads).with_norm_epsilon(epsilon))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPT2_SMALL: &str = r#"{"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
        "n_embd": 768, "n_layer": 12, "n_head": 12, "activation_function": "gelu_new",
        "n_inner": null, "layer_norm_epsilon": 1e-05}"#;

    #[test]
    fn gpt2_small_config_gives_its_shape() {
        let config = gpt2_config(GPT2_SMALL).unwrap();
        assert_eq!(
            (
                config.vocab_size,
                config.context,
                config.d_model,
                config.n_layers,
                config.n_heads
            ),
            (50257, 1024, 768, 12, 12)
        );
        assert!(config.gelu_tanh && config.tie_embeddings && config.mlp_ratio == 4);
    }

    #[test]
    fn configs_the_gpt_cannot_compute_are_refused_naming_the_key() {
        for (key, value) in [
            ("activation_function", serde_json::json!("relu")),
            ("n_inner", serde_json::json!(1000)),
            ("scale_attn_by_inverse_layer_idx", serde_json::json!(true)),
            ("tie_word_embeddings", serde_json::json!(false)),
            ("model_type", serde_json::json!("llama")),
            ("n_head", serde_json::json!(0)),
        ] {
            let mut json: serde_json::Value = serde_json::from_str(GPT2_SMALL).unwrap();
            json[key] = value;
            let err = gpt2_config(&json.to_string()).unwrap_err();
            assert_eq!(err.key(), Some(key), "{err}");
            assert!(err.to_string().contains(key), "{key}: {err}");
        }
    }

    #[test]
    fn hub_ids_are_owner_slash_name() {
        assert!(is_hub_id("openai-community/gpt2"));
        for not in ["gpt2", "a/b/c", "/gpt2", "owner/", ""] {
            assert!(!is_hub_id(not), "{not}");
        }
    }
}
