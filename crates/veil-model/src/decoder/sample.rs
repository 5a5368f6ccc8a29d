//! Choosing the next token from f32 logits: greedy, or temperature / top-k / top-p sampling
//! driven by a seeded AES-CTR generator ([`veil_core::Prg`]), so one seed gives the same text
//! on every machine. The one definition the f32 model, the simulator and the private pass share.

use veil_core::{Error, Prg, Result, Seed};

/// How to pick a token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits; `0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (`0`: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`
    /// (`1`: all).
    pub top_p: f32,
    /// Seeds the generator (unused when greedy).
    pub seed: u64,
}

impl SamplingParams {
    /// Argmax at every step.
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: 0,
    };

    fn check(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::InvalidArgument(format!(
                "temperature {} is not a number ≥ 0",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::InvalidArgument(format!(
                "top-p {} is not in (0, 1]",
                self.top_p
            )));
        }
        Ok(())
    }

    /// Whether the choice is the argmax (temperature 0): no randomness used.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// The index of the largest logit (the first on ties). NaN or +inf logits, all -inf, and an
/// empty vector are errors.
pub fn argmax(logits: &[f32]) -> Result<u32> {
    check_logits(logits)?;
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    Ok(best as u32)
}

fn check_logits(logits: &[f32]) -> Result<()> {
    if logits.is_empty() {
        return Err(Error::InvalidArgument("no logits to sample from".into()));
    }
    if let Some(i) = logits
        .iter()
        .position(|l| l.is_nan() || *l == f32::INFINITY)
    {
        return Err(Error::InvalidArgument(format!(
            "logit {i} is {}",
            logits[i]
        )));
    }
    if logits.iter().all(|l| *l == f32::NEG_INFINITY) {
        return Err(Error::InvalidArgument("every logit is -inf".into()));
    }
    if u32::try_from(logits.len()).is_err() {
        return Err(Error::InvalidArgument("over 2^32 logits".into()));
    }
    Ok(())
}

/// A token picker with its own generator state: successive calls continue the stream.
pub struct Sampler {
    params: SamplingParams,
    prg: Prg,
}

impl Sampler {
    /// A sampler seeded from `params.seed`, after checking the parameters.
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.check()?;
        let mut seed = [0u8; 16];
        seed[..8].copy_from_slice(&params.seed.to_le_bytes());
        Ok(Sampler {
            params,
            prg: Prg::from_seed(&Seed(seed)),
        })
    }

    /// The parameters it samples with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token for `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let probs = self.distribution(logits)?;
        // A uniform in [0, 1) from 53 random bits, then the inverse CDF.
        let u = (self.prg.u64() >> 11) as f64 / (1u64 << 53) as f64;
        let mut acc = 0.0;
        for &(id, p) in &probs {
            acc += p;
            if u < acc {
                return Ok(id);
            }
        }
        // Rounding left `acc` just under 1: the last kept token.
        Ok(probs.last().map(|&(id, _)| id).unwrap_or(0))
    }

    /// The tokens that may be drawn and their probabilities (summing to 1), most likely first.
    pub fn distribution(&self, logits: &[f32]) -> Result<Vec<(u32, f64)>> {
        check_logits(logits)?;
        let p = &self.params;
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        // Descending logit, ties by id: deterministic whatever the sort.
        order.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        if p.top_k > 0 {
            order.truncate(p.top_k);
        }
        let max = f64::from(logits[order[0] as usize]);
        let temperature = f64::from(p.temperature);
        let mut kept: Vec<(u32, f64)> = order
            .iter()
            .map(|&id| {
                (
                    id,
                    ((f64::from(logits[id as usize]) - max) / temperature).exp(),
                )
            })
            .collect();
        normalise(&mut kept);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut n = 0;
            for &(_, q) in &kept {
                acc += q;
                n += 1;
                if acc >= f64::from(p.top_p) {
                    break;
                }
            }
            kept.truncate(n.max(1));
            normalise(&mut kept);
        }
        Ok(kept)
    }
}

fn normalise(probs: &mut [(u32, f64)]) {
    let total: f64 = probs.iter().map(|&(_, p)| p).sum();
    for (_, p) in probs.iter_mut() {
        *p /= total;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn logits() -> impl Strategy<Value = Vec<f32>> {
        prop::collection::vec(-20.0f32..20.0, 1..64)
    }

    fn sampler(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> Sampler {
        Sampler::new(SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
        })
        .unwrap()
    }

    proptest! {
        #[test]
        fn greedy_is_the_first_maximum(l in logits()) {
            let max = l.iter().cloned().fold(f32::MIN, f32::max);
            let first = l.iter().position(|&x| x == max).unwrap() as u32;
            prop_assert_eq!(Sampler::new(SamplingParams::GREEDY).unwrap().sample(&l).unwrap(), first);
            prop_assert_eq!(argmax(&l).unwrap(), first);
        }

        #[test]
        fn top_k_one_tiny_top_p_and_cold_temperature_are_greedy(l in logits(), seed in any::<u64>()) {
            let greedy = argmax(&l).unwrap();
            prop_assert_eq!(sampler(1.0, 1, 1.0, seed).sample(&l).unwrap(), greedy);
            prop_assert_eq!(sampler(1.0, 0, 1e-9, seed).sample(&l).unwrap(), greedy);
            // Distinct top logits: a temperature near 0 puts all mass on the maximum.
            let mut sorted = l.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            prop_assume!(sorted.len() == 1 || sorted[0] - sorted[1] > 1e-3);
            prop_assert_eq!(sampler(1e-6, 0, 1.0, seed).sample(&l).unwrap(), greedy);
        }

        #[test]
        fn the_same_seed_draws_the_same_tokens(l in logits(), seed in any::<u64>()) {
            let (mut a, mut b) = (sampler(1.0, 0, 0.9, seed), sampler(1.0, 0, 0.9, seed));
            for _ in 0..8 {
                prop_assert_eq!(a.sample(&l).unwrap(), b.sample(&l).unwrap());
            }
        }

        #[test]
        fn the_distribution_is_normalised_sorted_and_truncated(l in logits(), k in 0usize..8, p in 0.05f32..1.0) {
            let d = sampler(0.7, k, p, 0).distribution(&l).unwrap();
            let total: f64 = d.iter().map(|x| x.1).sum();
            prop_assert!((total - 1.0).abs() < 1e-9);
            prop_assert!(d.windows(2).all(|w| w[0].1 >= w[1].1));
            if k > 0 {
                prop_assert!(d.len() <= k);
            }
        }
    }

    #[test]
    fn draws_follow_the_softmax() {
        // logits ln(1), ln(2), ln(3), ln(4): probabilities 0.1 … 0.4 at temperature 1.
        let l: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|x| x.ln()).collect();
        let mut s = sampler(1.0, 0, 1.0, 42);
        let n = 40_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[s.sample(&l).unwrap() as usize] += 1;
        }
        for (i, &c) in counts.iter().enumerate() {
            let expected = (i + 1) as f64 / 10.0;
            // 5 standard deviations of a binomial proportion.
            let sd = (expected * (1.0 - expected) / n as f64).sqrt();
            assert!(
                (c as f64 / n as f64 - expected).abs() < 5.0 * sd,
                "{counts:?}"
            );
        }
        // top-k 2 keeps ids 3 and 2 with 4:3; top-p 0.5 keeps 0.4 + 0.3.
        let d = sampler(1.0, 2, 1.0, 0).distribution(&l).unwrap();
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![3, 2]);
        // f32 logits: ln 4 − ln 3 is exact to about 1e-7.
        assert!((d[0].1 - 4.0 / 7.0).abs() < 1e-6);
        let d = sampler(1.0, 0, 0.5, 0).distribution(&l).unwrap();
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![3, 2]);
    }

    #[test]
    fn bad_logits_and_parameters_are_errors() {
        assert!(argmax(&[]).is_err());
        assert!(argmax(&[0.0, f32::NAN]).is_err());
        assert!(argmax(&[0.0, f32::INFINITY]).is_err());
        assert!(argmax(&[f32::NEG_INFINITY; 3]).is_err());
        assert_eq!(argmax(&[f32::NEG_INFINITY, 0.5]).unwrap(), 1);
        for (t, p) in [(-1.0, 1.0), (f32::NAN, 1.0), (1.0, 0.0), (1.0, 1.5)] {
            assert!(Sampler::new(SamplingParams {
                temperature: t,
                top_k: 0,
                top_p: p,
                seed: 0
            })
            .is_err());
        }
    }
}
