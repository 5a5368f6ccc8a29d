//! The substitution workflow (paper Algorithm 5, §3.3 and §4.2).
//!
//! For each operator type in turn (GELU → ReLU, Softmax → ReLU-normalise, LN1 and LN2 →
//! centring plus affine), with that stage's hidden-state bound B, and for block i = n−1 down
//! to 0: replace the operator in block i of the accepted model, fine-tune with blocks 0 … i−1
//! frozen, evaluate on dev, and keep the change only if accuracy > α − Δα, where α is the
//! original model's accuracy.
//! A rejected change is rolled back to the accepted model's parameters and variants.
//!
//! The loop is written against [`SubstitutionTarget`] so it can be tested with scripted
//! accuracies and run on the real model through an adapter.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use veil_core::{ensure, Result};

use crate::train::Evaluation;

/// The operator types the workflow replaces, in the paper's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Operator {
    /// GELU of the feed-forward network → ReLU.
    Gelu,
    /// Attention softmax → ReLU(x) / (Σ ReLU(x) + ε).
    Softmax,
    /// LayerNorm after attention → (x − mean)·γ + β.
    LayerNorm1,
    /// LayerNorm after the feed-forward network → (x − mean)·γ + β.
    LayerNorm2,
}

impl Operator {
    pub const ALL: [Operator; 4] = [
        Operator::Gelu,
        Operator::Softmax,
        Operator::LayerNorm1,
        Operator::LayerNorm2,
    ];

    /// The paper's column name.
    pub fn label(self) -> &'static str {
        match self {
            Operator::Gelu => "GELU",
            Operator::Softmax => "Softmax",
            Operator::LayerNorm1 => "LN1",
            Operator::LayerNorm2 => "LN2",
        }
    }
}

/// One pass over all blocks for one operator type.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub operator: Operator,
    /// Hidden-state bound B for the fine-tuning of this stage (`None` = ∞).
    pub bound: Option<f64>,
}

/// The paper's schedule: GELU (B = ∞), Softmax (32), LN1 (24), LN2 (16).
pub fn paper_stages() -> Vec<Stage> {
    let bounds = [None, Some(32.0), Some(24.0), Some(16.0)];
    Operator::ALL
        .into_iter()
        .zip(bounds)
        .map(|(operator, bound)| Stage { operator, bound })
        .collect()
}

/// Settings of the workflow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubstitutionConfig {
    pub stages: Vec<Stage>,
    /// Δα, as a fraction (0.02 = two accuracy points).
    pub max_accuracy_drop: f64,
}

impl Default for SubstitutionConfig {
    fn default() -> Self {
        SubstitutionConfig {
            stages: paper_stages(),
            max_accuracy_drop: 0.02,
        }
    }
}

/// What the workflow needs from a model: swap an operator, fine-tune, evaluate, and roll back.
pub trait SubstitutionTarget {
    /// Enough state to undo a rejected step (parameters and operator variants).
    type Snapshot;

    fn num_blocks(&self) -> usize;
    fn snapshot(&self) -> Result<Self::Snapshot>;
    fn restore(&mut self, snapshot: &Self::Snapshot) -> Result<()>;
    /// Replaces `operator` in `block` by its privacy-friendly substitute.
    fn substitute(&mut self, operator: Operator, block: usize) -> Result<()>;
    /// Fine-tunes with blocks `0 .. block` frozen under hidden-state bound `bound`; returns the
    /// mean training loss.
    fn finetune(&mut self, operator: Operator, block: usize, bound: Option<f64>) -> Result<f64>;
    /// Accuracy on the dev set and the largest |hidden state| per block.
    fn evaluate(&mut self) -> Result<Evaluation>;
}

/// One substitution attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub operator: Operator,
    pub block: usize,
    pub bound: Option<f64>,
    pub train_loss: f64,
    pub accuracy: f64,
    pub accepted: bool,
    pub max_abs_hidden: Vec<f32>,
    pub seconds: f64,
}

/// The accepted model at the end of a stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageRecord {
    pub operator: Operator,
    pub bound: Option<f64>,
    /// Blocks whose operator of this type was replaced and kept.
    pub replaced_blocks: Vec<usize>,
    /// Dev accuracy of the accepted model after the stage.
    pub accuracy: f64,
}

/// Everything the workflow did, for the JSON/Markdown/SVG reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubstitutionReport {
    pub num_blocks: usize,
    pub max_accuracy_drop: f64,
    pub original: Evaluation,
    /// α − Δα: a step is accepted when its accuracy is strictly above this.
    pub threshold: f64,
    pub steps: Vec<StepRecord>,
    pub stages: Vec<StageRecord>,
    /// Evaluation of the final accepted model.
    pub final_evaluation: Evaluation,
    pub seconds: f64,
}

impl SubstitutionReport {
    /// How many operators of `op` the final model has replaced (a row of the paper's Table 3).
    pub fn replaced(&self, op: Operator) -> usize {
        self.stages
            .iter()
            .filter(|s| s.operator == op)
            .map(|s| s.replaced_blocks.len())
            .sum()
    }
}

/// Runs Algorithm 5 for every stage of `config`. `on_step` sees each attempt as it finishes
/// (for logging and progress).
pub fn run_substitution<T: SubstitutionTarget>(
    target: &mut T,
    config: &SubstitutionConfig,
    mut on_step: impl FnMut(&StepRecord),
) -> Result<SubstitutionReport> {
    ensure!(
        (0.0..1.0).contains(&config.max_accuracy_drop),
        InvalidArgument,
        "Δα must be a fraction in [0, 1), got {}",
        config.max_accuracy_drop
    );
    ensure!(
        !config.stages.is_empty(),
        InvalidArgument,
        "no substitution stages"
    );
    let n = target.num_blocks();
    ensure!(n > 0, InvalidArgument, "model has no blocks");
    let started = Instant::now();
    let original = target.evaluate()?;
    let threshold = original.accuracy - config.max_accuracy_drop;
    let mut accepted_eval = original.clone();
    let mut steps = Vec::new();
    let mut stages = Vec::new();
    for stage in &config.stages {
        if let Some(b) = stage.bound {
            ensure!(
                b.is_finite() && b > 0.0,
                InvalidArgument,
                "stage bound must be > 0, got {b}"
            );
        }
        let mut replaced_blocks = Vec::new();
        for block in (0..n).rev() {
            let step_started = Instant::now();
            let accepted_state = target.snapshot()?;
            target.substitute(stage.operator, block)?;
            let train_loss = target.finetune(stage.operator, block, stage.bound)?;
            let eval = target.evaluate()?;
            let accepted = eval.accuracy > threshold;
            if accepted {
                replaced_blocks.push(block);
                accepted_eval = eval.clone();
            } else {
                target.restore(&accepted_state)?;
            }
            let record = StepRecord {
                operator: stage.operator,
                block,
                bound: stage.bound,
                train_loss,
                accuracy: eval.accuracy,
                accepted,
                max_abs_hidden: eval.max_abs_hidden,
                seconds: step_started.elapsed().as_secs_f64(),
            };
            on_step(&record);
            steps.push(record);
        }
        stages.push(StageRecord {
            operator: stage.operator,
            bound: stage.bound,
            replaced_blocks,
            accuracy: accepted_eval.accuracy,
        });
    }
    Ok(SubstitutionReport {
        num_blocks: n,
        max_accuracy_drop: config.max_accuracy_drop,
        original,
        threshold,
        steps,
        stages,
        final_evaluation: accepted_eval,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::{HashMap, VecDeque};

    /// A stand-in model: its "state" is the set of replaced (operator, block) pairs; evaluation
    /// returns scripted accuracies in order and records which state each call saw.
    pub(crate) struct ScriptedTarget {
        pub blocks: usize,
        pub replaced: Vec<(Operator, usize)>,
        pub accuracies: VecDeque<f64>,
        pub finetuned: Vec<(Operator, usize, Option<f64>)>,
        pub evaluated_states: Vec<Vec<(Operator, usize)>>,
    }

    impl ScriptedTarget {
        pub(crate) fn new(blocks: usize, accuracies: &[f64]) -> Self {
            ScriptedTarget {
                blocks,
                replaced: vec![],
                accuracies: accuracies.iter().copied().collect(),
                finetuned: vec![],
                evaluated_states: vec![],
            }
        }
    }

    impl SubstitutionTarget for ScriptedTarget {
        type Snapshot = Vec<(Operator, usize)>;
        fn num_blocks(&self) -> usize {
            self.blocks
        }
        fn snapshot(&self) -> Result<Self::Snapshot> {
            Ok(self.replaced.clone())
        }
        fn restore(&mut self, s: &Self::Snapshot) -> Result<()> {
            self.replaced = s.clone();
            Ok(())
        }
        fn substitute(&mut self, op: Operator, block: usize) -> Result<()> {
            assert!(!self.replaced.contains(&(op, block)), "substituted twice");
            self.replaced.push((op, block));
            Ok(())
        }
        fn finetune(&mut self, op: Operator, block: usize, bound: Option<f64>) -> Result<f64> {
            self.finetuned.push((op, block, bound));
            Ok(0.5)
        }
        fn evaluate(&mut self) -> Result<Evaluation> {
            self.evaluated_states.push(self.replaced.clone());
            let accuracy = self
                .accuracies
                .pop_front()
                .expect("script ran out of accuracies");
            Ok(Evaluation {
                accuracy,
                examples: 100,
                max_abs_hidden: vec![accuracy as f32; 2],
            })
        }
    }

    #[test]
    fn accepts_and_rejects_against_the_threshold() {
        use Operator::*;
        // Original 0.90, Δα 0.02 → accept iff accuracy > 0.88.
        let script = [
            0.90, // original
            0.91, 0.89, // GELU block 1, 0: accepted, accepted
            0.88, 0.95, // Softmax block 1 rejected (not strictly above), block 0 accepted
            0.10, 0.87, // LN1: both rejected
            0.889, 0.5, // LN2: block 1 accepted, block 0 rejected
        ];
        let mut target = ScriptedTarget::new(2, &script);
        let mut seen = 0;
        let report =
            run_substitution(&mut target, &SubstitutionConfig::default(), |_| seen += 1).unwrap();
        assert_eq!(seen, 8);
        let accepted: Vec<bool> = report.steps.iter().map(|s| s.accepted).collect();
        assert_eq!(
            accepted,
            [true, true, false, true, false, false, true, false]
        );
        let order: Vec<(Operator, usize)> =
            report.steps.iter().map(|s| (s.operator, s.block)).collect();
        assert_eq!(order[..2], [(Gelu, 1), (Gelu, 0)]);
        assert_eq!(order[6..], [(LayerNorm2, 1), (LayerNorm2, 0)]);
        // The final model carries exactly the accepted replacements.
        assert_eq!(
            target.replaced,
            [(Gelu, 1), (Gelu, 0), (Softmax, 0), (LayerNorm2, 1)]
        );
        // A rejected step is rolled back before the next one starts.
        assert_eq!(
            target.evaluated_states[5],
            [(Gelu, 1), (Gelu, 0), (Softmax, 0), (LayerNorm1, 1)]
        );
        assert_eq!(
            target.evaluated_states[6],
            [(Gelu, 1), (Gelu, 0), (Softmax, 0), (LayerNorm1, 0)]
        );
        // Fine-tuning used each stage's bound.
        let bounds: HashMap<Operator, Option<f64>> =
            target.finetuned.iter().map(|&(op, _, b)| (op, b)).collect();
        assert_eq!(bounds[&Gelu], None);
        assert_eq!(bounds[&Softmax], Some(32.0));
        assert_eq!(bounds[&LayerNorm1], Some(24.0));
        assert_eq!(bounds[&LayerNorm2], Some(16.0));
        // Table 3 counts and per-stage accuracy of the accepted model.
        let counts: Vec<usize> = Operator::ALL
            .iter()
            .map(|&op| report.replaced(op))
            .collect();
        assert_eq!(counts, [2, 1, 0, 1]);
        let stage_acc: Vec<f64> = report.stages.iter().map(|s| s.accuracy).collect();
        assert_eq!(stage_acc, [0.89, 0.95, 0.95, 0.889]);
        assert_eq!(report.final_evaluation.accuracy, 0.889);
        assert!((report.threshold - 0.88).abs() < 1e-12);
    }

    #[test]
    fn rejects_bad_settings() {
        let mut target = ScriptedTarget::new(2, &[0.9]);
        let bad_drop = SubstitutionConfig {
            max_accuracy_drop: -0.1,
            ..Default::default()
        };
        assert!(run_substitution(&mut target, &bad_drop, |_| {}).is_err());
        let no_stages = SubstitutionConfig {
            stages: vec![],
            ..Default::default()
        };
        assert!(run_substitution(&mut target, &no_stages, |_| {}).is_err());
        let mut empty = ScriptedTarget::new(0, &[0.9]);
        assert!(run_substitution(&mut empty, &SubstitutionConfig::default(), |_| {}).is_err());
    }
}
