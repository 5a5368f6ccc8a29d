//! Linear protocols on additive shares mod 2^ℓ, built on BFV ([`veil_he`]): Π_MatMul, fully
//! connected layers, and shared × shared products (attention).
//!
//! * Sessions ([`veil_he::session`], re-exported): the client generates one key per
//!   [`veil_he::ParamSet`] in [`SESSION_SETS`] (N8192 for model weights, N8192Q4 for share
//!   operands) and sends the public keys and Galois keys once ([`ClientSession::setup`] /
//!   [`ServerSession::setup`]; ≈ 9.4 MB in all, set-up traffic). A session may
//!   reveal at most 2^28 output coefficients per key (≈16 BERT-Base inferences); the server
//!   refuses more (`Error::Insecure`), and the parties then start a new session.
//!   **The decoder's ring ℓ = 48** has one set, N8192Q4L48, for weights and shares alike
//!   ([`session_sets`], [`weight_set`], [`shared_set`]; `setup(ch, Ring::new(48)?)` sets up
//!   just that key, ≈ 5.5 MB of public and Galois keys): FC weights at any depth up to 2^16,
//!   and shares × shares with the server's share cut into two 24-bit limbs ([`cross`]), which
//!   the Beaver triples of [`triples`] inherit.
//! * `layout`: Cheetah coefficient packing, response packing ([`veil_he::pack`]: many
//!   responses share one c1) and the choice of blocks: kept weights are cut once for every
//!   prompt length ([`WeightBlocking`]), one-off operands per product.
//! * `cost`: the price of a blocking, CPU time of every HE operation (calibrated on the
//!   project machine) plus traffic.
//! * [`matmul`]: the batched protocol core (one round trip for any number of products) and
//!   [`PreparedMatrix`], the server's packed and noise-checked plaintext operand.
//! * [`fc`]: Y = X·Wᵀ + b on shares for a whole sequence ([`PreparedFc`] is prepared once per
//!   model and serves every length); output at scale 2^{2f}, truncation is the caller's next step.
//! * [`lookup`]: private table lookup (one-hot baseline and batch PIR) for private embeddings.
//! * [`cross`]: per-head products of two shared matrices (Q·Kᵀ, A·V) via cross terms.
//! * [`premask`]: the offline/online split of the products with a server operand: Π_MatMul
//!   on a random mask before the prompt, a plaintext product and one message after it.
//! * [`triples`]: the same split for the shared × shared products: Beaver matrix triples made
//!   with [`cross`] before the prompt, opened differences and plaintext products after it.
//!
//! The benchmark is `veil_bench::linear` (`veil bench linear`).
//!
//! **Security:** semi-honest, 128-bit computational (RLWE at the HE-standard bounds), 40-bit
//! statistical for the whole session transcript (the flooding argument in the [`veil_he`] crate
//! docs, checked from public bounds: FC weights |w·2^f| ≤ [`fc::WEIGHT_BOUND`], shares 2^(ℓ−1)).
//! **Error:** none up to ℓ = 41, every product is exact mod 2^ℓ. At ℓ = 48 a product is exact
//! except with probability 2^-69 per output (the modulus switch's rounding is budgeted by its
//! tail bound there, see [`veil_he::RoundingBound`]; a failure is an off-by-one in the client's
//! share, a correctness event, not a leak).
//!
//! Every protocol is metered on whatever label the caller has entered on the channel.

#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

mod cost;
pub mod cross;
pub mod fc;
mod layout;
pub mod lookup;
pub mod matmul;
pub mod premask;
pub mod triples;

pub use cross::{shared_matmul_client, shared_matmul_server};
pub use fc::{fc_client, fc_server, fc_server_for, FcLayer, PreparedFc};
pub use layout::{Blocking, Layout, WeightBlocking};
pub use lookup::{lookup_client, lookup_server, LookupMethod, LookupShape, PreparedLookup};
pub use matmul::{PreparedMatrix, ServerJob};
pub use veil_he::session::{
    session_sets, shared_set, weight_set, ClientSession, ServerSession, SESSION_SETS, SHARED_SET,
    WIDE_SESSION_SETS,
};
