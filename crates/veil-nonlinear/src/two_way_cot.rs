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
/// `choices` (gets `y = x' ∘ c·δ'`, ∘ the group's operation). Returns (x, y). Sent COT i is
/// `send_widths[i mod len]` bits wide, received COT i `recv_widths[i mod len]` (the peer's send
/// widths), and each costs its width + 1 bits. Three flights: the server's corrections, the
/// client's messages with its own corrections, the server's messages; a direction without
/// COTs (the counts are public, so both parties agree) is skipped.
pub(crate) fn cot_both<C: Channel>(
    ot: &mut OtSession,
    ch: &mut C,
    role: Role,
    corr: Corr,
    (deltas, send_widths): (&[u64], &[u32]),
    (choices, recv_widths): (&[bool], &[u32]),
) -> Result<(Vec<u64>, Vec<u64>)> {
    let send = |ot: &mut OtSession, ch: &mut C| match (deltas.is_empty(), corr) {
        (true, _) => Ok(Vec::new()),
        (false, Corr::Arith) => ot.send_arith_cot_widths(ch, deltas, send_widths),
        (false, Corr::Xor) => ot.send_xor_cot_widths(ch, deltas, send_widths),
    };
    let recv = |ot: &mut OtSession, ch: &mut C| match (choices.is_empty(), corr) {
        (true, _) => Ok(Vec::new()),
        (false, Corr::Arith) => ot.recv_arith_cot_widths(ch, choices, recv_widths),
        (false, Corr::Xor) => ot.recv_xor_cot_widths(ch, choices, recv_widths),
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

/// One call of arithmetic COTs in both directions, assembled term by term, so that independent
/// terms (a product's cross terms and its wrap correction) share three flights. Both parties
/// add the same terms in the same order, sends and receives each in their own sequence, so this
/// party's i-th send meets the peer's i-th receive.
#[derive(Default)]
pub(crate) struct CotCall {
    deltas: Vec<u64>,
    send_widths: Vec<u32>,
    choices: Vec<bool>,
    recv_widths: Vec<u32>,
}

impl CotCall {
    /// A COT this party sends: correlation `delta` (reduced to `width` bits).
    pub(crate) fn send(&mut self, delta: u64, width: u32) {
        self.deltas.push(delta & low_mask(width));
        self.send_widths.push(width);
    }

    /// A COT this party receives with `choice`, `width` bits wide (the sender's width).
    pub(crate) fn recv(&mut self, choice: bool, width: u32) {
        self.choices.push(choice);
        self.recv_widths.push(width);
    }

    /// (sends, receives) added so far: where the next term's outputs will start.
    pub(crate) fn len(&self) -> (usize, usize) {
        (self.deltas.len(), self.choices.len())
    }

    /// Runs the call: (x of every send, y of every receive), in the order they were added.
    pub(crate) fn run<C: Channel>(
        &self,
        ot: &mut OtSession,
        ch: &mut C,
        role: Role,
    ) -> Result<(Vec<u64>, Vec<u64>)> {
        cot_both(
            ot,
            ch,
            role,
            Corr::Arith,
            (&self.deltas, &self.send_widths),
            (&self.choices, &self.recv_widths),
        )
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
