//! How far a session's HE keys can still go. The server refuses responses past
//! [`veil_he::SESSION_REVEALED_LIMIT`] revealed coefficients per key (where the flooding argument stops
//! holding) and the session then ends part-way through an inference. A client that runs many
//! prompts over one session (a dev-set evaluation, a long `classify`) asks [`KeyBudget::fits`]
//! before each and starts a new session, with fresh keys, when the next might not fit
//! (`Client::connect_renewing`).
//!
//! What one inference reveals is a public function of its length n: a sum of output counts,
//! n·m per linear layer, n·n per attention product, a constant for the head, so a polynomial
//! of degree ≤ 2 with non-negative coefficients. Hence a length measured once bounds every
//! shorter one, and f(n) ≤ f(L)·(n/L)² for n > L. A length with nothing measured at or below
//! it is let through only on a fresh key (a key that cannot hold one inference is the server's
//! refusal to make). The server's count is the enforcement; this only avoids running into it.

use std::collections::BTreeMap;

/// Coefficients revealed by an inference of each length seen (the largest seen).
#[derive(Clone, Debug, Default)]
pub(crate) struct KeyBudget {
    measured: BTreeMap<usize, u64>,
}

impl KeyBudget {
    /// Notes that work for an inference of `len` tokens revealed `count` coefficients.
    pub(crate) fn record(&mut self, len: usize, count: u64) {
        let e = self.measured.entry(len).or_insert(0);
        *e = (*e).max(count);
    }

    /// An upper bound on what an inference of `len` tokens reveals, if one is known.
    pub(crate) fn bound(&self, len: usize) -> Option<u64> {
        if let Some((_, &c)) = self.measured.range(len..).next() {
            return Some(c);
        }
        let (&l, &c) = self.measured.range(..len).next_back()?;
        let scaled = (c as u128 * (len as u128).pow(2)).div_ceil((l as u128).pow(2));
        Some(u64::try_from(scaled).unwrap_or(u64::MAX))
    }

    /// Whether an inference of `len` tokens fits in what a key that has revealed `revealed`
    /// coefficients has left of `limit`.
    pub(crate) fn fits(&self, revealed: u64, len: usize, limit: u64) -> bool {
        match self.bound(len) {
            Some(b) => revealed.checked_add(b).is_some_and(|t| t <= limit),
            None => revealed == 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_from_longer_and_shorter_lengths() {
        let mut b = KeyBudget::default();
        assert_eq!(b.bound(10), None);
        assert!(b.fits(0, 10, 100), "a fresh key takes one inference");
        assert!(!b.fits(1, 10, 100), "nothing known on a used key");
        b.record(10, 40);
        b.record(10, 30);
        assert_eq!(b.bound(10), Some(40));
        assert_eq!(b.bound(4), Some(40), "a longer length bounds a shorter one");
        assert_eq!(b.bound(15), Some(90), "40 · (15/10)²");
        b.record(20, 150);
        assert_eq!(b.bound(15), Some(150));
        assert!(b.fits(60, 10, 100));
        assert!(!b.fits(61, 10, 100));
        assert!(!b.fits(u64::MAX, 1, u64::MAX));
    }

    /// The quadratic bound holds for every polynomial a + b·n + c·n² with non-negative terms.
    #[test]
    fn quadratic_bound_covers_every_admissible_count() {
        let f = |a: u64, b: u64, c: u64, n: u64| a + b * n + c * n * n;
        for (a, b, c) in [(0, 1, 0), (5, 0, 0), (0, 0, 3), (7, 11, 2), (1000, 1, 1)] {
            for l in [1usize, 3, 16] {
                let mut kb = KeyBudget::default();
                kb.record(l, f(a, b, c, l as u64));
                for n in 1..64usize {
                    let bound = kb.bound(n).unwrap();
                    assert!(bound >= f(a, b, c, n as u64), "{a} {b} {c}: L {l} n {n}");
                }
            }
        }
    }
}
