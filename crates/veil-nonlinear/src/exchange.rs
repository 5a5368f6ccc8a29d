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

/// Binary correlated OTs in both directions, from veil-ot's shared-output 1-of-2 OT: this party
/// offers the rows (0, d_i) and gets its XOR share r_i; as receiver with `choices` it gets
/// r'_i ⊕ c_i·d'_i. Returns (r, received). `width` + 1 bits per OT instead of the 2·`width` + 1
/// of a chosen-message OT. Four flights.
pub(crate) fn binary_cot_both<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    d: &[u64],
    choices: &[bool],
    width: u32,
) -> Result<(Vec<u64>, Vec<u64>)> {
    let picks: Vec<u8> = choices.iter().map(|&c| c as u8).collect();
    let send = |ot: &mut OtSession, ch: &mut C| {
        ot.send_1_of_n_shared(ch, 1, d.len(), width, |i, row| {
            row[0] = 0;
            row[1] = d[i];
        })
    };
    match role {
        Role::Client => {
            let r = send(ot, ch)?;
            let got = ot.recv_1_of_n_shared(ch, 1, &picks, width)?;
            Ok((r, got))
        }
        Role::Server => {
            let got = ot.recv_1_of_n_shared(ch, 1, &picks, width)?;
            let r = send(ot, ch)?;
            Ok((r, got))
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
