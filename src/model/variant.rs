//! [`AttentionVariant`]: which attention a GPT's blocks use, and the one parser and printer of
//! variant names.

use crate::dynamics::DynamicsConfig;
use crate::error::NameError;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// The attention layer of a GPT's blocks: the field [`GptConfig::attention`](super::GptConfig)
/// and the name every program, report and run folder uses.
///
/// Named (by [`Display`](fmt::Display) and [`FromStr`], and serialised as that name) by the
/// [`DynamicsConfig`] of the coupled layer, `standard`, `mlp-only`, `euler1`, `leapfrog3`, …;
/// `diff` for differential attention, and `diff+euler1`, `diff+affine1`, … for differential
/// attention with those dynamics. Parsing takes the aliases of [`DynamicsConfig`] (`euler` for
/// one step, `hamiltonian`) and `differential`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AttentionVariant {
    /// [`CoupledQkAttention`](crate::CoupledQkAttention) with these dynamics (the standard and
    /// MLP-only baselines included).
    Coupled(DynamicsConfig),
    /// [`DifferentialAttention`](crate::DifferentialAttention) (Ye et al. 2024, V1) with these
    /// dynamics on each of its query/key map pairs; `Standard` is plain differential attention.
    Differential(DynamicsConfig),
}

impl burn::config::Config for AttentionVariant {}

/// The name of differential attention, and the separator of its dynamics (`diff+euler1`).
const DIFFERENTIAL: &str = "diff";
const WITH: char = '+';

impl Default for AttentionVariant {
    /// One forward-Euler step, the paper's best 60M result.
    fn default() -> Self {
        Self::Coupled(DynamicsConfig::default())
    }
}

impl AttentionVariant {
    /// The names [`FromStr`] takes, as a user would write them (`euler` and `leapfrog` take a step
    /// count: `euler3`), in the order of the paper's table: [`DynamicsConfig::names`], then
    /// `diff`; any dynamics name after `diff+` gives differential attention with them.
    pub fn names() -> impl Iterator<Item = &'static str> {
        DynamicsConfig::names().into_iter().chain([DIFFERENTIAL])
    }

    /// Plain differential attention.
    pub fn differential() -> Self {
        Self::Differential(DynamicsConfig::Standard)
    }

    /// The query-key dynamics of the variant's layer.
    pub fn dynamics(&self) -> &DynamicsConfig {
        match self {
            Self::Coupled(dynamics) | Self::Differential(dynamics) => dynamics,
        }
    }

    /// Whether the variant integrates coupled dynamics (and so takes a step count).
    pub fn is_integrated(&self) -> bool {
        matches!(self.dynamics(), DynamicsConfig::Coupled { .. })
    }

    /// The same variant with `steps` integrator steps (see [`DynamicsConfig::with_steps`]);
    /// the variants without an integrator are unchanged.
    pub fn with_steps(self, steps: usize) -> Self {
        match self {
            Self::Coupled(dynamics) => Self::Coupled(dynamics.with_steps(steps)),
            Self::Differential(dynamics) => Self::Differential(dynamics.with_steps(steps)),
        }
    }
}

impl From<DynamicsConfig> for AttentionVariant {
    fn from(dynamics: DynamicsConfig) -> Self {
        Self::Coupled(dynamics)
    }
}

impl fmt::Display for AttentionVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Coupled(dynamics) => dynamics.fmt(f),
            Self::Differential(DynamicsConfig::Standard) => f.write_str(DIFFERENTIAL),
            Self::Differential(dynamics) => write!(f, "{DIFFERENTIAL}{WITH}{dynamics}"),
        }
    }
}

impl FromStr for AttentionVariant {
    type Err = NameError;

    fn from_str(name: &str) -> Result<Self, NameError> {
        let (differential, dynamics) = match name.split_once(WITH) {
            Some((DIFFERENTIAL | "differential", dynamics)) => (true, Some(dynamics)),
            Some((prefix, _)) => {
                return Err(NameError::NotDifferential {
                    name: name.to_string(),
                    prefix: prefix.to_string(),
                });
            }
            None if matches!(name, DIFFERENTIAL | "differential") => (true, None),
            None => (false, Some(name)),
        };
        let dynamics = match dynamics {
            None => DynamicsConfig::Standard,
            Some(other) => other.parse().map_err(|err| match err {
                NameError::UnknownDynamics(_) => NameError::UnknownVariant(name.to_string()),
                other => other,
            })?,
        };
        Ok(match differential {
            true => Self::Differential(dynamics),
            false => Self::Coupled(dynamics),
        })
    }
}

impl Serialize for AttentionVariant {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AttentionVariant {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_back() {
        for name in AttentionVariant::names() {
            let variant: AttentionVariant = name.parse().unwrap();
            assert_eq!(variant.to_string().parse(), Ok(variant));
        }
        assert_eq!(
            "euler".parse::<AttentionVariant>().unwrap().to_string(),
            "euler1"
        );
        assert_eq!(
            "hamiltonian3".parse(),
            Ok(AttentionVariant::Coupled(DynamicsConfig::leapfrog(3)))
        );
        assert_eq!("differential".parse(), Ok(AttentionVariant::differential()));
        assert_eq!(AttentionVariant::differential().to_string(), "diff");
        for (name, dynamics) in [
            ("diff+euler", DynamicsConfig::euler(1)),
            ("diff+leapfrog3", DynamicsConfig::leapfrog(3)),
            ("diff+affine", DynamicsConfig::affine(1)),
            ("differential+mlp-only", DynamicsConfig::MlpOnly),
        ] {
            let variant: AttentionVariant = name.parse().unwrap();
            assert_eq!(variant, AttentionVariant::Differential(dynamics));
            assert_eq!(variant.to_string().parse(), Ok(variant.clone()));
            assert!(variant.to_string().starts_with("diff+"), "{variant}");
        }
        assert_eq!(
            "diff+standard"
                .parse::<AttentionVariant>()
                .unwrap()
                .to_string(),
            "diff"
        );
        let err = "euler+diff"
            .parse::<AttentionVariant>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("only differential attention"), "{err}");
        let err = "diff+rk4".parse::<AttentionVariant>().unwrap_err();
        assert_eq!(err, NameError::UnknownVariant("diff+rk4".into()));
        let err = "rk4".parse::<AttentionVariant>().unwrap_err().to_string();
        assert!(err.contains("`rk4`") && err.contains("diff"), "{err}");
        let err = "euler0"
            .parse::<AttentionVariant>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("at least one"), "{err}");
    }

    #[test]
    fn serialises_as_its_name() {
        for variant in [
            AttentionVariant::differential(),
            AttentionVariant::Differential(DynamicsConfig::affine(2)),
            AttentionVariant::Coupled(DynamicsConfig::Standard),
            AttentionVariant::Coupled(DynamicsConfig::leapfrog(3)),
        ] {
            let text = serde_json::to_string(&variant).unwrap();
            assert_eq!(text, format!("\"{variant}\""));
            assert_eq!(
                serde_json::from_str::<AttentionVariant>(&text).unwrap(),
                variant
            );
        }
        assert!(serde_json::from_str::<AttentionVariant>(r#""nope""#).is_err());
    }

    #[test]
    fn steps_apply_to_integrated_variants_only() {
        let euler = AttentionVariant::Coupled(DynamicsConfig::euler(1));
        assert!(euler.is_integrated());
        assert_eq!(
            euler.with_steps(5),
            AttentionVariant::Coupled(DynamicsConfig::euler(5))
        );
        let mlp = AttentionVariant::Coupled(DynamicsConfig::MlpOnly);
        assert!(!mlp.is_integrated());
        assert_eq!(mlp.clone().with_steps(5), mlp);
        assert_eq!(
            AttentionVariant::differential().with_steps(5),
            AttentionVariant::differential()
        );
        let diff_euler = AttentionVariant::Differential(DynamicsConfig::euler(1));
        assert!(diff_euler.is_integrated());
        assert_eq!(
            diff_euler.with_steps(2),
            AttentionVariant::Differential(DynamicsConfig::euler(2))
        );
    }
}
