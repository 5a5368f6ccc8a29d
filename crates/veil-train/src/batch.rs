//! Tokenised examples, padded batches, and the classifier interface the trainer drives.

use candle_core::{Device, Tensor};
use veil_core::{ensure, Result};

use veil_model::candle_error;

/// One tokenised example: word-piece ids, segment (token type) ids, class id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedExample {
    /// Word-piece ids, `[CLS]` and `[SEP]` included.
    pub ids: Vec<u32>,
    /// Segment (token type) id of each token.
    pub type_ids: Vec<u32>,
    /// Class id.
    pub label: u32,
}

/// A padded batch. Padding uses id 0 and mask 0; `attention_mask` is f32 (1 = real token).
pub struct Batch {
    /// [batch, seq] token ids.
    pub input_ids: Tensor,
    /// [batch, seq] segment ids.
    pub type_ids: Tensor,
    /// [batch, seq], 1 for real tokens and 0 for padding.
    pub attention_mask: Tensor,
    /// [batch] class ids.
    pub labels: Tensor,
}

impl Batch {
    /// Pads to the longest example of the batch.
    pub fn new(examples: &[&EncodedExample], device: &Device) -> Result<Batch> {
        ensure!(!examples.is_empty(), InvalidArgument, "empty batch");
        let len = examples.iter().map(|e| e.ids.len()).max().unwrap_or(0);
        ensure!(len > 0, InvalidArgument, "batch of empty token sequences");
        let n = examples.len();
        let (mut ids, mut types, mut mask) = (
            vec![0u32; n * len],
            vec![0u32; n * len],
            vec![0f32; n * len],
        );
        for (row, e) in examples.iter().enumerate() {
            ensure!(
                e.type_ids.len() == e.ids.len(),
                InvalidArgument,
                "example has {} ids but {} type ids",
                e.ids.len(),
                e.type_ids.len()
            );
            let at = row * len;
            ids[at..at + e.ids.len()].copy_from_slice(&e.ids);
            types[at..at + e.ids.len()].copy_from_slice(&e.type_ids);
            mask[at..at + e.ids.len()].fill(1.0);
        }
        let labels: Vec<u32> = examples.iter().map(|e| e.label).collect();
        let make = || -> candle_core::Result<Batch> {
            Ok(Batch {
                input_ids: Tensor::from_vec(ids, (n, len), device)?,
                type_ids: Tensor::from_vec(types, (n, len), device)?,
                attention_mask: Tensor::from_vec(mask, (n, len), device)?,
                labels: Tensor::from_vec(labels, n, device)?,
            })
        };
        make().map_err(candle_error("building a batch"))
    }

    /// Examples in the batch.
    pub fn len(&self) -> usize {
        self.labels.dims()[0]
    }

    /// Whether the batch has no examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a classifier's forward pass returns to the trainer.
pub struct ClassifierOutput {
    /// batch × classes.
    pub logits: Tensor,
    /// The output of every encoder block, block 0 first, each batch × seq × hidden.
    pub hidden_states: Vec<Tensor>,
}

impl ClassifierOutput {
    /// The same values cut from the autograd graph, which is freed with the originals (a
    /// teacher's outputs need no gradient, and its graph would double a step's memory).
    pub fn detach(&self) -> ClassifierOutput {
        ClassifierOutput {
            logits: self.logits.detach(),
            hidden_states: self.hidden_states.iter().map(Tensor::detach).collect(),
        }
    }
}

/// A model the trainer can fine-tune: a differentiable forward pass over a batch.
pub trait SequenceClassifier {
    /// Logits (and hidden states) of a batch, differentiable.
    fn forward(&self, batch: &Batch) -> candle_core::Result<ClassifierOutput>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_to_longest() {
        let a = EncodedExample {
            ids: vec![5, 6, 7],
            type_ids: vec![0, 0, 1],
            label: 1,
        };
        let b = EncodedExample {
            ids: vec![9],
            type_ids: vec![0],
            label: 0,
        };
        let batch = Batch::new(&[&a, &b], &Device::Cpu).unwrap();
        assert_eq!(
            batch.input_ids.to_vec2::<u32>().unwrap(),
            [[5, 6, 7], [9, 0, 0]]
        );
        assert_eq!(
            batch.type_ids.to_vec2::<u32>().unwrap(),
            [[0, 0, 1], [0, 0, 0]]
        );
        assert_eq!(
            batch.attention_mask.to_vec2::<f32>().unwrap(),
            [[1., 1., 1.], [1., 0., 0.]]
        );
        assert_eq!(batch.labels.to_vec1::<u32>().unwrap(), [1, 0]);
        let bad = EncodedExample {
            ids: vec![1, 2],
            type_ids: vec![0],
            label: 0,
        };
        assert!(Batch::new(&[&bad], &Device::Cpu).is_err());
        assert!(Batch::new(&[], &Device::Cpu).is_err());
    }
}
