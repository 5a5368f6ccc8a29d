//! Byte-level BPE tokenizers (GPT-2 family) built from a vocabulary and merge list, as GGUF
//! metadata gives them.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer};
use veil_core::{Error, Result};

/// How text is split before BPE (llama.cpp's `tokenizer.ggml.pre`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PreSplit {
    /// The GPT-2 regex only.
    Gpt2,
    /// Every digit on its own, then the GPT-2 regex (SmolLM, StarCoder).
    DigitsThenGpt2,
}

impl PreSplit {
    /// The split llama.cpp names `pre` (absent: GPT-2's); others are refused by name.
    pub(crate) fn from_gguf(pre: Option<&str>, source: &str) -> Result<Self> {
        match pre {
            None | Some("default") | Some("gpt-2") | Some("gpt2") => Ok(PreSplit::Gpt2),
            Some("smollm") | Some("starcoder") | Some("refact") | Some("codeshell") => {
                Ok(PreSplit::DigitsThenGpt2)
            }
            Some(other) => Err(Error::Unsupported(format!(
                "{source}: pre-tokenizer tokenizer.ggml.pre = {other:?} is not supported \
                 (gpt-2, smollm, starcoder, refact, codeshell are)"
            ))),
        }
    }
}

/// One vocabulary entry that is matched whole before BPE (`<|im_start|>`, …).
#[derive(Clone, Debug)]
pub(crate) struct SpecialToken {
    /// The token's text.
    pub content: String,
    /// Control tokens (`special`) vs user-defined ones.
    pub special: bool,
}

/// A byte-level BPE tokenizer: no prefix space, no normaliser; `specials` (already in
/// `tokens`) encode as single ids; `bos` (token, id), when given, is prepended to prompts
/// encoded with special tokens.
pub(crate) fn byte_level_bpe(
    tokens: &[String],
    merges: &[String],
    specials: &[SpecialToken],
    split: PreSplit,
    bos: Option<(&str, u32)>,
    source: &str,
) -> Result<Tokenizer> {
    let bad = |what: String| Error::Malformed(format!("{source}: {what}"));
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        let id = u32::try_from(id).map_err(|_| bad("vocabulary over 2^32 tokens".into()))?;
        if vocab.insert(t.clone(), id).is_some() {
            return Err(bad(format!("token {t:?} appears twice in the vocabulary")));
        }
    }
    let merges = merges
        .iter()
        .map(|m| match m.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                Ok((a.to_string(), b.to_string()))
            }
            _ => Err(bad(format!(
                "merge {m:?} is not two tokens separated by one space"
            ))),
        })
        .collect::<Result<Vec<_>>>()?;
    let model = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| bad(format!("BPE model: {e}")))?;
    let mut tokenizer = Tokenizer::new(model);
    let byte_level = ByteLevel::new(false, true, true);
    let pre: PreTokenizerWrapper = match split {
        PreSplit::Gpt2 => byte_level.into(),
        PreSplit::DigitsThenGpt2 => {
            Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
        }
    };
    tokenizer.with_pre_tokenizer(Some(pre));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    let added = |special: bool| -> Vec<AddedToken> {
        specials
            .iter()
            .filter(|s| s.special == special)
            .map(|s| AddedToken::from(s.content.clone(), special))
            .collect()
    };
    tokenizer.add_special_tokens(&added(true));
    tokenizer.add_tokens(&added(false));
    if let Some((token, id)) = bos {
        let mut builder = TemplateProcessing::builder();
        builder
            .try_single(format!("{token} $A"))
            .map_err(|e| bad(format!("BOS template: {e}")))?;
        builder.special_tokens(vec![(token.to_string(), id)]);
        let template = builder
            .build()
            .map_err(|e| bad(format!("BOS template: {e}")))?;
        tokenizer.with_post_processor(Some(template));
    }
    Ok(tokenizer)
}
