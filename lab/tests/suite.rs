//! The suite programs' pieces: variant names, statistics over seeds, and where a curve reaches a loss.

use coupled_qk::DynamicsConfig;
use coupled_qk::model::AttentionVariant;
use coupled_qk_lab::suite::{
    CellResult, CurvePoint, aggregate, first_reach, mean_std, parse_variants,
};

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn variants_expand_integrator_steps_and_reject_nonsense() {
    let variants = parse_variants(
        &names(&["standard", "euler", "leapfrog3", "diff", "euler"]),
        &[1, 3],
    )
    .unwrap();
    let labels: Vec<String> = variants.iter().map(|v| v.to_string()).collect();
    assert_eq!(
        labels,
        ["standard", "euler1", "euler3", "leapfrog3", "diff"]
    );
    assert_eq!(
        variants[2],
        AttentionVariant::Coupled(DynamicsConfig::euler(3))
    );
    assert_eq!(variants[4], AttentionVariant::Differential);
    for bad in ["standard3", "euler0", "eulr"] {
        assert!(parse_variants(&names(&[bad]), &[1]).is_err(), "{bad}");
    }
}

#[test]
fn mean_and_sample_std() {
    let (m, s) = mean_std(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
    assert!((m - 5.0).abs() < 1e-12);
    assert!((s - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
    assert_eq!(mean_std(&[3.0]), (3.0, 0.0));
}

fn cell(variant: &str, seed: u64, ppl: f64) -> CellResult {
    CellResult {
        corpus: "c".into(),
        variant: variant.into(),
        seed,
        val_loss: ppl.ln(),
        val_ppl: ppl,
        val_bpb: 1.0,
        tokens: 100,
        wall_s: 1.0,
        tokens_per_s: 100.0,
        params: 10,
        extra_params: 0,
        curve: vec![],
        dir: Default::default(),
    }
}

#[test]
fn aggregates_group_by_corpus_and_variant_in_order() {
    let results = [
        cell("standard", 0, 10.0),
        cell("euler1", 0, 8.0),
        cell("standard", 1, 12.0),
        cell("euler1", 1, 8.0),
    ];
    let a = aggregate(&results);
    assert_eq!(a.len(), 2);
    assert_eq!((a[0].variant.as_str(), a[0].seeds), ("standard", 2));
    assert!((a[0].ppl.0 - 11.0).abs() < 1e-12 && (a[0].ppl.1 - 2f64.sqrt()).abs() < 1e-12);
    assert_eq!(a[1].ppl, (8.0, 0.0));
}

#[test]
fn first_reach_interpolates_between_evaluations() {
    let point = |step: usize, loss: f64| CurvePoint {
        step,
        tokens: step as u64 * 100,
        elapsed_s: step as f64,
        val_loss: loss,
    };
    let curve = [point(1, 3.0), point(2, 2.0), point(3, 1.0)];
    let (tokens, seconds) = first_reach(&curve, 1.5).unwrap();
    assert!((tokens - 250.0).abs() < 1e-9 && (seconds - 2.5).abs() < 1e-9);
    assert_eq!(first_reach(&curve, 3.5), Some((100.0, 1.0)));
    assert_eq!(first_reach(&curve, 0.5), None);
}
