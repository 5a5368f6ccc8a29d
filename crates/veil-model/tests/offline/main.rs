//! veil-model's tests that need nothing outside the repository, in one test binary (one link
//! instead of one per file).

mod decoder;
mod decoder_engine;
mod decoder_variants;
mod loading;
mod presets;
mod simulator;
mod training;
