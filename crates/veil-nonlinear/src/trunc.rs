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
//!   ≤ 1 ulp, one-sided; x/2^s − 1 + 2^−s on average over the uniform shares, which
//!   [`Ctx::round`](crate::Ctx::round) uses to round without bias), at the cost of one s-bit COT
//!   per element.
//!
//! [`truncate_into`] delivers the result in a wider ring at no extra step (the wrap's COT is
//! just wider), so a truncation in a narrow ring followed by a sign extension costs one COT,
//! and a sign extension alone is the truncation by nothing ([`extend_values`]).
//! Flights: 2 (1-bit-error mode, extension), 4 + 2·⌈log2 ⌈s/4⌉⌉ (faithful: the comparison's
//! last flight carries the COT call's corrections).
//!
//! Security: semi-honest; the COT and the comparison reveal nothing beyond their outputs.

use veil_core::{ensure, Result, Ring};
use veil_net::{Channel, Role};
use veil_ot::OtSession;

use crate::millionaire::greater_than;
use crate::two_way_cot::{low_mask, CotCall};

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
    truncate_into(ot, ch, role, ring, ring, x, s, mode)
}

/// ⌊x / 2^s⌋ (or one less, in the 1-bit-error mode) for shares `x` of ring `from` (k bits,
/// s ≤ k − 2, |x| < 2^(k−2)), delivered as shares of ring `to` (at least as wide): the
/// truncation and the sign extension in one step. Over the integers x' = x + 2^(k−2) =
/// x'_0 + x'_1 − 2^k·w, so x' >> s = (x'_0 >> s) + (x'_1 >> s) + c − 2^(k−s)·w, and only w·2^(k−s)
/// mod 2^ℓ' (ℓ' = to's bits) is needed: one COT of ℓ' − k + s bits, however wide `to` is.
/// Flights: 2 in the 1-bit-error mode; in the faithful mode the carry's comparison on s bits
/// (3 + 2·⌈log2 ⌈s/4⌉⌉), then the wrap's COT and the carry's B2A in one call (one more: its
/// corrections ride on the comparison's last flight).
#[allow(clippy::too_many_arguments)]
pub(crate) fn truncate_into<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    from: Ring,
    to: Ring,
    x: &[u64],
    s: u32,
    mode: TruncMode,
) -> Result<Vec<u64>> {
    Ok(truncate_with(ot, ch, role, (from, to), x, s, mode, &[])?.0)
}

/// [`truncate_into`], and arithmetic shares in `to` of the XOR-shared `bits` (a B2A) riding in the
/// same COT call: (the truncated values, the bits).
#[allow(clippy::too_many_arguments)]
fn truncate_with<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    (from, to): (Ring, Ring),
    x: &[u64],
    s: u32,
    mode: TruncMode,
    bits: &[bool],
) -> Result<(Vec<u64>, Vec<u64>)> {
    let k = from.bits();
    ensure!(
        s <= k - 2 && to.bits() >= k && (s > 0 || to.bits() > k),
        InvalidArgument,
        "truncation by {s} bits from a {k}-bit ring into a {}-bit one",
        to.bits()
    );
    let bias = 1u64 << (k - 2);
    let xs: Vec<u64> = match role {
        Role::Client => x.iter().map(|&v| from.reduce(v)).collect(),
        Role::Server => x.iter().map(|&v| from.add(v, bias)).collect(),
    };
    // The carry is dropped in the 1-bit-error mode; without low bits (s = 0: an extension)
    // there is none. Its XOR shares are converted in the wrap's call, ahead of `bits`.
    let with_carry = mode == TruncMode::Faithful && s > 0;
    let mut convert = if with_carry {
        let low: Vec<u64> = xs
            .iter()
            .map(|&v| match role {
                Role::Client => v & low_mask(s),
                Role::Server => low_mask(s) - (v & low_mask(s)),
            })
            .collect();
        greater_than(ot, ch, role, &low, s)?
    } else {
        Vec::new()
    };
    convert.extend_from_slice(bits);
    let (w, mut arith) = wrap_and_carry(ot, ch, role, from, to, &xs, k - s, &convert)?;
    let extra = arith.split_off(if with_carry { x.len() } else { 0 });
    let top = 1u64 << (k - s);
    let out = (0..x.len())
        .map(|i| {
            let u = xs[i] >> s;
            let carry = if with_carry { arith[i] } else { 0 };
            let mut r = to.sub(to.add(u, carry), to.mul(top, w[i]));
            if role == Role::Client {
                r = to.sub(r, 1u64 << (k - 2 - s));
            }
            r
        })
        .collect();
    Ok((out, extra))
}

/// [`extend_values`] and a B2A of `bits` into `to`, in one call (two flights instead of four):
/// both are client-to-server COTs on bits each party already holds. Returns (the extended
/// values, the bits' arithmetic shares).
pub(crate) fn extend_with_b2a<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    (from, to): (Ring, Ring),
    x: &[u64],
    bits: &[bool],
) -> Result<(Vec<u64>, Vec<u64>)> {
    ensure!(
        from.bits() < to.bits(),
        InvalidArgument,
        "extension from {} to {} bits",
        from.bits(),
        to.bits()
    );
    truncate_with(ot, ch, role, (from, to), x, 0, TruncMode::Faithful, bits)
}

/// Shares of the wrap w of `xs` (ring `from`, sign bit known 0) that matter after a factor
/// 2^shift in ring `to` (mod 2^(to − shift)), and arithmetic shares in `to` of the XOR-shared
/// `bits`: both are client-to-server arithmetic COTs on bits each party already holds, so they
/// go in one call (two flights). w = 1 − (1 − msb0)(1 − msb1); a bit b0 ⊕ b1 = b0 + b1 − 2·b0·b1.
#[allow(clippy::too_many_arguments)]
fn wrap_and_carry<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    from: Ring,
    to: Ring,
    xs: &[u64],
    shift: u32,
    bits: &[bool],
) -> Result<(Vec<u64>, Vec<u64>)> {
    let n = xs.len();
    let width = to.bits() - shift;
    let not_msb: Vec<bool> = xs.iter().map(|&v| !from.msb(v)).collect();
    let mut call = CotCall::default();
    for &b in &not_msb {
        match role {
            Role::Client => call.send(b as u64, width),
            Role::Server => call.recv(b, width),
        }
    }
    for &c in bits {
        match role {
            Role::Client => call.send(if c { to.neg(1) } else { 1 }, to.bits()),
            Role::Server => call.recv(c, to.bits()),
        }
    }
    let (x, y) = call.run(ot, ch, role)?;
    let out = if role == Role::Client { &x } else { &y };
    let m = low_mask(width);
    let w = out[..n]
        .iter()
        .map(|&p| match role {
            Role::Client => 1u64.wrapping_add(p) & m,
            Role::Server => p.wrapping_neg() & m,
        })
        .collect();
    let c = match role {
        Role::Client => bits
            .iter()
            .zip(&out[n..])
            .map(|(&b, &p)| to.sub(b as u64, p))
            .collect(),
        Role::Server => out[n..].to_vec(),
    };
    Ok((w, c))
}

/// Sign extension from the narrow ring `from` to `to` (wider) of values with |x| < 2^(k−2)
/// (k = from.bits()): [`truncate_into`] by nothing, x = x'_0 + x'_1 − 2^k·w − 2^(k−2) with the
/// wrap from the known-zero sign bit (one COT of ℓ − k bits, two flights). Exact.
/// Security: semi-honest; one COT whose output is masked.
pub(crate) fn extend_values<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    from: Ring,
    to: Ring,
    x: &[u64],
) -> Result<Vec<u64>> {
    Ok(extend_with_b2a(ot, ch, role, (from, to), x, &[])?.0)
}
