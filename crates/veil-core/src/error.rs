//! One error type for every Veil crate: protocol code returns `Result<T>` and never panics on
//! anything a peer or a file can send.

use std::fmt;

/// Errors raised by Veil. Variants say *who* is at fault: the caller (`InvalidArgument`), the peer
/// or a file (`Malformed`), the transport (`Io`, `Disconnected`), or a security refusal.
#[derive(Debug)]
pub enum Error {
    /// A caller passed something the function does not accept (wrong shape, bad parameter).
    InvalidArgument(String),
    /// Bytes received from a peer or read from a file do not decode.
    Malformed(String),
    /// A message exceeds its size limit.
    TooLarge {
        /// What was too large (a message kind).
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit it exceeded.
        max: usize,
    },
    /// The peer closed the connection.
    Disconnected,
    /// The transport failed.
    Io(std::io::Error),
    /// A parameter set or request violates the security requirements.
    Insecure(String),
    /// A path that is not implemented: never a fake answer.
    Unsupported(String),
    /// Anything else, with context.
    Other(String),
    /// A deadline passed: a silent or too slow peer, or a step that took longer than allowed.
    TimedOut(String),
    /// A file or directory that does not exist (the message names its path).
    NotFound(String),
    /// The peer declined a request it is not obliged to grant (a session over its limits, a
    /// preprocessing over its budget); the message is its reason.
    Refused(String),
    /// A remote resource (the package registry) could not be reached: the one failure tests may
    /// count as a missing resource rather than a fault.
    Unreachable(String),
    /// The peer ended the session and said why (a close record, `veil_net::Channel::close_with`):
    /// its text as received, shown escaped ([`escape_control`]).
    PeerClosed(String),
}

/// `Result` with Veil's [`Error`], the return type of every fallible Veil function.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::Malformed(m) => write!(f, "malformed message: {m}"),
            Error::TooLarge { what, len, max } => {
                write!(f, "{what} too large: {len} bytes (limit {max})")
            }
            Error::Disconnected => write!(f, "peer disconnected"),
            Error::Io(e) => write!(f, "i/o error: {e}"),
            Error::Insecure(m) => write!(f, "refused as insecure: {m}"),
            Error::Unsupported(m) => write!(f, "not supported: {m}"),
            Error::Other(m) => write!(f, "{m}"),
            Error::TimedOut(m) => write!(f, "timed out: {m}"),
            Error::NotFound(m) => write!(f, "not found: {m}"),
            Error::Refused(m) => write!(f, "{m}"),
            Error::Unreachable(m) => write!(f, "unreachable: {m}"),
            Error::PeerClosed(m) => {
                write!(f, "the peer closed the session: {}", escape_control(m))
            }
        }
    }
}

/// A peer's text (a refusal, a close reason) with control characters (terminal escapes among
/// them) shown escaped, so what a peer sends cannot drive the reader's terminal.
pub fn escape_control(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c.is_control() {
            true => c.escape_default().collect::<Vec<_>>(),
            false => vec![c],
        })
        .collect()
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        use std::io::ErrorKind::*;
        match e.kind() {
            UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => Error::Disconnected,
            // A socket read or write timeout surfaces as WouldBlock (EAGAIN) on Unix.
            TimedOut | WouldBlock => Error::TimedOut(match e.get_ref() {
                Some(inner) => inner.to_string(),
                None => "the peer sent nothing within the time allowed".into(),
            }),
            _ => Error::Io(e),
        }
    }
}

/// `bail!(Kind, "fmt", args)` returns `Err(Error::Kind(format!(..)))`.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($arg:tt)*) => {
        return Err($crate::Error::$kind(format!($($arg)*)))
    };
}

/// `ensure!(cond, Kind, "fmt", args)`: a checked precondition that returns an error instead of
/// panicking. Used for every security and input check (never `debug_assert!`).
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $kind:ident, $($arg:tt)*) => {
        if !$cond {
            $crate::bail!($kind, $($arg)*);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(
            escape_control("busy\x1b[2J\r\nnow\u{7}"),
            "busy\\u{1b}[2J\\r\\nnow\\u{7}"
        );
        assert_eq!(escape_control("plain «text»"), "plain «text»");
        let e = Error::PeerClosed("gone\x1b[2J".into()).to_string();
        assert_eq!(e, "the peer closed the session: gone\\u{1b}[2J");
    }
}
