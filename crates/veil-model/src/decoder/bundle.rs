//! A decoder's client bundle: what the client of a private generation needs and nothing of the
//! server's — the configuration (`config.json` in Hugging Face form, Veil's block variants
//! included, whether the model came from a GGUF file or a folder), the tokenizer
//! (`tokenizer.json`, and `tokenizer_config.json` with the chat template when the model has
//! one) and, for an open model, the public tables (`public.safetensors`: the token embedding,
//! GPT-2's position table, an untied output table). A bundle for a server that keeps its tables
//! private (`veil serve --private-tables`) holds no tensor at all. No block, norm or other weight
//! is ever written, and a folder holding model weights is not read as a bundle. Every file is
//! listed with its SHA-256 in the manifest ([`crate::manifest`]) and re-hashed at load; the
//! server's own check (its tables' digest, or their shape's) still decides whether a bundle fits
//! the model it serves.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use veil_core::{bail, ensure, Error, Result};

use super::chat::ChatMessage;
use super::config::{DecoderConfig, DecoderFamily};
use super::tokenizer::DecoderTokenizer;
use super::weights::Matrix;
use super::{hf, hf_config, DecoderModel};
use crate::decode_sim::{DecoderFormat, DecoderTables};
use crate::folder::has_weights;
use crate::manifest::{self, CONFIG_FILE, MANIFEST_FILE, TABLES_FILE, TOKENIZER_FILE};

/// The chat template's file, as Hugging Face names it.
const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
const TOKEN_TABLE: &str = "token_embedding";
const POSITION_TABLE: &str = "position_embedding";
const OUTPUT_TABLE: &str = "output";

/// The tables an open decoder's client embeds tokens and reads logits with.
#[derive(Clone, Debug, PartialEq)]
pub struct PublicTables {
    /// `[vocab, hidden]`.
    pub token: Matrix,
    /// GPT-2: `[max_positions, hidden]`.
    pub position: Option<Matrix>,
    /// `[vocab, hidden]` when the output table is not tied to `token`.
    pub output: Option<Matrix>,
}

/// The public part of a decoder: all a generation's client holds.
#[derive(Clone, Debug)]
pub struct DecoderBundle {
    /// The shape and operators, as the server's must match.
    pub config: DecoderConfig,
    /// Prompts in, text out, with the chat template.
    pub tokenizer: DecoderTokenizer,
    /// The open model's tables; `None` for a server that keeps them private.
    pub tables: Option<PublicTables>,
}

impl DecoderBundle {
    /// The public part of `model`, its tables kept when `with_tables` (the blocks' weights are
    /// dropped).
    pub fn of_model(model: DecoderModel, with_tables: bool) -> Self {
        let w = model.weights;
        DecoderBundle {
            config: w.config,
            tokenizer: model.tokenizer,
            tables: with_tables.then_some(PublicTables {
                token: w.token_embedding,
                position: w.position_embedding,
                output: w.lm_head,
            }),
        }
    }

    /// What a client of `spec` uses: a bundle folder written by [`DecoderBundle::save`], or the
    /// public part of any decoder [`super::load`] reads. `with_tables`: the server shares its
    /// tables (a bundle without them is refused then, naming `--private-tables`); without, a
    /// bundle's tables are not used.
    pub fn open(spec: &str, with_tables: bool) -> Result<Self> {
        let dir = Path::new(spec);
        if !Self::is_bundle(dir) {
            return Ok(Self::of_model(super::load(spec)?, with_tables));
        }
        let mut bundle = Self::load(dir)?;
        if !with_tables {
            bundle.tables = None;
        } else if bundle.tables.is_none() {
            bail!(
                InvalidArgument,
                "{spec} holds no tables (exported with --private-tables): it serves a client of \
                 a server that keeps them private, so connect with --private-tables"
            );
        }
        Ok(bundle)
    }

    /// Whether `dir` is a client bundle: a manifest and no model weights.
    pub fn is_bundle(dir: &Path) -> bool {
        dir.join(MANIFEST_FILE).is_file() && !has_weights(dir)
    }

    /// Writes the bundle into `dir` (created if missing) with its manifest.
    pub fn save(&self, dir: &Path) -> Result<()> {
        manifest::write_bundle(dir, &self.files()?)
    }

    /// Reads a bundle written by [`DecoderBundle::save`], every file checked against the
    /// manifest first.
    pub fn load(dir: &Path) -> Result<Self> {
        manifest::refuse_model_folder(dir)?;
        let (_, listed) = manifest::verify_listed(
            dir,
            &[CONFIG_FILE, TOKENIZER_FILE],
            &[TOKENIZER_CONFIG_FILE, TABLES_FILE],
        )?;
        // Only what the manifest lists is read: an unlisted file beside it is not the bundle's.
        ensure!(
            listed.contains(&TOKENIZER_CONFIG_FILE) || !dir.join(TOKENIZER_CONFIG_FILE).is_file(),
            Malformed,
            "{}: {TOKENIZER_CONFIG_FILE} is not in the manifest; export the bundle again",
            dir.display()
        );
        let config = hf::load_config(dir)?;
        let tokenizer = hf::load_tokenizer(dir)?;
        let tables = match listed.contains(&TABLES_FILE) {
            true => Some(read_tables(&dir.join(TABLES_FILE), &config)?),
            false => None,
        };
        Ok(DecoderBundle {
            config,
            tokenizer,
            tables,
        })
    }

    /// The open model's tables at `format`, as the client computes with them.
    pub fn decoder_tables(&self, format: DecoderFormat) -> Result<DecoderTables> {
        let t = self.tables.as_ref().ok_or_else(|| {
            Error::InvalidArgument(
                "this client holds no tables: the server keeps them private (--private-tables)"
                    .into(),
            )
        })?;
        DecoderTables::encode(
            &self.config,
            format,
            &t.token,
            t.position.as_ref(),
            t.output.as_ref(),
        )
    }

    /// The token ids of a conversation in the model's chat template ([`DecoderModel::chat_prompt`]).
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.tokenizer.chat_ids(messages)
    }

    /// The bundle's files and their bytes, in manifest order.
    fn files(&self) -> Result<Vec<(&'static str, Vec<u8>)>> {
        let tokenizer = self
            .tokenizer
            .inner()
            .to_string(false)
            .map_err(|e| Error::Other(format!("serialising the tokenizer: {e}")))?;
        let mut files = vec![
            (CONFIG_FILE, hf_config::to_json(&self.config)?.into_bytes()),
            (TOKENIZER_FILE, tokenizer.into_bytes()),
        ];
        if let Some(t) = self.tokenizer.chat_template() {
            let v = serde_json::json!({
                "chat_template": t.template(),
                "bos_token": t.bos_token(),
                "eos_token": t.eos_token(),
            });
            let text = serde_json::to_string_pretty(&v)
                .map_err(|e| Error::Other(format!("{TOKENIZER_CONFIG_FILE}: {e}")))?;
            files.push((TOKENIZER_CONFIG_FILE, text.into_bytes()));
        }
        if let Some(t) = &self.tables {
            files.push((TABLES_FILE, write_tables(t)?));
        }
        Ok(files)
    }
}

fn write_tables(t: &PublicTables) -> Result<Vec<u8>> {
    let mut tensors = HashMap::new();
    for (name, m) in [
        (TOKEN_TABLE, Some(&t.token)),
        (POSITION_TABLE, t.position.as_ref()),
        (OUTPUT_TABLE, t.output.as_ref()),
    ] {
        if let Some(m) = m {
            let tensor = Tensor::from_slice(&m.data, (m.rows, m.cols), &Device::Cpu)
                .map_err(crate::candle_error(name))?;
            tensors.insert(name.to_string(), tensor);
        }
    }
    safetensors::serialize(&tensors, None)
        .map_err(|e| Error::Other(format!("serialising the public tables: {e}")))
}

/// The tables of `path`, each checked against `config`: exactly the ones the model has, of
/// their shapes.
fn read_tables(path: &Path, config: &DecoderConfig) -> Result<PublicTables> {
    let name = path.display().to_string();
    let mut tensors = candle_core::safetensors::load(path, &Device::Cpu)
        .map_err(|e| Error::Malformed(format!("{name}: {e}")))?;
    let (vocab, h) = (config.vocab_size, config.hidden);
    let mut take = |table: &str, rows: usize| -> Result<Option<Matrix>> {
        let Some(t) = tensors.remove(table) else {
            return Ok(None);
        };
        ensure!(
            t.dims() == [rows, h],
            Malformed,
            "{name}: {table} is {:?}, the model's is [{rows}, {h}]",
            t.dims()
        );
        let data = t
            .flatten_all()
            .and_then(|t| t.to_dtype(candle_core::DType::F32))
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(crate::candle_error(&name))?;
        Matrix::new(rows, h, data).map(Some)
    };
    let token = take(TOKEN_TABLE, vocab)?
        .ok_or_else(|| Error::Malformed(format!("{name}: no {TOKEN_TABLE}")))?;
    let position = take(POSITION_TABLE, config.max_positions)?;
    let output = take(OUTPUT_TABLE, vocab)?;
    let gpt2 = config.family == DecoderFamily::Gpt2;
    ensure!(
        position.is_some() == gpt2,
        Malformed,
        "{name}: a {:?} model {} a position table",
        config.family,
        if gpt2 { "needs" } else { "has no" }
    );
    ensure!(
        output.is_some() != config.tie_word_embeddings,
        Malformed,
        "{name}: the output table is {}tied to the token embedding in config.json",
        if config.tie_word_embeddings {
            ""
        } else {
            "not "
        }
    );
    if let Some(extra) = tensors.keys().next() {
        bail!(
            Malformed,
            "{name}: carries {extra:?}, which is not a public table"
        );
    }
    Ok(PublicTables {
        token,
        position,
        output,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decoder::random::{write_tiny_gpt2, write_tiny_llama, TinyShape};
    use crate::decoder::{self, DecoderBlockVariant, RopeScaling};

    fn tiny(gpt2: bool) -> (tempfile::TempDir, DecoderModel) {
        let dir = tempfile::tempdir().unwrap();
        let shape = TinyShape {
            kv_heads: if gpt2 { 4 } else { 2 },
            ..TinyShape::default()
        };
        if gpt2 {
            write_tiny_gpt2(dir.path(), 3, &shape).unwrap();
        } else {
            write_tiny_llama(dir.path(), 3, &shape).unwrap();
        }
        let m = decoder::load(dir.path().to_str().unwrap()).unwrap();
        (dir, m)
    }

    /// A bundle reads back to the model's configuration, tokenizer (ids, text, chat prompt)
    /// and tables, for both families, and its tables give the model's own digest.
    #[test]
    fn bundles_read_back_to_the_models_public_part() {
        // The built-in decoder comes from a GGUF file: its tokenizer is built from the file's
        // metadata, its configuration has no config.json of its own.
        let (_llama, llama) = tiny(false);
        let gguf_dir = tempfile::tempdir().unwrap();
        let gguf = gguf_dir.path().join("tiny.gguf");
        crate::decoder::random::write_tiny_gguf(
            &gguf,
            &llama.weights,
            candle_core::quantized::GgmlDType::F32,
        )
        .unwrap();
        let from_gguf = decoder::load(gguf.to_str().unwrap()).unwrap();
        assert!(from_gguf.tokenizer.has_chat_template());
        for (_src, model) in [tiny(false), tiny(true), (gguf_dir, from_gguf)] {
            let want = DecoderTables::of_weights(&model.weights, DecoderFormat::default())
                .unwrap()
                .digest();
            let text = "the cat sat on the mat";
            let ids = model.tokenizer.encode_prompt(text).unwrap();
            let chat = model.tokenizer.has_chat_template().then(|| {
                model
                    .chat_prompt(&[ChatMessage::new("user", text)])
                    .unwrap()
            });
            let out = tempfile::tempdir().unwrap();
            let bundle = DecoderBundle::of_model(model.clone(), true);
            bundle.save(out.path()).unwrap();
            assert!(DecoderBundle::is_bundle(out.path()));
            let back = DecoderBundle::open(out.path().to_str().unwrap(), true).unwrap();
            assert_eq!(back.config, model.weights.config);
            assert_eq!(back.tables, bundle.tables);
            let tables = back.decoder_tables(DecoderFormat::default()).unwrap();
            assert_eq!(tables.digest(), want);
            assert_eq!(back.tokenizer.encode_prompt(text).unwrap(), ids);
            assert_eq!(
                back.tokenizer.decode(&ids).unwrap(),
                model.tokenizer.decode(&ids).unwrap()
            );
            if let Some(chat) = chat {
                assert_eq!(
                    back.chat_prompt(&[ChatMessage::new("user", text)]).unwrap(),
                    chat
                );
            }
            // No weight file: the server's folder is not a bundle, nor read as one.
            assert!(!out.path().join("model.safetensors").exists());
            assert!(!DecoderBundle::is_bundle(_src.path()));
            assert!(!DecoderBundle::is_bundle(&_src.path().join("tiny.gguf")));
        }
    }

    /// A private-tables bundle holds no tensor; asking it for tables is refused by name, and a
    /// tampered, unlisted or misshapen file is refused.
    #[test]
    fn private_bundles_hold_no_tables_and_tampering_is_refused() {
        let (_src, model) = tiny(false);
        let out = tempfile::tempdir().unwrap();
        DecoderBundle::of_model(model.clone(), false)
            .save(out.path())
            .unwrap();
        assert!(!out.path().join(TABLES_FILE).exists());
        let spec = out.path().to_str().unwrap();
        let b = DecoderBundle::open(spec, false).unwrap();
        assert!(b.tables.is_none() && b.decoder_tables(DecoderFormat::default()).is_err());
        let e = DecoderBundle::open(spec, true).unwrap_err().to_string();
        assert!(e.contains("--private-tables"), "{e}");
        // A tables file dropped in beside the manifest is not the bundle's.
        let open = tempfile::tempdir().unwrap();
        DecoderBundle::of_model(model.clone(), true)
            .save(open.path())
            .unwrap();
        std::fs::copy(open.path().join(TABLES_FILE), out.path().join(TABLES_FILE)).unwrap();
        assert!(DecoderBundle::open(spec, true).is_err());
        // One byte of the configuration changed.
        let cfg = open.path().join(CONFIG_FILE);
        let mut text = std::fs::read_to_string(&cfg).unwrap();
        text = text.replacen("\"vocab_size\"", " \"vocab_size\"", 1);
        std::fs::write(&cfg, text).unwrap();
        let e = DecoderBundle::load(open.path()).unwrap_err().to_string();
        assert!(e.contains("changed since the bundle was exported"), "{e}");
        // Tables of another shape, with a manifest that lists them.
        let mut wrong = DecoderBundle::of_model(model, true);
        let t = wrong.tables.as_mut().unwrap();
        t.token = Matrix::new(
            t.token.rows - 1,
            t.token.cols,
            t.token.data[t.token.cols..].to_vec(),
        )
        .unwrap();
        let bad = tempfile::tempdir().unwrap();
        wrong.save(bad.path()).unwrap();
        let e = DecoderBundle::load(bad.path()).unwrap_err().to_string();
        assert!(e.contains("token_embedding"), "{e}");
    }

    /// The written `config.json` reads back to the same configuration whatever its fields:
    /// rotary scaling of both kinds, biases, untied heads, no BOS, block variants.
    #[test]
    fn configurations_round_trip_through_config_json() {
        let (_src, model) = tiny(false);
        let base = model.weights.config;
        let mut variants = vec![DecoderBlockVariant::default(); base.layers];
        variants[0] = DecoderBlockVariant::FRIENDLY;
        let cases = [
            DecoderConfig {
                rope_scaling: Some(RopeScaling::Linear { factor: 2.5 }),
                attention_bias: true,
                bos_token_id: None,
                ..base.clone()
            },
            DecoderConfig {
                rope_scaling: Some(RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192,
                }),
                tie_word_embeddings: !base.tie_word_embeddings,
                mlp_bias: true,
                eos_token_ids: vec![1, 2],
                variants,
                ..base.clone()
            },
            DecoderConfig {
                rope_theta: 1e5,
                norm_eps: 1e-5,
                ..base
            },
        ];
        for c in cases {
            let text = hf_config::to_json(&c).unwrap();
            assert_eq!(hf_config::parse(&text, "test").unwrap(), c, "{text}");
        }
        let (_g, gpt2) = tiny(true);
        let c = gpt2.weights.config;
        assert_eq!(
            hf_config::parse(&hf_config::to_json(&c).unwrap(), "test").unwrap(),
            c
        );
    }
}
