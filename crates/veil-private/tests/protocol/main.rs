//! veil-private's protocol tests — the private pass against the simulator, transcripts, bundles,
//! mutation, the decoder and generation sessions — in one test binary (one link instead of one
//! per file). Tests that watch process-wide state (thread counts, the captured log, the
//! preprocessing budget's environment variable) keep binaries of their own.

mod bundle;
mod client_api;
mod decoder_party;
mod embedding;
mod generation_session;
mod mutation;
mod private_vs_sim;
mod transcript;
