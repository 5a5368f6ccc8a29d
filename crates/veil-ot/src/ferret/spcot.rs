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

/// Expands `nodes` into `next` (children of node j at 2j, 2j+1, `next.len() = 2·nodes.len()`)
/// and returns the XOR of all left children and of all right children.
fn expand_level(nodes: &[u128], next: &mut [u128]) -> [u128; 2] {
    let (mut left, mut right) = ([0u128; EXPAND_BATCH], [0u128; EXPAND_BATCH]);
    let mut sums = [0u128; 2];
    for (parents, children) in nodes
        .chunks(EXPAND_BATCH)
        .zip(next.chunks_mut(2 * EXPAND_BATCH))
    {
        let m = parents.len();
        ggm_expand(parents, &mut left[..m], &mut right[..m]);
        for i in 0..m {
            children[2 * i] = left[i];
            children[2 * i + 1] = right[i];
            sums[0] ^= left[i];
            sums[1] ^= right[i];
        }
    }
    sums
}

/// Expands the tree level by level from `scratch.a[0]`; the last level is written to `leaves`
/// directly when it fills them exactly (the published parameter sets have full trees), else
/// to the scratch and copied. `visit(l, level, sums)` sees each level right after its
/// expansion, with its left/right sums, and may change it before the next expansion.
fn expand_tree(
    depth: usize,
    leaves: &mut [u128],
    scratch: &mut TreeScratch,
    mut visit: impl FnMut(usize, &mut [u128], [u128; 2]),
) {
    let (mut cur, mut next) = (&mut scratch.a, &mut scratch.b);
    for l in 0..depth {
        let width = 1 << l;
        if l + 1 == depth && leaves.len() == 2 * width {
            let sums = expand_level(&cur[..width], leaves);
            visit(l, leaves, sums);
            return;
        }
        let sums = expand_level(&cur[..width], &mut next[..2 * width]);
        std::mem::swap(&mut cur, &mut next);
        visit(l, &mut cur[..2 * width], sums);
    }
    leaves.copy_from_slice(&cur[..leaves.len()]);
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
    scratch.a[0] = root;
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
    expand_tree(depth, leaves, scratch, |l, _, k| {
        msg[2 * l] = k[0] ^ pads[2 * l];
        msg[2 * l + 1] = k[1] ^ pads[2 * l + 1];
    });
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
    // The receiver does not know the root: it expands 0 in its place, and at every level it
    // zeroes the node on the path to α, so the two nodes of the next level below it (the
    // next path node and its sibling) are always G(0), a public pair.
    let zero_children = {
        let (mut l, mut r) = ([0u128], [0u128]);
        ggm_expand(&[0], &mut l, &mut r);
        [l[0], r[0]]
    };
    scratch.a[0] = 0;
    // α is this party's secret: selections use masks, and every level is rewritten in full
    // with masks, so neither branches nor addresses depend on it (the pass costs less than
    // the level's AES expansion).
    expand_tree(depth, w, scratch, |l, level, sums| {
        let bit = ((alpha >> (depth - 1 - l)) & 1) as u128;
        let on = bit_mask_128(bit);
        let path = alpha >> (depth - 1 - l);
        let sibling = path ^ 1;
        // K_{¬α_l} = msg[2l + ¬α_l] ⊕ H(t_l): the XOR of the sibling's parity class.
        let k = known[l] ^ (msg[2 * l + 1] & !on) ^ (msg[2 * l] & on);
        // That class as expanded, minus its wrong member: the sibling slot, holding G(0)'s
        // child of the sibling's side.
        let expanded = ((sums[1] ^ zero_children[1]) & !on) | ((sums[0] ^ zero_children[0]) & on);
        let fixed = k ^ expanded;
        for (j, v) in level.iter_mut().enumerate() {
            let (is_sibling, is_path) = (eq_mask_128(j, sibling), eq_mask_128(j, path));
            *v = (fixed & is_sibling) | (*v & !is_sibling & !is_path);
        }
    });
    // w[α] is 0 now, so the XOR of all leaves is the XOR of the others.
    let rest = w.iter().fold(msg[2 * depth], |a, &v| a ^ v);
    for (i, v) in w.iter_mut().enumerate() {
        let is_alpha = eq_mask_128(i, alpha);
        *v = (rest & is_alpha) | (*v & !is_alpha);
    }
}
