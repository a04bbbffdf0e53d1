//! Weights in and out: a Hugging Face GPT-2 checkpoint loads and gives transformers' logits, a
//! coupled variant retrofitted with `dt = 0` gives the same, and the crate's own safetensors
//! round-trip. The fixture (tests/fixtures/gpt2-tiny) was made by tests/reference/gpt2_tiny.py.
#![cfg(feature = "safetensors")]

mod common;

use burn::module::Param;
use burn::tensor::{Int, Tensor, TensorData, backend::Backend};
use common::{Cpu, max_abs_diff, values};
use coupled_qk::model::{Gpt, GptConfig, WeightsError};
use coupled_qk::{AttentionVariant, DynamicsConfig, QkDynamics, StepSizeConfig};
use std::path::{Path, PathBuf};

type B = Cpu;

fn fixture(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gpt2-tiny")
        .join(file)
}

fn json(file: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(file)).unwrap()).unwrap()
}

/// The fixture's GPT-2 config, from its config.json.
fn config() -> GptConfig {
    let c = json("config.json");
    let size = |key: &str| c[key].as_u64().unwrap() as usize;
    GptConfig::gpt2(
        size("vocab_size"),
        size("n_positions"),
        size("n_embd"),
        size("n_layer"),
        size("n_head"),
    )
    .with_norm_epsilon(c["layer_norm_epsilon"].as_f64().unwrap())
}

/// The fixture's input ids `[2, 12]` and transformers' logits for them, flattened.
fn input_and_logits() -> (Tensor<B, 2, Int>, Vec<f64>) {
    let l = json("logits.json");
    let ids: Vec<i64> = l["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()))
        .collect();
    let shape: Vec<usize> = l["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    let logits: Vec<f64> = l["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b.as_array().unwrap().iter())
        .flat_map(|t| t.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
        .collect();
    assert_eq!(logits.len(), shape.iter().product::<usize>());
    let ids = Tensor::from_data(
        TensorData::new(ids, [shape[0], shape[1]]),
        &Default::default(),
    );
    (ids, logits)
}

fn load(config: &GptConfig, seed: u64) -> Result<Gpt<B>, WeightsError> {
    let device = Default::default();
    B::seed(&device, seed);
    config
        .init::<B>(&device)
        .load_gpt2_safetensors(&fixture("model.safetensors"))
}

#[test]
fn gpt2_checkpoint_gives_transformers_logits() {
    let model = load(&config(), 0).unwrap();
    let (ids, expected) = input_and_logits();
    let got = values(model.forward(ids));
    let err = max_abs_diff(&expected, &got);
    assert!(err < 1e-4, "logits differ from transformers' by {err:e}");
}

#[test]
fn the_weights_decide_not_the_initialisation() {
    // Two seeds, one checkpoint: the same logits, bit for bit.
    let (ids, _) = input_and_logits();
    let a = values(load(&config(), 1).unwrap().forward(ids.clone()));
    let b = values(load(&config(), 2).unwrap().forward(ids));
    assert_eq!(a, b);
}

#[test]
fn coupling_retrofitted_with_zero_dt_keeps_gpt2s_logits() {
    let (ids, expected) = input_and_logits();
    let standard = values(load(&config(), 0).unwrap().forward(ids.clone()));
    for dynamics in [
        DynamicsConfig::euler(1),
        DynamicsConfig::leapfrog(2),
        DynamicsConfig::affine(1),
    ] {
        let retrofit = config()
            .with_attention(AttentionVariant::Coupled(dynamics.clone()))
            .with_dt(StepSizeConfig::new().with_init(0.0));
        let model = load(&retrofit, 3).unwrap();
        let got = values(model.forward(ids.clone()));
        assert_eq!(got, standard, "{dynamics} with dt = 0 changes the logits");
        assert!(max_abs_diff(&expected, &got) < 1e-4);
    }

    // With dt ≠ 0 the coupling acts: the retrofit is not a no-op by construction.
    let coupled = config()
        .with_attention(AttentionVariant::Coupled(DynamicsConfig::euler(1)))
        .with_dt(StepSizeConfig::new().with_init(0.5));
    let got = values(load(&coupled, 3).unwrap().forward(ids));
    assert!(max_abs_diff(&standard, &got) > 1e-3);
}

#[test]
fn own_safetensors_round_trip_every_parameter() {
    let dir = std::env::temp_dir().join(format!("coupled-qk-weights-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    let config = GptConfig::new(40, 32, 2, 4, 16)
        .with_attention(AttentionVariant::Coupled(DynamicsConfig::leapfrog(2)));
    let device = Default::default();
    B::seed(&device, 10);
    let mut model = config.init::<B>(&device);
    // A dt of its own, so that a load that skipped it would show.
    if let coupled_qk::model::BlockAttention::Coupled(layer) = &mut model.blocks[0].attention
        && let QkDynamics::Coupled(dynamics) = &mut layer.dynamics
    {
        let dt = &mut dynamics.step_size.dt;
        *dt = Param::from_tensor(dt.val().add_scalar(0.37));
    }
    model.save_safetensors(&path).unwrap();
    B::seed(&device, 11);
    let loaded = config.init::<B>(&device).load_safetensors(&path).unwrap();

    let ids = Tensor::<B, 2, Int>::from_data(
        TensorData::new((0..24).map(|i| (i * 7) % 40).collect::<Vec<i64>>(), [2, 12]),
        &device,
    );
    assert_eq!(
        values(model.forward(ids.clone())),
        values(loaded.forward(ids))
    );
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "only the file itself: {leftovers:?}");

    // Another variant's model: the coupling's parameters are missing, and named.
    let other = GptConfig::new(40, 32, 2, 4, 16)
        .with_attention(AttentionVariant::Coupled(DynamicsConfig::affine(1)));
    let err = other
        .init::<B>(&device)
        .load_safetensors(&path)
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("model.safetensors"), "{message}");
    assert!(message.contains("key_scale"), "{message}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_checkpoint_of_another_shape_is_refused_naming_the_tensor() {
    let wider = GptConfig::gpt2(96, 32, 128, 2, 2);
    let err = load(&wider, 0).unwrap_err().to_string();
    assert!(
        err.contains("do not fit") && err.contains("tokens.weight"),
        "{err}"
    );

    let missing = load(&config(), 0)
        .map(|_| ())
        .and_then(|()| {
            config()
                .init::<B>(&Default::default())
                .load_gpt2_safetensors(Path::new("no/such/model.safetensors"))
                .map(drop)
        })
        .unwrap_err()
        .to_string();
    assert!(missing.contains("no/such/model.safetensors"), "{missing}");

    // The crate's own file is not a GPT-2 checkpoint.
    let dir = std::env::temp_dir().join(format!("coupled-qk-not-gpt2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("own.safetensors");
    config()
        .init::<B>(&Default::default())
        .save_safetensors(&path)
        .unwrap();
    let err = config()
        .init::<B>(&Default::default())
        .load_gpt2_safetensors(&path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown tensor"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
