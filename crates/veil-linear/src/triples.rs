//! Offline/online split of the products of two shared matrices (the attention's Q·Kᵀ and A·V):
//! Beaver's multiplication triples, one matrix triple per head.
//!
//! **Offline** ([`triples_client`] / [`triples_server`]): each party draws uniform shares of
//! U_h (n×k) and V_h (k×m) from its OS-seeded CSPRNG, and [`crate::cross`] (BFV, all heads in
//! one product per direction) turns them into shares of W_h = U_h·V_h.
//! **Online** ([`beaver_matmul`]): the parties open E_h = A_h − U_h and F_h = B_h − V_h (the
//! client's shares in one message, then the server's in one), and each computes its share of
//! A_h·B_h = W_h + E_h·V_h + U_h·F_h + E_h·F_h locally (the last term on the client's share
//! only): plaintext products mod 2^ℓ.
//!
//! **Security (semi-honest).** Offline: [`crate::cross`]'s transcript. Online: E and F are A and
//! B plus one-time pads uniform over Z_2^ℓ (U and V are uniform and never reused), so they are
//! uniform and independent of A and B. A [`Triple`] is a value the online step takes by value
//! (not `Clone`), so a triple cannot be used twice; its shares are zeroized on drop, and the
//! online step checks each triple's shape against its operands.
//! **Error:** as [`crate::cross`] (exact mod 2^ℓ; at ℓ = 48 except with probability 2^-69 per
//! decrypted coefficient, four of which make a triple's entry). **Flights:** offline 2 per batch (as [`crate::cross`]);
//! online 2 per batch (client → server, server → client).

use veil_core::wire::Writer;
use veil_core::{bitpack, ensure, Prg, Result, Ring, RingTensor};
use veil_net::{Channel, Role};
use zeroize::{Zeroize, Zeroizing};

use crate::cross::{shared_matmul_client, shared_matmul_server};
use veil_he::session::{ClientSession, ServerSession};

/// This party's shares of one matrix triple U (n×k), V (k×m), W = U·V. Used once
/// ([`beaver_matmul`] takes it by value); zeroized on drop:
///
/// ```compile_fail,E0382
/// # use veil_linear::triples::{beaver_matmul, Triple};
/// # use veil_core::RingTensor;
/// # fn twice(ch: &mut dyn veil_net::Channel, t: Triple, a: RingTensor, b: RingTensor) {
/// # let role = veil_net::Role::Client;
/// let first = beaver_matmul(ch, role, vec![t], &[a.clone()], &[b.clone()]);
/// let again = beaver_matmul(ch, role, vec![t], &[a], &[b]); // the same masks twice: refused
/// # }
/// ```
pub struct Triple {
    u: RingTensor,
    v: RingTensor,
    w: RingTensor,
}

impl Triple {
    /// The product's shape (n, k, m).
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.u.shape()[0], self.u.shape()[1], self.v.shape()[1])
    }
}

impl Drop for Triple {
    fn drop(&mut self) {
        self.u.data_mut().zeroize();
        self.v.data_mut().zeroize();
        self.w.data_mut().zeroize();
    }
}

/// This party's uniform shares of U_h and V_h for every shape (n, k, m).
/// Operands wiped on drop until they are in their [`Triple`]s, so a peer's error while the
/// triples are made leaves none behind.
type Operands = Zeroizing<Vec<RingTensor>>;

fn random_operands(ring: Ring, dims: &[(usize, usize, usize)]) -> Result<(Operands, Operands)> {
    let mut prg = Prg::from_os_entropy();
    let mut us = Zeroizing::new(Vec::with_capacity(dims.len()));
    let mut vs = Zeroizing::new(Vec::with_capacity(dims.len()));
    for &(n, k, m) in dims {
        us.push(RingTensor::random(ring, &[n, k], &mut prg)?);
        vs.push(RingTensor::random(ring, &[k, m], &mut prg)?);
    }
    Ok((us, vs))
}

fn assemble(mut us: Operands, mut vs: Operands, ws: Vec<RingTensor>) -> Vec<Triple> {
    std::mem::take(&mut *us)
        .into_iter()
        .zip(std::mem::take(&mut *vs))
        .zip(ws)
        .map(|((u, v), w)| Triple { u, v, w })
        .collect()
}

/// Offline, client: one triple per shape (n, k, m), all in one [`crate::cross`] batch.
pub fn triples_client<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ClientSession,
    ring: Ring,
    dims: &[(usize, usize, usize)],
) -> Result<Vec<Triple>> {
    let (us, vs) = random_operands(ring, dims)?;
    let ws = shared_matmul_client(ch, session, &us, &vs)?;
    Ok(assemble(us, vs, ws))
}

/// Offline, server: the other side of [`triples_client`].
pub fn triples_server<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ServerSession,
    ring: Ring,
    dims: &[(usize, usize, usize)],
) -> Result<Vec<Triple>> {
    let (us, vs) = random_operands(ring, dims)?;
    let ws = shared_matmul_server(ch, session, &us, &vs)?;
    Ok(assemble(us, vs, ws))
}

/// Online: this party's shares of A_h·B_h from its shares of A_h and B_h and one triple per
/// product (same shapes, same order on both sides).
pub fn beaver_matmul<C: Channel + ?Sized>(
    ch: &mut C,
    role: Role,
    triples: Vec<Triple>,
    a: &[RingTensor],
    b: &[RingTensor],
) -> Result<Vec<RingTensor>> {
    ensure!(
        triples.len() == a.len() && a.len() == b.len(),
        InvalidArgument,
        "{} triples for {} × {} operands",
        triples.len(),
        a.len(),
        b.len()
    );
    let mut opened_len = 0;
    for ((t, x), y) in triples.iter().zip(a).zip(b) {
        let (n, k, m) = t.shape();
        ensure!(
            x.shape() == [n, k]
                && y.shape() == [k, m]
                && x.ring() == t.u.ring()
                && y.ring() == x.ring(),
            InvalidArgument,
            "operands {:?} × {:?} for a triple made for ({n}×{k})·({k}×{m})",
            x.shape(),
            y.shape()
        );
        opened_len += bitpack::packed_len(n * k, x.ring().bits())
            + bitpack::packed_len(k * m, x.ring().bits());
    }
    // This party's shares of E = A − U and F = B − V, every product in one message.
    let mut mine = Vec::with_capacity(2 * triples.len());
    for ((t, x), y) in triples.iter().zip(a).zip(b) {
        mine.push(x.sub(&t.u)?);
        mine.push(y.sub(&t.v)?);
    }
    let send = |ch: &mut C, mine: &[RingTensor]| -> Result<()> {
        let mut w = Writer::new();
        for d in mine {
            w.bit_packed(d.data(), d.ring().bits());
        }
        ch.send_msg(&w.finish())?;
        ch.flush()
    };
    let receive = |ch: &mut C| -> Result<Vec<u8>> { ch.recv_msg_exact(opened_len) };
    let theirs = match role {
        Role::Client => {
            send(ch, &mine)?;
            receive(ch)?
        }
        Role::Server => {
            let msg = receive(ch)?;
            send(ch, &mine)?;
            msg
        }
    };
    let mut r = veil_core::wire::Reader::new(&theirs, "opened triple differences");
    let mut opened = Vec::with_capacity(mine.len());
    for d in &mine {
        let len = bitpack::packed_len(d.data().len(), d.ring().bits());
        let other = bitpack::unpack(
            r.take(len)?,
            d.data().len(),
            d.ring().bits(),
            "opened triple differences",
        )?;
        opened.push(d.add(&RingTensor::from_vec(d.ring(), d.shape(), other)?)?);
    }
    r.finish()?;
    triples
        .iter()
        .zip(opened.chunks_exact(2))
        .map(|(t, ef)| {
            let (e, f) = (&ef[0], &ef[1]);
            let mut z = t.w.add(&e.matmul(&t.v)?)?.add(&t.u.matmul(f)?)?;
            if role == Role::Client {
                z.add_in_place(&e.matmul(f)?)?;
            }
            Ok(z)
        })
        .collect()
}
