//! Fine-tuning with the bound loss, and the layer-by-layer substitution workflow (Algorithm 5).
//!
//! * `batch` — tokenised examples, padded batches, the [`SequenceClassifier`] trait;
//! * `loss` — Eq. 1 of the paper: task + weight decay + hidden-state bound, and an optional
//!   distillation term towards a teacher model;
//! * `optim` — AdamW with resumable state, linear warm-up/decay, gradient clipping;
//! * `init` — seeded initialisation of new parameters;
//! * `checkpoint` — crash-safe checkpoints for resuming a run;
//! * `train` — the fine-tuning loop and evaluation;
//! * [`substitute`] — Algorithm 5, generic over a [`SubstitutionTarget`], resumable step by
//!   step from a progress folder;
//! * `report` — JSON, Markdown and SVG reports of a substitution run;
//! * [`transformer`] — a veil-model transformer made trainable (VarMap, freezing, variants);
//! * [`decoder`] — the workflow for decoder LLMs: a trainable Llama, distillation, Algorithm 5,
//!   question-set scoring;
//! * [`fixed_check`] — overflow check of a model in veil-model's fixed-point simulator;
//! * [`workflow`] — `finetune` and `substitute` end to end, with an options struct each.

#![forbid(unsafe_code)]
#![warn(unreachable_pub, missing_docs)]

mod batch;
mod checkpoint;
pub mod decoder;
pub mod fixed_check;
mod init;
mod loss;
mod optim;
mod report;
pub mod substitute;
mod train;
pub mod transformer;
pub mod workflow;

#[cfg(test)]
#[allow(unreachable_pub)]
mod tiny;

pub use batch::{Batch, ClassifierOutput, EncodedExample, SequenceClassifier};
pub use fixed_check::{max_abs_difference, FixedVsF32, SideBySide};
pub use loss::LossWeights;
pub use substitute::{
    run_substitution, BlockOrder, Operator, Resume, RunOutcome, SubstitutionConfig,
    SubstitutionTarget,
};
pub use train::{
    evaluate, train, train_with_teacher, Evaluation, RunControl, TrainConfig, TrainSummary,
};
pub use workflow::{
    finetune, substitute, DataOptions, FinetuneOptions, SubstituteOptions, SubstituteOutcome,
};
