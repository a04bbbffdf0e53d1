//! The variants of a suite: names parsed by [`AttentionVariant`], with integrator steps expanded.

use coupled_qk::model::AttentionVariant;

/// Variants from names (see [`AttentionVariant`]'s `FromStr`), and for every `steps` value a
/// variant of each integrated name that gives no step count of its own (`euler` with steps 1,3 →
/// `euler1`, `euler3`), without repeats, in order.
pub fn parse_variants(names: &[String], steps: &[usize]) -> Result<Vec<AttentionVariant>, String> {
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
