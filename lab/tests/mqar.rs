//! The MQAR generator (faithful to Zoology's `multiquery_ar`) and the harness pieces it uses.

use coupled_qk_lab::mqar::{IGNORE, MqarTask};
use coupled_qk_lab::schedule::WarmupCosine;
use std::collections::HashSet;

fn task() -> MqarTask {
    MqarTask::new(128, 64, 8)
}

#[test]
fn context_keys_and_values_come_from_their_halves_without_repeats() {
    let t = task();
    let batch = t.generate(200, 1);
    for row in batch.inputs.chunks(t.seq_len) {
        let keys: Vec<i64> = row[..2 * t.kv_pairs].iter().step_by(2).copied().collect();
        let values: Vec<i64> = row[1..2 * t.kv_pairs].iter().step_by(2).copied().collect();
        assert!(keys.iter().all(|&k| (1..64).contains(&k)), "{keys:?}");
        assert!(values.iter().all(|&v| (64..128).contains(&v)), "{values:?}");
        assert_eq!(keys.iter().collect::<HashSet<_>>().len(), t.kv_pairs);
        assert_eq!(values.iter().collect::<HashSet<_>>().len(), t.kv_pairs);
    }
}

#[test]
fn every_key_is_queried_once_with_its_value_as_label() {
    let t = task();
    let context = 2 * t.kv_pairs;
    let batch = t.generate(200, 2);
    for (row, labels) in batch
        .inputs
        .chunks(t.seq_len)
        .zip(batch.labels.chunks(t.seq_len))
    {
        let pairs: Vec<(i64, i64)> = row[..context].chunks(2).map(|p| (p[0], p[1])).collect();
        let queried: Vec<usize> = (0..t.seq_len).filter(|&i| labels[i] != IGNORE).collect();
        assert_eq!(queried.len(), t.kv_pairs);
        let mut seen = HashSet::new();
        for &pos in &queried {
            // Queries sit after the context, at even offsets (Zoology's `2·gap`).
            assert!(
                pos >= context && (pos - context).is_multiple_of(2),
                "query at {pos}"
            );
            let (key, value) = pairs
                .iter()
                .copied()
                .find(|&(k, _)| k == row[pos])
                .unwrap_or_else(|| panic!("token {} at {pos} is not a context key", row[pos]));
            assert_eq!(
                labels[pos], value,
                "label at {pos} is not the value of key {key}"
            );
            assert!(seen.insert(key), "key {key} queried twice");
        }
        assert!(labels[..context].iter().all(|&l| l == IGNORE));
    }
}

#[test]
fn without_random_fill_non_queries_are_zero() {
    let t = MqarTask {
        random_non_queries: false,
        ..task()
    };
    let batch = t.generate(50, 3);
    for (row, labels) in batch
        .inputs
        .chunks(t.seq_len)
        .zip(batch.labels.chunks(t.seq_len))
    {
        for i in 2 * t.kv_pairs..t.seq_len {
            if labels[i] == IGNORE {
                assert_eq!(row[i], 0, "position {i}");
            }
        }
    }
}

#[test]
fn query_gaps_follow_the_power_law() {
    // p(gap) ∝ i^(a−1) with a = 0.01: the first gap is far likelier than the last.
    let t = MqarTask::new(128, 64, 2);
    let batch = t.generate(3000, 4);
    let space = (t.seq_len - 2 * t.kv_pairs) / 2;
    let mut counts = vec![0usize; space];
    for labels in batch.labels.chunks(t.seq_len) {
        for (i, &l) in labels.iter().enumerate() {
            if l != IGNORE {
                counts[(i - 2 * t.kv_pairs) / 2] += 1;
            }
        }
    }
    assert!(counts[0] > 5 * counts[space - 1], "{counts:?}");
    assert!(counts[0] > counts[space / 2], "{counts:?}");
}

#[test]
fn seeds_decide_the_data() {
    let t = task();
    assert_eq!(t.generate(20, 5), t.generate(20, 5));
    assert_ne!(t.generate(20, 5).inputs, t.generate(20, 6).inputs);
}

#[test]
fn zoologys_constraints_give_clear_errors() {
    use coupled_qk_lab::mqar::{MqarError, TaskRule};
    for (task, expected) in [
        (MqarTask::new(128, 63, 4), TaskRule::SeqLen),
        (MqarTask::new(64, 64, 4), TaskRule::Vocab),
        (MqarTask::new(128, 64, 17), TaskRule::KvPairs),
        (MqarTask::new(128, 64, 0), TaskRule::KvPairs),
    ] {
        let err = task.validate().unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(err, MqarError::Task { rule, seq_len, .. } if rule == expected && seq_len == task.seq_len),
            "{message}"
        );
        assert!(
            message.contains(&format!("seq_len {}", task.seq_len)),
            "{message}"
        );
    }
    assert!(MqarTask::new(128, 64, 4).validate().is_ok());
}

#[test]
fn warmup_then_cosine() {
    let s = WarmupCosine {
        peak: 1.0,
        warmup: 10,
        total: 110,
        min_ratio: 0.1,
    };
    assert!((s.at(0) - 0.1).abs() < 1e-12);
    assert!((s.at(9) - 1.0).abs() < 1e-12);
    assert!((s.at(60) - 0.55).abs() < 1e-12, "{}", s.at(60));
    assert!((s.at(110) - 0.1).abs() < 1e-12);
    assert!(s.at(30) > s.at(31));
}

#[test]
fn atomic_writes_replace_whole_files() {
    let dir = std::env::temp_dir().join(format!("coupled-qk-atomic-{}", std::process::id()));
    let path = dir.join("out.json");
    coupled_qk_lab::atomic::write(&path, b"first").unwrap();
    coupled_qk_lab::atomic::write(&path, b"second").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"second");
    let leftovers = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(leftovers, 1, "temporary files left in {}", dir.display());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_short_run_learns_that_labels_are_values() {
    use burn::backend::{Autodiff, Flex};
    use coupled_qk_lab::mqar::{MqarRun, train};
    let run = MqarRun {
        task: MqarTask::new(16, 8, 2),
        variant: coupled_qk::DynamicsConfig::euler(1).into(),
        d_model: 16,
        n_heads: 1,
        n_layers: 2,
        mlp: false,
        lr: 1e-2,
        weight_decay: 0.1,
        batch_size: 32,
        train_examples: 512,
        test_examples: 64,
        steps: 60,
        eval_every: 60,
        seed: 0,
    };
    let outcome = train::<Autodiff<Flex>>(
        &run,
        &[Default::default()],
        &indicatif::ProgressBar::hidden(),
    );
    // Chance over the whole vocabulary is ln 16 ≈ 2.77; knowing only that labels are values
    // (8 of 16 tokens) gives ln 8 ≈ 2.08.
    let loss = outcome.final_loss.expect("evaluated");
    assert!(loss < 2.3, "loss {loss}");
    assert!(!outcome.diverged);
    assert_eq!(outcome.steps, 60);
    assert!((0.0..=1.0).contains(&outcome.accuracy));
    assert_eq!(outcome.extra_params, 2 * (16 * 16 * 2 + 16 + 16 + 1));
}

#[test]
fn a_sweep_resumes_and_refuses_a_different_one() {
    use burn::backend::{Autodiff, Flex};
    use coupled_qk_lab::mqar::Sweep;
    let dir = std::env::temp_dir().join(format!("coupled-qk-sweep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sweep = Sweep {
        lrs: vec![1e-3, 3e-3],
        eval_every: 2,
        ..small_sweep()
    };
    let device = Default::default();
    let first = sweep
        .execute::<Autodiff<Flex>>(&dir, std::slice::from_ref(&device))
        .unwrap();
    assert_eq!(first.runs.len(), 2);
    assert_eq!(first.runs[0].backend.as_deref(), Some("autodiff<flex>"));
    assert_eq!(first.runs[0].dynamics_path.as_deref(), Some("fused"));
    // Drop one run, as an interrupted sweep would have: the rerun does only that one.
    let mut partial = first.clone();
    let kept = partial.runs.remove(1);
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_vec(&partial).unwrap(),
    )
    .unwrap();
    let second = sweep
        .execute::<Autodiff<Flex>>(&dir, std::slice::from_ref(&device))
        .unwrap();
    assert_eq!(second.runs.len(), 2);
    // A re-run would have taken its own time; the JSON round trip keeps the recorded one.
    let (a, b) = (
        second.runs[0].outcome.seconds,
        first.runs[0].outcome.seconds,
    );
    assert!(
        (a - b).abs() <= 1e-9 * b.abs(),
        "re-ran a finished run: {a} s vs {b} s"
    );
    assert_eq!(second.runs[1].key, kept.key);
    let other = Sweep { steps: 3, ..sweep };
    let err = other
        .execute::<Autodiff<Flex>>(&dir, std::slice::from_ref(&device))
        .unwrap_err();
    assert!(err.to_string().contains("different sweep"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Every parameter's gradient, flattened in the module's visiting order.
struct Flatten<'a> {
    grads: &'a burn::optim::GradientsParams,
    values: Vec<f32>,
}

impl burn::module::ModuleVisitor<burn::backend::Autodiff<burn::backend::Flex>> for Flatten<'_> {
    fn visit_float<const D: usize>(
        &mut self,
        param: &burn::module::Param<
            burn::tensor::Tensor<burn::backend::Autodiff<burn::backend::Flex>, D>,
        >,
    ) {
        if let Some(grad) = self.grads.get::<burn::backend::Flex, D>(param.id) {
            self.values
                .extend(grad.into_data().to_vec::<f32>().unwrap());
        }
    }
}

#[test]
fn two_devices_give_the_one_device_gradient_when_shards_hold_different_query_counts() {
    use burn::backend::{Autodiff, Flex};
    use burn::module::Module;
    use coupled_qk::DynamicsConfig;
    use coupled_qk::model::GptConfig;
    type B = Autodiff<Flex>;
    let t = task();
    let mut batch = t.generate(4, 3);
    // The second half (shard 1 of 2) keeps one query per example: its mean is over far fewer
    // positions than shard 0's, so averaging the two shard means would weight them wrongly.
    let half = batch.labels.len() / 2;
    for row in batch.labels[half..].chunks_mut(t.seq_len) {
        let mut kept = false;
        for label in row.iter_mut().filter(|l| **l != IGNORE) {
            if kept {
                *label = IGNORE;
            }
            kept = true;
        }
    }
    let device = Default::default();
    <B as burn::tensor::backend::Backend>::seed(&device, 0);
    let model = GptConfig::new(t.vocab, 32, 2, 2, t.seq_len)
        .with_attention(DynamicsConfig::euler(1).into())
        .with_mlp_ratio(0)
        .init::<B>(&device);
    let flat = |devices: &[burn::tensor::Device<B>]| {
        let (loss, grads) = coupled_qk_lab::mqar::batch_gradients(&model, &batch, devices);
        let mut flatten = Flatten {
            grads: &grads,
            values: Vec::new(),
        };
        model.visit(&mut flatten);
        (loss(), flatten.values)
    };
    let (loss1, one) = flat(std::slice::from_ref(&device));
    let (loss2, two) = flat(&[device, device]);
    assert_eq!(one.len(), two.len());
    let largest = one.iter().fold(0.0f32, |m, g| m.max(g.abs()));
    let differ = one
        .iter()
        .zip(&two)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!("largest |g| {largest:e}, 2 shards differ by {differ:e}; losses {loss1} / {loss2}");
    assert!(largest > 1e-4);
    assert!(
        differ <= 1e-5 * largest,
        "{differ:e} vs largest {largest:e}"
    );
    assert!((loss1 - loss2).abs() < 1e-5, "{loss1} vs {loss2}");
}

#[test]
fn a_sweep_refuses_a_batch_larger_than_its_examples_or_empty() {
    use burn::backend::{Autodiff, Flex};
    use coupled_qk_lab::mqar::Sweep;
    let sweep = Sweep {
        train_examples: 4,
        test_examples: 4,
        steps: 1,
        ..small_sweep()
    };
    let dir = std::env::temp_dir().join(format!("coupled-qk-sweep-bad-{}", std::process::id()));
    let device = Default::default();
    let devices = std::slice::from_ref(&device);
    let err = sweep.execute::<Autodiff<Flex>>(&dir, devices).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("batch_size = 8") && message.contains("train_examples = 4"),
        "{message}"
    );
    let empty = Sweep {
        batch_size: 0,
        ..sweep.clone()
    };
    let err = empty.execute::<Autodiff<Flex>>(&dir, devices).unwrap_err();
    assert!(err.to_string().contains("batch_size = 0"), "{err}");
    let uneven = Sweep {
        batch_size: 3,
        ..sweep
    };
    let err = uneven
        .execute::<Autodiff<Flex>>(&dir, &[device, device])
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("batch_size = 3") && message.contains("devices (2)"),
        "{message}"
    );
    assert!(!dir.exists(), "nothing is written for a refused sweep");
}

fn small_sweep() -> coupled_qk_lab::mqar::Sweep {
    coupled_qk_lab::mqar::Sweep {
        vocab: 16,
        tasks: vec![(8, 2)],
        variants: vec![coupled_qk::DynamicsConfig::Standard.into()],
        d_models: vec![8],
        lrs: vec![1e-3],
        n_heads: 1,
        n_layers: 1,
        mlp: false,
        batch_size: 8,
        train_examples: 16,
        test_examples: 8,
        steps: 2,
        eval_every: 1,
        seeds: vec![0],
    }
}

#[test]
fn bad_settings_are_refused_before_any_work_naming_the_field() {
    use burn::backend::{Autodiff, Flex};
    use coupled_qk_lab::mqar::Sweep;
    let dir = std::env::temp_dir().join(format!("coupled-qk-sweep-flags-{}", std::process::id()));
    let device = Default::default();
    let base = small_sweep();
    let euler0: coupled_qk::model::AttentionVariant = coupled_qk::DynamicsConfig::euler(1).into();
    let cases: Vec<(Sweep, &str)> = vec![
        (
            Sweep {
                n_heads: 0,
                ..base.clone()
            },
            "n_heads = 0",
        ),
        (
            Sweep {
                n_layers: 0,
                ..base.clone()
            },
            "n_layers = 0",
        ),
        (
            Sweep {
                steps: 0,
                ..base.clone()
            },
            "steps = 0",
        ),
        (
            Sweep {
                d_models: vec![0],
                ..base.clone()
            },
            "d_models: 0 must",
        ),
        (
            Sweep {
                d_models: vec![],
                ..base.clone()
            },
            "d_models: give at least one value",
        ),
        (
            Sweep {
                lrs: vec![0.0],
                ..base.clone()
            },
            "lrs: 0 is not",
        ),
        (
            Sweep {
                lrs: vec![-1e-3],
                ..base.clone()
            },
            "lrs: -0.001",
        ),
        (
            Sweep {
                lrs: vec![f64::NAN],
                ..base.clone()
            },
            "lrs: NaN",
        ),
        (
            Sweep {
                variants: vec![euler0.with_steps(0)],
                ..base.clone()
            },
            "variants: euler0",
        ),
    ];
    for (sweep, field) in cases {
        let err = sweep
            .execute::<Autodiff<Flex>>(&dir, std::slice::from_ref(&device))
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    assert!(!dir.exists(), "nothing is written for a refused sweep");
}

#[test]
fn a_diverged_run_is_recorded_and_its_results_file_reads_back() {
    use burn::backend::{Autodiff, Flex};
    let dir = std::env::temp_dir().join(format!("coupled-qk-sweep-nan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // AdamW moves every weight by about the learning rate a step: 1e30 overflows at once.
    let sweep = coupled_qk_lab::mqar::Sweep {
        lrs: vec![1e30],
        ..small_sweep()
    };
    let device = Default::default();
    let devices = std::slice::from_ref(&device);
    let first = sweep.execute::<Autodiff<Flex>>(&dir, devices).unwrap();
    let outcome = &first.runs[0].outcome;
    assert!(outcome.diverged, "{outcome:?}");
    assert_eq!(outcome.final_loss, None);
    // The finished (diverged) run reads back: a second execution runs nothing.
    let second = sweep.execute::<Autodiff<Flex>>(&dir, devices).unwrap();
    assert_eq!(second.runs.len(), 1);
    assert!(second.runs[0].outcome.diverged);
    std::fs::remove_dir_all(dir).unwrap();
}
