//! Products of two secret-shared matrices, C_h = A_h·B_h with A_h = A0_h + A1_h (n×k) and
//! B_h = B0_h + B1_h (k×m), for the H independent products of the attention heads (Q·Kᵀ, A·V)
//! in one round trip.
//!
//! A·B = A0·B0 + A·B1 + A1·B0. The client computes A0·B0 locally; the HE products are
//! (i) Enc(A0) with A1 folded in by the server, times B1 (= A·B1), and (ii) Enc(B0ᵀ) times A1ᵀ
//! (= (A1·B0)ᵀ). Both go in one client message and one server message. The server's plaintext
//! operands are uniform ℓ-bit shares, so these products use [`veil_he::ParamSet::N8192Q4`], whose larger Q
//! floods the correspondingly larger noise; the check uses the public bound 2^(ℓ−1) on a
//! centred share, never the shares' actual size.
//!
//! **All heads in one product per direction.** The heads' left operands are placed side by
//! side, [A0_1 … A0_H] (n × H·k), and the server's right operands on the diagonal of a
//! block-diagonal B (H·k × H·m), so one product yields [A_1·B1_1 … A_H·B1_H]. A short prompt's
//! heads then share input ciphertexts and packed responses (at 8 tokens a head fills 1/32 of
//! a ciphertext), and the weight blocks off the diagonal, zero by the public structure, are
//! never multiplied ([`Layout::search_block_diagonal`]); at 128 tokens the search finds the
//! per-head layouts again. Heads of different shapes are multiplied one by one.
//!
//! **Security and error:** as [`crate::matmul`]; exact mod 2^ℓ. Output scale is the product of
//! the input scales (2^{2f} for two fixed-point operands).

use veil_core::{ensure, Result, Ring, RingTensor};
use veil_he::Params;
use veil_net::Channel;

use crate::layout::Layout;
use crate::matmul::{client_receive, client_send, server_respond, PreparedMatrix, ServerJob};
use veil_he::session::{ClientSession, ServerSession};

pub use veil_he::session::SHARED_SET;

/// Public bound on a centred ℓ-bit share.
fn share_bound(ring: Ring) -> u64 {
    1u64 << (ring.bits() - 1)
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

/// How a batch of products is carried: all heads block-diagonally when their shapes agree,
/// else head by head. Each group is (heads, n, k, m) for direction (i) and (heads, m, k, n)
/// for direction (ii).
fn groups(dims: &[(usize, usize, usize)]) -> Vec<(usize, usize, usize, usize)> {
    if dims.iter().all(|&d| d == dims[0]) {
        let (n, k, m) = dims[0];
        vec![(dims.len(), n, k, m)]
    } else {
        dims.iter().map(|&(n, k, m)| (1, n, k, m)).collect()
    }
}

/// The layouts of the products of these per-head shapes, two per group of heads (directions (i)
/// and (ii)): public, both parties derive them (and the benchmark reports them).
pub fn layouts(p: &Params, dims: &[(usize, usize, usize)]) -> Result<Vec<Layout>> {
    let bound = share_bound(p.ring());
    let mut out = Vec::new();
    for (h, n, k, m) in groups(dims) {
        out.push(Layout::search_block_diagonal(p, n, h * k, h * m, h, bound)?);
        out.push(Layout::search_block_diagonal(p, m, h * k, h * n, h, bound)?);
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

/// Splits the two per-direction results of each group into per-head (i) results and per-head
/// (ii) results (still transposed).
fn split_heads(
    dims: &[(usize, usize, usize)],
    results: &[RingTensor],
) -> Result<Vec<(RingTensor, RingTensor)>> {
    let mut out = Vec::with_capacity(dims.len());
    for ((h, n, _, m), pair) in groups(dims).into_iter().zip(results.chunks_exact(2)) {
        for i in 0..h {
            out.push((head_columns(&pair[0], i, m)?, head_columns(&pair[1], i, n)?));
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
    let sk = session.key(SHARED_SET)?;
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
    let (pk, gk) = session.keys_for(SHARED_SET)?;
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
        let b: Vec<&RingTensor> = b1[start..start + h].iter().collect();
        let at: Vec<&RingTensor> = a1t[start..start + h].iter().collect();
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
}
