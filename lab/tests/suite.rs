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
        &names(&[
            "standard",
            "euler",
            "leapfrog3",
            "diff",
            "euler",
            "diff+euler",
        ]),
        &[1, 3],
    )
    .unwrap();
    let labels: Vec<String> = variants.iter().map(|v| v.to_string()).collect();
    assert_eq!(
        labels,
        [
            "standard",
            "euler1",
            "euler3",
            "leapfrog3",
            "diff",
            "diff+euler1",
            "diff+euler3"
        ]
    );
    assert_eq!(
        variants[2],
        AttentionVariant::Coupled(DynamicsConfig::euler(3))
    );
    assert_eq!(variants[4], AttentionVariant::differential());
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
        dynamics: vec![],
        attention: vec![],
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

/// A small coherent text corpus through the real pipeline, in a fresh folder.
/// Three steps of 2 × 32 tokens of `model`, evaluated once on two windows.
fn three_steps(model: coupled_qk::model::GptConfig) -> coupled_qk_lab::lm::TrainConfig {
    let mut c = coupled_qk_lab::lm::TrainConfig::new(model);
    c.seq_len = 32;
    c.batch_size = 2;
    c.max_steps = 3;
    c.warmup_steps = 1;
    c.eval_every = 3;
    c.eval_windows = Some(2);
    c
}

fn small_corpus(dir: &std::path::Path) -> coupled_qk_lab::data::TokenizedCorpus {
    use coupled_qk_lab::data::{
        CorpusSource, LoadOptions, SplitOptions, TokenCache, TokenizerKind, load_corpus,
    };
    let mut text = String::new();
    for i in 0..40 {
        text.push_str(&format!(
            "The river runs past the mill number {i}, and the miller counts the sacks of grain \
             that the carts bring down from the hill every morning.\n\n"
        ));
    }
    let path = dir.join("corpus.txt");
    std::fs::write(&path, text).unwrap();
    let options = LoadOptions {
        split: SplitOptions {
            valid_fraction: 0.25,
            seed: 0,
        },
        cache: TokenCache::new(dir.join("cache")),
        verbose: false,
        ..LoadOptions::default()
    };
    load_corpus(&CorpusSource::Text(path), TokenizerKind::Bytes, &options)
        .unwrap()
        .corpus
}

#[test]
fn a_failing_cell_is_recorded_the_others_run_and_a_retry_trains_it_again() {
    use burn::backend::{Autodiff, Flex};
    use coupled_qk::model::GptConfig;
    use coupled_qk_lab::backend::MultiDeviceTask;
    use coupled_qk_lab::suite::{Cells, FailedCell, Suite};
    type B = Autodiff<Flex>;

    let dir = std::env::temp_dir().join(format!("coupled-qk-suite-fail-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let corpus = small_corpus(&dir);
    let config = |lr: f64| {
        let mut c = three_steps(GptConfig::new(256, 16, 1, 2, 32));
        c.lr = lr;
        c
    };
    let suite = |retry_failed| Suite {
        runs: dir.join("runs"),
        quiet: true,
        retry_failed,
        selection: Default::default(),
    };
    let run = |suite: &Suite, bad_lr: f64| {
        Cells {
            suite,
            cells: vec![
                (&corpus, "diverges".to_string(), config(bad_lr)),
                (&corpus, "fine".to_string(), config(1e-3)),
            ],
        }
        .run::<B>(vec![Default::default()], "flex", false)
    };

    // AdamW moves every weight by about the learning rate: 1e30 overflows at once.
    let first = run(&suite(false), 1e30);
    assert_eq!(first.results.len(), 1, "the other cell ran");
    assert_eq!(first.results[0].variant, "fine");
    assert_eq!(first.failed.len(), 1);
    let failed = &first.failed[0];
    assert_eq!((failed.variant.as_str(), failed.seed), ("diverges", 0));
    assert!(failed.error.contains("the loss is"), "{}", failed.error);
    assert_eq!(FailedCell::recorded(&failed.dir).as_ref(), Some(failed));
    let err = first.check().unwrap_err();
    assert!(
        matches!(&err, coupled_qk_lab::suite::SuiteError::Failed(cells) if cells.len() == 1),
        "{err}"
    );
    assert!(err.to_string().contains("diverges"), "{err}");
    let advice = coupled_qk_lab::cli::advice(&err).unwrap();
    assert!(advice.contains("rerun with --retry-failed"), "{advice}");
    // A failure that is not recorded (a damaged checkpoint, a folder in use) is tried again by
    // any rerun: no advice to retry it.
    let unrecorded = coupled_qk_lab::suite::SuiteError::Failed(vec![FailedCell {
        dir: dir.join("no-such-cell"),
        ..failed.clone()
    }]);
    let advice = coupled_qk_lab::cli::advice(&unrecorded).unwrap();
    assert!(
        advice.contains("without --retry-failed") && !advice.contains("rerun with --retry-failed"),
        "{advice}"
    );

    // Rerun: the failed cell is reported again without training (even with a good config now).
    let second = run(&suite(false), 1e-3);
    assert_eq!(second.failed, first.failed);
    assert_eq!(second.results.len(), 1);

    // Retry: trained from scratch, with the config given now.
    let third = run(&suite(true), 1e-3);
    assert!(third.failed.is_empty(), "{:?}", third.failed);
    assert_eq!(third.results.len(), 2);
    assert!(FailedCell::recorded(&failed.dir).is_none());
    third.check().unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn paired_differences_have_a_t_interval_and_count_the_seeds_ahead() {
    use coupled_qk_lab::suite::{paired, t_975};
    // Differences −0.1, −0.2, −0.3 (seed 3 of the variant has no standard partner).
    let results = vec![
        cell("standard", 0, f64::exp(3.0)),
        cell("standard", 1, f64::exp(3.5)),
        cell("standard", 2, f64::exp(2.5)),
        cell("euler1", 0, f64::exp(2.9)),
        cell("euler1", 1, f64::exp(3.3)),
        cell("euler1", 2, f64::exp(2.2)),
        cell("euler1", 3, f64::exp(1.0)),
        cell("diff", 0, f64::exp(3.1)),
    ];
    let p = paired(&results, "standard");
    assert_eq!(p.len(), 2);
    let euler = &p[0];
    assert_eq!(
        (euler.variant.as_str(), euler.seeds, euler.ahead),
        ("euler1", 3, 3)
    );
    assert!((euler.mean_diff + 0.2).abs() < 1e-12);
    // sd 0.1, se 0.1/√3, t(2) = 4.302653: half-width 0.24841.
    let half = 4.302_653 * 0.1 / 3f64.sqrt();
    let (lo, hi) = euler.ci95.unwrap();
    assert!((lo - (-0.2 - half)).abs() < 1e-7 && (hi - (-0.2 + half)).abs() < 1e-7);
    // One seed: a difference, no interval.
    assert_eq!((p[1].seeds, p[1].ahead, p[1].ci95), (1, 0, None));
    assert!((p[1].mean_diff - 0.1).abs() < 1e-12);
    // Tabulated quantiles (to the table's 4 decimals): t(1) 12.7062, t(5) 2.5706, t(100) 1.9840.
    for (df, q) in [(1, 12.7062), (5, 2.5706), (100, 1.9840)] {
        assert!((t_975(df) - q).abs() < 1e-4, "t({df}): {}", t_975(df));
    }
    assert!(t_975(0).is_nan());
}

#[test]
fn coupled_differential_attention_is_paired_with_standard_and_with_plain_diff() {
    use coupled_qk_lab::suite::paired_to_baselines;
    let results = vec![
        cell("standard", 0, f64::exp(3.0)),
        cell("diff", 0, f64::exp(2.8)),
        cell("euler1", 0, f64::exp(2.9)),
        cell("diff+euler1", 0, f64::exp(2.5)),
        cell("affine1", 0, f64::exp(2.7)),
        cell("affine-uncoupled1", 0, f64::exp(2.75)),
    ];
    let p = paired_to_baselines(&results);
    let found: Vec<(&str, &str)> = p
        .iter()
        .map(|p| (p.variant.as_str(), p.baseline.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("diff", "standard"),
            ("euler1", "standard"),
            ("diff+euler1", "standard"),
            ("affine1", "standard"),
            ("affine-uncoupled1", "standard"),
            ("diff+euler1", "diff"),
            ("affine1", "affine-uncoupled1"),
        ]
    );
    assert!((p[5].mean_diff + 0.3).abs() < 1e-12 && (p[2].mean_diff + 0.5).abs() < 1e-12);
    assert!((p[6].mean_diff + 0.05).abs() < 1e-12, "{}", p[6].mean_diff);
}

/// The structural ablation: MLP-only (the net without the coupling) and leapfrog (the other
/// integrator, same step count) are also paired with Euler; a leapfrog without its Euler is not.
#[test]
fn the_structural_ablation_is_paired_with_euler_too() {
    use coupled_qk_lab::suite::paired_to_baselines;
    let results = vec![
        cell("standard", 0, f64::exp(3.0)),
        cell("mlp-only", 0, f64::exp(2.95)),
        cell("euler1", 0, f64::exp(2.9)),
        cell("leapfrog1", 0, f64::exp(2.8)),
        cell("leapfrog3", 0, f64::exp(2.7)),
    ];
    let p = paired_to_baselines(&results);
    let found: Vec<(&str, &str)> = p
        .iter()
        .map(|p| (p.variant.as_str(), p.baseline.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("mlp-only", "standard"),
            ("euler1", "standard"),
            ("leapfrog1", "standard"),
            ("leapfrog3", "standard"),
            ("mlp-only", "euler1"),
            ("leapfrog1", "euler1"),
        ]
    );
    assert!((p[4].mean_diff - 0.05).abs() < 1e-12 && (p[5].mean_diff + 0.1).abs() < 1e-12);
}

#[test]
fn the_dynamics_table_averages_each_layer_over_seeds() {
    use coupled_qk::DynamicsStats;
    use coupled_qk_lab::lm::DynamicsRow;
    use coupled_qk_lab::suite::dynamics_table;
    let row = |layer: usize, dt: Vec<f64>, q: f64, entropy: f64| DynamicsRow {
        step: 100,
        layer,
        stats: DynamicsStats {
            dt,
            q_change: q,
            k_change: q / 2.0,
            entropy,
            entropy_standard: 2.0,
        },
    };
    let mut a = cell("euler1", 0, 8.0);
    a.dynamics = vec![
        row(0, vec![0.1, 0.3], 0.04, 1.9),
        row(1, vec![0.2], 0.1, 2.0),
    ];
    let mut b = cell("euler1", 1, 8.0);
    b.dynamics = vec![row(0, vec![0.4], 0.08, 1.7), row(1, vec![0.2], 0.1, 2.0)];
    let mut mlp = cell("mlp-only", 0, 8.0);
    mlp.dynamics = vec![row(0, vec![], 0.5, 2.5)];
    let mut standard = cell("standard", 0, 9.0);
    standard.dynamics = vec![row(0, vec![], 0.0, 2.0)];
    let table = dynamics_table(&[standard, a, b, mlp]);
    let lines: Vec<&str> = table.lines().skip(2).collect();
    // Layer 0: dt (0.2 and 0.4 per run) 0.3, q moves 0.06, k 0.03, entropy change −0.2.
    assert_eq!(
        lines,
        [
            "| c | euler1 | 0 | 2 | 0.300 | 0.060 | 0.030 | -0.200 |",
            "| c | euler1 | 1 | 2 | 0.200 | 0.100 | 0.050 | +0.000 |",
            "| c | mlp-only | 0 | 1 | – | 0.500 | 0.250 | +0.500 |",
        ]
    );
}

#[test]
fn the_attention_table_averages_each_layer_over_the_seeds_that_have_it() {
    use coupled_qk_lab::lm::{AttentionDiagnostics, AttentionRow};
    use coupled_qk_lab::suite::attention_table;
    let row = |layer: usize, rank: f64, ratio: f64| AttentionRow {
        step: 100,
        layer,
        diagnostics: AttentionDiagnostics {
            entropy: 2.0,
            normalised_entropy: rank / 100.0,
            effective_rank: rank,
            leading_ratio: ratio,
            distance_from_uniform: 0.5,
        },
    };
    let mut a = cell("euler1", 0, 8.0);
    a.attention = vec![row(0, 40.0, 2.0), row(1, 20.0, 3.0)];
    let mut b = cell("euler1", 1, 8.0);
    b.attention = vec![row(0, 60.0, 8.0)];
    // A run made before the diagnostics: no rows, counted nowhere.
    let old = cell("euler1", 2, 8.0);
    let table = attention_table(&[a, b, old]);
    let lines: Vec<&str> = table.lines().skip(2).collect();
    // Layer 0: rank (40 + 60)/2, σ₁/σ₂ the geometric mean of 2 and 8.
    assert_eq!(
        lines,
        [
            "| c | euler1 | 0 | 2 | 0.500 | 0.500 | 50.0 | 4.00 |",
            "| c | euler1 | 1 | 1 | 0.200 | 0.500 | 20.0 | 3.00 |",
        ]
    );
}

#[test]
fn seed_spreads_are_compared_by_the_f_test_over_the_shared_seeds() {
    use coupled_qk_lab::suite::{paired_to_baselines, spread_tests};
    let results = vec![
        cell("standard", 0, f64::exp(1.0)),
        cell("standard", 1, f64::exp(1.1)),
        cell("euler1", 0, f64::exp(1.0)),
        cell("euler1", 1, f64::exp(1.2)),
        // A seed only the variant finished is left out of both spreads.
        cell("euler1", 2, f64::exp(5.0)),
    ];
    let tests = spread_tests(&results, &paired_to_baselines(&results));
    assert_eq!(tests.len(), 1);
    let t = &tests[0];
    assert_eq!(
        (t.variant.as_str(), t.baseline.as_str(), t.seeds),
        ("euler1", "standard", 2)
    );
    assert!((t.std - 0.2 / 2f64.sqrt()).abs() < 1e-9, "{}", t.std);
    assert!((t.baseline_std - 0.1 / 2f64.sqrt()).abs() < 1e-9);
    assert!((t.ratio - 4.0).abs() < 1e-9, "{}", t.ratio);
    // One seed: no spread, and the table says so instead of printing NaN.
    let pair = [results[0].clone(), results[2].clone()];
    let one = spread_tests(&pair, &paired_to_baselines(&pair));
    let table = coupled_qk_lab::suite::spread_table(&one);
    assert!(
        table.lines().nth(2).unwrap().ends_with("| – | – |"),
        "{table}"
    );
    // F(1, 1) has CDF (2/π)·atan(√x): at 4, p = 2·(1 − (2/π)·atan 2).
    let expected = 2.0 * (1.0 - 2.0 / std::f64::consts::PI * 2f64.atan());
    assert!((t.p.unwrap() - expected).abs() < 1e-9, "{:?}", t.p);
}

/// The two cells of [`cells_per_process_merge_into_one_report`], on the small corpus in `dir`.
/// The corpus is `root`'s, the run folders go to `root/runs`.
fn two_cells_suite(
    root: &std::path::Path,
    runs: &str,
    selection: coupled_qk_lab::suite::Selection,
) -> coupled_qk_lab::suite::SuiteOutcome {
    use burn::backend::{Autodiff, Flex};
    use coupled_qk::model::GptConfig;
    use coupled_qk_lab::backend::MultiDeviceTask;
    use coupled_qk_lab::suite::{Cells, Suite};
    let corpus = small_corpus(root);
    let config = |variant: &str| {
        three_steps(GptConfig::new(256, 16, 1, 2, 32).with_attention(variant.parse().unwrap()))
    };
    let suite = Suite {
        runs: root.join(runs),
        quiet: true,
        retry_failed: false,
        selection,
    };
    Cells {
        suite: &suite,
        cells: vec![
            (&corpus, "standard".to_string(), config("standard")),
            (&corpus, "euler1".to_string(), config("euler1")),
        ],
    }
    .run::<Autodiff<Flex>>(vec![Default::default()], "flex", false)
}

const CELL_DIR: &str = "COUPLED_QK_TEST_CELL_DIR";
const CELL_INDEX: &str = "COUPLED_QK_TEST_CELL_INDEX";

/// Not a test of its own: one cell per process, as an array job's task runs it.
#[test]
#[ignore = "run by cells_per_process_merge_into_one_report"]
fn child_trains_one_cell() {
    let (Some(dir), Some(index)) = (std::env::var_os(CELL_DIR), std::env::var(CELL_INDEX).ok())
    else {
        return;
    };
    let selection = coupled_qk_lab::suite::Selection::One(index.parse().unwrap());
    let outcome = two_cells_suite(std::path::Path::new(&dir), "split", selection);
    assert_eq!(outcome.results.len(), 1);
}

/// A suite whose cells are trained one per process (two child processes) and then merged by a
/// report-only run gives what one process training both gives: the same cells, the same losses
/// to the bit. Before the cells are trained, a report-only run lists both as not trained.
#[test]
fn cells_per_process_merge_into_one_report() {
    use coupled_qk_lab::suite::{Selection, paired_table, seed_table};
    let root = std::env::temp_dir().join(format!("coupled-qk-suite-array-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let early = two_cells_suite(&root, "split", Selection::ReportOnly);
    assert!(early.results.is_empty());
    assert_eq!(early.failed.len(), 2);
    assert!(
        early.failed[1].error.contains("not trained yet (cell 1"),
        "{}",
        early.failed[1].error
    );

    for index in ["1", "0"] {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_trains_one_cell",
                "--ignored",
                "--test-threads=1",
            ])
            .env(CELL_DIR, &root)
            .env(CELL_INDEX, index)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "cell {index}'s process failed");
    }
    let merged = two_cells_suite(&root, "split", Selection::ReportOnly);
    let single = two_cells_suite(&root, "whole", Selection::All);
    assert!(merged.failed.is_empty(), "{:?}", merged.failed);
    let key = |o: &coupled_qk_lab::suite::SuiteOutcome| -> Vec<(String, u64, u64, u64)> {
        o.results
            .iter()
            .map(|r| (r.variant.clone(), r.seed, r.val_loss.to_bits(), r.tokens))
            .collect()
    };
    assert_eq!(key(&merged), key(&single));
    let paired = |o: &coupled_qk_lab::suite::SuiteOutcome| {
        paired_table(&coupled_qk_lab::suite::paired_to_baselines(&o.results))
    };
    assert!(paired(&single).contains("euler1"), "{}", paired(&single));
    assert_eq!(paired(&merged), paired(&single));
    // The per-seed table differs only in the wall times the two trainings took.
    assert_eq!(
        seed_table(&merged.results).lines().count(),
        seed_table(&single.results).lines().count()
    );
    std::fs::remove_dir_all(root).unwrap();
}
