//! Fault injection: a `tiny` training run killed with SIGKILL at random points (in a step, in a
//! checkpoint write, in an evaluation) and resumed each time ends with the weights and the
//! metrics of an uninterrupted run, bit for bit, and leaves no temporary file behind; bytes
//! flipped in any file of a checkpoint are caught by its manifest, and the resume falls back to
//! the previous checkpoint and still ends bit for bit where the uninterrupted run does.

mod support;

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::AdamWConfig;
use burn::tensor::Tensor;
use coupled_qk::model::{Gpt, GptConfig, Preset};
use coupled_qk_lab::data::TokenizedCorpus;
use coupled_qk_lab::lm::{
    Damage, MANIFEST_FILE, REJECTED_NOTE, RunOptions, TrainConfig, TrainError, Trainer,
    Verification, checkpoint_dir, list_checkpoints, load_checkpoint, load_trained, read_metrics,
    train_with, verify_checkpoint,
};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use support::corpus::bytes_corpus;

type B = Autodiff<Flex>;

/// The backend's random generator is process-global: runs in this process must not interleave
/// (and the kill test's timings assume it has the machine to itself).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The variable that makes [`child_trains_until_done`] train (it is skipped otherwise).
const CHILD_DIR: &str = "COUPLED_QK_FAULT_RUN_DIR";

fn corpus() -> TokenizedCorpus {
    let text = "the quick brown fox jumps over the lazy dog; ".repeat(300);
    bytes_corpus("fault-test", &text)
}

/// Checkpoints and evaluations often, so that random kills land in each.
fn config() -> TrainConfig {
    let mut c = TrainConfig::new(GptConfig::preset(Preset::Tiny, 256));
    c.seq_len = 32;
    c.batch_size = 4;
    c.max_steps = 24;
    c.warmup_steps = 3;
    c.eval_every = 3;
    c.eval_windows = Some(4);
    c.eval_batch = 4;
    c.log_every = 1;
    c.checkpoint_every = 2;
    c.keep_checkpoints = 2;
    c
}

fn options() -> RunOptions {
    RunOptions {
        resume: true,
        quiet: true,
        ..RunOptions::default()
    }
}

/// Not a test of its own: the process the fault test starts and kills.
#[test]
#[ignore = "run by killed_runs_resume_to_the_uninterrupted_result"]
fn child_trains_until_done() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let device = Default::default();
    train_with::<B>(&config(), &corpus(), Path::new(&dir), &options(), &device).unwrap();
}

/// The final checkpoint's weights, flattened.
fn final_weights(dir: &Path, config: &TrainConfig) -> Vec<f32> {
    struct Flatten(Vec<f32>);
    impl ModuleVisitor<B> for Flatten {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let data = param.val().into_data().convert::<f32>();
            self.0.extend(data.to_vec::<f32>().unwrap());
        }
    }
    let device = Default::default();
    let (_, newest) = list_checkpoints(dir).unwrap().pop().expect("a checkpoint");
    let model: Gpt<B> = config.model.init(&device);
    let optimizer = AdamWConfig::new().init::<B, Gpt<B>>();
    let (model, _, state) = load_checkpoint(&newest, model, optimizer, &device).unwrap();
    assert_eq!(state.step, config.max_steps);
    let mut flat = Flatten(Vec::new());
    model.visit(&mut flat);
    flat.0
}

fn leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(leftovers(&path));
        } else if entry.file_name().to_string_lossy().contains(".tmp") {
            out.push(path);
        }
    }
    out
}

#[test]
fn killed_runs_resume_to_the_uninterrupted_result() {
    let _guard = serial();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("faults");
    let _ = std::fs::remove_dir_all(&root);
    let (whole, killed) = (root.join("whole"), root.join("killed"));
    let device = Default::default();
    let started = Instant::now();
    train_with::<B>(&config(), &corpus(), &whole, &options(), &device).unwrap();
    let whole_run = started.elapsed();

    // Kill points spread over the run's length, the same for every run of the test (a fixed
    // generator), and a last start left to finish.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % 1000) as f64 / 1000.0
    };
    // A kill counts when the child got past start-up: its metrics.csv changed (a resume
    // rewrites it up to its checkpoint, a step appends to it).
    let rows = |dir: &Path| read_metrics(&dir.join("metrics.csv")).map_or(0, |r| r.len());
    let log = root.join("child.log");
    let mut kills = 0;
    for attempt in 0.. {
        std::fs::create_dir_all(&root).unwrap();
        let before = rows(&killed);
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_trains_until_done",
                "--ignored",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, &killed)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let child_log = || std::fs::read_to_string(&log).unwrap_or_default();
        if attempt < 6 {
            // Process start-up included: each start gets a fifth of a run or so further.
            let delay = whole_run.mul_f64(0.05 + 0.25 * next());
            std::thread::sleep(delay.max(Duration::from_millis(50)));
            match child.try_wait().unwrap() {
                None => {
                    child.kill().unwrap();
                    child.wait().unwrap();
                    kills += usize::from(rows(&killed) != before);
                }
                Some(status) => assert!(status.success(), "attempt {attempt}: {}", child_log()),
            }
        } else {
            let status = child.wait().unwrap();
            assert!(status.success(), "the last start finishes: {}", child_log());
            break;
        }
    }
    eprintln!("killed {kills} times (an uninterrupted run takes {whole_run:.2?})");
    assert!(
        kills >= 2,
        "only {kills} kills landed after progress: the test did not test"
    );

    assert_same_run(&whole, &killed, &config());
    assert_eq!(leftovers(&killed), Vec::<PathBuf>::new());
    let lock = std::fs::read_to_string(killed.join(".lock")).unwrap_or_default();
    assert!(!lock.is_empty(), "the lock file names its last holder");
    std::fs::remove_dir_all(root).unwrap();
}

/// Asserts that two finished runs have the same metrics and final weights, bit for bit.
fn assert_same_run(a: &Path, b: &Path, config: &TrainConfig) {
    let what = b.display();
    let (ra, rb) = (
        read_metrics(&a.join("metrics.csv")).unwrap(),
        read_metrics(&b.join("metrics.csv")).unwrap(),
    );
    assert_eq!(ra.len(), rb.len(), "{what}");
    for (x, y) in ra.iter().zip(&rb) {
        assert_eq!(
            (x.step, x.tokens, x.train_loss.to_bits()),
            (y.step, y.tokens, y.train_loss.to_bits()),
            "{what}: step {}",
            x.step
        );
        assert_eq!(x.val, y.val, "{what}: step {}", x.step);
    }
    let (wa, wb) = (final_weights(a, config), final_weights(b, config));
    assert_eq!(wa.len(), wb.len());
    let differ = wa
        .iter()
        .zip(&wb)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    assert_eq!(differ, 0, "{what}: {differ} of {} weights differ", wa.len());
}

/// A short run for the damage tests: checkpoints at steps 2, 4, 6 and 8, the newest two kept.
fn short_config() -> TrainConfig {
    let mut c = config();
    c.max_steps = 8;
    c
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Xorshift64: the same offsets on every run of the test.
struct Draws(u64);

impl Draws {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Changes `count` bytes of `path` at random offsets (each xor-ed with a nonzero byte); returns
/// the offsets.
fn flip_bytes(path: &Path, count: usize, draws: &mut Draws) -> Vec<usize> {
    let mut bytes = std::fs::read(path).unwrap();
    let offsets: Vec<usize> = (0..count).map(|_| draws.below(bytes.len())).collect();
    for &at in &offsets {
        bytes[at] ^= 1 + draws.below(255) as u8;
    }
    std::fs::write(path, bytes).unwrap();
    offsets
}

/// The files of a checkpoint, each of which is damaged in turn.
const CHECKPOINT_FILES: [&str; 4] = ["model.mpk", "optimizer.mpk", "state.json", MANIFEST_FILE];

#[test]
fn flipped_bytes_in_any_checkpoint_file_are_caught_and_resume_falls_back() {
    let _guard = serial();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("damage");
    let _ = std::fs::remove_dir_all(&root);
    let config = short_config();
    let device = Default::default();
    let whole = root.join("whole");
    train_with::<B>(&config, &corpus(), &whole, &options(), &device).unwrap();
    // Stopped at step 6: checkpoints 4 and 6 on disk, rows up to 6 in metrics.csv.
    let stopped = root.join("stopped");
    let stop = RunOptions {
        stop_at: Some(6),
        ..options()
    };
    train_with::<B>(&config, &corpus(), &stopped, &stop, &device).unwrap();
    let steps: Vec<usize> = list_checkpoints(&stopped)
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(steps, [4, 6]);
    assert_eq!(
        verify_checkpoint(&checkpoint_dir(&stopped, 6)).unwrap(),
        Verification::Verified
    );

    let mut draws = Draws(0x2545_F491_4F6C_DD1D);
    for file in CHECKPOINT_FILES {
        for trial in 0..3 {
            let dir = root.join(format!("{file}-{trial}"));
            copy_dir(&stopped, &dir);
            let damaged = checkpoint_dir(&dir, 6).join(file);
            // One byte, then several: a single flip is the hardest to see.
            let offsets = flip_bytes(&damaged, 1 + 3 * trial, &mut draws);
            let case = format!("{file} at {offsets:?}");

            // Detected, naming the file.
            match verify_checkpoint(&checkpoint_dir(&dir, 6)) {
                Err(TrainError::CheckpointCorrupt { path, damage }) => {
                    assert_eq!(path, damaged, "{case}: {damage}");
                    if file == MANIFEST_FILE {
                        assert!(matches!(damage, Damage::Manifest(_)), "{case}: {damage}");
                    }
                }
                other => panic!("{case}: the damage went unnoticed: {other:?}"),
            }
            // Inference skips it (with a note) and takes the newest that verifies.
            let (_, _, step) = load_trained::<Flex>(&dir, &Default::default())
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(step, 4, "{case}");

            // The resume skips it, takes step 4, and ends where the uninterrupted run does.
            let summary = train_with::<B>(&config, &corpus(), &dir, &options(), &device)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(
                (summary.resumed_from, summary.steps),
                (Some(4), 8),
                "{case}"
            );
            assert_same_run(&whole, &dir, &config);
            assert_eq!(
                verify_checkpoint(&checkpoint_dir(&dir, 6)).unwrap(),
                Verification::Verified,
                "{case}: the damaged checkpoint is written again"
            );
            let aside = set_aside(&dir, 6);
            assert!(
                aside.join(file).is_file() && aside.join(REJECTED_NOTE).is_file(),
                "{case}: the damaged checkpoint is kept aside with a note"
            );
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn a_run_whose_every_checkpoint_is_damaged_does_not_resume() {
    let _guard = serial();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("all-damaged");
    let _ = std::fs::remove_dir_all(&root);
    let config = short_config();
    let device = Default::default();
    let stop = RunOptions {
        stop_at: Some(6),
        ..options()
    };
    train_with::<B>(&config, &corpus(), &root, &stop, &device).unwrap();
    let mut draws = Draws(7);
    let model6 = checkpoint_dir(&root, 6).join("model.mpk");
    let optimizer4 = checkpoint_dir(&root, 4).join("optimizer.mpk");
    flip_bytes(&model6, 1, &mut draws);
    flip_bytes(&optimizer4, 1, &mut draws);
    let metrics_before = std::fs::read(root.join("metrics.csv")).unwrap();
    match train_with::<B>(&config, &corpus(), &root, &options(), &device) {
        Err(e @ TrainError::NoGoodCheckpoint { .. }) => {
            let TrainError::NoGoodCheckpoint { path, rejected } = &e else {
                unreachable!()
            };
            assert_eq!(path, &root);
            let files: Vec<&PathBuf> = rejected.iter().map(|(file, _)| file).collect();
            assert_eq!(files, [&model6, &optimizer4], "newest first");
            let message = e.to_string();
            assert!(
                message.contains("none of its checkpoints verifies"),
                "{message}"
            );
        }
        other => panic!("expected NoGoodCheckpoint, got {other:?}"),
    }
    // Nothing of the run was touched: a copy of the checkpoints can still be put back.
    assert_eq!(
        std::fs::read(root.join("metrics.csv")).unwrap(),
        metrics_before
    );
    assert_eq!(list_checkpoints(&root).unwrap().len(), 2);
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn a_divergence_names_only_a_checkpoint_that_still_verifies() {
    let _guard = serial();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("diverge-damaged");
    let _ = std::fs::remove_dir_all(&root);
    let config = short_config();
    let device = Default::default();
    let stop = RunOptions {
        stop_at: Some(6),
        ..options()
    };
    train_with::<B>(&config, &corpus(), &root, &stop, &device).unwrap();
    // Resumed from step 6 with a learning rate that diverges; step 6's weights are damaged on
    // disk after they were loaded.
    let mut bad = config.clone();
    bad.lr = 1e30;
    let allow = RunOptions {
        allow_changes: vec!["lr"],
        ..options()
    };
    let corpus = corpus();
    let mut trainer =
        Trainer::<B>::prepare(&bad, &corpus, &root, &allow, std::slice::from_ref(&device)).unwrap();
    assert_eq!(trainer.steps_done(), 6);
    flip_bytes(
        &checkpoint_dir(&root, 6).join("model.mpk"),
        1,
        &mut Draws(11),
    );
    let error = loop {
        match trainer.step() {
            Ok(_) => assert!(!trainer.is_done(), "the run did not diverge"),
            Err(e) => break e,
        }
    };
    match &error {
        TrainError::NonFinite { checkpoint, .. } => assert_eq!(
            checkpoint.as_deref(),
            Some(checkpoint_dir(&root, 4).as_path()),
            "{error}"
        ),
        other => panic!("expected NonFinite, got {other:?}"),
    }
    std::fs::remove_dir_all(root).unwrap();
}

/// Turns the checkpoint in `dir` into one written before manifests: no manifest, `state.json`
/// of format 3.
fn make_unchecked(dir: &Path) {
    std::fs::remove_file(dir.join(MANIFEST_FILE)).unwrap();
    let path = dir.join("state.json");
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    state["format"] = 3.into();
    // Format 3 recorded no model config.
    state.as_object_mut().unwrap().remove("model");
    std::fs::write(&path, serde_json::to_vec_pretty(&state).unwrap()).unwrap();
}

/// Where a resume set the damaged checkpoint of `step` aside.
fn set_aside(dir: &Path, step: usize) -> PathBuf {
    let mut aside = checkpoint_dir(dir, step).into_os_string();
    aside.push(".rejected");
    PathBuf::from(aside)
}

#[test]
fn a_checkpoint_from_before_manifests_still_resumes() {
    let _guard = serial();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("unchecked");
    let _ = std::fs::remove_dir_all(&root);
    let config = short_config();
    let device = Default::default();
    let whole = root.join("whole");
    train_with::<B>(&config, &corpus(), &whole, &options(), &device).unwrap();
    let dir = root.join("old");
    let stop = RunOptions {
        stop_at: Some(6),
        ..options()
    };
    train_with::<B>(&config, &corpus(), &dir, &stop, &device).unwrap();
    let newest = checkpoint_dir(&dir, 6);
    make_unchecked(&newest);
    assert_eq!(list_checkpoints(&dir).unwrap().len(), 2, "it still counts");
    assert_eq!(
        verify_checkpoint(&newest).unwrap(),
        Verification::NoManifest
    );
    load_trained::<Flex>(&dir, &Default::default()).unwrap();
    let summary = train_with::<B>(&config, &corpus(), &dir, &options(), &device).unwrap();
    assert_eq!((summary.resumed_from, summary.steps), (Some(6), 8));
    assert_same_run(&whole, &dir, &config);
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn a_truncated_checkpoint_file_is_named_as_such_with_or_without_a_manifest() {
    let _guard = serial();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("truncated");
    let _ = std::fs::remove_dir_all(&root);
    let config = short_config();
    let device = Default::default();
    let whole = root.join("whole");
    train_with::<B>(&config, &corpus(), &whole, &options(), &device).unwrap();
    let dir = root.join("cut");
    let stop = RunOptions {
        stop_at: Some(6),
        ..options()
    };
    train_with::<B>(&config, &corpus(), &dir, &stop, &device).unwrap();
    let newest = checkpoint_dir(&dir, 6);
    let model = newest.join("model.mpk");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
    let expected = format!(
        "checkpoint file {} is truncated or corrupt",
        model.display()
    );

    let err = verify_checkpoint(&newest).unwrap_err();
    assert!(
        matches!(
            err,
            TrainError::CheckpointCorrupt {
                damage: Damage::Size { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().starts_with(&expected), "{err}");

    // Without a manifest only decoding can tell; Burn's text about its record formats of 2024
    // is not shown.
    make_unchecked(&newest);
    let alone = root.join("cut-alone");
    copy_dir(&dir, &alone);
    std::fs::remove_dir_all(checkpoint_dir(&alone, 4)).unwrap();
    let err = load_trained::<Flex>(&alone, &Default::default()).unwrap_err();
    let message = err.to_string();
    let cut = checkpoint_dir(&alone, 6).join("model.mpk");
    assert!(
        matches!(
            &err,
            TrainError::NoGoodCheckpoint { rejected, .. }
                if rejected.len() == 1
                    && rejected[0].0 == cut
                    && matches!(rejected[0].1, Damage::Undecodable(_))
        ),
        "{message}"
    );
    assert!(
        message.contains(&format!("{} is truncated or corrupt", cut.display())),
        "{message}"
    );
    assert!(!message.contains("backward-compat"), "{message}");
    // With the older checkpoint there, inference takes it.
    let (_, _, step) = load_trained::<Flex>(&dir, &Default::default()).unwrap();
    assert_eq!(step, 4);
    // A resume falls back to the checkpoint before it.
    let summary = train_with::<B>(&config, &corpus(), &dir, &options(), &device).unwrap();
    assert_eq!((summary.resumed_from, summary.steps), (Some(4), 8));
    assert_same_run(&whole, &dir, &config);
    std::fs::remove_dir_all(root).unwrap();
}

/// A run stopped at step 6 with `config` into `root/name`: its checkpoints as `config` keeps them.
fn stopped_at_6(root: &Path, name: &str, config: &TrainConfig) -> PathBuf {
    let dir = root.join(name);
    let stop = RunOptions {
        stop_at: Some(6),
        ..options()
    };
    train_with::<B>(config, &corpus(), &dir, &stop, &Default::default()).unwrap();
    dir
}

fn steps_of(dir: &Path) -> Vec<usize> {
    list_checkpoints(dir)
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect()
}

#[test]
fn a_damaged_newer_checkpoint_is_set_aside_and_one_kept_checkpoint_loses_nothing() {
    let _guard = serial();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keep-one");
    let _ = std::fs::remove_dir_all(&root);
    // As the suites train: only the newest checkpoint kept.
    let mut config = short_config();
    config.keep_checkpoints = 1;
    let device = Default::default();
    let whole = root.join("whole");
    train_with::<B>(&config, &corpus(), &whole, &options(), &device).unwrap();
    let dir = stopped_at_6(&root, "damaged", &config);
    assert_eq!(steps_of(&dir), [6]);
    // A newer checkpoint than any the run will write again before it ends, damaged.
    let newer = checkpoint_dir(&dir, 10);
    copy_dir(&checkpoint_dir(&dir, 6), &newer);
    flip_bytes(&newer.join("model.mpk"), 1, &mut Draws(5));

    let summary = train_with::<B>(&config, &corpus(), &dir, &options(), &device).unwrap();
    assert_eq!((summary.resumed_from, summary.steps), (Some(6), 8));
    assert_same_run(&whole, &dir, &config);
    // The run's own newest checkpoint survived the pruning, and the damaged one is kept aside.
    assert_eq!(steps_of(&dir), [8]);
    let aside = set_aside(&dir, 10);
    let note = std::fs::read_to_string(aside.join(REJECTED_NOTE)).unwrap();
    assert!(
        note.contains("model.mpk") && note.contains("corrupt"),
        "{note}"
    );
    let (_, _, step) = load_trained::<Flex>(&dir, &Default::default()).unwrap();
    assert_eq!(step, 8, "inference takes the run's newest checkpoint");
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn checkpoints_without_their_manifest_are_kept_and_never_trusted() {
    let _guard = serial();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-manifest");
    let _ = std::fs::remove_dir_all(&root);
    let config = short_config();
    let device = Default::default();
    let whole = root.join("whole");
    train_with::<B>(&config, &corpus(), &whole, &options(), &device).unwrap();
    let stopped = stopped_at_6(&root, "stopped", &config);
    assert_eq!(steps_of(&stopped), [4, 6]);

    // Every manifest deleted: no checkpoint verifies, the resume stops, and nothing is deleted.
    let none = root.join("none");
    copy_dir(&stopped, &none);
    for step in [4, 6] {
        std::fs::remove_file(checkpoint_dir(&none, step).join(MANIFEST_FILE)).unwrap();
    }
    let err = train_with::<B>(&config, &corpus(), &none, &options(), &device).unwrap_err();
    assert!(matches!(err, TrainError::NoGoodCheckpoint { .. }), "{err}");
    assert!(err.to_string().contains(MANIFEST_FILE), "{err}");
    assert_eq!(steps_of(&none), [4, 6], "both are still there");
    for step in [4, 6] {
        assert!(checkpoint_dir(&none, step).join("model.mpk").is_file());
    }

    // The newest manifest deleted: set aside by name, the resume takes step 4.
    let newest = root.join("newest");
    copy_dir(&stopped, &newest);
    std::fs::remove_file(checkpoint_dir(&newest, 6).join(MANIFEST_FILE)).unwrap();
    let summary = train_with::<B>(&config, &corpus(), &newest, &options(), &device).unwrap();
    assert_eq!((summary.resumed_from, summary.steps), (Some(4), 8));
    assert_same_run(&whole, &newest, &config);
    assert!(set_aside(&newest, 6).join("model.mpk").is_file());

    // A forged pre-manifest checkpoint (manifest deleted, format 3 written, the model config it
    // records left in place) is damage too, not a checkpoint to load with a warning.
    let forged = root.join("forged");
    copy_dir(&stopped, &forged);
    let dir6 = checkpoint_dir(&forged, 6);
    std::fs::remove_file(dir6.join(MANIFEST_FILE)).unwrap();
    let state_path = dir6.join("state.json");
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
    state["format"] = 3.into();
    assert!(state.get("model").is_some());
    std::fs::write(&state_path, serde_json::to_vec_pretty(&state).unwrap()).unwrap();
    let (_, _, step) = load_trained::<Flex>(&forged, &Default::default()).unwrap();
    assert_eq!(step, 4, "the forged checkpoint is skipped");
    let summary = train_with::<B>(&config, &corpus(), &forged, &options(), &device).unwrap();
    assert_eq!(summary.resumed_from, Some(4));

    // An interrupted write (a `.partial` folder) is the only kind removed.
    let partial = root.join("partial");
    copy_dir(&stopped, &partial);
    let mut torn = checkpoint_dir(&partial, 8).into_os_string();
    torn.push(".partial");
    let torn = PathBuf::from(torn);
    copy_dir(&checkpoint_dir(&partial, 6), &torn);
    std::fs::remove_file(torn.join(MANIFEST_FILE)).unwrap();
    assert_eq!(
        steps_of(&partial),
        [4, 6],
        "a partial write is no checkpoint"
    );
    let summary = train_with::<B>(&config, &corpus(), &partial, &options(), &device).unwrap();
    assert_eq!(summary.resumed_from, Some(6));
    assert!(!torn.exists(), "the interrupted write is removed");
    std::fs::remove_dir_all(root).unwrap();
}

#[test]
fn an_unreadable_checkpoint_falls_back_like_a_damaged_one() {
    let _guard = serial();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("unreadable");
    let _ = std::fs::remove_dir_all(&root);
    let config = short_config();
    let device = Default::default();
    let whole = root.join("whole");
    train_with::<B>(&config, &corpus(), &whole, &options(), &device).unwrap();
    let dir = stopped_at_6(&root, "stopped", &config);
    // The system's error on a read (EISDIR here; EACCES or EIO alike): root ignores file modes,
    // so a folder stands where the file should be.
    let optimizer = checkpoint_dir(&dir, 6).join("optimizer.mpk");
    std::fs::remove_file(&optimizer).unwrap();
    std::fs::create_dir(&optimizer).unwrap();
    match verify_checkpoint(&checkpoint_dir(&dir, 6)) {
        Err(TrainError::CheckpointCorrupt {
            path,
            damage: Damage::Unreadable(_),
        }) => assert_eq!(path, optimizer),
        other => panic!("expected an unreadable file, got {other:?}"),
    }
    let summary = train_with::<B>(&config, &corpus(), &dir, &options(), &device).unwrap();
    assert_eq!((summary.resumed_from, summary.steps), (Some(4), 8));
    assert_same_run(&whole, &dir, &config);
    assert!(set_aside(&dir, 6).join("optimizer.mpk").is_dir());
    std::fs::remove_dir_all(root).unwrap();
}
