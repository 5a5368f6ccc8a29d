//! Decoder loading on tiny seeded models written inside the tests: Hugging Face folders
//! (Llama, GPT-2) and the same Llama as a GGUF, config and file errors, tokenizer, chat
//! template, and the boundary between encoder and decoder commands.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use serde_json::Value;
use veil_model::decoder::random::{write_tiny_gguf, write_tiny_gpt2, write_tiny_llama, TinyShape};
use veil_model::decoder::{self, ChatMessage, DecoderFamily, DecoderSource, Mlp, RopeScaling};
use veil_model::source::ModelSource;

fn tensors(dir: &Path) -> HashMap<String, Vec<f32>> {
    candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(k, t): (String, Tensor)| {
            (
                k,
                t.to_dtype(DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap(),
            )
        })
        .collect()
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(v.as_object_mut().unwrap());
    std::fs::write(&path, v.to_string()).unwrap();
}

fn load_err(dir: &Path) -> String {
    decoder::load(dir.to_str().unwrap())
        .unwrap_err()
        .to_string()
}

#[test]
fn tiny_llama_folder_loads_with_its_exact_weights() {
    for (tie, bias) in [(true, false), (false, true)] {
        let dir = tempfile::tempdir().unwrap();
        let shape = TinyShape {
            tie_word_embeddings: tie,
            attention_bias: bias,
            ..TinyShape::default()
        };
        write_tiny_llama(dir.path(), 7, &shape).unwrap();
        let m = decoder::load(dir.path().to_str().unwrap()).unwrap();
        let c = &m.weights.config;
        assert_eq!(c.family, DecoderFamily::Llama);
        assert_eq!(
            (c.hidden, c.layers, c.heads, c.kv_heads, c.head_dim),
            (32, 2, 4, 2, 8)
        );
        assert_eq!(
            (c.intermediate, c.max_positions, c.vocab_size),
            (64, 64, m.tokenizer.vocab_size())
        );
        assert_eq!((c.tie_word_embeddings, c.attention_bias), (tie, bias));
        assert_eq!(
            (c.bos_token_id, c.eos_token_ids.clone()),
            (Some(1), vec![2])
        );
        let t = tensors(dir.path());
        let b1 = &m.weights.blocks[1];
        assert_eq!(
            b1.q.weight.data,
            t["model.layers.1.self_attn.q_proj.weight"]
        );
        assert_eq!(b1.k.weight.rows, 16);
        assert_eq!(
            b1.o.bias.as_deref(),
            t.get("model.layers.1.self_attn.o_proj.bias")
                .map(|v| v.as_slice())
        );
        let Mlp::Gated { down, .. } = &b1.mlp else {
            panic!("llama has a gated MLP")
        };
        assert_eq!(down.weight.data, t["model.layers.1.mlp.down_proj.weight"]);
        assert_eq!(m.weights.final_norm.weight, t["model.norm.weight"]);
        assert_eq!(m.weights.lm_head.is_none(), tie);
        assert_eq!(
            m.weights.lm_head().data,
            t[if tie {
                "model.embed_tokens.weight"
            } else {
                "lm_head.weight"
            }]
        );
    }
}

#[test]
fn tiny_gpt2_folder_transposes_conv1d_and_splits_the_fused_attention() {
    let dir = tempfile::tempdir().unwrap();
    let shape = TinyShape {
        kv_heads: 4,
        ..TinyShape::default()
    };
    write_tiny_gpt2(dir.path(), 3, &shape).unwrap();
    let m = decoder::load(dir.path().to_str().unwrap()).unwrap();
    let c = &m.weights.config;
    assert_eq!(c.family, DecoderFamily::Gpt2);
    assert_eq!(
        (c.hidden, c.heads, c.kv_heads, c.intermediate),
        (32, 4, 4, 64)
    );
    let t = tensors(dir.path());
    let (h, b) = (32, &m.weights.blocks[0]);
    let fused = &t["transformer.h.0.attn.c_attn.weight"]; // [in, 3h]
    for (part, lin) in [&b.q, &b.k, &b.v].into_iter().enumerate() {
        for out in [0, 5, h - 1] {
            for inp in [0, 7, h - 1] {
                assert_eq!(
                    lin.weight.data[out * h + inp],
                    fused[inp * 3 * h + part * h + out]
                );
            }
        }
        let bias = &t["transformer.h.0.attn.c_attn.bias"][part * h..(part + 1) * h];
        assert_eq!(lin.bias.as_deref(), Some(bias));
    }
    let Mlp::Plain { up, .. } = &b.mlp else {
        panic!("GPT-2 has a plain MLP")
    };
    assert_eq!((up.weight.rows, up.weight.cols), (64, 32));
    assert_eq!(
        up.weight.data[3 * 32 + 2],
        t["transformer.h.0.mlp.c_fc.weight"][2 * 64 + 3]
    );
    assert_eq!(
        b.attn_norm.bias.as_deref(),
        Some(t["transformer.h.0.ln_1.bias"].as_slice())
    );
    assert_eq!(
        m.weights.position_embedding.as_ref().unwrap().data,
        t["transformer.wpe.weight"]
    );
}

#[test]
fn config_fields_that_change_the_computation_are_refused_by_name() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("frobnicate_heads", Value::from(2), "frobnicate_heads"),
        ("hidden_act", Value::from("gelu"), "hidden_act"),
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "yarn", "factor": 4.0}),
            "rope_scaling.rope_type",
        ),
        (
            "rope_scaling",
            serde_json::json!({"type": "linear", "factor": 2.0, "extra": 1}),
            "rope_scaling.extra",
        ),
        ("rope_interleaved", Value::Bool(true), "rope_interleaved"),
        ("num_hidden_layers", Value::from("two"), "num_hidden_layers"),
    ];
    for (field, value, named) in cases {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_llama(dir.path(), 1, &TinyShape::default()).unwrap();
        edit_config(dir.path(), |m| {
            m.insert(field.into(), value.clone());
        });
        let e = load_err(dir.path());
        assert!(
            e.contains(named) && e.contains("config.json"),
            "{field}: {e}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 1, &TinyShape::default()).unwrap();
    edit_config(dir.path(), |m| {
        m.remove("hidden_size");
    });
    assert!(load_err(dir.path()).contains("hidden_size"));

    let gpt2 = tempfile::tempdir().unwrap();
    write_tiny_gpt2(
        gpt2.path(),
        1,
        &TinyShape {
            kv_heads: 4,
            ..TinyShape::default()
        },
    )
    .unwrap();
    edit_config(gpt2.path(), |m| {
        m.insert("activation_function".into(), Value::from("relu"));
    });
    assert!(load_err(gpt2.path()).contains("activation_function"));
}

#[test]
fn block_variants_round_trip_through_the_veil_object_and_bad_ones_are_refused() {
    use veil_model::decoder::{DecoderActivation, DecoderBlockVariant, DecoderNormKind};
    use veil_model::AttentionNorm;
    let dir = tempfile::tempdir().unwrap();
    let shape = TinyShape::default();
    write_tiny_llama(dir.path(), 3, &shape).unwrap();
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut variants = vec![DecoderBlockVariant::ORIGINAL; shape.layers];
    variants[0] = DecoderBlockVariant {
        activation: DecoderActivation::Relu,
        attention: AttentionNorm::ReluNormalise,
        attn_norm: DecoderNormKind::Scale,
        mlp_norm: DecoderNormKind::Original,
    };
    std::fs::write(&path, decoder::with_variants(&text, &variants).unwrap()).unwrap();
    let c = decoder::load(dir.path().to_str().unwrap())
        .unwrap()
        .weights
        .config;
    assert_eq!(c.variants, variants);
    assert!(c.is_substituted());
    assert_eq!(c.variant(1), DecoderBlockVariant::ORIGINAL);
    // All original: the object is removed, and the folder reads as the pre-trained model.
    let orig = vec![DecoderBlockVariant::ORIGINAL; shape.layers];
    let plain = decoder::with_variants(&text, &orig).unwrap();
    assert!(!plain.contains("\"veil\""));

    for (veil, named) in [
        (
            serde_json::json!({"blocks": [{"activation": "tanh", "attention": "softmax", "attn_norm": "original", "mlp_norm": "original"}]}),
            "veil",
        ),
        (serde_json::json!({"blocks": [], "extra": 1}), "veil"),
        (
            serde_json::json!({"blocks": [DecoderBlockVariant::ORIGINAL]}),
            "block variants",
        ),
    ] {
        let d = tempfile::tempdir().unwrap();
        write_tiny_llama(d.path(), 3, &shape).unwrap();
        edit_config(d.path(), |m| {
            m.insert("veil".into(), veil.clone());
        });
        let e = load_err(d.path());
        assert!(e.contains(named), "{veil}: {e}");
    }
    let g = tempfile::tempdir().unwrap();
    write_tiny_gpt2(
        g.path(),
        1,
        &TinyShape {
            kv_heads: 4,
            ..shape
        },
    )
    .unwrap();
    let relu = DecoderBlockVariant {
        activation: DecoderActivation::Relu,
        ..DecoderBlockVariant::ORIGINAL
    };
    edit_config(g.path(), |m| {
        m.insert(
            "veil".into(),
            serde_json::json!({"blocks": vec![relu; shape.layers]}),
        );
    });
    assert!(load_err(g.path()).contains("Llama family only"));
}

#[test]
fn rope_scaling_kinds_parse_and_scale_the_frequencies() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 1, &TinyShape::default()).unwrap();
    edit_config(dir.path(), |m| {
        m.insert(
            "rope_scaling".into(),
            serde_json::json!({"type": "linear", "factor": 2.0}),
        );
    });
    let c = decoder::hf::load_config(dir.path()).unwrap();
    assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));
    let plain = RopeScaling::inv_freqs(None, 10_000.0, 8);
    let scaled = RopeScaling::inv_freqs(c.rope_scaling.as_ref(), 10_000.0, 8);
    assert_eq!(plain[0], 1.0);
    assert!(plain
        .iter()
        .zip(&scaled)
        .all(|(p, s)| (p / 2.0 - s).abs() < 1e-15));

    edit_config(dir.path(), |m| {
        m.insert(
            "rope_scaling".into(),
            serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        );
    });
    let c = decoder::hf::load_config(dir.path()).unwrap();
    let s = c.rope_scaling.as_ref().unwrap();
    let f = RopeScaling::inv_freqs(Some(s), 500_000.0, 128);
    let p = RopeScaling::inv_freqs(None, 500_000.0, 128);
    // High frequencies (short wavelengths) untouched, the lowest divided by the factor.
    assert_eq!(f[0], p[0]);
    assert!((f[63] - p[63] / 8.0).abs() < 1e-18);
}

#[test]
fn weight_file_errors_name_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 1, &TinyShape::default()).unwrap();
    let mut t: HashMap<String, Tensor> =
        candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu).unwrap();
    let extra = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
    t.insert("model.layers.0.mystery.weight".into(), extra);
    candle_core::safetensors::save(&t, dir.path().join("model.safetensors")).unwrap();
    let e = load_err(dir.path());
    assert!(
        e.contains("layers.0.mystery.weight") && e.contains("model.safetensors"),
        "{e}"
    );

    let wrong = Tensor::zeros((5, 32), DType::F32, &Device::Cpu).unwrap();
    t.remove("model.layers.0.mystery.weight");
    t.insert("model.layers.1.self_attn.k_proj.weight".into(), wrong);
    candle_core::safetensors::save(&t, dir.path().join("model.safetensors")).unwrap();
    let e = load_err(dir.path());
    assert!(
        e.contains("layers.1.self_attn.k_proj.weight") && e.contains("[5, 32]"),
        "{e}"
    );

    std::fs::write(dir.path().join("model.safetensors"), b"not safetensors").unwrap();
    assert!(load_err(dir.path()).contains("model.safetensors"));
}

#[test]
fn tokenizer_round_trips_and_specials_are_single_ids() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 1, &TinyShape::default()).unwrap();
    let tok = decoder::load(dir.path().to_str().unwrap())
        .unwrap()
        .tokenizer;
    for text in [
        "the cat sat on the mat",
        "Héllo, wörld! 😀 12345",
        "  spaces\n\ttabs  ",
        "",
    ] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }
    assert_eq!(tok.encode("<|im_start|>user\nhi<|im_end|>").unwrap()[0], 1);
    let ids = tok.encode("a<|im_end|>b").unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1);
    // " the" and " cat" are merged words; digits are split one by one.
    assert_eq!(tok.encode(" the").unwrap().len(), 1);
    assert_eq!(tok.encode("123").unwrap().len(), 3);
    assert!(tok.decode(&[1_000_000]).is_err());
}

#[test]
fn streaming_decode_releases_only_complete_characters() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 1, &TinyShape::default()).unwrap();
    let tok = decoder::load(dir.path().to_str().unwrap())
        .unwrap()
        .tokenizer;
    let text = "ok 😀 é€ done";
    let ids = tok.encode(text).unwrap();
    let mut stream = tok.stream();
    let mut pieces = Vec::new();
    for &id in &ids {
        let piece = stream.push(id).unwrap();
        assert!(!piece.contains('\u{FFFD}'), "{piece:?}");
        pieces.push(piece);
    }
    pieces.push(stream.finish().unwrap());
    assert_eq!(pieces.concat(), text);
    // The 4-byte emoji is 4 byte tokens: the first three release nothing.
    assert!(pieces.iter().filter(|p| p.is_empty()).count() >= 3);
}

#[test]
fn chat_template_renders_the_default_system_line_and_turns() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 1, &TinyShape::default()).unwrap();
    let tok = decoder::load(dir.path().to_str().unwrap())
        .unwrap()
        .tokenizer;
    let user = [ChatMessage::new("user", "What is the capital of France?")];
    assert_eq!(
        tok.render_chat(&user, true).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    let turns = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello."),
    ];
    assert_eq!(
        tok.render_chat(&turns, false).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
    );

    std::fs::remove_file(dir.path().join("tokenizer_config.json")).unwrap();
    let plain = decoder::load(dir.path().to_str().unwrap())
        .unwrap()
        .tokenizer;
    assert!(!plain.has_chat_template());
    let e = plain.render_chat(&user, true).unwrap_err().to_string();
    assert!(
        e.contains("no chat template") && e.contains("tokenizer.json"),
        "{e}"
    );
}

#[test]
fn gguf_of_a_folder_loads_back_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    for tie in [true, false] {
        let folder = dir.path().join(format!("tie-{tie}"));
        write_tiny_llama(
            &folder,
            11,
            &TinyShape {
                tie_word_embeddings: tie,
                ..TinyShape::default()
            },
        )
        .unwrap();
        let hf = decoder::load(folder.to_str().unwrap()).unwrap();
        let path = dir.path().join(format!("tiny-{tie}.gguf"));
        write_tiny_gguf(&path, &hf.weights, GgmlDType::F32).unwrap();
        let g = decoder::load(path.to_str().unwrap()).unwrap();
        // GGUF stores ε as an f32; everything else comes back bit for bit from f32 storage,
        // q/k once llama.cpp's row permutation is undone.
        let mut gw = g.weights.clone();
        assert!((gw.config.norm_eps - hf.weights.config.norm_eps).abs() < 1e-12);
        gw.config.norm_eps = hf.weights.config.norm_eps;
        assert_eq!(gw, hf.weights);
        for text in ["the cat 123 😀", "<|im_start|>user\nhi<|im_end|>"] {
            assert_eq!(
                g.tokenizer.encode(text).unwrap(),
                hf.tokenizer.encode(text).unwrap()
            );
        }
        let chat = [ChatMessage::new("user", "hi")];
        assert_eq!(
            g.tokenizer.render_chat(&chat, true).unwrap(),
            hf.tokenizer.render_chat(&chat, true).unwrap()
        );
    }
}

#[test]
fn quantised_gguf_dequantises_within_the_format_error() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 5, &TinyShape::default()).unwrap();
    let hf = decoder::load(dir.path().to_str().unwrap()).unwrap();
    for (kind, tol) in [(GgmlDType::Q8_0, 0.01), (GgmlDType::Q4_1, 0.1)] {
        let path = dir.path().join("q.gguf");
        write_tiny_gguf(&path, &hf.weights, kind).unwrap();
        let g = decoder::load(path.to_str().unwrap()).unwrap();
        let (a, b) = (
            &g.weights.blocks[1].q.weight.data,
            &hf.weights.blocks[1].q.weight.data,
        );
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(worst < tol && worst > 0.0, "{kind:?}: {worst}");
    }
}

fn tiny_gguf_bytes(dir: &Path) -> Vec<u8> {
    let folder = dir.join("folder");
    write_tiny_llama(
        &folder,
        2,
        &TinyShape {
            layers: 1,
            ..TinyShape::default()
        },
    )
    .unwrap();
    let hf = decoder::load(folder.to_str().unwrap()).unwrap();
    let path = dir.join("src.gguf");
    write_tiny_gguf(&path, &hf.weights, GgmlDType::Q8_0).unwrap();
    std::fs::read(path).unwrap()
}

#[test]
fn truncated_gguf_is_an_error_naming_the_file_at_every_cut() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = tiny_gguf_bytes(dir.path());
    let path = dir.path().join("cut.gguf");
    // Every byte of the header region, then a stride through the tensor data, up to the last
    // tensor's final bytes (the file ends in under 32 bytes of alignment padding).
    let end = bytes.len() - 32;
    let header = end.min(8192);
    let cuts = (0..header).chain((header..=end).step_by(97)).chain([end]);
    for cut in cuts {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        match decoder::load(path.to_str().unwrap()) {
            Ok(_) => panic!("a file cut at {cut} of {} loaded", bytes.len()),
            Err(e) => assert!(e.to_string().contains("cut.gguf"), "cut {cut}: {e}"),
        }
    }
}

#[test]
fn corrupt_gguf_bytes_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = tiny_gguf_bytes(dir.path());
    let path = dir.path().join("bad.gguf");
    let header = bytes.len().min(8192);
    for pos in (0..header).step_by(3) {
        for flip in [0xFFu8, 0x80, 0x01] {
            let mut b = bytes.clone();
            b[pos] ^= flip;
            std::fs::write(&path, &b).unwrap();
            if let Err(e) = decoder::load(path.to_str().unwrap()) {
                assert!(e.to_string().contains("bad.gguf"), "byte {pos}: {e}");
            }
        }
    }
}

#[test]
fn gguf_architecture_tokenizer_and_dtype_outside_support_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = tiny_gguf_bytes(dir.path());
    let replace = |from: &[u8], to: &[u8]| -> Vec<u8> {
        assert_eq!(from.len(), to.len());
        let at = bytes.windows(from.len()).position(|w| w == from).unwrap();
        let mut b = bytes.clone();
        b[at..at + to.len()].copy_from_slice(to);
        b
    };
    let path = dir.path().join("odd.gguf");
    let check = |b: Vec<u8>, needles: &[&str]| {
        std::fs::write(&path, b).unwrap();
        let e = decoder::load(path.to_str().unwrap())
            .unwrap_err()
            .to_string();
        for n in needles {
            assert!(e.contains(n), "{n}: {e}");
        }
        assert!(e.contains("odd.gguf"), "{e}");
    };
    // The architecture value "llama" (after its u64 length 5) becomes "llamb".
    check(
        replace(b"\x05\0\0\0\0\0\0\0llama", b"\x05\0\0\0\0\0\0\0llamb"),
        &["general.architecture", "llamb"],
    );
    check(
        replace(b"\x04\0\0\0\0\0\0\0gpt2", b"\x04\0\0\0\0\0\0\0bert"),
        &["tokenizer.ggml.model", "bert"],
    );
    check(
        replace(b"\x06\0\0\0\0\0\0\0smollm", b"\x06\0\0\0\0\0\0\0qwen35"),
        &["tokenizer.ggml.pre", "qwen35"],
    );
    // An alignment of 0 (candle divides by it) is an error, not a panic: the key
    // llama.block_count becomes general.alignment (same length) and its u32 value 0.
    let key = b"llama.block_count";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap();
    let mut b = bytes.clone();
    b[at..at + key.len()].copy_from_slice(b"general.alignment");
    let value = at + key.len() + 4; // after the u32 value type
    assert_eq!(b[at + key.len()..value], [4, 0, 0, 0]);
    b[value..value + 4].copy_from_slice(&[0, 0, 0, 0]);
    check(b, &["GGUF"]);
    // Type 8 (Q8_0) of the first tensor info becomes 16, a type candle does not know.
    let name = b"token_embd.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let dtype_at = at + 4 + 2 * 8; // n_dims u32, two u64 dims
    let mut b = bytes.clone();
    assert_eq!(b[dtype_at..dtype_at + 4], [8, 0, 0, 0]);
    b[dtype_at] = 16;
    check(b, &["dtype", "16"]);
}

#[test]
fn encoder_and_decoder_commands_refuse_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let llama = dir.path().join("llama");
    write_tiny_llama(&llama, 1, &TinyShape::default()).unwrap();
    let e = ModelSource::resolve(llama.to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("decoder LLM") && e.contains("veil generate"),
        "{e}"
    );
    let e = ModelSource::resolve("smollm2-135m-instruct")
        .unwrap_err()
        .to_string();
    assert!(e.contains("decoder LLM"), "{e}");
    let e = ModelSource::resolve("some/model.gguf")
        .unwrap_err()
        .to_string();
    assert!(e.contains("decoder LLM"), "{e}");

    let bert = dir.path().join("bert");
    std::fs::create_dir_all(&bert).unwrap();
    veil_model::random::write_tiny_classifier(&bert, 1, 2, 1).unwrap();
    let e = DecoderSource::resolve(bert.to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bert") && e.contains("not a supported decoder"),
        "{e}"
    );
    let e = DecoderSource::resolve("default").unwrap_err().to_string();
    assert!(e.contains("is an encoder"), "{e}");
    assert_eq!(
        DecoderSource::resolve(llama.to_str().unwrap()).unwrap(),
        DecoderSource::Folder(llama.clone())
    );
}

/// The benchmark shapes build valid models with the published parameter counts of
/// SmolLM2-135M (134,515,008) and GPT-2 small (124,439,808), head tied to the embedding.
#[test]
fn benchmark_shapes_have_the_published_parameter_counts() {
    use veil_model::decoder::{DecoderShape, Linear, Mlp, Norm};
    let linear = |l: &Linear| l.weight.data.len() + l.bias.as_ref().map_or(0, Vec::len);
    let norm = |n: &Norm| n.weight.len() + n.bias.as_ref().map_or(0, Vec::len);
    for (shape, published) in [
        (DecoderShape::SmolLm2, 134_515_008),
        (DecoderShape::Gpt2, 124_439_808),
    ] {
        let w = shape.random_weights(1).unwrap();
        assert_eq!(DecoderShape::from_name(shape.name()), Some(shape));
        let mut count = w.token_embedding.data.len()
            + w.position_embedding.as_ref().map_or(0, |p| p.data.len())
            + norm(&w.final_norm);
        for b in &w.blocks {
            count += norm(&b.attn_norm) + norm(&b.mlp_norm);
            count += linear(&b.q) + linear(&b.k) + linear(&b.v) + linear(&b.o);
            count += match &b.mlp {
                Mlp::Gated { gate, up, down } => linear(gate) + linear(up) + linear(down),
                Mlp::Plain { up, down } => linear(up) + linear(down),
            };
        }
        assert!(w.lm_head.is_none());
        assert_eq!(count, published, "{}", shape.name());
    }
}
