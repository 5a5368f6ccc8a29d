//! Multiplication of shared values without Beaver triples (Gilboa / Cheetah style).
//!
//! A cross term a·b, a held by one party and b by the other, is Σ_k 2^k·b_k·a: one arithmetic COT
//! per bit b_k of b with correlation a. Bit k only needs a mod 2^(ℓ−k) (the factor 2^k kills the
//! rest), so every COT is sent at its own position's width: about ℓ²/2 bits per cross term
//! instead of ℓ². COTs go out in buckets of [`BUCKET_BITS`] positions (one call each).
//! * [`mul_values`]: x·y, both shared: two cross terms (one per direction, interleaved).
//! * [`square_values`]: x·x = x0² + x1² + 2·x0·x1: one cross term.
//! * [`mul_server_row`]: x·γ with γ known only to the server (LayerNorm's weights): one term.
//! * Narrow variants, when one operand has a promised small magnitude |a| < 2^(m−1):
//!   [`mul_narrow_values`], [`square_narrow_values`] re-share a in Z_(2^(m+1)) (SiRNN's
//!   mixed-width product: the known-zero sign bit makes the wrap w = ¬(n_0 ∧ n_1) of the
//!   parties' private top bits, and its product with the other operand one COT per direction
//!   in the same call as the cross terms, [`Wrap`]) so only m + 1 bits of a drive COTs; [`mul_server_row_narrow`] offsets a γ promised in
//!   [−2^(g−1), 2^(g−1)) to [0, 2^g). About (m+1)·(ℓ − m/2) bits per cross term instead of ℓ²/2.
//!
//! * [`mul_narrow_high_values`]: only a·b / 2^t mod 2^n (up to a small centred error): the
//!   sender rounds a COT's correlation to a multiple of 2^t, so every COT carries n bits
//!   instead of ℓ − k (a product and the truncation after it, fused; used by the 1-bit-error mode).
//!
//! Products are exact mod 2^ℓ (no truncation here; see [`crate::trunc`]); the narrow ones while
//! their promise holds.
//!
//! Flights: every product is one [`CotCall`] (three flights) per 2^22 COTs: the cross terms of
//! both directions and, for the narrow ones, the wrap term together.
//!
//! Security: semi-honest; the receiver of each COT learns x + b_k·a with x uniform (the wrap
//! term's COTs too: n_p·v_p is masked the same way).

use veil_core::{ensure, CostClass, Result, Ring, RingTensor};
use veil_net::{Channel, Role};
use veil_ot::OtSession;

use crate::two_way_cot::{low_mask, CotCall};

/// COTs per call at most: one call (three flights) carries every bit position of up to
/// 2^22 / bits elements (a narrow product over BERT-Base's 196,608 attention scores), and a
/// call's transient buffers stay near 200 MB however large the tensor.
const MAX_COTS_PER_CALL: usize = 1 << 22;

/// Bit-position buckets [k0, k1) covering the `bits` choice-bit positions 0..bits of `n`
/// elements: as few calls as [`MAX_COTS_PER_CALL`] allows, so a product costs
/// 3·⌈bits / ⌊2^22 / n⌋⌉ flights (3 for every product of up to 102k elements at ℓ = 41).
fn buckets(bits: u32, n: usize) -> impl Iterator<Item = (u32, u32)> {
    let per = (MAX_COTS_PER_CALL / n.max(1)).clamp(1, bits.max(1) as usize);
    (0..bits)
        .step_by(per)
        .map(move |k0| (k0, (k0 + per as u32).min(bits)))
}

/// What a cross term's COTs deliver: shares mod 2^n of Σ_k b_k·h_k(a) with h_k(a) =
/// round((a·2^k mod 2^ℓ) / 2^t), i.e. of a·b / 2^t + e with |e| ≤ (positions k < t with b_k
/// set) / 2: the high part of the product, computed without its low bits. Rounding (not
/// flooring) keeps the error centred, so the guard bits above it cover half as much. t = 0,
/// n = ℓ is the exact product mod 2^ℓ. Bit k ≥ t only needs a mod 2^(n−k+t), bit k < t a
/// correlation of n bits.
#[derive(Clone, Copy)]
pub(crate) struct Scale {
    pub(crate) ring: Ring,
    pub(crate) t: u32,
    pub(crate) n: u32,
}

impl Scale {
    pub(crate) fn exact(ring: Ring) -> Self {
        Scale {
            ring,
            t: 0,
            n: ring.bits(),
        }
    }

    /// COT width of bit position k (0: its term vanishes mod 2^n).
    fn width(&self, k: u32) -> u32 {
        self.n.saturating_sub(k.saturating_sub(self.t))
    }

    /// Positions below this one have a non-zero width.
    fn live_bits(&self, bits: u32) -> u32 {
        bits.min(self.t + self.n)
    }

    /// Correlation of bit k (reduced to its width by the caller).
    fn corr(&self, a: u64, k: u32) -> u64 {
        if k < self.t {
            self.round_high(self.ring.mul(a, 1u64 << k))
        } else {
            a
        }
    }

    /// round(v / 2^t) for a value v < 2^ℓ (t > 0).
    fn round_high(&self, v: u64) -> u64 {
        ((v as u128 + (1u128 << (self.t - 1))) >> self.t) as u64
    }

    /// Weight of bit k's COT output mod 2^n.
    fn weight(&self, k: u32) -> u64 {
        if k < self.t {
            1
        } else {
            1u64 << (k - self.t)
        }
    }

    /// round(v / 2^t) mod 2^n of a local ring value (v itself for t = 0).
    fn high(&self, v: u64) -> u64 {
        let h = if self.t == 0 { v } else { self.round_high(v) };
        h & low_mask(self.n)
    }

    fn add(&self, a: u64, b: u64) -> u64 {
        a.wrapping_add(b) & low_mask(self.n)
    }
}

/// Which directions a cross term's COTs run in.
#[derive(Clone, Copy)]
enum Cross {
    /// a_client·b_server + a_server·b_client: each party sends for its a and receives with its b.
    Both,
    /// a·b with the given party holding a (it sends) and the other b (it receives): one
    /// direction.
    OneWay(Role),
}

impl Cross {
    /// Whether this party (sends, receives) in the term.
    fn directions(self, role: Role) -> (bool, bool) {
        match self {
            Cross::Both => (true, true),
            Cross::OneWay(sender) => (role == sender, role != sender),
        }
    }
}

/// Adds bit positions k0..k1 of a cross term to `call`, element-major: the correlations
/// h_k(a_i) mod 2^width(k) this party sends and the choice bits b_i,k it receives with.
#[allow(clippy::too_many_arguments)]
fn push_cross(
    call: &mut CotCall,
    sc: Scale,
    (sends, recvs): (bool, bool),
    a: &[u64],
    b: &[u64],
    k0: u32,
    k1: u32,
) {
    if sends {
        for &ai in a {
            (k0..k1).for_each(|k| call.send(sc.corr(ai, k), sc.width(k)));
        }
    }
    if recvs {
        for &bi in b {
            (k0..k1).for_each(|k| call.recv(bi >> k & 1 == 1, sc.width(k)));
        }
    }
}

/// Adds Σ_k weight_k·(sign·v_{i,k}) into `acc` (mod 2^n).
fn accumulate(sc: Scale, acc: &mut [u64], v: &[u64], k0: u32, k1: u32, negate: bool) {
    let per = (k1 - k0) as usize;
    for (i, a) in acc.iter_mut().enumerate() {
        for (j, k) in (k0..k1).enumerate() {
            let t = v[i * per + j].wrapping_mul(sc.weight(k));
            *a = sc.add(*a, if negate { t.wrapping_neg() } else { t });
        }
    }
}

/// The outputs of the COTs an `extra` term added to a call: (x of its sends, y of its receives).
type ExtraOut = (Vec<u64>, Vec<u64>);

/// Shares (mod 2^n of `sc`) of a cross term in the directions `dir` (this party passes its a and
/// b; for a one-way term its one value as both); b's bits 0..`b_bits` drive the COTs (b <
/// 2^b_bits as an integer). `extra` adds the COTs of independent terms to the first call, ahead
/// of the cross term's, so they cost no flight of their own; their outputs come back beside the
/// shares. Three flights per call, one call per [`MAX_COTS_PER_CALL`].
#[allow(clippy::too_many_arguments)]
fn cross_term<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    sc: Scale,
    dir: Cross,
    (a, b): (&[u64], &[u64]),
    b_bits: u32,
    extra: impl FnOnce(&mut CotCall),
) -> Result<(Vec<u64>, ExtraOut)> {
    let n = a.len().max(b.len());
    let (sends, recvs) = dir.directions(role);
    let mut acc = vec![0u64; n];
    let mut extra = Some(extra);
    let mut extra_out = (Vec::new(), Vec::new());
    let mut ranges: Vec<(u32, u32)> = buckets(sc.live_bits(b_bits), n).collect();
    if ranges.is_empty() {
        // No live position: the call still carries the extra terms.
        ranges.push((0, 0));
    }
    for (k0, k1) in ranges {
        let mut call = CotCall::default();
        if let Some(f) = extra.take() {
            f(&mut call);
        }
        let (xs, ys) = call.len();
        push_cross(&mut call, sc, (sends, recvs), a, b, k0, k1);
        let (mut x, mut y) = call.run(ot, ch, role)?;
        if sends {
            accumulate(sc, &mut acc, &x[xs..], k0, k1, true);
        }
        if recvs {
            accumulate(sc, &mut acc, &y[ys..], k0, k1, false);
        }
        if xs + ys > 0 {
            x.truncate(xs);
            y.truncate(ys);
            extra_out = (x, y);
        }
    }
    Ok((acc, extra_out))
}

/// Shares (mod 2^n of `sc`) of a_client·b_server + a_server·b_client: this party passes its a and
/// b; b's bits 0..`b_bits` drive the COTs (b < 2^b_bits as an integer).
fn cross_both<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    sc: Scale,
    a: &[u64],
    b: &[u64],
    b_bits: u32,
) -> Result<Vec<u64>> {
    Ok(cross_term(ot, ch, role, sc, Cross::Both, (a, b), b_bits, |_| ())?.0)
}

/// Shares (mod 2^n of `sc`) of a·b where `sender` holds a and the other party holds b
/// (b < 2^b_bits as an integer); this party passes its value.
fn cross_one_way<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    sc: Scale,
    mine: &[u64],
    sender: Role,
    b_bits: u32,
) -> Result<Vec<u64>> {
    let dir = Cross::OneWay(sender);
    Ok(cross_term(ot, ch, role, sc, dir, (mine, mine), b_bits, |_| ())?.0)
}

/// Elementwise products need operands of equal length.
fn same_len(a: &[u64], b: &[u64]) -> Result<()> {
    ensure!(
        a.len() == b.len(),
        InvalidArgument,
        "mul: {} vs {} values",
        a.len(),
        b.len()
    );
    Ok(())
}

/// Shares of a·b mod 2^ℓ element-wise, on this party's raw shares.
pub(crate) fn mul_values<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    a: &[u64],
    b: &[u64],
) -> Result<Vec<u64>> {
    same_len(a, b)?;
    let _g = ch.meter().enter(CostClass::Mul);
    let mut z = cross_both(ot, ch, role, Scale::exact(ring), a, b, ring.bits())?;
    for (zi, (&x, &y)) in z.iter_mut().zip(a.iter().zip(b)) {
        *zi = ring.add(*zi, ring.mul(x, y));
    }
    Ok(z)
}

/// Shares of a² mod 2^ℓ element-wise: one cross term, half the traffic of [`mul_values`].
pub(crate) fn square_values<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    a: &[u64],
) -> Result<Vec<u64>> {
    let _g = ch.meter().enter(CostClass::Mul);
    let cross = cross_one_way(
        ot,
        ch,
        role,
        Scale::exact(ring),
        a,
        Role::Client,
        ring.bits(),
    )?;
    Ok(cross
        .iter()
        .zip(a)
        .map(|(&c, &x)| ring.add(ring.add(c, c), ring.mul(x, x)))
        .collect())
}

/// The promise on a narrow operand a: a' = a + bias lies in [0, 2^m), so a' is re-shared in
/// Z_(2^(m+1)) and drives m + 1 COTs per cross term instead of ℓ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Narrow {
    m: u32,
    signed: bool,
}

impl Narrow {
    /// |a| < 2^(m−1) (bias 2^(m−1)).
    pub fn signed(m: u32) -> Self {
        Narrow { m, signed: true }
    }

    /// 0 ≤ a < 2^m (no bias): one COT per cross term fewer than a signed promise of the same
    /// magnitude.
    pub fn unsigned(m: u32) -> Self {
        Narrow { m, signed: false }
    }

    /// Bits of a' (the share ring has one more).
    pub fn bits(&self) -> u32 {
        self.m
    }

    pub(crate) fn bias(&self) -> u64 {
        if self.signed {
            1u64 << (self.m - 1)
        } else {
            0
        }
    }
}

/// A shared value a under the promise `nw`, re-shared in Z_(2^(m+1)): a' = a + bias ∈ [0, 2^m)
/// (the server adds the bias), so a' = a'_0 + a'_1 − 2^(m+1)·w with the wrap w = msb(a'_0) ∨
/// msb(a'_1) (the top bit of a' is known to be 0), i.e. w = ¬(n_0 ∧ n_1) for each party's
/// private bit n = ¬msb(a'). No traffic: the wrap enters the products as a [`Wrap`] term.
/// Returns (this party's a', its n).
pub(crate) fn narrow_reshare(role: Role, a: &[u64], nw: Narrow) -> (Vec<u64>, Vec<bool>) {
    let (m, k) = (nw.m, nw.m + 1);
    let an: Vec<u64> = a
        .iter()
        .map(|&v| match role {
            Role::Client => v & low_mask(k),
            Role::Server => v.wrapping_add(nw.bias()) & low_mask(k),
        })
        .collect();
    let low = an.iter().map(|&v| v >> m & 1 == 0).collect();
    (an, low)
}

/// The wrap correction of a narrow re-sharing ([`narrow_reshare`]): shares of w·v·2^shift as far
/// as the bits below t + n of a [`Scale`] see them (v mod 2^bits, bits = t + n − shift), for
/// w = ¬(n_c ∧ n_s). As w·v = v − n_c·n_s·(v_c + v_s) and n_c·n_s·v_p is one arithmetic COT in
/// which party p sends n_p·v_p and the other chooses with its n, the term costs one `bits`-wide
/// COT per direction and no AND gate, and rides in the call of the product's cross terms.
#[derive(Clone, Copy)]
pub(crate) struct Wrap {
    bits: u32,
    shift: u32,
}

impl Wrap {
    /// None when the term vanishes mod 2^(t+n).
    pub(crate) fn new(sc: Scale, shift: u32) -> Option<Wrap> {
        let bits = (sc.t + sc.n).checked_sub(shift).filter(|&k| k > 0)?;
        Some(Wrap { bits, shift })
    }

    /// Adds the term's COTs: this party sends n·v and receives with n, element by element.
    pub(crate) fn push(&self, call: &mut CotCall, low: &[bool], v: &[u64]) {
        for (&n, &x) in low.iter().zip(v) {
            call.send(if n { x } else { 0 }, self.bits);
        }
        for &n in low {
            call.recv(n, self.bits);
        }
    }

    /// This party's share in `ring` from its v and its COT outputs x (sends) and y (receives):
    /// (v − (y − x)) mod 2^bits, times 2^shift.
    pub(crate) fn finish(&self, ring: Ring, v: &[u64], (x, y): &ExtraOut) -> Vec<u64> {
        let m = low_mask(self.bits);
        (0..v.len())
            .map(|i| {
                let s = v[i].wrapping_add(x[i]).wrapping_sub(y[i]) & m;
                ring.mul(s, pow2(ring, self.shift))
            })
            .collect()
    }
}

/// [`Wrap::finish`], or zeros when the term vanishes.
fn wrap_or_zero(wrap: Option<Wrap>, ring: Ring, v: &[u64], out: &ExtraOut) -> Vec<u64> {
    wrap.map_or_else(|| vec![0; v.len()], |w| w.finish(ring, v, out))
}

/// 2^e mod 2^ℓ (0 for e ≥ ℓ).
fn pow2(ring: Ring, e: u32) -> u64 {
    if e >= ring.bits() {
        0
    } else {
        1u64 << e
    }
}

fn check_narrow(ring: Ring, nw: Narrow) -> Result<()> {
    ensure!(
        (2..ring.bits() - 1).contains(&nw.m),
        InvalidArgument,
        "narrow width {} for a {}-bit ring",
        nw.m,
        ring.bits()
    );
    Ok(())
}

/// Shares of a·b mod 2^ℓ element-wise for a narrow a (promise `nw`) and any b (SiRNN's
/// mixed-width product): a' re-shared in Z_(2^(m+1)) as in the module doc, then a·b =
/// a'_0·b + a'_1·b − 2^(m+1)·w·b − bias·b: the cross terms are driven by the m + 1 bits of a'
/// instead of ℓ (≈ (m+1)·(ℓ − (m+1)/2) bits each instead of ℓ²/2), plus the wrap term's COT per
/// direction, all in one call. Exact when the promise holds; otherwise the result is not a·b.
/// Label "Mul".
pub(crate) fn mul_narrow_values<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    a: &[u64],
    nw: Narrow,
    b: &[u64],
) -> Result<Vec<u64>> {
    mul_narrow_scaled(ot, ch, role, Scale::exact(ring), a, nw, b)
}

/// [`mul_narrow_values`] delivering only the high part: shares mod 2^n (raw, in [0, 2^n)) of
/// a·b / 2^t + e with |e| ≤ min(m + 1, t) + 1 (each of the two local terms and each COT at a
/// position below t rounds off at most half a unit), for n + t ≤ ℓ. Every COT then carries n
/// bits instead of up to ℓ: a product followed by a truncation, fused, at an error of a few
/// units of 2^t (callers compute at a few guard bits below the wanted scale). Label "Mul".
#[allow(clippy::too_many_arguments)]
pub(crate) fn mul_narrow_high_values<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    a: &[u64],
    nw: Narrow,
    b: &[u64],
    t: u32,
    n: u32,
) -> Result<Vec<u64>> {
    check_high(ring, t, n)?;
    mul_narrow_scaled(ot, ch, role, Scale { ring, t, n }, a, nw, b)
}

fn check_high(ring: Ring, t: u32, n: u32) -> Result<()> {
    ensure!(
        n >= 1 && n + t <= ring.bits(),
        InvalidArgument,
        "high part of {n} bits above 2^{t} in a {}-bit ring",
        ring.bits()
    );
    Ok(())
}

fn mul_narrow_scaled<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    sc: Scale,
    a: &[u64],
    nw: Narrow,
    b: &[u64],
) -> Result<Vec<u64>> {
    let ring = sc.ring;
    check_narrow(ring, nw)?;
    same_len(a, b)?;
    let _g = ch.meter().enter(CostClass::Mul);
    let m = nw.m;
    let (an, low) = narrow_reshare(role, a, nw);
    let wrap = Wrap::new(sc, m + 1);
    let (cross, out) = cross_term(ot, ch, role, sc, Cross::Both, (b, &an), m + 1, |call| {
        if let Some(w) = wrap {
            w.push(call, &low, b)
        }
    })?;
    let wb = wrap_or_zero(wrap, ring, b, &out);
    Ok(narrow_product(sc, &an, nw, b, &wb, &cross, None))
}

/// This party's share of the high part of a·b = a'_c·b + a'_s·b − 2^(m+1)·w·b − bias·b: its own
/// a'·b − bias·b − (wrap term) plus `given` (an exact cross term it holds, mod 2^ℓ), rounded once
/// to the high part, plus its share `cross` of the COT cross terms (already high parts).
fn narrow_product(
    sc: Scale,
    an: &[u64],
    nw: Narrow,
    b: &[u64],
    wb: &[u64],
    cross: &[u64],
    given: Option<&[u64]>,
) -> Vec<u64> {
    let (ring, bias) = (sc.ring, nw.bias());
    (0..an.len())
        .map(|i| {
            let own = ring.sub(ring.mul(an[i], b[i]), ring.mul(bias, b[i]));
            let own = ring.add(own, given.map_or(0, |g| g[i]));
            sc.add(cross[i], sc.high(ring.sub(own, wb[i])))
        })
        .collect()
}

/// [`mul_narrow_high_values`] from a narrow re-sharing already taken ([`narrow_reshare`]: this
/// party's a' and its bit n = ¬msb(a')) with the cross term a'_client·b_server supplied by the
/// caller as shares mod 2^ℓ (`given`, e.g. from [`crate::he_rows`]): only a'_server·b_client runs
/// on COTs, the server's a' choosing, in one call with the wrap term (three flights). Shares
/// mod 2^n of a·b / 2^t + e with |e| ≤ ⌈min(m + 1, t)/2⌉ + 1 (one direction's COTs below t, one
/// rounding of each party's local part). Label "Mul".
#[allow(clippy::too_many_arguments)]
pub(crate) fn mul_narrow_high_given<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    sc: Scale,
    (an, low): (&[u64], &[bool]),
    nw: Narrow,
    b: &[u64],
    given: &[u64],
) -> Result<Vec<u64>> {
    let ring = sc.ring;
    check_narrow(ring, nw)?;
    check_high(ring, sc.t, sc.n)?;
    same_len(an, b)?;
    same_len(an, given)?;
    ensure!(
        low.len() == an.len(),
        InvalidArgument,
        "one wrap bit per value"
    );
    let _g = ch.meter().enter(CostClass::Mul);
    let m = nw.m;
    let wrap = Wrap::new(sc, m + 1);
    let mine = if role == Role::Client { b } else { an };
    let dir = Cross::OneWay(Role::Client);
    let (cross, out) = cross_term(ot, ch, role, sc, dir, (mine, mine), m + 1, |call| {
        if let Some(w) = wrap {
            w.push(call, low, b)
        }
    })?;
    let wb = wrap_or_zero(wrap, ring, b, &out);
    Ok(narrow_product(sc, an, nw, b, &wb, &cross, Some(given)))
}

/// Shares of a² mod 2^ℓ for a narrow a (promise `nw`): with s = a'_0 + a'_1 = a + c,
/// c = bias + 2^(m+1)·w, a² = s² − 2c·a − c² = s² − w·(2^(m+2)·a + 2^(2m+2) + 2^(m+2)·bias)
/// − 2·bias·a − bias²: one cross term on the m + 1 bits of a'_1 and the wrap term, in one call
/// (three flights). Label "Mul".
pub(crate) fn square_narrow_values<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    ring: Ring,
    a: &[u64],
    nw: Narrow,
) -> Result<Vec<u64>> {
    check_narrow(ring, nw)?;
    let _g = ch.meter().enter(CostClass::Mul);
    let (an, low) = narrow_reshare(role, a, nw);
    let sq = SquareWrap::new(role, ring, ring, nw)?;
    let v = sq.operand(a);
    let dir = Cross::OneWay(Role::Client);
    let (cross, out) = cross_term(
        ot,
        ch,
        role,
        Scale::exact(ring),
        dir,
        (&an, &an),
        nw.m + 1,
        |call| sq.push(call, &low, &v),
    )?;
    let own = sq.own_terms(a, &an, &sq.finish(&v, &out));
    Ok((0..a.len())
        .map(|i| ring.add(own[i], ring.add(cross[i], cross[i])))
        .collect())
}

/// Everything of a narrow square a² but its cross term 2·a'_c·a'_s, per element, as shares in
/// `ring`: a'² − w·2^(m+2)·(a + 2^m + bias) − 2·bias·a − bias², the wrap part a [`Wrap`] term.
/// The shares of a may live in a narrower ring `a_ring` while ring.bits() − m ≤ a_ring.bits()
/// (the terms see a only through 2^m·a and 2^(m+2)·a). Used by [`square_narrow_values`] and
/// LayerNorm's HE sum of squares, which supplies the cross term per row.
pub(crate) struct SquareWrap {
    role: Role,
    ring: Ring,
    a_ring: Ring,
    nw: Narrow,
    wrap: Option<Wrap>,
}

impl SquareWrap {
    pub(crate) fn new(role: Role, ring: Ring, a_ring: Ring, nw: Narrow) -> Result<Self> {
        ensure!(
            ring.bits() <= a_ring.bits() + nw.m,
            InvalidArgument,
            "a square in Z_2^{} of values shared in Z_2^{}",
            ring.bits(),
            a_ring.bits()
        );
        let wrap = Wrap::new(Scale::exact(ring), nw.m + 2);
        Ok(SquareWrap {
            role,
            ring,
            a_ring,
            nw,
            wrap,
        })
    }

    /// v with w·(2^(m+2)·a + 2^(2m+2) + 2^(m+2)·bias) = 2^(m+2)·w·v: v = a + 2^m + bias.
    pub(crate) fn operand(&self, a: &[u64]) -> Vec<u64> {
        let (m, bias, r) = (self.nw.m, self.nw.bias(), self.a_ring);
        a.iter()
            .map(|&x| match self.role {
                Role::Server => r.add(x, r.add(pow2(r, m), bias)),
                Role::Client => x,
            })
            .collect()
    }

    pub(crate) fn push(&self, call: &mut CotCall, low: &[bool], v: &[u64]) {
        if let Some(w) = self.wrap {
            w.push(call, low, v)
        }
    }

    /// Shares of 2^(m+2)·w·v from the call's outputs for [`SquareWrap::push`].
    pub(crate) fn finish(&self, v: &[u64], out: &ExtraOut) -> Vec<u64> {
        wrap_or_zero(self.wrap, self.ring, v, out)
    }

    /// The own terms from a, a' and the wrap part `wv`.
    pub(crate) fn own_terms(&self, a: &[u64], an: &[u64], wv: &[u64]) -> Vec<u64> {
        let (ring, bias) = (self.ring, self.nw.bias());
        (0..a.len())
            .map(|i| {
                let two_bias_a = ring.mul(a[i], ring.add(bias, bias));
                let mut r = ring.sub(ring.sub(ring.mul(an[i], an[i]), wv[i]), two_bias_a);
                if self.role == Role::Server {
                    r = ring.sub(r, ring.mul(bias, bias));
                }
                r
            })
            .collect()
    }

    /// The own terms with the wrap part in a call of its own (three flights), for callers with
    /// no COTs of their own to share it with.
    pub(crate) fn own_terms_alone<C: Channel>(
        &self,
        ot: &mut OtSession,
        ch: &mut C,
        (a, an, low): (&[u64], &[u64], &[bool]),
    ) -> Result<Vec<u64>> {
        let v = self.operand(a);
        let mut call = CotCall::default();
        self.push(&mut call, low, &v);
        let out = call.run(ot, ch, self.role)?;
        Ok(self.own_terms(a, an, &self.finish(&v, &out)))
    }
}

/// Shares of x·γ for x shared with shape [rows, n] and a row γ of n ring elements known only to the
/// server (`gamma` is `Some` on the server, `None` on the client); γ is broadcast over rows.
/// Label "Mul".
pub(crate) fn mul_server_row<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    x: &RingTensor,
    gamma: Option<&[u64]>,
) -> Result<RingTensor> {
    let z = server_row_product(ot, ch, role, x, gamma, None, Scale::exact(x.ring()))?;
    RingTensor::from_vec(x.ring(), x.shape(), z)
}

/// [`mul_server_row`] for a γ the server promises to keep in [−2^(g−1), 2^(g−1)) (signed, g a
/// public parameter): the server offsets it to γ' = γ + 2^(g−1) ∈ [0, 2^g), so x·γ = x·γ' −
/// 2^(g−1)·x and the cross term is driven by g bits instead of ℓ. Exact; a γ outside the bound
/// is an error on the server. Label "Mul".
pub(crate) fn mul_server_row_narrow<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    x: &RingTensor,
    gamma: Option<&[u64]>,
    g: u32,
) -> Result<RingTensor> {
    check_narrow(x.ring(), Narrow::signed(g))?;
    let z = server_row_product(ot, ch, role, x, gamma, Some(g), Scale::exact(x.ring()))?;
    RingTensor::from_vec(x.ring(), x.shape(), z)
}

/// [`mul_server_row_narrow`] delivering only the high part, as [`mul_narrow_high_values`]:
/// shares mod 2^n (raw, in [0, 2^n)) of x·γ / 2^t + e with |e| ≤ (min(g, t) + 2) / 2, for
/// n + t ≤ ℓ. Label "Mul".
#[allow(clippy::too_many_arguments)]
pub(crate) fn mul_server_row_high<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    x: &RingTensor,
    gamma: Option<&[u64]>,
    g: u32,
    t: u32,
    n: u32,
) -> Result<Vec<u64>> {
    let ring = x.ring();
    check_narrow(ring, Narrow::signed(g))?;
    check_high(ring, t, n)?;
    server_row_product(ot, ch, role, x, gamma, Some(g), Scale { ring, t, n })
}

fn server_row_product<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    x: &RingTensor,
    gamma: Option<&[u64]>,
    narrow: Option<u32>,
    sc: Scale,
) -> Result<Vec<u64>> {
    let _g = ch.meter().enter(CostClass::Mul);
    let ring = x.ring();
    let n = *x.shape().last().unwrap_or(&1);
    ensure!(
        n > 0 && x.len().is_multiple_of(n),
        InvalidArgument,
        "empty rows"
    );
    let offset = narrow.map_or(0, |g| 1u64 << (g - 1));
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
            if let Some(bits) = narrow {
                ensure!(
                    g.iter()
                        .all(|&v| (-(offset as i64)..offset as i64).contains(&ring.to_signed(v))),
                    InvalidArgument,
                    "γ outside the promised range ±2^{}",
                    bits - 1
                );
            }
            (0..x.len()).map(|i| ring.add(g[i % n], offset)).collect()
        }
        _ => veil_core::bail!(InvalidArgument, "exactly the server supplies γ"),
    };
    let bits = narrow.unwrap_or(ring.bits());
    let mut z = cross_one_way(ot, ch, role, sc, &mine, Role::Client, bits)?;
    for (i, zi) in z.iter_mut().enumerate() {
        let xi = x.data()[i];
        let mut own = ring.neg(ring.mul(xi, offset));
        if role == Role::Server {
            own = ring.add(own, ring.mul(xi, mine[i]));
        }
        *zi = sc.add(*zi, sc.high(own));
    }
    Ok(z)
}
