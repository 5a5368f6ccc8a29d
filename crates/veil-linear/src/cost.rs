//! The price of a blocking: CPU time of every HE operation it needs plus its traffic, so the
//! layout search ([`crate::layout`]) weighs server work against bytes instead of minimising
//! bytes alone.
//!
//! # The model
//! For A (n×k, encrypted) · B (k×m, plaintext) cut into blocks n_w × k_w × m_w with
//! rb = ⌈n/n_w⌉, kb = ⌈k/k_w⌉, mb = ⌈m/m_w⌉ and responses packed `pack` at a time:
//!
//! | operation | count | who |
//! |---|---|---|
//! | encrypt an A block | rb·kb | client |
//! | expand its seed, fold in the server's share | rb·kb | server |
//! | forward NTT of a B block (when not cached) | kb·mb | server |
//! | plaintext × ciphertext product | rb·kb·mb | server |
//! | key switch (packing) | (pack − 1) per full group | server |
//! | harden a response (re-randomise, flood, switch) | ⌈rb·mb/pack⌉ | server |
//! | decrypt a response | ⌈rb·mb/pack⌉ | client |
//!
//! Traffic is rb·kb ciphertexts up, and per packed response one c1 plus one c0 coefficient per
//! output entry down. A candidate's price is its CPU time shared by [`PRICING_THREADS`] cores
//! plus its bits at [`PRICING_LINK_BITS_PER_S`], the geometric mean of the cost report's LAN
//! (3 Gbit/s) and WAN (100 Mbit/s) rates, so neither link's optimum is far off.
//!
//! The constants are medians of three single-thread runs of
//! `cargo run --release -p veil-he --example calibrate` on the project machine, with the `veil`
//! binary's allocator settings (`veil_core::process`); the run and its machine are recorded in
//! docs/BENCHMARKS.md ("Moved from code comments"). Both parties must derive the same layout,
//! so the prices are constants, never re-measured at run time.

use veil_he::Params;

/// Cores the price assumes share a batch (the project machine's two).
pub(crate) const PRICING_THREADS: f64 = 2.0;

/// Link rate traffic is priced at: √(3 Gbit/s · 100 Mbit/s) ≈ 548 Mbit/s.
pub(crate) const PRICING_LINK_BITS_PER_S: f64 = 5.48e8;

/// Single-thread cost in µs of each HE operation at one parameter set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct OpCosts {
    pub encrypt: f64,
    /// Seed expansion plus folding in the server's share.
    pub expand_and_fold: f64,
    pub weight_ntt: f64,
    pub product: f64,
    pub key_switch: f64,
    pub response: f64,
    pub decrypt: f64,
}

/// Three 50-bit limbs (`ParamSet::N8192`).
pub(crate) const COSTS_3_LIMBS: OpCosts = OpCosts {
    encrypt: 202.0,
    expand_and_fold: 69.0 + 83.9,
    weight_ntt: 40.8,
    product: 9.1,
    key_switch: 630.0,
    response: 545.0,
    decrypt: 32.2,
};

/// Four 42-bit limbs (`ParamSet::N8192Q4`).
pub(crate) const COSTS_4_LIMBS: OpCosts = OpCosts {
    encrypt: 256.0,
    expand_and_fold: 90.5 + 102.9,
    weight_ntt: 51.1,
    product: 13.1,
    key_switch: 1040.0,
    response: 682.0,
    decrypt: 32.2,
};

impl OpCosts {
    /// The table for `p`'s limb count (Veil's two parameter sets have three and four).
    pub(crate) fn for_params(p: &Params) -> OpCosts {
        if p.limbs() <= 3 {
            COSTS_3_LIMBS
        } else {
            COSTS_4_LIMBS
        }
    }
}

/// Operation counts of one blocked product (see the module table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub inputs: usize,
    pub weight_ntts: usize,
    pub products: usize,
    pub key_switches: usize,
    pub responses: usize,
    /// Output entries, each one sent c0 coefficient.
    pub outputs: usize,
}

/// What a blocked product costs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Price {
    pub server_us: f64,
    pub client_us: f64,
    pub bits: f64,
}

impl Price {
    /// Modelled seconds: CPU shared by the pricing threads plus traffic at the pricing link.
    pub fn seconds(&self) -> f64 {
        (self.server_us + self.client_us) / PRICING_THREADS * 1e-6
            + self.bits / PRICING_LINK_BITS_PER_S
    }
}

impl OpCounts {
    /// Modelled single-thread µs per operation type, server side then client side.
    pub fn breakdown(&self, p: &Params) -> [(&'static str, f64); 7] {
        let c = OpCosts::for_params(p);
        let resp = self.responses as f64;
        [
            (
                "server: expand + fold inputs",
                self.inputs as f64 * c.expand_and_fold,
            ),
            (
                "server: weight NTTs",
                self.weight_ntts as f64 * c.weight_ntt,
            ),
            ("server: products", self.products as f64 * c.product),
            (
                "server: key switches",
                self.key_switches as f64 * c.key_switch,
            ),
            ("server: responses", resp * c.response),
            ("client: encrypt", self.inputs as f64 * c.encrypt),
            ("client: decrypt", resp * c.decrypt),
        ]
    }

    pub fn price(&self, p: &Params) -> Price {
        let parts = self.breakdown(p);
        let server_us = parts.iter().take(5).map(|(_, us)| us).sum();
        let client_us = parts.iter().skip(5).map(|(_, us)| us).sum();
        let resp = self.responses as f64;
        let c1_bits = p.response_bits(0) as f64;
        let c0_bits = p.response_bits(1) as f64 - c1_bits;
        Price {
            server_us,
            client_us,
            bits: self.inputs as f64 * p.ciphertext_bits() as f64
                + resp * c1_bits
                + self.outputs as f64 * c0_bits,
        }
    }
}
