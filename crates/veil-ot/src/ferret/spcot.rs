//! Single-point COT from a GGM tree (punctured PRF), semi-honest, as in Ferret §4.
//!
//! The sender expands a random root with the AES length-doubling PRG ([`ggm_expand`]) to
//! `2^depth` leaves, of which the bin uses the first `len`. For every level it computes the XOR
//! `K_0` of all left children and `K_1` of all right children; the receiver, whose punctured
//! index is α, learns `K_{¬α_l}` through a chosen OT on a COT (Beaver derandomisation), which
//! is exactly what it needs to rebuild every node off the path to α.
//! Finally the sender sends `c = Δ ⊕ ⊕_i v_i`, so the receiver gets `w_α = v_α ⊕ Δ` and
//! `w_i = v_i` elsewhere: a COT whose choice vector is the unit vector at α.
//!
//! Semi-honest only: no consistency check (a malicious sender could send inconsistent sums).

use zeroize::{Zeroize, Zeroizing};

use crate::aes_prims::{ggm_expand, tccr_hash_seq, tccr_hash_tweaked};
use crate::ct::{bit_mask_128, eq_mask_128};

/// Deepest tree supported (65,536 leaves per bin).
pub const MAX_DEPTH: usize = 16;

/// Parents expanded per AES batch.
const EXPAND_BATCH: usize = 64;

/// Expands `nodes[..width]` into `next[..2·width]` (children of node j at 2j, 2j+1).
fn expand_level(nodes: &[u128], next: &mut [u128]) {
    let (mut left, mut right) = ([0u128; EXPAND_BATCH], [0u128; EXPAND_BATCH]);
    for (parents, children) in nodes
        .chunks(EXPAND_BATCH)
        .zip(next.chunks_mut(2 * EXPAND_BATCH))
    {
        let m = parents.len();
        ggm_expand(parents, &mut left[..m], &mut right[..m]);
        for i in 0..m {
            children[2 * i] = left[i];
            children[2 * i + 1] = right[i];
        }
    }
}

fn parity_sums(level: &[u128]) -> [u128; 2] {
    let mut k = [0u128; 2];
    for pair in level.chunks_exact(2) {
        k[0] ^= pair[0];
        k[1] ^= pair[1];
    }
    k
}

/// Scratch space for one tree: two ping-pong buffers of `2^depth` nodes.
pub struct TreeScratch {
    a: Vec<u128>,
    b: Vec<u128>,
}

impl TreeScratch {
    pub fn new(depth: usize) -> Self {
        TreeScratch {
            a: vec![0; 1 << depth],
            b: vec![0; 1 << depth],
        }
    }
}

impl Drop for TreeScratch {
    fn drop(&mut self) {
        self.a.zeroize();
        self.b.zeroize();
    }
}

/// The sender's view of one tree's level COTs: `q[l]`, Δ, the receiver's corrections `d[l]`
/// and the tweak of level 0.
pub struct SenderLevels<'a> {
    pub delta: u128,
    pub q: &'a [u128],
    pub d: &'a [u8],
    pub tweak: u128,
}

/// Sender: expands `root`, writes the bin's leaves to `leaves` and the message (2 blocks per
/// level, then `c`) to `msg` (length `2·depth + 1`).
pub fn send_tree(
    root: u128,
    levels: &SenderLevels<'_>,
    leaves: &mut [u128],
    msg: &mut [u128],
    scratch: &mut TreeScratch,
) {
    let depth = levels.q.len();
    assert!(
        depth <= MAX_DEPTH && levels.d.len() == depth,
        "send_tree: depth"
    );
    assert_eq!(msg.len(), 2 * depth + 1, "send_tree: message size");
    let (mut cur, mut next) = (&mut scratch.a, &mut scratch.b);
    cur[0] = root;
    // Both pads of every level are secrets (one is the receiver's, one must stay hidden).
    let mut pads_in = Zeroizing::new([0u128; 2 * MAX_DEPTH]);
    for l in 0..depth {
        let d = levels.d[l] as u128;
        pads_in[2 * l] = levels.q[l] ^ (levels.delta & 0u128.wrapping_sub(d));
        pads_in[2 * l + 1] = pads_in[2 * l] ^ levels.delta;
    }
    // Both pads of level l share the tweak of that level's COT.
    let tweaks: [u128; 2 * MAX_DEPTH] = std::array::from_fn(|i| levels.tweak + (i / 2) as u128);
    let mut pads = Zeroizing::new([0u128; 2 * MAX_DEPTH]);
    tccr_hash_tweaked(
        &pads_in[..2 * depth],
        &tweaks[..2 * depth],
        &mut pads[..2 * depth],
    );
    for l in 0..depth {
        let width = 1 << l;
        expand_level(&cur[..width], &mut next[..2 * width]);
        std::mem::swap(&mut cur, &mut next);
        let k = parity_sums(&cur[..2 * width]);
        msg[2 * l] = k[0] ^ pads[2 * l];
        msg[2 * l + 1] = k[1] ^ pads[2 * l + 1];
    }
    leaves.copy_from_slice(&cur[..leaves.len()]);
    msg[2 * depth] = leaves.iter().fold(levels.delta, |a, &v| a ^ v);
}

/// Receiver: from its level COTs `t[l]` (with choice `¬α_l`) and the sender's message,
/// rebuilds the leaves into `w`, with `w[alpha] = v_alpha ⊕ Δ`.
pub fn receive_tree(
    alpha: usize,
    t: &[u128],
    tweak: u128,
    msg: &[u128],
    w: &mut [u128],
    scratch: &mut TreeScratch,
) {
    let depth = t.len();
    assert!(depth <= MAX_DEPTH, "receive_tree: depth");
    assert!(
        alpha < w.len() && msg.len() == 2 * depth + 1,
        "receive_tree: shape"
    );
    let mut known = Zeroizing::new([0u128; MAX_DEPTH]);
    tccr_hash_seq(t, tweak, &mut known[..depth]);
    let (mut cur, mut next) = (&mut scratch.a, &mut scratch.b);
    cur[0] = 0;
    // α is this party's secret: every level scans all nodes with masks, so neither branches
    // nor addresses depend on it (the scans cost less than the level's AES expansion).
    for l in 0..depth {
        let width = 1 << l;
        expand_level(&cur[..width], &mut next[..2 * width]);
        std::mem::swap(&mut cur, &mut next);
        let bit = ((alpha >> (depth - 1 - l)) & 1) as u128;
        let path = alpha >> (depth - 1 - l);
        let sibling = path ^ 1;
        // K_{¬α_l} = msg[2l + ¬α_l] ⊕ H(t_l): select between the two without an index.
        let k = known[l] ^ (msg[2 * l + 1] & !bit_mask_128(bit)) ^ (msg[2 * l] & bit_mask_128(bit));
        // XOR of the sibling's parity class, all correct except the sibling slot itself.
        let class = bit_mask_128(bit ^ 1);
        let mut others = 0u128;
        for (j, &v) in cur[..2 * width].iter().enumerate() {
            let in_class = class ^ bit_mask_128(j as u128 & 1) ^ u128::MAX;
            others ^= v & in_class & !eq_mask_128(j, sibling);
        }
        let fixed = k ^ others;
        for (j, v) in cur[..2 * width].iter_mut().enumerate() {
            let (is_sibling, is_path) = (eq_mask_128(j, sibling), eq_mask_128(j, path));
            *v = (fixed & is_sibling) | (*v & !is_sibling & !is_path);
        }
    }
    w.copy_from_slice(&cur[..w.len()]);
    let rest = w.iter().enumerate().fold(msg[2 * depth], |a, (i, &v)| {
        a ^ (v & !eq_mask_128(i, alpha))
    });
    for (i, v) in w.iter_mut().enumerate() {
        let is_alpha = eq_mask_128(i, alpha);
        *v = (rest & is_alpha) | (*v & !is_alpha);
    }
}
