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
//! **Response packing.** When k_w is a power of two ≤ 2^[`Params::galois_levels`] (64 for the
//! encoder's sets, 512 for the decoder's), `pack` = L > 1
//! consecutive responses (in [`Layout::responses`] order) are merged by the server into one
//! ciphertext ([`veil_he::pack`]): member r's output at coefficient pos lands at
//! pos − (k_w − 1) + (k_w/L)·r, and only those coefficients' c0 are sent, so L responses
//! cost one c1 instead of L.
//!
//! **Choice of blocks.** The weight side of a block, (k_w, m_w), fixes how B is cut into
//! polynomials; only n_w depends on the number of rows. A matrix the server keeps (model
//! weights) is therefore cut independently of the request, into a form that serves every
//! n: a request of n rows takes n_w = min(n, ⌊N/(k_w·m_w)⌋) and its own response packing
//! ([`Layout::for_weights`]). A kept matrix has up to three cuts
//! ([`WeightBlocking::all_for`]): one priced for short prompts ([`SHORT_ROWS`] rows: dense
//! weight polynomials, one row block, so the work falls with n), one for long prompts (priced
//! at [`LONG_REFERENCE_ROWS`]: sparser polynomials, fewer input ciphertexts), and one priced at
//! a single row (a decoder's step, matrix × vector: the row's k entries spread over few input
//! ciphertexts and each weight polynomial filled to N, since n_w = 1 leaves all of N to
//! k_w·m_w; at SmolLM2's shapes and ℓ = 48 it halves the short cut's traffic at n = 1). A
//! request of n rows takes whichever of them is cheapest at n ([`WeightBlocking::for_rows`]).
//! A one-off operand (a share in an attention product)
//! is cut for its n alone ([`Layout::search`]). Every candidate is priced with [`crate::cost`]:
//! server and client CPU time of every HE operation plus traffic. The search depends only on
//! public shapes and parameters, so both parties derive the same layout; ties go to fewer
//! polynomial products.

use std::collections::BTreeMap;
use std::sync::Mutex;

use veil_core::{ensure, Result, RingTensor};
use veil_he::{PackShape, Params};

use crate::cost::{OpCounts, Price};

/// Block sizes of one matrix product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// Rows of A per block.
    pub n_w: usize,
    /// Inner dimension per block.
    pub k_w: usize,
    /// Columns of B per block.
    pub m_w: usize,
    /// Responses merged into one packed ciphertext (1: no packing).
    pub pack: usize,
}

impl From<Blocking> for WeightBlocking {
    fn from(b: Blocking) -> Self {
        WeightBlocking {
            k_w: b.k_w,
            m_w: b.m_w,
        }
    }
}

/// Shape and packing of A (n×k) · B (k×m).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Rows of A.
    pub n: usize,
    /// Columns of A, rows of B.
    pub k: usize,
    /// Columns of B.
    pub m: usize,
    /// The block sizes and the response packing.
    pub blocks: Blocking,
    /// B is block-diagonal with this many equal blocks of (k/heads) × (m/heads) (public
    /// structure, 1 for a dense B): the attention heads batched into one product. Weight
    /// blocks that lie wholly off the diagonal are zero by construction and never multiplied.
    pub heads: usize,
}

/// Searched layouts remembered per process (shapes are few: a model's layers × the lengths served;
/// past this many the memory is cleared, so a peer's lengths cannot grow it).
const SEARCH_CACHE_ENTRIES: usize = 4096;

/// Products larger than this are refused (bounds memory a peer's shape can make us allocate).
pub(crate) const MAX_DIM: usize = 1 << 16;

/// How a kept plaintext matrix (k×m) is cut into polynomials: blocks of k_w × m_w entries,
/// independent of the number of rows it will be multiplied with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightBlocking {
    /// Inner dimension per block.
    pub k_w: usize,
    /// Columns of B per block.
    pub m_w: usize,
}

/// The row count a kept matrix's short-prompt cut is priced at (prompts of 2..=this many rows
/// are that cut's class; a request takes whichever kept cut is cheapest at its own length,
/// [`WeightBlocking::for_rows`]).
pub(crate) const SHORT_ROWS: usize = 16;

/// The row count the long-prompt cut is priced at (capped at the matrix's row limit).
pub(crate) const LONG_REFERENCE_ROWS: usize = 128;

pub(crate) fn check_dims(n: usize, k: usize, m: usize) -> Result<()> {
    ensure!(
        (1..=MAX_DIM).contains(&n) && (1..=MAX_DIM).contains(&k) && (1..=MAX_DIM).contains(&m),
        InvalidArgument,
        "matrix product {n}×{k}·{k}×{m}: every dimension must be in 1..={MAX_DIM}"
    );
    Ok(())
}

/// Block widths worth trying for a dimension of `total` under a cap: the smallest width for
/// each block count (wider only adds padding) and the powers of two (which can pack).
fn widths(total: usize, cap: usize) -> Vec<usize> {
    let cap = cap.min(total);
    let mut out: Vec<usize> = (1..=total)
        .map(|blocks| total.div_ceil(blocks))
        .chain((0..usize::BITS).map(|b| 1usize << b))
        .filter(|&w| (1..=cap).contains(&w))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

impl WeightBlocking {
    /// The cheapest cut of a k×m matrix for products with `n` rows (see the module docs).
    pub fn search(p: &Params, n: usize, k: usize, m: usize, bound: u64) -> Result<Self> {
        Ok(Layout::search(p, n, k, m, bound)?.weight_blocking())
    }

    /// The cut a kept matrix uses for a request of `rows` rows when requests have at most
    /// `max_rows`: the cheapest at `rows` of its kept cuts ([`WeightBlocking::all_for`]: one
    /// priced at a single row, for a decoder's steps; one at [`SHORT_ROWS`]; one at
    /// [`LONG_REFERENCE_ROWS`]), so a server keeps at most three cuts' NTT forms however many
    /// lengths it serves, and a length between the reference ones takes whichever cut serves
    /// it best (at 17–48 rows mostly the short-prompt cut, modelled at 0.5–0.8× the long one's
    /// time for BERT-Base's and MiniLM's layers). Prices count the weight transforms (no
    /// cache assumed: the client cannot know the server's); ties go to the earlier cut, the one
    /// a server's NTT budget caches first. Public data only, so both parties pick the same.
    pub fn for_rows(
        p: &Params,
        rows: usize,
        max_rows: usize,
        k: usize,
        m: usize,
        bound: u64,
    ) -> Result<Self> {
        ensure!(
            (1..=max_rows).contains(&rows),
            InvalidArgument,
            "{rows} rows outside 1..={max_rows}"
        );
        let mut best: Option<(f64, Self)> = None;
        for cut in Self::all_for(p, max_rows, k, m, bound)? {
            let lay = Layout::for_weights(p, rows, k, m, cut)?;
            if lay.check_noise(p, bound).is_err() {
                continue;
            }
            let price = lay.counts().price(p).seconds();
            if best.is_none_or(|(b, _)| price < b) {
                best = Some((price, cut));
            }
        }
        best.map(|(_, cut)| cut).ok_or_else(|| {
            veil_core::Error::Insecure(format!(
                "no kept cut of {k}×{m} keeps {rows} rows within the flooding budget"
            ))
        })
    }

    /// The row count a cut for `rows`' class is priced at: one row (a decoder's step),
    /// [`SHORT_ROWS`] for short prompts, [`LONG_REFERENCE_ROWS`] for longer ones, each capped
    /// at `max_rows`.
    fn reference_rows(rows: usize, max_rows: usize) -> usize {
        let reference = if rows == 1 {
            1
        } else if rows <= SHORT_ROWS {
            SHORT_ROWS
        } else {
            LONG_REFERENCE_ROWS
        };
        reference.min(max_rows)
    }

    /// The distinct cuts [`WeightBlocking::for_rows`] chooses from up to `max_rows`: the
    /// short-prompt cut, the long-prompt cut, then the single-row cut (a server's NTT budget
    /// goes to them in this order).
    pub fn all_for(
        p: &Params,
        max_rows: usize,
        k: usize,
        m: usize,
        bound: u64,
    ) -> Result<Vec<Self>> {
        ensure!(max_rows >= 1, InvalidArgument, "a row limit of 0");
        let cut = |rows| Self::search(p, Self::reference_rows(rows, max_rows), k, m, bound);
        let mut cuts = vec![cut(max_rows.min(2))?];
        for rows in [max_rows, 1] {
            let cut = cut(rows)?;
            if !cuts.contains(&cut) {
                cuts.push(cut);
            }
        }
        Ok(cuts)
    }
}

impl Layout {
    /// The cheapest layout of a one-off product A (n×k) · B (k×m) (B cut for this n alone)
    /// whose responses can be flooded for plaintext entries up to `bound` in magnitude.
    pub fn search(p: &Params, n: usize, k: usize, m: usize, bound: u64) -> Result<Self> {
        Self::search_block_diagonal(p, n, k, m, 1, bound)
    }

    /// [`Layout::search`] for a B that is block-diagonal with `heads` equal blocks (A·B then
    /// holds the `heads` products A_h·B_h side by side, A = [A_1 … A_heads]): every head's
    /// operands share ciphertexts and responses, and off-diagonal weight blocks cost nothing.
    pub fn search_block_diagonal(
        p: &Params,
        n: usize,
        k: usize,
        m: usize,
        heads: usize,
        bound: u64,
    ) -> Result<Self> {
        check_dims(n, k, m)?;
        ensure!(
            heads >= 1 && k.is_multiple_of(heads) && m.is_multiple_of(heads),
            InvalidArgument,
            "{heads} diagonal blocks do not divide {k}×{m}"
        );
        // Both parties search once per shape and process: every request of a length asks again.
        // The key levels belong to the key: they decide which strides can pack.
        type Key = (usize, Vec<u64>, usize, [usize; 4], u64);
        static FOUND: Mutex<BTreeMap<Key, Layout>> = Mutex::new(BTreeMap::new());
        let key = (
            p.degree(),
            p.moduli().to_vec(),
            p.galois_levels(),
            [n, k, m, heads],
            bound,
        );
        if let Some(&lay) = FOUND.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(lay);
        }
        let big_n = p.degree();
        let mut best: Option<((f64, usize), Layout)> = None;
        for k_w in widths(k, big_n) {
            for m_w in widths(m, big_n / k_w) {
                let wb = WeightBlocking { k_w, m_w };
                let (lay, counts, price) = Self::best_packing(p, n, k, m, wb, heads);
                if lay.check_noise(p, bound).is_err() {
                    continue;
                }
                let rank = (price.seconds(), counts.products);
                if best.is_none_or(|(c, _)| rank < c) {
                    best = Some((rank, lay));
                }
            }
        }
        let lay = best.map(|b| b.1).ok_or_else(|| {
            veil_core::Error::Insecure(format!(
                "no blocking of {n}×{k}·{k}×{m} keeps plaintexts up to {bound} within the \
                 flooding budget"
            ))
        })?;
        let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
        if found.len() >= SEARCH_CACHE_ENTRIES {
            found.clear();
        }
        found.insert(key, lay);
        Ok(lay)
    }

    /// Checks the flooding budget of a product under this layout from public data only: the
    /// bound, the most weight slots one output sums (k_w·m_w per non-zero block in a column
    /// block) and the packing's key-switching noise.
    pub fn check_noise(&self, p: &Params, bound: u64) -> Result<()> {
        let Blocking { k_w, m_w, .. } = self.blocks;
        let packing_noise = match self.pack_shape() {
            Some(shape) => shape.noise_bound(p)?,
            None => 0.0,
        };
        let blocks_per_column = (0..self.col_blocks())
            .map(|bm| self.nonzero_blocks_in_column(bm))
            .max()
            .unwrap_or(0);
        p.check_public_product(
            (blocks_per_column * k_w * m_w) as f64,
            bound as f64,
            packing_noise,
        )
    }

    /// The layout of n rows against a matrix cut as `wb`: as many rows per block as fit, and
    /// the cheapest response packing.
    pub fn for_weights(
        p: &Params,
        n: usize,
        k: usize,
        m: usize,
        wb: WeightBlocking,
    ) -> Result<Self> {
        check_dims(n, k, m)?;
        ensure!(
            (1..=k).contains(&wb.k_w) && (1..=m).contains(&wb.m_w) && wb.k_w * wb.m_w <= p.degree(),
            InvalidArgument,
            "weight blocking {wb:?} does not fit {k}×{m} at N = {}",
            p.degree()
        );
        Ok(Self::best_packing(p, n, k, m, wb, 1).0)
    }

    fn best_packing(
        p: &Params,
        n: usize,
        k: usize,
        m: usize,
        wb: WeightBlocking,
        heads: usize,
    ) -> (Layout, OpCounts, Price) {
        let WeightBlocking { k_w, m_w } = wb;
        let n_w = n.min(p.degree() / (k_w * m_w));
        let mut lay = Layout {
            n,
            k,
            m,
            blocks: Blocking {
                n_w,
                k_w,
                m_w,
                pack: 1,
            },
            heads,
        };
        let packable =
            p.special_modulus().is_some() && k_w.is_power_of_two() && k_w <= 1 << p.galois_levels();
        let max_pack = if packable {
            k_w.min(lay.output_count().next_power_of_two())
        } else {
            1
        };
        let counts = lay.counts();
        let mut best = (lay, counts, counts.price(p));
        let mut pack = 2;
        while pack <= max_pack {
            lay.blocks.pack = pack;
            let counts = lay.counts();
            let price = counts.price(p);
            if price.seconds() < best.2.seconds() {
                best = (lay, counts, price);
            }
            pack *= 2;
        }
        best
    }

    /// Operation counts of this layout, weights not cached ([`crate::cost`]).
    pub fn counts(&self) -> OpCounts {
        let outputs = self.output_count();
        let pack = self.blocks.pack;
        let key_switches = match self.pack_shape() {
            Some(shape) => {
                let full = outputs / pack;
                full * shape.key_switches(pack) + shape.key_switches(outputs % pack)
            }
            None => 0,
        };
        let weight_blocks = self.nonzero_weight_blocks();
        OpCounts {
            inputs: self.input_count(),
            weight_ntts: weight_blocks,
            products: self.row_blocks() * weight_blocks,
            key_switches,
            responses: self.packed_count(),
            outputs: self.n * self.m,
        }
    }

    /// Heads (diagonal blocks of B) that rows `range` of B, or columns of B, cover.
    fn heads_of(&self, range: std::ops::Range<usize>, total: usize) -> (usize, usize) {
        let per_head = total / self.heads;
        (range.start / per_head, (range.end - 1) / per_head)
    }

    /// Whether weight block (bk, bm) lies wholly off B's diagonal blocks (zero by the public
    /// structure, so it is neither transformed nor multiplied).
    pub fn is_structural_zero(&self, bk: usize, bm: usize) -> bool {
        if self.heads == 1 {
            return false;
        }
        let Blocking { k_w, m_w, .. } = self.blocks;
        let (r0, r1) = self.heads_of(Self::span(self.k, k_w, bk), self.k);
        let (c0, c1) = self.heads_of(Self::span(self.m, m_w, bm), self.m);
        r1 < c0 || c1 < r0
    }

    /// Non-zero weight blocks of column block `bm`: the k-blocks meeting the rows of the heads
    /// its columns belong to.
    fn nonzero_blocks_in_column(&self, bm: usize) -> usize {
        if self.heads == 1 {
            return self.k_blocks();
        }
        let Blocking { k_w, m_w, .. } = self.blocks;
        let per_head = self.k / self.heads;
        let (h0, h1) = self.heads_of(Self::span(self.m, m_w, bm), self.m);
        let first = h0 * per_head / k_w;
        let last = ((h1 + 1) * per_head - 1) / k_w;
        last - first + 1
    }

    /// Weight blocks that are not structural zeros.
    pub fn nonzero_weight_blocks(&self) -> usize {
        let Blocking { k_w, m_w, .. } = self.blocks;
        if self.heads == 1 {
            return self.k_blocks() * self.col_blocks();
        }
        let per_head = self.m / self.heads;
        (0..self.k_blocks())
            .map(|bk| {
                let (h0, h1) = self.heads_of(Self::span(self.k, k_w, bk), self.k);
                let first = h0 * per_head / m_w;
                let last = ((h1 + 1) * per_head - 1) / m_w;
                last - first + 1
            })
            .sum()
    }

    /// The weight side of this layout.
    pub fn weight_blocking(&self) -> WeightBlocking {
        self.blocks.into()
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

    /// Blocks along the rows of A.
    pub fn row_blocks(&self) -> usize {
        self.n.div_ceil(self.blocks.n_w)
    }
    /// Blocks along the inner dimension.
    pub fn k_blocks(&self) -> usize {
        self.k.div_ceil(self.blocks.k_w)
    }
    /// Blocks along the columns of B.
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

    /// acc += x·w in Z[X]/(X^N + 1), coefficients mod 2^64 (N = acc.len()).
    fn negacyclic_mul_acc(acc: &mut [u64], x: &[u64], w: &[i64]) {
        let big_n = acc.len();
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

    /// Under one cut, a shorter operand's encoding is a prefix of a longer one's: the rows
    /// (or inner columns) of A sit at the same coefficients whatever the length, and entries
    /// past the length — here random, as in a ciphertext kept while the operand grows — reach
    /// none of the shorter product's output coefficients. This is what lets a server keep a
    /// growing left operand (a decoder's cached keys and values) between products.
    #[test]
    fn entries_past_the_length_never_reach_an_output() {
        let ring = Ring::new(48).unwrap();
        let p = Params::new(ParamSet::N8192Q4L48, ring).unwrap();
        let big_n = p.degree();
        let mut g = Prg::from_seed(&Seed([6; 16]));
        let cut = |k_w, m_w| WeightBlocking { k_w, m_w };
        // (cut, rows, rows of the longer operand, inner, inner of the longer, columns)
        for &(wb, n, n_long, k, k_long, m) in &[
            (cut(64, 2), 41, 70, 64, 64, 6),
            (cut(64, 1), 3, 300, 64, 64, 6),
            (cut(64, 1), 130, 200, 64, 64, 6),
            (cut(32, 2), 64, 64, 41, 100, 6),
            (cut(64, 2), 64, 64, 64, 130, 6),
            (cut(16, 4), 10, 90, 33, 70, 5),
        ] {
            let short = Layout::for_weights(&p, n, k, m, wb).unwrap();
            let long = Layout::for_weights(&p, n_long, k_long, m, wb).unwrap();
            let a_long = RingTensor::random(ring, &[n_long, k_long], &mut g).unwrap();
            let a = RingTensor::from_vec(
                ring,
                &[n, k],
                (0..n)
                    .flat_map(|r| (0..k).map(move |c| (r, c)))
                    .map(|(r, c)| a_long.at2(r, c))
                    .collect(),
            )
            .unwrap();
            let b = RingTensor::random(ring, &[k, m], &mut g).unwrap();
            let want = a.matmul(&b).unwrap();
            for bi in 0..short.row_blocks() {
                let x_long: Vec<Vec<u64>> = (0..short.k_blocks())
                    .map(|bk| long.lhs_poly(&a_long, bi, bk))
                    .collect();
                for (bk, x_long) in x_long.iter().enumerate() {
                    let x = short.lhs_poly(&a, bi, bk);
                    for (pos, &v) in x.iter().enumerate().filter(|(_, &v)| v != 0) {
                        assert_eq!(x_long[pos], v, "{wb:?} n {n}/{n_long} k {k}/{k_long}");
                    }
                }
                for bm in 0..short.col_blocks() {
                    let mut acc = vec![0u64; big_n];
                    for (bk, x_long) in x_long.iter().enumerate() {
                        negacyclic_mul_acc(&mut acc, x_long, &short.rhs_coeffs(&b, bk, bm));
                    }
                    for (pos, r, c) in short.outputs(bi, bm) {
                        assert_eq!(ring.reduce(acc[pos]), want.at2(r, c), "{wb:?} n {n} k {k}");
                    }
                }
            }
        }
    }

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
            let lay = Layout::search(&p, n, k, m, crate::fc::WEIGHT_BOUND).unwrap();
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
                        negacyclic_mul_acc(&mut acc, &x, &lay.rhs_coeffs(&b_t, bk, bm));
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
            .map(|&(n, k, m)| Layout::search(&p, n, k, m, crate::fc::WEIGHT_BOUND).unwrap())
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
            heads: 1,
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

    /// The layouts of every BERT shape are those of half the weight bound: the flooding margin
    /// of N8192 covers them either way. If a bound change ever moves a layout, this says so and
    /// the benchmarks must be re-measured.
    #[test]
    fn bert_layouts_do_not_depend_on_the_doubled_weight_bound() {
        let p = Params::new(ParamSet::N8192, Ring::new(41).unwrap()).unwrap();
        let bound = crate::fc::WEIGHT_BOUND;
        for (k, m) in [
            (768, 768),
            (768, 3072),
            (3072, 768),
            (384, 1536),
            (1536, 384),
            (128, 512),
        ] {
            for n in [1, 16, 128, 512] {
                let now = WeightBlocking::for_rows(&p, n, 512, k, m, bound).unwrap();
                let before = WeightBlocking::for_rows(&p, n, 512, k, m, bound / 2).unwrap();
                assert_eq!(now, before, "{n}x{k}x{m}");
            }
        }
    }

    /// Prints the chosen blockings of the BERT shapes (for the docs):
    /// `cargo test -p veil-linear --release layout::tests::print_choices -- --ignored --nocapture`.
    #[test]
    #[ignore = "prints the search's choices"]
    fn print_choices() {
        let ring = Ring::new(41).unwrap();
        let p = Params::new(ParamSet::N8192, ring).unwrap();
        for (k, m, max) in [
            (768, 768, 512),
            (768, 2304, 512),
            (768, 3072, 512),
            (3072, 768, 512),
            (384, 384, 512),
            (384, 1152, 512),
            (384, 1536, 512),
            (1536, 384, 512),
            (128, 384, 512),
            (128, 512, 512),
            (512, 128, 512),
            (768, 768, 1),
            (768, 2, 1),
        ] {
            for n in [1, 8, 16, 128, 512] {
                if n > max {
                    continue;
                }
                let wb =
                    WeightBlocking::for_rows(&p, n, max, k, m, crate::fc::WEIGHT_BOUND).unwrap();
                let lay = Layout::for_weights(&p, n, k, m, wb).unwrap();
                let c = lay.counts();
                let pr = c.price(&p);
                println!(
                    "{k}x{m} n={n}: {:?} {c:?} server {:.0} ms client {:.0} ms {:.1} MB",
                    lay.blocks,
                    pr.server_us / 1e3,
                    pr.client_us / 1e3,
                    pr.bits / 8e6
                );
            }
        }
        let q4 = Params::new(ParamSet::N8192Q4, ring).unwrap();
        for (h, n, k, m) in [
            (12, 8, 32, 8),
            (12, 8, 8, 32),
            (12, 128, 64, 128),
            (12, 128, 128, 64),
            (2, 128, 64, 128),
            (12, 512, 64, 512),
        ] {
            for (a, b, c) in [(n, k, m), (m, k, n)] {
                let t = std::time::Instant::now();
                let lay = Layout::search_block_diagonal(&q4, a, h * b, h * c, h, 1 << 40).unwrap();
                println!("search {:?}", t.elapsed());
                let cn = lay.counts();
                let pr = cn.price(&q4);
                println!(
                    "Q4 {h} heads {a}x{b}x{c}: {:?} {cn:?} server {:.0} ms client {:.0} ms {:.2} MB",
                    lay.blocks, pr.server_us / 1e3, pr.client_us / 1e3, pr.bits / 8e6
                );
            }
        }
        for (n, k, m) in [
            (128, 64, 128),
            (128, 128, 64),
            (64, 128, 128),
            (16, 64, 16),
            (16, 16, 64),
        ] {
            let lay = Layout::search(&q4, n, k, m, 1 << 40).unwrap();
            let c = lay.counts();
            let pr = c.price(&q4);
            println!(
                "Q4 {n}x{k}x{m}: {:?} {c:?} server {:.0} ms {:.2} MB",
                lay.blocks,
                pr.server_us / 1e3,
                pr.bits / 8e6
            );
        }
    }

    /// The count of non-zero weight blocks of a block-diagonal B equals a direct scan, for
    /// blocks that straddle heads and for blocks inside one.
    #[test]
    fn block_diagonal_counts_match_a_scan() {
        fn scan(lay: &Layout) -> usize {
            (0..lay.col_blocks())
                .map(|bm| {
                    let column = (0..lay.k_blocks())
                        .filter(|&bk| !lay.is_structural_zero(bk, bm))
                        .count();
                    assert_eq!(
                        lay.nonzero_blocks_in_column(bm),
                        column,
                        "{lay:?} column {bm}"
                    );
                    column
                })
                .sum()
        }
        let p = Params::new(ParamSet::N8192Q4, Ring::new(41).unwrap()).unwrap();
        for (n, k, m, heads) in [
            (8, 384, 96, 12),
            (128, 768, 1536, 12),
            (5, 60, 21, 3),
            (3, 8, 8, 8),
        ] {
            let lay = Layout::search_block_diagonal(&p, n, k, m, heads, 1 << 40).unwrap();
            assert_eq!(lay.nonzero_weight_blocks(), scan(&lay), "{lay:?}");
            for w in [1, 7, 32] {
                let mut other = lay;
                other.blocks.k_w = w.min(k);
                other.blocks.m_w = w.min(m);
                assert_eq!(other.nonzero_weight_blocks(), scan(&other), "{other:?}");
            }
        }
        assert!(Layout::search_block_diagonal(&p, 8, 10, 12, 3, 1).is_err());
    }

    /// A kept matrix's cut serves every row count: the layout for n differs only in n_w and
    /// the packing, and short prompts take a single row block.
    #[test]
    fn weight_blocking_serves_every_length() {
        let p = Params::new(ParamSet::N8192, Ring::new(41).unwrap()).unwrap();
        let cuts = WeightBlocking::all_for(&p, 512, 768, 768, crate::fc::WEIGHT_BOUND).unwrap();
        assert!((1..=3).contains(&cuts.len()));
        for n in [1, 7, 16, 17, 128, 512] {
            let wb =
                WeightBlocking::for_rows(&p, n, 512, 768, 768, crate::fc::WEIGHT_BOUND).unwrap();
            assert!(cuts.contains(&wb));
            let lay = Layout::for_weights(&p, n, 768, 768, wb).unwrap();
            assert_eq!(lay.weight_blocking(), wb);
            assert!(lay.blocks.n_w * wb.k_w * wb.m_w <= p.degree());
            if n <= 16 {
                assert_eq!(lay.row_blocks(), 1, "n = {n}: {lay:?}");
            }
        }
        assert!(Layout::for_weights(&p, 0, 768, 768, cuts[0]).is_err());
        assert!(Layout::search(&p, 0, 1, 1, 1).is_err());
        let too_wide = WeightBlocking { k_w: 768, m_w: 768 };
        assert!(Layout::for_weights(&p, 1, 768, 768, too_wide).is_err());
    }

    /// A request takes the cheapest of the kept cuts at its own length, whatever its class: at
    /// every n up to the limit no kept cut prices lower, and between the reference lengths
    /// (20–32 rows of BERT-Base's and MiniLM's layers) that is well below the long-prompt cut,
    /// which these lengths took before.
    #[test]
    fn requests_take_the_cheapest_kept_cut() {
        let p = Params::new(ParamSet::N8192, Ring::new(41).unwrap()).unwrap();
        let bound = crate::fc::WEIGHT_BOUND;
        let seconds = |n, k, m, wb| {
            let lay = Layout::for_weights(&p, n, k, m, wb).unwrap();
            lay.check_noise(&p, bound).unwrap();
            lay.counts().price(&p).seconds()
        };
        for (k, m) in [
            (768, 768),
            (768, 3072),
            (3072, 768),
            (384, 1536),
            (128, 512),
        ] {
            let cuts = WeightBlocking::all_for(&p, 128, k, m, bound).unwrap();
            for n in [1, 2, 5, 16, 17, 20, 32, 48, 64, 100, 128] {
                let wb = WeightBlocking::for_rows(&p, n, 128, k, m, bound).unwrap();
                let chosen = seconds(n, k, m, wb);
                assert!(cuts.contains(&wb), "{k}x{m} n = {n}");
                for &c in &cuts {
                    assert!(
                        chosen <= seconds(n, k, m, c),
                        "{k}x{m} n = {n}: {wb:?} vs {c:?}"
                    );
                }
                if (20..=32).contains(&n) {
                    let long = seconds(n, k, m, cuts[1]);
                    assert!(chosen < 0.8 * long, "{k}x{m} n = {n}: {chosen} vs {long}");
                }
            }
        }
        assert!(WeightBlocking::for_rows(&p, 0, 128, 768, 768, bound).is_err());
        assert!(WeightBlocking::for_rows(&p, 129, 128, 768, 768, bound).is_err());
    }

    /// A single row is priced as one (a decoder's step): at the decoder's shapes and ℓ = 48 the
    /// single-row cut costs less at n = 1 than the short-prompt cut, in modelled time and in
    /// traffic (by at least a third), `all_for` lists it after the two prompt cuts, and a
    /// request of one row takes it.
    #[test]
    fn single_rows_get_a_matrix_vector_cut() {
        let p = Params::new(ParamSet::N8192Q4L48, Ring::new(48).unwrap()).unwrap();
        let bound = crate::fc::WEIGHT_BOUND;
        for (k, m) in [(576, 576), (576, 192), (576, 1536), (1536, 576)] {
            let cuts = WeightBlocking::all_for(&p, 2048, k, m, bound).unwrap();
            assert_eq!(cuts.len(), 3, "{k}x{m}: {cuts:?}");
            let (short, long, single) = (cuts[0], cuts[1], cuts[2]);
            assert_eq!(
                short,
                WeightBlocking::search(&p, SHORT_ROWS, k, m, bound).unwrap()
            );
            assert_eq!(
                long,
                WeightBlocking::search(&p, LONG_REFERENCE_ROWS, k, m, bound).unwrap()
            );
            assert_eq!(single, WeightBlocking::search(&p, 1, k, m, bound).unwrap());
            let price = |wb| {
                let lay = Layout::for_weights(&p, 1, k, m, wb).unwrap();
                lay.check_noise(&p, bound).unwrap();
                lay.counts().price(&p)
            };
            let (a, b) = (price(single), price(short));
            assert!(a.seconds() < b.seconds(), "{k}x{m}: {a:?} vs {b:?}");
            assert!(a.bits < 0.67 * b.bits, "{k}x{m}: {a:?} vs {b:?}");
            assert_eq!(
                WeightBlocking::for_rows(&p, 1, 2048, k, m, bound).unwrap(),
                single
            );
        }
        // A layer whose only length is one row keeps one cut, as before.
        assert_eq!(
            WeightBlocking::all_for(&p, 1, 576, 576, bound)
                .unwrap()
                .len(),
            1
        );
    }

    /// The decoder's set packs at strides up to 512: at n = 1 every SmolLM2 and GPT-2 product is
    /// priced no higher than under the same parameters with the encoder's 6 key levels (custom
    /// parameters), most pack wider than 64, and a SmolLM2 block's four decode-step products send
    /// more than a quarter fewer modelled bytes.
    #[test]
    fn single_rows_pack_at_the_decoders_strides() {
        let ring = Ring::new(48).unwrap();
        let p = Params::new(ParamSet::N8192Q4L48, ring).unwrap();
        let six = Params::custom(8192, 42, 4, 62, ring).unwrap();
        assert_eq!(six.moduli(), p.moduli());
        assert_eq!((six.galois_levels(), p.galois_levels()), (6, 9));
        let bound = crate::fc::WEIGHT_BOUND;
        let (mut wide, mut bits, mut bits_six) = (0, 0.0, 0.0);
        for (k, m) in [
            (576, 960),
            (576, 576),
            (576, 3072),
            (1536, 576),
            (768, 2304),
            (768, 768),
            (768, 3072),
            (3072, 768),
        ] {
            let lay = Layout::search(&p, 1, k, m, bound).unwrap();
            let old = Layout::search(&six, 1, k, m, bound).unwrap();
            lay.check_noise(&p, bound).unwrap();
            let (a, b) = (lay.counts().price(&p), old.counts().price(&six));
            assert!(
                a.seconds() <= b.seconds(),
                "{k}x{m}: {lay:?} {a:?} vs {old:?} {b:?}"
            );
            assert!(old.blocks.pack == 1 || old.blocks.k_w <= 64, "{old:?}");
            if lay.blocks.pack > 1 && lay.blocks.k_w > 64 {
                wide += 1;
            }
            if k == 576 || m == 576 {
                (bits, bits_six) = (bits + a.bits, bits_six + b.bits);
            }
        }
        assert!(wide >= 6, "{wide} products pack wider than 64");
        assert!(bits < 0.75 * bits_six, "{bits} vs {bits_six}");
    }
}

#[cfg(test)]
mod decoder_choices {
    use super::*;
    use veil_core::Ring;
    use veil_he::ParamSet;

    /// Prints the layouts and modelled prices of the decoder's products at ℓ = 48 (SmolLM2's
    /// and GPT-2's FC shapes, q|k|v and gate|up stacked, at 1, 8 and 40 rows, each priced for
    /// its own rows and for a 2,048-row limit; the attention products at a few context lengths):
    /// `cargo test -p veil-linear --lib decoder_choices -- --ignored --nocapture`.
    #[test]
    #[ignore = "prints the search's choices"]
    fn print_decoder_choices() {
        let ring = Ring::new(48).unwrap();
        let p = Params::new(ParamSet::N8192Q4L48, ring).unwrap();
        let bound = crate::fc::WEIGHT_BOUND;
        let shapes = [
            (576, 576),
            (576, 192),
            (576, 960),
            (576, 1536),
            (576, 3072),
            (1536, 576),
            (768, 768),
            (768, 2304),
            (768, 3072),
            (3072, 768),
        ];
        for (k, m) in shapes {
            for n in [1usize, 8, 40] {
                for limit in [n, 2048] {
                    let wb = WeightBlocking::for_rows(&p, n, limit, k, m, bound).unwrap();
                    let lay = Layout::for_weights(&p, n, k, m, wb).unwrap();
                    let c = lay.counts();
                    let pr = c.price(&p);
                    println!(
                        "{k}x{m} n={n} limit={limit}: {:?} {c:?} server {:.0} ms client {:.0} ms \
                         {:.2} MB modelled {:.2} s",
                        lay.blocks,
                        pr.server_us / 1e3,
                        pr.client_us / 1e3,
                        pr.bits / 8e6,
                        pr.seconds()
                    );
                }
            }
        }
        let shared = Params::new(veil_he::session::shared_set(ring), ring).unwrap();
        for t in [9usize, 41] {
            for dims in [vec![(1usize, 64usize, t); 9], vec![(1, t, 64); 9]] {
                for lay in crate::cross::layouts(&shared, &dims).unwrap() {
                    let c = lay.counts();
                    println!(
                        "attention t={t} {:?}: {}x{}x{} ({} heads) {:?} {c:?} {:.2} MB",
                        dims[0],
                        lay.n,
                        lay.k,
                        lay.m,
                        lay.heads,
                        lay.blocks,
                        c.price(&shared).bits / 8e6
                    );
                }
            }
        }
    }
}
