//! DReLU (the sign bit) on arithmetic shares, with an optional magnitude bound; ReLU is DReLU
//! and a multiplexer ([`crate::Ctx::relu`]).
//!
//! DReLU(x) = [x ≥ 0] is bit k of z = x + 2^k when |x| < 2^k (k ≤ ℓ − 1; k = ℓ − 1 is the whole
//! ring, where adding 2^(ℓ−1) just flips the sign bit). On shares z = z0 + z1, bit k of z is
//! bit_k(z0) ⊕ bit_k(z1) ⊕ carry, and the carry out of the low k bits is the millionaire's
//! comparison [low_k(z0) > 2^k − 1 − low_k(z1)] on k bits. A bound-controlled model promises a
//! small |x|, so k shrinks from ℓ − 1 = 40 to e.g. 20 and the comparison costs half.
//!
//! Exact: no approximation error. Flights: 3 + 2·⌈log2 ⌈k/4⌉⌉ (the millionaire's leaves in two,
//! its first AND level in three, every further level in two; 9 at k = 20, 11 at k = 40).
//! Security: semi-honest (millionaire).

use veil_core::{ensure, Result, Ring};
use veil_net::{Channel, Role};
use veil_ot::OtSession;

use crate::millionaire::greater_than_sharing_low;
use crate::two_way_cot::low_mask;

/// Bits k of the promise |x| < 2^k; `None` means no promise (k = ℓ − 1).
pub(crate) fn bound_bits(ring: Ring, bound: Option<u32>) -> Result<u32> {
    let k = bound.unwrap_or(ring.bits() - 1);
    ensure!(
        (1..ring.bits()).contains(&k),
        InvalidArgument,
        "magnitude bound 2^{k} outside 2^1..2^{}",
        ring.bits() - 1
    );
    Ok(k)
}

/// XOR shares of [x ≥ 0] for ring elements `x` (this party's shares), given |x| < 2^k.
pub(crate) fn drelu_values<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    x: &[u64],
    bound: Option<u32>,
) -> Result<Vec<bool>> {
    drelu_batch(ot, ch, role, ring, x, &[], bound)
}

/// Comparisons of shared values s with public thresholds t > 0: the DReLUs of s − t,
/// element-major (value by value, in the order of `ts`).
pub(crate) struct Thresholds<'a> {
    /// This party's shares of the values s.
    pub values: &'a [u64],
    /// The thresholds: powers of two for a class, finer steps for rsqrt's pieces.
    pub ts: &'a [u64],
}

/// XOR shares of [x ≥ 0] for `plain` (as [`drelu_values`]) followed by those of [s ≥ t] for
/// every set of [`Thresholds`], all in one comparison batch (one tree's depth) under the bound
/// |x| < 2^k, 0 < t < 2^k, |s − t| < 2^k. The millionaire's inputs of s − t and of s agree
/// below t's lowest set bit j (subtracting t changes no lower bit, and the client's share is s's
/// own), so those digits' leaves are computed once per value s ([`greater_than_sharing_low`]).
pub(crate) fn drelu_batch<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    plain: &[u64],
    sets: &[Thresholds],
    bound: Option<u32>,
) -> Result<Vec<bool>> {
    let k = bound_bits(ring, bound)?;
    ensure!(
        sets.iter()
            .flat_map(|t| t.ts)
            .all(|&t| t > 0 && t >> k == 0),
        InvalidArgument,
        "a threshold of 0 or at or above the comparison bound 2^{k}"
    );
    let offset = if role == Role::Server { 1u64 << k } else { 0 };
    let low = low_mask(k);
    let input = |z: u64| match role {
        Role::Client => z & low,
        Role::Server => low - (z & low),
    };
    let count = plain.len()
        + sets
            .iter()
            .map(|t| t.values.len() * t.ts.len())
            .sum::<usize>();
    let mut z = Vec::with_capacity(count);
    // Without thresholds nothing is shared (an empty map).
    let mut share = Vec::with_capacity(if sets.is_empty() { 0 } else { count });
    let mut base = Vec::new();
    for &v in plain {
        z.push(ring.add(v, offset));
    }
    if !sets.is_empty() {
        share.resize(plain.len(), None);
    }
    for set in sets {
        for &v in set.values {
            base.push(input(ring.add(v, offset)));
            for &t in set.ts {
                let x = if role == Role::Server {
                    ring.sub(v, t)
                } else {
                    v
                };
                z.push(ring.add(x, offset));
                share.push(Some((base.len() - 1, t.trailing_zeros())));
            }
        }
    }
    let mine: Vec<u64> = z.iter().map(|&v| input(v)).collect();
    let carry = greater_than_sharing_low(ot, ch, role, &base, &mine, &share, k)?;
    Ok(z.iter()
        .zip(carry)
        .map(|(&v, c)| (v >> k & 1 == 1) ^ c)
        .collect())
}
