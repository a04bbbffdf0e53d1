//! Which attention a GPT uses: the one type experiment programs select variants by.

use crate::dynamics::DynamicsConfig;
use crate::integrator::IntegratorKind;
use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;
use std::str::FromStr;

/// The attention layer of a GPT's blocks: the field [`GptConfig::attention`](super::GptConfig).
///
/// Serialised as `"coupled"` or `"differential"`. A config written before the field existed has
/// no `attention` key: it deserialises as [`Coupled`](Self::Coupled) (from JSON, or any
/// self-describing format; the field is read as an optional value).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionKind {
    /// [`CoupledQkAttention`](crate::CoupledQkAttention) with the config's `dynamics` (the
    /// standard and MLP-only baselines included).
    #[default]
    Coupled,
    /// [`DifferentialAttention`](crate::DifferentialAttention) (Ye et al. 2024).
    Differential,
}

impl<'de> Deserialize<'de> for AttentionKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "kebab-case")]
        enum Repr {
            Coupled,
            Differential,
        }
        // Burn's `Config` derive gives its fields no `#[serde(default)]`; a missing field is read
        // through `deserialize_option` as `None`, which is what makes old configs parse.
        Ok(match Option::<Repr>::deserialize(deserializer)? {
            None | Some(Repr::Coupled) => Self::Coupled,
            Some(Repr::Differential) => Self::Differential,
        })
    }
}

/// An attention variant as experiment programs name it: a [`DynamicsConfig`] of the coupled
/// layer (standard, MLP-only, Euler, leapfrog) or differential attention.
///
/// Parsed from `standard`, `mlp-only`, `euler`, `leapfrog` (alias `hamiltonian`) and `diff`
/// (alias `differential`), with one integrator step; [`name`](Self::name) and `Display` give the
/// name back (without the step count). Serialised like [`DynamicsConfig`] (`{"kind": "standard"}`,
/// `{"kind": "coupled", "integrator": "euler", "steps": 1}`, …), differential attention as
/// `{"kind": "differential"}`. [`GptConfig::with_variant`](super::GptConfig::with_variant) applies
/// one to a model config and [`GptConfig::variant`](super::GptConfig::variant) reads it back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "VariantRepr", into = "VariantRepr")]
pub enum AttentionVariant {
    /// Coupled QK attention with these dynamics.
    Dynamics(DynamicsConfig),
    /// Differential attention (Ye et al. 2024, V1).
    Differential,
}

impl burn::config::Config for AttentionVariant {}

impl AttentionVariant {
    /// Every name [`FromStr`] takes (aliases aside), in the order of the paper's table.
    pub const NAMES: [&'static str; 5] = ["standard", "mlp-only", "euler", "leapfrog", "diff"];

    /// The command-line name: `standard`, `mlp-only`, `euler`, `leapfrog` or `diff`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Dynamics(dynamics) => dynamics.name(),
            Self::Differential => "diff",
        }
    }

    /// The dynamics of the coupled layer; `None` for differential attention.
    pub fn dynamics(&self) -> Option<&DynamicsConfig> {
        match self {
            Self::Dynamics(dynamics) => Some(dynamics),
            Self::Differential => None,
        }
    }

    /// The same variant with `steps` integrator steps (see [`DynamicsConfig::with_steps`]);
    /// the variants without an integrator are unchanged.
    pub fn with_steps(self, steps: usize) -> Self {
        match self {
            Self::Dynamics(dynamics) => Self::Dynamics(dynamics.with_steps(steps)),
            other => other,
        }
    }
}

impl From<DynamicsConfig> for AttentionVariant {
    fn from(dynamics: DynamicsConfig) -> Self {
        Self::Dynamics(dynamics)
    }
}

impl FromStr for AttentionVariant {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "diff" | "differential" => Ok(Self::Differential),
            other => other
                .parse::<DynamicsConfig>()
                .map(Self::Dynamics)
                .map_err(|_| {
                    format!(
                        "unknown attention variant `{other}`: expected standard, mlp-only, euler, \
                     leapfrog (or hamiltonian) or diff (or differential)"
                    )
                }),
        }
    }
}

impl fmt::Display for AttentionVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The serialised form: [`DynamicsConfig`]'s, plus `differential`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum VariantRepr {
    Standard,
    MlpOnly,
    Coupled {
        integrator: IntegratorKind,
        #[serde(default = "one")]
        steps: usize,
    },
    #[serde(alias = "diff")]
    Differential,
}

fn one() -> usize {
    1
}

impl From<VariantRepr> for AttentionVariant {
    fn from(repr: VariantRepr) -> Self {
        match repr {
            VariantRepr::Standard => Self::Dynamics(DynamicsConfig::Standard),
            VariantRepr::MlpOnly => Self::Dynamics(DynamicsConfig::MlpOnly),
            VariantRepr::Coupled { integrator, steps } => {
                Self::Dynamics(DynamicsConfig::Coupled { integrator, steps })
            }
            VariantRepr::Differential => Self::Differential,
        }
    }
}

impl From<AttentionVariant> for VariantRepr {
    fn from(variant: AttentionVariant) -> Self {
        match variant {
            AttentionVariant::Dynamics(DynamicsConfig::Standard) => Self::Standard,
            AttentionVariant::Dynamics(DynamicsConfig::MlpOnly) => Self::MlpOnly,
            AttentionVariant::Dynamics(DynamicsConfig::Coupled { integrator, steps }) => {
                Self::Coupled { integrator, steps }
            }
            AttentionVariant::Differential => Self::Differential,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_back() {
        for name in AttentionVariant::NAMES {
            let variant: AttentionVariant = name.parse().unwrap();
            assert_eq!(variant.name(), name);
            assert_eq!(variant.to_string(), name);
        }
        assert_eq!(
            "hamiltonian".parse::<AttentionVariant>().unwrap(),
            AttentionVariant::Dynamics(DynamicsConfig::leapfrog(1))
        );
        assert_eq!(
            "differential".parse::<AttentionVariant>().unwrap(),
            AttentionVariant::Differential
        );
        let err = "rk4".parse::<AttentionVariant>().unwrap_err();
        assert!(err.contains("`rk4`") && err.contains("diff"), "{err}");
    }

    #[test]
    fn serialises_like_the_dynamics_plus_differential() {
        let json = |v: &AttentionVariant| serde_json::to_string(v).unwrap();
        assert_eq!(
            json(&AttentionVariant::Differential),
            r#"{"kind":"differential"}"#
        );
        for variant in [
            AttentionVariant::Differential,
            AttentionVariant::Dynamics(DynamicsConfig::Standard),
            AttentionVariant::Dynamics(DynamicsConfig::MlpOnly),
            AttentionVariant::Dynamics(DynamicsConfig::leapfrog(3)),
        ] {
            let text = json(&variant);
            assert_eq!(
                serde_json::from_str::<AttentionVariant>(&text).unwrap(),
                variant
            );
            if let Some(dynamics) = variant.dynamics() {
                assert_eq!(text, serde_json::to_string(dynamics).unwrap());
            }
        }
        let diff: AttentionVariant = serde_json::from_str(r#"{"kind":"diff"}"#).unwrap();
        assert_eq!(diff, AttentionVariant::Differential);
        assert_eq!(
            AttentionVariant::Dynamics(DynamicsConfig::euler(1)).with_steps(5),
            AttentionVariant::Dynamics(DynamicsConfig::euler(5))
        );
        assert_eq!(
            AttentionVariant::Differential.with_steps(5),
            AttentionVariant::Differential
        );
    }

    #[test]
    fn the_kind_reads_a_missing_or_null_field_as_coupled() {
        #[derive(Deserialize)]
        struct Holder {
            attention: AttentionKind,
        }
        let read = |text: &str| serde_json::from_str::<Holder>(text).unwrap().attention;
        assert_eq!(read("{}"), AttentionKind::Coupled);
        assert_eq!(read(r#"{"attention":null}"#), AttentionKind::Coupled);
        assert_eq!(read(r#"{"attention":"coupled"}"#), AttentionKind::Coupled);
        assert_eq!(
            read(r#"{"attention":"differential"}"#),
            AttentionKind::Differential
        );
        assert!(serde_json::from_str::<Holder>(r#"{"attention":"diff"}"#).is_err());
        assert_eq!(
            serde_json::to_string(&AttentionKind::Differential).unwrap(),
            r#""differential""#
        );
    }
}
