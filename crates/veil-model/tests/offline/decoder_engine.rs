//! The decoder composition on tiny seeded random models (no download): decode with the KV cache
//! equals a full recompute (bit-exact in the simulator), the simulator tracks f32, and Veil's
//! f32 decoder agrees with candle-transformers' independent `quantized_llama` on the same GGUF.

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use veil_model::decoder::random::{write_tiny_gguf, write_tiny_gpt2, write_tiny_llama, TinyShape};
use veil_model::decoder::{self, DecoderWeights};
use veil_model::engine::decoder::LogitRows;
use veil_model::F32Model;
use veil_model::{generate, padded_prompt, GenerateOptions, NextLogits, PADDING_ID};
use veil_model::{DecoderFormat, FixedDecoder};

/// Token ids of a fixed sequence in the tiny vocabulary (269 tokens).
const IDS: [u32; 11] = [1, 40, 77, 120, 5, 268, 33, 200, 2, 150, 99];

fn tiny(gpt2: bool, seed: u8, shape: &TinyShape) -> DecoderWeights {
    let dir = tempfile::tempdir().unwrap();
    if gpt2 {
        write_tiny_gpt2(dir.path(), seed, shape).unwrap();
    } else {
        write_tiny_llama(dir.path(), seed, shape).unwrap();
    }
    decoder::load(dir.path().to_str().unwrap()).unwrap().weights
}

fn shapes() -> Vec<(bool, TinyShape)> {
    let gqa = TinyShape::default();
    let biased = TinyShape {
        kv_heads: 4,
        attention_bias: true,
        tie_word_embeddings: false,
        layers: 3,
        ..TinyShape::default()
    };
    let gpt2 = TinyShape {
        kv_heads: 4,
        ..TinyShape::default()
    };
    vec![(false, gqa), (false, biased), (true, gpt2)]
}

/// Prefill of 4 tokens then one token per step: every step's logits equal the full sequence's
/// row at that position, bit for bit, and the cache's positions are the sequence's.
#[test]
fn simulator_kv_cache_decode_equals_full_recompute_bit_exact() {
    for (gpt2, shape) in shapes() {
        let w = tiny(gpt2, 7, &shape);
        let fixed = FixedDecoder::encode(&w, DecoderFormat::default()).unwrap();
        let full = fixed.session().step(&IDS, LogitRows::All).unwrap();
        let vocab = w.config.vocab_size;
        let mut s = fixed.session();
        let mut rows = s.step(&IDS[..4], LogitRows::All).unwrap().into_data();
        for &id in &IDS[4..] {
            rows.extend(s.step(&[id], LogitRows::Last).unwrap().into_data());
        }
        assert_eq!(rows.len(), IDS.len() * vocab);
        assert!(
            rows == full.data(),
            "gpt2 {gpt2}: cached decode differs from the full pass"
        );
        assert!(s.warnings().is_empty(), "{:?}", s.warnings());
        // The last-row option is the last row of the full pass.
        let last = fixed.session().step(&IDS, LogitRows::Last).unwrap();
        assert_eq!(last.data(), &full.data()[(IDS.len() - 1) * vocab..]);
    }
}

/// The same in f32 (candle's products may sum in another order for one row than for many).
#[test]
fn f32_kv_cache_decode_matches_full_recompute() {
    for (gpt2, shape) in shapes() {
        let w = tiny(gpt2, 9, &shape);
        let model = F32Model::new(&w).unwrap();
        let full = model.session().step(&IDS, LogitRows::All).unwrap();
        let mut s = model.session();
        let mut rows = s.step(&IDS[..5], LogitRows::All).unwrap().data;
        for &id in &IDS[5..] {
            rows.extend(s.step(&[id], LogitRows::Last).unwrap().data);
        }
        let worst = rows
            .iter()
            .zip(&full.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst < 1e-4,
            "gpt2 {gpt2}: cached decode differs by {worst}"
        );
    }
}

/// The simulator against f32 on the same tiny models: logits within 0.02 and the same argmax
/// wherever f32's top-2 margin exceeds that.
#[test]
fn simulator_tracks_f32_on_tiny_models() {
    for (gpt2, shape) in shapes() {
        let w = tiny(gpt2, 11, &shape);
        let f = F32Model::new(&w)
            .unwrap()
            .session()
            .step(&IDS, LogitRows::All)
            .unwrap();
        let fixed = FixedDecoder::encode(&w, DecoderFormat::default()).unwrap();
        let sim = fixed.session().step_f64(&IDS, LogitRows::All).unwrap();
        let vocab = w.config.vocab_size;
        for (r, row) in sim.iter().enumerate() {
            let fr = &f.data[r * vocab..(r + 1) * vocab];
            let worst = row
                .iter()
                .zip(fr)
                .map(|(a, &b)| (a - b as f64).abs())
                .fold(0.0, f64::max);
            assert!(
                worst < 0.02,
                "gpt2 {gpt2} row {r}: logits differ by {worst}"
            );
        }
    }
}

/// Greedy generation stops at the stop token and is the same in f32 and the simulator.
#[test]
fn greedy_generation_agrees_and_stops() {
    let w = tiny(false, 3, &TinyShape::default());
    let model = F32Model::new(&w).unwrap();
    let fixed = FixedDecoder::encode(&w, DecoderFormat::default()).unwrap();
    let mut opts = GenerateOptions {
        max_new_tokens: 12,
        sampling: decoder::sample::SamplingParams::GREEDY,
        stop: vec![],
        fixed_length: false,
        pad_to: None,
    };
    let (a, stopped) = generate(&mut model.session(), &IDS[..3], &opts, |_| Ok(())).unwrap();
    assert_eq!((a.len(), stopped), (12, false));
    let (b, _) = generate(&mut fixed.session(), &IDS[..3], &opts, |_| Ok(())).unwrap();
    let ids = |v: &[veil_model::GeneratedToken]| v.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(&a), ids(&b));
    assert!(a.iter().all(|t| t.margin >= 0.0));
    opts.stop = vec![a[4].id];
    let (c, stopped) = generate(&mut model.session(), &IDS[..3], &opts, |_| Ok(())).unwrap();
    let first = a.iter().position(|t| t.id == a[4].id).unwrap();
    assert_eq!((c.len(), stopped), (first, true));
}

/// A session that counts the model runs it is asked for and the tokens fed to them.
struct Counting<S> {
    inner: S,
    runs: usize,
    fed: usize,
}

impl<S: NextLogits> NextLogits for Counting<S> {
    fn next_logits(&mut self, ids: &[u32]) -> veil_core::Result<Vec<f32>> {
        self.runs += 1;
        self.fed += ids.len();
        self.inner.next_logits(ids)
    }
}

/// `fixed_length`: an answer ended early by a stop token still runs one model step per
/// possible token but the last (what the server of a private session sees), and its tokens
/// are those of the same generation without it; without it, the steps end at the stop token.
#[test]
fn fixed_length_runs_every_step_and_keeps_the_answer() {
    let w = tiny(false, 3, &TinyShape::default());
    let model = F32Model::new(&w).unwrap();
    let mut opts = GenerateOptions {
        max_new_tokens: 10,
        sampling: decoder::sample::SamplingParams::GREEDY,
        stop: vec![],
        fixed_length: false,
        pad_to: None,
    };
    let (all, _) = generate(&mut model.session(), &IDS[..3], &opts, |_| Ok(())).unwrap();
    for stop_at in [0, 3, 9] {
        opts.stop = vec![all[stop_at].id];
        let first = all.iter().position(|t| t.id == all[stop_at].id).unwrap();
        for fixed_length in [false, true] {
            opts.fixed_length = fixed_length;
            let mut s = Counting {
                inner: model.session(),
                runs: 0,
                fed: 0,
            };
            let (out, stopped) = generate(&mut s, &IDS[..3], &opts, |_| Ok(())).unwrap();
            assert_eq!(out, all[..first], "stop at {stop_at}, fixed {fixed_length}");
            assert!(stopped);
            let runs = if fixed_length { 10 } else { first + 1 };
            assert_eq!((s.runs, s.fed), (runs, 3 + runs - 1), "stop at {stop_at}");
        }
    }
    // A generation that reaches the limit runs the same steps with or without it.
    opts.stop = vec![];
    let mut s = Counting {
        inner: model.session(),
        runs: 0,
        fed: 0,
    };
    let (out, stopped) = generate(&mut s, &IDS[..3], &opts, |_| Ok(())).unwrap();
    assert_eq!((out.len(), stopped, s.runs), (10, false, 10));
}

/// Largest |a − b| of two logit rows, in ulps of the format.
fn max_ulps(fixed: &FixedDecoder, a: &[u64], b: &[u64]) -> i64 {
    let ring = fixed.fp().ring;
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (ring.to_signed(x) - ring.to_signed(y)).abs())
        .max()
        .unwrap()
}

/// Padding that hides the prompt's length (`pad_to`, what a private session's client runs):
/// the simulator runs 5 padding positions before a 4-token prompt and then 6 decode steps.
/// GPT-2's logits equal the unpadded run's bit for bit at every step (its learned positions
/// count from the first real token, and the padding's weights are exactly 0); a Llama's stay
/// within a few ulps (its rotary tables at the shifted positions round differently) with the
/// same tokens. Through `generate`, the session is fed the padded prompt (GPT-2's answer is the
/// unpadded one; a Llama's is its padded pass run by hand). Padding after a step, a prompt longer than `pad_to` and an engine that
/// runs in the clear are refused.
#[test]
fn padding_hides_the_prompt_length_and_keeps_the_answer() {
    const PAD: usize = 5;
    let prompt = &IDS[..4];
    for (gpt2, shape) in shapes() {
        let w = tiny(gpt2, 5, &shape);
        let fixed = FixedDecoder::encode(&w, DecoderFormat::default()).unwrap();
        let mut plain = fixed.session();
        let mut padded = fixed.session();
        padded.hide_padding(PAD).unwrap();
        let mut input = vec![PADDING_ID; PAD];
        input.extend_from_slice(prompt);
        let mut a = plain.step(prompt, LogitRows::Last).unwrap().into_data();
        let mut b = padded.step(&input, LogitRows::Last).unwrap().into_data();
        let mut worst = 0;
        for step in 0..=6 {
            let ulps = max_ulps(&fixed, &a, &b);
            worst = worst.max(ulps);
            if gpt2 {
                assert_eq!(ulps, 0, "gpt2 step {step}: padded logits differ");
            }
            let argmax = |v: &[u64]| {
                let ring = fixed.fp().ring;
                (0..v.len()).max_by_key(|&i| ring.to_signed(v[i])).unwrap()
            };
            assert_eq!(argmax(&a), argmax(&b), "gpt2 {gpt2}, step {step}: token");
            if step == 6 {
                break;
            }
            let next = [IDS[4 + step]];
            a = plain.step(&next, LogitRows::Last).unwrap().into_data();
            b = padded.step(&next, LogitRows::Last).unwrap().into_data();
        }
        println!("gpt2 {gpt2}: padded against unpadded logits, at most {worst} ulps");
        assert!(worst <= 64, "gpt2 {gpt2}: padded logits {worst} ulps off");
        assert!(plain.warnings().is_empty() && padded.warnings().is_empty());
        assert!(padded.hide_padding(1).is_err(), "padding after a step");
        padded.reset();
        padded.hide_padding(2).unwrap();

        // Through generate: the session is fed the padded prompt, the answer is unchanged.
        let mut opts = GenerateOptions {
            max_new_tokens: 6,
            sampling: decoder::sample::SamplingParams::GREEDY,
            stop: vec![],
            fixed_length: false,
            pad_to: None,
        };
        let (want, _) = generate(&mut fixed.session(), prompt, &opts, |_| Ok(())).unwrap();
        opts.pad_to = Some(prompt.len() + PAD);
        let mut s = Counting {
            inner: fixed.session(),
            runs: 0,
            fed: 0,
        };
        let (got, _) = generate(&mut s.inner, prompt, &opts, |_| Ok(())).unwrap();
        if gpt2 {
            assert_eq!(got, want, "gpt2: padded answer");
        } else {
            // A tiny random Llama's near-ties may go either way within the rotary rounding:
            // the answer is the padded pass's, run by hand.
            let mut by_hand = fixed.session();
            by_hand.hide_padding(PAD).unwrap();
            let unpadded = GenerateOptions {
                pad_to: None,
                ..opts.clone()
            };
            let (manual, _) = generate(&mut by_hand, &input, &unpadded, |_| Ok(())).unwrap();
            assert_eq!(got, manual, "llama: padded answer");
        }
        // The engine itself is fed the padded prompt: the counting wrapper cannot hide
        // padding, so it refuses rather than run the prompt unpadded.
        assert!(generate(&mut s, prompt, &opts, |_| Ok(())).is_err());
        assert_eq!(s.runs, 0);
        opts.pad_to = Some(prompt.len() - 1);
        let err = generate(&mut fixed.session(), prompt, &opts, |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        let f32_model = F32Model::new(&w).unwrap();
        opts.pad_to = Some(prompt.len() + 1);
        assert!(generate(&mut f32_model.session(), prompt, &opts, |_| Ok(())).is_err());
    }
    assert_eq!(
        padded_prompt(&[7, 8], Some(4)).unwrap(),
        [PADDING_ID, PADDING_ID, 7, 8]
    );
    assert_eq!(padded_prompt(&[7, 8], Some(2)).unwrap(), [7, 8]);
    assert_eq!(padded_prompt(&[7, 8], None).unwrap(), [7, 8]);
}

/// candle-transformers' `quantized_llama` (an independent Llama) on the GGUF Veil reads: the same
/// logits at every prefix of a fixed sequence (within 1e-4 for F32 tensors; Q8_0 weights are
/// dequantised by both, so they agree as closely) and the same greedy tokens.
#[test]
fn f32_decoder_matches_candle_quantized_llama() {
    // Without it candle quantises the activations to 8 bits in Q8_0 products.
    std::env::set_var("CANDLE_DEQUANTIZE_ALL", "1");
    let w = tiny(false, 5, &TinyShape::default());
    for dtype in [GgmlDType::F32, GgmlDType::Q8_0] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        write_tiny_gguf(&path, &w, dtype).unwrap();
        let ours = decoder::load(path.to_str().unwrap()).unwrap().weights;
        let model = F32Model::new(&ours).unwrap();
        let mut file = std::fs::File::open(&path).unwrap();
        let content = gguf_file::Content::read(&mut file).unwrap();
        let mut theirs = ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap();
        let mut session = model.session();
        let mut worst = 0.0f32;
        for (pos, &id) in IDS.iter().enumerate() {
            let x = Tensor::new(&[id], &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let want: Vec<f32> = theirs
                .forward(&x, pos)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let got = session.step(&[id], LogitRows::Last).unwrap().data;
            assert_eq!(got.len(), want.len());
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            worst = worst.max(diff);
            let argmax = |v: &[f32]| decoder::sample::argmax(v).unwrap();
            assert_eq!(argmax(&got), argmax(&want), "{dtype:?} position {pos}");
        }
        assert!(
            worst < 1e-4,
            "{dtype:?}: logits differ from candle by {worst}"
        );
    }
}

/// The activation bound a server announces holds at its worst input and is not vacuous: with
/// the MLP norm's γ scaled up (so the bound is far above the split's tail, as in a pretrained
/// model), a hidden row aligned with the row of the first MLP layer whose bound is largest
/// drives that activation input to within 2 bits of 2^k and never past it; random prompts stay
/// inside it (no domain warning).
#[test]
fn activation_bound_holds_at_its_worst_input_and_is_tight() {
    use veil_model::decoder::DecoderNormKind;
    use veil_model::decoder::Mlp;
    use veil_model::engine::decoder::{DecoderEngine, DecoderLayer, DecoderNorm};
    for (gpt2, shape) in shapes() {
        let mut w = tiny(gpt2, 5, &shape);
        for b in &mut w.blocks {
            b.mlp_norm.weight.iter_mut().for_each(|g| *g *= 40.0);
        }
        let fixed = FixedDecoder::encode(&w, DecoderFormat::default()).unwrap();
        let k = fixed.activation_bits().expect("a bound below the ring");
        let fp = fixed.fp();
        let (ring, f) = (fp.ring, fp.frac_bits());
        let d = w.config.hidden;
        let mut worst = 0u64;
        for (i, b) in w.blocks.iter().enumerate() {
            let first = match &b.mlp {
                Mlp::Gated { gate, .. } => &gate.weight,
                Mlp::Plain { up, .. } => &up.weight,
            };
            let gamma = &b.mlp_norm.weight;
            for j in 0..first.rows {
                // x ∝ W_j ⊙ γ (centred for LayerNorm), at a few units: the norm's output then
                // points along W_j ⊙ γ, where |g_j| = √d·‖W_j ⊙ γ‖₂ is largest.
                let mut x: Vec<f64> = (0..d)
                    .map(|c| f64::from(first.data[j * d + c] * gamma[c]))
                    .collect();
                if gpt2 {
                    let mean = x.iter().sum::<f64>() / d as f64;
                    x.iter_mut().for_each(|v| *v -= mean);
                }
                let scale = 4.0 / x.iter().fold(0f64, |m, v| m.max(v.abs()));
                let row = x.iter().map(|v| fp.encode(v * scale)).collect::<Vec<_>>();
                let row = veil_core::RingTensor::from_vec(ring, &[1, d], row).unwrap();
                let mut s = fixed.session();
                let h = s
                    .norm(DecoderNorm::Mlp(i), DecoderNormKind::Original, &row)
                    .unwrap();
                let layer = if gpt2 {
                    DecoderLayer::Up(i)
                } else {
                    DecoderLayer::Gate(i)
                };
                let g = s.linear(layer, &h).unwrap();
                worst = worst.max(ring.to_signed(g.data()[j]).unsigned_abs());
            }
        }
        println!("gpt2 {gpt2}: k = {k}, worst 2^{:.2}", (worst as f64).log2());
        assert!(
            worst < 1 << k,
            "gpt2 {gpt2}: |g| = 2^{:.2} ≥ 2^{k}",
            (worst as f64).log2()
        );
        assert!(
            worst >= 1 << (k - 2),
            "gpt2 {gpt2}: the worst input reaches only 2^{:.2} of 2^{k} (f = {f})",
            (worst as f64).log2()
        );
        let mut s = fixed.session();
        s.step(&IDS, LogitRows::All).unwrap();
        assert!(s.warnings().is_empty(), "{:?}", s.warnings());
    }
}
