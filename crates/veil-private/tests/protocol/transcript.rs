//! Transcript check of a whole private inference: every byte the server receives is scanned for
//! the client's token ids, its embedding and every intermediate activation in the clear, and
//! every byte the client receives for the server's weights, in each encoding the code uses:
//! ring elements at ⌈ℓ/8⌉ bytes (veil_core::wire), 8-byte words (signed and unsigned), f32 and
//! f64 of the real values, and residues bit-packed at the width of every HE modulus
//! (veil_he::wire). A value counts as found when a run of three consecutive entries of a row
//! appears; single low-entropy values (small weights, tiny ids) would match random bytes.
//! A scanner that cannot fail would prove nothing, so the planted-leak tests check that it
//! finds each encoding.

use std::collections::HashMap;

use veil_core::{FixedPoint, Ring, RingTensor};
use veil_he::{ParamSet, Params};
use veil_linear::lookup::LookupMethod;
use veil_model::random::random_transformer_with_std;
use veil_model::EmbeddingMode;
use veil_model::{Activation, Architecture, BlockVariant, ModelConfig};
use veil_model::{FixedModel, Transformer};
use veil_net::{run_two_party, Recording};
use veil_private::ServerEmbedding;
use veil_private::Tokens;
use veil_private::{serve_session_with, ClientConnection, ServerModel};

/// Consecutive entries that make a match.
const RUN: usize = 3;

/// A byte-aligned encoding: the bytes of one value.
type Encode = Box<dyn Fn(&Value) -> Option<Vec<u8>>>;

/// A secret value in both its ring form and its real form.
#[derive(Clone, Copy)]
struct Value {
    ring: u64,
    real: f64,
}

/// Runs of [`RUN`] values to look for, each with a label saying what it is.
struct Targets {
    runs: Vec<([Value; RUN], String)>,
}

impl Targets {
    fn new() -> Self {
        Targets { runs: Vec::new() }
    }

    /// Adds every run of `RUN` consecutive entries along each row of `values` whose first
    /// entry carries enough entropy to make a chance match negligible.
    fn add_rows(&mut self, label: &str, values: &[Value], row_len: usize) {
        for (r, row) in values.chunks(row_len).enumerate() {
            for (c, w) in row.windows(RUN).enumerate() {
                if w[0].real.abs() >= 1.0 / 64.0 {
                    self.runs
                        .push(([w[0], w[1], w[2]], format!("{label} row {r} col {c}")));
                }
            }
        }
    }

    fn add_tensor(&mut self, label: &str, t: &RingTensor, fp: FixedPoint) {
        let ring = t.ring();
        let vals: Vec<Value> = t
            .data()
            .iter()
            .map(|&v| Value {
                ring: v,
                real: ring.to_signed(v) as f64 / fp.scale(),
            })
            .collect();
        self.add_rows(label, &vals, *t.shape().last().unwrap_or(&1));
    }
}

fn byte_encodings(ring: Ring) -> Vec<(&'static str, Encode)> {
    let width = ring.byte_len();
    vec![
        (
            "ring bytes",
            Box::new(move |v: &Value| Some(v.ring.to_le_bytes()[..width].to_vec())),
        ),
        (
            "u64",
            Box::new(|v: &Value| Some(v.ring.to_le_bytes().to_vec())),
        ),
        (
            "i64",
            Box::new(move |v: &Value| Some(ring.to_signed(v.ring).to_le_bytes().to_vec())),
        ),
        (
            "f32",
            Box::new(|v: &Value| Some((v.real as f32).to_le_bytes().to_vec())),
        ),
        (
            "f64",
            Box::new(|v: &Value| Some(v.real.to_le_bytes().to_vec())),
        ),
    ]
}

/// A 2^24-bit set of the low 24 bits of the keys: rejects almost every stream position with one
/// memory access before the hash map is consulted (the scan covers every byte and bit offset of
/// megabytes of transcript).
struct Prefilter(Vec<u64>);

impl Prefilter {
    fn new(keys: impl Iterator<Item = u64>) -> Self {
        let mut bits = vec![0u64; 1 << 18];
        for k in keys {
            let k = (k & 0xff_ffff) as usize;
            bits[k >> 6] |= 1 << (k & 63);
        }
        Prefilter(bits)
    }

    fn may_contain(&self, key: u64) -> bool {
        let k = (key & 0xff_ffff) as usize;
        self.0[k >> 6] >> (k & 63) & 1 == 1
    }
}

/// The low three bytes of a byte string as a prefilter key.
fn key3(b: &[u8]) -> u64 {
    b[0] as u64 | (b[1] as u64) << 8 | (b[2] as u64) << 16
}

/// First match of any target run in `stream`, byte-aligned encodings.
fn find_bytes(stream: &[u8], targets: &Targets, ring: Ring) -> Option<String> {
    for (name, enc) in byte_encodings(ring) {
        let mut first: HashMap<Vec<u8>, Vec<usize>> = HashMap::new();
        let mut encoded = Vec::with_capacity(targets.runs.len());
        for (i, (run, _)) in targets.runs.iter().enumerate() {
            let parts: Option<Vec<Vec<u8>>> = run.iter().map(&enc).collect();
            let parts = parts.expect("encodable");
            first.entry(parts[0].clone()).or_default().push(i);
            encoded.push(parts.concat());
        }
        let w = encoded.first().map_or(0, |e| e.len() / RUN);
        if w == 0 {
            continue;
        }
        let filter = Prefilter::new(first.keys().map(|k| key3(k)));
        for at in 0..stream.len().saturating_sub(RUN * w - 1) {
            if !filter.may_contain(key3(&stream[at..])) {
                continue;
            }
            if let Some(cands) = first.get(&stream[at..at + w]) {
                for &i in cands {
                    if stream[at..].starts_with(&encoded[i]) {
                        return Some(format!("{} as {name} at byte {at}", targets.runs[i].1));
                    }
                }
            }
        }
    }
    None
}

/// The 128 bits of `stream` from byte `byte` on (LSB first), zero past its end.
fn word_at(stream: &[u8], byte: usize) -> u128 {
    let mut word = [0u8; 16];
    let n = (stream.len() - byte).min(16);
    word[..n].copy_from_slice(&stream[byte..byte + n]);
    u128::from_le_bytes(word)
}

/// Reads `width` bits at bit position `pos` (LSB first).
fn bits_at(stream: &[u8], pos: usize, width: u32) -> u64 {
    (word_at(stream, pos / 8) >> (pos % 8)) as u64 & ((1u64 << width) - 1)
}

/// First match of any target run as consecutive residues mod any of `moduli`, bit-packed at
/// that modulus's width, at any bit position. Moduli of one width share a pass over the stream
/// (one 16-byte load per byte, eight shifts), which is what keeps the scan of megabytes of
/// transcript at every bit offset affordable in a debug build.
fn find_residues(stream: &[u8], targets: &Targets, ring: Ring, moduli: &[u64]) -> Option<String> {
    let residue = |v: &Value, q: u64| ring.to_signed(v.ring).rem_euclid(q as i64) as u64;
    let mut widths: Vec<u32> = moduli.iter().map(|q| 64 - q.leading_zeros()).collect();
    widths.sort_unstable();
    widths.dedup();
    for width in widths {
        // First residue → (run, modulus) for every modulus of this width.
        let mut first: HashMap<u64, Vec<(usize, u64)>> = HashMap::new();
        for &q in moduli.iter().filter(|q| 64 - q.leading_zeros() == width) {
            for (i, (run, _)) in targets.runs.iter().enumerate() {
                first.entry(residue(&run[0], q)).or_default().push((i, q));
            }
        }
        let filter = Prefilter::new(first.keys().copied());
        let mask = (1u64 << width) - 1;
        let span = RUN * width as usize;
        let positions = (stream.len() * 8).saturating_sub(span - 1);
        for byte in 0..positions.div_ceil(8) {
            let word = word_at(stream, byte);
            for shift in 0..8.min(positions - byte * 8) {
                let v = (word >> shift) as u64 & mask;
                if !filter.may_contain(v) {
                    continue;
                }
                let pos = byte * 8 + shift;
                for &(i, q) in first.get(&v).into_iter().flatten() {
                    let run = &targets.runs[i].0;
                    if (1..RUN).all(|k| {
                        bits_at(stream, pos + k * width as usize, width) == residue(&run[k], q)
                    }) {
                        return Some(format!(
                            "{} as residues mod a {width}-bit modulus at bit {pos}",
                            targets.runs[i].1
                        ));
                    }
                }
            }
        }
    }
    None
}

/// Every modulus the HE layer packs residues at.
fn he_moduli(ring: Ring) -> Vec<u64> {
    let mut qs = Vec::new();
    for set in [ParamSet::N8192, ParamSet::N8192Q4] {
        let p = Params::new(set, ring).expect("parameter set");
        qs.extend_from_slice(p.moduli());
        qs.push(p.final_modulus());
    }
    qs.sort();
    qs.dedup();
    qs
}

fn find(stream: &[u8], targets: &Targets, ring: Ring) -> Option<String> {
    find_bytes(stream, targets, ring)
        .or_else(|| find_residues(stream, targets, ring, &he_moduli(ring)))
}

fn config(embedding: EmbeddingMode) -> ModelConfig {
    let mut cfg = ModelConfig::builder(Architecture::Bert)
        .vocab(60)
        .layers(1)
        .build()
        .unwrap();
    cfg.veil.blocks = vec![BlockVariant::exact(Activation::Gelu)];
    cfg.veil.embedding = embedding;
    cfg
}

fn weight_targets(fixed: &FixedModel, float: &Transformer) -> Targets {
    let mut t = Targets::new();
    let fp = fixed.fp();
    for (i, b) in fixed.blocks.iter().enumerate() {
        for (name, l) in [
            ("query", &b.query),
            ("key", &b.key),
            ("value", &b.value),
            ("attention output", &b.attn_out),
            ("intermediate", &b.intermediate),
            ("output", &b.output),
        ] {
            t.add_tensor(&format!("block {i} {name} weight"), &l.weight, fp);
            t.add_tensor(
                &format!("block {i} {name} weight (columns)"),
                &l.weight.transpose().unwrap(),
                fp,
            );
            t.add_tensor(&format!("block {i} {name} bias"), &l.bias, fp);
        }
        for (name, n) in [("ln1", &b.ln1), ("ln2", &b.ln2)] {
            for (what, v) in [("gamma", &n.gamma), ("beta", &n.beta)] {
                let tensor = RingTensor::from_vec(fp.ring, &[v.len()], v.clone()).unwrap();
                t.add_tensor(&format!("block {i} {name} {what}"), &tensor, fp);
            }
        }
    }
    // The float weights the model was loaded from, in their own f32 values.
    for (name, tensor) in &float.named {
        if name.starts_with("embeddings.") && fixed.config.veil.embedding == EmbeddingMode::Public {
            continue; // public in this mode
        }
        let v: Vec<f32> = tensor.flatten_all().unwrap().to_vec1().unwrap();
        let row = *tensor.dims().last().unwrap_or(&1);
        let vals: Vec<Value> = v
            .iter()
            .map(|&x| Value {
                ring: fp.encode(x as f64),
                real: x as f64,
            })
            .collect();
        t.add_rows(&format!("float {name}"), &vals, row);
    }
    t
}

#[test]
fn transcripts_carry_no_inputs_activations_or_weights_in_the_clear() {
    check_transcripts(EmbeddingMode::Public, LookupMethod::Batched);
}

#[test]
fn private_embedding_transcripts_carry_no_ids_or_tables_in_the_clear() {
    for method in [LookupMethod::Batched, LookupMethod::OneHot] {
        check_transcripts(EmbeddingMode::Private, method);
    }
}

/// One whole inference in `mode`; in private-embedding mode the client sends its token ids to
/// the HE lookup (`method`) and the tables join the server's secrets.
fn check_transcripts(mode: EmbeddingMode, method: LookupMethod) {
    let cfg = config(mode);
    let fp = FixedPoint::default_format();
    let t = random_transformer_with_std(&cfg, [9; 16], 0.2).unwrap();
    let fixed = FixedModel::encode(&t, fp).unwrap();
    let server = ServerModel::new(fixed.clone()).unwrap();
    let emb = match mode {
        EmbeddingMode::Private => Some(ServerEmbedding::new(&fixed, method).unwrap()),
        EmbeddingMode::Public => None,
    };
    let ids = [11u32, 37, 5, 52, 23, 41];
    let types = vec![0u32; ids.len()];
    let sim = fixed.forward(&ids, &types).unwrap();
    let (x, _) = fixed.embed(&ids, &types).unwrap();

    let ((to_server, to_client), ()) = run_two_party(
        |ch| {
            let mut rec = Recording::new(ch);
            let mut conn = ClientConnection::connect(&mut rec, 16)?;
            match mode {
                EmbeddingMode::Public => conn.infer(&x, None)?,
                EmbeddingMode::Private => conn.infer(Tokens::Ids(&ids, &types), None)?,
            };
            conn.close()?;
            Ok((rec.sent, rec.received))
        },
        |ch| serve_session_with(ch, &server, emb.as_ref()),
    )
    .unwrap();
    assert!(to_server.len() > 100_000 && to_client.len() > 100_000);
    eprintln!(
        "transcript: {} bytes to the server, {} to the client",
        to_server.len(),
        to_client.len()
    );

    // What the server must not see.
    let mut client_secrets = Targets::new();
    client_secrets.add_tensor("embedding", &x, fp);
    for (i, h) in sim.hidden_states.iter().enumerate() {
        client_secrets.add_tensor(&format!("hidden state {i}"), h, fp);
        client_secrets.add_tensor(
            &format!("hidden state {i} (columns)"),
            &h.transpose().unwrap(),
            fp,
        );
    }
    client_secrets.add_tensor("pooled", &sim.pooled, fp);
    assert!(client_secrets.runs.len() > 100);
    let ring = fp.ring;
    assert_eq!(find(&to_server, &client_secrets, ring), None);
    for width in [2usize, 4, 8] {
        let id_bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| (id as u64).to_le_bytes()[..width].to_vec())
            .collect();
        for w in id_bytes.windows(RUN * width).step_by(width) {
            assert!(
                !to_server.windows(w.len()).any(|s| s == w),
                "{mode:?}: token ids found as {width}-byte integers"
            );
        }
    }

    // What the client must not see.
    let weights = weight_targets(&fixed, &t);
    assert!(weights.runs.len() > 1000);
    assert_eq!(find(&to_client, &weights, ring), None);
}

#[test]
fn the_scanner_finds_planted_leaks_in_every_encoding() {
    let fp = FixedPoint::default_format();
    let ring = fp.ring;
    let t = random_transformer_with_std(&config(EmbeddingMode::Public), [9; 16], 0.2).unwrap();
    let fixed = FixedModel::encode(&t, fp).unwrap();
    let targets = weight_targets(&fixed, &t);
    let w = &fixed.blocks[0].intermediate.weight;
    let row: Vec<u64> = w.data()[..8].to_vec();
    let noise = |n: usize| -> Vec<u8> { (0..n).map(|i| (i * 131 + 7) as u8).collect() };

    // Byte-aligned encodings, at an odd offset.
    let mut wire = veil_core::wire::Writer::new();
    wire.ring_elems(ring, &row);
    for payload in [
        wire.finish(),
        row.iter().flat_map(|v| v.to_le_bytes()).collect(),
        row.iter()
            .flat_map(|&v| ((ring.to_signed(v) as f64 / fp.scale()) as f32).to_le_bytes())
            .collect::<Vec<u8>>(),
    ] {
        let stream = [noise(1001), payload, noise(999)].concat();
        assert!(find_bytes(&stream, &targets, ring).is_some());
    }
    assert_eq!(find_bytes(&noise(5000), &targets, ring), None);

    // Residues bit-packed at a modulus's width, at a bit offset that is not byte-aligned: the
    // narrowest and the widest modulus, each found by the scan over all of them, and the noise
    // around them alone never matches.
    let moduli = he_moduli(ring);
    for q in [moduli[0], moduli[moduli.len() - 1]] {
        let width = 64 - q.leading_zeros();
        let mut bits: Vec<bool> = (0..13).map(|i| i % 3 == 0).collect();
        for &v in &row {
            let r = ring.to_signed(v).rem_euclid(q as i64) as u64;
            bits.extend((0..width).map(|b| r >> b & 1 == 1));
        }
        bits.extend((0..40).map(|i| i % 5 == 0));
        let stream: Vec<u8> = bits
            .chunks(8)
            .map(|c| {
                c.iter()
                    .enumerate()
                    .fold(0u8, |a, (i, &b)| a | (b as u8) << i)
            })
            .collect();
        assert!(
            find_residues(&stream, &targets, ring, &moduli).is_some(),
            "a leak packed at {width} bits"
        );
    }
    assert_eq!(find_residues(&noise(5000), &targets, ring, &moduli), None);
}
