//! Fully connected layer on shares over a whole sequence: Y = X·Wᵀ + b with X = X0 + X1
//! (client, server shares of shape seq × in) and W (out × in), b (length out) private to the server.
//!
//! The server folds X1 into the client's ciphertexts of X0, so a single Π_MatMul gives
//! X·Wᵀ + b − R to the client and R to the server (no local X1·Wᵀ product is needed).
//!
//! **Scale.** Inputs and weights are fixed point at scale 2^f, so the output shares are at scale
//! 2^{2f}; the bias must be encoded at 2^{2f}. Truncation back to 2^f is a separate protocol.
//! **Security and error:** as [`crate::matmul`] (exact mod 2^ℓ, at ℓ = 48 except with probability
//! 2^-69 per output; the weights' size is checked against the flooding budget when the layer is
//! prepared, through the public bound [`WEIGHT_BOUND`]). **Flights:** 2 per request (one
//! Π_MatMul batch).
//!
//! **Which cut.** Both parties derive the layout from the request's public [`FcLayer`]: its row
//! count and the row limit it is priced for ([`FcLayer::layout`]). [`fc_server`] prices a request
//! at the prepared layer's limit (an encoder's cuts, whose NTT forms may be kept);
//! [`fc_server_for`] takes the limit from the request (a decoder's prompt priced for its own
//! length), which the prepared weights serve as well, since they are cut at use time.

use veil_core::{ensure, Result, RingTensor};
use veil_he::{ParamSet, Params};
use veil_net::Channel;

use crate::layout::{Layout, WeightBlocking};
use crate::matmul::{client_receive, client_send, server_respond, PreparedMatrix, ServerJob};
use crate::premask::{
    online_server, premask_client, premask_server, ClientMask, OnlineJob, ServerMask,
};
use veil_he::session::{ClientSession, ServerSession};

/// Public bound on |w·2^f| for FC weights (|w| ≤ 16 at f = 13: all-mpnet-base-v2's FFN output
/// weights reach 15.6). The flooding check uses this bound, and larger weights are refused as
/// [`veil_core::Error::Insecure`].
pub const WEIGHT_BOUND: u64 = 1 << 17;

/// Public description of an FC layer as both parties see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FcLayer {
    /// Rows of this request.
    pub seq: usize,
    /// The most rows any request may have (the model's sequence limit; 1 for a pooled head):
    /// the weights are cut once for every length up to it.
    pub max_seq: usize,
    /// Input features (columns of X, rows of Wᵀ).
    pub in_features: usize,
    /// Output features (columns of Y).
    pub out_features: usize,
    /// The weights' set for the ring, [`veil_he::session::weight_set`]: [`ParamSet::N8192`] up
    /// to ℓ = 41, [`ParamSet::N8192Q4L48`] at the decoder's ℓ = 48.
    pub set: ParamSet,
}

impl FcLayer {
    /// The layout of this request, from the public shape alone (both parties).
    pub fn layout(&self, p: &Params) -> Result<Layout> {
        let (k, m) = (self.in_features, self.out_features);
        let wb = WeightBlocking::for_rows(p, self.seq, self.max_seq, k, m, WEIGHT_BOUND)?;
        Layout::for_weights(p, self.seq, k, m, wb)
    }

    /// Every cut a request can use ([`WeightBlocking::all_for`]).
    pub fn cuts(&self, p: &Params) -> Result<Vec<WeightBlocking>> {
        WeightBlocking::all_for(
            p,
            self.max_seq,
            self.in_features,
            self.out_features,
            WEIGHT_BOUND,
        )
    }
}

/// The server's layer, prepared once per model: serves every request of 1..=max_seq rows.
pub struct PreparedFc {
    layer: FcLayer,
    matrix: PreparedMatrix,
    /// b (length out), or none.
    bias: Option<RingTensor>,
}

impl PreparedFc {
    /// `weight` is out × in at scale 2^f; `bias` has length out, at scale 2^{2f}. `layer.seq`
    /// is ignored (every length up to `layer.max_seq` is served). The NTT-domain weights are
    /// not cached; see [`PreparedFc::cache_ntt`].
    pub fn new(layer: FcLayer, weight: &RingTensor, bias: Option<&RingTensor>) -> Result<Self> {
        ensure!(
            weight.shape() == [layer.out_features, layer.in_features],
            InvalidArgument,
            "weight shape {:?} does not match layer {layer:?}",
            weight.shape()
        );
        let p = Params::new(layer.set, weight.ring())?;
        let matrix = PreparedMatrix::new(&p, &weight.transpose()?, WEIGHT_BOUND)?;
        if let Some(b) = bias {
            ensure!(
                b.shape() == [layer.out_features] && b.ring() == weight.ring(),
                InvalidArgument,
                "bias shape {:?}, expected [{}]",
                b.shape(),
                layer.out_features
            );
        }
        Ok(PreparedFc {
            layer,
            matrix,
            bias: bias.cloned(),
        })
    }

    /// Bytes the NTT form of every cut would take, per cut.
    pub fn ntt_bytes(&self) -> Result<Vec<(WeightBlocking, usize)>> {
        self.layer
            .cuts(self.matrix.params())?
            .into_iter()
            .map(|c| Ok((c, self.matrix.ntt_bytes(c)?)))
            .collect()
    }

    /// The cut a request of `rows` rows uses ([`WeightBlocking::for_rows`]): a decoder's steps
    /// use the single-row one.
    pub fn cut_for_rows(&self, rows: usize) -> Result<WeightBlocking> {
        let (k, m) = (self.layer.in_features, self.layer.out_features);
        let p = self.matrix.params();
        WeightBlocking::for_rows(p, rows, self.layer.max_seq, k, m, WEIGHT_BOUND)
    }

    /// Keeps the NTT-domain weights of `cut` (no weight transforms for requests using it).
    pub fn cache_ntt(&mut self, cut: WeightBlocking) -> Result<()> {
        self.matrix.cache_ntt(cut)
    }

    /// Bytes of NTT-domain weights kept.
    pub fn ntt_cached_bytes(&self) -> Result<usize> {
        Ok(self
            .ntt_bytes()?
            .into_iter()
            .filter(|(c, _)| self.matrix.is_ntt_cached(*c))
            .map(|(_, b)| b)
            .sum())
    }

    /// The public shape of the layer.
    pub fn layer(&self) -> &FcLayer {
        &self.layer
    }

    /// The prepared weights.
    pub fn matrix(&self) -> &PreparedMatrix {
        &self.matrix
    }

    /// Bytes held: the weight blocks (and their NTT form when cached) and the bias.
    pub fn prepared_bytes(&self) -> usize {
        self.matrix.prepared_bytes() + self.bias.as_ref().map_or(0, |b| b.data().len() * 8)
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
    let lay = layer.layout(sk.params())?;
    client_send(ch, sk, &[lay], &[x0])?;
    Ok(client_receive(ch, sk, &[lay])?.remove(0))
}

/// Server side: returns the server's share of X·Wᵀ + b (scale 2^{2f}) for X of any
/// 1..=max_seq rows.
pub fn fc_server<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ServerSession,
    fc: &PreparedFc,
    x1: &RingTensor,
) -> Result<RingTensor> {
    let (pk, gk) = session.keys_for(fc.layer.set)?;
    let rows = x1.shape().first().copied().unwrap_or(0);
    let layout = FcLayer {
        seq: rows,
        ..fc.layer
    }
    .layout(pk.params())?;
    let bias = fc.bias_rows(rows)?;
    let job = ServerJob {
        matrix: &fc.matrix,
        layout,
        lhs_share: Some(x1),
        add: bias.as_ref(),
    };
    Ok(server_respond(ch, pk, Some(gk), &[job])?.remove(0))
}

/// Server side of a request whose public shape `request` the parties derived themselves
/// (its `max_seq` picks the cut, [`FcLayer::layout`]): a layer prepared once for up to
/// `fc.layer().max_seq` rows serves a request priced for a tighter row limit, e.g. a decoder's
/// prompt priced for its own length rather than the model's context. The request must have the
/// prepared layer's features and set, `x1`'s rows, and a `max_seq` within the prepared one.
pub fn fc_server_for<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ServerSession,
    fc: &PreparedFc,
    request: &FcLayer,
    x1: &RingTensor,
) -> Result<RingTensor> {
    let rows = x1.shape().first().copied().unwrap_or(0);
    fc.check_request(request, rows)?;
    let (pk, gk) = session.keys_for(fc.layer.set)?;
    let layout = request.layout(pk.params())?;
    let bias = fc.bias_rows(rows)?;
    let job = ServerJob {
        matrix: &fc.matrix,
        layout,
        lhs_share: Some(x1),
        add: bias.as_ref(),
    };
    Ok(server_respond(ch, pk, Some(gk), &[job])?.remove(0))
}

impl PreparedFc {
    /// Refuses a request that this layer cannot serve: other features or set, `rows` other than
    /// the request's, a row limit outside the prepared one.
    fn check_request(&self, request: &FcLayer, rows: usize) -> Result<()> {
        ensure!(
            request.in_features == self.layer.in_features
                && request.out_features == self.layer.out_features
                && request.set == self.layer.set
                && request.seq == rows
                && (1..=self.layer.max_seq).contains(&request.max_seq),
            InvalidArgument,
            "request {request:?} for {rows} rows does not fit the prepared layer {:?}",
            self.layer
        );
        Ok(())
    }

    /// The bias repeated over `rows` rows (rows × out), or none.
    fn bias_rows(&self, rows: usize) -> Result<Option<RingTensor>> {
        self.bias
            .as_ref()
            .map(|b| {
                let data: Vec<u64> = (0..rows).flat_map(|_| b.data().iter().copied()).collect();
                RingTensor::from_vec(b.ring(), &[rows, self.layer.out_features], data)
            })
            .transpose()
    }
}

/// Offline, client: masks for future requests of these layers (each at its `seq` rows), in one
/// Π_MatMul batch ([`crate::premask`]). The layers must share a parameter set.
pub fn fc_premask_client<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ClientSession,
    layers: &[FcLayer],
) -> Result<Vec<ClientMask>> {
    let Some(first) = layers.first() else {
        return Ok(Vec::new());
    };
    ensure!(
        layers.iter().all(|l| l.set == first.set),
        InvalidArgument,
        "preprocessed layers of one batch need one parameter set"
    );
    let sk = session.key(first.set)?;
    let layouts = layers
        .iter()
        .map(|l| l.layout(sk.params()))
        .collect::<Result<Vec<_>>>()?;
    premask_client(ch, sk, &layouts)
}

/// Offline, server: the other side of [`fc_premask_client`], for each layer at `seq` rows
/// priced at its prepared row limit (an encoder's cuts).
pub fn fc_premask_server<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ServerSession,
    requests: &[(&PreparedFc, usize)],
) -> Result<Vec<ServerMask>> {
    let requests: Vec<(&PreparedFc, FcLayer)> = requests
        .iter()
        .map(|&(fc, seq)| (fc, FcLayer { seq, ..fc.layer }))
        .collect();
    fc_premask_server_for(ch, session, &requests)
}

/// Offline, server: the other side of [`fc_premask_client`] for requests whose public shapes
/// the parties derived themselves, as [`fc_server_for`]'s (a decoder step priced for its own
/// rows); each must fit its prepared layer.
pub fn fc_premask_server_for<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ServerSession,
    requests: &[(&PreparedFc, FcLayer)],
) -> Result<Vec<ServerMask>> {
    let Some(&(first, _)) = requests.first() else {
        return Ok(Vec::new());
    };
    ensure!(
        requests
            .iter()
            .all(|(fc, _)| fc.layer.set == first.layer.set),
        InvalidArgument,
        "preprocessed layers of one batch need one parameter set"
    );
    let (pk, gk) = session.keys_for(first.layer.set)?;
    let products = requests
        .iter()
        .map(|(fc, request)| {
            fc.check_request(request, request.seq)?;
            Ok((&fc.matrix, request.layout(pk.params())?))
        })
        .collect::<Result<Vec<_>>>()?;
    premask_server(ch, pk, Some(gk), &products)
}

/// Online, server: its shares of X·Wᵀ + b for each (layer, mask, X1), from the client's one
/// message of masked inputs ([`crate::premask::online_server`]); the client's side is
/// [`crate::premask::online_client`].
pub fn fc_online_server<C: Channel + ?Sized>(
    ch: &mut C,
    requests: Vec<(&PreparedFc, ServerMask, &RingTensor)>,
) -> Result<Vec<RingTensor>> {
    let biases = requests
        .iter()
        .map(|(fc, mask, _)| fc.bias_rows(mask.shape().0))
        .collect::<Result<Vec<_>>>()?;
    let jobs = requests
        .into_iter()
        .zip(&biases)
        .map(|((fc, mask, x1), bias)| OnlineJob {
            matrix: &fc.matrix,
            mask,
            lhs_share: Some(x1),
            add: bias.as_ref(),
        })
        .collect();
    online_server(ch, jobs)
}
