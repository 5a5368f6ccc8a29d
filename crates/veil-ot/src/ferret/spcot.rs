//! Single-point COT from a correlated GGM tree: the Half-Tree construction of Guo, Yang, Wang,
//! Zhang, Xie, Liu and Zhao (EUROCRYPT 2023, ePrint 2022/1431, Fig. 3 and §4), semi-honest.
//!
//! The sender's tree is built under the global COT offset Δ: the two nodes of level 1 are
//! `(k, k ⊕ Δ)` for a random `k`, and every node `x` has children `left = H(x)`,
//! `right = x ⊕ H(x)` with `H` the circular-correlation-robust hash [`ccr_hash`]. Since the
//! children of `x` XOR to `x`, every level XORs to Δ, so with `K_0` the XOR of a level's left
//! children its right children XOR to `K_0 ⊕ Δ`. One random COT per level then suffices: the
//! sender sends `c_l = K_0 ⊕ q_l`, and the receiver, whose COT gives `t_l = q_l ⊕ b_l·Δ`,
//! learns `c_l ⊕ t_l = K_{b_l}`. The punctured path is therefore *defined* by the COT choice
//! bits, `α_l = ¬b_l`, which is what Ferret's regular noise needs (a uniform position in each
//! full bin), so the receiver sends nothing. From `K_{¬α_l}` it rebuilds the sibling of its path
//! node at every level and with it every leaf but the path's. The leaves XOR to Δ, so the
//! receiver's XOR of all other leaves is `v_α ⊕ Δ`: a COT whose choice vector is the unit vector
//! at α, with no final correction message. Cost per tree: `depth` blocks from sender to receiver
//! and one fixed-key AES call per node (the classic GGM tree needs `2·depth + 1` blocks, a
//! correction bit per level back, and two AES calls per node).
//!
//! Leaf layout (as in emp-ot's `cggm.h`): each level is expanded in place, left children over
//! their parents and right children in the upper half, so the leaf of path `α` (MSB first) sits
//! at index `bit_reverse(α)`. Consumers only need to know where the punctured leaf is.
//!
//! Security: semi-honest, in the random-permutation model for the fixed-key AES inside `H`
//! (Half-Tree, Theorem 4.3 and §4.2); no consistency check, so no malicious security.
//! The receiver's path never drives a branch or an address: its per-level writes are masked
//! passes over the whole level.

use crate::aes_prims::ccr_hash;
use crate::ct::{bit_mask_128, eq_mask_128};

/// Deepest tree supported (65,536 leaves per bin).
pub(crate) const MAX_DEPTH: usize = 16;

/// Parents hashed per AES batch.
const EXPAND_BATCH: usize = 64;

/// Expands the `n` parents in `nodes[..n]` in place: the left child of parent `j` replaces it
/// and its right child goes to `nodes[n + j]`. Returns the XOR of the left children and the XOR
/// of the right children.
fn expand_level(nodes: &mut [u128], n: usize) -> [u128; 2] {
    let mut left = [0u128; EXPAND_BATCH];
    let mut sums = [0u128; 2];
    let (parents, rights) = nodes[..2 * n].split_at_mut(n);
    for (ps, rs) in parents
        .chunks_mut(EXPAND_BATCH)
        .zip(rights.chunks_mut(EXPAND_BATCH))
    {
        let m = ps.len();
        ccr_hash(ps, &mut left[..m]);
        for i in 0..m {
            let right = ps[i] ^ left[i];
            rs[i] = right;
            ps[i] = left[i];
            sums[0] ^= left[i];
            sums[1] ^= right;
        }
    }
    sums
}

#[cfg(test)]
/// Index of the leaf of path `path` (`depth` bits, MSB = level 1) in the in-place layout.
pub(crate) fn leaf_index(path: usize, depth: usize) -> usize {
    (path.reverse_bits() >> (usize::BITS as usize - depth)) & ((1 << depth) - 1)
}

/// Sender: builds the tree of `root` into `leaves` (exactly `2^depth`) and writes the level
/// messages `c_l = K_0(l) ⊕ q_l` to `msg` (one block per level COT `q_l`).
pub(crate) fn send_tree(
    root: u128,
    delta: u128,
    q: &[u128],
    leaves: &mut [u128],
    msg: &mut [u128],
) {
    let depth = q.len();
    assert!(
        (1..=MAX_DEPTH).contains(&depth) && leaves.len() == 1 << depth && msg.len() == depth,
        "send_tree: shape"
    );
    leaves[0] = root;
    leaves[1] = root ^ delta;
    msg[0] = root ^ q[0];
    for l in 1..depth {
        let [k0, _] = expand_level(leaves, 1 << l);
        msg[l] = k0 ^ q[l];
    }
}

/// Receiver: from its level COTs `t_l` with choice bits `b_l` and the sender's `msg`, rebuilds
/// the leaves into `w` (exactly `2^depth`) so that `w[i] = v_i` except at the punctured leaf
/// `leaf_index(α)`, `α_l = ¬b_l`, where `w = v ⊕ Δ`. Returns that index (a secret).
pub(crate) fn receive_tree(t: &[u128], bits: &[u8], msg: &[u128], w: &mut [u128]) -> usize {
    let depth = t.len();
    assert!(
        (1..=MAX_DEPTH).contains(&depth)
            && bits.len() == depth
            && msg.len() == depth
            && w.len() == 1 << depth,
        "receive_tree: shape"
    );
    let alpha_bit = |l: usize| (1 ^ bits[l] & 1) as usize;
    // The path node of every level holds 0; its children are then both H(0), a public value.
    let junk = {
        let mut h = [0u128];
        ccr_hash(&[0], &mut h);
        h[0]
    };
    // Level 1: the path node is at α_1, its sibling K_{¬α_1}.
    let on = bit_mask_128(alpha_bit(0) as u128);
    let known = msg[0] ^ t[0];
    w[0] = known & on;
    w[1] = known & !on;
    let mut path = alpha_bit(0);
    for l in 1..depth {
        let half = 1 << l;
        let a = alpha_bit(l);
        let on = bit_mask_128(a as u128);
        let sums = expand_level(w, half);
        // The sibling's side (¬α_l) as expanded includes the junk child of the path node.
        let side = (sums[0] & on) | (sums[1] & !on);
        let sibling = side ^ junk ^ msg[l] ^ t[l];
        let (path_child, sibling_child) = (path + a * half, path + (1 - a) * half);
        for (j, v) in w[..2 * half].iter_mut().enumerate() {
            let (is_sibling, is_path) = (eq_mask_128(j, sibling_child), eq_mask_128(j, path_child));
            *v = (sibling & is_sibling) | (*v & !is_sibling & !is_path);
        }
        path = path_child;
    }
    // w[path] is 0, so the XOR of all leaves is the XOR of the others: v_α ⊕ Δ.
    let rest = w.iter().fold(0, |a, &v| a ^ v);
    for (i, v) in w.iter_mut().enumerate() {
        let is_alpha = eq_mask_128(i, path);
        *v = (rest & is_alpha) | (*v & !is_alpha);
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use veil_core::Prg;

    /// Random level COTs with the given choice bits: the sender's q and the receiver's t.
    fn ideal_level_cots(prg: &mut Prg, delta: u128, bits: &[u8]) -> (Vec<u128>, Vec<u128>) {
        let q: Vec<u128> = bits
            .iter()
            .map(|_| u128::from_le_bytes(prg.block()))
            .collect();
        let t = q
            .iter()
            .zip(bits)
            .map(|(&q, &b)| q ^ if b == 1 { delta } else { 0 })
            .collect();
        (q, t)
    }

    #[test]
    fn leaf_index_reverses_the_path_bits() {
        assert_eq!(leaf_index(0b001, 3), 0b100);
        assert_eq!(leaf_index(0b110, 3), 0b011);
        assert_eq!(leaf_index(1, 1), 1);
        for p in 0..256 {
            assert_eq!(leaf_index(leaf_index(p, 8), 8), p);
        }
    }

    #[test]
    fn every_level_of_the_sender_tree_xors_to_delta() {
        let mut prg = Prg::from_os_entropy();
        let delta = u128::from_le_bytes(prg.block());
        let mut nodes = vec![0u128; 64];
        nodes[0] = 12345;
        nodes[1] = 12345 ^ delta;
        for l in 1..6 {
            let [k0, k1] = expand_level(&mut nodes, 1 << l);
            assert_eq!(k0 ^ k1, delta, "level {l}");
            assert_eq!(nodes[..2 << l].iter().fold(0, |a, &v| a ^ v), delta);
        }
    }

    #[test]
    fn single_tree_punctures_exactly_the_path_of_the_choice_bits() {
        let mut prg = Prg::from_os_entropy();
        let delta = u128::from_le_bytes(prg.block());
        for depth in [1usize, 2, 4] {
            let len = 1 << depth;
            for alpha in 0..len {
                // Ideal level COTs with choice bits b_l = ¬α_l.
                let bits: Vec<u8> = (0..depth)
                    .map(|l| 1 - ((alpha >> (depth - 1 - l)) & 1) as u8)
                    .collect();
                let (q, t) = ideal_level_cots(&mut prg, delta, &bits);
                let (mut v, mut w) = (vec![0u128; len], vec![0u128; len]);
                let mut msg = vec![0u128; depth];
                send_tree(
                    u128::from_le_bytes(prg.block()),
                    delta,
                    &q,
                    &mut v,
                    &mut msg,
                );
                let hole = receive_tree(&t, &bits, &msg, &mut w);
                assert_eq!(hole, leaf_index(alpha, depth));
                for i in 0..len {
                    let want = if i == hole { v[i] ^ delta } else { v[i] };
                    assert_eq!(w[i], want, "depth {depth} alpha {alpha} leaf {i}");
                }
                // The leaves are distinct and not the root's correlation in the clear.
                let mut sorted = v.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len(), len);
            }
        }
    }

    #[test]
    fn a_wrong_level_message_breaks_the_correlation() {
        let mut prg = Prg::from_os_entropy();
        let delta = u128::from_le_bytes(prg.block());
        let depth = 3;
        let bits = vec![1u8, 0, 1];
        let (q, t) = ideal_level_cots(&mut prg, delta, &bits);
        let (mut v, mut w) = (vec![0u128; 8], vec![0u128; 8]);
        let mut msg = vec![0u128; depth];
        send_tree(9, delta, &q, &mut v, &mut msg);
        msg[1] ^= 1;
        let hole = receive_tree(&t, &bits, &msg, &mut w);
        assert!((0..8).any(|i| w[i] != if i == hole { v[i] ^ delta } else { v[i] }));
    }
}
