//! Π_MatMul (the paper's Algorithm 1) on a batch of products: the client holds A (n×k) and
//! encrypts it; the server holds B (k×m) in the clear, optionally its own additive share of A,
//! and a value to add to the product. Afterwards the client holds A·B + add − R and the server
//! holds R, a fresh uniform matrix: an additive sharing of A·B + add mod 2^ℓ.
//!
//! Flow (one round trip for the whole batch): client → server: the seeded ciphertexts of every
//! A block; server → client: one hardened response per group of `pack` output blocks (merged
//! with the client's Galois keys, [`veil_he::pack`]; then [`veil_he::response`]: pk
//! re-randomisation, noise flooding, modulus switching, only the needed c0 coefficients).
//!
//! **Security (semi-honest).** The server sees only BFV ciphertexts under the client's key
//! (IND-CPA under RLWE, 128-bit parameters). The client sees responses that are simulatable from
//! its output alone: c1 is Σ wᵢaᵢ + pk1·u + e2, pseudo-random by RLWE in u; the decrypted noise is
//! flooded with 2^b ≥ 2^69 × a public bound on the weight-dependent noise (checked per prepared
//! matrix and again per response, otherwise [`veil_core::Error::Insecure`]), which keeps the
//! whole session transcript (≤ 2^28 revealed coefficients per key) within 2^-40 of simulated
//! ([`veil_he`] crate docs); and the decoded values are masked by R.
//! **Error:** none: results are exact mod 2^ℓ (the noise budget is checked for the worst case).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use veil_core::{ensure, Error, Prg, Result, RingTensor};
use veil_he::{
    wire, Accumulator, EvalCiphertext, GaloisKeys, NttPlaintext, Params, PublicKey, SecretKey,
};
use veil_net::Channel;

use crate::layout::{Blocking, Layout};

/// B (k×m) packed for one layout, with the noise check done. Weight polynomials are kept by
/// their low-degree coefficients (k_w·m_w per block); their NTT form, N/(k_w·m_w) times larger
/// (≈1.8 GB for a 768×768 matrix at seq 128), is cached only when it fits
/// [`NTT_CACHE_BYTES`], and otherwise computed at use time.
pub struct PreparedMatrix {
    params: Params,
    layout: Layout,
    /// Public bound on every |entry| (the flooding check's input, never the entries themselves).
    max_abs: u64,
    /// Block (bk, bm) at index bm·k_blocks + bk.
    blocks: Vec<Vec<i64>>,
    /// The same blocks in the NTT domain, when cached.
    ntt: Option<Vec<NttPlaintext>>,
}

/// Default largest NTT-domain weight cache per prepared matrix (each BERT-Tiny layer fits,
/// ≈ 0.6 GB for one Tiny encoder layer; BERT-Base matrices do not).
pub const NTT_CACHE_BYTES: usize = 256 << 20;

impl PreparedMatrix {
    /// Packs `b` for products with an n-row encrypted left operand. `max_abs` is a public
    /// bound on every |entry| (centred): entries above it are refused, and the flooding check
    /// (per output block, over the k·m_w weight slots it sums) uses only the bound and the
    /// shapes, so whether a product is accepted never depends on secret values.
    pub fn new(params: &Params, n: usize, b: &RingTensor, max_abs: u64) -> Result<Self> {
        ensure!(
            b.shape().len() == 2 && b.ring() == params.ring(),
            InvalidArgument,
            "plaintext matrix must be 2-D over the parameters' ring"
        );
        let layout = Layout::new(params, n, b.shape()[0], b.shape()[1])?;
        let Blocking { k_w, m_w, .. } = layout.blocks;
        let packing_noise = match layout.pack_shape() {
            Some(shape) => shape.noise_bound(params)?,
            None => 0.0,
        };
        params.check_public_product(
            (layout.k_blocks() * k_w * m_w) as f64,
            max_abs as f64,
            packing_noise,
        )?;
        let ring = b.ring();
        let over = b.data().iter().fold(0u64, |acc, &v| {
            acc | (ring.to_signed(v).unsigned_abs() > max_abs) as u64
        });
        ensure!(
            over == 0,
            Insecure,
            "plaintext matrix has entries above the public bound {max_abs}"
        );
        let mut blocks = Vec::with_capacity(layout.k_blocks() * layout.col_blocks());
        for bm in 0..layout.col_blocks() {
            for bk in 0..layout.k_blocks() {
                blocks.push(layout.rhs_coeffs(b, bk, bm));
            }
        }
        Ok(PreparedMatrix {
            params: params.clone(),
            layout,
            max_abs,
            blocks,
            ntt: None,
        })
    }

    /// Caches the NTT form of every block if it fits in `max_bytes`: worth it for a matrix
    /// reused across inferences (model weights), not for a one-off share.
    pub fn with_ntt_cache(mut self, max_bytes: usize) -> Result<Self> {
        let p = &self.params;
        if self.blocks.len() * p.limbs() * p.degree() * 8 <= max_bytes {
            let cached = self
                .blocks
                .iter()
                .map(|c| NttPlaintext::new(p, c, self.max_abs))
                .collect::<Result<Vec<_>>>()?;
            self.ntt = Some(cached);
        }
        Ok(self)
    }

    /// Whether the NTT-domain weights are cached.
    pub fn is_ntt_cached(&self) -> bool {
        self.ntt.is_some()
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn params(&self) -> &Params {
        &self.params
    }
}

/// The server's part of one product in a batch.
pub struct ServerJob<'a> {
    pub matrix: &'a PreparedMatrix,
    /// The server's additive share of A (n×k), folded into the client's ciphertexts.
    pub lhs_share: Option<&'a RingTensor>,
    /// Added to the product before sharing (n×m), e.g. a bias at scale 2f.
    pub add: Option<&'a RingTensor>,
}

/// Column blocks processed together by one server task.
const COLUMN_GROUP: usize = 8;

fn workers() -> usize {
    thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8)
}

/// Maps `f` over `0..count` on the available cores; `f` gets its own PRG per worker. Workers
/// take the next index from a shared counter rather than a fixed chunk each, so on a shared
/// machine a descheduled worker does not leave the other idle at the end.
pub fn parallel_map<T: Send>(
    count: usize,
    f: impl Fn(usize, &mut Prg) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let w = workers().min(count).max(1);
    let next = AtomicUsize::new(0);
    let (f, next) = (&f, &next);
    let mut done: Vec<(usize, T)> = thread::scope(|s| {
        let handles: Vec<_> = (0..w)
            .map(|_| {
                s.spawn(move || {
                    let mut prg = Prg::from_os_entropy();
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= count {
                            return Ok(out);
                        }
                        out.push((i, f(i, &mut prg)?));
                    }
                })
            })
            .collect();
        let mut all = Vec::with_capacity(count);
        for h in handles {
            let part: Result<Vec<(usize, T)>> = h
                .join()
                .map_err(|_| Error::Other("matmul worker panicked".into()))?;
            all.extend(part?);
        }
        Ok::<_, Error>(all)
    })?;
    done.sort_unstable_by_key(|&(i, _)| i);
    Ok(done.into_iter().map(|(_, v)| v).collect())
}

fn check_lhs(layout: &Layout, a: &RingTensor, who: &str) -> Result<()> {
    ensure!(
        a.shape() == [layout.n, layout.k],
        InvalidArgument,
        "{who} has shape {:?}, expected [{}, {}]",
        a.shape(),
        layout.n,
        layout.k
    );
    Ok(())
}

/// Client: encrypts every A and sends them in one message.
pub fn client_send<C: Channel + ?Sized>(
    ch: &mut C,
    sk: &SecretKey,
    layouts: &[Layout],
    lhs: &[&RingTensor],
) -> Result<()> {
    ensure!(
        layouts.len() == lhs.len(),
        InvalidArgument,
        "one left operand per layout"
    );
    let mut tasks = Vec::new();
    for (j, (lay, a)) in layouts.iter().zip(lhs).enumerate() {
        check_lhs(lay, a, "left operand")?;
        ensure!(
            a.ring() == sk.params().ring(),
            InvalidArgument,
            "ring mismatch"
        );
        for bi in 0..lay.row_blocks() {
            for bk in 0..lay.k_blocks() {
                tasks.push((j, bi, bk));
            }
        }
    }
    let cts = parallel_map(tasks.len(), |t, prg| {
        let (j, bi, bk) = tasks[t];
        sk.encrypt(&layouts[j].lhs_poly(lhs[j], bi, bk), prg)
    })?;
    ch.send_msg(&wire::encode_ciphertexts(sk.params(), &cts))?;
    ch.flush()
}

/// Client: receives the responses and decodes one n×m share per product.
pub fn client_receive<C: Channel + ?Sized>(
    ch: &mut C,
    sk: &SecretKey,
    layouts: &[Layout],
) -> Result<Vec<RingTensor>> {
    let p = sk.params();
    let mut tasks = Vec::new();
    let mut needed = Vec::new();
    for (j, lay) in layouts.iter().enumerate() {
        for g in 0..lay.packed_count() {
            let outs = lay.packed_outputs(g);
            needed.push(outs.len());
            tasks.push((j, outs));
        }
    }
    let msg = ch.recv_msg(wire::responses_len(p, &needed))?;
    let responses = wire::decode_responses(p, &msg, &needed)?;
    let decoded = parallel_map(tasks.len(), |t, _| {
        let positions: Vec<usize> = tasks[t].1.iter().map(|o| o.0).collect();
        sk.decrypt_response(&responses[t], &positions)
    })?;
    let mut out: Vec<RingTensor> = layouts
        .iter()
        .map(|l| RingTensor::zeros(p.ring(), &[l.n, l.m]))
        .collect::<Result<_>>()?;
    for ((j, outs), vals) in tasks.iter().zip(decoded) {
        let m = layouts[*j].m;
        let data = out[*j].data_mut();
        for (&(_, r, c), v) in outs.iter().zip(vals) {
            data[r * m + c] = v;
        }
    }
    Ok(out)
}

/// Server: receives the ciphertexts of a batch, computes and returns the hardened products,
/// and outputs its shares R (one n×m matrix per job).
///
/// `galois` must be the client's Galois keys for the same parameters when any job's layout
/// packs its responses.
pub fn server_respond<C: Channel + ?Sized>(
    ch: &mut C,
    pk: &PublicKey,
    galois: Option<&GaloisKeys>,
    jobs: &[ServerJob<'_>],
) -> Result<Vec<RingTensor>> {
    let p = pk.params();
    let ring = p.ring();
    let mut expected = 0;
    for job in jobs {
        let lay = job.matrix.layout;
        ensure!(
            job.matrix.params.moduli() == p.moduli() && job.matrix.params.degree() == p.degree(),
            InvalidArgument,
            "prepared matrix and public key use different parameters"
        );
        if let Some(s) = job.lhs_share {
            check_lhs(&lay, s, "server share of the left operand")?;
            ensure!(s.ring() == ring, InvalidArgument, "share ring mismatch");
        }
        if let Some(a) = job.add {
            ensure!(
                a.shape() == [lay.n, lay.m] && a.ring() == ring,
                InvalidArgument,
                "added matrix has shape {:?}, expected [{}, {}]",
                a.shape(),
                lay.n,
                lay.m
            );
        }
        ensure!(
            lay.blocks.pack == 1 || galois.is_some_and(|g| g.params().moduli() == p.moduli()),
            InvalidArgument,
            "a packed layout needs the client's Galois keys for these parameters"
        );
        expected += lay.input_count();
    }
    let msg = ch.recv_msg(wire::ciphertexts_len(p, expected))?;
    let cts = wire::decode_ciphertexts(p, &msg, expected)?;

    // Expand seeds and fold in the server's share of A.
    let mut in_tasks = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        for bi in 0..job.matrix.layout.row_blocks() {
            for bk in 0..job.matrix.layout.k_blocks() {
                in_tasks.push((j, bi, bk));
            }
        }
    }
    let evals = parallel_map(in_tasks.len(), |t, _| {
        let (j, bi, bk) = in_tasks[t];
        let mut ev = EvalCiphertext::expand(p, &cts[t]);
        if let Some(share) = jobs[j].lhs_share {
            ev.add_plain(p, &jobs[j].matrix.layout.lhs_poly(share, bi, bk))?;
        }
        Ok(ev)
    })?;

    // One task per (job, run of packed groups covering about COLUMN_GROUP column blocks):
    // responses are column-block major, so each weight block is transformed once per task and
    // used for every row block; grouping column blocks lets one pass over the input
    // ciphertexts feed several accumulators (the inputs are far larger than the cache).
    let mut out_tasks = Vec::new();
    let mut in_offset = Vec::new();
    let mut off = 0;
    for (j, job) in jobs.iter().enumerate() {
        in_offset.push(off);
        let lay = job.matrix.layout;
        off += lay.input_count();
        let per_task = (COLUMN_GROUP * lay.row_blocks()).div_ceil(lay.blocks.pack);
        for start in (0..lay.packed_count()).step_by(per_task) {
            out_tasks.push((j, start..(start + per_task).min(lay.packed_count())));
        }
    }
    let results = parallel_map(out_tasks.len(), |t, prg| {
        let (j, ref groups) = out_tasks[t];
        let job = &jobs[j];
        let lay = job.matrix.layout;
        let pack = lay.blocks.pack;
        let all = lay.responses();
        let members = &all[groups.start * pack..(groups.end * pack).min(all.len())];
        let kb = lay.k_blocks();
        let mut accs: Vec<Accumulator> = members.iter().map(|_| Accumulator::new(p)).collect();
        let mut w = NttPlaintext::new(p, &[], job.matrix.max_abs)?;
        for bk in 0..kb {
            let mut current = usize::MAX;
            for (&(bi, bm), acc) in members.iter().zip(accs.iter_mut()) {
                let idx = bm * kb + bk;
                let w = match &job.matrix.ntt {
                    Some(cached) => &cached[idx],
                    None => {
                        if current != bm {
                            w.set(p, &job.matrix.blocks[idx])?;
                            current = bm;
                        }
                        &w
                    }
                };
                acc.mul_acc(p, &evals[in_offset[j] + bi * kb + bk], w);
            }
        }
        let mut accs = accs.into_iter();
        let mut done = Vec::new();
        for g in groups.clone() {
            let size = pack.min(all.len() - g * pack);
            let group: Vec<Accumulator> = accs.by_ref().take(size).collect();
            let acc = match (lay.pack_shape(), galois) {
                (Some(shape), Some(gk)) => gk.pack(group, &shape)?,
                _ => group.into_iter().next().expect("one response per group"),
            };
            let outs = lay.packed_outputs(g);
            let positions: Vec<usize> = outs.iter().map(|o| o.0).collect();
            let mut share = Vec::with_capacity(outs.len());
            let mut add = Vec::with_capacity(outs.len());
            for &(_, r, c) in &outs {
                let rv = prg.ring_elem(ring);
                let extra = job.add.map_or(0, |a| a.at2(r, c));
                share.push((r, c, rv));
                add.push(ring.sub(extra, rv));
            }
            done.push((acc.into_response(pk, &positions, &add, prg)?, share));
        }
        Ok((j, done))
    })?;

    // Responses in (job, packed group) order, as the client expects.
    let mut shares: Vec<RingTensor> = jobs
        .iter()
        .map(|job| RingTensor::zeros(ring, &[job.matrix.layout.n, job.matrix.layout.m]))
        .collect::<Result<_>>()?;
    let mut responses = Vec::new();
    for (j, done) in results {
        let m = jobs[j].matrix.layout.m;
        let data = shares[j].data_mut();
        for (resp, share) in done {
            for (r, c, v) in share {
                data[r * m + c] = v;
            }
            responses.push(resp);
        }
    }
    ch.send_msg(&wire::encode_responses(p, &responses))?;
    ch.flush()?;
    Ok(shares)
}
