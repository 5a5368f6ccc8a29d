//! Linear protocols on additive shares, built on BFV: Π_MatMul, FC layers, cross terms.
