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

/// Panics with the error's message: the `init` counterpart of a `try_init`.
pub(crate) fn or_panic<T>(result: Result<T, ConfigError>) -> T {
    result.unwrap_or_else(|err| panic!("{err}"))
}
