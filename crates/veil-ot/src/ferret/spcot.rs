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

use crate::aes_prims::{ggm_expand, tccr_hash_seq, tccr_hash_tweaked};

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
        use zeroize::Zeroize;
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
    let mut pads_in = [0u128; 2 * MAX_DEPTH];
    for l in 0..depth {
        let d = levels.d[l] as u128;
        pads_in[2 * l] = levels.q[l] ^ (levels.delta & 0u128.wrapping_sub(d));
        pads_in[2 * l + 1] = pads_in[2 * l] ^ levels.delta;
    }
    // Both pads of level l share the tweak of that level's COT.
    let tweaks: [u128; 2 * MAX_DEPTH] = std::array::from_fn(|i| levels.tweak + (i / 2) as u128);
    let mut pads = [0u128; 2 * MAX_DEPTH];
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
    let mut known = [0u128; MAX_DEPTH];
    tccr_hash_seq(t, tweak, &mut known[..depth]);
    let (mut cur, mut next) = (&mut scratch.a, &mut scratch.b);
    cur[0] = 0;
    for l in 0..depth {
        let width = 1 << l;
        expand_level(&cur[..width], &mut next[..2 * width]);
        std::mem::swap(&mut cur, &mut next);
        let bit = (alpha >> (depth - 1 - l)) & 1;
        let path = alpha >> (depth - 1 - l);
        let sibling = path ^ 1;
        let k = known[l] ^ msg[2 * l + (bit ^ 1)];
        // XOR of the sibling's parity class, all correct except the sibling slot itself.
        let mut others = 0u128;
        for j in (sibling & 1..2 * width).step_by(2) {
            if j != sibling {
                others ^= cur[j];
            }
        }
        cur[sibling] = k ^ others;
        cur[path] = 0;
    }
    w.copy_from_slice(&cur[..w.len()]);
    let rest = w
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != alpha)
        .fold(msg[2 * depth], |a, (_, &v)| a ^ v);
    w[alpha] = rest;
}
