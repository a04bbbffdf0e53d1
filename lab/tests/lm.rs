//! The language-model training harness: a short `tiny` run that learns and writes its outputs,
//! exact resume, a divergence that keeps the last good checkpoint, checkpoint pruning,
//! data-parallel training over several devices, and the fused loss against the explicit one.

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use coupled_qk::model::{GptConfig, Preset};
use coupled_qk_lab::data::{TokenIds, TokenStream, TokenizedCorpus, TrainWindows};
use coupled_qk_lab::lm::{
    ATTENTION_HEADER, AttentionRow, DYNAMICS_HEADER, DynamicsRow, EvalRow, HEADER, LossKind,
    MetricsRow, RecordedChange, RunConfig, RunOptions, TrainConfig, TrainError, batch_gradients,
    differing_fields, list_checkpoints, read_metrics, train, train_on_devices, train_with,
};
mod support;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;
use support::corpus::corpus;

type B = Autodiff<Flex>;

/// The backend's random generator is process-global: runs that seed it and draw from it
/// (initialisation) must not interleave, or "the same run twice" is not the same run.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The `tiny` architecture with a 64-token window and 8 rows.
fn tiny(max_steps: usize) -> TrainConfig {
    let mut c = TrainConfig::new(GptConfig::preset(Preset::Tiny, 256));
    c.seq_len = 64;
    c.batch_size = 8;
    c.max_steps = max_steps;
    c.lr = 3e-3;
    c.warmup_steps = 5.min(max_steps);
    c.eval_every = 10;
    c.eval_windows = Some(16);
    c.eval_batch = 16;
    c.log_every = 1;
    c.checkpoint_every = 1000;
    c
}

fn out_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("lm").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn quiet() -> RunOptions {
    RunOptions {
        quiet: true,
        ..Default::default()
    }
}

fn steps(dir: &Path) -> Vec<usize> {
    list_checkpoints(dir)
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect()
}

#[test]
fn a_tiny_run_learns_and_writes_every_output() {
    let _guard = serial();
    let corpus = corpus();
    let dir = out_dir("outputs");
    let mut config = tiny(60);
    config.eval_every = 20;
    config.log_every = 5;
    config.checkpoint_every = 30;
    let started = Instant::now();
    let summary = train_with::<B>(&config, &corpus, &dir, &quiet(), &Default::default()).unwrap();
    eprintln!(
        "60 tiny steps: {:.1}s, {:.0} tokens/s",
        started.elapsed().as_secs_f64(),
        summary.tokens_per_s
    );

    let run: RunConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(run.train.max_steps, 60);
    assert_eq!(run.corpus.name, "test-english");
    assert_eq!(run.corpus.tokenizer, "bytes");
    assert_eq!(run.backend.as_deref(), Some("autodiff<flex>"));
    assert_eq!(run.dynamics_path.as_deref(), Some("fused"));

    let csv = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
    assert_eq!(csv.lines().next(), Some(HEADER));
    assert_eq!(
        HEADER,
        "step,tokens,lr,train_loss,val_loss,val_ppl,val_bpb,tokens_per_s,elapsed_s"
    );
    let rows = read_metrics(&dir.join("metrics.csv")).unwrap();
    assert_eq!(
        rows.iter().map(|r| r.step).collect::<Vec<_>>(),
        (1..=12).map(|i| 5 * i).collect::<Vec<_>>()
    );
    assert_eq!(rows.last().unwrap().tokens, 60 * 8 * 64);
    let evals: Vec<&MetricsRow> = rows.iter().filter(|r| r.val.is_some()).collect();
    assert_eq!(
        evals.iter().map(|r| r.step).collect::<Vec<_>>(),
        [20, 40, 60]
    );
    let (first, last) = (evals[0].val.unwrap(), evals[2].val.unwrap());
    eprintln!("validation loss {:.3} → {:.3}", first.loss, last.loss);
    assert!(
        last.loss < first.loss,
        "validation loss did not fall: {first:?} → {last:?}"
    );
    // Bytes: one byte per token, so bits per byte = loss / ln 2.
    assert!((last.bpb - last.loss / std::f64::consts::LN_2).abs() < 1e-9);
    assert!((last.ppl - last.loss.exp()).abs() < 1e-9 * last.ppl);

    let summary_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    for field in [
        "val_loss",
        "val_ppl",
        "val_bpb",
        "tokens",
        "steps",
        "wall_s",
        "params",
        "extra_params",
    ] {
        let value = summary_json[field]
            .as_f64()
            .unwrap_or_else(|| panic!("summary.json lacks {field}"));
        assert!(value.is_finite(), "{field} = {value}");
    }
    // serde_json (without its float_roundtrip feature) may read a float back one ulp off.
    assert!((summary_json["val_loss"].as_f64().unwrap() - last.loss).abs() < 1e-12);
    assert_eq!(summary_json["steps"].as_u64(), Some(60));
    assert!(summary.finished && summary.extra_params > 0 && summary.params > summary.extra_params);

    let svg = std::fs::read_to_string(dir.join("loss.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("</svg>"));
    assert_eq!(steps(&dir), [30, 60]);

    // The dynamics of the 4 Euler layers at each evaluation: dt learned away from its 0.1,
    // queries moved, the summary holding the last evaluation's.
    let dynamics = std::fs::read_to_string(dir.join("dynamics.csv")).unwrap();
    let mut lines = dynamics.lines();
    assert_eq!(lines.next(), Some(DYNAMICS_HEADER));
    let rows: Vec<DynamicsRow> = lines.map(|l| DynamicsRow::parse(l).unwrap()).collect();
    let at: Vec<(usize, usize)> = rows.iter().map(|r| (r.step, r.layer)).collect();
    let expected: Vec<(usize, usize)> = [20, 40, 60]
        .into_iter()
        .flat_map(|s| (0..4).map(move |l| (s, l)))
        .collect();
    assert_eq!(at, expected);
    for r in &rows {
        let dt = r.dt_mean().unwrap();
        assert!(dt != 0.1 && dt.is_finite(), "{r:?}");
        assert!(r.stats.q_change > 0.0 && r.stats.k_change > 0.0, "{r:?}");
    }
    assert_eq!(summary.dynamics, rows[8..]);
    let svg = std::fs::read_to_string(dir.join("dynamics.svg")).unwrap();
    assert!(svg.contains("layer 3"));

    // The attention diagnostics beside them, at the same evaluations: within their bounds (the
    // windows' first 128 positions, a causal map of full rank at most).
    let attention = std::fs::read_to_string(dir.join("attention.csv")).unwrap();
    let mut lines = attention.lines();
    assert_eq!(lines.next(), Some(ATTENTION_HEADER));
    let rows: Vec<AttentionRow> = lines.map(|l| AttentionRow::parse(l).unwrap()).collect();
    let at: Vec<(usize, usize)> = rows.iter().map(|r| (r.step, r.layer)).collect();
    assert_eq!(at, expected);
    for r in &rows {
        let d = r.diagnostics;
        assert!(
            d.entropy > 0.0 && (0.0..=1.0).contains(&d.normalised_entropy),
            "{r:?}"
        );
        assert!((0.0..1.0).contains(&d.distance_from_uniform), "{r:?}");
        assert!((1.0..=128.0).contains(&d.effective_rank), "{r:?}");
        assert!(d.leading_ratio >= 1.0, "{r:?}");
    }
    assert_eq!(summary.attention, rows[8..]);
    let svg = std::fs::read_to_string(dir.join("attention.svg")).unwrap();
    assert!(svg.contains("layer 3"));
}

#[test]
fn a_resumed_run_repeats_the_uninterrupted_losses() {
    let _guard = serial();
    let corpus = corpus();
    let mut config = tiny(12);
    config.batch_size = 4;
    config.grad_accum = 2;
    config.eval_every = 6;
    config.log_every = 1;
    config.checkpoint_every = 4;
    let device = Default::default();

    let whole = out_dir("resume-whole");
    train_with::<B>(&config, &corpus, &whole, &quiet(), &device).unwrap();

    let split = out_dir("resume-split");
    let first = RunOptions {
        stop_at: Some(6),
        ..quiet()
    };
    let stopped = train_with::<B>(&config, &corpus, &split, &first, &device).unwrap();
    assert!(!stopped.finished);
    assert_eq!(steps(&split), [4, 6]);
    // A run killed after the checkpoint of step 6 had written rows past it, the last one torn:
    // both are dropped on resume (the uninterrupted losses below show it).
    {
        use std::io::Write;
        let mut csv = std::fs::OpenOptions::new()
            .append(true)
            .open(split.join("metrics.csv"))
            .unwrap();
        write!(csv, "7,1,not-a-number,,,,,,\n8,1,0.1,4.").unwrap();
    }
    let resumed = train_with::<B>(
        &config,
        &corpus,
        &split,
        &RunOptions {
            resume: true,
            ..quiet()
        },
        &device,
    )
    .unwrap();
    assert_eq!(resumed.resumed_from, Some(6));
    assert!(resumed.finished);

    let a = read_metrics(&whole.join("metrics.csv")).unwrap();
    let b = read_metrics(&split.join("metrics.csv")).unwrap();
    assert_eq!(a.len(), 12);
    assert_eq!(
        b.len(),
        12,
        "the resumed metrics.csv has one row per step, none repeated"
    );
    let mut worst = 0.0f64;
    for (x, y) in a.iter().zip(&b) {
        assert_eq!((x.step, x.tokens, x.lr), (y.step, y.tokens, y.lr));
        worst = worst.max((x.train_loss - y.train_loss).abs());
    }
    eprintln!("largest train-loss difference after the resume: {worst:e}");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            x.train_loss.to_bits(),
            y.train_loss.to_bits(),
            "step {}: {} vs {}",
            x.step,
            x.train_loss,
            y.train_loss
        );
        assert_eq!(x.val, y.val, "step {}", x.step);
    }
    let dynamics = |dir: &Path| std::fs::read_to_string(dir.join("dynamics.csv")).unwrap();
    assert_eq!(
        dynamics(&split),
        dynamics(&whole),
        "dynamics.csv after the resume"
    );

    // Stopped between metrics rows (log_every 5, stop at 7): the checkpoint carries the losses
    // of the open interval, so the next row is the mean the uninterrupted run would write.
    let sparse = TrainConfig {
        log_every: 5,
        ..config.clone()
    };
    let split = out_dir("resume-between-rows");
    let first = RunOptions {
        stop_at: Some(7),
        ..quiet()
    };
    train_with::<B>(&sparse, &corpus, &split, &first, &device).unwrap();
    assert_eq!(steps(&split), [4, 7]);
    let again = RunOptions {
        resume: true,
        ..quiet()
    };
    train_with::<B>(&sparse, &corpus, &split, &again, &device).unwrap();
    let c = read_metrics(&split.join("metrics.csv")).unwrap();
    let mean = |from: usize, to: usize| {
        let losses: Vec<f64> = a[from - 1..to].iter().map(|r| r.train_loss).collect();
        losses.iter().sum::<f64>() / losses.len() as f64
    };
    let expected = [
        (5, mean(1, 5)),
        (6, mean(6, 6)),
        (10, mean(7, 10)),
        (12, mean(11, 12)),
    ];
    let got: Vec<(usize, f64)> = c.iter().map(|r| (r.step, r.train_loss)).collect();
    assert_eq!(got, expected);
    assert_eq!(c[3].val, a[11].val);
}

#[test]
fn a_divergence_stops_the_run_and_keeps_the_last_good_checkpoint() {
    let _guard = serial();
    let corpus = corpus();
    let dir = out_dir("diverge");
    let mut good = tiny(12);
    good.checkpoint_every = 2;
    good.keep_checkpoints = 5;
    let device = Default::default();
    train_with::<B>(
        &good,
        &corpus,
        &dir,
        &RunOptions {
            stop_at: Some(4),
            ..quiet()
        },
        &device,
    )
    .unwrap();
    assert_eq!(steps(&dir), [2, 4]);

    let mut bad = good.clone();
    bad.lr = 1e30;
    // A plain resume with another learning rate is refused, naming the field.
    let refused = train_with::<B>(
        &bad,
        &corpus,
        &dir,
        &RunOptions {
            resume: true,
            ..quiet()
        },
        &device,
    );
    match refused {
        Err(TrainError::ConfigMismatch { changes, .. }) => {
            let fields: Vec<&str> = changes.iter().map(|c| c.field.as_str()).collect();
            assert_eq!(fields, ["lr"]);
        }
        other => panic!("expected ConfigMismatch, got {other:?}"),
    }

    // Allowed as an optimiser change: resumed, and recorded in config.json with its step.
    let forced = RunOptions {
        resume: true,
        allow_changes: vec!["lr"],
        ..quiet()
    };
    let error = train_with::<B>(&bad, &corpus, &dir, &forced, &device).unwrap_err();
    eprintln!("{error}");
    match &error {
        TrainError::NonFinite {
            step,
            loss,
            checkpoint,
        } => {
            assert!(*step > 4 && !loss.is_finite(), "step {step}, loss {loss}");
            assert_eq!(
                checkpoint.as_deref(),
                Some(dir.join("checkpoints/step-0000004").as_path())
            );
        }
        other => panic!("expected NonFinite, got {other:?}"),
    }
    assert!(error.to_string().contains("step-0000004"));
    assert_eq!(steps(&dir), [2, 4], "no checkpoint of the diverged state");
    let recorded: RunConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(recorded.train.lr, 1e30);
    assert_eq!(
        recorded.changes,
        [RecordedChange {
            step: 4,
            field: "lr".into(),
            old: "0.003".into(),
            new: "1e+30".into(),
        }]
    );

    // An architecture change is refused even where optimiser changes are allowed.
    let mut wider = good.clone();
    wider.model.d_model = 64;
    let refused = train_with::<B>(&wider, &corpus, &dir, &forced, &device);
    assert!(
        matches!(&refused, Err(TrainError::ConfigMismatch { changes, .. }) if changes.iter().any(|c| c.field == "model.d_model")),
        "{refused:?}"
    );
    // Forced with allow_config_change, the checkpoint's shapes are checked against the model.
    let any = RunOptions {
        resume: true,
        allow_config_change: true,
        ..quiet()
    };
    let err = train_with::<B>(&wider, &corpus, &dir, &any, &device).unwrap_err();
    assert!(
        err.to_string().contains("shape") && err.to_string().contains("another architecture"),
        "{err}"
    );

    // The kept checkpoint still loads and trains.
    let back = RunOptions {
        resume: true,
        allow_config_change: true,
        stop_at: Some(5),
        ..quiet()
    };
    let summary = train_with::<B>(&good, &corpus, &dir, &back, &device).unwrap();
    assert_eq!((summary.resumed_from, summary.steps), (Some(4), 5));
    assert!(summary.train_loss.unwrap().is_finite());
}

#[test]
fn only_the_last_k_checkpoints_are_kept() {
    let _guard = serial();
    let corpus = corpus();
    let dir = out_dir("prune");
    let mut config = tiny(6);
    config.checkpoint_every = 1;
    config.keep_checkpoints = 2;
    let device = Default::default();
    // Resuming where there is no checkpoint starts a fresh run.
    let summary = train::<B>(&config, &corpus, &dir, true, &device).unwrap();
    assert_eq!((summary.resumed_from, summary.steps), (None, 6));
    assert_eq!(steps(&dir), [5, 6]);
    assert_eq!(
        std::fs::read_dir(dir.join("checkpoints")).unwrap().count(),
        2
    );
    // A fresh run into the folder is refused.
    match train::<B>(&config, &corpus, &dir, false, &device) {
        Err(TrainError::RunExists { what, .. }) => assert!(what.contains("step 6"), "{what}"),
        other => panic!("expected RunExists, got {other:?}"),
    }
    // An interrupted write (a `.partial` folder) is no checkpoint.
    let partial = dir.join("checkpoints/step-0000009.partial");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("model.mpk"), b"half").unwrap();
    assert_eq!(steps(&dir), [5, 6]);
    // A `step-N` folder without its manifest is a damaged checkpoint: listed, never loaded.
    let unmanifested = dir.join("checkpoints/step-0000009");
    std::fs::create_dir_all(&unmanifested).unwrap();
    let newest = dir.join("checkpoints/step-0000006");
    for file in ["model.mpk", "optimizer.mpk", "state.json"] {
        std::fs::copy(newest.join(file), unmanifested.join(file)).unwrap();
    }
    assert_eq!(steps(&dir), [5, 6, 9]);
    // Resuming a finished run changes nothing: the damaged folder is set aside, kept.
    let again = train::<B>(&config, &corpus, &dir, true, &device).unwrap();
    assert_eq!(
        (again.resumed_from, again.steps, again.val_loss),
        (Some(6), 6, summary.val_loss)
    );
    assert_eq!(read_metrics(&dir.join("metrics.csv")).unwrap().len(), 6);
    assert!(
        !partial.exists(),
        "the resume removes the interrupted write"
    );
    assert_eq!(steps(&dir), [5, 6]);
    assert!(
        dir.join("checkpoints/step-0000009.rejected/model.mpk")
            .is_file(),
        "the damaged checkpoint is kept aside"
    );
}

#[test]
fn configs_are_checked_before_anything_runs() {
    let corpus = corpus();
    let mut config = tiny(10);
    config.seq_len = 512;
    let error = config.validate().unwrap_err().to_string();
    assert!(
        error.contains("seq_len") && error.contains("256"),
        "{error}"
    );

    let mut config = tiny(10);
    config.model.vocab_size = 50257;
    let error = config.validate_for(&corpus).unwrap_err().to_string();
    assert!(
        error.contains("model.vocab_size") && error.contains("bytes"),
        "{error}"
    );

    // A validation split shorter than one window: refused before any folder is made, naming
    // the corpus and the split.
    let mut short = corpus.clone();
    short.valid.ids = TokenIds::from_u32(vec![65; 40], 256);
    let dir = out_dir("short-validation");
    let error = train_with::<B>(&tiny(10), &short, &dir, &quiet(), &Default::default())
        .unwrap_err()
        .to_string();
    for part in ["validation split", "test-english", "40 tokens", "65"] {
        assert!(error.contains(part), "`{part}` missing from: {error}");
    }
    assert!(!dir.exists(), "no run folder for a refused run");

    // Sizes whose product overflows are refused naming the fields, not wrapped to 0 tokens.
    let mut config = tiny(10);
    config.batch_size = 1 << 32;
    config.grad_accum = 1 << 32;
    let error = config.validate().unwrap_err().to_string();
    assert!(
        error.contains("batch_size") && error.contains("overflows"),
        "{error}"
    );
    let mut config = tiny(10);
    config.max_steps = usize::MAX / 2;
    config.warmup_steps = 0;
    let error = config.validate().unwrap_err().to_string();
    assert!(
        error.contains("max_steps") && error.contains("overflows"),
        "{error}"
    );

    // A micro-batch with more tokens than the training stream: refused before any folder.
    let mut config = tiny(10);
    config.batch_size = corpus.train.len() / config.seq_len + 1;
    let dir = out_dir("batch-beyond-the-corpus");
    let error = train_with::<B>(&config, &corpus, &dir, &quiet(), &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("batch_size") && error.contains("training tokens"),
        "{error}"
    );
    assert!(!dir.exists(), "no run folder for a refused run");

    for edit in [
        |c: &mut TrainConfig| c.batch_size = 0,
        |c: &mut TrainConfig| c.min_lr_ratio = 2.0,
        |c: &mut TrainConfig| c.betas = (0.9, 1.0),
        |c: &mut TrainConfig| c.grad_clip = Some(0.0),
        |c: &mut TrainConfig| c.warmup_steps = 11,
        |c: &mut TrainConfig| c.eval_windows = Some(0),
    ] {
        let mut config = tiny(10);
        edit(&mut config);
        assert!(config.validate().is_err(), "{config:?}");
    }
    assert!(tiny(10).validate().is_ok());
}

#[test]
fn config_differences_name_their_fields_but_ignore_bookkeeping() {
    let corpus = corpus();
    let a = tiny(10);
    let mut b = a.clone();
    b.model.d_model = 64;
    b.seed = 3;
    b.checkpoint_every = 7;
    b.log_every = 3;
    let json =
        |c: &TrainConfig| serde_json::from_str(&RunConfig::new(c, &corpus).to_json()).unwrap();
    let changes = differing_fields(&json(&a), &json(&b));
    let fields: Vec<&str> = changes.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(fields, ["model.d_model", "seed"]);
    assert_eq!(changes[0].to_string(), "model.d_model (128 → 64)");
}

#[test]
fn metrics_rows_round_trip_exactly() {
    let row = MetricsRow {
        step: 7,
        tokens: 3584,
        lr: 0.0029999999999999996,
        train_loss: 2.651_234_567_890_123,
        val: Some(coupled_qk_lab::lm::Validation {
            loss: 1.1,
            ppl: 1.1f64.exp(),
            bpb: 1.1 / std::f64::consts::LN_2,
        }),
        tokens_per_s: 12345.678,
        elapsed_s: 0.1,
    };
    assert_eq!(MetricsRow::parse(&row.to_csv()).unwrap(), row);
    let plain = MetricsRow { val: None, ..row };
    assert_eq!(plain.to_csv().split(',').nth(4), Some(""));
    assert_eq!(MetricsRow::parse(&plain.to_csv()).unwrap(), plain);
}

#[test]
fn two_devices_train_like_one_on_the_same_batch() {
    let _guard = serial();
    let corpus = corpus();
    let mut config = tiny(10);
    config.batch_size = 8;
    config.grad_accum = 2;
    config.eval_every = 5;
    config.log_every = 1;
    let device: burn::tensor::Device<B> = Default::default();

    let one = out_dir("devices-one");
    train_on_devices::<B>(
        &config,
        &corpus,
        &one,
        &quiet(),
        std::slice::from_ref(&device),
    )
    .unwrap();
    // Flex is one device: passing it twice still runs two shards of 4 rows, each on a pool
    // thread with its own fork of the model, and sums their gradients on the main device.
    let two = out_dir("devices-two");
    let summary =
        train_on_devices::<B>(&config, &corpus, &two, &quiet(), &[device, device]).unwrap();
    assert!(summary.finished);

    let a = read_metrics(&one.join("metrics.csv")).unwrap();
    let b = read_metrics(&two.join("metrics.csv")).unwrap();
    assert_eq!(a.len(), 10);
    assert_eq!(b.len(), 10);
    let (mut worst, mut worst_val) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!((x.step, x.tokens, x.lr), (y.step, y.tokens, y.lr));
        worst = worst.max((x.train_loss - y.train_loss).abs());
        if let (Some(u), Some(v)) = (x.val, y.val) {
            worst_val = worst_val.max((u.loss - v.loss).abs());
        }
    }
    eprintln!(
        "two devices vs one: largest train-loss difference {worst:e}, validation {worst_val:e} \
         (losses {:.4} → {:.4})",
        a[0].train_loss, a[9].train_loss
    );
    // Only float rounding differs (the shards' sums are added in another order). Measured on
    // Flex over these 10 steps: train losses within 7.2e-7, validation losses equal (a few f32
    // ulps at losses of 3 to 5; 9.5e-7 apart with a thread per device); the bound leaves a
    // margin of 10.
    assert!(worst < 1e-5, "train losses differ by up to {worst:e}");
    assert!(
        worst_val < 1e-5,
        "validation losses differ by up to {worst_val:e}"
    );
    assert!(
        a[9].train_loss < a[0].train_loss - 0.5,
        "the run did not learn"
    );

    // A batch that does not split evenly is refused before anything is written.
    let uneven = out_dir("devices-uneven");
    let mut odd = config.clone();
    odd.batch_size = 6;
    let devices = vec![device; 4];
    match train_on_devices::<B>(&odd, &corpus, &uneven, &quiet(), &devices) {
        Err(error @ TrainError::Config { .. }) => {
            let message = error.to_string();
            assert!(
                message.contains("batch_size = 6") && message.contains("(4)"),
                "{message}"
            );
            eprintln!("{message}");
        }
        other => panic!("expected a Config error naming batch_size, got {other:?}"),
    }
    assert!(!uneven.exists());
}

/// Every parameter's gradient, flattened in the module's visiting order.
struct Flatten<'a> {
    grads: &'a GradientsParams,
    values: Vec<f32>,
    tensors: usize,
}

impl ModuleVisitor<B> for Flatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.grads.get::<Flex, D>(param.id) {
            self.values
                .extend(grad.into_data().to_vec::<f32>().unwrap());
            self.tensors += 1;
        }
    }
}

#[test]
fn the_shards_gradients_sum_to_the_one_device_gradient() {
    let _guard = serial();
    let corpus = corpus();
    let config = tiny(10);
    let device: burn::tensor::Device<B> = Default::default();
    <B as burn::tensor::backend::Backend>::seed(&device, 0);
    let model = config.model.init::<B>(&device);
    let windows = TrainWindows::new(&corpus.train, config.seq_len, 0).unwrap();
    let batch = windows.batch(0, 8);
    let flatten = |devices: &[burn::tensor::Device<B>]| {
        let (loss, grads) = batch_gradients(&model, &batch, devices, 2, config.loss).unwrap();
        let mut flat = Flatten {
            grads: &grads,
            values: Vec::new(),
            tensors: 0,
        };
        model.visit(&mut flat);
        (loss, flat.values, flat.tensors)
    };
    let (loss1, one, tensors1) = flatten(std::slice::from_ref(&device));
    let (loss2, two, tensors2) = flatten(&[device, device]);
    let (loss4, four, tensors4) = flatten(&[device; 4]);
    assert_eq!((tensors2, tensors4), (tensors1, tensors1));
    assert_eq!((two.len(), four.len()), (one.len(), one.len()));
    let largest = one.iter().fold(0.0f32, |m, g| m.max(g.abs()));
    let differ = |other: &[f32]| {
        one.iter()
            .zip(other)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
    };
    let (d2, d4) = (differ(&two), differ(&four));
    eprintln!(
        "{tensors1} gradient tensors, largest |g| {largest:e}: 2 shards differ by up to {d2:e}, \
         4 by {d4:e}; losses {loss1} / {loss2} / {loss4}"
    );
    // Measured on Flex: 2 shards within 8.9e-8 of the one-device gradient, 4 within 7.5e-8
    // (3e-7 of its largest entry, 0.315); the bound is 1e-5 of it. Losses within 2.4e-7. A wrong
    // scale (e.g. shards not divided by the device count) would be off by a factor, which AdamW
    // and clipping would hide in the training losses.
    assert!(largest > 1e-3);
    assert!(
        d2 <= 1e-5 * largest && d4 <= 1e-5 * largest,
        "{d2:e}, {d4:e}"
    );
    assert!((loss1 - loss2).abs() < 1e-5 && (loss1 - loss4).abs() < 1e-5);
}

#[test]
fn the_programs_allocator_keeps_freed_memory_unless_told_otherwise() {
    const NAME: &str = "the_programs_allocator_keeps_freed_memory_unless_told_otherwise";
    match std::env::var("MIMALLOC_PURGE_DELAY") {
        // mimalloc took the value from the environment, into the option slot that
        // `purge_delay` reads: this also checks that the slot is the purge delay.
        Ok(value) => assert_eq!(
            coupled_qk_lab::alloc::purge_delay(),
            value.parse::<i64>().unwrap()
        ),
        Err(_) => {
            assert_eq!(coupled_qk_lab::alloc::purge_delay(), -1);
            let child = std::process::Command::new(std::env::current_exe().unwrap())
                .args([NAME, "--exact", "--quiet"])
                .env("MIMALLOC_PURGE_DELAY", "1234")
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&child.stdout);
            assert!(
                child.status.success() && stdout.contains("1 passed"),
                "with MIMALLOC_PURGE_DELAY=1234: {stdout}"
            );
        }
    }
}

#[test]
fn a_fresh_run_refuses_a_folder_of_other_files_unless_forced() {
    let _guard = serial();
    let corpus = corpus();
    let dir = out_dir("not-a-run");
    std::fs::create_dir_all(dir.join("checkpoints/step-0000001")).unwrap();
    std::fs::write(dir.join("metrics.csv"), "someone else's data\n").unwrap();
    let device = Default::default();
    let config = tiny(2);
    let err = train_with::<B>(&config, &corpus, &dir, &quiet(), &device).unwrap_err();
    assert!(matches!(err, TrainError::FolderNotEmpty { .. }), "{err}");
    let advice = coupled_qk_lab::cli::advice(&err).unwrap();
    assert!(advice.contains("--force"), "{advice}");
    assert_eq!(
        std::fs::read_to_string(dir.join("metrics.csv")).unwrap(),
        "someone else's data\n",
        "nothing is overwritten"
    );
    assert!(
        dir.join("checkpoints/step-0000001").is_dir(),
        "nothing is deleted"
    );
    assert!(!dir.join(".lock").exists(), "nothing is left");
    let forced = RunOptions {
        force: true,
        ..quiet()
    };
    train_with::<B>(&config, &corpus, &dir, &forced, &device).unwrap();
    assert_eq!(read_metrics(&dir.join("metrics.csv")).unwrap().len(), 2);
}

#[test]
fn a_run_folder_in_use_by_another_process_is_refused() {
    let _guard = serial();
    let corpus = corpus();
    let dir = out_dir("locked");
    std::fs::create_dir_all(&dir).unwrap();
    // Another process's lock, as the OS sees it: a second open file description holding it.
    let other = std::fs::File::create(dir.join(".lock")).unwrap();
    other.lock().unwrap();
    std::fs::write(dir.join(".lock"), "4242").unwrap();
    let device = Default::default();
    let err = train_with::<B>(&tiny(2), &corpus, &dir, &quiet(), &device).unwrap_err();
    assert!(matches!(err, TrainError::RunInUse { .. }), "{err}");
    assert!(err.to_string().contains("process 4242"), "{err}");
    assert!(!dir.join("config.json").exists(), "nothing is written");
    // Released (as when that process ends): the run goes ahead.
    drop(other);
    train_with::<B>(&tiny(2), &corpus, &dir, &quiet(), &device).unwrap();
}

#[test]
fn an_edited_corpus_of_the_same_length_does_not_resume_silently() {
    let _guard = serial();
    let corpus = corpus();
    let dir = out_dir("edited-corpus");
    let device = Default::default();
    let first = RunOptions {
        stop_at: Some(1),
        ..quiet()
    };
    train_with::<B>(&tiny(2), &corpus, &dir, &first, &device).unwrap();
    let mut ids: Vec<u32> = (0..corpus.train.len())
        .map(|i| corpus.train.ids.get(i))
        .collect();
    ids[0] = if ids[0] == b'x' as u32 {
        b'y' as u32
    } else {
        b'x' as u32
    };
    let edited = TokenizedCorpus {
        train: TokenStream {
            ids: TokenIds::from_u32(ids, 256),
            byte_lens: corpus.train.byte_lens.clone(),
        },
        ..corpus.clone()
    };
    let resume = RunOptions {
        resume: true,
        ..quiet()
    };
    let err = train_with::<B>(&tiny(2), &edited, &dir, &resume, &device).unwrap_err();
    match err {
        TrainError::ConfigMismatch { changes, .. } => {
            let fields: Vec<&str> = changes.iter().map(|c| c.field.as_str()).collect();
            assert_eq!(fields, ["corpus.train_hash"]);
        }
        other => panic!("expected ConfigMismatch, got {other:?}"),
    }
    train_with::<B>(&tiny(2), &corpus, &dir, &resume, &device).unwrap();
}

#[test]
fn a_plot_that_cannot_be_written_does_not_stop_training() {
    let _guard = serial();
    let corpus = corpus();
    let dir = out_dir("unwritable-plot");
    // A folder where the plot should go: every write of loss.svg fails.
    std::fs::create_dir_all(dir.join("loss.svg")).unwrap();
    let options = RunOptions {
        force: true,
        ..quiet()
    };
    let summary = train_with::<B>(&tiny(2), &corpus, &dir, &options, &Default::default()).unwrap();
    assert!(summary.finished);
    assert!(dir.join("loss.svg").is_dir());
}

#[test]
fn a_run_folder_loads_for_inference_and_generates() {
    use coupled_qk::model::SamplerConfig;
    use coupled_qk_lab::lm::load_trained;
    let _guard = serial();
    let corpus = corpus();
    let dir = out_dir("load-trained");
    let device = Default::default();
    train_with::<B>(&tiny(3), &corpus, &dir, &quiet(), &device).unwrap();
    let (model, config, step) = load_trained::<Flex>(&dir, &device).unwrap();
    assert_eq!((step, config.train.max_steps), (3, 3));
    assert_eq!(config.corpus.tokenizer, "bytes");
    // The loaded weights are the checkpoint's: the same validation loss as the run's summary.
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    let batches = coupled_qk_lab::data::eval_batches(&corpus.valid, 64, 16, Some(16)).unwrap();
    let val = coupled_qk_lab::lm::evaluate(&model, &batches, &device, config.train.loss);
    assert!((val.loss - summary["val_loss"].as_f64().unwrap()).abs() < 1e-6);
    let greedy = SamplerConfig::new()
        .with_temperature(0.0)
        .with_max_new_tokens(3);
    assert_eq!(
        model.generate(&[84, 104], &greedy, |_| {}).unwrap().len(),
        3
    );
    let err = load_trained::<Flex>(&dir.join("checkpoints"), &device).unwrap_err();
    assert!(err.to_string().contains("config.json"), "{err}");
    // A config.json from before the corpus hashes were recorded loads too.
    let path = dir.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let recorded = json["corpus"].as_object_mut().unwrap();
    assert!(recorded.remove("train_hash").is_some() && recorded.remove("valid_hash").is_some());
    std::fs::write(&path, json.to_string()).unwrap();
    let (_, config, _) = load_trained::<Flex>(&dir, &device).unwrap();
    assert_eq!(config.corpus.train_hash, None);
}

/// Sets `model.<field>` of the run's `config.json` to `value`.
fn edit_model_field(dir: &Path, field: &str, value: serde_json::Value) {
    let path = dir.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["model"][field] = value;
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
}

#[test]
fn a_config_json_edited_after_training_is_refused_naming_the_field() {
    use coupled_qk_lab::lm::load_trained;
    let _guard = serial();
    let corpus = corpus();
    let dir = out_dir("edited-config");
    let device = Default::default();
    let config = tiny(2);
    train_with::<B>(&config, &corpus, &dir, &quiet(), &device).unwrap();
    let original = std::fs::read(dir.join("config.json")).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&original).unwrap();
    assert_eq!(json["model"]["attention"], "euler1");
    // Each edit builds a model the checkpoint's weights do not belong to: d_model and n_heads
    // change shapes (or how they are read), leapfrog reads Euler's weights of the same shapes.
    for (field, value) in [
        ("d_model", serde_json::json!(64)),
        ("n_heads", serde_json::json!(2)),
        ("attention", serde_json::json!("leapfrog1")),
    ] {
        edit_model_field(&dir, field, value.clone());
        let err = load_trained::<Flex>(&dir, &device).unwrap_err();
        match &err {
            TrainError::CheckpointMismatch { changes, .. } => {
                let fields: Vec<&str> = changes.iter().map(|c| c.field.as_str()).collect();
                assert_eq!(fields, [format!("model.{field}")], "{err}");
                assert_eq!(changes[0].new, value.to_string(), "{err}");
            }
            other => panic!("{field}: expected CheckpointMismatch, got {other}"),
        }
        assert!(err.to_string().contains("config.json"), "{err}");
        std::fs::write(dir.join("config.json"), &original).unwrap();
    }
    // A resume with the same edit in both the config and config.json is refused too.
    let mut leapfrog = config.clone();
    leapfrog.model.attention = "leapfrog1".parse().unwrap();
    leapfrog.max_steps = 3;
    edit_model_field(&dir, "attention", serde_json::json!("leapfrog1"));
    let resume = RunOptions {
        resume: true,
        allow_changes: vec!["max_steps"],
        ..quiet()
    };
    let err = train_with::<B>(&leapfrog, &corpus, &dir, &resume, &device).unwrap_err();
    assert!(
        matches!(&err, TrainError::CheckpointMismatch { changes, .. } if changes.len() == 1 && changes[0].field == "model.attention"),
        "{err}"
    );
    // An unreadable config.json: a resume names the file and advises only what a user can do.
    std::fs::write(dir.join("config.json"), b"{ not json").unwrap();
    let err = train_with::<B>(&config, &corpus, &dir, &resume, &device)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("config.json") && err.contains("restore it from a copy"),
        "{err}"
    );
    assert!(
        !err.contains("allow_config_change"),
        "advice no program offers: {err}"
    );
    std::fs::write(dir.join("config.json"), &original).unwrap();
    load_trained::<Flex>(&dir, &device).unwrap();
}

#[test]
fn a_checkpoint_without_its_model_config_is_checked_by_parameter_shapes() {
    use coupled_qk_lab::lm::{MANIFEST_FILE, load_trained};
    let _guard = serial();
    let corpus = corpus();
    let dir = out_dir("unrecorded-model");
    let device = Default::default();
    train_with::<B>(&tiny(2), &corpus, &dir, &quiet(), &device).unwrap();
    // As written before checkpoints had a manifest or recorded their model.
    let checkpoint = dir.join("checkpoints/step-0000002");
    std::fs::remove_file(checkpoint.join(MANIFEST_FILE)).unwrap();
    let path = checkpoint.join("state.json");
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    state["format"] = 3.into();
    assert!(state.as_object_mut().unwrap().remove("model").is_some());
    std::fs::write(&path, serde_json::to_vec_pretty(&state).unwrap()).unwrap();
    load_trained::<Flex>(&dir, &device).unwrap();

    edit_model_field(&dir, "d_model", serde_json::json!(64));
    let err = load_trained::<Flex>(&dir, &device).unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, TrainError::Corrupt { .. })
            && message.contains("has shape [256, 128] in the checkpoint, but [256, 64]")
            && message.contains("another architecture"),
        "{message}"
    );
}

#[test]
fn a_gpt2_checkpoint_retrofitted_with_coupling_fine_tunes_end_to_end() {
    use coupled_qk::model::AttentionVariant;
    use coupled_qk::{DynamicsConfig, StepSizeConfig};
    use coupled_qk_lab::lm::InitWeights;
    use coupled_qk_lab::pretrained::Gpt2Checkpoint;
    let _serial = serial();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gpt2-tiny");
    let checkpoint =
        Gpt2Checkpoint::locate(fixture.to_str().unwrap(), &Default::default()).unwrap();
    let corpus = corpus();
    let run = |attention: AttentionVariant, name: &str| {
        let mut config = tiny(4);
        config.model = checkpoint
            .config
            .clone()
            .with_attention(attention)
            .with_dt(StepSizeConfig::new().with_init(0.0));
        config.seq_len = 32;
        config.lr = 1e-3;
        config.eval_every = 4;
        config.init_weights = Some(InitWeights::Gpt2(checkpoint.weights.clone()));
        let dir = out_dir(name);
        let summary =
            train_with::<B>(&config, &corpus, &dir, &quiet(), &Default::default()).unwrap();
        let recorded: RunConfig =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(recorded.train.init_weights, config.init_weights);
        (summary, read_metrics(&dir.join("metrics.csv")).unwrap())
    };
    let (standard, standard_rows) = run(
        AttentionVariant::Coupled(DynamicsConfig::Standard),
        "retrofit-standard",
    );
    let (euler, euler_rows) = run(
        AttentionVariant::Coupled(DynamicsConfig::euler(1)),
        "retrofit-euler",
    );
    assert!(standard.finished && euler.finished);
    // dt = 0: the first step's loss is GPT-2's, whatever the variant.
    assert_eq!(standard_rows[0].train_loss, euler_rows[0].train_loss);
    // The random checkpoint is far from byte text: fine-tuning lowers the loss.
    let first = euler_rows[0].train_loss;
    let last = euler_rows.last().unwrap().train_loss;
    assert!(last < first, "train loss {first} → {last}");
    // And the coupling learned: dt moved from 0.
    let dt = euler.dynamics.last().expect("dynamics row").dt_mean();
    assert!(dt.is_some_and(|dt| dt != 0.0), "dt stayed at 0: {dt:?}");

    // Weights that do not fit the model are refused before any step, naming the file.
    let mut wrong = tiny(2);
    wrong.init_weights = Some(InitWeights::Gpt2(checkpoint.weights.clone()));
    let err = train_with::<B>(
        &wrong,
        &corpus,
        &out_dir("retrofit-wrong"),
        &quiet(),
        &Default::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn a_config_json_from_before_a_model_field_existed_still_matches() {
    let config = tiny(10);
    let new: serde_json::Value =
        serde_json::from_str(&RunConfig::new(&config, &corpus()).to_json()).unwrap();
    let mut old = new.clone();
    let model = old["model"].as_object_mut().unwrap();
    assert!(model.remove("gelu_tanh").is_some() && model.remove("norm_epsilon").is_some());
    assert_eq!(differing_fields(&old, &new), vec![]);
    // Where the new config differs from the default the old run had, it is a change.
    let mut gelu = config.clone();
    gelu.model = gelu.model.with_gelu_tanh(true);
    let new: serde_json::Value =
        serde_json::from_str(&RunConfig::new(&gelu, &corpus()).to_json()).unwrap();
    let changes = differing_fields(&old, &new);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].field, "model.gelu_tanh");
}

#[test]
fn a_config_json_from_before_the_corpus_hashes_still_matches_but_a_different_hash_does_not() {
    let new: serde_json::Value =
        serde_json::from_str(&RunConfig::new(&tiny(10), &corpus()).to_json()).unwrap();
    let mut old = new.clone();
    let recorded = old["corpus"].as_object_mut().unwrap();
    assert!(recorded.remove("train_hash").is_some() && recorded.remove("valid_hash").is_some());
    assert_eq!(differing_fields(&old, &new), vec![]);
    // A recorded hash that differs is another corpus.
    let mut edited = new.clone();
    edited["corpus"]["train_hash"] = serde_json::json!("0000000000000000");
    let changes = differing_fields(&edited, &new);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].field, "corpus.train_hash");
    // And a corpus of another length still is, hashes or not.
    let mut shorter = old.clone();
    shorter["corpus"]["train_tokens"] = serde_json::json!(1);
    assert_eq!(
        differing_fields(&shorter, &new)[0].field,
        "corpus.train_tokens"
    );
}

#[test]
fn three_steps_on_the_fused_loss_equal_three_on_the_explicit_loss() {
    let _guard = serial();
    let corpus = corpus();
    let mut config = tiny(3);
    config.eval_every = 3;
    let losses = |loss: LossKind| {
        let dir = out_dir(&format!("loss-{loss}"));
        let config = TrainConfig {
            loss,
            ..config.clone()
        };
        train_with::<B>(&config, &corpus, &dir, &quiet(), &Default::default()).unwrap();
        let rows = read_metrics(&dir.join("metrics.csv")).unwrap();
        assert_eq!(rows.len(), 3);
        let val = rows[2].val.expect("a validation at the last step").loss;
        (rows.iter().map(|r| r.train_loss).collect::<Vec<_>>(), val)
    };
    let (explicit, explicit_val) = losses(LossKind::Explicit);
    let (fused, fused_val) = losses(LossKind::Fused);
    let worst = explicit
        .iter()
        .zip(&fused)
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    eprintln!(
        "fused vs explicit loss, 3 steps: train losses {explicit:?} vs {fused:?} (largest \
         difference {worst:e}), validation {explicit_val} vs {fused_val}"
    );
    // At most float rounding may differ (the same function, other sums). Measured on Flex: equal
    // to the bit (the vocabulary of 256 makes the batch one chunk); with the op's one-hot term
    // dropped from its backward pass the second step's loss is 0.59 higher.
    assert!(worst < 1e-5, "train losses differ by up to {worst:e}");
    assert!(
        (explicit_val - fused_val).abs() < 1e-5,
        "validation losses {explicit_val} and {fused_val}"
    );
    // The steps moved the weights: equal losses are not those of an untrained model thrice.
    assert!(explicit[2] < explicit[0] - 0.05, "{explicit:?}");
}

#[test]
fn the_loss_kind_defaults_to_fused_and_may_change_on_resume() {
    let corpus = corpus();
    let fused = tiny(10);
    assert_eq!(fused.loss, LossKind::Fused);
    let json =
        |c: &TrainConfig| serde_json::from_str(&RunConfig::new(c, &corpus).to_json()).unwrap();
    let new: serde_json::Value = json(&fused);
    assert_eq!(new["loss"], "fused");
    // A config.json from before the field existed loads, and matches either way of computing.
    let mut old = new.clone();
    assert!(old.as_object_mut().unwrap().remove("loss").is_some());
    let loaded: RunConfig = serde_json::from_value(old.clone()).unwrap();
    assert_eq!(loaded.train.loss, LossKind::Fused);
    let explicit = TrainConfig {
        loss: LossKind::Explicit,
        ..fused.clone()
    };
    assert_eq!(differing_fields(&old, &json(&explicit)), vec![]);
    assert_eq!(differing_fields(&new, &json(&explicit)), vec![]);
}

#[test]
fn a_resume_refuses_what_it_cannot_continue_and_marks_its_summary() {
    use coupled_qk_lab::lm::Trainer;
    let _guard = serial();
    let corpus = corpus();
    let device = Default::default();
    let resume = RunOptions {
        resume: true,
        ..quiet()
    };
    // --resume into a folder of someone else's files and no run: refused as a fresh run is.
    let mine = out_dir("resume-foreign");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::write(mine.join("metrics.csv"), "mine\n").unwrap();
    let err = train_with::<B>(&tiny(2), &corpus, &mine, &resume, &device).unwrap_err();
    assert!(matches!(err, TrainError::FolderNotEmpty { .. }), "{err}");
    assert_eq!(
        std::fs::read_to_string(mine.join("metrics.csv")).unwrap(),
        "mine\n"
    );

    let dir = out_dir("resume-limits");
    let mut config = tiny(4);
    config.checkpoint_every = 2;
    let summary = train_with::<B>(&config, &corpus, &dir, &quiet(), &device).unwrap();
    assert!(summary.finished);
    let may_change_steps = RunOptions {
        resume: true,
        allow_changes: vec!["max_steps"],
        ..quiet()
    };
    // Fewer steps than the checkpoint has done: refused, naming the step.
    let mut fewer = config.clone();
    fewer.max_steps = 3;
    fewer.warmup_steps = 2;
    let may_change_schedule = RunOptions {
        allow_changes: vec!["max_steps", "warmup_steps"],
        ..may_change_steps.clone()
    };
    let err = train_with::<B>(&fewer, &corpus, &dir, &may_change_schedule, &device).unwrap_err();
    assert!(
        matches!(&err, TrainError::Config { field, .. } if field == "max_steps")
            && err.to_string().contains("resumes from step 4"),
        "{err}"
    );
    // More steps: the summary says unfinished from the moment the resume starts.
    let mut more = config.clone();
    more.max_steps = 6;
    let trainer = Trainer::<B>::prepare(
        &more,
        &corpus,
        &dir,
        &may_change_steps,
        std::slice::from_ref(&device),
    )
    .unwrap();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["finished"], false, "{summary}");
    drop(trainer);
}
