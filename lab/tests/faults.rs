//! Fault injection: a `tiny` training run killed with SIGKILL at random points (in a step, in a
//! checkpoint write, in an evaluation) and resumed each time ends with the weights and the
//! metrics of an uninterrupted run, bit for bit, and leaves no temporary file behind.

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::AdamWConfig;
use burn::tensor::Tensor;
use coupled_qk::model::{Gpt, GptConfig, Preset};
use coupled_qk_lab::data::{TokenIds, TokenStream, TokenizedCorpus};
use coupled_qk_lab::lm::{
    RunOptions, TrainConfig, list_checkpoints, load_checkpoint, read_metrics, train_with,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

type B = Autodiff<Flex>;

/// The variable that makes [`child_trains_until_done`] train (it is skipped otherwise).
const CHILD_DIR: &str = "COUPLED_QK_FAULT_RUN_DIR";

fn corpus() -> TokenizedCorpus {
    let text = "the quick brown fox jumps over the lazy dog; ".repeat(300);
    let bytes: Vec<u32> = text.bytes().map(u32::from).collect();
    let split = bytes.len() * 9 / 10;
    let byte_lens = Arc::new(vec![1u32; 256]);
    let stream = |ids: &[u32]| TokenStream {
        ids: TokenIds::from_u32(ids.to_vec(), 256),
        byte_lens: byte_lens.clone(),
    };
    TokenizedCorpus {
        name: "fault-test".into(),
        tokenizer: "bytes".into(),
        vocab_size: 256,
        train: stream(&bytes[..split]),
        valid: stream(&bytes[split..]),
    }
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
fn final_weights(dir: &Path) -> Vec<f32> {
    struct Flatten(Vec<f32>);
    impl ModuleVisitor<B> for Flatten {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let data = param.val().into_data().convert::<f32>();
            self.0.extend(data.to_vec::<f32>().unwrap());
        }
    }
    let device = Default::default();
    let (_, newest) = list_checkpoints(dir).unwrap().pop().expect("a checkpoint");
    let model: Gpt<B> = config().model.init(&device);
    let optimizer = AdamWConfig::new().init::<B, Gpt<B>>();
    let (model, _, state) = load_checkpoint(&newest, model, optimizer, &device).unwrap();
    assert_eq!(state.step, config().max_steps);
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

    let (a, b) = (
        read_metrics(&whole.join("metrics.csv")).unwrap(),
        read_metrics(&killed.join("metrics.csv")).unwrap(),
    );
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            (x.step, x.tokens, x.train_loss.to_bits()),
            (y.step, y.tokens, y.train_loss.to_bits()),
            "step {}",
            x.step
        );
        assert_eq!(x.val, y.val, "step {}", x.step);
    }
    let (wa, wb) = (final_weights(&whole), final_weights(&killed));
    assert_eq!(wa.len(), wb.len());
    let differ = wa
        .iter()
        .zip(&wb)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    assert_eq!(differ, 0, "{differ} of {} weights differ", wa.len());
    assert_eq!(leftovers(&killed), Vec::<PathBuf>::new());
    let lock = std::fs::read_to_string(killed.join(".lock")).unwrap_or_default();
    assert!(!lock.is_empty(), "the lock file names its last holder");
    std::fs::remove_dir_all(root).unwrap();
}
