//! Secret and public keys. The client owns the [`SecretKey`] (zeroized on drop) and sends the
//! [`PublicKey`] once per session; the server uses it only to re-randomise its responses.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use veil_core::{ensure, Prg, Result, Seed};
use zeroize::Zeroize;

use crate::params::{SESSION_REVEALED_LIMIT, SESSION_REVEALED_LOG2};

use crate::math::{fill_uniform_mod, neg_mod, sample_cbd, sample_ternary, signed_mod};
use crate::params::Params;
use crate::poly::RnsPoly;

/// Uniform polynomial in the NTT domain expanded from a 16-byte seed (uniform NTT slots are a
/// uniform polynomial, so no transform is needed on either side).
pub(crate) fn expand_uniform_ntt(p: &Params, seed: &Seed) -> RnsPoly {
    let mut prg = Prg::from_seed(seed);
    let mut out = RnsPoly::zero(p);
    let n = p.degree();
    for (limb, &q) in out.limbs_mut(n).zip(p.moduli()) {
        fill_uniform_mod(&mut prg, q, limb);
    }
    out
}

/// The client's ternary secret s, kept in the forms decryption and encryption need.
pub struct SecretKey {
    pub(crate) params: Params,
    /// -s in the NTT domain of every RNS limb.
    pub(crate) neg_s_ntt: Vec<u64>,
    /// s in the NTT domain of the final modulus.
    pub(crate) s_final_ntt: Vec<u64>,
    /// Response coefficients decrypted under this key: the same count the server keeps on the
    /// public key ([`PublicKey::revealed`]), so the client sees its key's budget run down.
    revealed: AtomicU64,
}

impl Drop for SecretKey {
    fn drop(&mut self) {
        self.neg_s_ntt.zeroize();
        self.s_final_ntt.zeroize();
    }
}

impl SecretKey {
    /// Samples a fresh uniform ternary secret.
    pub fn generate(params: &Params, prg: &mut Prg) -> Self {
        let mut s = sample_ternary(prg, params.degree());
        let mut neg = RnsPoly::from_signed(params, &s);
        for (limb, &q) in neg.limbs_mut(params.degree()).zip(params.moduli()) {
            for x in limb.iter_mut() {
                *x = neg_mod(*x, q);
            }
        }
        neg.ntt(params);
        let pf = params.final_modulus();
        let mut s_final: Vec<u64> = s.iter().map(|&c| signed_mod(c, pf)).collect();
        params.inner().final_plan.fwd(&mut s_final);
        s.zeroize();
        SecretKey {
            params: params.clone(),
            neg_s_ntt: neg.data,
            s_final_ntt: s_final,
            revealed: AtomicU64::new(0),
        }
    }

    /// The parameters of the key.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Response coefficients decrypted under this key so far (at most
    /// 2^[`SESSION_REVEALED_LOG2`]: the server refuses responses beyond it).
    pub fn revealed(&self) -> u64 {
        self.revealed.load(Ordering::SeqCst)
    }

    pub(crate) fn count_revealed(&self, count: usize) {
        self.revealed.fetch_add(count as u64, Ordering::SeqCst);
    }

    /// pk = (-a·s + e, a) with a expanded from a fresh seed.
    pub fn public_key(&self, prg: &mut Prg) -> PublicKey {
        let p = &self.params;
        let seed = Seed(prg.block());
        let a = expand_uniform_ntt(p, &seed);
        let mut e = sample_cbd(prg, p.degree());
        let mut pk0 = RnsPoly::from_signed(p, &e);
        e.zeroize();
        pk0.ntt(p);
        pk0.mul_acc(p, &a.data, &self.neg_s_ntt);
        PublicKey::new(p, seed, pk0.data, a.data)
    }
}

/// The client's public key, both halves in the NTT domain; on the wire only pk0 and a's seed.
///
/// It also carries the session's count of revealed response coefficients (shared by clones):
/// the flooding argument holds for at most 2^[`SESSION_REVEALED_LOG2`] of them per key, so
/// responses beyond that are refused and the parties must start a new session (new key).
#[derive(Clone)]
pub struct PublicKey {
    pub(crate) params: Params,
    pub(crate) seed: Seed,
    pub(crate) pk0_ntt: Vec<u64>,
    pub(crate) pk1_ntt: Vec<u64>,
    revealed: Arc<AtomicU64>,
}

impl PublicKey {
    pub(crate) fn new(params: &Params, seed: Seed, pk0_ntt: Vec<u64>, pk1_ntt: Vec<u64>) -> Self {
        PublicKey {
            params: params.clone(),
            seed,
            pk0_ntt,
            pk1_ntt,
            revealed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The parameters of the key.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Response coefficients revealed under this key so far.
    pub fn revealed(&self) -> u64 {
        self.revealed.load(Ordering::SeqCst)
    }

    /// Reserves `count` more revealed coefficients, or refuses ([`veil_core::Error::Insecure`])
    /// if the session total would exceed 2^[`SESSION_REVEALED_LOG2`].
    pub(crate) fn reserve_revealed(&self, count: usize) -> Result<()> {
        let reserved = self
            .revealed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| {
                r.checked_add(count as u64)
                    .filter(|&t| t <= SESSION_REVEALED_LIMIT)
            });
        ensure!(
            reserved.is_ok(),
            Insecure,
            "session would reveal more than 2^{SESSION_REVEALED_LOG2} coefficients under one key: \
             start a new session"
        );
        Ok(())
    }
}
