//! Per-connection key material, shared by every HE protocol (the linear layers and LayerNorm's
//! row products). The client generates one secret key per parameter set
//! (zeroized on drop) and sends, once at set-up, its public key (the server uses it only to
//! re-randomise responses) and its Galois keys (the server uses them only to pack responses,
//! [`veil_he::pack`]). Set-up traffic: ≈ 0.2 MB of public keys and ≈ 9 MB of Galois keys
//! (6 levels × limbs digits × log2(Q·P)·N bits per set) for the encoder's two sets; 8.2 MB for
//! the decoder's one set (9 levels, [`crate::ParamSet::galois_levels`]), once per session.

use crate::{wire, GaloisKeys, ParamSet, Params, PublicKey, SecretKey};
use veil_core::{ensure, Error, Prg, Result, Ring};
use veil_net::Channel;

/// The parameter set of products whose plaintext operand is an ℓ-bit share (attention, LayerNorm's
/// rows, the private-embedding routing).
pub const SHARED_SET: ParamSet = ParamSet::N8192Q4;

/// The parameter sets a session sets up keys for: model-weight products and share products.
/// Each key may reveal at most 2^28 coefficients (enforced by [`veil_he::PublicKey`]); a longer
/// conversation needs a new session.
pub const SESSION_SETS: [ParamSet; 2] = [ParamSet::N8192, SHARED_SET];

/// The one set of a session whose ring is wider than 41 bits (the decoder's ℓ = 48): the
/// ℓ ≤ 41 sets' final modulus leaves no room there, and its flood covers both FC weights and
/// 24-bit limbs of shares ([`ParamSet::N8192Q4L48`]).
pub const WIDE_SESSION_SETS: [ParamSet; 1] = [ParamSet::N8192Q4L48];

/// The sets a session over `ring` sets up: [`SESSION_SETS`] up to ℓ = 41 (the encoder),
/// [`WIDE_SESSION_SETS`] beyond.
pub fn session_sets(ring: Ring) -> &'static [ParamSet] {
    if ring.bits() <= 41 {
        &SESSION_SETS
    } else {
        &WIDE_SESSION_SETS
    }
}

/// The set of products with model weights (FC layers) over `ring`.
pub fn weight_set(ring: Ring) -> ParamSet {
    session_sets(ring)[0]
}

/// The set of products whose plaintext operand is a share over `ring` ([`SHARED_SET`] up to
/// ℓ = 41).
pub fn shared_set(ring: Ring) -> ParamSet {
    *session_sets(ring).last().expect("at least one set")
}

/// The client's keys of a session: one secret key per parameter set.
pub struct ClientSession {
    ring: Ring,
    keys: Vec<(ParamSet, SecretKey)>,
}

/// The server's view of a session's keys: the client's public and Galois keys per set.
pub struct ServerSession {
    ring: Ring,
    keys: Vec<(ParamSet, PublicKey, GaloisKeys)>,
}

impl ClientSession {
    /// Generates keys for [`session_sets`]`(ring)` and sends the public and Galois keys (two
    /// messages per set).
    pub fn setup<C: Channel + ?Sized>(ch: &mut C, ring: Ring) -> Result<Self> {
        Self::setup_for(ch, ring, session_sets(ring))
    }

    /// [`ClientSession::setup`] for the given sets only (the server must name the same).
    pub fn setup_for<C: Channel + ?Sized>(
        ch: &mut C,
        ring: Ring,
        sets: &[ParamSet],
    ) -> Result<Self> {
        let mut prg = Prg::from_os_entropy();
        let mut keys = Vec::new();
        for &set in sets {
            let params = Params::new(set, ring)?;
            let sk = SecretKey::generate(&params, &mut prg);
            ch.send_msg(&wire::encode_public_key(&sk.public_key(&mut prg)))?;
            ch.send_msg(&wire::encode_galois_keys(&sk.galois_keys(&mut prg)?)?)?;
            keys.push((set, sk));
        }
        ch.flush()?;
        Ok(ClientSession { ring, keys })
    }

    /// The ring every key's plaintexts live in.
    pub fn ring(&self) -> Ring {
        self.ring
    }

    /// The most response coefficients any of this session's keys has decrypted: the key
    /// closest to the server's per-key limit of 2^[`crate::params::SESSION_REVEALED_LOG2`].
    pub fn most_revealed(&self) -> u64 {
        self.keys
            .iter()
            .map(|(_, k)| k.revealed())
            .max()
            .unwrap_or(0)
    }

    /// The secret key of `set`; an error when the session has none.
    pub fn key(&self, set: ParamSet) -> Result<&SecretKey> {
        self.keys
            .iter()
            .find(|(s, _)| *s == set)
            .map(|(_, k)| k)
            .ok_or_else(|| Error::InvalidArgument(format!("no key for {set:?}")))
    }
}

impl ServerSession {
    /// Receives the client's keys for [`session_sets`]`(ring)` (the peer of
    /// [`ClientSession::setup`]).
    pub fn setup<C: Channel + ?Sized>(ch: &mut C, ring: Ring) -> Result<Self> {
        Self::setup_for(ch, ring, session_sets(ring))
    }

    /// [`ServerSession::setup`] for the given sets only.
    pub fn setup_for<C: Channel + ?Sized>(
        ch: &mut C,
        ring: Ring,
        sets: &[ParamSet],
    ) -> Result<Self> {
        let mut keys = Vec::new();
        for &set in sets {
            let params = Params::new(set, ring)?;
            let max = wire::ciphertexts_len(&params, 1);
            let pk = wire::decode_public_key(&params, &ch.recv_msg(max)?)?;
            let gk_max = wire::galois_keys_len(&params);
            let gk = wire::decode_galois_keys(&params, &ch.recv_msg(gk_max)?)?;
            keys.push((set, pk, gk));
        }
        ensure!(!keys.is_empty(), InvalidArgument, "no parameter sets");
        Ok(ServerSession { ring, keys })
    }

    /// The ring every key's plaintexts live in.
    pub fn ring(&self) -> Ring {
        self.ring
    }

    /// The client's public key of `set`; an error when the session has none.
    pub fn key(&self, set: ParamSet) -> Result<&PublicKey> {
        self.keys_for(set).map(|(pk, _)| pk)
    }

    /// The public key and Galois keys of a parameter set.
    pub fn keys_for(&self, set: ParamSet) -> Result<(&PublicKey, &GaloisKeys)> {
        self.keys
            .iter()
            .find(|(s, _, _)| *s == set)
            .map(|(_, pk, gk)| (pk, gk))
            .ok_or_else(|| Error::InvalidArgument(format!("no public key for {set:?}")))
    }
}
