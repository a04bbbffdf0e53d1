//! A new integrator made choosable by name in one file and one line: position Verlet
//! (drift-kick-drift, second order like leapfrog but with the roles of `q` and `k` swapped),
//! registered with `register_integrator` and then trained by name through the path `wikitext_60m`
//! takes (`--attention NAME --steps N` → the variant → `TrainConfig` → training → a run folder
//! that loads back by its name).

mod support;

use burn::backend::{Autodiff, Flex};
use coupled_qk::integrator::{Integrator, PhaseSpace};
use coupled_qk::model::{AttentionVariant, GptConfig, Preset};
use coupled_qk::{DynamicsConfig, IntegratorKind, register_integrator};
use coupled_qk_lab::lm::{RunOptions, TrainConfig, load_trained, train_on_devices};
use coupled_qk_lab::suite::variant_with_steps;
use std::path::Path;
use std::sync::Arc;
use support::corpus::corpus;

/// Position Verlet: half a drift, a kick with the force at the midpoint, half a drift.
#[derive(Debug)]
struct PositionVerlet;

impl Integrator for PositionVerlet {
    fn name(&self) -> &str {
        "position-verlet"
    }
    fn step(&self, space: &mut dyn PhaseSpace) {
        space.drift(0.5);
        let force = space.force();
        space.kick(1.0, force);
        space.drift(0.5);
    }
}

#[test]
fn a_registered_integrator_trains_by_name_through_the_programs_path() {
    // The one line that makes it choosable everywhere.
    let kind = register_integrator("position-verlet", || Arc::new(PositionVerlet)).unwrap();
    assert_eq!(IntegratorKind::named("position-verlet"), Some(kind));

    // `wikitext_60m --attention position-verlet --steps 2`.
    let variant = variant_with_steps("position-verlet", Some(2)).unwrap();
    assert_eq!(variant.to_string(), "position-verlet2");
    assert_eq!(
        "diff+position-verlet3".parse::<AttentionVariant>().unwrap(),
        AttentionVariant::Differential(DynamicsConfig::Coupled {
            integrator: kind,
            steps: 3
        })
    );
    let unknown = "rk4".parse::<AttentionVariant>().unwrap_err().to_string();
    assert!(unknown.contains("position-verlet"), "{unknown}");
    // The lists in messages come from the registry, the step-count sentence included.
    assert!(
        unknown.contains("euler, leapfrog and position-verlet with an optional step count"),
        "{unknown}"
    );
    assert_eq!(
        IntegratorKind::listed(),
        "euler, leapfrog and position-verlet"
    );

    let mut config = TrainConfig::new(GptConfig::preset(Preset::Tiny, 256).with_attention(variant));
    config.seq_len = 64;
    config.batch_size = 8;
    config.max_steps = 12;
    config.lr = 3e-3;
    config.warmup_steps = 3;
    config.eval_every = 12;
    config.eval_windows = Some(8);
    config.eval_batch = 8;
    config.log_every = 1;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("integrator-by-name");
    let _ = std::fs::remove_dir_all(&dir);
    let options = RunOptions {
        quiet: true,
        ..Default::default()
    };
    let device = Default::default();
    let corpus = corpus();
    let summary = train_on_devices::<Autodiff<Flex>>(
        &config,
        &corpus,
        &dir,
        &options,
        std::slice::from_ref(&device),
    )
    .unwrap();
    assert!(summary.finished);
    let val = summary.val_loss.unwrap();
    eprintln!("position-verlet2, 12 steps: validation loss {val:.4}");
    assert!(val < 4.5, "did not learn: {val} (ln 256 = 5.55)");

    // The run folder records the variant by name, and reads back by it.
    let saved = std::fs::read_to_string(dir.join("config.json")).unwrap();
    assert!(saved.contains("\"position-verlet2\""), "{saved}");
    let (_, run, _) = load_trained::<Flex>(&dir, &device).unwrap();
    assert_eq!(run.train.model.attention.to_string(), "position-verlet2");
}
