//! Cheetah-style coefficient packing of a matrix product A·B (A: n×k, client-encrypted;
//! B: k×m, server plaintext) into polynomials of degree N, the packing of the responses, and
//! the choice of block sizes.
//!
//! A block (n_w × k_w) of A goes to coefficient i·k_w·m_w + j; a block (k_w × m_w) of B goes to
//! coefficient l·k_w + (k_w − 1 − j) (centred lift). Their negacyclic product holds
//! Σ_j A(i,j)·B(j,l) at coefficient i·k_w·m_w + l·k_w + k_w − 1: every other pair of terms
//! lands elsewhere, and with n_w·k_w·m_w ≤ N the terms that wrap around X^N land below
//! k_w − 1, under no target (see `wrap_around_never_hits_a_target`). Every coefficient
//! ≡ k_w − 1 (mod k_w) is thus an output entry or zero, the others are cross terms.
//!
//! **Response packing.** When k_w is a power of two ≤ 2^[`veil_he::GALOIS_LEVELS`], `pack` = L > 1
//! consecutive responses (in [`Layout::responses`] order) are merged by the server into one
//! ciphertext ([`veil_he::pack`]): member r's output at coefficient pos lands at
//! pos − (k_w − 1) + (k_w/L)·r, and only those coefficients' c0 are sent, so L responses
//! cost one c1 instead of L.
//!
//! **Choice of blocks.** Traffic is (#input ciphertexts)·|c0 in all limbs| + (#packed
//! responses)·|c1 at p| + n·m·|c0 coefficient|; the input count is n·k·m_w/N and the response
//! count n·m/(n_w·m_w·L). Packing costs key switches (L − 1 per full group), which the search
//! prices at [`KEY_SWITCH_BITS`] each (scaled by limbs·(limbs+1)/12, the transforms one switch
//! takes), so it trades traffic for server time instead of minimising traffic alone. It is
//! exhaustive over (n_w, k_w, L), cheap, and depends only on public shapes and parameters, so
//! both parties derive the same layout. Ties go to fewer polynomial products.

use veil_core::{ensure, Result, RingTensor};
use veil_he::{PackShape, Params, GALOIS_LEVELS};

/// Price of one key switch at three RNS limbs, in bits of traffic (see the module docs).
///
/// A switch takes ≈ 0.65 ms of server CPU on the project machine (N = 8192): the time that
/// 65 kbit take on the WAN of the cost report (100 Mbps) and 2 Mbit on its LAN (3 Gbps). The
/// price sits between the two (their geometric mean is ≈ 360 kbit). Measured on BERT-Tiny
/// substituted (`veil bench model`, 2026-11-22, 3 alternating runs each): 64 kbit gave
/// 59.0 MB and a median 5.26 s, 400 kbit 92.2 MB and 4.34 s, 640 kbit (no packing at all)
/// 114.3 MB and 4.29 s; the modelled WAN time grows by 2 % from 64 to 400 kbit.
pub const KEY_SWITCH_BITS: u128 = 400_000;

/// Block sizes of one matrix product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    pub n_w: usize,
    pub k_w: usize,
    pub m_w: usize,
    /// Responses merged into one packed ciphertext (1: no packing).
    pub pack: usize,
}

/// Shape and packing of A (n×k) · B (k×m).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub n: usize,
    pub k: usize,
    pub m: usize,
    pub blocks: Blocking,
}

/// Products larger than this are refused (bounds memory a peer's shape can make us allocate).
pub const MAX_DIM: usize = 1 << 16;

impl Layout {
    pub fn new(p: &Params, n: usize, k: usize, m: usize) -> Result<Self> {
        ensure!(
            (1..=MAX_DIM).contains(&n) && (1..=MAX_DIM).contains(&k) && (1..=MAX_DIM).contains(&m),
            InvalidArgument,
            "matrix product {n}×{k}·{k}×{m}: every dimension must be in 1..={MAX_DIM}"
        );
        let big_n = p.degree();
        let ct_bits = p.ciphertext_bits() as u128;
        let c1_bits = p.response_bits(0) as u128;
        let c0_bits = p.response_bits(1) as u128 - c1_bits;
        let limbs = p.limbs() as u128;
        let ks_bits = KEY_SWITCH_BITS * limbs * (limbs + 1) / 12;
        let can_pack = p.special_modulus().is_some();
        let mut best: Option<((u128, u128), Blocking)> = None;
        for n_w in 1..=n.min(big_n) {
            for k_w in 1..=k.min(big_n / n_w) {
                let m_w = m.min(big_n / (n_w * k_w));
                let (rb, kb, mb) = (n.div_ceil(n_w), k.div_ceil(k_w), m.div_ceil(m_w));
                let packable = can_pack && k_w.is_power_of_two() && k_w <= 1 << GALOIS_LEVELS;
                let max_pack = if packable { k_w.min(rb * mb) } else { 1 };
                let mut pack = 1;
                while pack <= max_pack.max(1) {
                    let groups = (rb * mb).div_ceil(pack) as u128;
                    let switches = groups * (pack as u128 - 1);
                    let bits = (rb * kb) as u128 * ct_bits
                        + groups * c1_bits
                        + (n * m) as u128 * c0_bits
                        + switches * ks_bits;
                    let cost = (bits, (rb * kb * mb) as u128);
                    if best.is_none_or(|(c, _)| cost < c) {
                        best = Some((
                            cost,
                            Blocking {
                                n_w,
                                k_w,
                                m_w,
                                pack,
                            },
                        ));
                    }
                    pack *= 2;
                }
            }
        }
        let blocks = best.expect("at least one blocking").1;
        Ok(Layout { n, k, m, blocks })
    }

    /// Responses in wire order: column block major, row block minor (a packed group then
    /// shares its weight blocks across row blocks).
    pub fn responses(&self) -> Vec<(usize, usize)> {
        (0..self.col_blocks())
            .flat_map(|bm| (0..self.row_blocks()).map(move |bi| (bi, bm)))
            .collect()
    }

    /// The packing of the responses, if any.
    pub fn pack_shape(&self) -> Option<PackShape> {
        let Blocking { k_w, pack, .. } = self.blocks;
        (pack > 1).then(|| PackShape::new(k_w, pack, k_w - 1).expect("layout checked the shape"))
    }

    /// Packed responses sent (groups of `pack` consecutive responses).
    pub fn packed_count(&self) -> usize {
        self.output_count().div_ceil(self.blocks.pack)
    }

    /// Sent coefficients of packed response `g`: (coefficient, row, column) of each output.
    pub fn packed_outputs(&self, g: usize) -> Vec<(usize, usize, usize)> {
        let all = self.responses();
        let pack = self.blocks.pack;
        let members = &all[g * pack..((g + 1) * pack).min(all.len())];
        let shape = self.pack_shape();
        members
            .iter()
            .enumerate()
            .flat_map(|(r, &(bi, bm))| {
                self.outputs(bi, bm)
                    .into_iter()
                    .map(move |(pos, row, col)| match shape {
                        Some(s) => (s.position(pos, r), row, col),
                        None => (pos, row, col),
                    })
            })
            .collect()
    }

    pub fn row_blocks(&self) -> usize {
        self.n.div_ceil(self.blocks.n_w)
    }
    pub fn k_blocks(&self) -> usize {
        self.k.div_ceil(self.blocks.k_w)
    }
    pub fn col_blocks(&self) -> usize {
        self.m.div_ceil(self.blocks.m_w)
    }
    /// Ciphertexts the client sends, ordered (row block, k block).
    pub fn input_count(&self) -> usize {
        self.row_blocks() * self.k_blocks()
    }
    /// Responses the server computes (before packing).
    pub fn output_count(&self) -> usize {
        self.row_blocks() * self.col_blocks()
    }

    fn span(total: usize, w: usize, b: usize) -> std::ops::Range<usize> {
        b * w..(b * w + w).min(total)
    }

    /// Plaintext polynomial of the A block (row block `bi`, k block `bk`).
    pub fn lhs_poly(&self, a: &RingTensor, bi: usize, bk: usize) -> Vec<u64> {
        let Blocking { n_w, k_w, m_w, .. } = self.blocks;
        let rows = Self::span(self.n, n_w, bi);
        let cols = Self::span(self.k, k_w, bk);
        let mut out = vec![0u64; (rows.len() - 1) * k_w * m_w + cols.len()];
        for (i, r) in rows.enumerate() {
            for (j, c) in cols.clone().enumerate() {
                out[i * k_w * m_w + j] = a.at2(r, c);
            }
        }
        out
    }

    /// Centred coefficients of the B block (k block `bk`, column block `bm`), degree < k_w·m_w.
    pub fn rhs_coeffs(&self, b: &RingTensor, bk: usize, bm: usize) -> Vec<i64> {
        let Blocking { k_w, m_w, .. } = self.blocks;
        let ring = b.ring();
        let rows = Self::span(self.k, k_w, bk);
        let cols = Self::span(self.m, m_w, bm);
        let mut out = vec![0i64; k_w * m_w];
        for (j, r) in rows.enumerate() {
            for (l, c) in cols.clone().enumerate() {
                out[l * k_w + (k_w - 1 - j)] = ring.to_signed(b.at2(r, c));
            }
        }
        out
    }

    /// Output coefficients of response (bi, bm) with their (row, column) in the product.
    pub fn outputs(&self, bi: usize, bm: usize) -> Vec<(usize, usize, usize)> {
        let Blocking { n_w, k_w, m_w, .. } = self.blocks;
        let rows = Self::span(self.n, n_w, bi);
        let cols = Self::span(self.m, m_w, bm);
        let mut out = Vec::with_capacity(rows.len() * cols.len());
        for (i, r) in rows.enumerate() {
            for (l, c) in cols.clone().enumerate() {
                out.push((i * k_w * m_w + l * k_w + k_w - 1, r, c));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use veil_core::{Prg, Ring, Seed};
    use veil_he::ParamSet;

    /// Plain negacyclic product mod 2^ℓ of the packed polynomials reproduces A·B at the
    /// output coefficients, for every block — including full blocks where terms wrap around.
    #[test]
    fn wrap_around_never_hits_a_target() {
        let ring = Ring::new(41).unwrap();
        let p = Params::new(ParamSet::N8192, ring).unwrap();
        let big_n = p.degree();
        let mut g = Prg::from_seed(&Seed([3; 16]));
        for &(n, k, m) in &[
            (64, 64, 1),
            (128, 8, 4),
            (5, 7, 3),
            (128, 768, 768),
            (1, 1, 1),
        ] {
            let lay = Layout::new(&p, n, k, m).unwrap();
            let b = lay.blocks;
            assert!(b.n_w * b.k_w * b.m_w <= big_n);
            let a_t = RingTensor::random(ring, &[n, k], &mut g).unwrap();
            let b_t = RingTensor::random(ring, &[k, m], &mut g).unwrap();
            let want = a_t.matmul(&b_t).unwrap();
            for bi in 0..lay.row_blocks().min(2) {
                for bm in 0..lay.col_blocks().min(2) {
                    let mut acc = vec![0u64; big_n];
                    for bk in 0..lay.k_blocks() {
                        let x = lay.lhs_poly(&a_t, bi, bk);
                        let w = lay.rhs_coeffs(&b_t, bk, bm);
                        for (i, &wi) in w.iter().enumerate() {
                            for (j, &xj) in x.iter().enumerate() {
                                let v = (wi as u64).wrapping_mul(xj);
                                if i + j < big_n {
                                    acc[i + j] = acc[i + j].wrapping_add(v);
                                } else {
                                    acc[i + j - big_n] = acc[i + j - big_n].wrapping_sub(v);
                                }
                            }
                        }
                    }
                    for (pos, r, c) in lay.outputs(bi, bm) {
                        assert_eq!(ring.reduce(acc[pos]), want.at2(r, c), "{n}x{k}x{m}");
                    }
                }
            }
        }
    }

    /// Every output entry is sent exactly once, at a distinct coefficient of its packed
    /// response that lies on the class the merge keeps (≡ 0 mod k_w/pack), including partial
    /// last groups and several row blocks (a hand-made layout, as the search rarely picks one).
    #[test]
    fn packed_outputs_cover_every_entry_once() {
        let p = Params::new(ParamSet::N8192, Ring::new(41).unwrap()).unwrap();
        let mut lays: Vec<Layout> = [(128, 40, 70), (39, 79, 39), (128, 768, 768), (5, 7, 3)]
            .iter()
            .map(|&(n, k, m)| Layout::new(&p, n, k, m).unwrap())
            .collect();
        lays.push(Layout {
            n: 150,
            k: 20,
            m: 30,
            blocks: Blocking {
                n_w: 64,
                k_w: 16,
                m_w: 8,
                pack: 4,
            },
        });
        for lay in lays {
            let mut seen = vec![0u8; lay.n * lay.m];
            for g in 0..lay.packed_count() {
                let outs = lay.packed_outputs(g);
                let mut pos: Vec<usize> = outs.iter().map(|o| o.0).collect();
                let step = lay.blocks.k_w / lay.blocks.pack;
                if lay.blocks.pack > 1 {
                    assert!(pos.iter().all(|&x| x % step == 0 && x < p.degree()));
                }
                pos.sort_unstable();
                pos.dedup();
                assert_eq!(pos.len(), outs.len(), "{lay:?}: duplicate coefficient");
                for (_, r, c) in outs {
                    seen[r * lay.m + c] += 1;
                }
            }
            assert!(seen.iter().all(|&v| v == 1), "{lay:?}");
        }
    }

    /// The BERT fully connected shapes pack their responses (the point of the Galois keys);
    /// the attention products, at four limbs where a switch costs 5/3 as much, do not.
    #[test]
    fn bert_fc_shapes_pack_responses_and_attention_shapes_do_not() {
        let ring = Ring::new(41).unwrap();
        let p = Params::new(ParamSet::N8192, ring).unwrap();
        for (n, k, m) in [
            (128, 768, 768),
            (128, 3072, 768),
            (128, 768, 3072),
            (128, 128, 512),
        ] {
            let lay = Layout::new(&p, n, k, m).unwrap();
            assert!(lay.blocks.pack >= 8, "{n}x{k}x{m}: {lay:?}");
        }
        let q4 = Params::new(ParamSet::N8192Q4, ring).unwrap();
        for (n, k, m) in [(128, 64, 128), (128, 128, 64)] {
            let lay = Layout::new(&q4, n, k, m).unwrap();
            assert_eq!(lay.blocks.pack, 1, "{n}x{k}x{m}: {lay:?}");
        }
    }

    #[test]
    fn bert_fc_blocking_uses_all_rows() {
        let p = Params::new(ParamSet::N8192, Ring::new(41).unwrap()).unwrap();
        let lay = Layout::new(&p, 128, 768, 768).unwrap();
        assert_eq!(lay.blocks.n_w, 128);
        assert_eq!(lay.blocks.k_w * lay.blocks.m_w, 64);
        assert!(Layout::new(&p, 0, 1, 1).is_err());
    }
}
