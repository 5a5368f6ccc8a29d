//! BFV homomorphic encryption (RNS, coefficient encoding, plaintext modulus t = 2^ℓ) for Veil's
//! linear layers: the client encrypts its share, the server multiplies by plaintext polynomials
//! and returns a hardened response the client decrypts to its new share.
//!
//! # Objects and flow
//! * [`Params`] / [`ParamSet`]: degree N, RNS primes q_i (tfhe-ntt `prime64::Plan` per prime),
//!   final prime p, and the [`NoiseBudget`]. Sets above the HE-standard 128-bit bound
//!   (log2 Q ≤ 109 at N=4096, ≤ 218 at N=8192, ternary secret) are refused (`Error::Insecure`).
//! * [`SecretKey`] (client, zeroized on drop) → [`PublicKey`] (sent once per session).
//! * [`SecretKey::encrypt`] → [`SeededCiphertext`]: c1 = a is expanded from a 16-byte seed (sent
//!   instead of the polynomial), c0 = −a·s + e + round(Q·m/t) is sent in the NTT domain.
//! * Server: [`EvalCiphertext::expand`], optional [`EvalCiphertext::add_plain`] (its own share),
//!   [`Accumulator::mul_acc`] with [`NttPlaintext`] weights, then
//!   [`Accumulator::into_response`] → [`Response`]; client: [`SecretKey::decrypt_response`].
//! * Output packing: [`SecretKey::galois_keys`] → [`GaloisKeys`] (sent once per session, at
//!   modulus Q·P with the set's special prime P, log2(Q·P) ≤ the HE-standard bound);
//!   [`GaloisKeys::pack`] merges up to `leaves` accumulators whose useful coefficients share a
//!   power-of-two stride into one ([`pack`]), so one response (one c1) carries the outputs of
//!   many products. The merge is exact on the kept coefficients; its key-switching noise is
//!   bounded in the worst case ([`PackShape::noise_bound`]) and carried into the checks below.
//! * [`wire`]: canonical bit-packed encodings of all four messages with strict validation.
//! * [`round_trip`]: the share-product exchange built from these (encrypt, multiply, mask,
//!   respond, decrypt), once for every HE protocol on shares.
//!
//! # Why the response is safe to send (semi-honest client), per session transcript
//! With secret-key encryption and c1 = a known to the client, the raw product has
//! c1' = Σ wᵢ·aᵢ, a linear function of the weights the client could solve. The server therefore
//! adds a fresh encryption of zero under the client's public key, (pk0·u + e1, pk1·u + e2) with
//! ternary u and CBD e1, e2, and adds uniform flooding noise E ∈ [−2^b, 2^b) to every c0
//! coefficient it sends. The client's view of a response is then (c1', v) with
//! c0' = −c1'·s + Δ·(result) + v. (i) c1' = Σ wᵢaᵢ + (pk1·u + e2) is pseudo-random by RLWE in u
//! (one sample with uniform pk1), independently of w. (ii) v = X + E with
//! X = w·(e + ε) + e_pk·u + e1 + e2·s, the noise that depends on the server's secrets.
//! A packed response is re-randomised and flooded once, after the merge: its c1' is the merged
//! c1 plus pk1·u + e2 (pseudo-random as before), and X additionally holds the key-switching
//! noise of the merge (a function of intermediate c1's, hence of w), which is bounded in the
//! worst case by [`PackShape::noise_bound`] and added to B below, so the argument is unchanged.
//! The coefficients of a packed ciphertext outside the merged class hold sums of unrelated
//! coefficients; they are never sent (only the needed c0 coefficients are).
//!
//! **Requirement:** the whole transcript a client receives in one session — up to
//! D = 2^[`SESSION_REVEALED_LOG2`] = 2^28 revealed coefficients (a BERT-Base inference reveals
//! ≈ 2^24), enforced per [`PublicKey`] — must be within statistical distance 2^-40 of a
//! simulation from the client's outputs. **Argument (hybrid over coefficients):**
//! 1. *Tail event.* |X| ≤ B at every coefficient, where B ([`Params::product_noise_bounds`]) is
//!    the deterministic part (‖w‖₁·|ε| and the re-randomisation terms, ≤ 2·η·N + η + 1) plus a
//!    Hoeffding bound on w·e with e ~ CBD(η) (sub-Gaussian, variance proxy η/2):
//!    P[|w·e| > x·√(η/2·‖w‖₂²)] ≤ 2·exp(−x²/2) = 2^-69 for x = 9.86. By a union bound over D
//!    coefficients all bounds hold except with probability D·2^-69 = 2^-41.
//! 2. *Flooding.* Given |X| ≤ B, SD(X + E, E) = |X|/2^(b+1) ≤ B/2^(b+1) for uniform E of width
//!    2^(b+1). Floods are independent per coefficient, so replacing the D coefficients one at a
//!    time by a fresh uniform value adds at most D·B/2^(b+1) ≤ 2^-41 when
//!    b + 1 − log2 B ≥ [`FLOOD_MARGIN_BITS`] = 40 + 28 + 1 = 69, the margin
//!    [`NoiseBudget::check`] enforces.
//! 3. Total: 2^-41 + 2^-41 = 2^-40. The simulator samples uniform c1', uniform v in the flood
//!    range and sets c0'; modulus switching and dropping coefficients are public post-processing.
//!
//! B is computed from **public** data only (with packing: + the merge's worst-case noise): the plaintext's declared bound max|w| (weights:
//! `veil_linear::fc::WEIGHT_BOUND` = 2^17 at f = 13; shares: 2^(ℓ−1)) times its number of slots,
//! never from secret values; [`NttPlaintext`] refuses coefficients above the bound and
//! [`Accumulator`] carries the bounds, so [`Accumulator::into_response`] always checks.
//!
//! *Cheaper alternative (not implemented):* a discrete Gaussian flood of parameter σ has
//! per-coordinate KL ≤ B²/(2σ²), KL adds over coordinates, and Pinsker gives
//! SD ≤ √(D·B²/(4σ²)), so σ ≥ 2^39·√D·B = 2^53·B (margin 53 + 1 instead of 69) would save ≈15
//! bits of Q; it needs a constant-time sampler for σ ≈ 2^90 that is provably close to the ideal
//! distribution over 2^28 samples, which this crate does not have yet.
//!
//! # Noise budget (decryption)
//! After switching to p, decryption round(t·x/p) is exact while |noise| < p/(2t), i.e. below
//! 2^h with h = ⌊log2(p/2t)⌋. The budget is split: switching rounding (below), dropped c0 bits
//! 2^(h−2), switched flood 2^(h−2) (so b = h − 2 + ⌊log2(Q/p)⌋, capped at 125), and the rest
//! (< 2^(h−2)) for the switched plaintext noise, checked in the worst case (CBD noise is bounded
//! by η = 21 exactly).
//!
//! **Switch rounding** ([`RoundingBound`]): ε0 + Σ_i ε_i·s_i with |ε| ≤ 1/2, at most
//! (1 + ‖s‖₁)/2 + 1 ≤ (N+3)/2 in the worst case, which every set uses while it fits
//! (< 0.9·2^(h−1); all sets at ℓ ≤ 41: decryption is then exact for every secret). At ℓ = 48 no
//! u64 final modulus leaves room for it (h ≥ 14 would need p ≥ 2^63), so there the budget uses
//! its tail bound: c1 is a function of public uniform polynomials (the ciphertexts' seeds, pk1,
//! the Galois keys' uniform parts) and server randomness, never of s, so for any c1 the sum is
//! over N independent zero-mean terms of range ≤ 1 in the client's uniform ternary s, and
//! Hoeffding gives |Σ| ≤ 9.86·√(N/4) ≈ 446 (2^8.8 at N = 8192) except with probability 2^-69
//! per coefficient, 2^-41 per session (union bound over 2^28). **Exceeding it is a correctness
//! failure, not a leak**: the client decodes its own share off by one; the server's view does
//! not change, and the client's view is simulated above whether or not decryption succeeds
//! (the flooding argument does not use it). The 2^-41 is thus a bound on a wrong result per
//! session, separate from the 2^-40 statistical distance of the transcript.
//!
//! | set | N | Q | p | ℓ | h | rounding | flood b | hides (69-bit margin) | c0 / c1 bits | for |
//! |---|---|---|---|---|---|---|---|---|---|---|
//! | N8192 | 8192 | 3 × 50-bit (≈150) | ≈2^57 | 41 | 14 | 4,098 (worst) | 104 | 2^36 | 44 / 57 | FC weights ≤ 2^17 |
//! | N8192Q4 | 8192 | 4 × 42-bit (≈168) | ≈2^57 | 41 | 14 | 4,098 (worst) | 122 | 2^54 | 44 / 57 | ℓ-bit shares |
//! | N8192Q4L48 | 8192 | 4 × 42-bit (≈168) | ≈2^62 | 48 | 12 | 448 (tail) | 115 | 2^47 | 51 / 62 | FC weights ≤ 2^17; 24-bit limbs of shares |
//!
//! For a product Σ_c w_c × Enc(m_c) with S weight slots in all under the bound W, B ≈ S·W +
//! 9.86·√(10.5·S)·W + 2·21·N. BERT-Base FC layers (S ≤ 3072·64, W = 2^17) give B ≤ 2^35;
//! per-head attention products with share operands (S ≤ 128·64, W = 2^40) give B ≤ 2^54. At
//! ℓ = 48 a decoder FC row of 1,536 (S = 1536·64, W = 2^17) gives B ≈ 2^33.6 (margin 82 under
//! N8192Q4L48); a uniform 48-bit share (W = 2^47) would need 2^60, beyond any flood N = 8192
//! allows with room for the Galois keys, so shares are multiplied as two 24-bit limbs
//! (W = 2^23, B ≈ 2^36). N = 4096 (log Q ≤ 109) cannot reach a 69-bit margin over even the
//! re-randomisation noise, so no set uses it.
//! Decryption is exact for every product the check accepts at ℓ in 32..=41, and exact except
//! with probability 2^-69 per coefficient where the tail bound is used (ℓ = 48); larger ℓ than
//! a set's final modulus allows is refused at construction. The tests run products at the
//! largest weights the check accepts (`edge_weights_*`, at ℓ = 41 and 48) and check the
//! switch's rounding against an exact long division at the extreme moduli the parameter checks
//! allow.
//!
//! # Side channels
//! Arithmetic on residues, the switch, decoding and the encoders are branch-free in secret values
//! (masks instead of branches); the client's encryption noise, scaled messages and the
//! decryption buffer c1·s are zeroized after use, and the secret key on drop.

#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

mod cipher;
mod galois;
mod keys;
mod math;
mod pack;
mod params;
mod poly;
mod response;
pub mod round_trip;
pub mod session;
pub mod wire;

pub use cipher::{Accumulator, EvalCiphertext, NttPlaintext, SeededCiphertext};
pub use galois::{GaloisKeys, MAX_GALOIS_LEVELS, MIN_GALOIS_LEVELS};
pub use keys::{PublicKey, SecretKey};
pub use pack::PackShape;
pub use params::{
    NoiseBudget, ParamSet, Params, RoundingBound, FLOOD_MARGIN_BITS, SESSION_REVEALED_LIMIT,
    SESSION_REVEALED_LOG2, STAT_SECURITY_BITS,
};
pub use response::Response;

#[cfg(test)]
mod cross_check;
#[cfg(test)]
mod tests;
