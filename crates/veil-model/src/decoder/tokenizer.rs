//! A decoder's tokenizer: text ↔ ids (the `tokenizers` crate), streaming decode, and the
//! model's chat template (Jinja, rendered with `minijinja`).

use tokenizers::Tokenizer;
use veil_core::{Error, Result};

use super::chat::{ChatMessage, ChatTemplate};

/// Text ↔ ids for one decoder, plus its chat template when the model ships one.
#[derive(Clone)]
pub struct DecoderTokenizer {
    inner: Tokenizer,
    chat: Option<ChatTemplate>,
    /// Where the tokenizer came from, for error messages.
    source: String,
}

impl std::fmt::Debug for DecoderTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecoderTokenizer")
            .field("source", &self.source)
            .field("vocab_size", &self.inner.get_vocab_size(true))
            .field("chat_template", &self.chat.is_some())
            .finish()
    }
}

impl DecoderTokenizer {
    /// Wraps a built tokenizer; `source` names the file it came from in later errors.
    pub fn new(inner: Tokenizer, chat: Option<ChatTemplate>, source: impl Into<String>) -> Self {
        DecoderTokenizer {
            inner,
            chat,
            source: source.into(),
        }
    }

    /// Ids of `text` exactly: no BOS or other token is added. For text a chat template rendered
    /// (it writes its own special tokens, which encode as single ids).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, false)
    }

    /// Ids of a plain text prompt, with the tokens the model's tokenizer adds around it (a BOS
    /// for Llama-style tokenizers whose post-processor or `tokenizer.ggml.add_bos_token` asks
    /// for one; nothing for SmolLM2 or GPT-2).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, true)
    }

    fn encode_with(&self, text: &str, specials: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, specials)
            .map_err(|e| Error::Malformed(format!("{}: cannot encode: {e}", self.source)))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens included (an unknown id is an error).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let vocab = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::InvalidArgument(format!(
                "{}: token id {bad} is outside the vocabulary of {vocab}",
                self.source
            )));
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| Error::Malformed(format!("{}: cannot decode: {e}", self.source)))
    }

    /// The number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of one token string (e.g. `<|im_end|>`), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The underlying `tokenizers` object.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// A streaming decoder: feed it generated ids, get text once it is complete UTF-8.
    pub fn stream(&self) -> TextStream<'_> {
        TextStream {
            tokenizer: self,
            ids: Vec::new(),
            emitted: 0,
        }
    }

    /// The prompt the model's chat template makes of `messages` (with the assistant's opening
    /// when `add_generation_prompt`). An error when the model has no template.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        match &self.chat {
            Some(t) => t.render(messages, add_generation_prompt),
            None => Err(Error::Unsupported(format!(
                "{} has no chat template: give a plain text prompt instead",
                self.source
            ))),
        }
    }

    /// The token ids of a conversation: the chat template rendered with the assistant's opening
    /// (after the BOS token when the model declares one and the template does not).
    pub fn chat_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.encode(&self.render_chat(messages, true)?)
    }

    /// Whether the model ships a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.chat.is_some()
    }

    /// The chat template, when the model ships one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat.as_ref()
    }
}

/// Streaming decode: byte-level BPE splits characters across tokens, so text is released only
/// once the decoded whole no longer ends in an incomplete character (U+FFFD).
pub struct TextStream<'a> {
    tokenizer: &'a DecoderTokenizer,
    ids: Vec<u32>,
    /// Bytes of the decoded text already returned.
    emitted: usize,
}

impl TextStream<'_> {
    /// Adds one id; returns the text it completes (empty while a character is incomplete).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') || !text.is_char_boundary(self.emitted.min(text.len())) {
            return Ok(String::new());
        }
        let piece = text.get(self.emitted..).unwrap_or_default().to_string();
        self.emitted = text.len().max(self.emitted);
        Ok(piece)
    }

    /// Whatever is still held back (an incomplete character at the end of generation).
    pub fn finish(self) -> Result<String> {
        let text = self.tokenizer.decode(&self.ids)?;
        Ok(text.get(self.emitted..).unwrap_or_default().to_string())
    }
}
