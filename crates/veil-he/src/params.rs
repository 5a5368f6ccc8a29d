//! BFV parameter sets: ring degree, RNS moduli, the final (decryption) modulus and the noise
//! budget derived from them.
//!
//! Every set is checked against the HE-standard table of maximal log2 Q for 128-bit security with
//! a uniform ternary secret and error σ ≈ 3.2 (N=4096: 109 bits, N=8192: 218 bits); anything
//! larger is refused with [`Error::Insecure`]. The moduli are the largest NTT-friendly primes
//! below a bit size, derived deterministically, so both parties agree on them from the set alone.

use std::sync::Arc;

use tfhe_ntt::prime64::Plan;
use veil_core::{ensure, Error, Result, Ring};

use crate::galois::{MAX_GALOIS_LEVELS, MIN_GALOIS_LEVELS};
use crate::math::{inv_mod, mul_mod, ntt_primes, ShoupConst};

/// Maximal total log2 Q for 128-bit security (HomomorphicEncryption.org standard, ternary secret).
const HE_STANDARD_MAX_LOG_Q: [(usize, u32); 6] = [
    (1024, 27),
    (2048, 54),
    (4096, 109),
    (8192, 218),
    (16384, 438),
    (32768, 881),
];

/// Statistical security parameter: the whole session transcript the client receives is within
/// statistical distance 2^-40 of a simulation from its outputs alone.
pub const STAT_SECURITY_BITS: f64 = 40.0;

/// log2 of the most response coefficients one session (one public key) may reveal: 2^28 covers
/// a BERT-Base inference (≈2^24) sixteen times over. Enforced per [`crate::PublicKey`].
pub const SESSION_REVEALED_LOG2: u32 = 28;

/// 2^[`SESSION_REVEALED_LOG2`]: the count itself, as the server enforces it and a client tracks it.
pub const SESSION_REVEALED_LIMIT: u64 = 1 << SESSION_REVEALED_LOG2;

/// Flooding margin, in bits, every revealed coefficient needs: with D = 2^28 coefficients per
/// session, each 2^-69-close to simulated and each tail bound failing with probability ≤ 2^-69,
/// the transcript is within D·2^-69 + D·2^-69 = 2^-40 (see the crate docs).
pub const FLOOD_MARGIN_BITS: f64 = STAT_SECURITY_BITS + SESSION_REVEALED_LOG2 as f64 + 1.0;

/// Hoeffding multiplier for a per-coefficient tail probability of 2^-69:
/// 2·exp(−x²/2) ≤ 2^-69 for x = √(2·70·ln 2) ≈ 9.85 standard deviations (variance proxy).
const TAIL_SIGMAS: f64 = 9.86;

/// The named parameter sets Veil uses. Both parties pick one per layer from public architecture
/// data, so the choice never depends on a secret. (N = 4096 cannot carry a session-level flood:
/// its ≤ 109-bit Q leaves 2^63 of flooding room, less than the 2^69 margin alone.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamSet {
    /// N = 8192, Q = three 50-bit primes (≈150 bits), final modulus ≈ 2^57, flood 2^104. For
    /// fixed-point model weights (|w| ≤ 2^17): hides 2^36 of weight-dependent noise with the
    /// 69-bit session margin.
    N8192,
    /// N = 8192, Q = four 42-bit primes (≈168 bits), final modulus ≈ 2^57, flood 2^122. For
    /// plaintext operands that are uniform ℓ-bit shares (shared × shared products): hides 2^54.
    N8192Q4,
    /// N8192Q4's Q with a final modulus ≈ 2^62, for the decoder's ring ℓ = 48 (where the others'
    /// 2^57 leaves no headroom): h = 12, so the switch rounding is budgeted by its tail bound
    /// ([`RoundingBound::Tail`]); flood 2^115, hides 2^47: FC weights (|w| ≤ 2^17) at any depth
    /// up to 2^16, shares only as 24-bit limbs.
    N8192Q4L48,
}

impl ParamSet {
    /// The set's one-byte id on the wire.
    pub fn id(self) -> u8 {
        match self {
            ParamSet::N8192 => 2,
            ParamSet::N8192Q4 => 3,
            ParamSet::N8192Q4L48 => 4,
        }
    }

    /// The set of a wire id; unknown ids are `Error::Malformed`.
    pub fn from_id(id: u8) -> Result<Self> {
        match id {
            2 => Ok(ParamSet::N8192),
            3 => Ok(ParamSet::N8192Q4),
            4 => Ok(ParamSet::N8192Q4L48),
            _ => Err(Error::Malformed(format!(
                "unknown BFV parameter set id {id}"
            ))),
        }
    }

    /// Automorphism levels of the set's Galois keys: strides up to 2^levels can be packed. The
    /// decoder's set has [`MAX_GALOIS_LEVELS`], whose single-row products want inner blocks of
    /// 128–512 entries; the encoder's sets keep [`MIN_GALOIS_LEVELS`] (each extra level would
    /// add limbs × log2(Q·P)·N bits, ≈ 0.9 MB, to their set-up and serve no encoder layout).
    pub fn galois_levels(self) -> usize {
        match self {
            ParamSet::N8192 | ParamSet::N8192Q4 => MIN_GALOIS_LEVELS,
            ParamSet::N8192Q4L48 => MAX_GALOIS_LEVELS,
        }
    }

    /// (N, bits per RNS prime, number of RNS primes, bits of the final modulus).
    fn shape(self) -> (usize, u32, usize, u32) {
        match self {
            ParamSet::N8192 => (8192, 50, 3, 57),
            ParamSet::N8192Q4 => (8192, 42, 4, 57),
            ParamSet::N8192Q4L48 => (8192, 42, 4, 62),
        }
    }
}

/// Shared, immutable parameters with all precomputed tables. Cheap to clone.
#[derive(Clone)]
pub struct Params {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub set: Option<ParamSet>,
    pub n: usize,
    pub ring: Ring,
    pub moduli: Vec<u64>,
    pub plans: Vec<Plan>,
    pub log2_q: f64,
    /// ⌊Q/t⌋ mod q_i.
    pub delta: Vec<ShoupConst>,
    /// Q mod t.
    pub q_mod_t: u64,
    /// Limbs kept after the RNS rescaling chain (their product is at most 2^110).
    pub crt_limbs: usize,
    /// `rescale_inv[j][i]` = q_j^{-1} mod q_i for every dropped limb j and kept i < j.
    pub rescale_inv: Vec<Vec<ShoupConst>>,
    pub crt_modulus: u128,
    /// Q'/q_i for each kept limb.
    pub crt_basis: Vec<u128>,
    /// (Q'/q_i)^{-1} mod q_i.
    pub crt_hat_inv: Vec<ShoupConst>,
    pub final_modulus: u64,
    pub final_plan: Plan,
    pub budget: NoiseBudget,
    /// The key-switching prime, when the HE-standard bound leaves room for it.
    pub special: Option<Special>,
}

/// The special prime P of hybrid key switching (Galois keys live modulo Q·P; switching divides
/// the digit-times-key-noise products by P). Chosen so that log2(Q·P) stays within the
/// HE-standard bound and P > q_i/2 (a centred digit is then already reduced modulo P).
pub(crate) struct Special {
    pub modulus: u64,
    pub plan: Plan,
    /// P mod q_i.
    pub p_mod_q: Vec<u64>,
    /// N·P^{-1} mod q_i in every slot: tfhe-ntt's `mul_assign_normalize` by it multiplies by
    /// P^{-1} (its 1/N cancelled), vectorised.
    pub p_inv_scaled: Vec<Vec<u64>>,
}

impl Special {
    /// The largest NTT prime below 2^min(50, ⌊max − log2 Q⌋), or none if it would have fewer bits
    /// than the RNS primes.
    fn new(n: usize, max_log_q: u32, log2_q: f64, moduli: &[u64], avoid: u64) -> Option<Self> {
        let limb_bits = 64 - moduli[0].leading_zeros();
        let bits = ((max_log_q as f64 - log2_q - 1e-9).floor() as u32).min(50);
        if bits < limb_bits {
            return None;
        }
        let mut exclude = moduli.to_vec();
        exclude.push(avoid);
        let modulus = ntt_primes(bits, n, 1, &exclude)[0];
        Some(Special {
            modulus,
            plan: Plan::try_new(n, modulus).expect("NTT-friendly prime"),
            p_mod_q: moduli.iter().map(|&q| modulus % q).collect(),
            p_inv_scaled: moduli
                .iter()
                .map(|&q| vec![mul_mod(n as u64 % q, inv_mod(modulus % q, q), q); n])
                .collect(),
        })
    }
}

/// Which bound [`NoiseBudget::switch_rounding`] is. The rounding of the modulus switch reaches
/// the decrypted noise as ε0 + Σ_i ε_i·s_i (ε the rounding errors of c0 and c1, |ε| ≤ 1/2, s the
/// client's ternary secret): at most (N + 1)/2 in the worst case, but c1 is computed from public
/// uniform polynomials and server randomness only, never from s, so for every c1 the sum is a
/// sum of N independent zero-mean terms of range ≤ 1 over the client's uniform s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundingBound {
    /// (N + 1)/2 + 1: decryption is exact for every secret. Used whenever it fits the headroom
    /// (every set at ℓ ≤ 41).
    WorstCase,
    /// Hoeffding over s (variance proxy N/4): 1/2 + 9.86·√(N/4) + 1, exceeded with probability
    /// ≤ 2^-69 per coefficient, ≤ 2^-41 over a session's 2^28 (union bound). Used only when the
    /// worst case does not fit (ℓ = 48). Exceeding it is a **correctness** event, not a leak: the
    /// client decodes a value off by one in its own share, which the server never sees; the
    /// transcript's simulation (the crate docs) does not depend on decryption succeeding.
    Tail,
}

/// The noise budget of a parameter set (all quantities are absolute values of per-coefficient
/// noise; see the crate docs for the derivation).
#[derive(Clone, Copy, Debug)]
pub struct NoiseBudget {
    /// h = ⌊log2(p / 2t)⌋: decryption at the final modulus p is exact while the noise is below 2^h.
    pub headroom_bits: u32,
    /// Rounding noise of the modulus switch: (N + 1)/2 + 1 in the worst case, ≈ 2^8.8 at
    /// N = 8192 by the tail bound; which one is `switch_bound`.
    pub switch_rounding: u64,
    /// Whether `switch_rounding` holds always or except with probability 2^-69 per coefficient.
    pub switch_bound: RoundingBound,
    /// Low bits of c0 dropped before sending (error ≤ 2^(d-1) = 2^(h-2)).
    pub c0_drop_bits: u32,
    /// Flooding noise is uniform in [-2^b, 2^b): after switching it is ≤ 2^(h-2).
    pub flood_bits: u32,
    /// Bits per sent c0 coefficient (after dropping) and per c1 coefficient.
    pub c0_width: u32,
    /// Bits sent per c1 coefficient.
    pub c1_width: u32,
    /// log2(Q / p), how much switching shrinks the noise.
    pub log2_q_over_p: f64,
}

impl NoiseBudget {
    /// Flooding margin, in bits, over a bound on the noise the flood must hide (statistical
    /// distance per coefficient ≤ hidden / 2^(b+1)).
    pub fn flood_margin_bits(&self, hidden: f64) -> f64 {
        self.flood_bits as f64 + 1.0 - hidden.max(1.0).log2()
    }

    /// Checks both the security condition (flood margin ≥ [`FLOOD_MARGIN_BITS`] over
    /// `hidden_tail`, a bound that holds except with probability 2^-69 per coefficient) and
    /// exact decryption (the worst case `hidden_worst` plus flood, switched down, plus the switch
    /// rounding — by `switch_bound` — and the dropped c0 bits stays below 2^h).
    pub fn check(&self, hidden_tail: f64, hidden_worst: f64) -> Result<()> {
        let margin = self.flood_margin_bits(hidden_tail);
        ensure!(
            margin >= FLOOD_MARGIN_BITS,
            Insecure,
            "flooding margin {margin:.1} bits < {FLOOD_MARGIN_BITS} (hidden noise ≈ 2^{:.1}, \
             flood 2^{}): use a parameter set with a larger Q or smaller plaintext values",
            hidden_tail.max(1.0).log2(),
            self.flood_bits
        );
        let h = self.headroom_bits as f64;
        let switched =
            (2f64.powi(self.flood_bits as i32) + hidden_worst) * 2f64.powf(-self.log2_q_over_p);
        let total = self.switch_rounding as f64 + 2f64.powf(h - 2.0) + switched + 1.0;
        ensure!(
            total < 2f64.powf(h),
            InvalidArgument,
            "noise budget exceeded: 2^{:.2} ≥ 2^{h} (worst-case plaintext noise 2^{:.1})",
            total.log2(),
            hidden_worst.max(1.0).log2()
        );
        Ok(())
    }
}

impl std::fmt::Debug for Params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Params")
            .field("set", &self.inner.set)
            .field("n", &self.inner.n)
            .field("moduli", &self.inner.moduli)
            .field("final_modulus", &self.inner.final_modulus)
            .field("special_modulus", &self.special_modulus())
            .field("budget", &self.inner.budget)
            .finish()
    }
}

impl Params {
    /// The named set for plaintext ring Z_{2^ℓ}.
    pub fn new(set: ParamSet, ring: Ring) -> Result<Self> {
        let (n, bits, limbs, final_bits) = set.shape();
        let mut p = Self::custom(n, bits, limbs, final_bits, ring)?;
        Arc::get_mut(&mut p.inner).expect("fresh").set = Some(set);
        Ok(p)
    }

    /// Any power-of-two N with `limbs` primes of `limb_bits` bits each and a final modulus of
    /// `final_bits` bits. Refused as [`Error::Insecure`] above the HE-standard bound.
    pub fn custom(
        n: usize,
        limb_bits: u32,
        limbs: usize,
        final_bits: u32,
        ring: Ring,
    ) -> Result<Self> {
        let max_log_q = HE_STANDARD_MAX_LOG_Q
            .iter()
            .find(|&&(d, _)| d == n)
            .map(|&(_, b)| b)
            .ok_or_else(|| {
                Error::Insecure(format!("N = {n} is not in the HE-standard security table"))
            })?;
        ensure!(
            (20..=50).contains(&limb_bits) && (1..=8).contains(&limbs),
            InvalidArgument,
            "RNS primes must have 20..=50 bits (got {limb_bits}) and there must be 1..=8 (got {limbs})"
        );
        ensure!(
            (40..=62).contains(&final_bits),
            InvalidArgument,
            "final modulus must have 40..=62 bits, got {final_bits}"
        );
        let moduli = ntt_primes(limb_bits, n, limbs, &[]);
        // The switching code relies on equal-sized primes (any residue mod q_j is < 2·q_i).
        ensure!(
            moduli.iter().all(|&q| q > 1 << (limb_bits - 1)),
            InvalidArgument,
            "not enough {limb_bits}-bit NTT primes for N = {n}"
        );
        let log2_q: f64 = moduli.iter().map(|&q| (q as f64).log2()).sum();
        ensure!(
            log2_q <= max_log_q as f64,
            Insecure,
            "log2 Q = {log2_q:.1} exceeds the 128-bit bound {max_log_q} for N = {n}"
        );
        let final_modulus = ntt_primes(final_bits, n, 1, &moduli)[0];
        let plans = moduli
            .iter()
            .map(|&q| Plan::try_new(n, q).expect("NTT-friendly prime"))
            .collect::<Vec<_>>();
        let final_plan = Plan::try_new(n, final_modulus).expect("NTT-friendly prime");

        let t_bits = ring.bits();
        let t_mask = ring.mask();
        let q_mod_t = moduli.iter().fold(1u64, |acc, &q| acc.wrapping_mul(q)) & t_mask;
        // Q = ⌊Q/t⌋·t + (Q mod t) ≡ 0 (mod q_i)  ⇒  ⌊Q/t⌋ ≡ -(Q mod t)·t^{-1} (mod q_i).
        let delta = moduli
            .iter()
            .map(|&q| {
                let t_mod_q = ((1u128 << t_bits) % q as u128) as u64;
                let r = (q_mod_t as u128 % q as u128) as u64;
                let d = mul_mod(q - r % q, inv_mod(t_mod_q, q), q) % q;
                ShoupConst::new(d, q)
            })
            .collect();

        // Drop limbs (largest index first) until Q' ≤ 2^110: the final switch estimates
        // round(p·x/Q') in f64 (error ≤ 2^-52·p ≤ 2^10) and corrects with a remainder that must
        // stay within ±2^127 in wrapping 128-bit arithmetic: 2^10·Q' < 2^121 leaves room.
        let mut crt_limbs = limbs;
        while moduli[..crt_limbs]
            .iter()
            .map(|&q| (q as f64).log2())
            .sum::<f64>()
            > 110.0
        {
            crt_limbs -= 1;
        }
        ensure!(
            crt_limbs >= 1,
            InvalidArgument,
            "no RNS prefix fits the switching arithmetic"
        );
        let rescale_inv = (0..limbs)
            .map(|j| {
                (0..j)
                    .map(|i| ShoupConst::new(inv_mod(moduli[j] % moduli[i], moduli[i]), moduli[i]))
                    .collect()
            })
            .collect();
        let crt_modulus: u128 = moduli[..crt_limbs].iter().map(|&q| q as u128).product();
        let crt_basis: Vec<u128> = moduli[..crt_limbs]
            .iter()
            .map(|&q| crt_modulus / q as u128)
            .collect();
        let crt_hat_inv = moduli[..crt_limbs]
            .iter()
            .zip(&crt_basis)
            .map(|(&q, &b)| ShoupConst::new(inv_mod((b % q as u128) as u64, q), q))
            .collect();

        let log2_p = (final_modulus as f64).log2();
        // The rescaling's rounding error (< 1 per dropped limb) reaches the result scaled by
        // p/Q'; Q' ≥ 2^20·p keeps it below 2^-20, inside the switching budget's +1.
        ensure!(
            (crt_modulus as f64).log2() >= log2_p + 20.0,
            InvalidArgument,
            "kept RNS modulus 2^{:.1} too small for the final modulus 2^{log2_p:.1}",
            (crt_modulus as f64).log2()
        );
        let headroom = (log2_p - t_bits as f64 - 1.0).floor();
        ensure!(
            headroom >= 4.0,
            InvalidArgument,
            "final modulus too small for t = 2^{t_bits}"
        );
        let h = headroom as u32;
        // The rounding gets at most ≈ half of 2^h (the dropped c0 bits and the switched flood
        // take a quarter each): the worst case when it fits, else its tail bound.
        let room = 2f64.powi(h as i32 - 1) * 0.9;
        let worst = (n as u64 + 1).div_ceil(2) + 1;
        let tail = (0.5 + TAIL_SIGMAS * (n as f64 / 4.0).sqrt()).ceil() as u64 + 1;
        let (switch_rounding, switch_bound) = if (worst as f64) < room {
            (worst, RoundingBound::WorstCase)
        } else {
            ensure!(
                (tail as f64) < room,
                InvalidArgument,
                "final modulus 2^{final_bits} leaves no room for the switching noise of N = {n} \
                 at t = 2^{t_bits} (even its 2^-69 tail bound {tail} ≥ {room:.0})"
            );
            (tail, RoundingBound::Tail)
        };
        let log2_q_over_p = log2_q - log2_p;
        // Capped at the sampler's 2^125 (a narrower flood only loosens the decryption bound).
        let flood_bits = ((h as f64 - 2.0 + (log2_q_over_p - 1e-9).floor()) as u32).min(125);
        let c0_drop_bits = h - 1;
        let bits_of = |v: u64| 64 - v.leading_zeros();
        let budget = NoiseBudget {
            headroom_bits: h,
            switch_rounding,
            switch_bound,
            c0_drop_bits,
            flood_bits,
            c0_width: bits_of((final_modulus - 1 + (1 << (c0_drop_bits - 1))) >> c0_drop_bits),
            c1_width: bits_of(final_modulus - 1),
            log2_q_over_p,
        };
        let special = Special::new(n, max_log_q, log2_q, &moduli, final_modulus);
        Ok(Params {
            inner: Arc::new(Inner {
                set: None,
                n,
                ring,
                moduli,
                plans,
                log2_q,
                delta,
                q_mod_t,
                crt_limbs,
                rescale_inv,
                crt_modulus,
                crt_basis,
                crt_hat_inv,
                final_modulus,
                final_plan,
                budget,
                special,
            }),
        })
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }
    /// The named set, if these are one.
    pub fn set(&self) -> Option<ParamSet> {
        self.inner.set
    }
    /// Automorphism levels of the Galois keys ([`ParamSet::galois_levels`];
    /// [`MIN_GALOIS_LEVELS`] for custom parameters).
    pub fn galois_levels(&self) -> usize {
        self.set()
            .map_or(MIN_GALOIS_LEVELS, ParamSet::galois_levels)
    }
    /// N, the ring degree.
    pub fn degree(&self) -> usize {
        self.inner.n
    }
    /// The plaintext ring Z_{2^ℓ}.
    pub fn ring(&self) -> Ring {
        self.inner.ring
    }
    /// The RNS primes of Q.
    pub fn moduli(&self) -> &[u64] {
        &self.inner.moduli
    }
    /// The number of RNS primes.
    pub fn limbs(&self) -> usize {
        self.inner.moduli.len()
    }
    /// log2 Q.
    pub fn log2_q(&self) -> f64 {
        self.inner.log2_q
    }
    /// The prime responses are switched to.
    pub fn final_modulus(&self) -> u64 {
        self.inner.final_modulus
    }
    /// The noise budget of a response.
    pub fn budget(&self) -> &NoiseBudget {
        &self.inner.budget
    }
    /// The key-switching prime P (log2(Q·P) within the HE-standard bound), if there is room.
    pub fn special_modulus(&self) -> Option<u64> {
        self.inner.special.as_ref().map(|s| s.modulus)
    }
    /// Bounds on the noise a server response must hide, for Σ_c w_c × ct_c with
    /// `l1` = Σ_c ‖w_c‖₁ and `l2sq` = Σ_c ‖w_c‖₂² (w_c the centred plaintext coefficients):
    /// returns (tail bound, worst case). The client knows its encryption noise e and the
    /// encoding rounding ε (|ε| ≤ 1 with the server's folded-in share), so w·(e + ε) is the
    /// weight-dependent part; the re-randomisation adds e_pk·u + e1 + e2·s ≤ 2·η·N + η.
    /// The tail bound uses Hoeffding on e ~ CBD(η) (sub-Gaussian, variance proxy η/2): it holds
    /// except with probability 2^-69 per coefficient (9.86 proxy deviations).
    pub fn product_noise_bounds(&self, l1: f64, l2sq: f64) -> (f64, f64) {
        let eta = crate::math::CBD_ETA as f64;
        let rerandomise = 2.0 * eta * self.degree() as f64 + eta + 1.0;
        let tail = l1 + TAIL_SIGMAS * (eta / 2.0 * l2sq).sqrt() + rerandomise;
        let worst = l1 * (eta + 1.0) + rerandomise;
        (tail, worst)
    }

    /// Checks a product Σ_c w_c × ct_c against the budget from public data only: `slots` is the
    /// total number of plaintext coefficient slots multiplied in and `max_abs` a public bound on
    /// every |w| (so the outcome never depends on secret values; see [`NoiseBudget::check`]).
    /// `extra` is public worst-case noise added after the products (output packing).
    pub fn check_public_product(&self, slots: f64, max_abs: f64, extra: f64) -> Result<()> {
        let (tail, worst) = self.product_noise_bounds(slots * max_abs, slots * max_abs * max_abs);
        self.budget().check(tail + extra, worst + extra)
    }

    /// Bits on the wire of one client ciphertext (its c0 in all limbs; c1 is a 16-byte seed).
    pub fn ciphertext_bits(&self) -> u64 {
        let limb_bits: u64 = self
            .moduli()
            .iter()
            .map(|&q| 64 - q.leading_zeros() as u64)
            .sum();
        limb_bits * self.degree() as u64 + 128
    }
    /// Bits on the wire of one response carrying `needed` c0 coefficients.
    pub fn response_bits(&self, needed: usize) -> u64 {
        let b = self.budget();
        b.c1_width as u64 * self.degree() as u64 + b.c0_width as u64 * needed as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Ring {
        Ring::new(41).unwrap()
    }

    #[test]
    fn named_sets_are_secure_and_consistent() {
        for set in [ParamSet::N8192, ParamSet::N8192Q4] {
            let p = Params::new(set, ring()).unwrap();
            assert!(p.log2_q() <= 218.0, "{p:?}");
            let b = p.budget();
            // Exact decryption with no plaintext noise at all.
            b.check(1.0, 1.0).unwrap();
            assert_eq!(ParamSet::from_id(set.id()).unwrap(), set);
        }
        assert_eq!(FLOOD_MARGIN_BITS, 69.0);
        let p = Params::new(ParamSet::N8192, ring()).unwrap();
        assert_eq!(p.budget().flood_bits, 104);
        // The session-margin edge: 2^36 of hidden noise under a 2^104 flood is the limit.
        p.budget().check(2f64.powi(36), 2f64.powi(36)).unwrap();
        assert!(matches!(
            p.budget().check(2f64.powf(36.01), 1.0),
            Err(Error::Insecure(_))
        ));
        let q4 = Params::new(ParamSet::N8192Q4, ring()).unwrap();
        assert_eq!(q4.budget().flood_bits, 122);
    }

    /// The workloads the sets are for: BERT-Base FC weights (|w| ≤ 2^17, inner dimension up to
    /// 3072, 64-slot weight blocks) and share × share products (|w| ≤ 2^40, 128 × 64 slots).
    #[test]
    fn sets_cover_their_workloads_with_public_bounds() {
        let w = Params::new(ParamSet::N8192, ring()).unwrap();
        w.check_public_product(3072.0 * 64.0, 2f64.powi(17), 0.0)
            .unwrap();
        assert!(w
            .check_public_product(3072.0 * 64.0, 2f64.powi(40), 0.0)
            .is_err());
        let s = Params::new(ParamSet::N8192Q4, ring()).unwrap();
        s.check_public_product(128.0 * 64.0, 2f64.powi(40), 0.0)
            .unwrap();
    }

    #[test]
    fn oversized_or_unknown_sets_are_insecure() {
        assert!(matches!(
            Params::custom(4096, 40, 3, 56, ring()),
            Err(Error::Insecure(_))
        ));
        assert!(matches!(
            Params::custom(8192, 50, 5, 57, ring()),
            Err(Error::Insecure(_))
        ));
        assert!(matches!(
            Params::custom(3000, 36, 3, 56, ring()),
            Err(Error::Insecure(_))
        ));
        assert!(ParamSet::from_id(9).is_err());
    }

    #[test]
    fn plaintext_ring_sizes_supported() {
        for bits in 32..=41 {
            for set in [ParamSet::N8192, ParamSet::N8192Q4, ParamSet::N8192Q4L48] {
                Params::new(set, Ring::new(bits).unwrap()).unwrap();
            }
        }
        // Beyond ℓ = 41 the 2^57 final modulus leaves room only for the switch's tail bound,
        // and at ℓ = 48 not even for that.
        for set in [ParamSet::N8192, ParamSet::N8192Q4] {
            let p = Params::new(set, Ring::new(42).unwrap()).unwrap();
            assert_eq!(p.budget().switch_bound, RoundingBound::Tail);
            assert!(Params::new(set, Ring::new(48).unwrap()).is_err());
        }
        for bits in 42..=48 {
            Params::new(ParamSet::N8192Q4L48, Ring::new(bits).unwrap()).unwrap();
        }
    }

    /// The ℓ ≤ 41 sets keep the worst-case rounding bound and every number they had (the
    /// encoder's layouts, bytes and flights depend on them).
    #[test]
    fn sets_at_l41_keep_the_worst_case_budget() {
        for (set, flood) in [(ParamSet::N8192, 104), (ParamSet::N8192Q4, 122)] {
            let b = *Params::new(set, ring()).unwrap().budget();
            assert_eq!(b.switch_bound, RoundingBound::WorstCase);
            assert_eq!(
                (
                    b.headroom_bits,
                    b.switch_rounding,
                    b.c0_drop_bits,
                    b.flood_bits
                ),
                (14, 4098, 13, flood)
            );
            assert_eq!((b.c0_width, b.c1_width), (44, 57));
        }
    }

    /// The ℓ = 48 budget, verified here rather than by hand: the worst-case rounding does not
    /// fit h = 12, the 2^-69 tail bound does; the flood covers 1,536-deep FC rows of weights up
    /// to 2^17 (the decoder's MLP, 64-slot blocks as the layouts cut them, and whole-ring rows)
    /// with the 69-bit margin, and refuses uniform 48-bit shares but takes 24-bit limbs.
    #[test]
    fn l48_set_budget_is_checked_in_code() {
        let p = Params::new(ParamSet::N8192Q4L48, Ring::new(48).unwrap()).unwrap();
        let b = *p.budget();
        assert!(
            p.log2_q() <= 218.0 && p.special_modulus().is_some(),
            "{p:?}"
        );
        assert!((p.final_modulus() as f64).log2() > 61.9);
        assert_eq!(b.headroom_bits, 12);
        assert_eq!(b.switch_bound, RoundingBound::Tail);
        assert_eq!(ParamSet::from_id(4).unwrap(), ParamSet::N8192Q4L48);
        let worst = (p.degree() as u64 + 1).div_ceil(2) + 1;
        assert!(
            worst as f64 >= 0.9 * 2f64.powi(11),
            "the worst case would fit"
        );
        assert_eq!(b.switch_rounding, 448); // 1/2 + 9.86·√2048 + 1, rounded up: ≈ 2^8.8
        assert_eq!(b.flood_bits, 115);
        b.check(1.0, 1.0).unwrap();
        for slots in [1536.0 * 64.0, 1536.0 * 8192.0] {
            p.check_public_product(slots, 2f64.powi(17), 0.0).unwrap();
        }
        let (tail, _) = p.product_noise_bounds(1536.0 * 64.0 * 2f64.powi(17), 0.0);
        assert!(b.flood_margin_bits(tail) > 80.0);
        assert!(matches!(
            p.check_public_product(128.0 * 64.0, 2f64.powi(47), 0.0),
            Err(Error::Insecure(_))
        ));
        p.check_public_product(128.0 * 64.0, 2f64.powi(23), 0.0)
            .unwrap();
    }
}
