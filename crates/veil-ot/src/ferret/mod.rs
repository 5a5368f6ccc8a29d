//! Ferret-style silent correlated OT (Yang et al., CCS 2020), semi-honest version.
//!
//! One iteration with LPN parameters (n, k, t) turns `k + t·depth` COTs (the *reserve*) into n
//! fresh COTs with the same Δ:
//! 1. **MPCOT** ([`spcot`]): t GGM-tree single-point COTs, one per bin of the regular noise;
//!    the receiver's noise vector e has one 1 per bin at a uniformly random position.
//! 2. **LPN** ([`lpn`]): both parties add `A·(reserve)` with the public sparse matrix A, so the
//!    receiver's choice vector becomes `e ⊕ A·r`, pseudo-random under regular-noise LPN.
//!
//! The first reserve comes from IKNP through a smaller *bootstrap* iteration; afterwards each
//! main iteration keeps its first `k + t·depth` outputs as the next reserve and hands out the
//! rest (10,001,981 COTs per main iteration). Parameters and their sources: [`params`].
//!
//! Traffic per iteration: receiver → sender `t·depth` correction bits; sender → receiver
//! `t·(2·depth + 1)` blocks (≈ 0.45 bits per output COT for the main set). Two flights per
//! iteration (plus one 16-byte flight at set-up carrying the public matrix seed).
//!
//! Security: semi-honest, 128-bit computational (regular-noise LPN with the published
//! parameters, AES as PRG
//! and TCCR hash). No consistency check: that is only needed against a malicious party, and
//! this version claims no malicious security. Δ, reserves, roots and punctured indices are
//! zeroized on drop.

pub mod lpn;
pub mod params;
pub mod spcot;
pub mod table;

use veil_core::{Prg, Result};
use veil_net::Channel;
use zeroize::{Zeroize, Zeroizing};

use crate::ct::eq_mask;
use crate::iknp::{IknpReceiver, IknpSender};
use crate::pack::{pack_bools, unpack_bools};
use lpn::{workers, LpnMatrix};
use params::LpnParams;
use spcot::{receive_tree, send_tree, SenderLevels, TreeScratch};
use table::{scratch_wiping, HugeTable};

/// Tag of Ferret's internal hash tweaks (the session's flavours use tweaks below 2^72).
const TWEAK_TAG: u128 = 1 << 127;

fn iteration_tweak(iteration: u64) -> u128 {
    TWEAK_TAG | ((iteration as u128) << 40)
}

/// Checks that `boot` can seed `main` and that `main` sustains itself.
fn check_params(boot: &LpnParams, main: &LpnParams) {
    assert!(
        boot.n >= main.base_cots() && main.n > main.base_cots(),
        "LPN parameter sets cannot bootstrap"
    );
    assert!(main.depth() <= spcot::MAX_DEPTH && boot.depth() <= spcot::MAX_DEPTH);
}

/// Splits `0..t` trees into one contiguous range per worker.
fn tree_groups(t: usize) -> Vec<std::ops::Range<usize>> {
    let w = workers().min(t).max(1);
    (0..w).map(|g| g * t / w..(g + 1) * t / w).collect()
}

/// COT sender side of silent OT.
pub struct FerretSender {
    delta: u128,
    main: LpnParams,
    matrix: LpnMatrix,
    reserve: HugeTable,
    iteration: u64,
    prg: Prg,
}

/// COT receiver side of silent OT.
pub struct FerretReceiver {
    main: LpnParams,
    matrix: LpnMatrix,
    reserve: HugeTable,
    reserve_bits: Vec<u8>,
    iteration: u64,
    prg: Prg,
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
    tweak: u128,
    prg: &mut Prg,
    out: &mut [u128],
) -> Result<()> {
    assert_eq!(out.len(), p.n, "MPCOT output length");
    let depth = p.depth();
    let d = unpack_bools(
        &ch.recv_msg_exact((p.t * depth).div_ceil(8))?,
        p.t * depth,
        "silent OT corrections",
    )?;
    let roots: Zeroizing<Vec<u128>> =
        Zeroizing::new((0..p.t).map(|_| u128::from_le_bytes(prg.block())).collect());
    // Every position of `out` is overwritten by the bins' leaves.
    let per_tree = 2 * depth + 1;
    let mut msg = vec![0u128; p.t * per_tree];
    std::thread::scope(|s| {
        let (mut out_rest, mut msg_rest) = (out, &mut msg[..]);
        for group in tree_groups(p.t) {
            let out_len = p.bin(group.end - 1).0 + p.bin(group.end - 1).1 - p.bin(group.start).0;
            let (out_g, o) = out_rest.split_at_mut(out_len);
            let (msg_g, m) = msg_rest.split_at_mut(group.len() * per_tree);
            (out_rest, msg_rest) = (o, m);
            let (d, roots) = (&d, &roots);
            s.spawn(move || {
                let mut scratch = TreeScratch::new(depth);
                let base = p.bin(group.start).0;
                for (j, i) in group.clone().enumerate() {
                    let (start, len) = p.bin(i);
                    let levels = SenderLevels {
                        delta,
                        q: &level_cots[i * depth..(i + 1) * depth],
                        d: &d[i * depth..(i + 1) * depth],
                        tweak: tweak + (i * depth) as u128,
                    };
                    send_tree(
                        roots[i],
                        &levels,
                        &mut out_g[start - base..start - base + len],
                        &mut msg_g[j * per_tree..(j + 1) * per_tree],
                        &mut scratch,
                    );
                }
            });
        }
    });
    let bytes: Vec<u8> = msg.iter().flat_map(|b| b.to_le_bytes()).collect();
    ch.send_msg(&bytes)?;
    ch.flush()
}

/// Receiver's MPCOT: returns the blocks and the noise vector (one 1 per bin).
#[allow(clippy::too_many_arguments)] // one iteration's state, passed explicitly
fn mpcot_receive<C: Channel>(
    ch: &mut C,
    p: &LpnParams,
    level_t: &[u128],
    level_bits: &[u8],
    tweak: u128,
    prg: &mut Prg,
    out: &mut [u128],
    noise: &mut [u8],
) -> Result<()> {
    assert!(
        out.len() == p.n && noise.len() == p.n,
        "MPCOT output length"
    );
    let depth = p.depth();
    let alphas: Zeroizing<Vec<usize>> = Zeroizing::new(
        (0..p.t)
            .map(|i| prg.below(p.bin(i).1 as u64) as usize)
            .collect(),
    );
    // Level l of tree i must deliver K_{¬α_l}: correction = ¬α_l ⊕ r.
    let corrections = (0..p.t * depth).map(|x| {
        let (i, l) = (x / depth, x % depth);
        let alpha_bit = (alphas[i] >> (depth - 1 - l)) & 1 == 1;
        !alpha_bit ^ (level_bits[x] == 1)
    });
    ch.send_msg(&pack_bools(corrections))?;
    ch.flush()?;
    let per_tree = 2 * depth + 1;
    let bytes = ch.recv_msg_exact(p.t * per_tree * 16)?;
    let msg: Vec<u128> = bytes
        .chunks_exact(16)
        .map(|b| u128::from_le_bytes(b.try_into().expect("16 bytes")))
        .collect();
    std::thread::scope(|s| {
        let mut out_rest = &mut *out;
        for group in tree_groups(p.t) {
            let out_len = p.bin(group.end - 1).0 + p.bin(group.end - 1).1 - p.bin(group.start).0;
            let (out_g, o) = out_rest.split_at_mut(out_len);
            out_rest = o;
            let (msg, alphas) = (&msg, &alphas);
            s.spawn(move || {
                let mut scratch = TreeScratch::new(depth);
                let base = p.bin(group.start).0;
                for i in group {
                    let (start, len) = p.bin(i);
                    receive_tree(
                        alphas[i],
                        &level_t[i * depth..(i + 1) * depth],
                        tweak + (i * depth) as u128,
                        &msg[i * per_tree..(i + 1) * per_tree],
                        &mut out_g[start - base..start - base + len],
                        &mut scratch,
                    );
                }
            });
        }
    });
    // The unit vector of each bin, written in full so no address depends on α.
    for (i, &a) in alphas.iter().enumerate() {
        let (start, len) = p.bin(i);
        for (j, b) in noise[start..start + len].iter_mut().enumerate() {
            *b = (eq_mask(j, a) & 1) as u8;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)] // one iteration's state, passed explicitly
fn sender_iteration<C: Channel>(
    ch: &mut C,
    p: &LpnParams,
    matrix: &LpnMatrix,
    delta: u128,
    base: &[u128],
    iteration: u64,
    prg: &mut Prg,
    out: &mut [u128],
) -> Result<()> {
    let (lpn_base, levels) = base.split_at(p.k);
    mpcot_send(ch, p, delta, levels, iteration_tweak(iteration), prg, out)?;
    matrix.encode(out, lpn_base);
    Ok(())
}

#[allow(clippy::too_many_arguments)] // one iteration's state, passed explicitly
fn receiver_iteration<C: Channel>(
    ch: &mut C,
    p: &LpnParams,
    matrix: &LpnMatrix,
    base: &[u128],
    base_bits: &[u8],
    iteration: u64,
    prg: &mut Prg,
    out: &mut [u128],
    bits: &mut [u8],
) -> Result<()> {
    let (lpn_base, levels) = base.split_at(p.k);
    let (lpn_bits, level_bits) = base_bits.split_at(p.k);
    let tweak = iteration_tweak(iteration);
    mpcot_receive(ch, p, levels, level_bits, tweak, prg, out, bits)?;
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
        let mut out = vec![0u128; boot.n];
        sender_iteration(ch, &boot, &boot_matrix, delta, &base, 0, &mut prg, &mut out)?;
        let mut reserve = HugeTable::new(main.base_cots());
        reserve
            .as_mut_slice()
            .copy_from_slice(&out[..main.base_cots()]);
        let sender = FerretSender {
            delta,
            main,
            matrix: LpnMatrix::new(seed, 1, main.k),
            reserve,
            iteration: 1,
            prg,
        };
        Ok((sender, out, main.base_cots()))
    }

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
            self.iteration,
            &mut self.prg,
            out,
        )?;
        self.iteration += 1;
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
        let (mut out, mut bits) = (vec![0u128; boot.n], vec![0u8; boot.n]);
        receiver_iteration(
            ch,
            &boot,
            &boot_matrix,
            &base,
            &base_bits,
            0,
            &mut prg,
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
            iteration: 1,
            prg,
        };
        Ok((receiver, out, bits, r))
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
            self.iteration,
            &mut self.prg,
            out,
            bits,
        )?;
        self.iteration += 1;
        let r = self.reserve.len();
        self.reserve.as_mut_slice().copy_from_slice(&out[..r]);
        self.reserve_bits.copy_from_slice(&bits[..r]);
        Ok(r)
    }

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
        n: 20_000,
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

    #[test]
    fn single_tree_punctures_exactly_alpha() {
        let depth = 4;
        let mut prg = Prg::from_os_entropy();
        let delta = u128::from_le_bytes(prg.block());
        for len in [2usize, 9, 16] {
            for alpha in 0..len {
                // Ideal level COTs with receiver choice ¬α_l and zero corrections.
                let r: Vec<u8> = (0..depth)
                    .map(|l| 1 - ((alpha >> (depth - 1 - l)) & 1) as u8)
                    .collect();
                let q: Vec<u128> = (0..depth)
                    .map(|_| u128::from_le_bytes(prg.block()))
                    .collect();
                let t: Vec<u128> = (0..depth)
                    .map(|l| q[l] ^ if r[l] == 1 { delta } else { 0 })
                    .collect();
                let levels = SenderLevels {
                    delta,
                    q: &q,
                    d: &vec![0; depth],
                    tweak: 77,
                };
                let (mut v, mut w) = (vec![0u128; len], vec![0u128; len]);
                let mut msg = vec![0u128; 2 * depth + 1];
                let mut scratch = TreeScratch::new(depth);
                send_tree(5, &levels, &mut v, &mut msg, &mut scratch);
                receive_tree(alpha, &t, 77, &msg, &mut w, &mut scratch);
                for i in 0..len {
                    let want = if i == alpha { v[i] ^ delta } else { v[i] };
                    assert_eq!(w[i], want, "len {len} alpha {alpha} leaf {i}");
                }
            }
        }
    }
}
