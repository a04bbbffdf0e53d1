//! [`DynamicsConfig`]: which transformation a layer applies to `q` and `k`, and the names it
//! goes by on the command line, in reports and in saved configs.

use crate::error::ConfigError;
use crate::integrator::IntegratorKind;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Which transformation a layer applies to `q` and `k` before scoring.
///
/// Named (by [`Display`](fmt::Display) and [`FromStr`], and serialised as that name):
/// `standard`, `mlp-only`, and a coupled variant with its step count, `euler1`, `leapfrog3`, …
/// Parsing also takes `euler` and `leapfrog` for one step, and `hamiltonian` for leapfrog (the
/// paper's word for it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DynamicsConfig {
    /// No dynamics: `q' = q`, `k' = k`.
    Standard,
    /// The uncoupled baseline of matched capacity: `q' = q + f(q)`, `k' = k`.
    MlpOnly,
    /// The coupled dynamics `dq/dt = k`, `dk/dt = f(q)`, integrated for `steps` steps.
    Coupled {
        /// The integrator.
        integrator: IntegratorKind,
        /// How many steps of size `dt` (the paper finds one enough).
        steps: usize,
    },
}

impl burn::config::Config for DynamicsConfig {}

impl Default for DynamicsConfig {
    /// One forward-Euler step, the paper's best 60M result.
    fn default() -> Self {
        Self::euler(1)
    }
}

impl DynamicsConfig {
    /// The names [`FromStr`] takes, as a user would write them (`euler` and `leapfrog` take a step
    /// count: `euler3`).
    pub const NAMES: [&'static str; 4] = ["standard", "mlp-only", "euler", "leapfrog"];

    /// `steps` forward-Euler steps.
    pub fn euler(steps: usize) -> Self {
        Self::Coupled {
            integrator: IntegratorKind::Euler,
            steps,
        }
    }

    /// `steps` leapfrog steps.
    pub fn leapfrog(steps: usize) -> Self {
        Self::Coupled {
            integrator: IntegratorKind::Leapfrog,
            steps,
        }
    }

    /// The same dynamics with `steps` integrator steps; standard and MLP-only are unchanged.
    pub fn with_steps(self, steps: usize) -> Self {
        match self {
            Self::Coupled { integrator, .. } => Self::Coupled { integrator, steps },
            other => other,
        }
    }

    /// Whether the dynamics have a coupling net (every variant but standard).
    pub fn has_coupling_net(&self) -> bool {
        !matches!(self, Self::Standard)
    }

    /// Checks the step count.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Self::Coupled { steps: 0, .. } => Err(ConfigError::new(
                "DynamicsConfig",
                "steps",
                0,
                "the coupled dynamics need at least 1 integrator step (use `standard` for none)",
            )),
            _ => Ok(()),
        }
    }
}

/// The built-in integrators, whose names ([`Integrator::name`](crate::Integrator::name)) the
/// coupled variants take.
const INTEGRATORS: [IntegratorKind; 2] = [IntegratorKind::Euler, IntegratorKind::Leapfrog];

impl fmt::Display for DynamicsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Standard => f.write_str("standard"),
            Self::MlpOnly => f.write_str("mlp-only"),
            Self::Coupled { integrator, steps } => {
                write!(f, "{}{steps}", integrator.build().name())
            }
        }
    }
}

impl FromStr for DynamicsConfig {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        let base = name.trim_end_matches(|c: char| c.is_ascii_digit());
        let digits = &name[base.len()..];
        // The paper calls leapfrog the "Hamiltonian" variant.
        let base = if base == "hamiltonian" {
            "leapfrog"
        } else {
            base
        };
        let integrator = INTEGRATORS.into_iter().find(|k| k.build().name() == base);
        let integrator = match (base, integrator) {
            (_, Some(integrator)) => integrator,
            ("standard" | "mlp-only", None) if !digits.is_empty() => {
                return Err(format!(
                    "`{name}`: only euler and leapfrog take a step count"
                ));
            }
            ("standard", None) => return Ok(Self::Standard),
            ("mlp-only", None) => return Ok(Self::MlpOnly),
            _ => {
                return Err(format!(
                    "unknown dynamics `{name}`: expected standard, mlp-only, euler or leapfrog \
                     (euler and leapfrog with an optional step count, e.g. euler3)"
                ));
            }
        };
        let steps = match digits {
            "" => 1,
            digits => digits
                .parse()
                .map_err(|_| format!("`{name}`: the step count `{digits}` is not a number"))?,
        };
        if steps == 0 {
            return Err(format!(
                "`{name}`: a coupled variant needs at least one integrator step"
            ));
        }
        Ok(Self::Coupled { integrator, steps })
    }
}

impl Serialize for DynamicsConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DynamicsConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_print_and_parse_back() {
        for config in [
            DynamicsConfig::Standard,
            DynamicsConfig::MlpOnly,
            DynamicsConfig::euler(1),
            DynamicsConfig::leapfrog(7),
        ] {
            assert_eq!(config.to_string().parse::<DynamicsConfig>(), Ok(config));
        }
        assert_eq!(DynamicsConfig::euler(3).to_string(), "euler3");
        assert_eq!("euler".parse(), Ok(DynamicsConfig::euler(1)));
        assert_eq!("hamiltonian5".parse(), Ok(DynamicsConfig::leapfrog(5)));
        for name in DynamicsConfig::NAMES {
            assert!(name.parse::<DynamicsConfig>().is_ok(), "{name}");
        }
    }

    #[test]
    fn bad_names_say_what_is_expected() {
        let err = "rk4".parse::<DynamicsConfig>().unwrap_err();
        assert!(err.contains("`rk4`") && err.contains("leapfrog"), "{err}");
        let err = "euler0".parse::<DynamicsConfig>().unwrap_err();
        assert!(err.contains("at least one"), "{err}");
        let err = "standard2".parse::<DynamicsConfig>().unwrap_err();
        assert!(err.contains("only euler and leapfrog"), "{err}");
        assert!(
            "euler99999999999999999999999"
                .parse::<DynamicsConfig>()
                .is_err()
        );
    }

    #[test]
    fn serialises_as_its_name() {
        let json = serde_json::to_string(&DynamicsConfig::leapfrog(3)).unwrap();
        assert_eq!(json, r#""leapfrog3""#);
        let parsed: DynamicsConfig = serde_json::from_str(r#""mlp-only""#).unwrap();
        assert_eq!(parsed, DynamicsConfig::MlpOnly);
        assert!(serde_json::from_str::<DynamicsConfig>(r#""rk4""#).is_err());
    }

    #[test]
    fn zero_steps_is_rejected() {
        let err = DynamicsConfig::euler(0).validate().unwrap_err();
        assert_eq!(err.field, "steps");
    }
}
