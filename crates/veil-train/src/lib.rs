//! Fine-tuning with the bound loss, and the layer-by-layer substitution workflow (Algorithm 5).
