//! Variant names of the suites: `standard`, `mlp-only`, `euler`, `leapfrog`, `diff`, and a coupled
//! variant with its integrator steps (`euler3`, `leapfrog5`).

use coupled_qk::DynamicsConfig;
use coupled_qk::model::AttentionVariant;
use std::str::FromStr;

/// An attention variant with its label in tables and folder names.
#[derive(Clone, Debug, PartialEq)]
pub struct Variant {
    /// `standard`, `mlp-only`, `euler1`, `leapfrog3`, `diff`, …
    pub label: String,
    /// The variant.
    pub variant: AttentionVariant,
}

impl FromStr for Variant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let base = s.trim_end_matches(|c: char| c.is_ascii_digit());
        let steps: Option<usize> = s[base.len()..].parse().ok();
        let variant = base
            .parse::<AttentionVariant>()
            .map_err(|e| e.to_string())?;
        Ok(match variant {
            AttentionVariant::Dynamics(DynamicsConfig::Coupled {
                integrator,
                steps: default,
            }) => {
                let steps = steps.unwrap_or(default);
                if steps == 0 {
                    return Err(format!(
                        "`{s}`: a coupled variant needs at least one integrator step"
                    ));
                }
                Variant {
                    label: format!("{}{steps}", variant.name()),
                    variant: AttentionVariant::Dynamics(DynamicsConfig::Coupled {
                        integrator,
                        steps,
                    }),
                }
            }
            _ if steps.is_some() => {
                return Err(format!("`{s}`: only euler and leapfrog take a step count"));
            }
            other => Variant {
                label: other.name().to_string(),
                variant: other,
            },
        })
    }
}

/// Variants from names, and for every `steps` value a coupled variant of each coupled name
/// (`euler` with steps 1,3 → `euler1`, `euler3`), without repeats, in order.
pub fn parse_variants(names: &[String], steps: &[usize]) -> Result<Vec<Variant>, String> {
    let mut out: Vec<Variant> = Vec::new();
    for name in names {
        let parsed: Variant = name.parse()?;
        let coupled = matches!(
            parsed.variant,
            AttentionVariant::Dynamics(DynamicsConfig::Coupled { .. })
        );
        let has_digits = name.ends_with(|c: char| c.is_ascii_digit());
        let expanded: Vec<Variant> = if coupled && !has_digits && !steps.is_empty() {
            steps
                .iter()
                .map(|n| format!("{name}{n}").parse())
                .collect::<Result<_, _>>()?
        } else {
            vec![parsed]
        };
        for v in expanded {
            if !out.iter().any(|o| o.label == v.label) {
                out.push(v);
            }
        }
    }
    Ok(out)
}
