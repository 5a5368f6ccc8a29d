//! Text → token ids with the `tokenizers` crate (pure-Rust build), from a model folder's
//! `tokenizer.json` or a BERT WordPiece `vocab.txt`.
//!
//! Inputs are truncated to a maximum length (longest-first over a sentence pair) and never
//! padded: private inference cost grows with the real length. Each encoding says how many
//! tokens the truncation dropped, so a client can refuse an over-long prompt instead of
//! classifying a silently shortened one.

use std::path::Path;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;
use tokenizers::{EncodeInput, Tokenizer, TruncationParams};
use veil_core::{bail, ensure, Error, Result};

/// Token ids and token-type ids of one input (with `[CLS]`/`[SEP]` or `<s>`/`</s>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    /// The token ids.
    pub ids: Vec<u32>,
    /// The token-type ids: 0 for the first sentence, 1 for the second of a pair.
    pub type_ids: Vec<u32>,
    /// Tokens the truncation to the maximum length dropped (0 when the input fit).
    pub truncated: usize,
}

impl Encoded {
    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// A tokenizer with a fixed truncation length.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    /// The same tokenizer without truncation, to count what the truncation drops.
    untruncated: Tokenizer,
    max_len: usize,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab_size", &self.inner.get_vocab_size(true))
            .field("max_len", &self.max_len)
            .finish()
    }
}

fn tk_err(what: &str) -> impl FnOnce(tokenizers::Error) -> Error + '_ {
    move |e| Error::Malformed(format!("{what}: {e}"))
}

impl TextTokenizer {
    /// Loads a `tokenizer.json`. Any padding it configures is switched off.
    pub fn from_tokenizer_json(path: &Path, max_len: usize) -> Result<Self> {
        let inner = Tokenizer::from_file(path).map_err(tk_err(&path.display().to_string()))?;
        Self::wrap(inner, max_len)
    }

    /// A BERT WordPiece tokenizer from `vocab.txt` (`[CLS] a [SEP] b [SEP]`).
    pub fn from_vocab_txt(path: &Path, lowercase: bool, max_len: usize) -> Result<Self> {
        let text = path
            .to_str()
            .ok_or_else(|| Error::InvalidArgument(format!("non-UTF-8 path {path:?}")))?;
        let model = WordPiece::from_file(text)
            .unk_token("[UNK]".into())
            .build()
            .map_err(tk_err(text))?;
        let mut inner = Tokenizer::new(model);
        let special = |t: &str| {
            inner
                .token_to_id(t)
                .ok_or_else(|| Error::Malformed(format!("{text}: vocabulary lacks {t}")))
        };
        let (cls, sep) = (special("[CLS]")?, special("[SEP]")?);
        inner
            .with_normalizer(Some(BertNormalizer::new(true, true, None, lowercase)))
            .with_pre_tokenizer(Some(BertPreTokenizer))
            .with_post_processor(Some(BertProcessing::new(
                ("[SEP]".into(), sep),
                ("[CLS]".into(), cls),
            )))
            .with_decoder(Some(WordPieceDecoder::default()));
        Self::wrap(inner, max_len)
    }

    /// `tokenizer.json` if the folder has one, else `vocab.txt` (lower-casing unless
    /// `tokenizer_config.json` says `"do_lower_case": false`).
    pub fn from_folder(dir: &Path, max_len: usize) -> Result<Self> {
        let json = dir.join("tokenizer.json");
        if json.is_file() {
            return Self::from_tokenizer_json(&json, max_len);
        }
        let vocab = dir.join("vocab.txt");
        if vocab.is_file() {
            let lowercase = std::fs::read_to_string(dir.join("tokenizer_config.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .and_then(|v| v.get("do_lower_case").and_then(|b| b.as_bool()))
                .unwrap_or(true);
            return Self::from_vocab_txt(&vocab, lowercase, max_len);
        }
        bail!(
            Malformed,
            "{}: no tokenizer.json or vocab.txt",
            dir.display()
        )
    }

    fn wrap(mut inner: Tokenizer, max_len: usize) -> Result<Self> {
        ensure!(
            max_len >= 4,
            InvalidArgument,
            "maximum length {max_len} leaves no room for text"
        );
        inner.with_padding(None);
        let mut untruncated = inner.clone();
        untruncated
            .with_truncation(None)
            .map_err(tk_err("truncation"))?;
        inner
            .with_truncation(Some(TruncationParams {
                max_length: max_len,
                ..Default::default()
            }))
            .map_err(tk_err("truncation"))?;
        Ok(TextTokenizer {
            inner,
            untruncated,
            max_len,
        })
    }

    /// The length inputs are truncated to.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Encodes one sentence, or a pair (`b`) as `[CLS] a [SEP] b [SEP]` with type ids 0/1.
    pub fn encode(&self, a: &str, b: Option<&str>) -> Result<Encoded> {
        let input = || -> EncodeInput {
            match b {
                Some(b) => (a, b).into(),
                None => a.into(),
            }
        };
        let enc = self
            .inner
            .encode(input(), true)
            .map_err(tk_err("tokenising"))?;
        let full = self
            .untruncated
            .encode(input(), true)
            .map_err(tk_err("tokenising"))?;
        Ok(Encoded {
            ids: enc.get_ids().to_vec(),
            type_ids: enc.get_type_ids().to_vec(),
            truncated: full.len().saturating_sub(enc.len()),
        })
    }

    /// The number of token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Writes `tokenizer.json` (as used by [`crate::folder::save`]).
    /// The tokenizer's JSON, as [`Self::save`] writes it.
    pub fn to_json(&self) -> Result<String> {
        self.inner
            .to_string(false)
            .map_err(|e| Error::Other(format!("serialising the tokenizer: {e}")))
    }

    /// Writes the tokenizer as `tokenizer.json` would hold it.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.inner
            .save(path, false)
            .map_err(|e| Error::Other(format!("writing {}: {e}", path.display())))
    }
}
