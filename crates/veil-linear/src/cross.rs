//! Products of two secret-shared matrices, C_h = A_h·B_h with A_h = A0_h + A1_h (n×k) and
//! B_h = B0_h + B1_h (k×m), for the H independent products of the attention heads (Q·Kᵀ, A·V;
//! a decoder's one per key/value head, its query heads' rows stacked) in one round trip.
//!
//! A·B = A0·B0 + A·B1 + A1·B0. The client computes A0·B0 locally; the HE products are
//! (i) Enc(A0) with A1 folded in by the server, times B1 (= A·B1), and (ii) Enc(B0ᵀ) times A1ᵀ
//! (= (A1·B0)ᵀ). Both go in one client message and one server message. The server's plaintext
//! operands are uniform ℓ-bit shares, so these products use [`shared_set`]: up to ℓ = 41
//! [`veil_he::ParamSet::N8192Q4`], whose larger Q floods the correspondingly larger noise; the
//! check uses the public bound 2^(ℓ−1) on a centred share, never the shares' actual size.
//!
//! **Wider rings (the decoder's ℓ = 48).** No N = 8192 flood hides a 2^47 plaintext with the
//! 69-bit margin and room left for the Galois keys, so the server cuts each operand into
//! [`LIMB_BITS`]-bit limbs, M ≡ Σ_j 2^(24j)·M_j (mod 2^ℓ) with centred |M_j| ≤ 2^23, places
//! each head's limbs side by side ([M_h,0 | M_h,1], still block-diagonal over the heads) and
//! both parties recombine their shares of the limb products linearly. The client learns each
//! limb product masked by its own fresh R, so nothing beyond the whole product's share; the
//! cost is twice the output columns (responses), not more input ciphertexts.
//!
//! **All heads in one product per direction.** The heads' left operands are placed side by
//! side, [A0_1 … A0_H] (n × H·k), and the server's right operands on the diagonal of a
//! block-diagonal B (H·k × H·m), so one product yields [A_1·B1_1 … A_H·B1_H]. A short prompt's
//! heads then share input ciphertexts and packed responses (at 8 tokens a head fills 1/32 of
//! a ciphertext), and the weight blocks off the diagonal, zero by the public structure, are
//! never multiplied ([`Layout::search_block_diagonal`]); at 128 tokens the search finds the
//! per-head layouts again. A batch of heads of several shapes is carried run by run (each run of
//! consecutive heads of one shape block-diagonally), still in one round trip.
//!
//! **Security and error:** as [`crate::matmul`] (exact mod 2^ℓ up to ℓ = 41; at ℓ = 48 except
//! with probability 2^-69 per decrypted coefficient, two limbs per output). **Flights:** 2 per batch. Output scale is the product of
//! the input scales (2^{2f} for two fixed-point operands).

use veil_core::{ensure, Result, Ring, RingTensor};
use veil_he::session::shared_set;
use veil_he::Params;
use veil_net::Channel;

use crate::layout::Layout;
use crate::matmul::{client_receive, client_send, server_respond, PreparedMatrix, ServerJob};
use veil_he::session::{ClientSession, ServerSession};

pub use veil_he::session::SHARED_SET;

/// Bits of a limb when a share is too wide to be multiplied whole (ℓ > 41): a centred 24-bit
/// limb (|M_j| ≤ 2^23) hides under N8192Q4L48's flood with ≈ 10 bits to spare at a 128-token
/// head, and two limbs cover ℓ = 48.
pub const LIMB_BITS: u32 = 24;

/// Limbs a server share is cut into: one (the whole share) up to ℓ = 41, else ⌈ℓ/24⌉.
fn limbs(ring: Ring) -> usize {
    if ring.bits() <= 41 {
        1
    } else {
        ring.bits().div_ceil(LIMB_BITS) as usize
    }
}

/// Public bound on a centred limb (a whole ℓ-bit share when there is one limb).
fn share_bound(ring: Ring) -> u64 {
    let bits = if limbs(ring) == 1 {
        ring.bits()
    } else {
        LIMB_BITS
    };
    1u64 << (bits - 1)
}

/// M (r × c) as its limbs side by side (r × L·c): centred base-2^24 digits with
/// M ≡ Σ_j 2^(24j)·M_j (mod 2^ℓ), computed branch-free (M is the server's secret share).
fn split_limbs(m: &RingTensor) -> Result<RingTensor> {
    let ring = m.ring();
    let l = limbs(ring);
    if l == 1 {
        return Ok(m.clone());
    }
    let (r, c) = (m.shape()[0], m.shape()[1]);
    let half = 1i64 << (LIMB_BITS - 1);
    let mask = (1i64 << LIMB_BITS) - 1;
    let mut out = vec![0u64; r * l * c];
    for i in 0..r {
        for k in 0..c {
            let mut v = m.data()[i * c + k] as i64;
            for j in 0..l {
                let d = ((v + half) & mask) - half;
                out[i * l * c + j * c + k] = ring.from_signed(d);
                v = (v - d) >> LIMB_BITS;
            }
        }
    }
    RingTensor::from_vec(ring, &[r, l * c], out)
}

/// The inverse on a product with the limbs' columns side by side in groups of L·w: x (rows ×
/// G·L·w) → (rows × G·w), Σ_j 2^(24j)·x_j mod 2^ℓ (linear, so it maps shares to shares).
fn combine_limbs(x: &RingTensor, w: usize) -> Result<RingTensor> {
    let ring = x.ring();
    let l = limbs(ring);
    if l == 1 {
        return Ok(x.clone());
    }
    let (rows, cols) = (x.shape()[0], x.shape()[1]);
    let groups = cols / (l * w);
    let mut out = vec![0u64; rows * groups * w];
    for (o, v) in out.iter_mut().enumerate() {
        let (i, g, k) = (o / (groups * w), o / w % groups, o % w);
        let base = i * cols + g * l * w + k;
        *v = ring.reduce((0..l).fold(0u64, |acc, j| {
            acc.wrapping_add(x.data()[base + j * w] << (LIMB_BITS as usize * j))
        }));
    }
    RingTensor::from_vec(ring, &[rows, groups * w], out)
}

fn shapes(a: &[RingTensor], b: &[RingTensor]) -> Result<Vec<(usize, usize, usize)>> {
    ensure!(
        a.len() == b.len() && !a.is_empty(),
        InvalidArgument,
        "need the same positive number of left and right operands"
    );
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            ensure!(
                x.shape().len() == 2 && y.shape().len() == 2 && x.shape()[1] == y.shape()[0],
                InvalidArgument,
                "cannot multiply {:?} by {:?}",
                x.shape(),
                y.shape()
            );
            Ok((x.shape()[0], x.shape()[1], y.shape()[1]))
        })
        .collect()
}

/// How a batch of products is carried: each run of consecutive heads of one shape
/// block-diagonally (all heads when their shapes agree; a decode step's preprocessed triples,
/// every block's Q·Kᵀ heads then its P·V heads, in one batch). Each group is (heads, n, k, m)
/// for direction (i) and (heads, m, k, n) for direction (ii).
fn groups(dims: &[(usize, usize, usize)]) -> Vec<(usize, usize, usize, usize)> {
    dims.chunk_by(|a, b| a == b)
        .map(|run| {
            let (n, k, m) = run[0];
            (run.len(), n, k, m)
        })
        .collect()
}

/// The layouts of the products of these per-head shapes, two per group of heads (directions (i)
/// and (ii)): public, both parties derive them (and the benchmark reports them).
pub fn layouts(p: &Params, dims: &[(usize, usize, usize)]) -> Result<Vec<Layout>> {
    let bound = share_bound(p.ring());
    let l = limbs(p.ring());
    let mut out = Vec::new();
    for (h, n, k, m) in groups(dims) {
        out.push(Layout::search_block_diagonal(
            p,
            n,
            h * k,
            h * l * m,
            h,
            bound,
        )?);
        out.push(Layout::search_block_diagonal(
            p,
            m,
            h * k,
            h * l * n,
            h,
            bound,
        )?);
    }
    Ok(out)
}

/// The matrices (all of one shape) on the diagonal of a block-diagonal matrix.
fn block_diagonal(parts: &[&RingTensor]) -> Result<RingTensor> {
    let (r, c, g) = (parts[0].shape()[0], parts[0].shape()[1], parts.len());
    let mut d = vec![0u64; g * r * g * c];
    for (h, p) in parts.iter().enumerate() {
        for i in 0..r {
            let row = (h * r + i) * g * c + h * c;
            d[row..row + c].copy_from_slice(&p.data()[i * c..(i + 1) * c]);
        }
    }
    RingTensor::from_vec(parts[0].ring(), &[g * r, g * c], d)
}

/// Head `h`'s columns of a side-by-side result with `width` columns per head.
fn head_columns(x: &RingTensor, h: usize, width: usize) -> Result<RingTensor> {
    let (rows, cols) = (x.shape()[0], x.shape()[1]);
    let d = (0..rows)
        .flat_map(|r| x.data()[r * cols + h * width..r * cols + (h + 1) * width].to_vec())
        .collect();
    RingTensor::from_vec(x.ring(), &[rows, width], d)
}

/// Splits the two per-direction results of each group (limbs recombined) into per-head (i)
/// results and per-head (ii) results (still transposed).
fn split_heads(
    dims: &[(usize, usize, usize)],
    results: &[RingTensor],
) -> Result<Vec<(RingTensor, RingTensor)>> {
    let mut out = Vec::with_capacity(dims.len());
    for ((h, n, _, m), pair) in groups(dims).into_iter().zip(results.chunks_exact(2)) {
        let (first, second) = (combine_limbs(&pair[0], m)?, combine_limbs(&pair[1], n)?);
        for i in 0..h {
            out.push((head_columns(&first, i, m)?, head_columns(&second, i, n)?));
        }
    }
    Ok(out)
}

/// Client side: given its shares A0_h, B0_h of each product, returns its shares of A_h·B_h.
pub fn shared_matmul_client<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ClientSession,
    a0: &[RingTensor],
    b0: &[RingTensor],
) -> Result<Vec<RingTensor>> {
    let dims = shapes(a0, b0)?;
    let sk = session.key(shared_set(a0[0].ring()))?;
    let lays = layouts(sk.params(), &dims)?;
    let b0t = b0
        .iter()
        .map(|b| b.transpose())
        .collect::<Result<Vec<_>>>()?;
    let mut lhs = Vec::new();
    let mut start = 0;
    for (h, ..) in groups(&dims) {
        let a: Vec<&RingTensor> = a0[start..start + h].iter().collect();
        let bt: Vec<&RingTensor> = b0t[start..start + h].iter().collect();
        lhs.push(RingTensor::concat_columns(&a)?);
        lhs.push(RingTensor::concat_columns(&bt)?);
        start += h;
    }
    let lhs_refs: Vec<&RingTensor> = lhs.iter().collect();
    client_send(ch, sk, &lays, &lhs_refs)?;
    let dec = client_receive(ch, sk, &lays)?;
    a0.iter()
        .zip(b0)
        .zip(split_heads(&dims, &dec)?)
        .map(|((a, b), (d1, d2))| a.matmul(b)?.add(&d1)?.add(&d2.transpose()?))
        .collect()
}

/// Server side: given its shares A1_h, B1_h of each product, returns its shares of A_h·B_h.
pub fn shared_matmul_server<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ServerSession,
    a1: &[RingTensor],
    b1: &[RingTensor],
) -> Result<Vec<RingTensor>> {
    let dims = shapes(a1, b1)?;
    let (pk, gk) = session.keys_for(shared_set(a1[0].ring()))?;
    let p = pk.params();
    let lays = layouts(p, &dims)?;
    let a1t = a1
        .iter()
        .map(|a| a.transpose())
        .collect::<Result<Vec<_>>>()?;
    let mut mats = Vec::new();
    let mut folded = Vec::new();
    let mut start = 0;
    for (h, ..) in groups(&dims) {
        let limbs_of = |parts: &[RingTensor]| -> Result<Vec<RingTensor>> {
            parts.iter().map(split_limbs).collect()
        };
        let (b_limbs, at_limbs) = (
            limbs_of(&b1[start..start + h])?,
            limbs_of(&a1t[start..start + h])?,
        );
        let b: Vec<&RingTensor> = b_limbs.iter().collect();
        let at: Vec<&RingTensor> = at_limbs.iter().collect();
        let a: Vec<&RingTensor> = a1[start..start + h].iter().collect();
        mats.push(PreparedMatrix::new(
            p,
            &block_diagonal(&b)?,
            share_bound(p.ring()),
        )?);
        mats.push(PreparedMatrix::new(
            p,
            &block_diagonal(&at)?,
            share_bound(p.ring()),
        )?);
        folded.push(RingTensor::concat_columns(&a)?);
        start += h;
    }
    let jobs: Vec<ServerJob<'_>> = mats
        .iter()
        .zip(&lays)
        .enumerate()
        .map(|(i, (matrix, &layout))| ServerJob {
            matrix,
            layout,
            lhs_share: (i % 2 == 0).then(|| &folded[i / 2]),
            add: None,
        })
        .collect();
    let shares = server_respond(ch, pk, Some(gk), &jobs)?;
    split_heads(&dims, &shares)?
        .into_iter()
        .map(|(r1, r2)| r1.add(&r2.transpose()?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use veil_core::{Prg, Seed};

    /// Side by side times block-diagonal is every head's product side by side.
    #[test]
    fn block_diagonal_product_is_the_heads_products() {
        let ring = Ring::new(41).unwrap();
        let mut g = Prg::from_seed(&Seed([4; 16]));
        let a: Vec<RingTensor> = (0..3)
            .map(|_| RingTensor::random(ring, &[5, 4], &mut g).unwrap())
            .collect();
        let b: Vec<RingTensor> = (0..3)
            .map(|_| RingTensor::random(ring, &[4, 6], &mut g).unwrap())
            .collect();
        let all = RingTensor::concat_columns(&a.iter().collect::<Vec<_>>())
            .unwrap()
            .matmul(&block_diagonal(&b.iter().collect::<Vec<_>>()).unwrap())
            .unwrap();
        for h in 0..3 {
            assert_eq!(
                head_columns(&all, h, 6).unwrap(),
                a[h].matmul(&b[h]).unwrap()
            );
        }
    }

    /// Limbs are centred 24-bit values that recombine to the share mod 2^48, including the
    /// extremes; one limb (ℓ ≤ 41) is the share itself.
    #[test]
    fn limbs_recombine_to_the_share() {
        let ring = Ring::new(48).unwrap();
        assert_eq!(limbs(ring), 2);
        assert_eq!(share_bound(ring), 1 << 23);
        let mut g = Prg::from_seed(&Seed([5; 16]));
        let mut m = RingTensor::random(ring, &[3, 7], &mut g).unwrap();
        let edges = [
            0,
            1,
            (1 << 23) - 1,
            1 << 23,
            (1 << 24) - 1,
            ring.mask(),
            1 << 47,
        ];
        m.data_mut()[..edges.len()].copy_from_slice(&edges);
        let l = split_limbs(&m).unwrap();
        assert_eq!(l.shape(), [3, 14]);
        assert!(l
            .data()
            .iter()
            .all(|&v| ring.to_signed(v).unsigned_abs() <= 1 << 23));
        assert_eq!(combine_limbs(&l, 7).unwrap(), m);
        let narrow = Ring::new(41).unwrap();
        assert_eq!((limbs(narrow), share_bound(narrow)), (1, 1 << 40));
        let m41 = RingTensor::random(narrow, &[2, 2], &mut g).unwrap();
        assert_eq!(split_limbs(&m41).unwrap(), m41);
    }
}
