//! Two-way OT exchanges: both parties act as sender once and as receiver once, in a fixed order
//! (client sends first), so callers write one symmetric line instead of a `match` per protocol.

use veil_core::Result;
use veil_net::{Channel, Role};
use veil_ot::OtSession;

/// The group of a COT's correlation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Corr {
    /// Z_(2^bits): shares of products (Gilboa).
    Arith,
    /// XOR on `bits`-bit words: shares of ANDs; one correction word instead of the two
    /// messages of a chosen-message OT.
    Xor,
}

/// COTs in both directions: this party sends correlations `deltas` (gets `x`) and receives with
/// `choices` (gets `y = x' ∘ c·δ'`, ∘ the group's operation). Returns (x, y). COT i is
/// `widths[i mod widths.len()]` bits wide and costs that + 1 bits per direction. Three flights: the server's corrections, the client's
/// messages with its own corrections, the server's messages.
pub(crate) fn cot_both<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    corr: Corr,
    deltas: &[u64],
    choices: &[bool],
    widths: &[u32],
) -> Result<(Vec<u64>, Vec<u64>)> {
    let send = |ot: &mut OtSession, ch: &mut C| match corr {
        Corr::Arith => ot.send_arith_cot_widths(ch, deltas, widths),
        Corr::Xor => ot.send_xor_cot_widths(ch, deltas, widths),
    };
    let recv = |ot: &mut OtSession, ch: &mut C| match corr {
        Corr::Arith => ot.recv_arith_cot_widths(ch, choices, widths),
        Corr::Xor => ot.recv_xor_cot_widths(ch, choices, widths),
    };
    match role {
        Role::Client => {
            let x = send(ot, ch)?;
            let y = recv(ot, ch)?;
            Ok((x, y))
        }
        Role::Server => {
            let y = recv(ot, ch)?;
            let x = send(ot, ch)?;
            Ok((x, y))
        }
    }
}

/// 2^bits − 1 (bits ≤ 64).
pub(crate) fn low_mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}
