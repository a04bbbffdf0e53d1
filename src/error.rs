//! The crate's error type.

use thiserror::Error;

/// An invalid configuration, found by a `validate` or `try_init` method.
///
/// The message names the field, the value it had and the rule it broke, so that a user can fix
/// the config without reading the source. `init` methods panic with the same message, as Burn's
/// own configs do.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("invalid {config}: `{field}` = {value}: {rule}")]
pub struct ConfigError {
    /// The config type, for example `CoupledQkAttentionConfig`.
    pub config: &'static str,
    /// The offending field, as spelled in the config (`d_model`, `dt.init`, …).
    pub field: &'static str,
    /// The value the field had, formatted.
    pub value: String,
    /// The rule the value breaks, phrased as what to do.
    pub rule: String,
}

impl ConfigError {
    pub(crate) fn new(
        config: &'static str,
        field: &'static str,
        value: impl std::fmt::Display,
        rule: impl Into<String>,
    ) -> Self {
        Self {
            config,
            field,
            value: value.to_string(),
            rule: rule.into(),
        }
    }
}

/// A dynamics or attention-variant name that does not parse (`DynamicsConfig` and
/// `AttentionVariant`'s `FromStr`). The messages list the names that do, from
/// [`DynamicsConfig::names`](crate::DynamicsConfig::names).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    /// Not a dynamics name.
    #[error("unknown dynamics `{0}`: expected {names} ({counts})", names = crate::DynamicsConfig::names().join(", "), counts = counts())]
    UnknownDynamics(String),
    /// Not an attention-variant name.
    #[error("unknown attention variant `{0}`: expected one of {names} ({counts}; diff+ any of these, e.g. diff+euler1)", names = crate::AttentionVariant::names().collect::<Vec<_>>().join(", "), counts = counts())]
    UnknownVariant(String),
    /// Dynamics after `+` on something other than differential attention.
    #[error(
        "unknown attention variant `{name}`: only differential attention takes dynamics after `+` \
         (`diff+euler1`), not `{prefix}`"
    )]
    NotDifferential {
        /// The whole name.
        name: String,
        /// What came before the `+`.
        prefix: String,
    },
    /// A count on a name that takes none (`standard2`).
    #[error(
        "`{0}`: only integrators ({integrators}) take a step count, and affine a layer count",
        integrators = crate::IntegratorKind::listed()
    )]
    CountNotTaken(String),
    /// A count that is not a number (or does not fit one).
    #[error("`{name}`: the {count} count `{digits}` is not a number")]
    NotANumber {
        /// The whole name.
        name: String,
        /// `step` or `layer`.
        count: &'static str,
        /// The digits.
        digits: String,
    },
    /// A count of 0.
    #[error("`{name}`: {what} needs at least one {count}")]
    ZeroCount {
        /// The whole name.
        name: String,
        /// What needs it.
        what: &'static str,
        /// `integrator step` or `layer`.
        count: &'static str,
    },
    /// A count beyond [`MAX_COUNT`](crate::dynamics::MAX_COUNT).
    #[error(
        "`{name}`: {found} {count}s is more than the {max} this crate takes (each adds the \
         activations of a step to training memory; the paper finds one enough)",
        max = crate::dynamics::MAX_COUNT
    )]
    TooMany {
        /// The whole name.
        name: String,
        /// `integrator step` or `layer`.
        count: &'static str,
        /// The count given.
        found: usize,
    },
}

/// How counts are written, for the messages of [`NameError`].
fn counts() -> String {
    format!(
        "{} with an optional step count, e.g. euler3; affine and affine-uncoupled with a layer \
         count, e.g. affine2",
        crate::IntegratorKind::listed()
    )
}

/// Panics with the error's message: the `init` counterpart of a `try_init`.
pub(crate) fn or_panic<T>(result: Result<T, ConfigError>) -> T {
    result.unwrap_or_else(|err| panic!("{err}"))
}
