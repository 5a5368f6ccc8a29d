//! Products of two secret-shared matrices, C = A·B with A = A0 + A1 (n×k) and B = B0 + B1
//! (k×m), for many independent products (attention heads: Q·Kᵀ, A·V) in one round trip.
//!
//! A·B = A0·B0 + A·B1 + A1·B0. The client computes A0·B0 locally; the HE products are
//! (i) Enc(A0) with A1 folded in by the server, times B1 (= A·B1), and (ii) Enc(B0ᵀ) times A1ᵀ
//! (= (A1·B0)ᵀ). Both go in one client message and one server message. The server's plaintext
//! operands are uniform ℓ-bit shares, so these products use [`ParamSet::N8192Q4`], whose larger Q
//! floods the correspondingly larger noise; the check uses the public bound 2^(ℓ−1) on a
//! centred share, never the shares' actual size.
//!
//! **Security and error:** as [`crate::matmul`]; exact mod 2^ℓ. Output scale is the product of
//! the input scales (2^{2f} for two fixed-point operands).

use veil_core::{ensure, Result, RingTensor};
use veil_he::{ParamSet, Params};
use veil_net::Channel;

use crate::layout::Layout;
use crate::matmul::{client_receive, client_send, server_respond, PreparedMatrix, ServerJob};
use crate::session::{ClientSession, ServerSession};

/// The parameter set of shared × shared products.
pub const SHARED_SET: ParamSet = ParamSet::N8192Q4;

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

fn layouts(p: &Params, dims: &[(usize, usize, usize)]) -> Result<Vec<Layout>> {
    let mut out = Vec::with_capacity(2 * dims.len());
    for &(n, k, m) in dims {
        out.push(Layout::search(p, n, k, m)?);
        out.push(Layout::search(p, m, k, n)?);
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
    let lhs: Vec<&RingTensor> = a0.iter().zip(&b0t).flat_map(|(a, b)| [a, b]).collect();
    client_send(ch, sk, &lays, &lhs)?;
    let dec = client_receive(ch, sk, &lays)?;
    a0.iter()
        .zip(b0)
        .zip(dec.chunks_exact(2))
        .map(|((a, b), d)| a.matmul(b)?.add(&d[0])?.add(&d[1].transpose()?))
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
    let share_bound = 1u64 << (p.ring().bits() - 1);
    let lays = layouts(p, &dims)?;
    let mut mats = Vec::with_capacity(2 * dims.len());
    for (a, b) in a1.iter().zip(b1) {
        mats.push(PreparedMatrix::new(p, b, share_bound)?);
        mats.push(PreparedMatrix::new(p, &a.transpose()?, share_bound)?);
    }
    let jobs: Vec<ServerJob<'_>> = mats
        .iter()
        .enumerate()
        .zip(lays)
        .map(|((i, matrix), layout)| ServerJob {
            matrix,
            layout,
            lhs_share: (i % 2 == 0).then(|| &a1[i / 2]),
            add: None,
        })
        .collect();
    let shares = server_respond(ch, pk, Some(gk), &jobs)?;
    shares
        .chunks_exact(2)
        .map(|r| r[0].add(&r[1].transpose()?))
        .collect()
}
