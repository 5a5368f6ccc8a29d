//! Multiplication of shared values without Beaver triples (Gilboa / Cheetah style).
//!
//! A cross term a·b, a held by one party and b by the other, is Σ_k 2^k·b_k·a: one arithmetic COT
//! per bit b_k of b with correlation a. Bit k only needs a mod 2^(ℓ−k) (the factor 2^k kills the
//! rest), so COTs are grouped in buckets of [`BUCKET_BITS`] bit positions, each bucket sent at the
//! width of its lowest position: about ℓ²/2 + ℓ·BUCKET_BITS/2 bits per cross term instead of ℓ².
//! * [`mul`]: x·y, both shared: two cross terms (one per direction, interleaved).
//! * [`square`]: x·x = x0² + x1² + 2·x0·x1: one cross term.
//! * [`mul_server_row`]: x·γ with γ known only to the server (LayerNorm's weights): one term.
//!
//! Products are exact mod 2^ℓ (no truncation here; see [`crate::trunc`]).
//!
//! Security: semi-honest; the receiver of each COT learns x + b_k·a with x uniform.

use veil_core::{ensure, Result, Ring, RingTensor};
use veil_net::{Channel, Role};
use veil_ot::OtSession;

use crate::exchange::{arith_cot_both, low_mask};
use crate::trunc::TruncMode;

/// Bit positions per COT call: 8 keeps the width overhead small and the calls few (ℓ/8 rounds).
pub const BUCKET_BITS: u32 = 8;

/// Bit-position buckets [k0, k1) covering 0..ℓ.
fn buckets(l: u32) -> impl Iterator<Item = (u32, u32)> {
    (0..l)
        .step_by(BUCKET_BITS as usize)
        .map(move |k0| (k0, (k0 + BUCKET_BITS).min(l)))
}

/// COT inputs of one bucket: correlations a mod 2^(ℓ−k0) and choice bits b_k, element-major.
fn bucket_inputs(a: &[u64], b: &[u64], k0: u32, k1: u32, width: u32) -> (Vec<u64>, Vec<bool>) {
    let per = (k1 - k0) as usize;
    let mut deltas = Vec::with_capacity(a.len() * per);
    let mut choices = Vec::with_capacity(b.len() * per);
    for &ai in a {
        deltas.extend(std::iter::repeat_n(ai & low_mask(width), per));
    }
    for &bi in b {
        choices.extend((k0..k1).map(|k| bi >> k & 1 == 1));
    }
    (deltas, choices)
}

/// Adds Σ_k 2^k·(sign·v_{i,k}) into `acc`.
fn accumulate(ring: Ring, acc: &mut [u64], v: &[u64], k0: u32, k1: u32, negate: bool) {
    let per = (k1 - k0) as usize;
    for (i, a) in acc.iter_mut().enumerate() {
        for (j, k) in (k0..k1).enumerate() {
            let t = ring.mul(v[i * per + j], 1u64 << k);
            *a = if negate {
                ring.sub(*a, t)
            } else {
                ring.add(*a, t)
            };
        }
    }
}

/// Shares of a_client·b_server + a_server·b_client: this party passes its a and b.
fn cross_both<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    a: &[u64],
    b: &[u64],
) -> Result<Vec<u64>> {
    let l = ring.bits();
    let mut acc = vec![0u64; a.len()];
    for (k0, k1) in buckets(l) {
        let width = l - k0;
        let (deltas, choices) = bucket_inputs(a, b, k0, k1, width);
        let (x, y) = arith_cot_both(ot, ch, role, &deltas, &choices, width)?;
        accumulate(ring, &mut acc, &x, k0, k1, true);
        accumulate(ring, &mut acc, &y, k0, k1, false);
    }
    Ok(acc)
}

/// Shares of a·b where `sender` holds a and the other party holds b; this party passes its value.
fn cross_one_way<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    mine: &[u64],
    sender: Role,
) -> Result<Vec<u64>> {
    let l = ring.bits();
    let mut acc = vec![0u64; mine.len()];
    for (k0, k1) in buckets(l) {
        let width = l - k0;
        if role == sender {
            let (deltas, _) = bucket_inputs(mine, &[], k0, k1, width);
            let x = ot.send_arith_cot(ch, &deltas, width)?;
            accumulate(ring, &mut acc, &x, k0, k1, true);
        } else {
            let (_, choices) = bucket_inputs(&[], mine, k0, k1, width);
            let y = ot.recv_arith_cot(ch, &choices, width)?;
            accumulate(ring, &mut acc, &y, k0, k1, false);
        }
    }
    Ok(acc)
}

fn check_same(x: &RingTensor, y: &RingTensor) -> Result<()> {
    ensure!(
        x.ring() == y.ring() && x.shape() == y.shape(),
        InvalidArgument,
        "multiplication operands {:?} and {:?} differ",
        x.shape(),
        y.shape()
    );
    Ok(())
}

/// Shares of a·b mod 2^ℓ element-wise, on this party's raw shares.
pub fn mul_values<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    a: &[u64],
    b: &[u64],
) -> Result<Vec<u64>> {
    ensure!(
        a.len() == b.len(),
        InvalidArgument,
        "mul: {} vs {} values",
        a.len(),
        b.len()
    );
    let _g = ch.meter().enter("Mul");
    let mut z = cross_both(ot, ch, role, ring, a, b)?;
    for (zi, (&x, &y)) in z.iter_mut().zip(a.iter().zip(b)) {
        *zi = ring.add(*zi, ring.mul(x, y));
    }
    Ok(z)
}

/// Shares of a² mod 2^ℓ element-wise: one cross term, half the traffic of [`mul_values`].
pub fn square_values<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    a: &[u64],
) -> Result<Vec<u64>> {
    let _g = ch.meter().enter("Mul");
    let cross = cross_one_way(ot, ch, role, ring, a, Role::Client)?;
    Ok(cross
        .iter()
        .zip(a)
        .map(|(&c, &x)| ring.add(ring.add(c, c), ring.mul(x, x)))
        .collect())
}

/// Shares of x·y mod 2^ℓ (element-wise). Label "Mul".
pub fn mul<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    x: &RingTensor,
    y: &RingTensor,
) -> Result<RingTensor> {
    check_same(x, y)?;
    let z = mul_values(ot, ch, role, x.ring(), x.data(), y.data())?;
    RingTensor::from_vec(x.ring(), x.shape(), z)
}

/// Shares of x² mod 2^ℓ. Label "Mul".
pub fn square<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    x: &RingTensor,
) -> Result<RingTensor> {
    let z = square_values(ot, ch, role, x.ring(), x.data())?;
    RingTensor::from_vec(x.ring(), x.shape(), z)
}

/// Shares of x·γ for x shared with shape [rows, n] and a row γ of n ring elements known only to the
/// server (`gamma` is `Some` on the server, `None` on the client); γ is broadcast over rows.
/// Label "Mul".
pub fn mul_server_row<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    x: &RingTensor,
    gamma: Option<&[u64]>,
) -> Result<RingTensor> {
    let _g = ch.meter().enter("Mul");
    let ring = x.ring();
    let n = *x.shape().last().unwrap_or(&1);
    ensure!(
        n > 0 && x.len().is_multiple_of(n),
        InvalidArgument,
        "empty rows"
    );
    let mine: Vec<u64> = match (role, gamma) {
        (Role::Client, None) => x.data().to_vec(),
        (Role::Server, Some(g)) => {
            ensure!(
                g.len() == n,
                InvalidArgument,
                "γ of length {} for rows of {n}",
                g.len()
            );
            ensure!(
                g.iter().all(|&v| ring.contains(v)),
                InvalidArgument,
                "γ outside the ring"
            );
            (0..x.len()).map(|i| g[i % n]).collect()
        }
        _ => veil_core::bail!(InvalidArgument, "exactly the server supplies γ"),
    };
    let mut z = cross_one_way(ot, ch, role, ring, &mine, Role::Client)?;
    if role == Role::Server {
        for (i, zi) in z.iter_mut().enumerate() {
            *zi = ring.add(*zi, ring.mul(x.data()[i], mine[i]));
        }
    }
    RingTensor::from_vec(ring, x.shape(), z)
}

/// ⌊x·y / 2^s⌋: [`mul`] then a truncation (assumes |x·y| < 2^(ℓ−2) as integers).
pub fn mul_trunc<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    x: &RingTensor,
    y: &RingTensor,
    s: u32,
    mode: TruncMode,
) -> Result<RingTensor> {
    let p = mul(ot, ch, role, x, y)?;
    crate::trunc::truncate(ot, ch, role, &p, s, mode)
}
