//! The one definition of Veil's fixed-point non-linear arithmetic.
//!
//! The two-party protocols (crate `veil-nonlinear`) and the single-process fixed-point simulator
//! (crate `veil-model`) must compute *the same integers*. This module is that definition: pure
//! functions on ring elements (`u64` values reduced mod 2^ℓ, read as two's-complement fixed point
//! with f fractional bits). Every step is one the protocols can do on shares: local additions and
//! multiplications by public constants, a secret product followed by a truncation, a comparison
//! (DReLU) followed by a selection, or a selection of public constants by a one-hot vector of
//! comparison bits. The protocols reproduce these functions exactly when they use the faithful
//! truncation, and within a stated few ulps when they use a cheaper truncation.
//!
//! # API
//! ```
//! use veil_core::{approx::Approx, FixedPoint};
//! let fp = FixedPoint::default_format();          // ℓ = 41, f = 13
//! let ax = Approx::new(fp).unwrap();              // checks the format has the head-room needed
//! let y = ax.gelu(fp.encode(0.5));
//! assert!((fp.decode(y) - 0.3457).abs() < 1e-3);
//! ```
//! Element-wise: [`Approx::trunc`], [`Approx::mul_trunc`], [`Approx::relu`], [`Approx::exp_neg`],
//! [`Approx::recip`], [`Approx::rsqrt`], [`Approx::tanh`], [`Approx::gelu`].
//! Row-wise (one row of a row-major matrix): [`Approx::softmax_row`],
//! [`Approx::relu_normalise_row`], [`Approx::layer_norm_row`], [`Approx::centre_affine_row`],
//! [`Approx::mean_of_sum`]. The f64 definitions they approximate are in [`reference`]. The
//! decoders' SiLU and RMSNorm are in [`decoder`].
//!
//! # Semantics shared by all functions
//! * **Truncation** by s bits is the arithmetic shift of the signed value: ⌊x / 2^s⌋ (floor, not
//!   round). `mul_trunc(a, b) = ⌊(a·b mod 2^ℓ) / 2^f⌋`.
//! * Errors below are measured by the tests at the bottom of this file, sweeping each domain at
//!   the default format (ℓ, f) = (41, 13); 1 ulp = 2^-13 ≈ 1.22e-4.
//! * Outside a stated domain the functions still return the same integers as the protocols (the
//!   formulas are identical), but those integers carry no accuracy promise — except where a
//!   protocol uses a narrow (mixed-width) product whose promise is the domain itself: exp_neg
//!   for x > 0, ReLU-normalise for Σ ReLU + ε ≥ 2^(norm_bits − f) (2048), LayerNorm for
//!   |x − mean| ≥ 2^LAYER_NORM_DEV_BITS (2048). There the protocols' outputs are unspecified.
//!   GELU, Softmax, tanh and centre-affine match for every input.

use crate::{ensure, FixedPoint, Result, Ring};

/// SiLU and RMSNorm, the decoders' additions (their error bounds are re-exported here).
pub mod decoder;
pub use decoder::{HARD_SWISH_EXTRA_BITS, HARD_SWISH_MAX_ERROR, RMS_NORM_ERROR, SILU_MAX_ERROR};

/// exp(x) for x below −EXP_CLAMP is computed as exp(−EXP_CLAMP) ≈ 1.1e-7, which encodes as 0.
pub const EXP_CLAMP: i64 = 16;
/// exp works at f + EXP_SQUARINGS fractional bits and squares that many times.
pub const EXP_SQUARINGS: u32 = 5;
/// exp's quadratic p(t) = 1 + t + (EXP_QUAD_NUM / 2^EXP_QUAD_SHIFT)·t² on t ∈ [−1/2, 0]: 31/64
/// instead of Taylor's 1/2 balances the error left after the 2^5-th power (1.79 vs 2.48 ulp),
/// and 31·t² still fits the truncation head-room (needs ℓ ≥ 2f + 15).
pub const EXP_QUAD_NUM: u64 = 31;
/// The power of two under [`EXP_QUAD_NUM`]: the quadratic's coefficient is a shift, not a division.
pub const EXP_QUAD_SHIFT: u32 = 6;
/// Reciprocal and rsqrt iterate at f + RECIP_EXTRA_BITS fractional bits.
pub const RECIP_EXTRA_BITS: u32 = 2;
/// Pieces per octave of rsqrt's piecewise-quadratic approximation ([`Approx::rsqrt_piece`]):
/// their thresholds join the class comparisons in one batch (one comparison per piece and row,
/// a few hundred bytes per row), and J = 8 geometric pieces leave a relative error of about
/// 6e-6 with no Newton step (a quadratic's near-minimax error ≈ (15/8)·(ln 2 / J)³ / 192; a
/// linear piece would leave 3.5e-4, too much for LayerNorm's bound).
pub const RSQRT_PIECES: u32 = 8;
/// The public constants of one rsqrt piece, (M_c, P, Q, R, b) ([`Approx::rsqrt_piece`]).
pub type RsqrtPiece = (u64, u64, u64, u64, u32);
/// The private pass promises |x| < 2^RELU_DOMAIN_BITS (8192) for every ReLU input (the GELU
/// substitute's FFN activations and ReLU-normalise's scores, including the client's padding-key
/// offset of −4096): its comparisons then run on f + 13 bits instead of ℓ − 1, and [`Approx::relu`]
/// is what the protocol computes only inside this domain (the simulator counts inputs outside it).
pub const RELU_DOMAIN_BITS: u32 = 13;
/// Extra bits of the 1/n constant in [`Approx::mean_of_sum`].
pub const MEAN_EXTRA_BITS: u32 = 3;
/// GELU constants of the tanh form: 0.5·x·(1 + tanh(√(2/π)(x + 0.044715·x³))).
pub const GELU_CUBIC: f64 = 0.044715;
/// |x| up to which [`Approx::gelu`] is accurate: every representable value (ReLU is exact and
/// the correction φ vanishes beyond [`GELU_TAIL`]).
pub const GELU_DOMAIN: f64 = f64::INFINITY;
/// Max |approx::gelu − reference::gelu| measured by the sweep test at (41, 13).
pub const GELU_MAX_ERROR: f64 = 1.6e-4;
/// φ(a) = a − GELU(a) (a ≥ 0) is taken as 0 from a = GELU_TAIL on (φ(4.25) = 2.0e-5).
pub const GELU_TAIL: f64 = 4.25;
/// (start, [C_0, C_1, C_2, C_3]): φ(a) ≈ C_0 + C_1·a + C_2·a² + C_3·a³ on [start, next start)
/// (the last segment ends at GELU_TAIL); weighted least-squares (Lawson) minimax fits, max fit
/// errors 5.4e-5, 4.4e-5, 3.2e-5, 2.5e-5, 6.3e-5.
pub const GELU_SEGMENTS: [(f64, [f64; 4]); 5] = [
    (0.0, [-0.000053490, 0.502963073, -0.424678980, 0.072645321]),
    (0.6, [-0.000720468, 0.520871493, -0.480092281, 0.118792904]),
    (1.35, [0.203202711, 0.073767647, -0.150561295, 0.037132580]),
    (1.95, [0.566448362, -0.490643247, 0.143124396, -0.014033700]),
    (2.9, [0.254019511, -0.193328734, 0.049116993, -0.004163203]),
];
/// Width of the narrow ring GELU's polynomial runs in: a_c·a2 < 2^33 needs head-room 2^(k−2).
pub const GELU_RING_BITS: u32 = 35;
/// The segment comparisons are on a_c − t_j, |a_c − t_j| < 2^GELU_CMP_BITS (A·2^f < 2^16).
pub const GELU_CMP_BITS: u32 = 16;
/// Extra fractional bits of GELU's polynomial coefficients (V is at f + this many bits).
pub const GELU_COEF_FRAC: u32 = 22;

/// The most segments a [`SplitSpec`] may have.
pub const SPLIT_MAX_SEGMENTS: usize = 8;

/// An odd split g(x) = ReLU(x) − φ(|x|) whose correction φ is a cubic on each segment of
/// [0, tail) and 0 from `tail` on ([`Approx::odd_split`]): GELU ([`GELU_SPLIT`]) and SiLU
/// ([`decoder::SILU_SPLIT`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SplitSpec {
    /// A: φ is taken as 0 from here on.
    pub tail: f64,
    /// (start, [C_0, C_1, C_2, C_3]): φ(a) ≈ C_0 + C_1·a + C_2·a² + C_3·a³ on [start, next
    /// start) (the last segment ends at `tail`); the first starts at 0.
    pub segments: &'static [(f64, [f64; 4])],
    /// Width k of the narrow ring the polynomials run in: needs A³·2^(2f) < 2^(k−2) (the product
    /// a_c·a2) and max |φ|·2^(f + coef_frac) < 2^(k−2) (the value V before its rounding; with
    /// f + coef_frac ≤ k that holds for |φ| < 1/4, and for SiLU's 0.279 at k = f + coef_frac + 1).
    pub ring_bits: u32,
    /// The segment comparisons are on a_c − t_j: needs A·2^f < 2^cmp_bits.
    pub cmp_bits: u32,
    /// Extra fractional bits of the coefficients (V is at f + this many bits).
    pub coef_frac: u32,
}

/// GELU's split (see [`Approx::gelu`]).
pub const GELU_SPLIT: SplitSpec = SplitSpec {
    tail: GELU_TAIL,
    segments: &GELU_SEGMENTS,
    ring_bits: GELU_RING_BITS,
    cmp_bits: GELU_CMP_BITS,
    coef_frac: GELU_COEF_FRAC,
};

/// Public constants of an odd split's piecewise polynomial at a format (see
/// [`Approx::odd_split`]), ring elements of the narrow ring except `tail` (full ring).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitPlan {
    /// The narrow ring (2^ring_bits) the polynomials run in, cheaper than the full one.
    pub ring: Ring,
    /// A = tail at f bits.
    pub tail: u64,
    /// Number of segments s; `breaks[..s − 1]` and `coef[..s]` are used.
    pub segs: usize,
    /// t_1 … t_(s−1) at f bits.
    pub breaks: [u64; SPLIT_MAX_SEGMENTS - 1],
    /// C_(j,0) at 2f + coef_frac bits, C_(j,1..3) at coef_frac bits.
    pub coef: [[u64; 4]; SPLIT_MAX_SEGMENTS],
    /// [`SplitSpec::cmp_bits`].
    pub cmp_bits: u32,
    /// [`SplitSpec::coef_frac`].
    pub coef_frac: u32,
}

/// GELU's plan (the name it had before SiLU shared it).
pub type GeluPlan = SplitPlan;

impl SplitPlan {
    /// The used breakpoints t_1 … t_(s−1).
    pub fn breaks(&self) -> &[u64] {
        &self.breaks[..self.segs - 1]
    }

    /// P_j(a) = C_0 + C_1·a + C_2·a2 + C_3·a3 in the narrow ring (powers at f bits).
    pub fn poly(&self, j: usize, a: u64, a2: u64, a3: u64) -> u64 {
        let k = self.ring;
        let c = &self.coef[j];
        [(c[1], a), (c[2], a2), (c[3], a3)]
            .iter()
            .fold(c[0], |acc, &(ci, p)| k.add(acc, k.mul(ci, p)))
    }
}

/// ⌊x / 2^s⌋ on the signed view of the ring `ring`.
pub fn trunc_in(ring: Ring, x: u64, s: u32) -> u64 {
    ring.from_signed(ring.to_signed(x) >> s)
}

/// What the DReLU protocol with the promise |x| < 2^k computes for any x: bit k of x + 2^k
/// (= [x ≥ 0] when the promise holds; k = ℓ − 1 is the sign bit itself).
pub fn drelu_bounded(ring: Ring, x: u64, k: u32) -> bool {
    ring.add(x, 1u64 << k) >> k & 1 == 1
}

/// The fixed-point format plus the derived parameters every function needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Approx {
    /// The ring and fractional bits every input and output is encoded at.
    pub fp: FixedPoint,
    /// Fractional bits inside exp: f + EXP_SQUARINGS.
    exp_frac: u32,
    /// Fractional bits of the normalised reciprocal and rsqrt: f + RECIP_EXTRA_BITS.
    newton_frac: u32,
    /// Reciprocal and rsqrt accept raw inputs in [1, 2^norm_bits).
    norm_bits: u32,
}

impl Approx {
    /// Validates that the format leaves the head-room the algorithms need (ℓ ≥ 2f + 15; at f = 13
    /// that is the paper's ℓ = 41).
    pub fn new(fp: FixedPoint) -> Result<Self> {
        let l = fp.ring.bits();
        let f = fp.frac_bits();
        let exp_frac = f + EXP_SQUARINGS;
        let newton_frac = f + RECIP_EXTRA_BITS;
        ensure!(
            2 * exp_frac + 2 <= l && 2 * f + 15 <= l,
            Unsupported,
            "approx needs l >= 2f + 15 (exp squares values of f+{} fractional bits and scales \
             t² by {EXP_QUAD_NUM}); got l={l}, f={f}",
            EXP_SQUARINGS
        );
        ensure!(
            l >= 3 * f,
            Unsupported,
            "approx needs l >= 3f for the wide reciprocal; got l={l}, f={f}"
        );
        // Products y·g in recip must stay below 2^(l-2): y < 2^(newton_frac+1), g < 2^norm_bits.
        let norm_bits = l - 2 - newton_frac;
        Ok(Approx {
            fp,
            exp_frac,
            newton_frac,
            norm_bits,
        })
    }

    fn s(&self, x: u64) -> i64 {
        self.fp.ring.to_signed(x)
    }
    fn u(&self, x: i64) -> u64 {
        self.fp.ring.from_signed(x)
    }
    fn one(&self) -> i64 {
        1i64 << self.fp.frac_bits()
    }

    /// Fractional bits F of the normalised reciprocal and rsqrt (protocols need it to reproduce
    /// them).
    pub fn newton_frac(&self) -> u32 {
        self.newton_frac
    }
    /// Fractional bits inside exp.
    pub fn exp_frac(&self) -> u32 {
        self.exp_frac
    }
    /// Reciprocal and rsqrt are accurate for raw inputs in [1, 2^norm_bits) (at (41,13): values in
    /// [2^-13, 2048)). They normalise by comparing against 2^1 … 2^(norm_bits−1).
    pub fn norm_bits(&self) -> u32 {
        self.norm_bits
    }

    /// Bits k of the raw bound |x| < 2^k promised for ReLU inputs ([`RELU_DOMAIN_BITS`] above
    /// the fraction, at most the whole ring).
    pub fn relu_bound_bits(&self) -> u32 {
        (self.fp.frac_bits() + RELU_DOMAIN_BITS).min(self.fp.ring.bits() - 1)
    }

    /// ⌊x / 2^s⌋ on the signed view.
    pub fn trunc(&self, x: u64, s: u32) -> u64 {
        self.u(self.s(x) >> s)
    }

    /// ⌊(x + 2^(s−1)) / 2^s⌋: rounding to nearest, a truncation after a public constant is added
    /// (free on shares).
    pub fn round(&self, x: u64, s: u32) -> u64 {
        self.trunc(self.fp.ring.add(x, 1u64 << (s - 1)), s)
    }

    /// ⌊(a·b + 2^(s−1)) / 2^s⌋: product rounded to nearest.
    pub fn mul_round_by(&self, a: u64, b: u64, s: u32) -> u64 {
        self.round(self.fp.ring.mul(a, b), s)
    }

    /// ⌊(a·b mod 2^ℓ) / 2^s⌋: the product of two fixed-point values followed by a truncation.
    pub fn mul_trunc_by(&self, a: u64, b: u64, s: u32) -> u64 {
        self.trunc(self.fp.ring.mul(a, b), s)
    }

    /// Fixed-point product: ⌊(a·b mod 2^ℓ) / 2^f⌋. Exact up to the floor (error < 1 ulp) while
    /// |a·b| < 2^(ℓ−1−2f) in real terms (|a·b| < 16384 at (41,13)).
    pub fn mul_trunc(&self, a: u64, b: u64) -> u64 {
        self.mul_trunc_by(a, b, self.fp.frac_bits())
    }

    /// max(x, 0). Exact.
    pub fn relu(&self, x: u64) -> u64 {
        if self.fp.ring.msb(x) {
            0
        } else {
            x
        }
    }

    /// exp(x) for x ≤ 0.
    ///
    /// Method: clamp x to ≥ −16 (protocol: −16 + ReLU(x + 16)); read the raw integer at
    /// F = f + 5 fractional bits, which is t = x/32 ∈ [−1/2, 0] at no cost; p = 1 + t +
    /// ⌊(31·t² + 2^(F+5)) / 2^(F+6)⌋ (a quadratic with the t² coefficient 31/64 tuned for the
    /// 32nd power, [`EXP_QUAD_NUM`]); square p five times (each a multiply, add 2^(F−1), truncate
    /// by F: rounded); round away the 5 extra bits. Domain: x ≤ 0 (any such value; below −16 the
    /// result is 0). Max error vs f64 over the whole domain (measured): 1.79 ulp (2.2e-4) at
    /// x ≈ −1.27; exp(0) = 1 exactly.
    pub fn exp_neg(&self, x: u64) -> u64 {
        self.round(self.exp_neg_wide(x), EXP_SQUARINGS)
    }

    /// [`Approx::exp_neg`] before its last rounding: exp(x) at `exp_frac` = f + 5 fractional bits.
    /// Softmax sums these and rounds the sum once, so a row's sum does not collect one rounding
    /// (and, in the protocol's one-bit-error mode, one low ulp) per entry.
    pub fn exp_neg_wide(&self, x: u64) -> u64 {
        let fe = self.exp_frac;
        let lo = -EXP_CLAMP * self.one();
        let t = self.s(x).max(lo);
        let t = self.u(t);
        let one = self.u(1i64 << fe);
        let ring = self.fp.ring;
        let q = ring.mul(ring.mul(t, t), EXP_QUAD_NUM);
        let mut p = ring.add(ring.add(one, t), self.round(q, fe + EXP_QUAD_SHIFT));
        for _ in 0..EXP_SQUARINGS {
            p = self.mul_round_by(p, p, fe);
        }
        p
    }

    /// Bit length e of a raw positive value, clamped to [1, norm_bits]: the class the protocol's
    /// comparisons s ≥ 2^k (k = 1 … norm_bits−1) select. Non-positive inputs give e = 1.
    pub fn norm_class(&self, s: u64) -> u32 {
        let v = self.s(s);
        let e = if v <= 0 { 1 } else { 64 - v.leading_zeros() };
        e.clamp(1, self.norm_bits)
    }

    /// The public constant 2^(norm_bits − e) the protocol selects with the one-hot class vector:
    /// s·g puts s at a fixed scale, and g rescales the result of the iteration.
    pub fn norm_scale(&self, e: u32) -> u64 {
        1u64 << (self.norm_bits - e)
    }

    /// m = s / 2^e ∈ [1/2, 1) at `newton_frac` bits: ⌊s·2^(K−e) / 2^(K−F)⌋ (K = norm_bits).
    fn normalise(&self, s: u64, e: u32) -> u64 {
        self.mul_trunc_by(s, self.norm_scale(e), self.norm_bits - self.newton_frac)
    }

    /// Goldschmidt for num/m, m ∈ [1/2, 1] and num at F = newton_frac bits: y0 = 2.9142 − 2m
    /// (relative error ≤ 8.6 %), D0 = ⌊m·y0⌋_F and N0 = ⌊num·y0⌋_F, then with δ = 1 − D each step
    /// multiplies by 1 + δ: D1 = D0 + ⌊D0·δ0⌋_F, N1 = N0 + ⌊N0·δ0⌋_F, N2 = N1 + ⌊N1·δ1⌋_F (D2 is
    /// never needed). N/D stays num/m while D → 1 quadratically, so N2 ≈ num/m with the error of
    /// two Newton steps (δ1 ≈ δ0² ≤ 0.0074, then ≤ 5.5e-5), and each step's products are
    /// independent: two rounds of products where Newton needs four. Because δ is small, it is
    /// the narrow factor. For num = 1 (2^F), N0 = y0. Returns N2 ≈ 2^F·num/m.
    pub fn goldschmidt(&self, m: u64, num: u64) -> u64 {
        let ring = self.fp.ring;
        let fr = self.newton_frac;
        let one = self.u(1i64 << fr);
        let y0 = ring.sub(self.recip_guess(), ring.add(m, m));
        let d0 = self.mul_trunc_by(m, y0, fr);
        let n0 = self.mul_trunc_by(num, y0, fr);
        let delta0 = ring.sub(one, d0);
        let d1 = ring.add(d0, self.mul_trunc_by(d0, delta0, fr));
        let n1 = ring.add(n0, self.mul_trunc_by(n0, delta0, fr));
        let delta1 = ring.sub(one, d1);
        ring.add(n1, self.mul_trunc_by(n1, delta1, fr))
    }

    /// The constant of the linear initial guess y0 = c0 − 2m for 1/m on [1/2, 1]: c0 = 1.5 + √2
    /// at F bits (equal ripple, relative error ≤ 8.6 %).
    pub fn recip_guess(&self) -> u64 {
        self.u((2.914_213_562_373_095 * (1u64 << self.newton_frac) as f64).round() as i64)
    }

    /// 1/s on the raw domain [1, 2^norm_bits) (values [2^-13, 2048) at (41,13)), output at f bits.
    ///
    /// Method: class e = bit length of s (norm_bits − 1 comparisons with public powers of two),
    /// g = 2^(K−e) selected by the one-hot class; m = s·g truncated to F bits ∈ [1/2, 1);
    /// y = Goldschmidt(1/m); result ⌊y·g / 2^(F+K−f−out)⌋ at `out` fractional bits. Max error vs f64:
    /// 1 ulp + 2^-12 relative (for s near 2^-13 the input itself is that coarse).
    pub fn recip(&self, s: u64) -> u64 {
        self.recip_at(s, self.fp.frac_bits())
    }

    /// [`Approx::recip`] with the output at `out_frac` fractional bits (≤ F + K − f).
    pub fn recip_at(&self, s: u64, out_frac: u32) -> u64 {
        self.recip_in_class(s, self.norm_class(s), out_frac)
    }

    /// Output precision of the row reciprocal in Softmax and ReLU-normalise: 2f − 2 bits, so the
    /// final products e_i·(1/s) lose nothing to the quantisation of 1/s and still fit the ring.
    pub fn wide_recip_frac(&self) -> u32 {
        2 * self.fp.frac_bits() - 2
    }

    /// Truncation applied to y·g in the reciprocal with output at `out_frac` bits.
    pub fn recip_out_shift(&self, out_frac: u32) -> u32 {
        let shift = self.newton_frac + self.norm_bits - self.fp.frac_bits();
        assert!(
            out_frac <= shift,
            "recip output precision {out_frac} too high"
        );
        shift - out_frac
    }

    /// [`Approx::recip_at`] with the class given (the protocol computes e from comparisons).
    pub fn recip_in_class(&self, s: u64, e: u32, out_frac: u32) -> u64 {
        let m = self.normalise(s, e);
        let y = self.goldschmidt(m, self.u(1i64 << self.newton_frac));
        self.mul_trunc_by(y, self.norm_scale(e), self.recip_out_shift(out_frac))
    }

    /// Bits R of rsqrt's pieces: r1 ≤ 2^R (|P|, |Q|, |R| ≤ 2^(R+1)), with R = ℓ − 4 − F so that
    /// the products by D stay below 2^(ℓ−2) for every S in [0, 2^hi) (|slope·D| < 2^(R+F); D is
    /// small inside the classes, down to −0.53·2^F below the lowest) and r1 keeps R
    /// significant bits.
    pub fn rsqrt_piece_bits(&self) -> u32 {
        self.fp.ring.bits() - 4 - self.newton_frac
    }

    /// The ascending public thresholds of rsqrt over the classes lo ..= hi: the class boundaries
    /// 2^(e−1) (e > lo) and, inside each class, the piece boundaries ≈ 2^(e−1)·2^(j/J) (j = 1 …
    /// J − 1, J = [`RSQRT_PIECES`]) rounded to 5 significant bits, so their low bits are zero
    /// and the comparisons share those digits' leaves with the value's own. Interval i of the
    /// ladder (below threshold i, at or above threshold i − 1) is the i-th piece of
    /// [`Approx::rsqrt_pieces_in_class`] order, class by class.
    pub fn rsqrt_thresholds(&self, lo: u32, hi: u32) -> Vec<u64> {
        let mut t = Vec::new();
        for e in lo..=hi {
            if e > lo {
                t.push(1u64 << (e - 1));
            }
            t.extend(self.rsqrt_class_thresholds(e));
        }
        t
    }

    /// The piece boundaries strictly inside class e ([2^(e−1), 2^e)), ascending.
    fn rsqrt_class_thresholds(&self, e: u32) -> Vec<u64> {
        let base = 1u64 << (e - 1);
        let q = 1u64 << (e - 1).saturating_sub(RSQRT_PIECES.ilog2() + 2);
        let mut t: Vec<u64> = Vec::new();
        for j in 1..RSQRT_PIECES {
            let v = base as f64 * 2f64.powf(j as f64 / RSQRT_PIECES as f64);
            let v = (v / q as f64).round() as u64 * q;
            if v > base && v < 2 * base && t.last().is_none_or(|&l| l < v) {
                t.push(v);
            }
        }
        t
    }

    /// The pieces of class e as (class, lower bound, upper bound) of the raw S they cover
    /// (the last bound exclusive), in the order of [`Approx::rsqrt_thresholds`].
    pub fn rsqrt_pieces_in_class(&self, e: u32) -> Vec<(u32, u64, u64)> {
        let mut bounds = vec![1u64 << (e - 1)];
        bounds.extend(self.rsqrt_class_thresholds(e));
        bounds.push(1u64 << e);
        bounds.windows(2).map(|w| (e, w[0], w[1])).collect()
    }

    /// The piece of S over the classes lo ..= hi: its class (bit length clamped to the range)
    /// and its bounds. Below 2^(lo−1) the class's first piece, from 2^hi on its last.
    pub fn rsqrt_piece_of(&self, lo: u32, hi: u32, s: u64) -> (u32, u64, u64) {
        let v = self.s(s);
        let e = if v <= 0 { 1 } else { 64 - v.leading_zeros() };
        let e = e.clamp(lo, hi);
        let pieces = self.rsqrt_pieces_in_class(e);
        let i = pieces
            .iter()
            .position(|&(_, _, end)| v < end as i64)
            .unwrap_or(pieces.len() - 1);
        pieces[i]
    }

    /// The public constants of the piece of class e covering raw S ∈ [a, b_end) for r ≈ κ/√S:
    /// (M_c, P, Q, R, b) with r = (P + ⌊(Q + ⌊R·D / 2^F⌋)·D / 2^F⌋)·2^b, where M = ⌊S·2^(F−e)⌋
    /// is S normalised to [1/2, 1) at F bits and D = M − M_c its offset from the piece's centre.
    /// The quadratic interpolates κ·2^(−e/2)/√x (x = M / 2^F) at the three Chebyshev nodes of
    /// the piece (near-minimax: 6e-6 relative at J = 8); centred and in Horner's form, only the
    /// outer floor lands at r's unit (|D| / 2^F < 2^-4 scales the inner one down). b ≥ 0
    /// is the smallest power with r1 = r/2^b below 2^R ([`Approx::rsqrt_piece_bits`]) over the
    /// class, so r keeps R significant bits over any range of classes (LayerNorm's 1/√var
    /// spans 2^17 and more).
    pub fn rsqrt_piece(&self, kappa: f64, (e, a, b_end): (u32, u64, u64)) -> RsqrtPiece {
        let fr = self.newton_frac as i32;
        let r_bits = self.rsqrt_piece_bits();
        let top = kappa * 2f64.powf(-((e - 1) as f64) / 2.0);
        let b = (top.log2().ceil() - r_bits as f64).max(0.0) as u32;
        let k = kappa * 2f64.powf(-(e as f64) / 2.0) / 2f64.powi(b as i32);
        let one = 2f64.powi(fr);
        // M ∈ [m_a, m_b] on the piece; for e > F, M is S's floor: the real x is ½ unit above.
        let (m_a, m_b) = (self.normal_floor(a, e), self.normal_floor(b_end - 1, e));
        let half = if e as i32 > fr { 0.5 } else { 0.0 };
        let mc = (m_a + m_b).div_ceil(2);
        let target = |t: f64| k * ((mc as f64 + half) / one + t).powf(-0.5);
        let (lo, hi) = (
            (m_a as f64 - mc as f64) / one,
            (m_b as f64 - mc as f64) / one,
        );
        let (c0, c1, c2) = if m_a == m_b {
            (target(0.0), 0.0, 0.0)
        } else {
            let (mid, rad) = ((lo + hi) / 2.0, (hi - lo) / 2.0);
            let t: Vec<f64> = (0..3)
                .map(|i| mid + rad * ((2 * i + 1) as f64 * std::f64::consts::PI / 6.0).cos())
                .collect();
            let y: Vec<f64> = t.iter().map(|&t| target(t)).collect();
            let d1 = (y[1] - y[0]) / (t[1] - t[0]);
            let d2 = ((y[2] - y[1]) / (t[2] - t[1]) - d1) / (t[2] - t[0]);
            (
                y[0] - d1 * t[0] + d2 * t[0] * t[1],
                d1 - d2 * (t[0] + t[1]),
                d2,
            )
        };
        // The outer floor loses ½ unit on average: P carries it.
        let p = (c0 + 0.5).round() as i64;
        let q = c1.round() as i64;
        let r = c2.round() as i64;
        assert!(
            [p, q, r].iter().all(|v| v.abs() <= 1i64 << (r_bits + 1)),
            "rsqrt piece constants exceed 2^{r_bits}: κ too large for the ring"
        );
        (mc, self.u(p), self.u(q), self.u(r), b)
    }

    /// M = ⌊S·2^(F−e)⌋ for S of class e: the normalisation ⌊S·2^(hi−e) / 2^(hi−F)⌋ of every hi.
    fn normal_floor(&self, s: u64, e: u32) -> u64 {
        let fr = self.newton_frac;
        if e > fr {
            s >> (e - fr)
        } else {
            s << (fr - e)
        }
    }

    /// r = (P + ⌊(Q + ⌊R·D / 2^F⌋)·D / 2^F⌋)·2^b with M = ⌊S·2^(hi−e) / 2^(hi−F)⌋, D = M − M_c
    /// and the constants of S's piece over the classes lo ..= hi ([`Approx::rsqrt_piece`]):
    /// r ≈ κ/√S.
    pub fn rsqrt_pieces(&self, kappa: f64, lo: u32, hi: u32, s: u64) -> u64 {
        let piece = self.rsqrt_piece_of(lo, hi, s);
        let e = piece.0;
        let fr = self.newton_frac;
        let ring = self.fp.ring;
        let m = self.mul_trunc_by(s, 1u64 << (hi - e), hi - fr);
        let (mc, p, q, r, b) = self.rsqrt_piece(kappa, piece);
        let d = ring.sub(m, mc);
        let slope = ring.add(q, self.mul_trunc_by(r, d, fr));
        let r1 = ring.add(p, self.mul_trunc_by(slope, d, fr));
        ring.mul(r1, 1u64 << b)
    }

    /// κ of rsqrt with the output at `out` fractional bits: 2^out·(S / 2^f)^(−½) = κ/√S.
    pub fn rsqrt_kappa(&self, out_frac: u32) -> f64 {
        2f64.powf(out_frac as f64 + self.fp.frac_bits() as f64 / 2.0)
    }

    /// 1/√s on the raw domain [1, 2^norm_bits), output at f bits.
    ///
    /// Method: the piece of s (its class e, the bit length, and one of [`RSQRT_PIECES`] pieces
    /// of the octave; the protocol's comparisons with every threshold of
    /// [`Approx::rsqrt_thresholds`] in one batch select it), m = s/2^e ∈ [1/2, 1) at F bits,
    /// then the piece's quadratic in the offset D from its centre ([`Approx::rsqrt_pieces`]):
    /// three rounds of products, no iteration. Max error vs f64 (measured over the domain):
    /// 1 ulp + 2^-14 relative (the constant and the floor, each within ½ ulp).
    pub fn rsqrt(&self, s: u64) -> u64 {
        self.rsqrt_at(s, self.fp.frac_bits())
    }

    /// [`Approx::rsqrt`] with the output at `out_frac` fractional bits (r1 < 2^R with b = 0:
    /// out_frac + f/2 < R).
    pub fn rsqrt_at(&self, s: u64, out_frac: u32) -> u64 {
        self.rsqrt_pieces(self.rsqrt_kappa(out_frac), 1, self.norm_bits, s)
    }

    /// tanh(x) for any x.
    ///
    /// Method: a = |x| (protocol: sign by DReLU, then a selection); z = exp_neg(−2a) ∈ (0, 1];
    /// tanh(a) = (1 − z)/(1 + z) as the Goldschmidt quotient of num = 1 − z by m = (1+z)/2 ∈
    /// (1/2, 1] (no normalisation: the range is known), N ≈ 2·tanh(a) at F bits; th = N rounded
    /// to f bits (so the saturated value is exactly ±1); the sign is re-applied.
    /// Max error vs f64 over all x (measured): 2.7 ulp (3.27e-4). Odd: tanh(−x) = −tanh(x) exactly.
    pub fn tanh(&self, x: u64) -> u64 {
        let ring = self.fp.ring;
        let f = self.fp.frac_bits();
        let neg = ring.msb(x);
        let a = if neg { ring.neg(x) } else { x };
        let z = self.exp_neg(ring.neg(ring.add(a, a)));
        let one = self.u(self.one());
        // m = (1 + z)/2 and num = 1 − z at F bits: N ≈ 2·tanh(|x|) at F bits.
        let up = 1u64 << (self.newton_frac - f);
        let m = ring.mul(ring.add(one, z), up / 2);
        let n = self.goldschmidt(m, ring.mul(ring.sub(one, z), up));
        let th = self.round(n, self.newton_frac - f + 1);
        if neg {
            ring.neg(th)
        } else {
            th
        }
    }

    /// GELU, tanh form: 0.5·x·(1 + tanh(√(2/π)(x + 0.044715·x³))), evaluated through the identity
    /// GELU(x) = ReLU(x) − φ(|x|), φ(a) = 0.5·a·(1 − tanh(√(2/π)(a + 0.044715·a³))) = a / (1 +
    /// e^(2·√(2/π)(a + 0.044715·a³))) (tanh and the cubic are odd). φ is smooth, at most 0.17, and
    /// below 2.1e-5 from a = [`GELU_TAIL`] on, so it is 0 there and a cubic polynomial on each of
    /// the five segments [`GELU_SEGMENTS`] of [0, GELU_TAIL) (minimax fits, ≤ 6.3e-5 each).
    ///
    /// Steps (exactly the protocol's): r = ReLU(x), a = 2r − x = |x|; c = [a − A ≥ 0]; the clamped
    /// a_c = a − c·(a − A) ∈ [0, A] always (also for x = −2^(ℓ−1)), so everything after runs in the
    /// narrow ring Z_(2^[`GELU_RING_BITS`]) on a_c mod 2^k: a2 = ⌊a_c²⌋_f, a3 = ⌊a_c·a2⌋_f; segment
    /// bits c_j = [a_c ≥ t_j] (DReLU on 2^[`GELU_CMP_BITS`]-bounded values); P_j = Σ_i C_(j,i)·a^i
    /// with the coefficients at f + [`GELU_COEF_FRAC`] bits; V = P_0 + Σ_j c_j·(P_j − P_(j−1)) −
    /// c·P_4 (a telescoping selection: only the segment's own polynomial survives, 0 beyond A);
    /// φ̃ = round(V, GELU_COEF_FRAC), sign-extended to the full ring; y = r − φ̃.
    /// Domain: every x (ReLU is exact; the tail's φ is below the error bound).
    /// Max error vs f64 (measured over |x| ≤ 60 and at large |x|): [`GELU_MAX_ERROR`].
    pub fn gelu(&self, x: u64) -> u64 {
        self.odd_split(&self.gelu_plan(), x, None)
    }

    /// [`Approx::gelu`] with its two sign comparisons promised |x| < 2^k
    /// ([`Approx::odd_split`]'s `bound`): equal to it on that domain, the protocol's value
    /// there (unspecified outside it).
    pub fn gelu_within(&self, x: u64, bound: Option<u32>) -> u64 {
        self.odd_split(&self.gelu_plan(), x, bound)
    }

    /// The odd split ReLU(x) − φ̃(|x|) of `plan` (GELU's and SiLU's steps, exactly the
    /// protocol's `Ctx::odd_split`): r = ReLU(x), a = 2r − x = |x|; c = [a − A ≥ 0]; the clamped
    /// a_c = a − c·(a − A) ∈ [0, A] always (also for x = −2^(ℓ−1)), so everything after runs in
    /// the plan's narrow ring on a_c mod 2^k: a2 = ⌊a_c²⌋_f, a3 = ⌊a_c·a2⌋_f; segment bits
    /// c_j = [a_c ≥ t_j] (DReLU on 2^cmp_bits-bounded values); P_j = Σ_i C_(j,i)·a^i;
    /// V = P_0 + Σ_j c_j·(P_j − P_(j−1)) − c·P_last (a telescoping selection: only the segment's
    /// own polynomial survives, 0 beyond A); φ̃ = round(V, coef_frac), sign-extended to the full
    /// ring; y = r − φ̃.
    ///
    /// `bound`: the promise |x| < 2^k (k ≥ the tail's bits + 1, below ℓ − 1), which lets the
    /// protocol run the sign and the clamp as k-bit comparisons: both are then
    /// [`drelu_bounded`] at k, equal to the unbounded ones on the promised domain, where this
    /// is the protocol's value. Outside it the protocol's output is unspecified (a misread sign
    /// can leave a_c outside the narrow products' promise, and the result then depends on the
    /// shares): this function gives one reading, and its callers count such inputs as domain
    /// violations.
    pub fn odd_split(&self, p: &SplitPlan, x: u64, bound: Option<u32>) -> u64 {
        let ring = self.fp.ring;
        let k = p.ring;
        let f = self.fp.frac_bits();
        // Unbounded is k = ℓ − 1, where drelu_bounded reads the sign bit itself.
        let k_sign = bound.unwrap_or(ring.bits() - 1);
        let sign = |v: u64| drelu_bounded(ring, v, k_sign);
        let r = if sign(x) { x } else { 0 };
        let a = ring.sub(ring.add(r, r), x);
        let clamp = sign(ring.sub(a, p.tail));
        let ac = if clamp { p.tail } else { k.reduce(a) };
        let a2 = trunc_in(k, k.mul(ac, ac), f);
        let a3 = trunc_in(k, k.mul(ac, a2), f);
        let mut prev = p.poly(0, ac, a2, a3);
        let mut v = prev;
        for (j, &t) in p.breaks().iter().enumerate() {
            let next = p.poly(j + 1, ac, a2, a3);
            if drelu_bounded(k, k.sub(ac, t), p.cmp_bits) {
                v = k.add(v, k.sub(next, prev));
            }
            prev = next;
        }
        if clamp {
            v = k.sub(v, prev);
        }
        let cf = p.coef_frac;
        let phi = trunc_in(k, k.add(v, 1u64 << (cf - 1)), cf);
        ring.sub(r, ring.from_signed(k.to_signed(phi)))
    }

    /// The public constants of [`Approx::gelu`] (the protocol selects and scales with them).
    pub fn gelu_plan(&self) -> SplitPlan {
        self.split_plan(&GELU_SPLIT)
    }

    /// The public constants of `spec` at this format. Panics if the spec does not fit the
    /// format (its ring, comparison width or segment count): the specs are constants checked
    /// by the tests at the formats in use.
    pub fn split_plan(&self, spec: &SplitSpec) -> SplitPlan {
        let k = Ring::new(spec.ring_bits).expect("split ring width");
        let f = self.fp.frac_bits();
        let segs = spec.segments.len();
        assert!(
            (1..=SPLIT_MAX_SEGMENTS).contains(&segs),
            "{segs} segments (at most {SPLIT_MAX_SEGMENTS})"
        );
        let a = spec.tail * 2f64.powi(f as i32);
        assert!(
            a < 2f64.powi(spec.cmp_bits as i32)
                && a * a * a / 2f64.powi(f as i32) < 2f64.powi(spec.ring_bits as i32 - 2)
                && f + spec.coef_frac <= spec.ring_bits
                && spec.cmp_bits + 1 < spec.ring_bits,
            "split spec does not fit f = {f}"
        );
        let enc = |v: f64, frac: u32| k.from_signed((v * 2f64.powi(frac as i32)).round() as i64);
        let mut breaks = [0u64; SPLIT_MAX_SEGMENTS - 1];
        for (b, seg) in breaks.iter_mut().zip(&spec.segments[1..]) {
            *b = enc(seg.0, f);
        }
        let mut coef = [[0u64; 4]; SPLIT_MAX_SEGMENTS];
        for (c, seg) in coef.iter_mut().zip(spec.segments) {
            // C_0 multiplies the constant 2^f, C_1..C_3 the powers at f bits.
            for (i, &v) in seg.1.iter().enumerate() {
                c[i] = enc(v, spec.coef_frac + if i == 0 { f } else { 0 });
            }
        }
        SplitPlan {
            ring: k,
            tail: self.fp.encode(spec.tail),
            segs,
            breaks,
            coef,
            cmp_bits: spec.cmp_bits,
            coef_frac: spec.coef_frac,
        }
    }

    /// Mean of n values from the raw sum S: ⌊⌊S / 2^p⌋ · c / 2^(f+3)⌋ with p = ⌊log2 n⌋ and
    /// c = round(2^(p+f+3)/n). (Algorithm 4 multiplies by ⌊2^f/n⌉ directly; at n = 768 that
    /// constant is 11 instead of 10.67, a 3% error. Pre-dividing by 2^p and 3 extra bits keep c
    /// precise to 2^-16 while the product still fits.) Error ≤ 2 ulp + |mean|·2^-15 (relative); needs
    /// |mean| < 2^(ℓ−3−2f−3) (2048 at (41,13)).
    pub fn mean_of_sum(&self, sum: u64, n: usize) -> u64 {
        let (p, c) = self.mean_params(n);
        self.mul_trunc_by(self.trunc(sum, p), c, self.fp.frac_bits() + MEAN_EXTRA_BITS)
    }

    /// (p, c) of [`Approx::mean_of_sum`].
    pub fn mean_params(&self, n: usize) -> (u32, u64) {
        assert!(n > 0, "mean of an empty row");
        let p = usize::BITS - 1 - n.leading_zeros();
        let c = (2f64.powi((p + self.fp.frac_bits() + MEAN_EXTRA_BITS) as i32) / n as f64).round();
        (p, c as u64)
    }

    /// Softmax of one row with max subtraction and a padding mask (Algorithm 3). `valid[i]` false
    /// means a padded position: excluded from the max and the sum, output 0. The mask is public.
    /// Steps: m = max over valid; p_i = exp_neg_wide(x_i − m) (f + 5 bits); e_i = round(p_i) and
    /// s = round(Σ p_i) to f bits (one rounding for the sum, not one per entry: in the protocol's
    /// one-bit-error mode each rounding may land an ulp low, which over a long row's many
    /// near-zero terms would bias s by half an ulp per entry); r = recip_at(s, 2f−2);
    /// y_i = ⌊e_i·r⌋_(2f−2). Domain: valid entries within 2^(ℓ−2)/2^f of each other (no wrap in
    /// x_i − m), at most 2^(norm_bits−f) = 2048 valid entries. Max error vs f64: 8e-4 absolute per
    /// output. A row with no valid entry outputs all zeros.
    pub fn softmax_row(&self, row: &[u64], valid: &[bool]) -> Vec<u64> {
        assert_eq!(row.len(), valid.len(), "mask length");
        let ring = self.fp.ring;
        let Some(max) = row
            .iter()
            .zip(valid)
            .filter(|(_, &v)| v)
            .map(|(&x, _)| self.s(x))
            .max()
        else {
            return vec![0; row.len()];
        };
        let p: Vec<u64> = row
            .iter()
            .zip(valid)
            .map(|(&x, &v)| {
                if v {
                    self.exp_neg_wide(ring.sub(x, self.u(max)))
                } else {
                    0
                }
            })
            .collect();
        let s = self.round(
            p.iter().fold(0u64, |acc, &v| ring.add(acc, v)),
            EXP_SQUARINGS,
        );
        let e: Vec<u64> = p.iter().map(|&v| self.round(v, EXP_SQUARINGS)).collect();
        let w = self.wide_recip_frac();
        let r = self.recip_at(s, w);
        e.iter().map(|&v| self.mul_trunc_by(v, r, w)).collect()
    }

    /// ReLU-normalise (the friendly Softmax substitute): r_i = ReLU(x_i) on valid positions (0 on
    /// padded ones), s = Σ r_i + ⌊ε·2^f⌉ (ε = defaults::RELU_NORMALISE_EPS, at least 1 ulp; the
    /// error bound is against the f64 definition with this quantised ε, 9.77e-4 at f = 13),
    /// y_i = ⌊r_i·recip_at(s, 2f−2)⌋_(2f−2). Domain: s < 2048 at (41,13). Max error vs f64: 3e-4 absolute.
    pub fn relu_normalise_row(&self, row: &[u64], valid: &[bool]) -> Vec<u64> {
        assert_eq!(row.len(), valid.len(), "mask length");
        let ring = self.fp.ring;
        let r: Vec<u64> = row
            .iter()
            .zip(valid)
            .map(|(&x, &v)| if v { self.relu(x) } else { 0 })
            .collect();
        let s = r
            .iter()
            .fold(self.relu_normalise_eps(), |acc, &v| ring.add(acc, v));
        let w = self.wide_recip_frac();
        let inv = self.recip_at(s, w);
        r.iter().map(|&v| self.mul_trunc_by(v, inv, w)).collect()
    }

    /// ε of ReLU-normalise as a raw value (never below 1 ulp, so the reciprocal stays defined).
    pub fn relu_normalise_eps(&self) -> u64 {
        self.eps_raw(crate::defaults::RELU_NORMALISE_EPS)
    }

    /// ⌊ε·2^f⌉, at least 1: the raw ε added before a reciprocal or rsqrt.
    pub fn eps_raw(&self, eps: f64) -> u64 {
        self.fp.encode(eps).max(1)
    }

    /// LayerNorm of one row (Algorithm 4, with a variance path that covers large deviations).
    ///
    /// The sum of squares Σd² has too much dynamic range for one ring value (|d| up to 2^11 and
    /// variances down to 2^-13), so it is computed twice and one is chosen per row:
    /// * coarse: d' = round(d, k) (pre-shift, so d'² fits the ring), S_c = Σ round(d'·d', t) + E_c
    ///   at g_c fractional bits; valid over the whole domain;
    /// * fine: S_f = Σ d·d + E_f at 2f bits, no truncation; exact, valid while Σd² < 2^(ℓ−2−2f)
    ///   (8192 at (41,13)).
    ///
    /// E = round(n·ε·2^g) (≥ 1). The fine sum is used when S_c < 2^(ℓ−3−2f)·2^(g_c) (half the
    /// fine path's range; S_c's error is far below that margin). The 1/n of the variance goes into
    /// the public output constants: r = [`Approx::layer_norm_rsqrt`](S) ≈ √n/√(S/2^g) at W bits,
    /// i.e. 1/√(var + ε). Then y = ⌊⌊d·r⌋_W · γ⌋_f + β (γ, β raw at f bits). All parameters are
    /// public (n, ε, format): [`Approx::layer_norm_plan`].
    ///
    /// Domain: |x − μ| < 2^LAYER_NORM_DEV_BITS (2048) and var + ε ≥ 2^-LAYER_NORM_VAR_FLOOR_BITS;
    /// ⌈log2 n⌉ ≤ ℓ − 2 − 2·LAYER_NORM_DEV_BITS. Error vs f64: [`layer_norm_error_bound`] per normalised value.
    pub fn layer_norm_row(&self, row: &[u64], gamma: &[u64], beta: &[u64], eps: f64) -> Vec<u64> {
        self.layer_norm_row_at(row, gamma, beta, eps, LAYER_NORM_DEV_BITS)
    }

    /// [`Approx::layer_norm_row`] on the domain |x − μ| < 2^dev_bits ([`Approx::norm_plan`]).
    pub fn layer_norm_row_at(
        &self,
        row: &[u64],
        gamma: &[u64],
        beta: &[u64],
        eps: f64,
        dev_bits: u32,
    ) -> Vec<u64> {
        let plan = self.norm_plan(row.len(), eps, dev_bits);
        self.scale_row(&plan, &self.centre(row), gamma, Some(beta))
    }

    /// ⌊⌊d_i·r⌋_W·γ_i⌋_f (+ β_i) with r ≈ 1/√(Σd²/n + ε) from `plan`: the normalisation shared by
    /// LayerNorm (d = x − μ, [`Approx::layer_norm_row`]) and RMSNorm (d = x,
    /// [`Approx::rms_norm_row`]). The sum of squares is taken twice (coarse and fine, see
    /// [`Approx::layer_norm_row`]) and one chosen per row.
    pub fn scale_row(
        &self,
        plan: &LayerNormPlan,
        d: &[u64],
        gamma: &[u64],
        beta: Option<&[u64]>,
    ) -> Vec<u64> {
        assert!(
            d.len() == plan.n && gamma.len() == plan.n && beta.is_none_or(|b| b.len() == plan.n),
            "γ/β length"
        );
        let ring = self.fp.ring;
        let coarse = d.iter().fold(plan.coarse.eps_sum, |acc, &v| {
            ring.add(acc, self.layer_norm_coarse_square(plan, v))
        });
        let r = if self.layer_norm_uses_fine(plan, coarse) {
            let fine = d
                .iter()
                .fold(plan.fine.eps_sum, |acc, &v| ring.add(acc, ring.mul(v, v)));
            self.layer_norm_rsqrt(&plan.fine, fine)
        } else {
            self.layer_norm_rsqrt(&plan.coarse, coarse)
        };
        d.iter()
            .zip(gamma)
            .enumerate()
            .map(|(i, (&v, &g))| {
                let y = self.mul_trunc(self.mul_trunc_by(v, r, plan.out_frac), g);
                beta.map_or(y, |b| ring.add(y, b[i]))
            })
            .collect()
    }

    /// [S_c < switch], as the protocol's DReLU computes it: switch − 1 − S_c ≥ 0.
    pub fn layer_norm_uses_fine(&self, plan: &LayerNormPlan, coarse: u64) -> bool {
        !self.fp.ring.msb(self.fp.ring.sub(plan.switch - 1, coarse))
    }

    /// round(round(d, k)², t): one term of the coarse sum of squares.
    pub fn layer_norm_coarse_square(&self, plan: &LayerNormPlan, d: u64) -> u64 {
        let dp = self.round_if(d, plan.pre_shift);
        self.round_if(self.fp.ring.mul(dp, dp), plan.square_shift)
    }

    /// [`Approx::round`] by s bits, the identity for s = 0.
    pub fn round_if(&self, x: u64, s: u32) -> u64 {
        if s == 0 {
            x
        } else {
            self.round(x, s)
        }
    }

    /// The longest LayerNorm row the ring holds (0 if none): n squared deviations below
    /// 2^LAYER_NORM_DEV_BITS must sum below 2^(ℓ−2). 2^17 at ℓ = 41; a model whose hidden size
    /// exceeds it is refused when it is prepared, before any row reaches [`Approx::layer_norm_plan`].
    pub fn layer_norm_max_row(&self) -> usize {
        self.norm_max_row(LAYER_NORM_DEV_BITS)
    }

    /// The longest row whose n squared values below 2^dev_bits sum below 2^(ℓ−2) (0 if none).
    pub fn norm_max_row(&self, dev_bits: u32) -> usize {
        (self.fp.ring.bits() - 2)
            .checked_sub(2 * dev_bits)
            .map_or(0, |room| 1usize << room.min(usize::BITS - 1))
    }

    /// The public parameters of LayerNorm on rows of n values (see [`LayerNormPlan`]).
    /// Precondition: 0 < n ≤ [`Approx::layer_norm_max_row`].
    pub fn layer_norm_plan(&self, n: usize, eps: f64) -> LayerNormPlan {
        self.norm_plan(n, eps, LAYER_NORM_DEV_BITS)
    }

    /// [`Approx::layer_norm_plan`] for values |d| < 2^dev_bits (the decoders' wide norms, whose
    /// residual streams reach tens of thousands). Precondition: 0 < n ≤
    /// [`Approx::norm_max_row`]`(dev_bits)`.
    pub fn norm_plan(&self, n: usize, eps: f64, dev_bits: u32) -> LayerNormPlan {
        assert!(n > 0, "LayerNorm of an empty row");
        let l = self.fp.ring.bits();
        let f = self.fp.frac_bits();
        let head = l - 2;
        // |d| < 2^(DEV+f) raw; d' = d/2^k must square below 2^(ℓ−2).
        let pre_shift = (2 * (dev_bits + f)).saturating_sub(head).div_ceil(2);
        let sq_frac = 2 * (f - pre_shift);
        let log_n = usize::BITS - (n - 1).leading_zeros(); // ⌈log2 n⌉
        let room = head as i64 - 2 * dev_bits as i64 - log_n as i64;
        assert!(room >= 0, "LayerNorm rows of {n} do not fit the ring");
        let coarse_frac = (room as u32).min(sq_frac);
        // |d·r| ≤ √n in the domain, ≤ 2.9·√n for rows under the floor; ⌊d·r⌋_W must stay < 2^(ℓ−2).
        let out_frac = head - f - (2.9 * (n as f64).sqrt()).log2().ceil() as u32;
        let fine_limit = head - 2 * f; // Σd² < 2^fine_limit keeps the fine sum below 2^(ℓ−2)
        let switch_bits = fine_limit - 1 + coarse_frac;
        let mut coarse = self.layer_norm_sum_plan(n, eps, coarse_frac, out_frac);
        // The coarse root is used only from the switch on (S_c ≥ 2^switch_bits): its lower
        // classes would be comparisons whose root is always dropped.
        coarse.class_min = coarse.class_min.max(switch_bits + 1).min(head);
        LayerNormPlan {
            n,
            pre_shift,
            square_shift: sq_frac - coarse_frac,
            out_frac,
            switch: 1u64 << switch_bits,
            coarse,
            fine: self.layer_norm_sum_plan(n, eps, 2 * f, out_frac),
        }
    }

    fn layer_norm_sum_plan(&self, n: usize, eps: f64, g: u32, out_frac: u32) -> SumPlan {
        let head = self.fp.ring.bits() - 2;
        let eps_sum = ((n as f64 * eps * 2f64.powi(g as i32)).round() as u64).max(1);
        // Classes: S ∈ [2^(e−1), 2^e) for e ∈ [e_min, ℓ−2]; smaller S (below the variance floor)
        // fall into e_min's first piece, whose quadratic stays bounded down to S = 0.
        let s_floor = n as f64 * 2f64.powi(g as i32 - LAYER_NORM_VAR_FLOOR_BITS as i32);
        let class_min = if s_floor < 1.0 {
            1
        } else {
            (s_floor.log2().floor() as u32 + 1).min(head)
        };
        SumPlan {
            frac: g,
            eps_sum,
            class_min,
            class_max: head,
            kappa: (n as f64).sqrt() * 2f64.powf(out_frac as f64 + g as f64 / 2.0),
        }
    }

    /// r ≈ √n/√(S / 2^g) at W fractional bits: [`Approx::rsqrt_pieces`] with κ = √n·2^(W + g/2)
    /// over the sum's classes (a power 2^b per class keeps 1/√var's 2^17-fold range at R
    /// significant bits).
    pub fn layer_norm_rsqrt(&self, sum: &SumPlan, s: u64) -> u64 {
        self.rsqrt_pieces(sum.kappa, sum.class_min, sum.class_max, s)
    }

    /// x − mean(x) with the mean of [`Approx::mean_of_sum`].
    pub fn centre(&self, row: &[u64]) -> Vec<u64> {
        let ring = self.fp.ring;
        let sum = row.iter().fold(0u64, |acc, &v| ring.add(acc, v));
        let mu = self.mean_of_sum(sum, row.len());
        row.iter().map(|&v| ring.sub(v, mu)).collect()
    }

    /// The friendly LayerNorm substitute: y = ⌊(x − μ)·γ⌋_f + β. Max error vs f64: 2 ulp·(1+|γ|).
    pub fn centre_affine_row(&self, row: &[u64], gamma: &[u64], beta: &[u64]) -> Vec<u64> {
        assert!(
            row.len() == gamma.len() && row.len() == beta.len(),
            "γ/β length"
        );
        let ring = self.fp.ring;
        self.centre(row)
            .iter()
            .zip(gamma.iter().zip(beta))
            .map(|(&v, (&g, &b))| ring.add(self.mul_trunc(v, g), b))
            .collect()
    }
}

/// LayerNorm's domain for the deviations: |x − mean| < 2^LAYER_NORM_DEV_BITS (2048). Real
/// BERT-class models reach hundreds in their outlier dimensions (MiniLM-L6: ≈ 221;
/// all-mpnet-base-v2: 1,254 in block 9, beyond the 1,024 this was before).
pub const LAYER_NORM_DEV_BITS: u32 = 11;
/// LayerNorm's domain for the variance: var + ε ≥ 2^-LAYER_NORM_VAR_FLOOR_BITS.
pub const LAYER_NORM_VAR_FLOOR_BITS: u32 = 13;

/// Max error of LayerNorm's normalised value (x − μ)/√(var + ε) vs f64 on a row in the domain
/// (the output then adds ≤ 1 ulp + |γ|·this): 4.5e-3 (output quantisation at W bits,
/// |d|·2^-W ≤ 3.9e-3 at |d| = 2048 and n = 768, plus the rsqrt's) plus 2.5e-4/√(var + ε) (the
/// ≤ 2-ulp error of the mean μ, divided by the standard deviation; 2.5e-3 at var = 0.01, 2.2e-2
/// at the floor 2^-13). Deviations of a few units, the common case, stay near 1e-4. Holds for
/// rows of n ≤ 1,948 (W = 19 at (41, 13); longer rows get W = 18 and up to 7.8e-3 at |d| = 2048).
/// Checked by the sweep test at n ∈ {64, 384, 768}.
pub fn layer_norm_error_bound(var_plus_eps: f64) -> f64 {
    4.5e-3 + 2.5e-4 / var_plus_eps.sqrt()
}

/// Public parameters of LayerNorm on rows of n values (depend on n, ε and the format only).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerNormPlan {
    /// The row length the plan is for (the mean divides by it).
    pub n: usize,
    /// k: deviations are rounded to f − k fractional bits before the coarse squares.
    pub pre_shift: u32,
    /// t: coarse squares are rounded by t bits, to g_c = 2(f − k) − t fractional bits.
    pub square_shift: u32,
    /// W: fractional bits of r = 1/√(var + ε).
    pub out_frac: u32,
    /// The fine sum is used when the coarse sum is below this raw value.
    pub switch: u64,
    /// The sum of squares of the coarsely rounded deviations (any row in the domain).
    pub coarse: SumPlan,
    /// The sum at full precision, for rows whose coarse sum is too small to be accurate.
    pub fine: SumPlan,
}

/// One sum of squares and its rsqrt: fractional bits, ε term and class range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SumPlan {
    /// g: fractional bits of S.
    pub frac: u32,
    /// round(n·ε·2^g), at least 1: added to S.
    pub eps_sum: u64,
    /// Lowest class of S for the normalisation.
    pub class_min: u32,
    /// Highest class of S (the range bounds the comparisons that find the class).
    pub class_max: u32,
    /// κ: the root is r ≈ κ/√S = √n/√(S / 2^g) at W bits ([`Approx::layer_norm_rsqrt`]).
    pub kappa: f64,
}

/// The real-valued functions the fixed-point algorithms approximate (test oracles for the
/// protocols and the simulator).
pub mod reference {
    /// max(x, 0).
    pub fn relu(x: f64) -> f64 {
        x.max(0.0)
    }

    /// GELU, tanh form.
    pub fn gelu(x: f64) -> f64 {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (k * (x + super::GELU_CUBIC * x * x * x)).tanh())
    }

    /// Softmax over the valid entries; padded entries are 0.
    pub fn softmax(row: &[f64], valid: &[bool]) -> Vec<f64> {
        let m = row
            .iter()
            .zip(valid)
            .filter(|(_, &v)| v)
            .map(|(&x, _)| x)
            .fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row
            .iter()
            .zip(valid)
            .map(|(&x, &v)| if v { (x - m).exp() } else { 0.0 })
            .collect();
        let s: f64 = e.iter().sum();
        e.iter()
            .map(|&v| if s > 0.0 { v / s } else { 0.0 })
            .collect()
    }

    /// ReLU(x_i) / (Σ_j ReLU(x_j) + ε) over the valid entries.
    pub fn relu_normalise(row: &[f64], valid: &[bool], eps: f64) -> Vec<f64> {
        let r: Vec<f64> = row
            .iter()
            .zip(valid)
            .map(|(&x, &v)| if v { x.max(0.0) } else { 0.0 })
            .collect();
        let s: f64 = r.iter().sum::<f64>() + eps;
        r.iter().map(|&v| v / s).collect()
    }

    /// (x − mean)/√(var + ε)·γ + β over the row.
    pub fn layer_norm(row: &[f64], gamma: &[f64], beta: &[f64], eps: f64) -> Vec<f64> {
        let n = row.len() as f64;
        let mu = row.iter().sum::<f64>() / n;
        let var = row.iter().map(|&x| (x - mu) * (x - mu)).sum::<f64>() / n;
        let r = 1.0 / (var + eps).sqrt();
        row.iter()
            .zip(gamma.iter().zip(beta))
            .map(|(&x, (&g, &b))| (x - mu) * r * g + b)
            .collect()
    }

    /// (x − mean)·γ + β: the centring substitute for LayerNorm.
    pub fn centre_affine(row: &[f64], gamma: &[f64], beta: &[f64]) -> Vec<f64> {
        let mu = row.iter().sum::<f64>() / row.len() as f64;
        row.iter()
            .zip(gamma.iter().zip(beta))
            .map(|(&x, (&g, &b))| (x - mu) * g + b)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Prg;

    fn ax() -> Approx {
        Approx::new(FixedPoint::default_format()).unwrap()
    }
    const ULP: f64 = 1.0 / 8192.0;

    /// Max |approx − f64| over the raw inputs `xs`.
    fn max_err(
        ax: &Approx,
        xs: impl Iterator<Item = i64>,
        f: impl Fn(u64) -> u64,
        g: impl Fn(f64) -> f64,
    ) -> (f64, f64) {
        let fp = ax.fp;
        let mut worst = (0.0, 0.0);
        for x in xs {
            let xv = fp.ring.from_signed(x);
            let err = (fp.decode(f(xv)) - g(fp.decode(xv))).abs();
            if err > worst.0 {
                worst = (err, fp.decode(xv));
            }
        }
        worst
    }

    #[test]
    fn rejects_formats_without_headroom() {
        assert!(Approx::new(FixedPoint::new(41, 14).unwrap()).is_err());
        assert!(Approx::new(FixedPoint::new(64, 20).unwrap()).is_ok());
    }

    #[test]
    fn truncation_is_floor_and_relu_exact() {
        let a = ax();
        let r = a.fp.ring;
        assert_eq!(r.to_signed(a.trunc(r.from_signed(-1), 13)), -1);
        assert_eq!(r.to_signed(a.trunc(r.from_signed(8191), 13)), 0);
        assert_eq!(a.relu(r.from_signed(-1)), 0);
        assert_eq!(a.relu(5), 5);
        assert_eq!(a.relu(1 << 40), 0);
        let x = a.fp.encode(1.5);
        assert_eq!(a.fp.decode(a.mul_trunc(x, a.fp.encode(-2.0))), -3.0);
    }

    #[test]
    fn exp_sweep_whole_domain() {
        let a = ax();
        let (err, at) = max_err(&a, -(20 << 13)..=0, |x| a.exp_neg(x), f64::exp);
        assert!(err <= 1.8 * ULP, "exp error {err} at {at}");
        assert_eq!(a.exp_neg(0), 1 << 13);
        assert_eq!(a.exp_neg(a.fp.ring.from_signed(-(1 << 30))), 0);
    }

    /// Raw inputs covering [1, 2^K): every value below 2^14, then a stride, plus 2^k ± 1.
    fn positive_sweep(k: u32) -> impl Iterator<Item = i64> {
        (1..1i64 << 14)
            .chain(((1i64 << 14)..(1i64 << k)).step_by(97))
            .chain((1..k).flat_map(|j| [(1i64 << j) - 1, 1i64 << j, (1i64 << j) + 1]))
            .chain(std::iter::once((1i64 << k) - 1))
    }

    #[test]
    fn recip_sweep_whole_domain() {
        let a = ax();
        let fp = a.fp;
        assert_eq!(a.norm_bits(), 24);
        for x in positive_sweep(a.norm_bits()) {
            let xv = fp.ring.from_signed(x);
            let exact = 1.0 / fp.decode(xv);
            let err = (fp.decode(a.recip(xv)) - exact).abs();
            assert!(
                err <= ULP + exact / 4096.0,
                "recip({}) error {err}",
                fp.decode(xv)
            );
        }
    }

    #[test]
    fn rsqrt_sweep_whole_domain() {
        let a = ax();
        let fp = a.fp;
        for x in positive_sweep(a.norm_bits()) {
            let xv = fp.ring.from_signed(x);
            let exact = 1.0 / fp.decode(xv).sqrt();
            let err = (fp.decode(a.rsqrt(xv)) - exact).abs();
            assert!(
                err <= ULP + exact / 16384.0,
                "rsqrt({}) error {err}",
                fp.decode(xv)
            );
        }
    }

    #[test]
    fn tanh_sweep_and_oddness() {
        let a = ax();
        let (err, at) = max_err(&a, -(12 << 13)..=(12 << 13), |x| a.tanh(x), f64::tanh);
        assert!(err <= 2.7 * ULP, "tanh error {err} at {at}");
        let r = a.fp.ring;
        for x in [1i64, 77, 8192, 40000, 1 << 30] {
            assert_eq!(a.tanh(r.from_signed(-x)), r.neg(a.tanh(r.from_signed(x))));
        }
        assert_eq!(a.tanh(0), 0);
    }

    #[test]
    fn gelu_sweep_whole_domain() {
        let a = ax();
        let (err, at) = max_err(&a, -(60 << 13)..=(60 << 13), |x| a.gelu(x), reference::gelu);
        assert!(err <= GELU_MAX_ERROR, "gelu error {err} at {at}");
        // Far out, and the ring's extremes: ReLU exactly (the correction is 0 there).
        let r = a.fp.ring;
        for x in [
            1i64 << 20,
            -(1 << 20),
            (1 << 39) + 7,
            -(1 << 40),
            (1 << 40) - 1,
        ] {
            let v = r.from_signed(x);
            assert_eq!(a.gelu(v), a.relu(v), "gelu({x})");
        }
    }

    fn random_rows(prg: &mut Prg, rows: usize, cols: usize, scale: f64) -> Vec<Vec<f64>> {
        (0..rows)
            .map(|_| {
                (0..cols)
                    .map(|_| (prg.u64() as f64 / u64::MAX as f64 * 2.0 - 1.0) * scale)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn softmax_rows_match_f64_with_mask() {
        let a = ax();
        let fp = a.fp;
        let mut prg = Prg::from_os_entropy();
        for (cols, scale, pad) in [(128, 8.0, 37), (128, 30.0, 0), (7, 2.0, 3), (1, 1.0, 0)] {
            let valid: Vec<bool> = (0..cols).map(|i| i < cols - pad).collect();
            for row in random_rows(&mut prg, 8, cols, scale) {
                let raw: Vec<u64> = row.iter().map(|&x| fp.encode(x)).collect();
                let got = a.softmax_row(&raw, &valid);
                let q: Vec<f64> = raw.iter().map(|&x| fp.decode(x)).collect();
                let want = reference::softmax(&q, &valid);
                for i in 0..cols {
                    let err = (fp.decode(got[i]) - want[i]).abs();
                    assert!(err <= 8e-4, "softmax error {err}");
                    if !valid[i] {
                        assert_eq!(got[i], 0);
                    }
                }
            }
        }
        assert_eq!(a.softmax_row(&[5, 6], &[false, false]), vec![0, 0]);
    }

    #[test]
    fn relu_normalise_rows_match_f64() {
        let a = ax();
        let fp = a.fp;
        let mut prg = Prg::from_os_entropy();
        // The f64 definition with ε as the simulator encodes it (8 ulp = 9.77e-4).
        let eps = fp.decode(a.relu_normalise_eps());
        for (cols, scale, pad) in [(128, 8.0, 20), (128, 0.01, 0), (5, 3.0, 1)] {
            let valid: Vec<bool> = (0..cols).map(|i| i < cols - pad).collect();
            for row in random_rows(&mut prg, 8, cols, scale) {
                let raw: Vec<u64> = row.iter().map(|&x| fp.encode(x)).collect();
                let got = a.relu_normalise_row(&raw, &valid);
                let q: Vec<f64> = raw.iter().map(|&x| fp.decode(x)).collect();
                let want = reference::relu_normalise(&q, &valid, eps);
                for i in 0..cols {
                    let err = (fp.decode(got[i]) - want[i]).abs();
                    assert!(err <= 3e-4, "relu-normalise error {err}");
                }
            }
        }
    }

    /// The row limit is where the plan's own room check turns negative: ℓ = 41 holds 2^17.
    #[test]
    fn layer_norm_row_limit() {
        let a = ax();
        assert_eq!(a.layer_norm_max_row(), 1 << 17);
        a.layer_norm_plan(1 << 17, 1e-5);
        let narrow = Approx::new(FixedPoint::new(32, 8).unwrap()).unwrap();
        assert_eq!(narrow.layer_norm_max_row(), 256);
        narrow.layer_norm_plan(256, 1e-5);
    }

    #[test]
    fn layer_norm_rows_match_f64() {
        let a = ax();
        let fp = a.fp;
        let mut prg = Prg::from_os_entropy();
        for (cols, scale) in [(768, 4.0), (768, 0.5), (64, 20.0)] {
            let gamma: Vec<f64> = random_rows(&mut prg, 1, cols, 2.0).remove(0);
            let beta: Vec<f64> = random_rows(&mut prg, 1, cols, 1.0).remove(0);
            let (g, b): (Vec<u64>, Vec<u64>) = (
                gamma.iter().map(|&x| fp.encode(x)).collect(),
                beta.iter().map(|&x| fp.encode(x)).collect(),
            );
            let (gq, bq): (Vec<f64>, Vec<f64>) = (
                g.iter().map(|&x| fp.decode(x)).collect(),
                b.iter().map(|&x| fp.decode(x)).collect(),
            );
            for row in random_rows(&mut prg, 4, cols, scale) {
                let raw: Vec<u64> = row.iter().map(|&x| fp.encode(x)).collect();
                let q: Vec<f64> = raw.iter().map(|&x| fp.decode(x)).collect();
                let got = a.layer_norm_row(&raw, &g, &b, 1e-5);
                let want = reference::layer_norm(&q, &gq, &bq, 1e-5);
                let got_c = a.centre_affine_row(&raw, &g, &b);
                let want_c = reference::centre_affine(&q, &gq, &bq);
                for i in 0..cols {
                    let err = (fp.decode(got[i]) - want[i]).abs();
                    assert!(err <= 2e-3 * (1.0 + gq[i].abs()), "layernorm error {err}");
                    let err = (fp.decode(got_c[i]) - want_c[i]).abs();
                    assert!(err <= 2.0 * ULP * (1.0 + gq[i].abs()), "centre error {err}");
                }
            }
        }
    }

    /// Rows of n values: Gaussian-like bulk of standard deviation `std` plus `outliers` entries at
    /// ±`outlier` (the shape of real LayerNorm inputs), all encoded.
    fn ln_row(
        prg: &mut Prg,
        fp: FixedPoint,
        n: usize,
        std: f64,
        outliers: usize,
        outlier: f64,
    ) -> Vec<u64> {
        (0..n)
            .map(|i| {
                let u: f64 = (0..4)
                    .map(|_| prg.u64() as f64 / u64::MAX as f64 - 0.5)
                    .sum();
                let v = if i < outliers {
                    if i % 2 == 0 {
                        outlier
                    } else {
                        -outlier
                    }
                } else {
                    u * std * 1.7
                };
                fp.encode(v)
            })
            .collect()
    }

    /// Max |approx − f64| of the normalised value (γ = 1, β = 0) over rows spanning the domain.
    #[test]
    fn layer_norm_sweep_over_domain() {
        let a = ax();
        let fp = a.fp;
        let mut prg = Prg::from_os_entropy();
        for n in [768usize, 384, 64] {
            let ones = vec![fp.encode(1.0); n];
            let zeros = vec![0u64; n];
            for &(std, outliers, outlier) in &[
                (0.012, 0, 0.0),
                (0.05, 0, 0.0),
                (0.3, 0, 0.0),
                (1.0, 0, 0.0),
                (4.0, 0, 0.0),
                (30.0, 0, 0.0),
                (200.0, 0, 0.0),
                (1.0, 1, 221.0),
                (0.3, 4, 500.0),
                (2.0, 2, 1000.0),
                (2.0, 2, 2000.0),
                (290.0, 0, 0.0),
                (580.0, 0, 0.0),
            ] {
                for eps in [1e-12, 1e-5] {
                    let raw = ln_row(&mut prg, fp, n, std, outliers, outlier);
                    let q: Vec<f64> = raw.iter().map(|&x| fp.decode(x)).collect();
                    let got = a.layer_norm_row(&raw, &ones, &zeros, eps);
                    let want = reference::layer_norm(&q, &vec![1.0; n], &vec![0.0; n], eps);
                    let mu = q.iter().sum::<f64>() / n as f64;
                    let var = q.iter().map(|x| (x - mu) * (x - mu)).sum::<f64>() / n as f64;
                    let bound = layer_norm_error_bound(var + eps);
                    for i in 0..n {
                        let err = (fp.decode(got[i]) - want[i]).abs();
                        assert!(
                            err <= bound,
                            "n={n} std={std} outlier={outlier}: error {err} > {bound}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn mean_is_within_two_ulp() {
        let a = ax();
        let r = a.fp.ring;
        for n in [1usize, 7, 128, 768, 3072] {
            for s in [-5_000_000i64, -1, 0, 1, 12345, 16_000_000] {
                let got = r.to_signed(a.mean_of_sum(r.from_signed(s), n)) as f64;
                let exact = s as f64 / n as f64;
                let bound = 2.0 + exact.abs() / 32768.0;
                assert!((got - exact).abs() <= bound, "mean {s}/{n} -> {got}");
            }
        }
    }
}
