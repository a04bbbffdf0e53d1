//! [`DynamicsConfig`]: which transformation a layer applies to `q` and `k`, and the names it
//! goes by on the command line, in reports and in saved configs.

use crate::error::{ConfigError, NameError};
use crate::integrator::IntegratorKind;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Which transformation a layer applies to `q` and `k` before scoring.
///
/// Named (by [`Display`](fmt::Display) and [`FromStr`], and serialised as that name):
/// `standard`, `mlp-only`, a coupled variant with its step count (`euler1`, `leapfrog3`, …) and
/// the affine coupling with its layer count (`affine1`, `affine2`, …) and its uncoupled control
/// (`affine-uncoupled1`, …). Parsing also takes
/// `euler`, `leapfrog` and `affine` for one step or layer, and `hamiltonian` for leapfrog (the
/// paper's word for it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DynamicsConfig {
    /// No dynamics: `q' = q`, `k' = k`.
    Standard,
    /// The uncoupled baseline of matched capacity: `q' = q + f(q)`, `k' = k`.
    MlpOnly,
    /// The invertible affine coupling of `q` and `k` (RealNVP-style, `layers` alternating maps;
    /// see [`AffineCoupling`](super::AffineCoupling)): standard attention at initialisation.
    /// With `coupled` false, its control of the same size: each of `q`, `k` moved by nets of
    /// itself, no exchange.
    Affine {
        /// How many layers (each moves `k`, then `q`).
        layers: usize,
        /// Whether `k` is moved by nets of `q` and `q` by nets of `k` (`affine`), or each by nets
        /// of itself (`affine-uncoupled`).
        coupled: bool,
    },
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
    /// Every name [`FromStr`] takes, as a user would write them (integrators take a step count:
    /// `euler3`, the affine maps a layer count): `standard`, `mlp-only`, every integrator (the
    /// built-in ones, then those added by
    /// [`register_integrator`](crate::integrator::register_integrator)), `affine`,
    /// `affine-uncoupled`.
    pub fn names() -> Vec<&'static str> {
        let mut names = vec![STANDARD, MLP_ONLY];
        names.extend(IntegratorKind::all().iter().map(|k| k.name()));
        names.extend([AFFINE, AFFINE_UNCOUPLED]);
        names
    }

    /// `steps` forward-Euler steps.
    pub fn euler(steps: usize) -> Self {
        Self::Coupled {
            integrator: IntegratorKind::EULER,
            steps,
        }
    }

    /// The affine coupling with `layers` layers.
    pub fn affine(layers: usize) -> Self {
        Self::Affine {
            layers,
            coupled: true,
        }
    }

    /// The affine coupling's uncoupled control with `layers` layers: the same nets, each of `q`
    /// and `k` moved by a function of itself.
    pub fn affine_uncoupled(layers: usize) -> Self {
        Self::Affine {
            layers,
            coupled: false,
        }
    }

    /// `steps` leapfrog steps.
    pub fn leapfrog(steps: usize) -> Self {
        Self::Coupled {
            integrator: IntegratorKind::LEAPFROG,
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

    /// Checks the step or layer count.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Self::Affine { layers: 0, .. } => Err(ConfigError::new(
                "DynamicsConfig",
                "layers",
                0,
                "the affine coupling needs at least 1 layer (use `standard` for none)",
            )),
            Self::Coupled { steps: 0, .. } => Err(ConfigError::new(
                "DynamicsConfig",
                "steps",
                0,
                "the coupled dynamics need at least 1 integrator step (use `standard` for none)",
            )),
            Self::Affine { layers, .. } if *layers > MAX_COUNT => Err(ConfigError::new(
                "DynamicsConfig",
                "layers",
                layers,
                format!("at most {MAX_COUNT} affine layers"),
            )),
            Self::Coupled { steps, .. } if *steps > MAX_COUNT => Err(ConfigError::new(
                "DynamicsConfig",
                "steps",
                steps,
                format!("at most {MAX_COUNT} integrator steps"),
            )),
            _ => Ok(()),
        }
    }
}

/// The most integrator steps or affine layers a variant may have: each keeps its activations
/// for the backward pass, so a mistyped count (`euler100000`) would otherwise run the machine out
/// of memory before the first step; the paper uses one to a few.
pub const MAX_COUNT: usize = 64;

/// The names of the variants without an integrator.
const STANDARD: &str = "standard";
const MLP_ONLY: &str = "mlp-only";
/// The affine coupling's name, and its uncoupled control's.
const AFFINE: &str = "affine";
const AFFINE_UNCOUPLED: &str = "affine-uncoupled";

impl fmt::Display for DynamicsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Standard => f.write_str(STANDARD),
            Self::MlpOnly => f.write_str(MLP_ONLY),
            Self::Affine {
                layers,
                coupled: true,
            } => write!(f, "{AFFINE}{layers}"),
            Self::Affine {
                layers,
                coupled: false,
            } => write!(f, "{AFFINE_UNCOUPLED}{layers}"),
            Self::Coupled { integrator, steps } => {
                write!(f, "{}{steps}", integrator.name())
            }
        }
    }
}

impl FromStr for DynamicsConfig {
    type Err = NameError;

    fn from_str(name: &str) -> Result<Self, NameError> {
        let base = name.trim_end_matches(|c: char| c.is_ascii_digit());
        let digits = &name[base.len()..];
        // The paper calls leapfrog the "Hamiltonian" variant.
        let base = if base == "hamiltonian" {
            "leapfrog"
        } else {
            base
        };
        let count = |kind: &'static str| -> Result<usize, NameError> {
            let found: usize = match digits {
                "" => 1,
                d => d.parse().map_err(|_| NameError::NotANumber {
                    name: name.to_string(),
                    count: kind,
                    digits: d.to_string(),
                })?,
            };
            if found > MAX_COUNT {
                return Err(NameError::TooMany {
                    name: name.to_string(),
                    count: kind,
                    found,
                });
            }
            Ok(found)
        };
        let zero = |what: &'static str, count: &'static str| NameError::ZeroCount {
            name: name.to_string(),
            what,
            count,
        };
        let integrator = IntegratorKind::named(base);
        match (base, integrator) {
            (_, Some(integrator)) => match count("step")? {
                0 => Err(zero("a coupled variant", "integrator step")),
                steps => Ok(Self::Coupled { integrator, steps }),
            },
            (STANDARD | MLP_ONLY, None) if !digits.is_empty() => {
                Err(NameError::CountNotTaken(name.to_string()))
            }
            (AFFINE | AFFINE_UNCOUPLED, None) => match count("layer")? {
                0 => Err(zero("the affine coupling", "layer")),
                layers => Ok(Self::Affine {
                    layers,
                    coupled: base == AFFINE,
                }),
            },
            (STANDARD, None) => Ok(Self::Standard),
            (MLP_ONLY, None) => Ok(Self::MlpOnly),
            _ => Err(NameError::UnknownDynamics(name.to_string())),
        }
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
            DynamicsConfig::affine(2),
            DynamicsConfig::affine_uncoupled(1),
        ] {
            assert_eq!(config.to_string().parse::<DynamicsConfig>(), Ok(config));
        }
        assert_eq!(
            "affine-uncoupled".parse(),
            Ok(DynamicsConfig::affine_uncoupled(1))
        );
        assert_eq!(
            DynamicsConfig::affine_uncoupled(2).to_string(),
            "affine-uncoupled2"
        );
        assert_eq!(DynamicsConfig::euler(3).to_string(), "euler3");
        assert_eq!("euler".parse(), Ok(DynamicsConfig::euler(1)));
        assert_eq!("hamiltonian5".parse(), Ok(DynamicsConfig::leapfrog(5)));
        assert_eq!("affine".parse(), Ok(DynamicsConfig::affine(1)));
        assert_eq!(DynamicsConfig::affine(3).to_string(), "affine3");
        assert!("affine0".parse::<DynamicsConfig>().is_err());
        assert_eq!(
            DynamicsConfig::affine(0).validate().unwrap_err().field,
            "layers"
        );
        assert_eq!(
            DynamicsConfig::names()[..6],
            [
                "standard",
                "mlp-only",
                "euler",
                "leapfrog",
                "affine",
                "affine-uncoupled"
            ]
        );
        for name in DynamicsConfig::names() {
            assert!(name.parse::<DynamicsConfig>().is_ok(), "{name}");
        }
    }

    #[test]
    fn bad_names_say_what_is_expected() {
        let err = "rk4".parse::<DynamicsConfig>().unwrap_err();
        assert_eq!(err, NameError::UnknownDynamics("rk4".into()));
        let err = err.to_string();
        assert!(err.contains("`rk4`") && err.contains("leapfrog"), "{err}");
        for name in DynamicsConfig::names() {
            assert!(err.contains(name), "{name} missing from: {err}");
        }
        let err = "euler0".parse::<DynamicsConfig>().unwrap_err().to_string();
        assert!(err.contains("at least one"), "{err}");
        let err = "affine0".parse::<DynamicsConfig>().unwrap_err().to_string();
        assert!(err.contains("at least one layer"), "{err}");
        let err = "standard2".parse::<DynamicsConfig>().unwrap_err();
        assert_eq!(err, NameError::CountNotTaken("standard2".into()));
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

    #[test]
    fn counts_beyond_the_bound_are_refused_before_anything_is_built() {
        for name in [
            "euler100000",
            "leapfrog65",
            "affine65",
            "affine-uncoupled1000",
        ] {
            let err = name.parse::<DynamicsConfig>().unwrap_err();
            assert!(matches!(err, NameError::TooMany { .. }), "{name}: {err}");
            assert!(err.to_string().contains("more than the 64"), "{err}");
        }
        assert!("euler64".parse::<DynamicsConfig>().is_ok());
        let err = DynamicsConfig::euler(65).validate().unwrap_err();
        assert_eq!(err.field, "steps");
        assert!(DynamicsConfig::euler(64).validate().is_ok());
    }
}
