//! The GPT-style decoder: parameter counts of the presets, causality, heads and options.

use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use coupled_qk::DynamicsConfig;
use coupled_qk::model::{AttentionVariant, BlockAttention, Gpt, GptConfig, Positions, Preset};

type B = burn::backend::Flex;

const GPT2_VOCAB: usize = 50257;

/// Parameters of a block, counted by hand: attention (4 linear with bias), MLP (2 linear with
/// bias), two LayerNorms (gamma + beta).
fn block_params(d: usize) -> usize {
    4 * (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d) + 2 * 2 * d
}

#[test]
fn the_60m_preset_has_60m_parameters_and_the_coupling_adds_0_11_percent() {
    let config = GptConfig::preset(Preset::M60, GPT2_VOCAB);
    let standard = config
        .clone()
        .with_attention(DynamicsConfig::Standard.into())
        .init::<B>(&Default::default());
    let (d, layers, context) = (576, 8, 512);
    let expected = GPT2_VOCAB * d + context * d + layers * block_params(d) + 2 * d;
    assert_eq!(standard.num_params(), expected);
    assert!((60_500_000..61_500_000).contains(&expected), "{expected}");
    drop(standard);
    let euler = config.init::<B>(&Default::default());
    let extra = euler.extra_num_params();
    assert_eq!(extra, layers * (64 * 64 * 2 + 64 + 64 + 1));
    let fraction = extra as f64 / expected as f64;
    assert!((0.0010..0.0012).contains(&fraction), "{fraction}");
}

#[test]
fn presets_have_the_documented_shapes() {
    for (preset, shape) in [
        (Preset::Tiny, (128, 4, 4, 256)),
        (Preset::Small, (192, 8, 6, 256)),
        (Preset::M60, (576, 8, 9, 512)),
        (Preset::M150, (768, 16, 12, 1024)),
        (Preset::M350, (1024, 24, 16, 1024)),
    ] {
        let c = GptConfig::preset(preset, 256);
        assert_eq!(
            (c.d_model, c.n_layers, c.n_heads, c.context),
            shape,
            "{preset:?}"
        );
        assert_eq!(
            c.coupled_attention(&DynamicsConfig::Standard).d_head(),
            if matches!(preset, Preset::Tiny | Preset::Small) {
                32
            } else {
                64
            }
        );
    }
    assert_eq!("60m".parse::<Preset>().unwrap(), Preset::M60);
    assert_eq!("small".parse::<Preset>().unwrap(), Preset::Small);
    let err = "70m".parse::<Preset>().unwrap_err();
    assert_eq!(err, coupled_qk::model::UnknownPreset("70m".into()));
    assert!(err.to_string().contains("tiny"), "{err}");
}

fn tokens(values: &[i64], batch: usize) -> Tensor<B, 2, Int> {
    let seq = values.len() / batch;
    Tensor::from_data(
        TensorData::new(values.to_vec(), [batch, seq]),
        &Default::default(),
    )
}

fn tiny(positions: Positions, mlp_ratio: usize, tie: bool) -> Gpt<B> {
    GptConfig::new(32, 16, 2, 2, 12)
        .with_positions(positions)
        .with_mlp_ratio(mlp_ratio)
        .with_tie_embeddings(tie)
        .with_dt(coupled_qk::StepSizeConfig::new().with_init(0.5))
        .init(&Default::default())
}

#[test]
fn logits_do_not_depend_on_future_tokens() {
    for positions in [Positions::Learned, Positions::Rotary] {
        let model = tiny(positions, 4, true);
        let a = model.forward(tokens(&[1, 5, 9, 3, 7, 2, 8, 4], 1));
        let b = model.forward(tokens(&[1, 5, 9, 3, 0, 0, 31, 30], 1));
        let (a, b) = (
            a.slice([0..1, 0..4]).into_data(),
            b.slice([0..1, 0..4]).into_data(),
        );
        a.assert_approx_eq::<f32>(&b, burn::tensor::Tolerance::default());
    }
}

#[test]
fn the_tied_head_reuses_the_embedding_and_the_untied_one_has_its_own() {
    let tied = tiny(Positions::Learned, 4, true);
    let untied = tiny(Positions::Learned, 4, false);
    assert!(tied.head.is_none());
    assert_eq!(untied.num_params(), tied.num_params() + 16 * 32);
    let logits = tied.forward(tokens(&[1, 2, 3, 4, 5, 6], 2));
    assert_eq!(logits.dims(), [2, 3, 32]);
}

#[test]
fn mlp_ratio_zero_builds_attention_only_blocks() {
    let model = tiny(Positions::Rotary, 0, true);
    assert!(
        model
            .blocks
            .iter()
            .all(|b| b.mlp.is_none() && b.norm_mlp.is_none())
    );
    assert!(model.positions.is_none());
    assert_eq!(model.forward(tokens(&[1, 2, 3], 1)).dims(), [1, 3, 32]);
}

#[test]
fn initial_loss_is_near_log_vocab() {
    // GPT-2 initialisation (std 0.02): near-uniform predictions, not the ≈20 of Burn's N(0, 1)
    // embedding with a tied head.
    let model = tiny(Positions::Learned, 4, true);
    let logits = model.forward(tokens(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 1));
    let log_p = burn::tensor::activation::log_softmax(logits.reshape([12, 32]), 1);
    let mean_nll = -log_p.mean().into_scalar();
    assert!((mean_nll - (32f32).ln()).abs() < 0.1, "{mean_nll}");
}

#[test]
#[should_panic(expected = "13 positions exceed the context of 12")]
fn a_too_long_sequence_names_the_context() {
    tiny(Positions::Learned, 4, true).forward(tokens(&[1; 13], 1));
}

// Differential attention in the GPT.

fn diff(config: GptConfig) -> GptConfig {
    config.with_attention(AttentionVariant::differential())
}

#[test]
fn a_differential_gpt_runs_with_even_and_odd_head_counts() {
    let device = Default::default();
    // Tiny preset: 4 heads → 2 differential heads with maps of d_head = 32.
    let tiny = diff(GptConfig::preset(Preset::Tiny, 64));
    assert_eq!(tiny.differential_heads(), 2);
    assert_eq!(
        tiny.differential_attention(&DynamicsConfig::Standard, 0)
            .d_map(),
        32
    );
    let model = tiny.init::<B>(&device);
    assert!(
        model
            .blocks
            .iter()
            .all(|b| matches!(b.attention, BlockAttention::Differential(_)))
    );
    assert_eq!(
        model.forward(tokens(&[1, 2, 3, 4, 5, 6], 2)).dims(),
        [2, 3, 64]
    );
    // 3 heads of 8 (odd): 3 differential heads with maps of 4, rotary over them.
    let odd = diff(GptConfig::new(32, 24, 3, 3, 12).with_positions(Positions::Rotary));
    assert_eq!(odd.differential_heads(), 3);
    assert_eq!(
        odd.differential_attention(&DynamicsConfig::Standard, 0)
            .d_map(),
        4
    );
    let model = odd.init::<B>(&device);
    assert_eq!(
        model.forward(tokens(&[1, 5, 9, 3, 7, 2, 8, 4], 1)).dims(),
        [1, 8, 32]
    );
    // λ_init follows the block index.
    for (i, block) in model.blocks.iter().enumerate() {
        let BlockAttention::Differential(attention) = &block.attention else {
            panic!("block {i} is not differential");
        };
        assert_eq!(attention.lambda_init, 0.8 - 0.6 * (-0.3 * i as f64).exp());
    }
    // The 60m preset's 9 heads → 9 differential heads of maps 32.
    let m60 = diff(GptConfig::preset(Preset::M60, 256));
    assert_eq!(
        (
            m60.differential_heads(),
            m60.differential_attention(&DynamicsConfig::Standard, 0)
                .d_map()
        ),
        (9, 32)
    );
    m60.validate().unwrap();
}

#[test]
fn a_differential_gpt_has_the_standard_parameters_plus_the_lambdas_and_norms() {
    let device = Default::default();
    let config = GptConfig::preset(Preset::Tiny, 256);
    let standard = config
        .clone()
        .with_attention(DynamicsConfig::Standard.into())
        .init::<B>(&device);
    let differential = diff(config).init::<B>(&device);
    // 4 layers × (4 λ vectors of d_map = 32 + a norm weight of 2·32).
    let extra = 4 * (4 * 32 + 2 * 32);
    assert_eq!(differential.extra_num_params(), extra);
    assert_eq!(standard.extra_num_params(), 0);
    assert_eq!(differential.num_params(), standard.num_params() + extra);
}

#[test]
fn differential_causality() {
    let model = diff(GptConfig::new(32, 16, 2, 2, 12)).init::<B>(&Default::default());
    let a = model.forward(tokens(&[1, 5, 9, 3, 7, 2, 8, 4], 1));
    let b = model.forward(tokens(&[1, 5, 9, 3, 0, 0, 31, 30], 1));
    a.slice([0..1, 0..4]).into_data().assert_approx_eq::<f32>(
        &b.slice([0..1, 0..4]).into_data(),
        burn::tensor::Tolerance::default(),
    );
}

#[test]
fn the_attention_variant_is_one_field_that_round_trips_through_json() {
    let base = GptConfig::preset(Preset::Tiny, 256);
    assert_eq!(
        base.attention,
        AttentionVariant::Coupled(DynamicsConfig::euler(1))
    );
    for name in AttentionVariant::names() {
        let variant: AttentionVariant = name.parse().unwrap();
        let config = base.clone().with_attention(variant.clone());
        let json = serde_json::to_string(&config).unwrap();
        assert!(
            json.contains(&format!(r#""attention":"{variant}""#)),
            "{json}"
        );
        let back: GptConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back.attention, variant, "{name}");
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
    }
    let mut json = serde_json::to_value(&base).unwrap();
    json["attention"] = "rk4".into();
    let err = serde_json::from_value::<GptConfig>(json).unwrap_err();
    assert!(err.to_string().contains("`rk4`"), "{err}");
}

#[test]
fn each_variant_builds_its_layer() {
    let device = Default::default();
    for (name, differential) in [
        ("standard", false),
        ("leapfrog2", false),
        ("diff", true),
        ("diff+euler1", true),
    ] {
        let model = GptConfig::new(32, 16, 1, 2, 8)
            .with_attention(name.parse().unwrap())
            .init::<B>(&device);
        let built = matches!(model.blocks[0].attention, BlockAttention::Differential(_));
        assert_eq!(built, differential, "{name}");
    }
}

#[test]
fn every_block_reports_what_its_dynamics_do() {
    let device = Default::default();
    let input = tokens(&[1, 5, 9, 2, 7, 3, 8, 4], 2);
    // (variant, dt, whether queries move): a fresh affine coupling is the identity.
    for (name, dt, moves) in [
        ("standard", vec![], false),
        ("euler1", vec![0.5], true),
        ("affine1", vec![], false),
        ("affine-uncoupled1", vec![], false),
        ("diff", vec![], false),
        ("diff+euler1", vec![0.5], true),
        ("diff+affine1", vec![], false),
    ] {
        let model = GptConfig::new(32, 16, 2, 2, 8)
            .with_attention(name.parse().unwrap())
            .with_dt(coupled_qk::StepSizeConfig::new().with_init(0.5))
            .init::<B>(&device);
        let stats = model.dynamics_stats(input.clone());
        assert_eq!(stats.len(), 2, "{name}");
        for s in stats {
            assert_eq!(s.dt, dt, "{name}");
            assert_eq!(s.q_change > 1e-3, moves, "{name}: {s:?}");
            if !moves {
                assert_eq!((s.q_change, s.k_change), (0.0, 0.0), "{name}");
                assert_eq!(s.entropy, s.entropy_standard, "{name}");
            }
        }
    }
}

/// Each block's attention maps: its heads' (both softmax maps of each differential head: with 3
/// heads, 3 differential heads of half-width maps), causal rows summing to 1.
#[test]
fn every_block_gives_its_attention_maps() {
    let device = Default::default();
    let input = tokens(&[1, 5, 9, 2, 7, 3, 8, 4], 2);
    for (name, heads, maps) in [("euler1", 2, 2), ("diff+affine1", 2, 2), ("diff", 3, 6)] {
        let model = GptConfig::new(32, 24, 2, heads, 8)
            .with_attention(name.parse().unwrap())
            .init::<B>(&device);
        let blocks = model.attention_maps(input.clone());
        assert_eq!(blocks.len(), 2, "{name}");
        for block in blocks {
            assert_eq!(block.dims(), [2, maps, 4, 4], "{name}");
            let values = block.into_data().to_vec::<f32>().unwrap();
            for (row, weights) in values.chunks(4).enumerate() {
                let sum: f32 = weights.iter().sum();
                assert!((sum - 1.0).abs() < 1e-5, "{name} row {row}: {weights:?}");
                assert!(weights[row % 4 + 1..].iter().all(|&w| w == 0.0), "{name}");
            }
        }
    }
}

#[test]
fn cached_decoding_gives_the_full_forward_logits_for_every_variant() {
    use coupled_qk::model::GptCache;
    let device = Default::default();
    for name in [
        "standard",
        "mlp-only",
        "euler2",
        "leapfrog1",
        "affine1",
        "affine-uncoupled1",
        "diff",
        "diff+euler2",
        "diff+affine1",
    ] {
        for positions in [Positions::Learned, Positions::Rotary] {
            let model = GptConfig::new(32, 16, 2, 2, 12)
                .with_attention(name.parse().unwrap())
                .with_positions(positions)
                .init::<B>(&device);
            let ids = tokens(&[1, 5, 9, 3, 7, 2, 8, 4, 11, 30], 1);
            let full = model.forward(ids.clone());
            let mut cache = GptCache::new();
            let mut parts = Vec::new();
            let mut start = 0;
            // A prompt of four, then one token at a time.
            for n in [4, 1, 1, 1, 1, 1, 1] {
                parts.push(
                    model.forward_cache(ids.clone().slice([0..1, start..start + n]), &mut cache),
                );
                start += n;
            }
            assert_eq!(cache.len(), 10);
            Tensor::cat(parts, 1).into_data().assert_approx_eq::<f32>(
                &full.into_data(),
                burn::tensor::Tolerance::absolute(1e-5),
            );
        }
    }
}

#[test]
fn generation_is_greedy_over_the_full_forward_and_reproducible_with_a_seed() {
    use coupled_qk::model::SamplerConfig;
    let device = Default::default();
    let model = GptConfig::new(32, 16, 2, 2, 12).init::<B>(&device);
    let prompt = [3u32, 14, 15];
    let greedy = SamplerConfig::new()
        .with_temperature(0.0)
        .with_max_new_tokens(5);
    let mut streamed = Vec::new();
    let out = model
        .generate(&prompt, &greedy, |t| streamed.push(t))
        .unwrap();
    assert_eq!(out.len(), 5);
    assert_eq!(streamed, out);
    // Each greedy token is the argmax of the full forward pass over everything before it.
    let all: Vec<i64> = prompt.iter().chain(&out).map(|&t| t as i64).collect();
    let logits = model.forward(tokens(&all[..all.len() - 1], 1));
    let [_, n, v] = logits.dims();
    let values: Vec<f32> = logits.into_data().convert::<f32>().to_vec().unwrap();
    for (i, &t) in out.iter().enumerate() {
        let row = &values[(prompt.len() - 1 + i) * v..(prompt.len() + i) * v];
        let argmax = (0..v).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
        assert_eq!(t as usize, argmax, "token {i} of {n}");
    }

    // Sampling: the seed decides; a stop token stops; the context bounds the output.
    let sample = |seed| {
        let s = SamplerConfig::new().with_seed(seed).with_max_new_tokens(8);
        model.generate(&prompt, &s, |_| {}).unwrap()
    };
    assert_eq!(sample(1), sample(1));
    assert!(
        (2..6).any(|seed| sample(seed) != sample(1)),
        "seeds change the sample"
    );
    let first = sample(1)[0];
    let stop = SamplerConfig::new()
        .with_seed(1)
        .with_stop_tokens(vec![first]);
    assert_eq!(model.generate(&prompt, &stop, |_| {}).unwrap(), [first]);
    let long = SamplerConfig::new().with_max_new_tokens(100);
    assert_eq!(
        model.generate(&prompt, &long, |_| {}).unwrap().len(),
        12 - 3 + 1
    );
    let err = model.generate(&[40], &greedy, |_| {}).unwrap_err();
    assert!(err.to_string().contains("vocabulary size 32"), "{err}");
    assert_eq!(
        model.generate(&[], &greedy, |_| {}).unwrap_err().field,
        "prompt"
    );
}

#[test]
fn greedy_decoding_of_a_model_trained_on_a_repeating_pattern_continues_it() {
    use burn::module::AutodiffModule;
    use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
    use coupled_qk::model::{SamplerConfig, masked_cross_entropy};
    type Ad = burn::backend::Autodiff<B>;
    let device = Default::default();
    let pattern = [3i64, 7, 1, 9, 4, 2];
    let (rows, len) = (6, 17);
    <Ad as burn::tensor::backend::Backend>::seed(&device, 1);
    let mut model = GptConfig::new(12, 32, 2, 2, 16)
        .with_attention(AttentionVariant::Coupled(DynamicsConfig::euler(1)))
        .init::<Ad>(&device);
    let mut optimizer = AdamWConfig::new().init();
    // Every row starts at another phase of the pattern.
    let ids: Vec<i64> = (0..rows)
        .flat_map(|r| (0..len).map(move |t| pattern[(r + t) % pattern.len()]))
        .collect();
    let batch = Tensor::<Ad, 2, Int>::from_data(TensorData::new(ids, [rows, len]), &device);
    let inputs = batch.clone().slice([0..rows, 0..len - 1]);
    let targets = batch.slice([0..rows, 1..len]).reshape([rows * (len - 1)]);
    for _ in 0..150 {
        let logits = model
            .forward(inputs.clone())
            .reshape([rows * (len - 1), 12]);
        let loss = masked_cross_entropy(
            logits,
            targets.clone(),
            Tensor::ones([rows * (len - 1)], &device),
        );
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(1e-2, model, grads);
    }
    let sampler = SamplerConfig::new()
        .with_temperature(0.0)
        .with_max_new_tokens(9);
    let out = model
        .valid()
        .generate(&[3, 7, 1], &sampler, |_| {})
        .unwrap();
    assert_eq!(out, [9, 4, 2, 3, 7, 1, 9, 4, 2]);
}

/// `GptConfig::coupling_per_head` reaches every block: one coupling net per head (9 in the 60m
/// shape's layer, 4 here), and a per-head GPT runs; differential attention refuses the option.
#[test]
fn a_gpt_with_per_head_coupling_has_a_net_per_head() {
    let device = Default::default();
    let config = GptConfig::preset(Preset::Tiny, 64);
    let shared = config.clone().init::<B>(&device);
    let per_head = config
        .clone()
        .with_coupling_per_head(true)
        .init::<B>(&device);
    // d_head 32: a net is 32·32·2 + 32 + 32 parameters; dt is one per layer either way.
    let net = 32 * 32 * 2 + 32 + 32;
    assert_eq!(shared.extra_num_params(), 4 * (net + 1));
    assert_eq!(per_head.extra_num_params(), 4 * (4 * net + 1));
    let logits = per_head.forward(tokens(&[1, 2, 3, 4, 5, 6], 2));
    assert_eq!(logits.dims(), [2, 3, 64]);
    let error = diff(config.with_coupling_per_head(true))
        .validate()
        .unwrap_err()
        .to_string();
    assert!(error.contains("coupling_per_head"), "{error}");
}
