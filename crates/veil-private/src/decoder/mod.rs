//! Private generation's engine: a decoder LLM's forward pass on secret shares, one step at a
//! time with the KV cache held as shares. [`DecoderParty`] implements
//! `veil_model::engine::decoder::DecoderEngine`, so the one composition
//! (`veil_model::engine::decoder::forward`) drives it exactly as it drives the fixed-point
//! simulator (`veil_model::DecoderSim`) and the f32 decoder; [`ServerDecoder`] is the server's
//! model with its linear layers prepared for HE.
//!
//! **Per operator.** Embedding: the token table (and GPT-2's position table) is public for an
//! open model, so the client embeds its own ids from it (`veil_model::DecoderTables::embed`,
//! the simulator's code) and holds the result as its share; the server's share is zero and it
//! is told only how many tokens a step has. Linear layers: the server's weights times the
//! shared rows by BFV (`veil_linear::fc_client` / `fc_server_for`), then one truncation; the
//! layers that read the same rows (a block's query, key and value; a Llama block's gate and up)
//! are one product against their weights stacked and one truncation, so the rows are encrypted
//! and sent once (`model::fused_group`, public). Each request is priced for its own row count
//! (a prompt's layout for that prompt, a step's the matrix × vector one), which both parties
//! derive from the public number of rows. Norms:
//! `veil_nonlinear::Ctx::rms_norm` / `layer_norm_at` on the format's wide domain with the
//! server's γ (and β). Rotary positions: public cos and sin, local on each share, one
//! truncation. Q·Kᵀ and P·V: BFV products of shares by shares (`veil_linear::cross`), one
//! per key/value head with its query heads' rows stacked (so each party's cached key and value
//! share enters one product per step, not one per query head), one truncation. Causal softmax: `Ctx::softmax_masked` with each row's public mask. Gated MLP:
//! `Ctx::silu`, then a secret product and a truncation; GPT-2: `Ctx::gelu` (the simulator's
//! `approx::gelu`, the same tanh-form polynomial). Substituted operators (a Llama block's
//! `veil_model::decoder::DecoderBlockVariant`, public in the configuration, so both parties
//! run the same protocols): the Scale norm is `Ctx::scale_affine`, the server's γ times the
//! shares and one truncation (the norms' own last product, under the RMSNorm class);
//! ReLU-normalise attention is `Ctx::relu_normalise_masked` with each row's causal mask and
//! ReLU the gate's `Ctx::relu`, both with the encoder's comparison promise |x| <
//! 2^`RELU_DOMAIN_BITS` (the simulator counts inputs outside it, and row sums outside
//! ReLU-normalise's domain, as domain warnings: there the protocol is unspecified). LM head: the output table is public too, so
//! the server sends its share of the final-normed last row h to the client, which applies the
//! table in the clear (`veil_model::DecoderTables::logits`, the simulator's head). Each
//! operator runs under its `veil_core::CostClass` (MatMul, Truncation, RMSNorm or LayerNorm,
//! Softmax, SiLU, Mul for the gated product, GELU, Head), so a step's cost report per
//! operator class is exact.
//!
//! **KV cache.** Each party appends its shares of every block's new keys and values to its own
//! cache, held by its [`Generation`] between steps; the context limit is fixed when the
//! generation starts, and a step that would exceed it is refused by both parties before
//! anything is sent (`veil_core::Error::Refused`). [`Generation::cache_bytes`] is what one
//! party's cache takes at that limit.
//!
//! **Preprocessing between tokens** (`preprocess`): [`DecoderParty::preprocess`] makes the next
//! step's FC masks and attention triples in one request (planned on shapes by the same
//! composition) and fills the OT pools; [`DecoderParty::client_step_with`] and
//! [`DecoderParty::server_step_with`] then run each FC group as one client → server message and
//! a plaintext product, and each batch of attention products as Beaver openings. Same security
//! model, same results bit for bit; its module states the flights of each phase.
//!
//! **Sessions.** [`serve_generation`] and [`GenerationClient`] carry generations over a
//! session (the typed messages of `crate::protocol`, memory admission for the KV cache, a
//! client whose generations implement `veil_model::NextLogits`); see their module.
//!
//! **Driving it.** Each party makes a [`Generation`] (the model's configuration, the
//! truncation mode both agreed on, the context limit) and, for its steps, a [`DecoderParty`]
//! over its channel, OT session, side ([`DecoderSide`]: the client's tables come from the open
//! model's matrices alone, `veil_model::DecoderTables::encode`) and that generation. The
//! client calls [`DecoderParty::client_step`] with the prompt's ids, then with each token it
//! picked from the returned logits; the server calls [`DecoderParty::server_step`] with the
//! same counts.
//!
//! **Security model.** Semi-honest client and server, the protocols of veil-linear and
//! veil-nonlinear composed sequentially on uniformly masked shares (128-bit computational,
//! 40-bit statistical security). The server learns the number of tokens of each step (the
//! prompt's length, then one per generated token: the number of steps) and the context limit;
//! never a token id, a hidden value or a logit. **Padding** hides the prompt's length
//! ([`Generation::hide_padding`]): the client runs made-up tokens before its prompt and pushes
//! its own share of every real position's scores against them down
//! (`veil_model::engine::decoder::hide_padding_keys`), a local step the server cannot tell
//! from any other share, so the server sees the padded length and nothing of where the prompt
//! starts; the real positions attend as without the padding (exactly for GPT-2, whose learned
//! positions the client counts from the first real token; Llama's relative rotary positions up
//! to their tables' rounding at the shifted positions), and the simulator computes the same
//! padded pass. The client learns, per step, the final-normed
//! hidden row h of the last position and the logits computed from it. With a public output
//! table T of full column rank (vocab ≫ hidden), knowing h is equivalent to knowing the logits
//! ⌊h·Tᵀ / 2^f⌋ — h is determined by them up to the fixed-point rounding — so revealing h tells
//! the client nothing beyond the answer it is entitled to. The server's weights (every linear
//! layer, every norm's γ and β) stay the server's; the tables are public by the deployment's
//! choice (an open model's are).
//!
//! **Private tables** (`ServerDecoder::keep_tables_private`, [`ClientTables::Private`]; Llama
//! family). For a model whose token embedding and output table are secret too, the client
//! holds only the configuration and the format. Embedding: Veil's private lookup
//! (`veil_linear::lookup`, its one-hot method: the client's encrypted one-hot rows [n, vocab]
//! times the server's token table in one Π_MatMul, a decode step's prepared once and a
//! prompt's per prompt): shares of the rows, exact mod 2^ℓ. Head: the final-normed last row times the output table in one HE product, whose
//! accumulator shares the server then sends to the client, which adds them and truncates as
//! the simulator does (`Approx::trunc`), so the head adds no error of its own in either mode
//! (faithful: the logits are the simulator's bit for bit). The server learns nothing more than with public tables (the products' inputs
//! are encrypted or masked); the client learns the logits' accumulators (2f fractional bits
//! instead of f: the same answer), nothing of the tables beyond what the logits it is entitled
//! to tell. Cost: two more HE products a step, of vocab × hidden weights each (measured on the
//! tests' 269-token vocabulary: 299 kB and 239 kB a decode step, 3 flights; the batched
//! lookup would upload more at a step's one query). Preprocessing such
//! a step is refused (`Error::Unsupported`: the table products are not planned); GPT-2 refuses
//! the mode (its learned position table, counted from the first real token under padding, would
//! be a third secret table).
//!
//! **Error.** With `ProductTruncation::Faithful` (a decoder server's default,
//! `DEFAULT_DECODER_TRUNCATION`) every step's logits equal the simulator's integers bit for bit.
//! In the `OneBitError` mode (`veil serve --truncation one-bit-error`) each truncation after a product
//! (linear, rotary, the attention products, the gated product) may read one ulp (2^−f) low,
//! and Softmax, ReLU-normalise, the norms (the Scale norm's product by γ: ⌊x·γ / 2^f⌋ off by
//! −3 to 2 ulps) and SiLU run their internal truncations in their 1-bit-error modes (their bounds
//! are on `veil_nonlinear::Ctx`'s methods); GELU and ReLU stay exact. The deviation is these
//! errors carried through the blocks and the cache (bounded in `tests/`); a Scale norm passes
//! the residual stream on unnormalised, so the blocks after it may amplify them (the tests'
//! substituted mix: 0.04 to 0.12 against 0.01 for the original model).
//!
//! **Activation bound.** The server proves from its weights that every SiLU (GELU) input is
//! below 2^k (`veil_model::FixedDecoder::activation_bits`: the MLP's norm bounds its output
//! row's length, the first MLP layer's rows then bound each input; SmolLM2-135M: k = 21) and
//! announces k at admission (`DecoderAnnounced::activation_bits`, the one thing of its weights
//! the client learns beyond the outputs). Both parties then run the activation's sign and
//! clamp comparisons on k bits instead of ℓ − 1 (`Ctx::silu`'s `bound`): fewer correlations
//! and 2·(⌈log2 ⌈(ℓ−1)/4⌉⌉ − ⌈log2 ⌈k/4⌉⌉) fewer flights each, and the simulator computes the
//! same bits (`Approx::silu_within`), so the faithful mode stays bit for bit. The client cannot
//! check k; a server announcing too small a k only corrupts its own answers.
//!
//! **Flights** (measured on the tests' tiny models, 2 blocks of width 32, at the shipped
//! (48, 13), before the activation bound, which takes 4 or more from each SiLU and GELU; they
//! depend on the format and the context length, not on the width). A decode step
//! (n = 1) in the 1-bit-error mode takes 778 flights on the two Llama blocks: per block RMSNorm
//! 2 × 74, Softmax 108, SiLU 76, the gated product 4, the six HE products (q|k|v, o, gate|up,
//! down, Q·Kᵀ, P·V) 6, truncations 10, plus the final norm, one flight for the head and an OT
//! refill; 758 on the two GPT-2 blocks (LayerNorm 2 × 78, Softmax 108, GELU 64, HE products 6,
//! truncations 6, the final norm, the head). (Before q, k, v and gate, up were fused: 790 and
//! 766.) Faithful truncations about double the norms, Softmax and SiLU (≈ 775 per Llama block
//! when measured at ℓ = 41). Softmax's max tree adds 12 flights per block each time the context
//! doubles. A prefill costs the same flights as a decode step: its rows share every flight.
//! Substituted (the tests' two-block mix, block 0 with ReLU and ReLU-normalise, block 1 with
//! both norms x·γ; measured at session 24): a decode step takes 478 flights in the
//! 1-bit-error mode, ReLU-normalise 44 and ReLU 11 where block 1 runs Softmax 108 and SiLU
//! 46, and the Scale norms a few flights each (RMSNorm class 229 for three RMSNorms and two
//! Scale norms); 1,016 in the faithful mode.
//!
//! **Ring.** Every width comes from the model's `veil_model::DecoderFormat`: the shipped format
//! is ℓ = 48, f = 13 (what `tests/protocol/decoder_party.rs` and `tests/protocol/generation_session.rs` run), whose
//! HE products run on BFV with t = 2^48 (`N8192Q4L48`: FC weights whole, shares as 24-bit limbs,
//! in the attention products and in the norms' row products alike); other rings run the same
//! code.

mod model;
mod party;
mod preprocess;
mod session;

pub use model::{ServerDecoder, DEFAULT_DECODER_TRUNCATION};
pub use party::{ClientTables, DecoderParty, DecoderSide, Generation};
pub(crate) use preprocess::pool_fill;
pub use preprocess::{plan_step, step_material_bytes, StepMaterial};
pub(crate) use session::serve_generation_admitted;
pub use session::{
    default_generation_context, serve_generation, step_bytes, GenerationClient, GenerationOptions,
    OwnedGeneration, PrivateGeneration, SessionMemoryPool,
};
