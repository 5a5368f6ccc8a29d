//! Substituted decoder operators ([`DecoderBlockVariant`]) on tiny seeded random Llama decoders
//! (no download), their configuration written to the folder's `config.json` with
//! `decoder::with_variants` and read back: the simulator tracks f32 with any mix of substitutes
//! per block, its cached decode equals a full recompute bit for bit, each substitute changes the
//! logits (an engine that ignored one would fail), the simulator reports a ReLU-normalise row
//! outside its domain, and a GPT-2 decoder with substitutes is refused.

use veil_model::decoder::random::{write_tiny_gpt2, write_tiny_llama, TinyShape};
use veil_model::decoder::{
    self, DecoderActivation, DecoderBlockVariant, DecoderNormKind, DecoderWeights,
};
use veil_model::engine::decoder::LogitRows;
use veil_model::{AttentionNorm, DecoderFormat, F32Model, FixedDecoder};

/// Token ids of a fixed sequence in the tiny vocabulary (269 tokens).
const IDS: [u32; 9] = [1, 40, 77, 120, 5, 268, 33, 200, 2];

const ORIGINAL: DecoderBlockVariant = DecoderBlockVariant::ORIGINAL;

const FRIENDLY: DecoderBlockVariant = DecoderBlockVariant::FRIENDLY;
const SCALED: DecoderBlockVariant = DecoderBlockVariant::SCALED;

fn shape() -> TinyShape {
    TinyShape {
        layers: 3,
        ..TinyShape::default()
    }
}

/// A tiny Llama whose folder's `config.json` names `variants` (one per block).
fn tiny(seed: u8, variants: &[DecoderBlockVariant]) -> DecoderWeights {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), seed, &shape()).unwrap();
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, decoder::with_variants(&text, variants).unwrap()).unwrap();
    let w = decoder::load(dir.path().to_str().unwrap()).unwrap().weights;
    for (i, v) in variants.iter().enumerate() {
        assert_eq!(w.config.variant(i), *v);
    }
    w
}

fn f32_logits(w: &DecoderWeights) -> Vec<f64> {
    let f = F32Model::new(w)
        .unwrap()
        .session()
        .step(&IDS, LogitRows::All)
        .unwrap();
    f.data.iter().map(|&v| v as f64).collect()
}

fn sim_logits(w: &DecoderWeights) -> Vec<f64> {
    let fixed = FixedDecoder::encode(w, DecoderFormat::default()).unwrap();
    let mut s = fixed.session();
    let rows = s.step_f64(&IDS, LogitRows::All).unwrap();
    assert!(s.warnings().is_empty(), "{:?}", s.warnings());
    rows.concat()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The simulator's budget against f32 on these tiny decoders (as `decoder_engine.rs`'s
/// `simulator_tracks_f32_on_tiny_models`).
const SIM_VS_F32: f64 = 0.02;

/// The budget for a model with a Scale norm: without the division by the root mean square the
/// next layers see the residual stream's own magnitude, and the fixed-point errors grow with
/// it (measured: 0.039 with the attention norm of the last block substituted at f = 13, 0.18 at
/// f = 12, so the format's resolution, not a different computation).
const SCALED_SIM_VS_F32: f64 = 0.05;

/// Mixes of substitutes per block: the simulator against f32 on every position's logits, and
/// the simulator's prefill-then-decode with the KV cache equal to the full pass bit for bit
/// (f32's within 1e-4).
#[test]
fn substituted_blocks_simulator_tracks_f32_and_caches_exactly() {
    let mixes = [
        vec![FRIENDLY, SCALED, ORIGINAL],
        vec![FRIENDLY; 3],
        vec![SCALED, FRIENDLY, FRIENDLY],
    ];
    for (m, variants) in mixes.iter().enumerate() {
        let w = tiny(21 + m as u8, variants);
        let (f, s) = (f32_logits(&w), sim_logits(&w));
        let worst = max_diff(&f, &s);
        println!("mix {m}: simulator vs f32 {worst:.2e}");
        assert!(worst < SIM_VS_F32, "mix {m}: logits differ by {worst}");

        let fixed = FixedDecoder::encode(&w, DecoderFormat::default()).unwrap();
        let full = fixed.session().step(&IDS, LogitRows::All).unwrap();
        let mut sess = fixed.session();
        let mut rows = sess.step(&IDS[..4], LogitRows::All).unwrap().into_data();
        for &id in &IDS[4..] {
            rows.extend(sess.step(&[id], LogitRows::Last).unwrap().into_data());
        }
        assert!(rows == full.data(), "mix {m}: cached decode differs");
        assert!(sess.warnings().is_empty(), "{:?}", sess.warnings());

        let model = F32Model::new(&w).unwrap();
        let mut sess = model.session();
        let mut rows = sess.step(&IDS[..4], LogitRows::All).unwrap().data;
        for &id in &IDS[4..] {
            rows.extend(sess.step(&[id], LogitRows::Last).unwrap().data);
        }
        let rows: Vec<f64> = rows.iter().map(|&v| v as f64).collect();
        let worst = max_diff(&rows, &f);
        assert!(
            worst < 1e-4,
            "mix {m}: f32 cached decode differs by {worst}"
        );
    }
}

/// Each substitute alone, in the first or the last block, moves the logits well beyond the
/// simulator's error in both engines (an engine that ignored it would stay at the original's
/// logits), while the two engines still agree on the substituted model.
#[test]
fn each_substitute_changes_the_logits_in_both_engines() {
    let seed = 31;
    let base = tiny(seed, &[ORIGINAL; 3]);
    let (f0, s0) = (f32_logits(&base), sim_logits(&base));
    let singles = [
        (
            "activation",
            DecoderBlockVariant {
                activation: DecoderActivation::Relu,
                ..ORIGINAL
            },
        ),
        (
            "hard-swish",
            DecoderBlockVariant {
                activation: DecoderActivation::HardSwish,
                ..ORIGINAL
            },
        ),
        (
            "attention",
            DecoderBlockVariant {
                attention: AttentionNorm::ReluNormalise,
                ..ORIGINAL
            },
        ),
        (
            "attn_norm",
            DecoderBlockVariant {
                attn_norm: DecoderNormKind::Scale,
                ..ORIGINAL
            },
        ),
        (
            "mlp_norm",
            DecoderBlockVariant {
                mlp_norm: DecoderNormKind::Scale,
                ..ORIGINAL
            },
        ),
    ];
    for (name, v) in singles {
        for block in [0, 2] {
            let mut variants = vec![ORIGINAL; 3];
            variants[block] = v;
            let w = tiny(seed, &variants);
            let (f, s) = (f32_logits(&w), sim_logits(&w));
            let (moved_f, moved_s, agree) =
                (max_diff(&f, &f0), max_diff(&s, &s0), max_diff(&f, &s));
            println!(
                "{name} in block {block}: f32 moved {moved_f:.3}, simulator moved {moved_s:.3}, apart {agree:.2e}"
            );
            let budget = if name.ends_with("norm") {
                SCALED_SIM_VS_F32
            } else {
                SIM_VS_F32
            };
            assert!(
                agree < budget,
                "{name} in block {block}: engines {agree} apart"
            );
            assert!(
                moved_f > 5.0 * SIM_VS_F32 && moved_s > 5.0 * SIM_VS_F32,
                "{name} in block {block}: the logits hardly moved ({moved_f}, {moved_s})"
            );
        }
    }
}

/// Scores far outside ReLU-normalise's domain (the first block's query weights ×1000, its key
/// weights ×100): the
/// simulator reports them; the same model with Softmax reports no domain violation.
#[test]
fn relu_normalise_outside_its_domain_is_reported() {
    let attention = DecoderBlockVariant {
        attention: AttentionNorm::ReluNormalise,
        ..ORIGINAL
    };
    for (variant, reported) in [(attention, true), (ORIGINAL, false)] {
        let mut w = tiny(41, &[variant, ORIGINAL, ORIGINAL]);
        w.blocks[0]
            .q
            .weight
            .data
            .iter_mut()
            .for_each(|v| *v *= 1000.0);
        w.blocks[0]
            .k
            .weight
            .data
            .iter_mut()
            .for_each(|v| *v *= 100.0);
        let fixed = FixedDecoder::encode(&w, DecoderFormat::default()).unwrap();
        let mut s = fixed.session();
        s.step(&IDS, LogitRows::All).unwrap();
        let domain = s
            .warnings()
            .into_iter()
            .filter(|l| l.contains("outside"))
            .collect::<Vec<_>>();
        assert_eq!(!domain.is_empty(), reported, "{variant:?}: {domain:?}");
        if reported {
            assert!(s.reports()[0].out_of_domain > 0);
            assert!(domain[0].starts_with("block 0:"), "{domain:?}");
        }
    }
}

/// Substitutes in a GPT-2 decoder (built in memory, past the loader's own refusal) are refused
/// by the composition, not silently run as the original operators.
#[test]
fn substituted_gpt2_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = TinyShape {
        kv_heads: 4,
        ..TinyShape::default()
    };
    write_tiny_gpt2(dir.path(), 3, &s).unwrap();
    let mut w = decoder::load(dir.path().to_str().unwrap()).unwrap().weights;
    w.config.variants = vec![FRIENDLY; s.layers];
    let e = F32Model::new(&w)
        .and_then(|m| m.session().step(&IDS, LogitRows::Last).map(drop))
        .unwrap_err()
        .to_string();
    assert!(e.contains("Llama family only"), "{e}");
    let e = FixedDecoder::encode(&w, DecoderFormat::default())
        .and_then(|f| f.session().step(&IDS, LogitRows::Last).map(drop))
        .unwrap_err()
        .to_string();
    assert!(e.contains("Llama family only"), "{e}");
}
