//! LayerNorm's two products of the deviations d on BFV ([`crate::he_rows`]), used in the
//! 1-bit-error mode when the context has HE keys: the client's narrow share of d is encrypted
//! once and serves both.
//!
//! With the narrow share a' = d + bias = a'_c + a'_s − 2^(m+1)·w (a'_i ∈ [0, 2^(m+1)), see
//! [`crate::mul`]) and the client's centred u = a'_c − 2^m:
//! * **Σ_j d_j² per row** in the wide ring Z_2^W: Σ(a'_c + a'_s)² needs the cross term
//!   Σ_j a'_c·a'_s = Σ u·v + 2^m·Σ(u + v) + n·2^2m (v = a'_s − 2^m). The server splits v into
//!   planes v = Σ_i 2^(b·i)·v_i; each Σ u·v_i is a per-row inner product on HE, exact mod 2^ℓ.
//!   The planes with W − b·i > ℓ have |v_i| ≤ 2^(b−1), chosen so that |Σ u·v_i| < 2^(ℓ−2), and
//!   are sign-extended to W bits (128 values per plane, not per element); the last plane is
//!   only needed mod 2^(W − b·i) ≤ 2^ℓ. The wrap terms stay a multiplexer per element, as in
//!   [`crate::mul::square_narrow_values`]. Exact, like the COT square it replaces.
//! * **d·r** (r one value per row): the cross term a'_c·r_s = u·r_s + 2^m·r_s is a row × scalar
//!   product on HE; a'_s·r_c stays one direction of COTs; fused with the truncation as
//!   [`Ctx::mul_narrow_trunc`] (result ⌊d·r / 2^s⌋ + c, c ∈ {−3, …, 2}).
//!
//! Security: semi-honest, compositions of [`crate::he_rows`] (flooded, re-masked HE responses), the
//! COT products and the extension protocol; every value either party receives is masked.

use veil_core::{ensure, Result, Ring};
use veil_net::Channel;

use crate::ctx::{Ctx, HeKeys};
use crate::he_rows::{client_open, server_open, RowsClient, RowsServer};
use crate::mul::{mul_narrow_high_given, narrow_reshare, Narrow, Scale, SquareWrap};

enum Side<'k> {
    Client(RowsClient<'k>),
    Server(RowsServer<'k>),
}

/// The narrow share of d and its encryption, opened once per LayerNorm call.
pub(crate) struct NormHe<'k> {
    /// This party's shares of d (ring), and of its narrow form.
    d: Vec<u64>,
    an: Vec<u64>,
    /// This party's bit n = ¬msb(a') of the narrow form (its wrap is ¬(n_c ∧ n_s)).
    low: Vec<bool>,
    nw: Narrow,
    cols: usize,
    /// The ring of the sums of squares (checked by [`open`]).
    wide: Ring,
    side: Side<'k>,
}

/// Shortest rows that go to HE. Its cost is per row: one packed inner product per plane (five
/// at (41, 13) with rows of 768). Its saving is per value (≈ 1,000 bits of the square, ≈ 500 of
/// d·r), so a BERT-Base row (768) gains and a BERT-Tiny row (128) does not: short rows stay on
/// COTs (the measured costs are in docs/BENCHMARKS.md, "Moved from code comments").
pub(crate) const HE_MIN_COLS: usize = 512;

/// Takes the narrow share of d (promise `nw`) and sends the client's encrypted centred share,
/// for sums of squares in the ring `wide`. `None` (nothing sent; the caller runs the COT path)
/// without HE keys, for rows shorter than [`HE_MIN_COLS`], for rows longer than N/2 (the stride
/// layout of [`crate::he_rows`] cannot hold them), and for formats too narrow for the planes
/// ([`plane_bits`]) or the wide ring (W − m > ℓ). All of it is public, so both parties decide
/// alike.
pub(crate) fn open<'k, C: Channel>(
    cx: &mut Ctx<'k, C>,
    d: &[u64],
    nw: Narrow,
    cols: usize,
    wide: Ring,
) -> Result<Option<NormHe<'k>>> {
    let Some(keys) = cx.he else {
        return Ok(None);
    };
    let (ring, m) = (cx.ring(), nw.bits());
    let fits = cols >= HE_MIN_COLS
        && 2 * cols <= keys.params().degree()
        && plane_bits(ring, m, cols).is_ok()
        && (ring.bits()..=ring.bits() + m).contains(&wide.bits());
    if !fits {
        return Ok(None);
    }
    ensure!(
        d.len().is_multiple_of(cols),
        InvalidArgument,
        "{} values in rows of {cols}",
        d.len()
    );
    let rows = d.len() / cols;
    let (an, low) = narrow_reshare(cx.role, d, nw);
    let centre = 1u64 << m;
    let side = match keys {
        HeKeys::Client(sk) => {
            let u: Vec<u64> = an.iter().map(|&a| ring.sub(a, centre)).collect();
            Side::Client(client_open(cx.ch, sk, &u, rows, cols)?)
        }
        HeKeys::Server(pk, gk) => Side::Server(server_open(cx.ch, pk, gk, rows, cols)?),
    };
    Ok(Some(NormHe {
        d: d.to_vec(),
        an,
        low,
        nw,
        cols,
        wide,
        side,
    }))
}

/// Plane width b: the largest with n·2^m·2^(b−1) < 2^(ℓ−2), so a plane's inner product can be
/// sign-extended; an error when even b = 1 (digits −1, 0) is too wide.
fn plane_bits(ring: Ring, m: u32, cols: usize) -> Result<u32> {
    let room = (ring.bits() - 2) as f64 - m as f64 - (cols as f64).log2();
    let b = (room.ceil() as i64).min(32);
    ensure!(
        b >= 1,
        InvalidArgument,
        "rows of {cols} too long for HE inner products of {m}-bit values in Z_2^{}",
        ring.bits()
    );
    Ok(b as u32)
}

/// v split into `ext` centred b-bit digits and the rest: v = Σ_i 2^(b·i)·v_i.
fn planes(v: i64, b: u32, ext: usize) -> Vec<i64> {
    let half = 1i64 << (b - 1);
    let mut rest = v;
    let mut out = Vec::with_capacity(ext + 1);
    for _ in 0..ext {
        let digit = (rest + half).rem_euclid(1 << b) - half;
        out.push(digit);
        rest = (rest - digit) >> b;
    }
    out.push(rest);
    out
}

impl NormHe<'_> {
    fn rows(&self) -> usize {
        self.an.len() / self.cols
    }

    /// Shares mod 2^W of Σ_j d_j² per row, W the wide ring given to [`open`] (module docs).
    pub(crate) fn square_sums<C: Channel>(&self, cx: &mut Ctx<C>) -> Result<Vec<u64>> {
        let (ring, wide) = (cx.ring(), self.wide);
        let (m, cols, rows) = (self.nw.bits(), self.cols, self.rows());
        let wb = wide.bits();
        let b = plane_bits(ring, m, cols)?;
        // Planes whose weight 2^(b·i) leaves more than ℓ bits of W need the extension.
        let ext = (0..)
            .take_while(|&i| wb - (b * i).min(wb) > ring.bits())
            .count();
        let centre = 1u64 << m;
        let sums = match &self.side {
            Side::Client(c) => c.inner_products(cx.ch, ext + 1)?,
            Side::Server(s) => {
                let mut vs = vec![vec![0i64; self.an.len()]; ext + 1];
                for (j, &a) in self.an.iter().enumerate() {
                    for (plane, v) in vs.iter_mut().zip(planes(a as i64 - centre as i64, b, ext)) {
                        plane[j] = v;
                    }
                }
                let bound = (1u64 << (m + 1).saturating_sub(b * ext as u32)) + 1;
                s.inner_products(cx.ch, &vs, bound.max(1 << (b - 1)))?
            }
        };
        let low: Vec<u64> = sums[..ext].concat();
        let extended = cx.extend_to(ring, wide, &low)?;
        // Σ u·v = Σ_i 2^(b·i)·P_i in Z_2^W.
        let mut cross = vec![0u64; rows];
        for (i, plane) in extended.chunks(rows).chain([&sums[ext][..]]).enumerate() {
            let weight = wide.reduce(1u64.checked_shl(b * i as u32).unwrap_or(0));
            for (c, &p) in cross.iter_mut().zip(plane) {
                *c = wide.add(*c, wide.mul(p, weight));
            }
        }
        // a² = 2·a'_c·a'_s + everything else (per element); 2·a'_c·a'_s summed per row is
        // 2·(Σ u·v + 2^m·Σ(u + v) + n·2^2m).
        let own = SquareWrap::new(cx.role, wide, ring, self.nw)?.own_terms_alone(
            cx.ot,
            cx.ch,
            (&self.d, &self.an, &self.low),
        )?;
        let server = cx.is_server();
        Ok((0..rows)
            .map(|r| {
                let span = r * cols..(r + 1) * cols;
                let mut sum = wide.mul(2, cross[r]);
                for (&o, &a) in own[span.clone()].iter().zip(&self.an[span]) {
                    sum = wide.add(sum, o);
                    sum = wide.add(sum, wide.mul(2 * centre, wide.sub(a, centre)));
                }
                if server {
                    sum = wide.add(sum, wide.mul(2 * cols as u64, wide.mul(centre, centre)));
                }
                sum
            })
            .collect())
    }

    /// ⌊d·r / 2^s⌋ + c, c ∈ {−3, …, 2}, for r one value per row (shares), |d·r| < 2^(ℓ−2) and
    /// |d·r| / 2^s < 2^(out−1) − 2, as [`Ctx::mul_narrow_trunc`]; the faithful mode (or too
    /// small an s) runs that instead.
    pub(crate) fn mul_rows_trunc<C: Channel>(
        &self,
        cx: &mut Ctx<C>,
        r: &[u64],
        s: u32,
        out: u32,
    ) -> Result<Vec<u64>> {
        let cols = self.cols;
        ensure!(
            r.len() == self.rows(),
            InvalidArgument,
            "{} row scalars for {} rows",
            r.len(),
            self.rows()
        );
        let r_b: Vec<u64> = (0..self.an.len()).map(|i| r[i / cols]).collect();
        let m = self.nw.bits();
        cx.fused_trunc(
            s,
            out,
            (m + 1).min(s).div_ceil(2) + 1,
            |cx| {
                let p = cx.mul_narrow(&self.d, self.nw, &r_b)?;
                cx.trunc(&p, s)
            },
            |cx, t, n| {
                let ring = cx.ring();
                // u·r_s on HE; a'_c·r_s = u·r_s + 2^m·r_s (the server adds the second term).
                let given = match &self.side {
                    Side::Client(c) => c.row_scaled(cx.ch)?,
                    Side::Server(sv) => {
                        let centre = 1u64 << m;
                        let g = sv.row_scaled(cx.ch, r)?;
                        g.iter()
                            .zip(&r_b)
                            .map(|(&x, &rb)| ring.add(x, ring.mul(centre, rb)))
                            .collect()
                    }
                };
                mul_narrow_high_given(
                    cx.ot,
                    cx.ch,
                    cx.role,
                    Scale { ring, t, n },
                    (&self.an, &self.low),
                    self.nw,
                    &r_b,
                    &given,
                )
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planes_recompose_with_bounded_digits() {
        for &v in &[
            0i64,
            1,
            -1,
            31,
            32,
            -32,
            -33,
            (1 << 24) - 1,
            -(1 << 24),
            123_456_789 % (1 << 24),
        ] {
            for (b, ext) in [(6u32, 3usize), (5, 4), (8, 0)] {
                let p = planes(v, b, ext);
                assert_eq!(p.len(), ext + 1);
                let back: i64 = p
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| d << (b * i as u32))
                    .sum();
                assert_eq!(back, v, "v {v} b {b}");
                assert!(p[..ext]
                    .iter()
                    .all(|&d| (-(1 << (b - 1))..(1 << (b - 1))).contains(&d)));
            }
        }
    }

    #[test]
    fn plane_width_keeps_inner_products_extendable() {
        let ring = Ring::new(41).unwrap();
        for cols in [1usize, 2, 100, 768, 1024, 3000, 4096] {
            // LayerNorm's narrow d at (41, 13): LAYER_NORM_DEV_BITS + f + 1 bits.
            let m = veil_core::approx::LAYER_NORM_DEV_BITS + 13 + 1;
            let b = plane_bits(ring, m, cols).unwrap();
            let worst = cols as f64 * 2f64.powi(m as i32) * 2f64.powi(b as i32 - 1);
            assert!(worst < 2f64.powi(39), "cols {cols}: b {b}");
            assert!(
                cols as f64 * 2f64.powi(m as i32) * 2f64.powi(b as i32) >= 2f64.powi(39) || b == 32
            );
        }
    }
}
