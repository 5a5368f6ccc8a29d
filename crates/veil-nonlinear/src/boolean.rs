//! Gates on XOR-shared bits and the bridges to arithmetic shares.
//!
//! A shared bit b is held as b0 (client) ⊕ b1 (server). The gates on shared values cost one OT
//! per element in each direction (three flights, [`cot_both`]), and no pre-generated triples:
//! the cross terms are computed directly by OT, which is what a bit triple would cost anyway.
//!
//! Security: semi-honest; each party only ever sees OT outputs masked by the peer's fresh
//! randomness (uniform XOR masks or the uniform x of an arithmetic COT).

use veil_core::{ensure, Result, Ring};
use veil_net::{Channel, Role};
use veil_ot::OtSession;

use crate::two_way_cot::{cot_both, low_mask, Corr};

/// XOR shares of `a_i ? d_i : 0` for shared bits a and shared words d (a ∧ every bit of d), word
/// i of `widths[i mod widths.len()]` bits: (a0 ⊕ a1)·(d0 ⊕ d1) = a_mine·d_mine ⊕ a_peer·d_mine ⊕
/// a_mine·d_peer, the cross terms by one binary COT of the word's width per element in each
/// direction.
pub(crate) fn and_select<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    a: &[bool],
    d: &[u64],
    widths: &[u32],
) -> Result<Vec<u64>> {
    ensure!(
        a.len() == d.len() && !widths.is_empty(),
        InvalidArgument,
        "and_select: {} bits vs {} words ({} widths)",
        a.len(),
        d.len(),
        widths.len()
    );
    let mine: Vec<u64> = d
        .iter()
        .enumerate()
        .map(|(i, &v)| v & low_mask(widths[i % widths.len()]))
        .collect();
    // The peer's choice bit selects row 0 or d_mine: the two outputs XOR to a_peer·d_mine.
    let (r, got) = cot_both(ot, ch, role, Corr::Xor, (&mine, widths), (a, widths))?;
    Ok((0..a.len())
        .map(|i| (if a[i] { mine[i] } else { 0 }) ^ r[i] ^ got[i])
        .collect())
}

/// Arithmetic shares mod 2^ℓ of XOR-shared bits: b0 ⊕ b1 = b0 + b1 − 2·b0·b1, the product by
/// one ℓ-bit arithmetic COT from client to server. Two flights.
pub(crate) fn bool_to_arith<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    b: &[bool],
) -> Result<Vec<u64>> {
    let l = ring.bits();
    match role {
        Role::Client => {
            let deltas: Vec<u64> = b
                .iter()
                .map(|&bi| if bi { ring.neg(1) } else { 1 })
                .collect();
            let x = ot.send_arith_cot(ch, &deltas, l)?;
            Ok(b.iter()
                .zip(x)
                .map(|(&bi, xi)| ring.sub(bi as u64, xi))
                .collect())
        }
        Role::Server => ot.recv_arith_cot(ch, b, l),
    }
}

/// Arithmetic shares of b·v for an XOR-shared bit b and an arithmetic-shared v:
/// (b0 ⊕ b1)·v_mine = b_mine·v_mine + b_peer·(1 − 2·b_mine)·v_mine, the second term by one ℓ-bit
/// arithmetic COT per direction. Three flights.
pub(crate) fn mux<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    b: &[bool],
    v: &[u64],
) -> Result<Vec<u64>> {
    ensure!(
        b.len() == v.len(),
        InvalidArgument,
        "mux: {} bits vs {} values",
        b.len(),
        v.len()
    );
    let deltas: Vec<u64> = b
        .iter()
        .zip(v)
        .map(|(&bi, &vi)| if bi { ring.neg(vi) } else { vi })
        .collect();
    let w = [ring.bits()];
    let (x, y) = cot_both(ot, ch, role, Corr::Arith, (&deltas, &w), (b, &w))?;
    Ok((0..b.len())
        .map(|i| {
            let own = if b[i] { v[i] } else { 0 };
            ring.add(ring.sub(own, x[i]), y[i])
        })
        .collect())
}
