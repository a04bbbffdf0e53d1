//! The variants of a suite: names parsed by [`AttentionVariant`], with integrator steps expanded.

use coupled_qk::model::AttentionVariant;
use coupled_qk::{DynamicsConfig, NameError};

/// Variants from names (see [`AttentionVariant`]'s `FromStr`), and for every `steps` value a
/// variant of each integrated name that gives no step count of its own (`euler` with steps 1,3 →
/// `euler1`, `euler3`), without repeats, in order.
pub fn parse_variants(
    names: &[String],
    steps: &[usize],
) -> Result<Vec<AttentionVariant>, NameError> {
    let mut out: Vec<AttentionVariant> = Vec::new();
    for name in names {
        let parsed: AttentionVariant = name.parse()?;
        let has_digits = name.ends_with(|c: char| c.is_ascii_digit());
        let expanded: Vec<AttentionVariant> =
            if parsed.is_integrated() && !has_digits && !steps.is_empty() {
                steps
                    .iter()
                    .map(|n| format!("{name}{n}").parse())
                    .collect::<Result<_, _>>()?
            } else {
                vec![parsed]
            };
        for v in expanded {
            if !out.contains(&v) {
                out.push(v);
            }
        }
    }
    Ok(out)
}

/// Why [`variant_with_steps`] refused a name and a step count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepsError {
    /// The name does not parse.
    #[error(transparent)]
    Name(#[from] NameError),
    /// The name gives one step count and `steps` another.
    #[error(
        "`{name}` names {named} integrator steps and steps = {steps} another: give the count once \
         (`{with_steps}`)"
    )]
    Conflict {
        /// The variant's name.
        name: String,
        /// The count in the name.
        named: usize,
        /// The count given apart.
        steps: usize,
        /// The variant with `steps`.
        with_steps: String,
    },
    /// The variant has no integrator steps.
    #[error(
        "`{name}` has no integrator steps ({integrators} have; affine counts layers in its name, \
         e.g. `affine2`), so steps = {steps} would be ignored",
        integrators = coupled_qk::IntegratorKind::listed()
    )]
    NoSteps {
        /// The variant's name.
        name: String,
        /// The count given.
        steps: usize,
    },
}

/// The variant `name` with `--steps`-style `steps` applied to its integrator: refused when `steps`
/// contradicts a count in the name (`euler3` with steps 2) or the variant has no integrator steps
/// (`standard`, `mlp-only`, `diff`, `affine…` whose count is of layers).
pub fn variant_with_steps(
    name: &str,
    steps: Option<usize>,
) -> Result<AttentionVariant, StepsError> {
    let variant: AttentionVariant = name.parse()?;
    let Some(steps) = steps else {
        return Ok(variant);
    };
    let named_count = name.ends_with(|c: char| c.is_ascii_digit());
    match variant.dynamics() {
        DynamicsConfig::Coupled { steps: named, .. } if named_count && *named != steps => {
            Err(StepsError::Conflict {
                name: name.to_string(),
                named: *named,
                steps,
                with_steps: variant.with_steps(steps).to_string(),
            })
        }
        DynamicsConfig::Coupled { .. } => Ok(variant.with_steps(steps)),
        _ => Err(StepsError::NoSteps {
            name: name.to_string(),
            steps,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count given twice must agree, steps on a variant without an integrator are refused, and
    /// steps fill in a name without a count.
    #[test]
    fn steps_apply_only_where_they_mean_something() {
        let ok = |name: &str, steps| {
            variant_with_steps(name, steps)
                .map(|v| v.to_string())
                .map_err(|e| e.to_string())
        };
        assert_eq!(ok("euler", Some(3)), Ok("euler3".to_string()));
        assert_eq!(ok("euler3", Some(3)), Ok("euler3".to_string()));
        assert_eq!(ok("euler3", None), Ok("euler3".to_string()));
        assert_eq!(
            ok("diff+leapfrog", Some(2)),
            Ok("diff+leapfrog2".to_string())
        );
        let err = ok("euler3", Some(2)).unwrap_err();
        assert!(
            err.contains("names 3 integrator steps") && err.contains("euler2"),
            "{err}"
        );
        for name in ["standard", "mlp-only", "diff", "affine2"] {
            let err = ok(name, Some(3)).unwrap_err();
            assert!(err.contains("has no integrator steps"), "{name}: {err}");
        }
    }
}
