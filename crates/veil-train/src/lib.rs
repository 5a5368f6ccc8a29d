//! Fine-tuning with the bound loss, and the layer-by-layer substitution workflow (Algorithm 5).
//!
//! * [`data`] — dataset files (SST-2 lines, GLUE TSV, CSV) and label sets;
//! * [`batch`] — tokenised examples, padded batches, the [`SequenceClassifier`] trait;
//! * [`loss`] — Eq. 1 of the paper: task + weight decay + hidden-state bound;
//! * [`optim`] — AdamW with resumable state, linear warm-up/decay, gradient clipping;
//! * [`init`] — seeded initialisation of new parameters;
//! * [`checkpoint`] — crash-safe checkpoints for resuming a run;
//! * [`train`] — the fine-tuning loop and evaluation;
//! * [`substitute`] — Algorithm 5, generic over a [`SubstitutionTarget`];
//! * [`report`] — JSON, Markdown and SVG reports of a substitution run.

pub mod batch;
pub mod checkpoint;
pub mod data;
pub mod init;
pub mod loss;
pub mod optim;
pub mod report;
pub mod substitute;
pub mod train;

#[cfg(test)]
mod tiny;

pub use batch::{Batch, ClassifierOutput, EncodedExample, SequenceClassifier};
pub use loss::LossWeights;
pub use substitute::{run_substitution, Operator, SubstitutionConfig, SubstitutionTarget};
pub use train::{evaluate, train, Evaluation, RunControl, TrainConfig, TrainSummary};

/// candle's errors into Veil's (the orphan rule forbids a `From` impl between two foreign types).
pub(crate) fn candle_err(e: candle_core::Error) -> veil_core::Error {
    veil_core::Error::Other(format!("candle: {e}"))
}
