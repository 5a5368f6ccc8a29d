//! A TCP stream with a total deadline: before every read or write the socket's timeout is set to
//! the time left, so a peer dripping one byte every few seconds cannot stretch a step past its
//! deadline (a per-read timeout alone would be reset by every byte). Reads may also be stopped
//! from another thread ([`TimedStream::stop_reads_on`]: a server ending its sessions at
//! shutdown), and a closing end hangs up politely ([`hang_up`]).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One end of a TCP connection whose reads and writes fail with `io::ErrorKind::TimedOut` once
/// the deadline has passed, or when the peer stays silent for longer than the idle limit.
#[derive(Debug)]
pub(crate) struct TimedStream {
    stream: TcpStream,
    deadline: Option<Instant>,
    idle: Option<Duration>,
    /// Once set, reads fail within [`STOP_POLL`].
    stop: Option<Arc<AtomicBool>>,
}

/// The shortest timeout handed to the socket (zero would mean "none").
const MIN_WAIT: Duration = Duration::from_millis(1);
/// How often a blocked read looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);
/// How long an end that closed with a reason ([`crate::Channel::close_with`]) keeps reading
/// what the peer still sends, so that closing with unread data (a reset) does not destroy the
/// reason before the peer reads it; the peer's hang-up ends it sooner.
pub const LINGER: Duration = Duration::from_secs(2);

impl TimedStream {
    pub(crate) fn new(stream: TcpStream) -> Self {
        TimedStream {
            stream,
            deadline: None,
            idle: None,
            stop: None,
        }
    }

    /// A second handle on the same socket, with the same limits.
    pub(crate) fn try_clone(&self) -> io::Result<Self> {
        Ok(TimedStream {
            stream: self.stream.try_clone()?,
            deadline: self.deadline,
            idle: self.idle,
            stop: self.stop.clone(),
        })
    }

    pub(crate) fn get_ref(&self) -> &TcpStream {
        &self.stream
    }

    /// Reads and writes after `deadline` fail (`None`: no total deadline).
    pub(crate) fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    /// One read or write waiting longer than `idle` fails (`None`: no limit).
    pub(crate) fn set_idle(&mut self, idle: Option<Duration>) {
        self.idle = idle;
    }

    /// Reads fail once `stop` is set, even while a peer keeps sending.
    pub(crate) fn stop_reads_on(&mut self, stop: Arc<AtomicBool>) {
        self.stop = Some(stop);
    }

    fn stopped(&self) -> bool {
        self.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst))
    }

    /// The wait allowed to the next socket operation, or a timeout error if the deadline has
    /// passed.
    fn wait(&self) -> io::Result<Option<Duration>> {
        let mut wait = self.idle;
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the step's deadline passed",
                ));
            }
            wait = Some(wait.map_or(left, |w| w.min(left)));
        }
        Ok(wait.map(|w| w.max(MIN_WAIT)))
    }

    fn timed_out(&self, e: io::Error, what: &str) -> io::Error {
        if is_timeout(&e) {
            let past = self.deadline.is_some_and(|d| Instant::now() >= d);
            let msg = if past {
                format!("the step's deadline passed while {what}")
            } else {
                match self.idle {
                    Some(i) => format!("{:.0} s without progress {what}", i.as_secs_f64()),
                    None => format!("{what} timed out"),
                }
            };
            io::Error::new(io::ErrorKind::TimedOut, msg)
        } else {
            e
        }
    }
}

impl Read for TimedStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // One read may wait for the idle limit, within the deadline; with a stop flag, in
        // slices of STOP_POLL that look at it.
        let started = Instant::now();
        let limit = match (self.deadline, self.idle.map(|i| started + i)) {
            (Some(d), Some(i)) => Some(d.min(i)),
            (d, i) => d.or(i),
        };
        loop {
            if self.stopped() {
                return Err(io::Error::other(
                    "reading stopped: the session is being ended",
                ));
            }
            let mut wait = match limit {
                Some(l) => match l.saturating_duration_since(Instant::now()) {
                    left if left.is_zero() => {
                        let e = io::Error::from(io::ErrorKind::TimedOut);
                        return Err(self.timed_out(e, "waiting for the peer"));
                    }
                    left => Some(left),
                },
                None => None,
            };
            if self.stop.is_some() {
                wait = Some(wait.map_or(STOP_POLL, |w| w.min(STOP_POLL)));
            }
            self.stream
                .set_read_timeout(wait.map(|w| w.max(MIN_WAIT)))?;
            match self.stream.read(buf) {
                // The limit or the stop flag decides, at the top of the loop.
                Err(e) if is_timeout(&e) => continue,
                r => return r.map_err(|e| self.timed_out(e, "waiting for the peer")),
            }
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Ends the sending direction of `reader`'s socket, then reads and drops what the peer still
/// sends until it hangs up, for at most [`LINGER`] (and never stopped).
pub(crate) fn hang_up(reader: &mut BufReader<TimedStream>) {
    let stream = reader.get_mut();
    let _ = stream.stream.shutdown(Shutdown::Write);
    stream.stop = None;
    stream.idle = None;
    stream.deadline = Some(Instant::now() + LINGER);
    while let Ok(b) = reader.fill_buf() {
        let n = b.len();
        if n == 0 {
            break;
        }
        reader.consume(n);
    }
}

impl Write for TimedStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let wait = self.wait()?;
        self.stream.set_write_timeout(wait)?;
        self.stream
            .write(buf)
            .map_err(|e| self.timed_out(e, "sending to the peer"))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}
