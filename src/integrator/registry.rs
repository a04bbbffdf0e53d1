//! [`IntegratorKind`]: integrators by name, as configs, command lines and saved runs hold them.
//! The built-in ones are one line each of [`BUILT_IN`]; a program adds its own with
//! [`register_integrator`], after which every name parser of the crate (dynamics, attention
//! variants, saved configs) takes it.

use super::{Euler, Integrator, Leapfrog};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::{Arc, RwLock};

/// Builds an integrator.
pub type IntegratorBuilder = fn() -> Arc<dyn Integrator>;

/// The built-in integrators, in the order names are listed: one line each.
const BUILT_IN: &[(&str, IntegratorBuilder)] = &[
    ("euler", || Arc::new(Euler)),
    ("leapfrog", || Arc::new(Leapfrog)),
];

/// The integrators registered at run time, after the built-in ones.
static REGISTERED: RwLock<Vec<(&'static str, IntegratorBuilder)>> = RwLock::new(Vec::new());

/// Names that other dynamics or variants take, or that the paper uses for leapfrog.
const RESERVED: &[&str] = &[
    "standard",
    "mlp-only",
    "affine",
    "affine-uncoupled",
    "diff",
    "differential",
    "hamiltonian",
];

/// An integrator by name (`"euler"`, `"leapfrog"`, or one added by [`register_integrator`]),
/// serialised as that name. Only names of known integrators make one, so [`build`](Self::build)
/// always succeeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IntegratorKind(&'static str);

impl IntegratorKind {
    /// [`Euler`]: forward Euler.
    pub const EULER: Self = Self("euler");
    /// [`Leapfrog`]: kick-drift-kick (the paper's "Hamiltonian" variant).
    pub const LEAPFROG: Self = Self("leapfrog");

    /// Its name.
    pub fn name(self) -> &'static str {
        self.0
    }

    /// The integrator of that name, built in or registered.
    pub fn named(name: &str) -> Option<Self> {
        Self::all().into_iter().find(|kind| kind.0 == name)
    }

    /// Every integrator: the built-in ones, then the registered ones in registration order.
    pub fn all() -> Vec<Self> {
        let registered = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
        BUILT_IN
            .iter()
            .chain(registered.iter())
            .map(|(name, _)| Self(name))
            .collect()
    }

    /// The names of [`all`](Self::all) as a sentence lists them: `euler and leapfrog`, `euler,
    /// leapfrog and verlet` (messages and help texts build their lists from it, so a registered
    /// integrator appears in them).
    pub fn listed() -> String {
        let names: Vec<&str> = Self::all().into_iter().map(Self::name).collect();
        match names.split_last() {
            None => String::new(),
            Some((last, [])) => (*last).to_string(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        }
    }

    /// The integrator this name stands for.
    pub fn build(self) -> Arc<dyn Integrator> {
        let registered = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
        let (_, build) = BUILT_IN
            .iter()
            .chain(registered.iter())
            .find(|(name, _)| *name == self.0)
            .expect("an IntegratorKind is made only from a known name");
        build()
    }
}

impl std::fmt::Display for IntegratorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Why [`register_integrator`] refused a name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// Not lowercase letters, digits and `-` (starting with a letter, not ending in a digit,
    /// which would read as a step count).
    #[error(
        "`{0}` cannot name an integrator: use lowercase letters, digits and `-`, starting with a \
         letter and not ending in a digit (a trailing number is the step count)"
    )]
    Invalid(String),
    /// A name in use.
    #[error("`{0}` already names an integrator or another dynamics")]
    Taken(String),
    /// The integrator calls itself something else.
    #[error("the integrator registered as `{name}` calls itself `{own}` (Integrator::name)")]
    OtherName {
        /// The name asked for.
        name: String,
        /// What its `name()` returns.
        own: String,
    },
}

/// Makes `build`'s integrator choosable by `name` wherever the crate parses dynamics: as
/// `name` or `name3` (3 steps) in [`DynamicsConfig`](crate::DynamicsConfig) and
/// [`AttentionVariant`](crate::model::AttentionVariant) names, on the programs' command lines,
/// and in saved configs (which need it registered before they are read).
///
/// # Errors
/// A malformed name, a name in use (built-in, registered or reserved), or an integrator whose
/// [`Integrator::name`] differs from `name`.
pub fn register_integrator(
    name: &str,
    build: IntegratorBuilder,
) -> Result<IntegratorKind, RegisterError> {
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        return Err(RegisterError::Invalid(name.to_string()));
    }
    // Built before the lock is taken: a builder may itself look integrators up.
    let own = build().name().to_string();
    let mut registered = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    let taken = RESERVED.contains(&name)
        || BUILT_IN
            .iter()
            .chain(registered.iter())
            .any(|(n, _)| *n == name);
    if taken {
        return Err(RegisterError::Taken(name.to_string()));
    }
    if own != name {
        return Err(RegisterError::OtherName {
            name: name.to_string(),
            own,
        });
    }
    let name: &'static str = Box::leak(name.to_string().into_boxed_str());
    registered.push((name, build));
    Ok(IntegratorKind(name))
}

impl Serialize for IntegratorKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for IntegratorKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Self::named(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown integrator `{name}` (known: {}; register others first)",
                Self::all()
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_names_build_their_integrators() {
        for kind in [IntegratorKind::EULER, IntegratorKind::LEAPFROG] {
            assert_eq!(kind.build().name(), kind.name());
            assert_eq!(IntegratorKind::named(kind.name()), Some(kind));
        }
        assert_eq!(IntegratorKind::named("rk4"), None);
        let json = serde_json::to_string(&IntegratorKind::LEAPFROG).unwrap();
        assert_eq!(json, r#""leapfrog""#);
        assert_eq!(
            serde_json::from_str::<IntegratorKind>(&json).unwrap(),
            IntegratorKind::LEAPFROG
        );
        assert!(serde_json::from_str::<IntegratorKind>(r#""rk4""#).is_err());
    }

    #[test]
    fn bad_registrations_are_refused() {
        let euler: IntegratorBuilder = || Arc::new(Euler);
        for name in ["Euler2", "2step", "rk4", "a+b", ""] {
            assert!(
                matches!(
                    register_integrator(name, euler),
                    Err(RegisterError::Invalid(_))
                ),
                "{name}"
            );
        }
        for name in ["euler", "standard", "diff", "hamiltonian"] {
            assert_eq!(
                register_integrator(name, euler),
                Err(RegisterError::Taken(name.into()))
            );
        }
        assert!(matches!(
            register_integrator("my-euler", euler),
            Err(RegisterError::OtherName { .. })
        ));
    }
}
