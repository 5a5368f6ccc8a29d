//! Bit decomposition of a shared value and prefix scans over XOR-shared bits.
//!
//! [`sum_bits`] turns additive shares of s = a + b mod 2^k (the client holds a, the server b)
//! into XOR shares of the k bits of s: carry-lookahead with the generate/propagate pairs
//! (a_i ∧ b_i, a_i ⊕ b_i) combined by a Sklansky parallel prefix, ⌈log2 k⌉ levels of one 2-bit
//! AND gate per node. [`suffix_or`] gives OR_{i ≥ j} x_i for every j with the same prefix
//! network on (0, ¬x_i) pairs. Together they find every threshold [s ≥ 2^j] of a value known
//! to lie in [0, 2^k) for about k·(log2 k)·8 bits, instead of one comparison per threshold.
//!
//! Exact. Security: semi-honest; only the AND gates of [`crate::boolean`] exchange messages.

use veil_core::{ensure, Result};
use veil_net::{Channel, Role};
use veil_ot::OtSession;

use crate::boolean::{and_private, and_select};

/// Sklansky prefix over rows of `k` (generate, propagate) pairs, in place: afterwards entry i
/// holds (G, P) of the span 0 … i, where (G_hi, P_hi) ∘ (G_lo, P_lo) = (G_hi ⊕ P_hi ∧ G_lo,
/// P_hi ∧ P_lo). The nodes of one level, over all rows, share one AND call.
fn prefix<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    g: &mut [bool],
    p: &mut [bool],
    k: usize,
) -> Result<()> {
    let rows = g.len() / k.max(1);
    let mut span = 1;
    while span < k {
        // Entry i (bit `span` set) absorbs entry j, the last of the lower half of its block.
        let pairs: Vec<(usize, usize)> = (0..k)
            .filter(|i| i & span != 0)
            .map(|i| (i, (i & !(span - 1)) - 1))
            .collect();
        let (mut sel, mut words) = (Vec::new(), Vec::new());
        for r in 0..rows {
            for &(i, j) in &pairs {
                sel.push(p[r * k + i]);
                words.push(g[r * k + j] as u64 | (p[r * k + j] as u64) << 1);
            }
        }
        let got = and_select(ot, ch, role, &sel, &words, &[2])?;
        for r in 0..rows {
            for (t, &(i, _)) in pairs.iter().enumerate() {
                let v = got[r * pairs.len() + t];
                g[r * k + i] ^= v & 1 == 1;
                p[r * k + i] = v >> 1 & 1 == 1;
            }
        }
        span <<= 1;
    }
    Ok(())
}

/// XOR shares of the bits of a + b mod 2^k, where the client passes `mine = a` and the server
/// `mine = b` (values below 2^k, 1 ≤ k ≤ 64). Element-major: bit j of element i at i·k + j.
pub(crate) fn sum_bits<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    mine: &[u64],
    k: u32,
) -> Result<Vec<bool>> {
    ensure!(
        (1..=64).contains(&k),
        InvalidArgument,
        "bit decomposition of {k} bits"
    );
    ensure!(
        mine.iter().all(|&v| k == 64 || v >> k == 0),
        InvalidArgument,
        "bit decomposition input exceeds {k} bits"
    );
    let k = k as usize;
    let own: Vec<bool> = mine
        .iter()
        .flat_map(|&v| (0..k).map(move |j| v >> j & 1 == 1))
        .collect();
    // Generate a_i ∧ b_i: the client's bits against the server's.
    let mut g = and_private(ot, ch, role, &own)?;
    let mut p = own.clone();
    prefix(ot, ch, role, &mut g, &mut p, k)?;
    // Bit j = a_j ⊕ b_j ⊕ carry into j, the carry being G of the span 0 … j−1.
    Ok((0..own.len())
        .map(|i| own[i] ^ (i % k > 0 && g[i - 1]))
        .collect())
}

/// XOR shares of OR_{i ≥ j} x_i for every j, over rows of `k` shared bits (element-major).
pub(crate) fn suffix_or<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    x: &[bool],
    k: usize,
) -> Result<Vec<bool>> {
    ensure!(
        k > 0 && x.len().is_multiple_of(k),
        InvalidArgument,
        "suffix OR over rows of {k} of {} bits",
        x.len()
    );
    // OR of a suffix = ¬(AND of its negations); the scan runs from the top, so rows are
    // reversed. The client's share carries the negation.
    let flip = role == Role::Client;
    let mut p: Vec<bool> = x
        .chunks(k)
        .flat_map(|row| row.iter().rev().map(move |&b| b ^ flip))
        .collect();
    let mut g = vec![false; p.len()];
    prefix(ot, ch, role, &mut g, &mut p, k)?;
    Ok(p.chunks(k)
        .flat_map(|row| row.iter().rev().map(move |&b| b ^ flip))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_harness::{open_bits, run_mem};
    use veil_core::Prg;

    /// Bit decomposition of a + b mod 2^k for private a, b (carries across every position, the
    /// extremes, k = 1 and 64), and suffix ORs of the bits, against plain integer arithmetic.
    #[test]
    fn sum_bits_and_suffix_or_match_integers() {
        let mut prg = Prg::from_os_entropy();
        for k in [1u32, 2, 7, 24, 41, 64] {
            let m = if k == 64 { u64::MAX } else { (1u64 << k) - 1 };
            let mut a: Vec<u64> = vec![0, m, m, 1, 0, m >> 1];
            let mut b: Vec<u64> = vec![0, 1, m, m, m, 1];
            for _ in 0..100 {
                a.push(prg.u64() & m);
                b.push(prg.u64() & m);
            }
            let (ac, bc) = (a.clone(), b.clone());
            let out = run_mem(move |ot, ch, role| {
                let mine = if role == Role::Client { &ac } else { &bc };
                let bits = sum_bits(ot, ch, role, mine, k)?;
                let any = suffix_or(ot, ch, role, &bits, k as usize)?;
                Ok((bits, any))
            });
            let bits = open_bits((out.0 .0, out.1 .0));
            let any = open_bits((out.0 .1, out.1 .1));
            let ku = k as usize;
            for i in 0..a.len() {
                let s = a[i].wrapping_add(b[i]) & m;
                for j in 0..ku {
                    assert_eq!(
                        bits[i * ku + j],
                        s >> j & 1 == 1,
                        "k={k} {}+{} bit {j}",
                        a[i],
                        b[i]
                    );
                    assert_eq!(
                        any[i * ku + j],
                        s >> j != 0,
                        "k={k} {}+{} OR from {j}",
                        a[i],
                        b[i]
                    );
                }
            }
        }
    }

    #[test]
    fn sum_bits_rejects_wide_inputs() {
        let out = run_mem(|ot, ch, role| {
            let mine = if role == Role::Client {
                vec![1u64 << 5]
            } else {
                vec![0]
            };
            Ok(sum_bits(ot, ch, role, &mine, 5).is_err())
        });
        assert!(out.0, "an input above 2^k is refused before any traffic");
    }
}
