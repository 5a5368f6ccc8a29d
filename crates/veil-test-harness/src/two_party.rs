//! Both parties of a two-party protocol in one test: each in a thread with its own OT session,
//! over the in-memory duplex or TCP loopback, with sharing and opening helpers. The protocol
//! crates' unit and integration tests share these instead of a copy per file.

use veil_core::approx::Approx;
use veil_core::{share, FixedPoint, Prg, Result, Ring, RingTensor};
use veil_net::{run_two_party, run_two_party_tcp, MemChannel, Role, TcpChannel};
use veil_ot::{Backend, OtSession};

/// The default fixed-point format, the one inference runs at.
pub fn fp() -> FixedPoint {
    FixedPoint::default_format()
}

/// The fixed-point algorithms at [`fp`]: the oracle the protocols must match exactly.
pub fn approx() -> Approx {
    Approx::new(fp()).expect("the default format is valid")
}

/// OT engine for the in-memory tests: IKNP sets up in milliseconds, while the protocols are
/// engine-agnostic; the TCP samples use the session's default (silent) engine.
fn quick_session(ch: &mut MemChannel, role: Role) -> Result<OtSession> {
    OtSession::setup_with(ch, role, Backend::Iknp)
}

/// Runs `f` as client and server over the in-memory duplex.
pub fn run_mem<T, F>(f: F) -> (T, T)
where
    T: Send,
    F: Fn(&mut OtSession, &mut MemChannel, Role) -> Result<T> + Sync,
{
    run_two_party(
        |c| {
            let mut ot = quick_session(c, Role::Client)?;
            f(&mut ot, c, Role::Client)
        },
        |s| {
            let mut ot = quick_session(s, Role::Server)?;
            f(&mut ot, s, Role::Server)
        },
    )
    .expect("protocol run")
}

/// Same over TCP loopback, with the default OT engine.
pub fn run_tcp<T, F>(f: F) -> (T, T)
where
    T: Send,
    F: Fn(&mut OtSession, &mut TcpChannel, Role) -> Result<T> + Sync,
{
    run_two_party_tcp(
        |c| {
            let mut ot = OtSession::setup(c, Role::Client)?;
            f(&mut ot, c, Role::Client)
        },
        |s| {
            let mut ot = OtSession::setup(s, Role::Server)?;
            f(&mut ot, s, Role::Server)
        },
    )
    .expect("protocol run")
}

/// Shares plaintext ring values; returns (client share, server share).
pub fn share_values(ring: Ring, values: &[u64]) -> (RingTensor, RingTensor) {
    let x = RingTensor::from_vec(ring, &[values.len()], values.to_vec()).unwrap();
    share(&x, &mut Prg::from_os_entropy()).unwrap()
}

/// This party's share of a (client, server) pair.
pub fn pick(role: Role, pair: &(RingTensor, RingTensor)) -> &RingTensor {
    match role {
        Role::Client => &pair.0,
        Role::Server => &pair.1,
    }
}

/// The values behind a (client, server) pair of additive shares.
pub fn open(pair: (RingTensor, RingTensor)) -> Vec<u64> {
    pair.0.add(&pair.1).unwrap().into_data()
}

/// The bits behind a (client, server) pair of XOR shares.
pub fn open_bits(pair: (Vec<bool>, Vec<bool>)) -> Vec<bool> {
    pair.0.iter().zip(&pair.1).map(|(a, b)| a ^ b).collect()
}

/// Random signed values with |x| < 2^bits, plus the edge values of that range.
pub fn values_below(ring: Ring, bits: u32, n: usize) -> Vec<u64> {
    let mut prg = Prg::from_os_entropy();
    let lim = 1i64 << bits;
    let mut v: Vec<u64> = [0, 1, -1, lim - 1, -(lim - 1), 2, -2]
        .iter()
        .filter(|&&x| x.abs() < lim)
        .map(|&x| ring.from_signed(x))
        .collect();
    while v.len() < n {
        let r = (prg.u64() >> 1) as i64 % lim;
        let r = if prg.bit() { -r } else { r };
        v.push(ring.from_signed(r));
    }
    v
}

/// Opens shares given as raw values of `ring`.
pub fn open_raw(ring: Ring, pair: (Vec<u64>, Vec<u64>)) -> Vec<u64> {
    pair.0
        .iter()
        .zip(&pair.1)
        .map(|(&a, &b)| ring.add(a, b))
        .collect()
}
