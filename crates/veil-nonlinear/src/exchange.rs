//! Two-way OT exchanges: both parties act as sender once and as receiver once, in a fixed order
//! (client sends first), so callers write one symmetric line instead of a `match` per protocol.

use veil_core::Result;
use veil_net::{Channel, Role};
use veil_ot::OtSession;

/// Arithmetic COTs in both directions: this party sends correlations `deltas` (gets `x`) and
/// receives with `choices` (gets `y = x' + c·δ'`). Returns (x, y). Four flights.
pub(crate) fn arith_cot_both<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    deltas: &[u64],
    choices: &[bool],
    bits: u32,
) -> Result<(Vec<u64>, Vec<u64>)> {
    match role {
        Role::Client => {
            let x = ot.send_arith_cot(ch, deltas, bits)?;
            let y = ot.recv_arith_cot(ch, choices, bits)?;
            Ok((x, y))
        }
        Role::Server => {
            let y = ot.recv_arith_cot(ch, choices, bits)?;
            let x = ot.send_arith_cot(ch, deltas, bits)?;
            Ok((x, y))
        }
    }
}

/// Chosen-message 1-of-2 OTs in both directions: this party sends `msgs` and receives with
/// `choices`. Returns the received messages. Four flights.
pub(crate) fn chosen_both<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    msgs: &[[u64; 2]],
    choices: &[bool],
    bits: u32,
) -> Result<Vec<u64>> {
    match role {
        Role::Client => {
            ot.send_chosen(ch, msgs, bits)?;
            ot.recv_chosen(ch, choices, bits)
        }
        Role::Server => {
            let got = ot.recv_chosen(ch, choices, bits)?;
            ot.send_chosen(ch, msgs, bits)?;
            Ok(got)
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
