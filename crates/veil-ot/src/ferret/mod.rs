//! Ferret-style silent correlated OT (Yang et al., CCS 2020), semi-honest version.
//!
//! One iteration with LPN parameters (n, k, t) turns `k + t·depth` COTs (the *reserve*) into n
//! fresh COTs with the same Δ:
//! 1. **MPCOT** ([`spcot`]): t Half-Tree single-point COTs, one per bin of the regular noise,
//!    each fed by `depth` reserve COTs whose choice bits fix the receiver's punctured position;
//!    the receiver's noise vector e has one 1 per bin at a uniformly random position.
//! 2. **LPN** ([`lpn`]): both parties add `A·(reserve)` with the public sparse matrix A, so the
//!    receiver's choice vector becomes `e ⊕ A·r`, pseudo-random under regular-noise LPN.
//!
//! Both steps run as jobs of the process's worker pool (`veil_core::parallel`): one tree per job,
//! and slices of LPN rows; every tree and row depends only on its index, so the output does not
//! depend on how the jobs fall.
//!
//! The first reserve comes from IKNP through a smaller *bootstrap* iteration; afterwards each
//! main iteration keeps its first `k + t·depth` outputs as the next reserve and hands out the
//! rest (5,945,536 COTs per main iteration). Parameters and their sources: [`params`].
//!
//! Traffic per iteration: `t·depth` blocks from sender to receiver in one flight (≈ 0.39 bit per
//! usable COT for the main set); the receiver sends nothing (plus one 16-byte flight at set-up
//! carrying the public matrix seed).
//!
//! Security: semi-honest, 128-bit computational (regular-noise LPN with the published
//! parameters; the Half-Tree trees in the random-permutation model for fixed-key AES). No
//! consistency check: that is only needed against a malicious party, and this version claims
//! no malicious security. Δ, reserves and roots are zeroized on drop, punctured indices
//! after each iteration.

mod lpn;
mod params;
mod spcot;
pub(crate) mod table;

use rayon::prelude::*;
use veil_core::parallel::pool;
use veil_core::{Prg, Result};
use veil_net::Channel;
use zeroize::{Zeroize, Zeroizing};

use crate::ct::eq_mask;
use crate::iknp::{IknpReceiver, IknpSender};
use lpn::LpnMatrix;
use params::LpnParams;
use spcot::{receive_tree, send_tree};
use table::{scratch_wiping, HugeTable};

/// Checks that `boot` can seed `main` and that `main` sustains itself.
fn check_params(boot: &LpnParams, main: &LpnParams) {
    assert!(
        boot.n >= main.base_cots() && main.n > main.base_cots(),
        "LPN parameter sets cannot bootstrap"
    );
    for p in [boot, main] {
        assert!(
            (1..=spcot::MAX_DEPTH).contains(&p.depth()) && p.n == p.t << p.depth(),
            "LPN parameter set without full trees"
        );
    }
}

/// COT sender side of silent OT.
pub struct FerretSender {
    delta: u128,
    main: LpnParams,
    matrix: LpnMatrix,
    reserve: HugeTable,
    prg: Prg,
}

/// COT receiver side of silent OT.
pub struct FerretReceiver {
    main: LpnParams,
    matrix: LpnMatrix,
    reserve: HugeTable,
    reserve_bits: Vec<u8>,
}

impl Drop for FerretSender {
    fn drop(&mut self) {
        self.delta.zeroize();
    }
}

impl Drop for FerretReceiver {
    fn drop(&mut self) {
        self.reserve_bits.zeroize();
    }
}

/// Sender's MPCOT: `out` gets the t bins of leaves; returns after sending the tree messages.
fn mpcot_send<C: Channel>(
    ch: &mut C,
    p: &LpnParams,
    delta: u128,
    level_cots: &[u128],
    prg: &mut Prg,
    out: &mut [u128],
) -> Result<()> {
    assert_eq!(out.len(), p.n, "MPCOT output length");
    let depth = p.depth();
    let roots: Zeroizing<Vec<u128>> =
        Zeroizing::new((0..p.t).map(|_| u128::from_le_bytes(prg.block())).collect());
    let mut msg = vec![0u128; p.t * depth];
    pool().install(|| {
        out.par_chunks_mut(1 << depth)
            .zip(msg.par_chunks_mut(depth))
            .enumerate()
            .for_each(|(i, (leaves, tree_msg))| {
                send_tree(
                    roots[i],
                    delta,
                    &level_cots[i * depth..(i + 1) * depth],
                    leaves,
                    tree_msg,
                );
            });
    });
    let bytes: Vec<u8> = msg.iter().flat_map(|b| b.to_le_bytes()).collect();
    ch.send_msg(&bytes)?;
    ch.flush()
}

fn mpcot_receive<C: Channel>(
    ch: &mut C,
    p: &LpnParams,
    level_t: &[u128],
    level_bits: &[u8],
    out: &mut [u128],
    noise: &mut [u8],
) -> Result<()> {
    assert!(
        out.len() == p.n && noise.len() == p.n,
        "MPCOT output length"
    );
    let depth = p.depth();
    let bytes = ch.recv_msg_exact(p.t * depth * 16)?;
    let msg: Vec<u128> = bytes
        .chunks_exact(16)
        .map(|b| u128::from_le_bytes(b.try_into().expect("16 bytes")))
        .collect();
    let mut holes: Zeroizing<Vec<usize>> = Zeroizing::new(vec![0; p.t]);
    pool().install(|| {
        out.par_chunks_mut(1 << depth)
            .zip(holes.par_iter_mut())
            .enumerate()
            .for_each(|(i, (leaves, hole))| {
                let levels = i * depth..(i + 1) * depth;
                *hole = receive_tree(
                    &level_t[levels.clone()],
                    &level_bits[levels.clone()],
                    &msg[levels],
                    leaves,
                );
            });
    });
    for (bin, &hole) in noise.chunks_exact_mut(1 << depth).zip(holes.iter()) {
        for (j, b) in bin.iter_mut().enumerate() {
            *b = (eq_mask(j, hole) & 1) as u8;
        }
    }
    Ok(())
}

fn sender_iteration<C: Channel>(
    ch: &mut C,
    p: &LpnParams,
    matrix: &LpnMatrix,
    delta: u128,
    base: &[u128],
    prg: &mut Prg,
    out: &mut [u128],
) -> Result<()> {
    let (lpn_base, levels) = base.split_at(p.k);
    mpcot_send(ch, p, delta, levels, prg, out)?;
    matrix.encode(out, lpn_base);
    Ok(())
}

fn receiver_iteration<C: Channel>(
    ch: &mut C,
    p: &LpnParams,
    matrix: &LpnMatrix,
    base: &[u128],
    base_bits: &[u8],
    out: &mut [u128],
    bits: &mut [u8],
) -> Result<()> {
    let (lpn_base, levels) = base.split_at(p.k);
    let (lpn_bits, level_bits) = base_bits.split_at(p.k);
    mpcot_receive(ch, p, levels, level_bits, out, bits)?;
    matrix.encode_with_bits(out, bits, lpn_base, lpn_bits);
    Ok(())
}

impl FerretSender {
    /// Bootstraps from IKNP with the published parameter sets ([`params`]). Returns the sender and the bootstrap's
    /// COTs beyond the first reserve, as `(q, start)`: the usable COTs are `q[start..]`.
    pub fn setup<C: Channel>(
        ch: &mut C,
        iknp: &mut IknpSender,
    ) -> Result<(Self, Vec<u128>, usize)> {
        Self::setup_with(ch, iknp, params::BOOTSTRAP, params::MAIN)
    }

    pub(crate) fn setup_with<C: Channel>(
        ch: &mut C,
        iknp: &mut IknpSender,
        boot: LpnParams,
        main: LpnParams,
    ) -> Result<(Self, Vec<u128>, usize)> {
        check_params(&boot, &main);
        let mut prg = Prg::from_os_entropy();
        let seed = u128::from_le_bytes(prg.block());
        ch.send_msg(&seed.to_le_bytes())?;
        let base = Zeroizing::new(iknp.extend(ch, boot.base_cots())?);
        let delta = iknp.delta();
        let boot_matrix = LpnMatrix::new(seed, 0, boot.k);
        // Zeroizing, so a send that fails leaves none of the sender's COTs behind.
        let mut out = Zeroizing::new(vec![0u128; boot.n]);
        sender_iteration(ch, &boot, &boot_matrix, delta, &base, &mut prg, &mut out)?;
        let mut reserve = HugeTable::new(main.base_cots());
        reserve
            .as_mut_slice()
            .copy_from_slice(&out[..main.base_cots()]);
        let sender = FerretSender {
            delta,
            main,
            matrix: LpnMatrix::new(seed, 1, main.k),
            reserve,
            prg,
        };
        Ok((sender, std::mem::take(&mut *out), main.base_cots()))
    }

    /// Δ, the correlation every COT of this sender carries.
    pub fn delta(&self) -> u128 {
        self.delta
    }

    /// One main iteration into `out` (its allocation is reused): returns `start`, the usable
    /// COTs being `out[start..]`.
    pub fn extend<C: Channel>(&mut self, ch: &mut C, out: &mut Vec<u128>) -> Result<usize> {
        scratch_wiping(out, self.iteration_len(), 0);
        self.extend_into(ch, out)
    }

    /// One main iteration into `out`, of exactly [`Self::iteration_len`] blocks: returns
    /// `start`, the usable COTs being `out[start..]` (the prefix is the next reserve).
    pub fn extend_into<C: Channel>(&mut self, ch: &mut C, out: &mut [u128]) -> Result<usize> {
        sender_iteration(
            ch,
            &self.main,
            &self.matrix,
            self.delta,
            self.reserve.as_slice(),
            &mut self.prg,
            out,
        )?;
        let r = self.reserve.len();
        self.reserve.as_mut_slice().copy_from_slice(&out[..r]);
        Ok(r)
    }

    /// COTs each main iteration hands out.
    pub fn batch_size(&self) -> usize {
        self.main.n - self.main.base_cots()
    }

    /// Blocks each main iteration writes (reserve prefix included).
    pub fn iteration_len(&self) -> usize {
        self.main.n
    }

    /// Length of the reserve prefix of each iteration's output.
    pub fn reserve_len(&self) -> usize {
        self.reserve.len()
    }
}

impl FerretReceiver {
    /// Bootstraps from IKNP; returns the receiver and `(t, bits, start)` of the bootstrap's
    /// COTs beyond the first reserve.
    #[allow(clippy::type_complexity)]
    pub fn setup<C: Channel>(
        ch: &mut C,
        iknp: &mut IknpReceiver,
    ) -> Result<(Self, Vec<u128>, Vec<u8>, usize)> {
        Self::setup_with(ch, iknp, params::BOOTSTRAP, params::MAIN)
    }

    #[allow(clippy::type_complexity)]
    pub(crate) fn setup_with<C: Channel>(
        ch: &mut C,
        iknp: &mut IknpReceiver,
        boot: LpnParams,
        main: LpnParams,
    ) -> Result<(Self, Vec<u128>, Vec<u8>, usize)> {
        check_params(&boot, &main);
        let seed_bytes: [u8; 16] = ch.recv_msg_exact(16)?.try_into().expect("exactly 16 bytes");
        let seed = u128::from_le_bytes(seed_bytes);
        let mut prg = Prg::from_os_entropy();
        let base_bits: Zeroizing<Vec<u8>> =
            Zeroizing::new((0..boot.base_cots()).map(|_| prg.bit() as u8).collect());
        let base = Zeroizing::new(iknp.extend(ch, &base_bits)?);
        let boot_matrix = LpnMatrix::new(seed, 0, boot.k);
        // Zeroizing, so a peer's error leaves none of the receiver's COTs behind.
        let mut out = Zeroizing::new(vec![0u128; boot.n]);
        let mut bits = Zeroizing::new(vec![0u8; boot.n]);
        receiver_iteration(
            ch,
            &boot,
            &boot_matrix,
            &base,
            &base_bits,
            &mut out,
            &mut bits,
        )?;
        let r = main.base_cots();
        let mut reserve = HugeTable::new(r);
        reserve.as_mut_slice().copy_from_slice(&out[..r]);
        let receiver = FerretReceiver {
            main,
            matrix: LpnMatrix::new(seed, 1, main.k),
            reserve,
            reserve_bits: bits[..r].to_vec(),
        };
        Ok((
            receiver,
            std::mem::take(&mut *out),
            std::mem::take(&mut *bits),
            r,
        ))
    }

    /// One main iteration into `out` and `bits` (allocations reused): returns `start`, the
    /// usable COTs being `out[start..]` with choices `bits[start..]`.
    pub fn extend<C: Channel>(
        &mut self,
        ch: &mut C,
        out: &mut Vec<u128>,
        bits: &mut Vec<u8>,
    ) -> Result<usize> {
        scratch_wiping(out, self.iteration_len(), 0);
        scratch_wiping(bits, self.iteration_len(), 0);
        self.extend_into(ch, out, bits)
    }

    /// One main iteration into `out` and `bits`, of exactly [`Self::iteration_len`] entries
    /// each: returns `start`, the usable COTs being `out[start..]` with choices `bits[start..]`.
    pub fn extend_into<C: Channel>(
        &mut self,
        ch: &mut C,
        out: &mut [u128],
        bits: &mut [u8],
    ) -> Result<usize> {
        receiver_iteration(
            ch,
            &self.main,
            &self.matrix,
            self.reserve.as_slice(),
            &self.reserve_bits,
            out,
            bits,
        )?;
        let r = self.reserve.len();
        self.reserve.as_mut_slice().copy_from_slice(&out[..r]);
        self.reserve_bits.copy_from_slice(&bits[..r]);
        Ok(r)
    }

    /// COTs each main iteration hands out.
    pub fn batch_size(&self) -> usize {
        self.main.n - self.main.base_cots()
    }

    /// Entries each main iteration writes (reserve prefix included).
    pub fn iteration_len(&self) -> usize {
        self.main.n
    }

    /// Length of the reserve prefix of each iteration's output.
    pub fn reserve_len(&self) -> usize {
        self.reserve.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use veil_net::run_two_party;

    /// Small, insecure sets that exercise every code path (several main iterations) quickly.
    const TEST_BOOT: LpnParams = LpnParams {
        n: 4096,
        k: 512,
        t: 16,
    };
    const TEST_MAIN: LpnParams = LpnParams {
        n: 50 << 9,
        k: 2_000,
        t: 50,
    };

    fn check_correlation(delta: u128, q: &[u128], t: &[u128], bits: &[u8]) {
        assert_eq!(q.len(), t.len());
        for i in 0..q.len() {
            let want = q[i] ^ if bits[i] == 1 { delta } else { 0 };
            assert_eq!(t[i], want, "COT {i}");
        }
        let ones = bits.iter().filter(|&&b| b == 1).count() as f64;
        let n = bits.len() as f64;
        assert!(
            (ones - n / 2.0).abs() < 6.0 * (n / 4.0).sqrt(),
            "choice bits biased: {ones} of {n}"
        );
    }

    fn run(boot: LpnParams, main: LpnParams, iterations: usize) {
        type Recv = Vec<(Vec<u128>, Vec<u8>)>;
        let (recv, (delta, sent)): (Recv, (u128, Vec<Vec<u128>>)) = run_two_party(
            move |c| {
                let mut iknp = IknpReceiver::setup(c)?;
                let (mut r, t, bits, start) = FerretReceiver::setup_with(c, &mut iknp, boot, main)?;
                let mut all = vec![(t[start..].to_vec(), bits[start..].to_vec())];
                let (mut t, mut bits) = (Vec::new(), Vec::new());
                for _ in 0..iterations {
                    let start = r.extend(c, &mut t, &mut bits)?;
                    all.push((t[start..].to_vec(), bits[start..].to_vec()));
                }
                Ok(all)
            },
            move |c| {
                let mut iknp = IknpSender::setup(c)?;
                let (mut s, q, start) = FerretSender::setup_with(c, &mut iknp, boot, main)?;
                let mut all = vec![q[start..].to_vec()];
                let mut q = Vec::new();
                for _ in 0..iterations {
                    let start = s.extend(c, &mut q)?;
                    all.push(q[start..].to_vec());
                }
                Ok((s.delta(), all))
            },
        )
        .unwrap();
        assert_eq!(recv.len(), iterations + 1);
        for ((t, bits), q) in recv.iter().zip(&sent) {
            check_correlation(delta, q, t, bits);
        }
        assert_ne!(sent[0][..100], sent[1][..100], "iterations repeat");
    }

    #[test]
    fn bootstrap_loop_keeps_the_correlation_over_iterations() {
        run(TEST_BOOT, TEST_MAIN, 4);
    }

    #[test]
    fn published_parameters_one_main_iteration() {
        run(params::BOOTSTRAP, params::MAIN, 1);
    }
}
