//! Scalar modular arithmetic and the samplers every BFV object is built from.

use veil_core::Prg;

#[inline]
pub(crate) fn mul_mod(a: u64, b: u64, q: u64) -> u64 {
    ((a as u128 * b as u128) % q as u128) as u64
}

/// All-ones if the top bit of `v` is set, else zero (the sign of a wrapped difference).
#[inline]
pub(crate) fn sign_mask(v: u64) -> u64 {
    0u64.wrapping_sub(v >> 63)
}

/// `v mod q` for v < 2q, without a branch (q < 2^63).
#[inline]
pub(crate) fn reduce_once(v: u64, q: u64) -> u64 {
    let t = v.wrapping_sub(q);
    t.wrapping_add(q & sign_mask(t))
}

/// Branch-free modular arithmetic on residues (q < 2^62): residues are secret data, so neither
/// time nor the branch predictor may depend on them.
#[inline]
pub(crate) fn add_mod(a: u64, b: u64, q: u64) -> u64 {
    reduce_once(a + b, q)
}

#[inline]
pub(crate) fn sub_mod(a: u64, b: u64, q: u64) -> u64 {
    let d = a.wrapping_sub(b);
    d.wrapping_add(q & sign_mask(d))
}

/// −x mod q for a residue x < q, without a branch.
#[inline]
pub(crate) fn neg_mod(x: u64, q: u64) -> u64 {
    let nonzero = 0u64.wrapping_sub((x | x.wrapping_neg()) >> 63);
    (q - x) & nonzero
}

/// `a` if `mask` is all ones, `b` if it is zero.
#[inline]
pub(crate) fn select(mask: u64, a: u64, b: u64) -> u64 {
    (a & mask) | (b & !mask)
}

pub(crate) fn pow_mod(mut b: u64, mut e: u64, q: u64) -> u64 {
    let mut r = 1 % q;
    b %= q;
    while e > 0 {
        if e & 1 == 1 {
            r = mul_mod(r, b, q);
        }
        b = mul_mod(b, b, q);
        e >>= 1;
    }
    r
}

/// Multiplication by a constant w modulo q < 2^63 with Shoup's precomputed quotient
/// w' = ⌊w·2^64/q⌋: two multiplications and no division.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShoupConst {
    w: u64,
    w_shoup: u64,
}

impl ShoupConst {
    pub(crate) fn new(w: u64, q: u64) -> Self {
        ShoupConst {
            w,
            w_shoup: (((w as u128) << 64) / q as u128) as u64,
        }
    }

    /// x·w mod q for any x < q.
    #[inline]
    pub(crate) fn mul(self, x: u64, q: u64) -> u64 {
        let quot = ((x as u128 * self.w_shoup as u128) >> 64) as u64;
        let r = x.wrapping_mul(self.w).wrapping_sub(quot.wrapping_mul(q));
        reduce_once(r, q)
    }
}

/// Reduction modulo q < 2^62 of any 64-bit value with the precomputed μ = ⌊2^64/q⌋: one
/// high multiplication and no division (the quotient estimate is at most one low).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Barrett {
    mu: u64,
}

impl Barrett {
    pub(crate) fn new(q: u64) -> Self {
        assert!(q > 1 && q < 1 << 62, "Barrett modulus {q}");
        Barrett {
            mu: ((1u128 << 64) / q as u128) as u64,
        }
    }

    /// x mod q, branch-free.
    #[inline]
    pub(crate) fn reduce(self, x: u64, q: u64) -> u64 {
        let quot = ((x as u128 * self.mu as u128) >> 64) as u64;
        reduce_once(x - quot * q, q)
    }
}

/// Inverse modulo a prime `q` (Fermat).
pub(crate) fn inv_mod(a: u64, q: u64) -> u64 {
    pow_mod(a, q - 2, q)
}

/// Residue of a signed integer modulo `q`. Branch-free in the value for |x| < q (every secret
/// Veil reduces: noise, secrets, ℓ-bit shares and weights are below the smallest prime); only
/// larger inputs take the division.
#[inline]
pub(crate) fn signed_mod(x: i64, q: u64) -> u64 {
    let a = x.unsigned_abs();
    let r = if a < q { a } else { a % q };
    select(sign_mask(x as u64), neg_mod(r, q), r)
}

/// Residue of a signed integer with |x| < q: one masked addition, branch-free and vectorisable
/// (the caller guarantees the bound; [`signed_mod`] handles any x).
#[inline]
pub(crate) fn small_signed_mod(x: i64, q: u64) -> u64 {
    (x as u64).wrapping_add(q & sign_mask(x as u64))
}

/// Deterministic Miller–Rabin for 64-bit integers (these bases are exact below 2^64).
pub(crate) fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    for p in [2u64, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37] {
        if n.is_multiple_of(p) {
            return n == p;
        }
    }
    let (mut d, mut s) = (n - 1, 0);
    while d % 2 == 0 {
        d /= 2;
        s += 1;
    }
    'witness: for a in [2u64, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37] {
        let mut x = pow_mod(a, d, n);
        if x == 1 || x == n - 1 {
            continue;
        }
        for _ in 1..s {
            x = mul_mod(x, x, n);
            if x == n - 1 {
                continue 'witness;
            }
        }
        return false;
    }
    true
}

/// The `count` largest primes below 2^bits that are ≡ 1 (mod 2n), i.e. support a negacyclic NTT
/// of size n. Deterministic, so both parties derive the same moduli from the parameter set.
pub(crate) fn ntt_primes(bits: u32, n: usize, count: usize, exclude: &[u64]) -> Vec<u64> {
    let step = 2 * n as u64;
    let mut q = ((1u64 << bits) - 1) / step * step + 1;
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        assert!(q > step, "ran out of NTT primes below 2^{bits}");
        if is_prime(q) && !exclude.contains(&q) {
            out.push(q);
        }
        q -= step;
    }
    out
}

/// Uniform ternary coefficients in {-1, 0, 1} (bytes below 255 reduced mod 3, 255 rejected).
pub(crate) fn sample_ternary(prg: &mut Prg, n: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(n);
    let mut buf = [0u8; 512];
    while out.len() < n {
        prg.fill(&mut buf);
        for &b in buf.iter().filter(|&&b| b < 255) {
            if out.len() == n {
                break;
            }
            out.push((b % 3) as i64 - 1);
        }
    }
    out
}

/// Centred binomial distribution with η = 21 (σ² = 10.5, σ ≈ 3.24 ≥ the HE standard's 3.2):
/// every sample lies in [-21, 21], which makes the noise bounds below exact, not probabilistic.
pub(crate) const CBD_ETA: i64 = 21;

pub(crate) fn sample_cbd(prg: &mut Prg, n: usize) -> Vec<i64> {
    const M: u64 = (1 << CBD_ETA) - 1;
    let mut bytes = vec![0u8; 8 * n];
    prg.fill(&mut bytes);
    bytes
        .chunks_exact(8)
        .map(|c| {
            let x = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            (x & M).count_ones() as i64 - ((x >> CBD_ETA) & M).count_ones() as i64
        })
        .collect()
}

/// Fills `out` with uniform residues modulo `q` by rejection on the next power of two.
pub(crate) fn fill_uniform_mod(prg: &mut Prg, q: u64, out: &mut [u64]) {
    let mask = q.next_power_of_two() - 1;
    let mut buf = [0u8; 8 * 256];
    let mut pos = buf.len();
    for slot in out.iter_mut() {
        loop {
            if pos == buf.len() {
                prg.fill(&mut buf);
                pos = 0;
            }
            let v = u64::from_le_bytes(buf[pos..pos + 8].try_into().expect("8 bytes")) & mask;
            pos += 8;
            if v < q {
                *slot = v;
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes_and_inverses() {
        assert!(is_prime(0xffff_ffff_ffff_ffc5)); // largest 64-bit prime
        assert!(!is_prime(561) && !is_prime(1));
        let ps = ntt_primes(36, 4096, 3, &[]);
        for &p in &ps {
            assert!(is_prime(p) && p % 8192 == 1 && p < 1 << 36);
            assert_eq!(mul_mod(inv_mod(12345, p), 12345, p), 1);
        }
        assert!(ps[0] > ps[1] && ps[1] > ps[2]);
    }

    #[test]
    fn signed_mod_matches_rem_euclid() {
        for &q in &[97u64, (1 << 36) - 5, (1 << 62) + 1] {
            for &x in &[0i64, 1, -1, 96, -97, 98, i64::MIN, i64::MAX, -(1 << 40) - 3] {
                assert_eq!(signed_mod(x, q) as i128, (x as i128).rem_euclid(q as i128));
            }
        }
    }

    #[test]
    fn shoup_matches_u128() {
        let q = ntt_primes(50, 8192, 1, &[])[0];
        let mut prg = Prg::from_seed(&veil_core::Seed([3; 16]));
        for _ in 0..1000 {
            let (w, x) = (prg.below(q), prg.below(q));
            assert_eq!(ShoupConst::new(w, q).mul(x, q), mul_mod(x, w, q));
        }
    }

    #[test]
    fn barrett_matches_rem_at_the_edges() {
        let mut prg = Prg::from_seed(&veil_core::Seed([5; 16]));
        for &q in &[2u64, 97, ntt_primes(42, 8192, 1, &[])[0], (1 << 62) - 57] {
            let b = Barrett::new(q);
            let edges = [0, 1, q - 1, q, q + 1, 2 * q - 1, u64::MAX, u64::MAX - q];
            for x in edges.into_iter().chain((0..1000).map(|_| prg.u64())) {
                assert_eq!(b.reduce(x, q), x % q, "{x} mod {q}");
            }
        }
    }

    #[test]
    fn samplers_stay_in_range() {
        let mut prg = Prg::from_seed(&veil_core::Seed([7; 16]));
        let e = sample_cbd(&mut prg, 10_000);
        assert!(e.iter().all(|&x| x.abs() <= CBD_ETA));
        let var = e.iter().map(|&x| (x * x) as f64).sum::<f64>() / e.len() as f64;
        assert!((var - 10.5).abs() < 1.0, "variance {var}");
        let s = sample_ternary(&mut prg, 3000);
        assert!(s.iter().all(|&x| (-1..=1).contains(&x)));
        assert!((0..3).all(|v| s.iter().filter(|&&x| x == v - 1).count() > 800));
        let mut u = vec![0u64; 1000];
        fill_uniform_mod(&mut prg, 97, &mut u);
        assert!(u.iter().all(|&x| x < 97));
    }
}
