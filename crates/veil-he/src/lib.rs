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
//! * [`wire`]: canonical bit-packed encodings of all three messages with strict validation.
//!
//! # Why the response is safe to send (semi-honest client)
//! With secret-key encryption and c1 = a known to the client, the raw product has
//! c1' = Σ wᵢ·aᵢ, a linear function of the weights the client could solve. The server therefore
//! adds a fresh encryption of zero under the client's public key, (pk0·u + e1, pk1·u + e2) with
//! ternary u and CBD e1, e2, and adds uniform flooding noise E ∈ [−2^b, 2^b) to every c0
//! coefficient it sends. The client's view of a response is then (c1', v) with
//! c0' = −c1'·s + Δ·(result) + v. (i) c1' = Σ wᵢaᵢ + (pk1·u + e2) is pseudo-random by RLWE in u
//! (one sample with uniform pk1), independently of w. (ii) v = w·(e + ε) + e_pk·u + e1 + e2·s + E:
//! everything but E is bounded by `hidden` ([`Params::product_noise_bounds`], a Hoeffding tail
//! bound on the client's CBD noise, failure 2^-41 per coefficient, plus the deterministic
//! rounding terms), and uniform E of width 2^(b+1) makes v's distribution 2^-40-close per
//! coefficient to one independent of w when b + 1 − log2(hidden) ≥ 40 — the check
//! [`NoiseBudget::check`] enforces for every prepared matrix. A simulator knowing only the
//! decrypted result samples uniform c1', uniform v in the flood range, and sets c0'; modulus
//! switching and dropping coefficients are public post-processing of this view. The flooding
//! bound is per coefficient (40 bits of margin, as specified); over D revealed coefficients
//! the distance adds up to D·2^-40 (D ≈ 2^17 for a BERT-Base FC): a stricter whole-transcript
//! reading would need log2 D more bits of Q.
//!
//! # Noise budget (exact decryption)
//! After switching to p, decryption round(t·x/p) is exact while |noise| < p/(2t), i.e. below
//! 2^h with h = ⌊log2(p/2t)⌋. The budget is split: switching rounding (1 + ‖s‖₁)/2 + 1 ≤ (N+3)/2,
//! dropped c0 bits 2^(h−2), switched flood 2^(h−2) (so b = h − 2 + ⌊log2(Q/p)⌋), and the rest
//! (< 2^(h−2)) for the switched plaintext noise. With ℓ = 41:
//!
//! | set | N | Q | p | h | flood b | hides (40-bit margin) | c0 / c1 bits |
//! |---|---|---|---|---|---|---|---|
//! | N4096 | 4096 | 3 × 36-bit (≈108) | ≈2^56 | 13 | 62 | 2^23 | 44 / 56 |
//! | N8192 | 8192 | 3 × 50-bit (≈150) | ≈2^57 | 14 | 104 | 2^65 | 44 / 57 |
//!
//! For a product Σ_c w_c × Enc(m_c) the hidden noise is ≈ Σ‖w_c‖₁ + 7.63·√(10.5·Σ‖w_c‖₂²) +
//! 2·21·N. Fixed-point weights at f = 13 (|w·2^f| ≲ 2^11, inner dimension ≤ 3072, Cheetah blocks
//! with m_w ≤ 4) stay below 2^23 on N4096; uniform 41-bit shares as plaintexts (≈2^48 for
//! k = 64) need N8192. Exactness holds for every shape the check accepts and any ℓ in 32..=41
//! (larger ℓ is refused at construction: the final modulus would leave no room for the
//! switching noise); f plays no role in the HE layer beyond the weights' magnitude |w·2^f|.
//! The tests run products at the largest weights the check accepts (`edge_weights_*`).

pub(crate) mod math;
pub mod params;
pub(crate) mod poly;

pub use params::{NoiseBudget, ParamSet, Params, STAT_SECURITY_BITS};
pub mod cipher;
pub mod keys;
pub mod response;

pub use cipher::{Accumulator, EvalCiphertext, NttPlaintext, SeededCiphertext};
pub use keys::{PublicKey, SecretKey};
pub use response::Response;

#[cfg(test)]
mod cross_check;
#[cfg(test)]
pub(crate) mod tests;
pub mod wire;
