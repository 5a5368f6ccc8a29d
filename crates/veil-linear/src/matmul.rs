//! Π_MatMul (the paper's Algorithm 1) on a batch of products: the client holds A (n×k) and
//! encrypts it; the server holds B (k×m) in the clear, optionally its own additive share of A,
//! and a value to add to the product. Afterwards the client holds A·B + add − R and the server
//! holds R, a fresh uniform matrix: an additive sharing of A·B + add mod 2^ℓ.
//!
//! Flow (one [`veil_he::round_trip`] for the whole batch): client → server: the seeded
//! ciphertexts of every A block; server → client: one hardened response per group of `pack`
//! output blocks (merged with the client's Galois keys, [`veil_he::pack`]; then
//! [`veil_he::response`]: pk re-randomisation, noise flooding, modulus switching, only the
//! needed c0 coefficients).
//!
//! **Security (semi-honest).** The server sees only BFV ciphertexts under the client's key
//! (IND-CPA under RLWE, 128-bit parameters). The client sees responses that are simulatable from
//! its output alone: c1 is Σ wᵢaᵢ + pk1·u + e2, pseudo-random by RLWE in u; the decrypted noise is
//! flooded with 2^b ≥ 2^69 × a public bound on the weight-dependent noise (checked per layout
//! before anything is received and again per response, otherwise
//! [`veil_core::Error::Insecure`]), which keeps the
//! whole session transcript (≤ 2^28 revealed coefficients per key) within 2^-40 of simulated
//! ([`veil_he`] crate docs); and the decoded values are masked by R.
//! **Error:** none up to ℓ = 41: results are exact mod 2^ℓ (the noise budget is checked for
//! the worst case). At ℓ = 48 exact except with probability 2^-69 per output: the switch's
//! rounding is budgeted by its tail bound ([`veil_he::RoundingBound::Tail`]); a failure gives
//! the client a share off by one, a correctness event, not a leak.
//! **Flights:** 2 per batch (client → server, server → client), whatever the number of products.

use veil_core::parallel::{lanes, parallel_map};
use veil_core::{ensure, Result, RingTensor};
use veil_he::{
    round_trip, Accumulator, EvalCiphertext, GaloisKeys, NttPlaintext, Params, PublicKey, SecretKey,
};
use veil_net::Channel;

use crate::layout::{check_dims, Layout, WeightBlocking};

/// B (k×m), the server's plaintext operand, bound-checked once and served to products with
/// any number of rows and any cut ([`Layout`]). Each job's weight polynomials are gathered from
/// B and transformed at use time, unless the job's cut is one whose NTT form is kept
/// ([`PreparedMatrix::cache_ntt`]; N/(k_w·m_w) × 24 bytes per entry at three limbs, so only
/// when the owner's memory budget allows).
pub struct PreparedMatrix {
    params: Params,
    b: RingTensor,
    /// Public bound on every |entry| (the flooding check's input, never the entries themselves).
    max_abs: u64,
    /// Cuts whose NTT-domain blocks are kept: block (bk, bm) at index bm·k_blocks + bk.
    cached: Vec<(WeightBlocking, Vec<NttPlaintext>)>,
}

impl PreparedMatrix {
    /// `max_abs` is a public bound on every |entry| (centred): entries above it are refused
    /// ([`veil_core::Error::Insecure`]); whether a product is accepted never depends on the
    /// values.
    pub fn new(params: &Params, b: &RingTensor, max_abs: u64) -> Result<Self> {
        ensure!(
            b.shape().len() == 2 && b.ring() == params.ring(),
            InvalidArgument,
            "plaintext matrix must be 2-D over the parameters' ring"
        );
        check_dims(1, b.shape()[0], b.shape()[1])?;
        ensure!(max_abs < 1 << 62, InvalidArgument, "bound {max_abs} ≥ 2^62");
        let ring = b.ring();
        let over = b.data().iter().fold(0u64, |acc, &v| {
            acc | (ring.to_signed(v).unsigned_abs() > max_abs) as u64
        });
        ensure!(
            over == 0,
            Insecure,
            "plaintext matrix has entries above the public bound {max_abs}"
        );
        Ok(PreparedMatrix {
            params: params.clone(),
            b: b.clone(),
            max_abs,
            cached: Vec::new(),
        })
    }

    /// Rows and columns of B.
    pub fn shape(&self) -> (usize, usize) {
        (self.b.shape()[0], self.b.shape()[1])
    }

    /// Bytes the NTT form of `cut` takes.
    pub fn ntt_bytes(&self, cut: WeightBlocking) -> Result<usize> {
        let (k, m) = self.shape();
        let lay = Layout::for_weights(&self.params, 1, k, m, cut)?;
        Ok(lay.k_blocks() * lay.col_blocks() * self.params.limbs() * self.params.degree() * 8)
    }

    /// Bytes held: B and the kept NTT forms.
    pub fn prepared_bytes(&self) -> usize {
        let ntt: usize = self
            .cached
            .iter()
            .map(|(c, _)| self.ntt_bytes(*c).unwrap_or(0))
            .sum();
        self.b.data().len() * 8 + ntt
    }

    /// Keeps the NTT form of `cut`: worth it for a matrix reused across inferences (model
    /// weights) when memory allows, not for a one-off share. Idempotent.
    pub fn cache_ntt(&mut self, cut: WeightBlocking) -> Result<()> {
        if self.is_ntt_cached(cut) {
            return Ok(());
        }
        let (k, m) = self.shape();
        let lay = Layout::for_weights(&self.params, 1, k, m, cut)?;
        let mut blocks = Vec::with_capacity(lay.k_blocks() * lay.col_blocks());
        for bm in 0..lay.col_blocks() {
            for bk in 0..lay.k_blocks() {
                let coeffs = lay.rhs_coeffs(&self.b, bk, bm);
                blocks.push(NttPlaintext::new(&self.params, &coeffs, self.max_abs)?);
            }
        }
        self.cached.push((cut, blocks));
        Ok(())
    }

    /// Whether the NTT form of `cut` is kept.
    pub fn is_ntt_cached(&self, cut: WeightBlocking) -> bool {
        self.cached.iter().any(|(c, _)| *c == cut)
    }

    fn ntt_for(&self, cut: WeightBlocking) -> Option<&[NttPlaintext]> {
        self.cached
            .iter()
            .find(|(c, _)| *c == cut)
            .map(|(_, b)| b.as_slice())
    }

    /// The parameters the matrix was prepared for.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// A·B in the clear, mod 2^ℓ (A: n×k): the online step of a preprocessed product
    /// ([`crate::premask`]), where A is a masked input the server may see.
    pub fn plain_product(&self, a: &RingTensor) -> Result<RingTensor> {
        a.matmul(&self.b)
    }
}

/// The server's part of one product in a batch.
pub struct ServerJob<'a> {
    /// The server's plaintext operand B.
    pub matrix: &'a PreparedMatrix,
    /// The product's layout, as the client derives it (its k and m must be B's shape).
    pub layout: Layout,
    /// The server's additive share of A (n×k), folded into the client's ciphertexts.
    pub lhs_share: Option<&'a RingTensor>,
    /// Added to the product before sharing (n×m), e.g. a bias at scale 2f.
    pub add: Option<&'a RingTensor>,
}

/// Column blocks processed together by one server task.
const COLUMN_GROUP: usize = 8;

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
    round_trip::send_operands(ch, sk, tasks.len(), |t| {
        let (j, bi, bk) = tasks[t];
        layouts[j].lhs_poly(lhs[j], bi, bk)
    })
}

/// Client: receives the responses and decodes one n×m share per product.
pub fn client_receive<C: Channel + ?Sized>(
    ch: &mut C,
    sk: &SecretKey,
    layouts: &[Layout],
) -> Result<Vec<RingTensor>> {
    let p = sk.params();
    let mut tasks = Vec::new();
    for (j, lay) in layouts.iter().enumerate() {
        for g in 0..lay.packed_count() {
            tasks.push((j, lay.packed_outputs(g)));
        }
    }
    let positions: Vec<Vec<usize>> = tasks
        .iter()
        .map(|(_, outs)| outs.iter().map(|o| o.0).collect())
        .collect();
    let decoded = round_trip::receive_results(ch, sk, &positions)?;
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

/// The accumulators of `members` ((row block, column block) pairs of `job`'s layout), each the
/// sum over the inner blocks of its input ciphertext times its weight block. Inner blocks run
/// outermost so that one pass over the inputs feeds every accumulator, and a weight block is
/// transformed once for the consecutive members of its column.
fn products(
    job: &ServerJob<'_>,
    members: &[(usize, usize)],
    evals: &[EvalCiphertext],
) -> Result<Vec<Accumulator>> {
    let lay = job.layout;
    let p = &job.matrix.params;
    let kb = lay.k_blocks();
    let mut accs: Vec<Accumulator> = members.iter().map(|_| Accumulator::new(p)).collect();
    let cached = job.matrix.ntt_for(lay.weight_blocking());
    let mut w = NttPlaintext::new(p, &[], job.matrix.max_abs)?;
    for bk in 0..kb {
        let mut current = usize::MAX;
        for (&(bi, bm), acc) in members.iter().zip(accs.iter_mut()) {
            if lay.is_structural_zero(bk, bm) {
                continue;
            }
            let w = match cached {
                Some(blocks) => &blocks[bm * kb + bk],
                None => {
                    if current != bm {
                        w.set(p, &lay.rhs_coeffs(&job.matrix.b, bk, bm))?;
                        current = bm;
                    }
                    &w
                }
            };
            acc.mul_acc(p, &evals[bi * kb + bk], w);
        }
    }
    Ok(accs)
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
    for job in jobs {
        let lay = job.layout;
        ensure!(
            job.matrix.shape() == (lay.k, lay.m),
            InvalidArgument,
            "layout {lay:?} does not match the prepared {:?} matrix",
            job.matrix.shape()
        );
        lay.check_noise(p, job.matrix.max_abs)?;
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
    }
    // Expand seeds and fold in the server's share of A.
    let mut in_tasks = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        let lay = job.layout;
        for bi in 0..lay.row_blocks() {
            for bk in 0..lay.k_blocks() {
                in_tasks.push((j, bi, bk));
            }
        }
    }
    let evals = round_trip::receive_operands(ch, p, in_tasks.len(), |t, ev| {
        let (j, bi, bk) = in_tasks[t];
        match jobs[j].lhs_share {
            Some(share) => ev.add_plain(p, &jobs[j].layout.lhs_poly(share, bi, bk)),
            None => Ok(()),
        }
    })?;

    // One task per (job, run of packed groups covering about COLUMN_GROUP column blocks):
    // responses are column-block major, so each weight block is transformed once per task and
    // used for every row block; grouping column blocks lets one pass over the input
    // ciphertexts feed several accumulators (the inputs are far larger than the cache).
    let mut out_tasks = Vec::new();
    let mut in_offset = Vec::new();
    let mut off = 0;
    for (j, job) in jobs.iter().enumerate() {
        let lay = job.layout;
        in_offset.push(off);
        off += lay.input_count();
        let per_task = (COLUMN_GROUP * lay.row_blocks()).div_ceil(lay.blocks.pack);
        for start in (0..lay.packed_count()).step_by(per_task) {
            out_tasks.push((j, start..(start + per_task).min(lay.packed_count())));
        }
    }
    // Few tasks (a decoder step's matrix × vector: one packed group a product) would leave
    // workers idle, so each task then computes its column blocks in parallel too.
    let nested = out_tasks.len() < veil_core::parallel::pool().current_num_threads();
    let results = parallel_map(out_tasks.len(), |t, prg| {
        let (j, ref groups) = out_tasks[t];
        let job = &jobs[j];
        let lay = job.layout;
        let pack = lay.blocks.pack;
        let shape = lay.pack_shape();
        let all = lay.responses();
        let members = &all[groups.start * pack..(groups.end * pack).min(all.len())];
        let evals = &evals[in_offset[j]..in_offset[j] + lay.input_count()];
        let accs = if nested {
            // Members are column-block major: one run per column block, a lane each (no random
            // stream needed, unlike `parallel_map`; serial on a one-worker pool).
            let runs: Vec<&[(usize, usize)]> = members.chunk_by(|a, b| a.1 == b.1).collect();
            let parts = lanes(runs.len(), 1, |r| products(job, runs[r.start], evals));
            let parts = parts.into_iter().collect::<Result<Vec<_>>>()?;
            parts.into_iter().flatten().collect()
        } else {
            products(job, members, evals)?
        };
        let mut accs = accs.into_iter();
        let mut done = Vec::new();
        for g in groups.clone() {
            let size = pack.min(all.len() - g * pack);
            let group: Vec<Accumulator> = accs.by_ref().take(size).collect();
            let outs = lay.packed_outputs(g);
            let positions: Vec<usize> = outs.iter().map(|o| o.0).collect();
            let (response, share) = round_trip::respond(
                pk,
                galois,
                group,
                shape.as_ref(),
                &positions,
                |i| job.add.map_or(0, |a| a.at2(outs[i].1, outs[i].2)),
                prg,
            )?;
            let share: Vec<_> = outs.iter().zip(share).map(|(o, r)| (o.1, o.2, r)).collect();
            done.push((response, share));
        }
        Ok((j, done))
    })?;

    // Responses in (job, packed group) order, as the client expects.
    let mut shares: Vec<RingTensor> = jobs
        .iter()
        .map(|job| RingTensor::zeros(ring, &[job.layout.n, job.layout.m]))
        .collect::<Result<_>>()?;
    let mut responses = Vec::new();
    for (j, done) in results {
        let m = jobs[j].layout.m;
        let data = shares[j].data_mut();
        for (resp, share) in done {
            for (r, c, v) in share {
                data[r * m + c] = v;
            }
            responses.push(resp);
        }
    }
    round_trip::send_responses(ch, p, &responses)?;
    Ok(shares)
}
