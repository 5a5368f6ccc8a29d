//! veil-nonlinear's protocols end to end (both parties in one process), in one test binary
//! (one link instead of one per file).

mod elementary;
mod flights;
mod layer_norm_he;
mod layers;
mod primitives;
