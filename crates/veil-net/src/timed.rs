//! A TCP stream with a total deadline: before every read or write the socket's timeout is set to
//! the time left, so a peer dripping one byte every few seconds cannot stretch a step past its
//! deadline (a per-read timeout alone would be reset by every byte).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One end of a TCP connection whose reads and writes fail with `io::ErrorKind::TimedOut` once
/// the deadline has passed, or when the peer stays silent for longer than the idle limit.
#[derive(Debug)]
pub(crate) struct TimedStream {
    stream: TcpStream,
    deadline: Option<Instant>,
    idle: Option<Duration>,
}

/// The shortest timeout handed to the socket (zero would mean "none").
const MIN_WAIT: Duration = Duration::from_millis(1);

impl TimedStream {
    pub(crate) fn new(stream: TcpStream) -> Self {
        TimedStream {
            stream,
            deadline: None,
            idle: None,
        }
    }

    /// A second handle on the same socket, with the same limits.
    pub(crate) fn try_clone(&self) -> io::Result<Self> {
        Ok(TimedStream {
            stream: self.stream.try_clone()?,
            deadline: self.deadline,
            idle: self.idle,
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
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
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
        let wait = self.wait()?;
        self.stream.set_read_timeout(wait)?;
        self.stream
            .read(buf)
            .map_err(|e| self.timed_out(e, "waiting for the peer"))
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
