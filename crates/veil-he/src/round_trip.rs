//! The share-product round trip, the one exchange every HE protocol on shares runs: the client
//! encrypts its operands and sends them in one message; the server multiplies them by its
//! plaintexts (the caller's step), merges each group of products into one ciphertext, hardens
//! and masks it, and answers with every response in one message; the client decrypts the
//! coefficients it needs. Afterwards the client holds product + add − r and the server r, fresh
//! uniform values: an additive sharing mod 2^ℓ.
//!
//! Used by Π_MatMul (`veil_linear::matmul`) and LayerNorm's row products
//! (`veil_nonlinear`'s `he_rows`), which differ only in where their values sit in the
//! polynomials and which plaintexts multiply them.
//!
//! **Security:** that of [`Accumulator::into_response`] (crate docs): the server sees seeded
//! ciphertexts under the client's key, the client only re-randomised, flooded responses whose
//! decoded values the masks hide.
//! **Flights:** 2 (client → server, server → client), whatever the number of operands.

use veil_core::parallel::parallel_map;
use veil_core::{bail, ensure, Prg, Result};
use veil_net::Channel;

use crate::cipher::{Accumulator, EvalCiphertext};
use crate::galois::GaloisKeys;
use crate::keys::{PublicKey, SecretKey};
use crate::pack::PackShape;
use crate::params::Params;
use crate::response::Response;
use crate::wire;

/// Client: encrypts `count` plaintexts (`plaintext(i)`: the i-th one's coefficients mod t) on the
/// worker pool and sends them as one message.
pub fn send_operands<C: Channel + ?Sized>(
    ch: &mut C,
    sk: &SecretKey,
    count: usize,
    plaintext: impl Fn(usize) -> Vec<u64> + Sync,
) -> Result<()> {
    let cts = parallel_map(count, |i, prg| sk.encrypt(&plaintext(i), prg))?;
    ch.send_msg(&wire::encode_ciphertexts(sk.params(), &cts))?;
    ch.flush()
}

/// Server: receives the client's `count` ciphertexts and expands them; `fold(i, ct)` may add
/// the server's own plaintext to the i-th (its share of the operand).
pub fn receive_operands<C: Channel + ?Sized>(
    ch: &mut C,
    p: &Params,
    count: usize,
    fold: impl Fn(usize, &mut EvalCiphertext) -> Result<()> + Sync,
) -> Result<Vec<EvalCiphertext>> {
    let msg = ch.recv_msg(wire::ciphertexts_len(p, count))?;
    let cts = wire::decode_ciphertexts(p, &msg, count)?;
    parallel_map(count, |i, _| {
        let mut ev = EvalCiphertext::expand(p, &cts[i]);
        fold(i, &mut ev)?;
        Ok(ev)
    })
}

/// Server: one response from a group of products, merged by `shape` with the client's Galois
/// keys (or a single product, `shape` `None`), revealing product + `add(i)` − rᵢ at
/// `positions[i]`. Returns the response and the server's shares rᵢ, drawn from `prg`.
pub fn respond(
    pk: &PublicKey,
    galois: Option<&GaloisKeys>,
    members: Vec<Accumulator>,
    shape: Option<&PackShape>,
    positions: &[usize],
    add: impl Fn(usize) -> u64,
    prg: &mut Prg,
) -> Result<(Response, Vec<u64>)> {
    let acc = match shape {
        Some(s) => match galois {
            Some(gk) => gk.pack(members, s)?,
            None => bail!(
                InvalidArgument,
                "a packed response needs the client's Galois keys"
            ),
        },
        None => {
            ensure!(
                members.len() == 1,
                InvalidArgument,
                "{} products for one unpacked response",
                members.len()
            );
            members.into_iter().next().expect("one member")
        }
    };
    let ring = pk.params().ring();
    let shares: Vec<u64> = positions.iter().map(|_| prg.ring_elem(ring)).collect();
    let revealed: Vec<u64> = shares
        .iter()
        .enumerate()
        .map(|(i, &r)| ring.sub(add(i), r))
        .collect();
    Ok((acc.into_response(pk, positions, &revealed, prg)?, shares))
}

/// Server: sends every response of the round trip as one message.
pub fn send_responses<C: Channel + ?Sized>(
    ch: &mut C,
    p: &Params,
    responses: &[Response],
) -> Result<()> {
    ch.send_msg(&wire::encode_responses(p, responses))?;
    ch.flush()
}

/// Client: receives one response per entry of `positions` and decrypts each at its positions.
pub fn receive_results<C: Channel + ?Sized>(
    ch: &mut C,
    sk: &SecretKey,
    positions: &[Vec<usize>],
) -> Result<Vec<Vec<u64>>> {
    let p = sk.params();
    let needed: Vec<usize> = positions.iter().map(Vec::len).collect();
    let msg = ch.recv_msg(wire::responses_len(p, &needed))?;
    let responses = wire::decode_responses(p, &msg, &needed)?;
    parallel_map(responses.len(), |g, _| {
        sk.decrypt_response(&responses[g], &positions[g])
    })
}
