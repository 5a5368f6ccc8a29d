//! Truncation of shared fixed-point values: ⌊x / 2^s⌋ on the signed view (arithmetic shift), the
//! step after every product. Both variants need head-room: |x| < 2^(ℓ−2).
//!
//! Method (SCI/Cheetah with a known MSB): the server adds 2^(ℓ−2) so x' = x + 2^(ℓ−2) is in
//! [0, 2^(ℓ−1)) and its sign bit is known to be 0. Writing each share as u_i·2^s + l_i,
//! x' >> s = u0 + u1 + c − 2^(ℓ−s)·w, with the wrap w = [x0 + x1 ≥ 2^ℓ] and the low carry
//! c = [l0 + l1 ≥ 2^s]. A known zero MSB makes w = msb(x0) ∨ msb(x1) = 1 − (1−msb0)(1−msb1): one
//! arithmetic COT in Z_{2^s} (only w·2^(ℓ−s) matters).
//! * [`TruncMode::Faithful`]: c by a millionaire's comparison on s bits and a B2A conversion:
//!   exactly ⌊x / 2^s⌋, the semantics of `veil_core::approx`.
//! * [`TruncMode::OneBitError`]: c dropped; the result is ⌊x / 2^s⌋ or ⌊x / 2^s⌋ − 1 (error
//!   ≤ 1 ulp, one-sided), at the cost of one s-bit COT per element.
//!
//! Security: semi-honest; the COT and the comparison reveal nothing beyond their outputs.

use veil_core::{ensure, Result, Ring};
use veil_net::{Channel, Role};
use veil_ot::OtSession;

use crate::boolean::bool_to_arith;
use crate::millionaire::greater_than;
use crate::two_way_cot::low_mask;

/// Which truncation to run; the layers above choose per use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TruncMode {
    /// Exactly ⌊x / 2^s⌋.
    Faithful,
    /// ⌊x / 2^s⌋ − c with c ∈ {0, 1}: one-sided 1-ulp error, ~10× cheaper.
    OneBitError,
}

/// Truncates this party's shares `x` by `s` bits (1 ≤ s ≤ ℓ − 2), assuming |x| < 2^(ℓ−2).
pub(crate) fn truncate_values<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    x: &[u64],
    s: u32,
    mode: TruncMode,
) -> Result<Vec<u64>> {
    let l = ring.bits();
    ensure!(
        (1..=l - 2).contains(&s),
        InvalidArgument,
        "truncation by {s} bits in a {l}-bit ring"
    );
    let bias = 1u64 << (l - 2);
    let xs: Vec<u64> = match role {
        Role::Client => x.to_vec(),
        Role::Server => x.iter().map(|&v| ring.add(v, bias)).collect(),
    };
    let w = wrap_shares(ot, ch, role, ring, &xs, s)?;
    let carry: Vec<u64> = match mode {
        TruncMode::OneBitError => vec![0; x.len()],
        TruncMode::Faithful => {
            let low: Vec<u64> = xs
                .iter()
                .map(|&v| match role {
                    Role::Client => v & low_mask(s),
                    Role::Server => low_mask(s) - (v & low_mask(s)),
                })
                .collect();
            let c = greater_than(ot, ch, role, &low, s)?;
            bool_to_arith(ot, ch, role, ring, &c)?
        }
    };
    let top = 1u64 << (l - s);
    Ok((0..x.len())
        .map(|i| {
            let u = xs[i] >> s;
            let mut r = ring.sub(ring.add(u, carry[i]), ring.mul(top, w[i]));
            if role == Role::Client {
                r = ring.sub(r, 1u64 << (l - 2 - s));
            }
            r
        })
        .collect())
}

/// Shares mod 2^width of the wrap w = [x0 + x1 ≥ 2^k] of values x = x0 + x1 (ring k) whose sign
/// bit is known to be 0: then w = msb(x0) ∨ msb(x1) = 1 − (1 − msb0)(1 − msb1), the product by
/// one arithmetic COT of `width` bits (client sending). Client's share 1 − p0, server's −p1.
fn wrap_shares<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    xs: &[u64],
    width: u32,
) -> Result<Vec<u64>> {
    let m = low_mask(width);
    let not_msb: Vec<bool> = xs.iter().map(|&v| !ring.msb(v)).collect();
    Ok(match role {
        Role::Client => {
            let d: Vec<u64> = not_msb.iter().map(|&b| b as u64).collect();
            let r = ot.send_arith_cot(ch, &d, width)?;
            r.into_iter().map(|p| 1u64.wrapping_add(p) & m).collect()
        }
        Role::Server => ot
            .recv_arith_cot(ch, &not_msb, width)?
            .into_iter()
            .map(|p| p.wrapping_neg() & m)
            .collect(),
    })
}

/// Sign extension from the narrow ring `from` to `to` (wider) of values with |x| < 2^(k−2)
/// (k = from.bits()): the server adds 2^(k−2) so the sign bit is known 0, and x = x0 + x1 −
/// 2^k·w − 2^(k−2) over the integers with the wrap w from the known-zero sign bit (one COT of
/// ℓ − k bits). Exact. Security: semi-honest; one COT whose output is masked.
pub(crate) fn extend_values<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    from: Ring,
    to: Ring,
    x: &[u64],
) -> Result<Vec<u64>> {
    let k = from.bits();
    ensure!(
        k < to.bits(),
        InvalidArgument,
        "extension from {k} to {} bits",
        to.bits()
    );
    let bias = 1u64 << (k - 2);
    let xs: Vec<u64> = match role {
        Role::Client => x.iter().map(|&v| from.reduce(v)).collect(),
        Role::Server => x.iter().map(|&v| from.add(v, bias)).collect(),
    };
    let w = wrap_shares(ot, ch, role, from, &xs, to.bits() - k)?;
    Ok(xs
        .iter()
        .zip(&w)
        .map(|(&v, &wi)| {
            let r = to.sub(v, to.mul(wi, 1u64 << k));
            if role == Role::Server {
                to.sub(r, bias)
            } else {
                r
            }
        })
        .collect())
}
