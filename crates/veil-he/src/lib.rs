//! BFV homomorphic encryption (RNS, coefficient encoding, t = 2^ℓ) for linear layers.
