//! The cost classes a two-party run is accounted in.
//!
//! `veil-net`'s meter charges bytes, flights and time to the innermost class entered and totals
//! them per outermost one (per operator); the model's composition (`veil-model`) opens the
//! operator classes through its engine, so the enum lives here, below both. Its names are the
//! lines of every cost report, the keys of the JSON output and the words of the docs: renaming a
//! variant's text changes all three.

use std::cmp::Ordering;
use std::fmt;

/// What a protocol step's traffic and time are charged to. The operator classes head the cost
/// reports; the finer ones (`Exp`, `Recip`, `Compare`, …) are the steps inside them, reported
/// per label and totalled into the operator that opened them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CostClass {
    /// The session's set-up: key exchange, base OTs, HE keys.
    Setup,
    /// The HE set-up of the linear-layer benchmark.
    HeSetup,
    /// The embedding lookup and its LayerNorm on shares.
    Embedding,
    /// HE matrix products (the linear layers and attention's products).
    MatMul,
    /// The truncation after each fixed-point product.
    Truncation,
    /// Sign extension of shares to a wider ring.
    Extension,
    /// The exact softmax of attention scores.
    Softmax,
    /// The ReLU-normalise substitute for softmax.
    ReluNormalise,
    /// The exact GELU activation.
    Gelu,
    /// The ReLU activation (also ReLU inside other operators).
    Relu,
    /// The exact LayerNorm.
    LayerNorm,
    /// RMSNorm (decoders).
    RmsNorm,
    /// The SiLU of a decoder's gated MLP.
    Silu,
    /// Hard-swish, SiLU's substitute in a decoder's gated MLP, with its product by `up`.
    HardSwish,
    /// The centring substitute for LayerNorm.
    Centring,
    /// Centring's affine step.
    CentreAffine,
    /// The model's head (pooling, dense, tanh, classifier).
    Head,
    /// The row maximum inside softmax.
    Max,
    /// The exponential inside softmax.
    Exp,
    /// The reciprocal inside softmax and ReLU-normalise.
    Recip,
    /// The reciprocal square root inside LayerNorm.
    Rsqrt,
    /// The hyperbolic tangent of the pooler head.
    Tanh,
    /// A secure comparison.
    Compare,
    /// The derivative of ReLU (the sign bit).
    DRelu,
    /// A secure product of two shared values.
    Mul,
    /// A silent-OT pool refill: shared by every operator, so its own class wherever it happens.
    OtRefill,
    /// Traffic sent while no class is open.
    Unlabelled,
}

impl CostClass {
    /// Every class, in declaration order.
    #[rustfmt::skip]
    pub const ALL: [CostClass; 27] = {
        use CostClass::*;
        [
            Setup, HeSetup, Embedding, MatMul, Truncation, Extension, Softmax, ReluNormalise, Gelu,
            Relu, LayerNorm, RmsNorm, Silu, HardSwish, Centring, CentreAffine, Head, Max, Exp,
            Recip, Rsqrt, Tanh, Compare, DRelu, Mul, OtRefill, Unlabelled,
        ]
    };

    /// The class's name in reports, JSON keys and docs.
    pub const fn as_str(self) -> &'static str {
        match self {
            CostClass::Setup => "Setup",
            CostClass::HeSetup => "HE setup",
            CostClass::Embedding => "Embedding",
            CostClass::MatMul => "MatMul",
            CostClass::Truncation => "Truncation",
            CostClass::Extension => "Extension",
            CostClass::Softmax => "Softmax",
            CostClass::ReluNormalise => "ReLU-normalise",
            CostClass::Gelu => "GELU",
            CostClass::Relu => "ReLU",
            CostClass::LayerNorm => "LayerNorm",
            CostClass::RmsNorm => "RMSNorm",
            CostClass::Silu => "SiLU",
            CostClass::HardSwish => "Hard-swish",
            CostClass::Centring => "Centring",
            CostClass::CentreAffine => "Centre-affine",
            CostClass::Head => "Head",
            CostClass::Max => "Max",
            CostClass::Exp => "Exp",
            CostClass::Recip => "Recip",
            CostClass::Rsqrt => "Rsqrt",
            CostClass::Tanh => "Tanh",
            CostClass::Compare => "Compare",
            CostClass::DRelu => "DReLU",
            CostClass::Mul => "Mul",
            CostClass::OtRefill => "OT refill",
            CostClass::Unlabelled => "unlabelled",
        }
    }
}

impl fmt::Display for CostClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so width and alignment in report tables apply.
        f.pad(self.as_str())
    }
}

/// Ordered by name, so reports keyed by class list their lines in the order they always had.
impl Ord for CostClass {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for CostClass {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::CostClass;

    #[test]
    fn names_are_distinct_and_order_follows_them() {
        let mut by_class = CostClass::ALL.to_vec();
        by_class.sort();
        let mut by_name: Vec<&str> = CostClass::ALL.iter().map(|c| c.as_str()).collect();
        by_name.sort();
        by_name.dedup();
        assert_eq!(
            by_name.len(),
            CostClass::ALL.len(),
            "two classes share a name"
        );
        assert_eq!(
            by_class.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
            by_name
        );
        assert_eq!(format!("[{:<8}]", CostClass::Gelu), "[GELU    ]");
        assert_eq!(CostClass::OtRefill.to_string(), "OT refill");
    }
}
