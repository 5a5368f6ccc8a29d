//! Unlabelled text for distillation: sentences from dataset files (SST-2's `LABEL SENTENCE`
//! lines, GLUE TSV such as MRPC's pairs; labels are ignored), made into token sequences.
//!
//! The mix: the sentences are shuffled (seeded) and dealt alternately into two kinds of
//! sequence, so about half of them are each:
//! * **chat** — one sentence as the user turn of the model's chat template, with the assistant's
//!   opening (what the model sees when it is asked something), truncated to the length;
//! * **plain** — the other sentences joined by spaces into one token stream, cut into pieces of
//!   exactly the length (running text, as in pre-training).
//!
//! Models without a chat template get plain sequences only. The sequences are shuffled again
//! (seeded) so batches mix the two kinds.

use std::path::Path;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use veil_core::{ensure, Result};
use veil_model::data::{read_file, DatasetFormat};
use veil_model::decoder::{ChatMessage, DecoderTokenizer};

/// Every sentence of a dataset file (both sentences of a pair), in file order, labels ignored.
pub fn read_sentences(path: &Path) -> Result<Vec<String>> {
    let format = DatasetFormat::from_path(path)?;
    let examples = read_file(path, &format)?;
    let mut out = Vec::with_capacity(examples.len() * 2);
    for e in examples {
        out.push(e.text_a);
        if let Some(b) = e.text_b {
            out.push(b);
        }
    }
    out.retain(|s| !s.trim().is_empty());
    ensure!(
        !out.is_empty(),
        InvalidArgument,
        "{} has no sentences",
        path.display()
    );
    Ok(out)
}

/// The sentences of several files, in order.
pub fn read_all(paths: &[impl AsRef<Path>]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for p in paths {
        out.extend(read_sentences(p.as_ref())?);
    }
    Ok(out)
}

/// Token sequences of at most `len` tokens (at least 2), the chat/plain mix of the module docs.
/// `limit` caps the number of sequences (after the shuffle; 0 = all).
pub fn sequences(
    tokenizer: &DecoderTokenizer,
    sentences: &[String],
    len: usize,
    seed: u64,
    limit: usize,
) -> Result<Vec<Vec<u32>>> {
    ensure!(
        len >= 2,
        InvalidArgument,
        "sequences need at least 2 tokens"
    );
    let mut order: Vec<&String> = sentences.iter().collect();
    let mut rng = StdRng::seed_from_u64(seed);
    order.shuffle(&mut rng);
    // Tokenising everything would take long for nothing when a limit is set: every sequence
    // needs at most one chat sentence and about `len` plain tokens (a sentence is ≥ 1 token).
    if limit > 0 {
        order.truncate(limit.saturating_mul(len + 1).min(order.len()));
    }
    let chat = tokenizer.has_chat_template();
    let mut out = Vec::new();
    let mut stream: Vec<u32> = Vec::new();
    for (k, s) in order.iter().enumerate() {
        if chat && k % 2 == 0 {
            let text = tokenizer.render_chat(&[ChatMessage::new("user", s.trim())], true)?;
            let mut ids = tokenizer.encode(&text)?;
            ids.truncate(len);
            if ids.len() >= 2 {
                out.push(ids);
            }
        } else {
            if !stream.is_empty() {
                stream.extend(tokenizer.encode(" ")?);
            }
            stream.extend(tokenizer.encode(s.trim())?);
            while stream.len() >= len {
                out.push(stream.drain(..len).collect());
            }
        }
        if limit > 0 && out.len() >= limit {
            break;
        }
    }
    if stream.len() >= 2 && (limit == 0 || out.len() < limit) {
        out.push(stream);
    }
    out.shuffle(&mut rng);
    if limit > 0 {
        out.truncate(limit);
    }
    ensure!(
        !out.is_empty(),
        InvalidArgument,
        "no sequence of at least 2 tokens could be made from the text"
    );
    Ok(out)
}

/// A batch of sequences right-padded to the longest: `ids` rows of one length, and `mask`
/// (1 for a real position, 0 for padding). Causal attention never lets a real position see
/// the padding after it, so padding only needs to be kept out of the losses.
#[derive(Clone, Debug)]
pub struct PaddedBatch {
    /// Token rows, each of the batch's length.
    pub ids: Vec<Vec<u32>>,
    /// Real length of each row.
    pub lengths: Vec<usize>,
}

impl PaddedBatch {
    /// Pads `rows` with `pad`.
    pub fn new(rows: &[&Vec<u32>], pad: u32) -> Self {
        let t = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        PaddedBatch {
            ids: rows
                .iter()
                .map(|r| {
                    let mut v = (*r).clone();
                    v.resize(t, pad);
                    v
                })
                .collect(),
            lengths: rows.iter().map(|r| r.len()).collect(),
        }
    }

    /// Positions `[B, T]` as 1.0 (real) or 0.0 (padding).
    pub fn mask(&self) -> Vec<f32> {
        let t = self.ids.first().map_or(0, Vec::len);
        self.lengths
            .iter()
            .flat_map(|&l| (0..t).map(move |p| (p < l) as u8 as f32))
            .collect()
    }

    /// Tokens that are not padding.
    pub fn real_positions(&self) -> usize {
        self.lengths.iter().sum()
    }
}

/// Batch `index` of `batch_size` sequences, taken cyclically: update u always sees the same
/// batch, so a resumed run continues exactly.
pub fn batch_at(sequences: &[Vec<u32>], batch_size: usize, index: u64, pad: u32) -> PaddedBatch {
    let n = sequences.len() as u64;
    let rows: Vec<&Vec<u32>> = (0..batch_size as u64)
        .map(|j| &sequences[((index * batch_size as u64 + j) % n) as usize])
        .collect();
    PaddedBatch::new(&rows, pad)
}
