//! A shaped link: both parties of one process over an in-memory duplex whose every flushed chunk
//! reaches the other end only when it would over a network of a given bandwidth and round-trip
//! time, so a run *measures* its time on that network instead of modelling it afterwards.
//!
//! Model, per direction: a chunk departs at max(now, when the link is free), occupies the link for
//! bytes·8/rate, and arrives one-way latency (RTT/2) after its last bit left. Chunks of one flight
//! therefore pipeline (the latency is paid once per flight, not per chunk), a reply departs only
//! after the request arrived (a round trip costs a full RTT), and arrival times are fixed by the
//! sender, so the receiver's own processing delays nothing it has not yet read.
//!
//! Where the delay is applied: the sender stamps each chunk with its arrival time when it flushes
//! it (a [`MemChannel`] flushes on [`crate::Channel::flush`], before every receive, and every 1 MiB), and
//! the receiver waits until that time before it reads any byte of the chunk. Both ends read one
//! shared [`Clock`]. The chunk boundaries are the transport's real flushes, so a buffered message
//! departs when it is flushed, not when it is queued. Shaping sits beside the meter: the bytes and
//! flights counted are those of an unshaped [`MemChannel`].
//!
//! Limits: both parties must run in this process (the stamp travels beside the chunk, not on the
//! wire; two processes need a network emulator such as Linux `tc netem`). The link only adds
//! delay: the two parties' compute still shares this machine's cores. It ignores TCP (slow start,
//! congestion window, headers) and loss. With [`RealClock`], every wait may overshoot by the OS
//! sleep granularity (tens of microseconds), which a LAN run of many flights accumulates.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use veil_core::{ensure, Error, Result};

use crate::{mem, MemChannel};

/// A network: bandwidth per direction in bits per second and round-trip time in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NetworkModel {
    /// Its name in reports (`LAN`, `WAN` or the `--net` text).
    pub name: &'static str,
    /// Bandwidth per direction.
    pub bits_per_second: f64,
    /// Round-trip time.
    pub rtt_s: f64,
}

/// The cost report's LAN: 3 Gbps, 0.8 ms RTT.
pub const LAN: NetworkModel = NetworkModel {
    name: "LAN",
    bits_per_second: 3e9,
    rtt_s: 0.8e-3,
};

/// The cost report's WAN: 100 Mbps, 80 ms RTT.
pub const WAN: NetworkModel = NetworkModel {
    name: "WAN",
    bits_per_second: 100e6,
    rtt_s: 80e-3,
};

/// The name of a network given as `RATE,RTT`.
const CUSTOM: &str = "custom";

impl NetworkModel {
    /// A network must have a rate of at least 1 bit/s and an RTT of at most a minute, so every
    /// delay is a finite [`Duration`].
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.bits_per_second.is_finite() && self.bits_per_second >= 1.0,
            InvalidArgument,
            "a network's rate must be at least 1 bit/s, not {}",
            self.bits_per_second
        );
        ensure!(
            (0.0..=60.0).contains(&self.rtt_s),
            InvalidArgument,
            "a network's round-trip time must be between 0 and 60 s, not {} s",
            self.rtt_s
        );
        Ok(())
    }

    /// How long `bytes` occupy one direction of the link.
    pub fn transfer_time(&self, bytes: usize) -> Duration {
        Duration::from_secs_f64(bytes as f64 * 8.0 / self.bits_per_second)
    }

    /// Half the round-trip time: what every flight pays once.
    pub fn one_way(&self) -> Duration {
        Duration::from_secs_f64(self.rtt_s / 2.0)
    }
}

/// Parses `lan`, `wan` (any case) or `RATE,RTT`: RATE in bits per second with an optional `k`,
/// `M` or `G` (×10³, ×10⁶, ×10⁹, any case) and an optional `bps`, RTT with a unit `s`, `ms` or
/// `us`. Examples: `100M,80ms`, `1G,10ms`, `2.5Gbps,0.5ms`.
impl FromStr for NetworkModel {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let net = match s.to_ascii_lowercase().as_str() {
            "lan" => LAN,
            "wan" => WAN,
            _ => {
                let bad = |why: &str| {
                    Error::InvalidArgument(format!(
                        "network \"{s}\": {why}; expected lan, wan or RATE,RTT such as 100M,80ms \
                         (RATE in bit/s with an optional k, M or G; RTT with a unit s, ms or us)"
                    ))
                };
                let (rate, rtt) = s.split_once(',').ok_or_else(|| bad("no comma"))?;
                NetworkModel {
                    name: CUSTOM,
                    bits_per_second: parse_rate(rate.trim())
                        .ok_or_else(|| bad(&format!("bad rate \"{rate}\"")))?,
                    rtt_s: parse_rtt(rtt.trim())
                        .ok_or_else(|| bad(&format!("bad round-trip time \"{rtt}\"")))?,
                }
            }
        };
        net.validate()?;
        Ok(net)
    }
}

fn parse_rate(s: &str) -> Option<f64> {
    let s = s.strip_suffix("bps").unwrap_or(s);
    let (number, scale) = match s.chars().last()?.to_ascii_lowercase() {
        'k' => (&s[..s.len() - 1], 1e3),
        'm' => (&s[..s.len() - 1], 1e6),
        'g' => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    Some(number.parse::<f64>().ok()? * scale)
}

fn parse_rtt(s: &str) -> Option<f64> {
    let (number, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else {
        (s.strip_suffix('s')?, 1.0)
    };
    let v = number.parse::<f64>().ok()?;
    (v >= 0.0).then_some(v * scale)
}

/// At most three decimals, without trailing zeros.
fn short(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `WAN (100 Mbps, 80 ms RTT)`.
impl fmt::Display for NetworkModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (scale, unit) = [(1e9, "Gbps"), (1e6, "Mbps"), (1e3, "kbps")]
            .into_iter()
            .find(|&(scale, _)| self.bits_per_second >= scale)
            .unwrap_or((1.0, "bps"));
        write!(
            f,
            "{} ({} {unit}, {} ms RTT)",
            self.name,
            short(self.bits_per_second / scale),
            short(self.rtt_s * 1e3)
        )
    }
}

/// The time both ends of a shaped link read; injectable so tests run on simulated time.
pub trait Clock: Send + Sync {
    /// Time since the clock's origin.
    fn now(&self) -> Duration;
    /// Returns once [`Clock::now`] has reached `t`.
    fn wait_until(&self, t: Duration);
}

/// Wall time, by sleeping.
pub struct RealClock {
    origin: Instant,
}

impl RealClock {
    /// A clock at zero.
    pub fn new() -> Self {
        RealClock {
            origin: Instant::now(),
        }
    }
}

impl Default for RealClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for RealClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn wait_until(&self, t: Duration) {
        if let Some(d) = t.checked_sub(self.now()) {
            std::thread::sleep(d);
        }
    }
}

/// Simulated time for single-threaded tests: it stands still except when advanced, and waiting
/// jumps it forward.
#[derive(Default)]
pub struct SimClock {
    now: Mutex<Duration>,
}

impl SimClock {
    /// Lets `d` pass, as a party's computation would.
    pub fn advance(&self, d: Duration) {
        *self.lock() += d;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Duration> {
        self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Clock for SimClock {
    fn now(&self) -> Duration {
        *self.lock()
    }

    fn wait_until(&self, t: Duration) {
        let mut now = self.lock();
        *now = (*now).max(t);
    }
}

/// One party's end of a shaped link: its outgoing direction's schedule and the shared clock.
pub(crate) struct LinkEnd {
    net: NetworkModel,
    clock: Arc<dyn Clock>,
    /// When the outgoing direction finishes sending what it has been given.
    free_at: Duration,
}

impl LinkEnd {
    pub(crate) fn network(&self) -> NetworkModel {
        self.net
    }

    /// Schedules a chunk of `bytes` flushed now; returns when it arrives at the other end.
    pub(crate) fn depart(&mut self, bytes: usize) -> Duration {
        let start = self.clock.now().max(self.free_at);
        self.free_at = start + self.net.transfer_time(bytes);
        self.free_at + self.net.one_way()
    }

    /// Holds the receiver back until a chunk stamped `arrival` has arrived.
    pub(crate) fn wait_for(&self, arrival: Duration) {
        self.clock.wait_until(arrival);
    }
}

/// A connected in-memory pair whose traffic is delayed as over `net`, both ends reading `clock`.
pub fn shaped_pair(net: NetworkModel, clock: Arc<dyn Clock>) -> Result<(MemChannel, MemChannel)> {
    net.validate()?;
    let end = || LinkEnd {
        net,
        clock: clock.clone(),
        free_at: Duration::ZERO,
    };
    Ok(mem::joined(Some(end()), Some(end())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{mem_pair, Channel};

    /// Simulated times are sums of nanosecond-rounded durations: equal to the exact figure
    /// within a microsecond.
    const TOLERANCE_S: f64 = 1e-6;

    fn assert_at(clock: &SimClock, want_s: f64) {
        let got = clock.now().as_secs_f64();
        assert!(
            (got - want_s).abs() <= TOLERANCE_S,
            "simulated time {got} s, expected {want_s} s"
        );
    }

    fn sim_pair(net: NetworkModel) -> (Arc<SimClock>, MemChannel, MemChannel) {
        let clock = Arc::new(SimClock::default());
        let (a, b) = shaped_pair(net, clock.clone()).unwrap();
        (clock, a, b)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn recv_vec(ch: &mut MemChannel, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        ch.recv(&mut buf).unwrap();
        buf
    }

    /// A script of flights both ways, with chunks above the 1 MiB flush size: every byte
    /// arrives intact and in order, and the meters count what unshaped channels count.
    #[test]
    fn delivers_every_byte_in_order_and_meters_as_unshaped() {
        let sizes = [1usize, 4, 1000, 3 << 20, 17, (1 << 20) + 5];
        let run = |a: &mut MemChannel, b: &mut MemChannel| {
            for (i, &n) in sizes.iter().enumerate() {
                let (from, to) = if i % 2 == 0 {
                    (&mut *a, &mut *b)
                } else {
                    (&mut *b, &mut *a)
                };
                let (first, second) = (pattern(n, i as u8), pattern(n / 2 + 1, 99));
                from.send(&first).unwrap();
                from.send(&second).unwrap();
                from.flush().unwrap();
                assert_eq!(recv_vec(to, n), first);
                assert_eq!(recv_vec(to, n / 2 + 1), second);
            }
            (a.meter().total(), b.meter().total())
        };
        let (_, mut a, mut b) = sim_pair(WAN);
        let shaped = run(&mut a, &mut b);
        let (mut a, mut b) = mem_pair();
        let plain = run(&mut a, &mut b);
        assert_eq!(
            (shaped.0.bytes_sent, shaped.0.rounds(), shaped.1.bytes_sent),
            (plain.0.bytes_sent, plain.0.rounds(), plain.1.bytes_sent)
        );
        assert_eq!(shaped.0.rounds(), sizes.len() as u64);
    }

    #[test]
    fn one_flight_costs_its_transfer_and_half_an_rtt() {
        let (clock, mut a, mut b) = sim_pair(WAN);
        a.send(&[7u8; 10_000]).unwrap();
        a.flush().unwrap();
        recv_vec(&mut b, 10_000);
        assert_at(&clock, 10_000.0 * 8.0 / 100e6 + 0.040);
    }

    /// 3 MiB + 1 leave as four chunks (1 MiB sends flush at once) that share one latency, and
    /// the sender's computation between chunks delays only what it has not yet sent.
    #[test]
    fn chunks_of_a_flight_pipeline() {
        let (clock, mut a, mut b) = sim_pair(WAN);
        let mib = 1 << 20;
        for _ in 0..3 {
            a.send(&vec![1u8; mib]).unwrap();
        }
        a.send(&[2u8]).unwrap();
        a.flush().unwrap();
        recv_vec(&mut b, 3 * mib + 1);
        let flight = (3 * mib + 1) as f64 * 8.0 / 100e6;
        assert_at(&clock, flight + 0.040);

        // Idle link: a chunk, 100 ms of computation, another chunk.
        let start = clock.now().as_secs_f64();
        b.send(&[3u8; 1000]).unwrap();
        b.flush().unwrap();
        clock.advance(Duration::from_millis(100));
        b.send(&[4u8; 1000]).unwrap();
        b.flush().unwrap();
        assert_eq!(recv_vec(&mut a, 1000), [3u8; 1000]);
        assert_at(&clock, start + 0.100);
        recv_vec(&mut a, 1000);
        assert_at(&clock, start + 0.100 + 1000.0 * 8.0 / 100e6 + 0.040);
    }

    /// A round trip costs one RTT plus both transfers plus the replier's computation; the
    /// receiver's processing does not delay messages already on their way.
    #[test]
    fn round_trips_and_receiver_processing() {
        let (clock, mut a, mut b) = sim_pair(LAN);
        let tx = |n: usize| n as f64 * 8.0 / 3e9;
        a.send(&[1u8; 500]).unwrap();
        a.flush().unwrap();
        a.send(&[2u8; 300]).unwrap();
        a.flush().unwrap();
        recv_vec(&mut b, 500);
        assert_at(&clock, tx(500) + 0.0004);
        clock.advance(Duration::from_micros(50));
        recv_vec(&mut b, 300);
        // The second message arrived behind the first (tx(300) < 50 µs): no wait.
        assert_at(&clock, tx(500) + 0.0004 + 50e-6);
        clock.advance(Duration::from_millis(2));
        b.send(&[3u8; 2000]).unwrap();
        b.flush().unwrap();
        recv_vec(&mut a, 2000);
        assert_at(&clock, tx(500) + 0.0004 + 50e-6 + 0.002 + tx(2000) + 0.0004);
    }

    /// Wall time: with two threads and a real clock, a receiver never sees a flight early.
    #[test]
    fn real_clock_never_delivers_early() {
        let net: NetworkModel = "1G,20ms".parse().unwrap();
        let pair = shaped_pair(net, Arc::new(RealClock::new())).unwrap();
        let t = Instant::now();
        crate::run_two_party_on(
            pair,
            |ch| {
                for i in 0..3u8 {
                    ch.send(&[i; 100])?;
                    assert_eq!(recv_vec(ch, 100), [i; 100]);
                }
                Ok(())
            },
            |ch| {
                for _ in 0..3 {
                    let m = recv_vec(ch, 100);
                    ch.send(&m)?;
                }
                Ok(())
            },
        )
        .unwrap();
        assert!(t.elapsed() >= Duration::from_millis(6 * 10));
    }

    #[test]
    fn parses_networks_and_refuses_bad_ones() {
        assert_eq!("lan".parse::<NetworkModel>().unwrap(), LAN);
        assert_eq!("WAN".parse::<NetworkModel>().unwrap(), WAN);
        for (s, rate, rtt) in [
            ("100M,80ms", 100e6, 0.080),
            ("1G,10ms", 1e9, 0.010),
            ("2.5Gbps, 0.5ms", 2.5e9, 0.0005),
            ("500k,1s", 500e3, 1.0),
            ("64000,250us", 64e3, 250e-6),
        ] {
            let n: NetworkModel = s.parse().unwrap();
            assert_eq!((n.name, n.bits_per_second), (CUSTOM, rate), "{s}");
            assert!((n.rtt_s - rtt).abs() < 1e-12, "{s}");
        }
        for s in [
            "",
            "lan2",
            "100M",
            "100M,80",
            "0M,1ms",
            "-1M,1ms",
            "100X,1ms",
            "M,1ms",
            "100M,-1ms",
            "nanM,1ms",
            "infG,1ms",
            "100M,infs",
            "100M,61s",
        ] {
            let e = s.parse::<NetworkModel>().unwrap_err().to_string();
            assert!(e.contains("invalid argument"), "{s}: {e}");
        }
        assert_eq!(WAN.to_string(), "WAN (100 Mbps, 80 ms RTT)");
        assert_eq!(LAN.to_string(), "LAN (3 Gbps, 0.8 ms RTT)");
    }
}
