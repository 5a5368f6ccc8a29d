//! Fully connected layer on shares over a whole sequence: Y = X·Wᵀ + b with X = X0 + X1
//! (client, server shares of shape seq × in) and W (out × in), b (length out) private to the server.
//!
//! The server folds X1 into the client's ciphertexts of X0, so a single Π_MatMul gives
//! X·Wᵀ + b − R to the client and R to the server (no local X1·Wᵀ product is needed).
//!
//! **Scale.** Inputs and weights are fixed point at scale 2^f, so the output shares are at scale
//! 2^{2f}; the bias must be encoded at 2^{2f}. Truncation back to 2^f is a separate protocol.
//! **Security and error:** as [`crate::matmul`] (exact mod 2^ℓ; the weights' size is checked
//! against the flooding budget when the layer is prepared, through the public bound [`WEIGHT_BOUND`]).

use veil_core::{ensure, Result, Ring, RingTensor};
use veil_he::{ParamSet, Params};
use veil_net::Channel;

use crate::layout::Layout;
use crate::matmul::{
    client_receive, client_send, server_respond, PreparedMatrix, ServerJob, NTT_CACHE_BYTES,
};
use crate::session::{ClientSession, ServerSession};

/// Public bound on |w·2^f| for FC weights (|w| ≤ 8 at f = 13; trained BERT weights are far
/// smaller). The flooding check uses this bound, and larger weights are refused as
/// [`veil_core::Error::Insecure`].
pub const WEIGHT_BOUND: u64 = 1 << 16;

/// Public description of an FC layer as both parties see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FcLayer {
    pub seq: usize,
    pub in_features: usize,
    pub out_features: usize,
    /// [`ParamSet::N8192`] suits fixed-point model weights; see [`veil_he::ParamSet`].
    pub set: ParamSet,
}

impl FcLayer {
    fn layout(&self, ring: Ring) -> Result<(Params, Layout)> {
        let p = Params::new(self.set, ring)?;
        let lay = Layout::new(&p, self.seq, self.in_features, self.out_features)?;
        Ok((p, lay))
    }
}

/// The server's layer, prepared once per model and reused across sessions.
pub struct PreparedFc {
    layer: FcLayer,
    matrix: PreparedMatrix,
    /// b broadcast over the sequence ([seq, out]), or none.
    bias: Option<RingTensor>,
}

impl PreparedFc {
    /// `weight` is out × in at scale 2^f; `bias` has length out, at scale 2^{2f}. Caches the
    /// NTT-domain weights when they fit [`NTT_CACHE_BYTES`].
    pub fn new(layer: FcLayer, weight: &RingTensor, bias: Option<&RingTensor>) -> Result<Self> {
        Self::with_cache_budget(layer, weight, bias, NTT_CACHE_BYTES)
    }

    /// As [`PreparedFc::new`] with an explicit NTT-cache budget in bytes (0 disables it).
    pub fn with_cache_budget(
        layer: FcLayer,
        weight: &RingTensor,
        bias: Option<&RingTensor>,
        cache_bytes: usize,
    ) -> Result<Self> {
        ensure!(
            weight.shape() == [layer.out_features, layer.in_features],
            InvalidArgument,
            "weight shape {:?} does not match layer {layer:?}",
            weight.shape()
        );
        let (p, _) = layer.layout(weight.ring())?;
        let matrix = PreparedMatrix::new(&p, layer.seq, &weight.transpose()?, WEIGHT_BOUND)?
            .with_ntt_cache(cache_bytes)?;
        let bias = match bias {
            Some(b) => {
                ensure!(
                    b.shape() == [layer.out_features] && b.ring() == weight.ring(),
                    InvalidArgument,
                    "bias shape {:?}, expected [{}]",
                    b.shape(),
                    layer.out_features
                );
                let rows: Vec<u64> = (0..layer.seq)
                    .flat_map(|_| b.data().iter().copied())
                    .collect();
                Some(RingTensor::from_vec(
                    b.ring(),
                    &[layer.seq, layer.out_features],
                    rows,
                )?)
            }
            None => None,
        };
        Ok(PreparedFc {
            layer,
            matrix,
            bias,
        })
    }

    pub fn layer(&self) -> &FcLayer {
        &self.layer
    }

    pub fn matrix(&self) -> &PreparedMatrix {
        &self.matrix
    }
}

/// Client side: returns the client's share of X·Wᵀ + b (scale 2^{2f}).
pub fn fc_client<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ClientSession,
    layer: &FcLayer,
    x0: &RingTensor,
) -> Result<RingTensor> {
    let sk = session.key(layer.set)?;
    let (_, lay) = layer.layout(x0.ring())?;
    client_send(ch, sk, &[lay], &[x0])?;
    Ok(client_receive(ch, sk, &[lay])?.remove(0))
}

/// Server side: returns the server's share of X·Wᵀ + b (scale 2^{2f}).
pub fn fc_server<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ServerSession,
    fc: &PreparedFc,
    x1: &RingTensor,
) -> Result<RingTensor> {
    let (pk, gk) = session.keys_for(fc.layer.set)?;
    let job = ServerJob {
        matrix: &fc.matrix,
        lhs_share: Some(x1),
        add: fc.bias.as_ref(),
    };
    Ok(server_respond(ch, pk, Some(gk), &[job])?.remove(0))
}
