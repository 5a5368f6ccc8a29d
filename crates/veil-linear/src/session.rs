//! Per-connection key material. The client generates one secret key per parameter set
//! (zeroized on drop) and sends the public keys once at set-up; the server keeps them for the
//! session and uses them only to re-randomise responses.

use veil_core::{ensure, Error, Prg, Result, Ring};
use veil_he::{wire, ParamSet, Params, PublicKey, SecretKey};
use veil_net::Channel;

/// The parameter sets a session sets up keys for: model-weight products and share products.
/// Each key may reveal at most 2^28 coefficients (enforced by [`veil_he::PublicKey`]); a longer
/// conversation needs a new session.
pub const SESSION_SETS: [ParamSet; 2] = [ParamSet::N8192, ParamSet::N8192Q4];

pub struct ClientSession {
    keys: Vec<(ParamSet, SecretKey)>,
}

pub struct ServerSession {
    keys: Vec<(ParamSet, PublicKey)>,
}

impl ClientSession {
    /// Generates keys and sends the public keys (one message per set).
    pub fn setup<C: Channel + ?Sized>(ch: &mut C, ring: Ring) -> Result<Self> {
        let mut prg = Prg::from_os_entropy();
        let mut keys = Vec::new();
        for set in SESSION_SETS {
            let params = Params::new(set, ring)?;
            let sk = SecretKey::generate(&params, &mut prg);
            ch.send_msg(&wire::encode_public_key(&sk.public_key(&mut prg)))?;
            keys.push((set, sk));
        }
        ch.flush()?;
        Ok(ClientSession { keys })
    }

    pub fn key(&self, set: ParamSet) -> Result<&SecretKey> {
        self.keys
            .iter()
            .find(|(s, _)| *s == set)
            .map(|(_, k)| k)
            .ok_or_else(|| Error::InvalidArgument(format!("no key for {set:?}")))
    }
}

impl ServerSession {
    pub fn setup<C: Channel + ?Sized>(ch: &mut C, ring: Ring) -> Result<Self> {
        let mut keys = Vec::new();
        for set in SESSION_SETS {
            let params = Params::new(set, ring)?;
            let max = wire::ciphertexts_len(&params, 1);
            let pk = wire::decode_public_key(&params, &ch.recv_msg(max)?)?;
            keys.push((set, pk));
        }
        ensure!(!keys.is_empty(), InvalidArgument, "no parameter sets");
        Ok(ServerSession { keys })
    }

    pub fn key(&self, set: ParamSet) -> Result<&PublicKey> {
        self.keys
            .iter()
            .find(|(s, _)| *s == set)
            .map(|(_, k)| k)
            .ok_or_else(|| Error::InvalidArgument(format!("no public key for {set:?}")))
    }
}
