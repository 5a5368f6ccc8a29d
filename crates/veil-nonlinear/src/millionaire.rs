//! Millionaire's comparison (CrypTFlow2 / Cheetah style): XOR shares of \[a > b\] where the client
//! privately holds a and the server privately holds b, both k-bit unsigned integers.
//!
//! Both values are cut into digits of 3 bits, or of 3 and 4 bits where that saves a tree level
//! ([`digit_widths`]). For every digit the client, as 1-of-2^m OT
//! sender, offers the table v ↦ (\[a_j > v\], [a_j = v]) and the server selects its digit b_j
//! in the shared-output OT (veil-ot `send_1_of_n_shared`: the client's masks are derived from the
//! OT keys, so entry 0 is never sent): this gives XOR shares of gt_j and eq_j (the lowest digit's
//! eq is never used, so its table carries gt only). A binary tree then combines adjacent digits,
//! low to high: gt = gt_hi ⊕ (eq_hi ∧ gt_lo), eq = eq_hi ∧ eq_lo (the two ANDs share the choice
//! bit eq_hi, so one 2-bit binary COT per direction does both). The lowest node's eq is never
//! used, and neither is any eq of the last level: those gates select gt alone (1-bit COTs).
//!
//! Cost per comparison of k bits in d digits: d 1-of-2^w shared-output OTs (2^w − 1 entries of 2
//! bits, 1 for the lowest digit, and w choice bits each: 17 bits for a 3-bit digit, 34 for a
//! 4-bit one), d − 1 combine gates of 3 bits per direction (2 on the lowest spine and at the last
//! level); at k = 40 about 290 bits and 68 COTs. The tree's depth is what a network pays for, so
//! d is the smallest power of two that 4-bit digits reach, ⌈log2 ⌈k/4⌉⌉ levels, and as many
//! digits as possible stay 3 bits wide (the cheaper leaf per bit): at k = 26 two 4-bit digits and
//! six 3-bit ones (8 digits, 3 levels, about 11 bits more than nine 3-bit digits in 4 levels).
//! Flights: 3 + 2·⌈log2 ⌈k/4⌉⌉ — the d leaves in one batched 1-of-N call (two flights), the first
//! AND level in three, each further level in two (its server corrections ride on the previous
//! level's last flight).
//!
//! Security: semi-honest; the server's view is OT outputs masked by the client's fresh bits, the
//! client's view is OT sender transcripts (see veil-ot).

use veil_core::{ensure, Result};
use veil_net::{Channel, Role};
use veil_ot::{OneOfN, OtSession};

use crate::boolean::and_select;
use crate::two_way_cot::low_mask;

/// Digit width m. Per compared bit, a digit costs (2^m·2 + m)/m bits of leaf OT plus ~10/m bits
/// of combining: m = 2, 3, 4 give 9.8, 9.3, 11.2 bits at k = 40; 3 wins (CrypTFlow2 uses 4 with
/// IKNP-era costs), and 4 is used only where it removes a tree level.
const DIGIT_BITS: u32 = 3;

/// The widths of the digits of a k-bit comparison, lowest first: ⌈k/3⌉ digits of 3 bits (the
/// top one narrower) when 4-bit digits would not need fewer tree levels; otherwise
/// d = 2^⌈log2 ⌈k/4⌉⌉ digits (3d < k ≤ 4d), k − 3d of them 4 bits wide: the lowest first (its
/// table carries gt alone, 15 bits instead of 30), then the top ones.
pub(crate) fn digit_widths(bits: u32) -> Vec<u32> {
    let levels = |d: u32| 32 - (d.max(1) - 1).leading_zeros();
    let d3 = bits.div_ceil(DIGIT_BITS);
    let d4 = 1u32 << levels(bits.div_ceil(DIGIT_BITS + 1));
    if d4 >= d3 {
        let top = bits - DIGIT_BITS * (d3 - 1);
        return (0..d3)
            .map(|j| if j + 1 == d3 { top } else { DIGIT_BITS })
            .collect();
    }
    let fours = bits - DIGIT_BITS * d4;
    (0..d4)
        .map(|j| DIGIT_BITS + (j == 0 || j > d4 - fours) as u32)
        .collect()
}

/// XOR shares of \[a > b\]: the client passes `mine = a`, the server `mine = b`; values must be
/// below 2^bits (1 ≤ bits ≤ 64).
pub(crate) fn greater_than<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    mine: &[u64],
    bits: u32,
) -> Result<Vec<bool>> {
    greater_than_sharing_low(ot, ch, role, &[], mine, &[], bits)
}

/// [`greater_than`] where element e may agree, on both parties' inputs, with `base[b]` on every
/// bit below j (`share[e] = Some((b, j))`, a public fact of the batch; an empty `share`: no
/// element shares anything): the leaves of the digits
/// entirely below bit j are then the base's, computed once and used by every element sharing
/// them (shares of the same bits may enter any number of AND gates). Comparisons of one value
/// against many public thresholds 2^j agree below j, so about half their leaves go. The tree and
/// its flights are [`greater_than`]'s.
pub(crate) fn greater_than_sharing_low<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    base: &[u64],
    mine: &[u64],
    share: &[Option<(usize, u32)>],
    bits: u32,
) -> Result<Vec<bool>> {
    ensure!(
        (1..=64).contains(&bits),
        InvalidArgument,
        "comparison width {bits} outside 1..=64"
    );
    let vmask = low_mask(bits);
    ensure!(
        mine.iter().chain(base).all(|&v| v & !vmask == 0),
        InvalidArgument,
        "comparison input exceeds {bits} bits"
    );
    ensure!(
        (share.is_empty() || share.len() == mine.len())
            && share.iter().flatten().all(|&(b, _)| b < base.len()),
        InvalidArgument,
        "a shared-digit map that does not fit the batch"
    );
    let n = mine.len();
    let widths = digit_widths(bits);
    // Per digit: which base values and which elements need a leaf of their own.
    let mut ends = Vec::with_capacity(widths.len());
    let mut pos = 0;
    for &w in &widths {
        pos += w;
        ends.push(pos);
    }
    let shared = |e: usize, t: usize| {
        share
            .get(e)
            .copied()
            .flatten()
            .is_some_and(|(_, j)| ends[t] <= j)
    };
    let mut digit_values = Vec::with_capacity(widths.len());
    let mut base_slot = Vec::with_capacity(widths.len());
    for (t, &w) in widths.iter().enumerate() {
        let digit = |v: u64| (v >> (ends[t] - w)) & low_mask(w);
        let mut slot = vec![usize::MAX; base.len()];
        let mut values = Vec::new();
        for e in (0..n).filter(|&e| shared(e, t)) {
            let b = share[e].expect("shared").0;
            if slot[b] == usize::MAX {
                slot[b] = values.len();
                values.push(digit(base[b]));
            }
        }
        values.extend((0..n).filter(|&e| !shared(e, t)).map(|e| digit(mine[e])));
        digit_values.push(values);
        base_slot.push(slot);
    }
    let got = leaves(ot, ch, role, &digit_values, &widths)?;
    // Leaves, digit-major: nodes[t][e] = (gt, eq) shares of digit t of element e.
    let mut nodes = Vec::with_capacity(widths.len());
    for (t, leaf) in got.iter().enumerate() {
        let mut own = base_slot[t].iter().filter(|&&s| s != usize::MAX).count();
        let mut row = Vec::with_capacity(n);
        for e in 0..n {
            if shared(e, t) {
                row.push(leaf[base_slot[t][share[e].expect("shared").0]]);
            } else {
                row.push(leaf[own]);
                own += 1;
            }
        }
        nodes.push(row);
    }
    combine(ot, ch, role, nodes, n)
}

/// The comparison tree over the digit leaves (nodes[t][e]), low to high: gt = gt_hi ⊕ (eq_hi ∧
/// gt_lo), eq = eq_hi ∧ eq_lo; returns the gt of each element.
fn combine<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    mut nodes: Vec<Vec<(bool, bool)>>,
    n: usize,
) -> Result<Vec<bool>> {
    while nodes.len() > 1 {
        let pairs = nodes.len() / 2;
        // Element-major, so the widths form one pattern per element: the lowest pair's eq is
        // never used (the lowest digit has none, and its node stays the lowest), so it only
        // needs gt, as does every pair of the last level.
        let widths: Vec<u32> = (0..pairs)
            .map(|t| if t == 0 || nodes.len() == 2 { 1 } else { 2 })
            .collect();
        let mut a = Vec::with_capacity(pairs * n);
        let mut d = Vec::with_capacity(pairs * n);
        for i in 0..n {
            for t in 0..pairs {
                let (lo, hi) = (&nodes[2 * t], &nodes[2 * t + 1]);
                a.push(hi[i].1);
                d.push(lo[i].0 as u64 | (lo[i].1 as u64) << 1);
            }
        }
        let prod = and_select(ot, ch, role, &a, &d, &widths)?;
        let mut next = Vec::with_capacity(nodes.len().div_ceil(2));
        for t in 0..pairs {
            let hi = &nodes[2 * t + 1];
            next.push(
                (0..n)
                    .map(|i| {
                        let p = prod[i * pairs + t];
                        (hi[i].0 ^ (p & 1 == 1), p >> 1 & 1 == 1)
                    })
                    .collect(),
            );
        }
        if nodes.len() % 2 == 1 {
            next.push(nodes.pop().expect("odd node"));
        }
        nodes = next;
    }
    Ok(nodes
        .pop()
        .map(|v| v.into_iter().map(|(gt, _)| gt).collect())
        .unwrap_or_default())
}

/// Shares of (gt, eq) for every digit j of width `widths[j]` (`digits[j][i]`: digit j of
/// element i), all in one batched 1-of-N call (two flights): the client is the 1-of-2^w sender.
/// The lowest digit's eq is never used: its table carries gt alone and its eq share is false.
fn leaves<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    digits: &[Vec<u64>],
    widths: &[u32],
) -> Result<Vec<Vec<(bool, bool)>>> {
    let bits = |j: usize| 1 + (j > 0) as u32;
    let got = match role {
        Role::Client => {
            let groups: Vec<OneOfN> = widths
                .iter()
                .enumerate()
                .map(|(j, &w)| OneOfN {
                    log_n: w,
                    count: digits[j].len(),
                    bits: bits(j),
                })
                .collect();
            ot.send_1_of_n_shared_groups(ch, &groups, |j, i, row| {
                let (a, eq_bit) = (digits[j][i], (j > 0) as u64);
                for (v, e) in row.iter_mut().enumerate() {
                    let v = v as u64;
                    *e = (a > v) as u64 | ((a == v) as u64 & eq_bit) << 1;
                }
            })?
        }
        Role::Server => {
            let choices: Vec<Vec<u8>> = digits
                .iter()
                .map(|d| d.iter().map(|&b| b as u8).collect())
                .collect();
            let groups: Vec<(u32, u32, &[u8])> = widths
                .iter()
                .enumerate()
                .map(|(j, &w)| (w, bits(j), choices[j].as_slice()))
                .collect();
            ot.recv_1_of_n_shared_groups(ch, &groups)?
        }
    };
    Ok(got
        .into_iter()
        .map(|g| {
            g.into_iter()
                .map(|v| (v & 1 == 1, v >> 1 & 1 == 1))
                .collect()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_harness::{open_bits, run_mem};
    use veil_core::Prg;

    #[test]
    fn digit_widths_cover_the_bits_in_the_fewest_levels() {
        let levels = |d: usize| usize::BITS - (d.max(1) - 1).leading_zeros();
        for bits in 1..=64u32 {
            let w = digit_widths(bits);
            assert_eq!(w.iter().sum::<u32>(), bits, "k = {bits}");
            assert!(w.iter().all(|&x| (1..=4).contains(&x)), "k = {bits}: {w:?}");
            assert_eq!(
                levels(w.len()),
                levels(bits.div_ceil(4) as usize),
                "k = {bits}"
            );
        }
        assert_eq!(digit_widths(26), [4, 3, 3, 3, 3, 3, 3, 4]);
        assert_eq!(digit_widths(25), [4, 3, 3, 3, 3, 3, 3, 3]);
        assert_eq!(digit_widths(24), [3; 8]);
        assert_eq!(digit_widths(40), [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 1]);
    }

    /// Elements that agree with a base value below bit j (on both sides) compare exactly, for
    /// every j from 0 (nothing shared) to past the width (everything shared), mixed in one batch
    /// with elements that share nothing.
    #[test]
    fn shared_low_digits_compare_exactly() {
        let mut prg = Prg::from_os_entropy();
        for bits in [4u32, 13, 24, 26] {
            let m = (1u64 << bits) - 1;
            let (base_a, base_b): (Vec<u64>, Vec<u64>) =
                (0..6).map(|_| (prg.u64() & m, prg.u64() & m)).unzip();
            let (mut a, mut b, mut share) = (Vec::new(), Vec::new(), Vec::new());
            for (i, (&ba, &bb)) in base_a.iter().zip(&base_b).enumerate() {
                for j in 0..=bits + 2 {
                    let keep = if j >= 64 { u64::MAX } else { (1u64 << j) - 1 };
                    let (ra, rb) = (prg.u64() & m & !keep, prg.u64() & m & !keep);
                    a.push(ba & keep | ra);
                    b.push(bb & keep | rb);
                    share.push(Some((i, j)));
                }
                a.push(prg.u64() & m);
                b.push(ba);
                share.push(None);
            }
            let got = open_bits(run_mem(|ot, ch, role| {
                let (base, mine) = if role == Role::Client {
                    (&base_a, &a)
                } else {
                    (&base_b, &b)
                };
                greater_than_sharing_low(ot, ch, role, base, mine, &share, bits)
            }));
            for e in 0..a.len() {
                assert_eq!(got[e], a[e] > b[e], "bits {bits}, element {e}");
            }
        }
    }

    #[test]
    fn millionaire_matches_integer_comparison() {
        let mut prg = Prg::from_os_entropy();
        for bits in [1u32, 3, 4, 5, 13, 25, 26, 40, 58, 64] {
            let m = if bits == 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
            let mut a: Vec<u64> = (0..40).map(|_| prg.u64() & m).collect();
            let mut b: Vec<u64> = (0..40).map(|_| prg.u64() & m).collect();
            // Edges: equal values, extremes, off by one.
            a.extend([0, m, m, 0, 5 & m, m]);
            b.extend([0, m, 0, m, 5 & m, m.saturating_sub(1)]);
            let got = open_bits(run_mem(|ot, ch, role| {
                let mine = if role == Role::Client { &a } else { &b };
                greater_than(ot, ch, role, mine, bits)
            }));
            for i in 0..a.len() {
                assert_eq!(got[i], a[i] > b[i], "bits {bits}: {} > {}", a[i], b[i]);
            }
        }
    }
}
