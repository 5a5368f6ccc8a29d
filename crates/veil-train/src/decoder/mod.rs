//! The substitution workflow for decoder LLMs (issue #38): a Llama-family decoder made
//! privacy-computing friendly block by block, distilled from the original with no labelled data.
//!
//! * [`model`] — the decoder as trainable candle variables, honouring each block's variant;
//! * [`data`] — unlabelled text from dataset files, as chat and plain token sequences;
//! * [`answers`] — chat prompts from those sentences answered by the original (the default text);
//! * [`distill`] — the KL distillation loss, a step's fine-tuning, the held-out evaluation;
//! * [`stage`] — saved stages (base + changed tensors) and the Hugging Face output folder;
//! * [`workflow`] — Algorithm 5 over [`crate::substitute`]'s driver;
//! * [`questions`] — greedy answers to a question set against the original's.

pub mod answers;
pub mod data;
pub mod distill;
pub mod model;
pub mod questions;
pub mod stage;
pub mod workflow;

#[cfg(test)]
mod tests;

pub use distill::{DistillSettings, Scope};
pub use model::TrainableDecoder;
pub use questions::{load_scored, read_questions, score_questions, QuestionReport};
pub use workflow::{substitute_decoder, DecoderOutcome, DecoderSubstituteOptions, DecoderText};
