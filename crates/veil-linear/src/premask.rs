//! Offline/online split of the products with a server operand (fully connected layers), after
//! Delphi: everything Π_MatMul computes under encryption is independent of the prompt, so it
//! runs before the prompt exists, and the prompt's own product is plaintext arithmetic.
//!
//! **Offline** ([`premask_client`] / [`premask_server`]): the client draws a fresh uniform mask
//! R (n×k, its OS-seeded CSPRNG) and runs Π_MatMul ([`crate::matmul`]) on it, with no server
//! share and nothing added: the client ends with R·B − T, the server with T (fresh, uniform).
//! **Online** ([`online_client`] / [`online_server`]): the client sends D = X0 − R in the clear,
//! one message for the whole batch; the server's share is (D + X1)·B + add + T, a plaintext
//! product mod 2^ℓ, and the client's is R·B − T. Their sum is X·B + add.
//!
//! **Security (semi-honest).** Offline: exactly Π_MatMul's transcript (BFV under the client's
//! key, flooded and re-masked responses; the revealed coefficients count against the session's
//! budget like any product). Online: D is X0 plus a one-time pad uniform over Z_2^ℓ, so it is
//! uniform and independent of X0 — as long as R is used once. Each mask is a value that the
//! online step takes by value ([`ClientMask`], [`ServerMask`]: neither is `Clone`), so using one
//! twice does not compile, and the client's mask and share are zeroized when dropped. The
//! online step also checks that the mask was made for this product's shape.
//! **Error:** as [`crate::matmul`] (exact mod 2^ℓ; at ℓ = 48 except with probability 2^-69
//! per decrypted coefficient of the offline product). **Flights:** offline 2 per batch (as Π_MatMul); online 1
//! (client → server) per batch.

use veil_core::wire::{Reader, Writer};
use veil_core::{bitpack, ensure, Prg, Result, RingTensor};
use veil_he::{GaloisKeys, PublicKey, SecretKey};
use veil_net::Channel;
use zeroize::{Zeroize, Zeroizing};

use crate::layout::Layout;
use crate::matmul::{client_receive, client_send, server_respond, PreparedMatrix, ServerJob};

/// The client's half of one preprocessed product: the mask R and its share R·B − T. Used once
/// ([`online_client`] takes it by value); zeroized on drop. A second use does not compile:
///
/// ```compile_fail,E0382
/// # use veil_linear::premask::{online_client, ClientMask};
/// # fn twice(ch: &mut dyn veil_net::Channel, mask: ClientMask, x: &veil_core::RingTensor) {
/// let first = online_client(ch, vec![mask], &[x]);
/// let again = online_client(ch, vec![mask], &[x]); // the same R twice: refused
/// # }
/// ```
pub struct ClientMask {
    layout: Layout,
    r: RingTensor,
    share: RingTensor,
}

impl ClientMask {
    /// The product's public shape (n, k, m).
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.layout.n, self.layout.k, self.layout.m)
    }
}

impl Drop for ClientMask {
    fn drop(&mut self) {
        self.r.data_mut().zeroize();
        self.share.data_mut().zeroize();
    }
}

/// The server's half: its share T of R·B, for the shape it was made for. Used once
/// ([`online_server`] takes it by value):
///
/// ```compile_fail,E0382
/// # use veil_linear::premask::{OnlineJob, ServerMask};
/// # use veil_linear::PreparedMatrix;
/// # fn twice(matrix: &PreparedMatrix, mask: ServerMask) {
/// let first = OnlineJob { matrix, mask, lhs_share: None, add: None };
/// let again = OnlineJob { matrix, mask, lhs_share: None, add: None }; // T twice: refused
/// # }
/// ```
pub struct ServerMask {
    layout: Layout,
    t: RingTensor,
}

impl ServerMask {
    /// The product's public shape (n, k, m).
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.layout.n, self.layout.k, self.layout.m)
    }
}

impl Drop for ServerMask {
    fn drop(&mut self) {
        self.t.data_mut().zeroize();
    }
}

/// Offline, client: one fresh mask per layout, all in one Π_MatMul batch (two flights).
pub fn premask_client<C: Channel + ?Sized>(
    ch: &mut C,
    sk: &SecretKey,
    layouts: &[Layout],
) -> Result<Vec<ClientMask>> {
    let ring = sk.params().ring();
    let mut prg = Prg::from_os_entropy();
    // Zeroizing until each is in its ClientMask, so a peer's error leaves no mask behind.
    let mut masks = Zeroizing::new(
        layouts
            .iter()
            .map(|l| RingTensor::random(ring, &[l.n, l.k], &mut prg))
            .collect::<Result<Vec<_>>>()?,
    );
    let refs: Vec<&RingTensor> = masks.iter().collect();
    client_send(ch, sk, layouts, &refs)?;
    let shares = client_receive(ch, sk, layouts)?;
    Ok(layouts
        .iter()
        .zip(std::mem::take(&mut *masks))
        .zip(shares)
        .map(|((&layout, r), share)| ClientMask { layout, r, share })
        .collect())
}

/// Offline, server: the other side of [`premask_client`] for these matrices and layouts.
pub fn premask_server<C: Channel + ?Sized>(
    ch: &mut C,
    pk: &PublicKey,
    galois: Option<&GaloisKeys>,
    products: &[(&PreparedMatrix, Layout)],
) -> Result<Vec<ServerMask>> {
    let jobs: Vec<ServerJob> = products
        .iter()
        .map(|&(matrix, layout)| ServerJob {
            matrix,
            layout,
            lhs_share: None,
            add: None,
        })
        .collect();
    let shares = server_respond(ch, pk, galois, &jobs)?;
    Ok(products
        .iter()
        .zip(shares)
        .map(|(&(_, layout), t)| ServerMask { layout, t })
        .collect())
}

/// Online, client: sends X0 − R for every product in one message and returns its shares of
/// X·B + add (the preprocessed R·B − T). `x0[j]` must have mask j's shape n×k.
pub fn online_client<C: Channel + ?Sized>(
    ch: &mut C,
    masks: Vec<ClientMask>,
    x0: &[&RingTensor],
) -> Result<Vec<RingTensor>> {
    ensure!(
        masks.len() == x0.len(),
        InvalidArgument,
        "{} masks for {} products",
        masks.len(),
        x0.len()
    );
    let mut w = Writer::new();
    for (mask, x) in masks.iter().zip(x0) {
        ensure!(
            x.shape() == mask.r.shape() && x.ring() == mask.r.ring(),
            InvalidArgument,
            "an input of shape {:?} for a mask made for {:?}",
            x.shape(),
            mask.r.shape()
        );
        let mut d = x.sub(&mask.r)?;
        w.bit_packed(d.data(), x.ring().bits());
        d.data_mut().zeroize();
    }
    ch.send_msg(&w.finish())?;
    ch.flush()?;
    Ok(masks.into_iter().map(|mut m| m.take_share()).collect())
}

impl ClientMask {
    fn take_share(&mut self) -> RingTensor {
        let ring = self.share.ring();
        let empty = RingTensor::zeros(ring, &[0, 0]).expect("an empty tensor");
        std::mem::replace(&mut self.share, empty)
    }
}

/// The server's part of one online product.
pub struct OnlineJob<'a> {
    /// The layer's prepared weights.
    pub matrix: &'a PreparedMatrix,
    /// The mask made for this product in the offline phase.
    pub mask: ServerMask,
    /// The server's additive share of the left operand (n×k).
    pub lhs_share: Option<&'a RingTensor>,
    /// Added to the product (n×m), e.g. a bias at scale 2f.
    pub add: Option<&'a RingTensor>,
}

/// Online, server: receives the masked inputs of a batch and returns its shares
/// (D + X1)·B + add + T, one per job. A message of the wrong size or with values outside the
/// ring is refused before any product is computed.
pub fn online_server<C: Channel + ?Sized>(
    ch: &mut C,
    jobs: Vec<OnlineJob<'_>>,
) -> Result<Vec<RingTensor>> {
    let mut bytes = 0usize;
    for job in &jobs {
        let (n, k, m) = job.mask.shape();
        ensure!(
            job.matrix.shape() == (k, m),
            InvalidArgument,
            "a mask for a {k}×{m} product used with a {:?} matrix",
            job.matrix.shape()
        );
        let ring = job.matrix.params().ring();
        if let Some(s) = job.lhs_share {
            ensure!(
                s.shape() == [n, k] && s.ring() == ring,
                InvalidArgument,
                "server share of shape {:?}, expected [{n}, {k}]",
                s.shape()
            );
        }
        if let Some(a) = job.add {
            ensure!(
                a.shape() == [n, m] && a.ring() == ring,
                InvalidArgument,
                "added matrix of shape {:?}, expected [{n}, {m}]",
                a.shape()
            );
        }
        bytes += bitpack::packed_len(n * k, ring.bits());
    }
    let msg = ch.recv_msg_exact(bytes)?;
    let mut r = Reader::new(&msg, "masked product inputs");
    let mut inputs = Vec::with_capacity(jobs.len());
    for job in &jobs {
        let (n, k, _) = job.mask.shape();
        let ring = job.matrix.params().ring();
        // ℓ-bit values are ring elements by construction; the padding is checked.
        let len = bitpack::packed_len(n * k, ring.bits());
        let d = bitpack::unpack(r.take(len)?, n * k, ring.bits(), "masked product inputs")?;
        inputs.push(RingTensor::from_vec(ring, &[n, k], d)?);
    }
    r.finish()?;
    jobs.into_iter()
        .zip(inputs)
        .map(|(job, mut d)| {
            if let Some(s) = job.lhs_share {
                d.add_in_place(s)?;
            }
            let mut y = job.matrix.plain_product(&d)?;
            y.add_in_place(&job.mask.t)?;
            if let Some(a) = job.add {
                y.add_in_place(a)?;
            }
            Ok(y)
        })
        .collect()
}
