//! Base OT: the "simplest OT" of Chou and Orlandi (Latincrypt 2015) on the Ristretto group.
//!
//! Sender: `a ← Z_q`, sends `A = a·G`. Receiver with choice `c`: `b ← Z_q`, sends
//! `B = b·G + c·A` and keeps `k_c = H(i, A, B, b·A)`. Sender: `k_0 = H(i, A, B, a·B)`,
//! `k_1 = H(i, A, B, a·(B − A))`. H is SHA-256 over a domain tag, the OT index and the whole
//! transcript of that OT (so keys are bound to it), truncated to 128 bits.
//!
//! Security: semi-honest (honest-but-curious) under CDH in the random-oracle model; 128-bit
//! computational security (Ristretto255 offers ~126-bit discrete-log security, the standard
//! "128-bit" group). Used only for the 128 seed OTs of IKNP, so its cost (two scalar
//! multiplications per OT and party) is paid once per session. Rounds: two flights
//! (sender → receiver, receiver → sender).

use curve25519_dalek::ristretto::{CompressedRistretto, RistrettoPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::Identity;
use rand_core::OsRng;
use sha2::{Digest, Sha256};
use subtle::{Choice, ConditionallySelectable};
use veil_core::{ensure, Error, Result};
use veil_net::Channel;
use zeroize::{Zeroize, Zeroizing};

/// At most this many base OTs per call: bounds the receiver's message a sender accepts.
pub const MAX_BASE_OTS: usize = 1 << 12;

fn key(i: usize, a: &CompressedRistretto, b: &CompressedRistretto, p: &RistrettoPoint) -> u128 {
    let mut h = Sha256::new();
    h.update(b"veil-ot/chou-orlandi/v1");
    h.update((i as u64).to_le_bytes());
    h.update(a.as_bytes());
    h.update(b.as_bytes());
    h.update(p.compress().as_bytes());
    let d = h.finalize();
    u128::from_le_bytes(d[..16].try_into().expect("32-byte digest"))
}

fn decompress(bytes: &[u8], what: &str) -> Result<(CompressedRistretto, RistrettoPoint)> {
    let c = CompressedRistretto::from_slice(bytes)
        .map_err(|_| Error::Malformed(format!("{what}: point is not 32 bytes")))?;
    let p = c
        .decompress()
        .ok_or_else(|| Error::Malformed(format!("{what}: not a Ristretto point")))?;
    ensure!(
        p != RistrettoPoint::identity(),
        Malformed,
        "{what}: identity point"
    );
    Ok((c, p))
}

/// Sender of `n` base OTs: returns the key pairs `(k_0, k_1)`.
pub fn send<C: Channel>(ch: &mut C, n: usize) -> Result<Vec<[u128; 2]>> {
    ensure!(
        n <= MAX_BASE_OTS,
        InvalidArgument,
        "{n} base OTs exceed {MAX_BASE_OTS}"
    );
    let mut a = Scalar::random(&mut OsRng);
    let big_a = RistrettoPoint::mul_base(&a);
    let a_c = big_a.compress();
    ch.send_msg(a_c.as_bytes())?;
    ch.flush()?;
    let msg = match ch.recv_msg_exact(32 * n) {
        Ok(msg) => msg,
        Err(e) => {
            a.zeroize();
            return Err(e);
        }
    };
    // Keys and the shared points are wiped even when a later point is rejected.
    let mut out = Zeroizing::new(Vec::with_capacity(n));
    let a_big_a = Zeroizing::new(a * big_a);
    let result = msg.chunks_exact(32).enumerate().try_for_each(|(i, chunk)| {
        let (b_c, b) = decompress(chunk, "base OT receiver point")?;
        let ab = Zeroizing::new(a * b);
        let ab_minus = Zeroizing::new(*ab - *a_big_a);
        out.push([key(i, &a_c, &b_c, &ab), key(i, &a_c, &b_c, &ab_minus)]);
        Ok(())
    });
    a.zeroize();
    result.map(|()| std::mem::take(&mut *out))
}

/// Receiver of base OTs with the given choices: returns `k_{c_i}`.
pub fn receive<C: Channel>(ch: &mut C, choices: &[bool]) -> Result<Vec<u128>> {
    ensure!(
        choices.len() <= MAX_BASE_OTS,
        InvalidArgument,
        "{} base OTs exceed {MAX_BASE_OTS}",
        choices.len()
    );
    let msg = ch.recv_msg_exact(32)?;
    let (a_c, big_a) = decompress(&msg, "base OT sender point")?;
    let mut reply = Vec::with_capacity(32 * choices.len());
    let mut out = Zeroizing::new(Vec::with_capacity(choices.len()));
    for (i, &c) in choices.iter().enumerate() {
        let mut b = Scalar::random(&mut OsRng);
        let b_g = Zeroizing::new(RistrettoPoint::mul_base(&b));
        // B = bG + c·A, selected in constant time (no branch on the secret choice).
        let big_b =
            RistrettoPoint::conditional_select(&b_g, &(*b_g + big_a), Choice::from(c as u8));
        let b_c = big_b.compress();
        reply.extend_from_slice(b_c.as_bytes());
        let shared = Zeroizing::new(b * big_a);
        out.push(key(i, &a_c, &b_c, &shared));
        b.zeroize();
    }
    ch.send_msg(&reply)?;
    ch.flush()?;
    Ok(std::mem::take(&mut *out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use veil_core::Prg;
    use veil_net::run_two_party;

    #[test]
    fn receiver_gets_exactly_the_chosen_key() {
        let mut prg = Prg::from_os_entropy();
        let choices: Vec<bool> = (0..128).map(|_| prg.bit()).collect();
        let ch2 = choices.clone();
        let (got, pairs) = run_two_party(move |c| receive(c, &ch2), |s| send(s, 128)).unwrap();
        for i in 0..128 {
            assert_eq!(got[i], pairs[i][choices[i] as usize]);
            assert_ne!(got[i], pairs[i][!choices[i] as usize]);
        }
    }

    #[test]
    fn garbage_points_are_rejected() {
        let r = run_two_party(
            |c| {
                c.recv_msg(64)?;
                c.send_msg(&[0xff; 64])?;
                Ok(())
            },
            |s| send(s, 2),
        );
        assert!(matches!(r, Err(Error::Malformed(_))), "{r:?}");
        let r = run_two_party(
            |c| receive(c, &[true]),
            |s| {
                s.send_msg(&[0u8; 31])?;
                Ok(())
            },
        );
        assert!(r.is_err());
    }
}
