//! Admission priced by what a peer has shown. A connection that has shown nothing (no TLS, no
//! hello) holds a handshake place, bounded in total and per source address, for the fixed
//! handshake deadline; one that sent a valid hello holds a place in the queue (its socket, not a
//! thread) for at most the queue's wait, or a session slot and the memory of the length it
//! announced. What is refused is told why ([`announced_tokens`], the busy and shutdown texts).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use veil_net::Channel;

use crate::protocol::Hello;

/// The length a hello announces, checked against the model's limit: 1 to `limit` tokens, or
/// why not (sent to the client). A zero or larger announcement is refused rather than rounded:
/// the server reserves memory for exactly what a client announces.
pub(crate) fn announced_tokens(hello: &Hello, limit: usize) -> Result<usize, String> {
    match hello.max_tokens as usize {
        0 => Err(format!(
            "the hello announces 0 tokens: announce the longest prompt of the session (1 to \
             {limit} tokens for this model)"
        )),
        n if n > limit => Err(format!(
            "the hello announces {n} tokens, more than the {limit} this model takes"
        )),
        n => Ok(n),
    }
}

/// Connections from each source address that are not yet in a session (in their handshake or
/// queued): one address cannot take every place.
#[derive(Default)]
pub(crate) struct PerAddress {
    counts: HashMap<IpAddr, usize>,
}

impl PerAddress {
    /// Counts one more from `ip` if it has fewer than `cap`; whether it did.
    pub(crate) fn try_add(&mut self, ip: IpAddr, cap: usize) -> bool {
        let n = self.counts.entry(ip).or_insert(0);
        if *n >= cap {
            return false;
        }
        *n += 1;
        true
    }

    /// One from `ip` left (admitted, refused or gone).
    pub(crate) fn remove(&mut self, ip: IpAddr) {
        if let Some(n) = self.counts.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&ip);
            }
        }
    }
}

/// A connection whose hello was valid, waiting for a session slot: its channel and what it
/// announced; no thread.
pub(crate) struct Waiting<T> {
    pub(crate) ch: Box<dyn Channel + Send>,
    pub(crate) hello: Hello,
    pub(crate) tokens: usize,
    /// The session memory its announced length needs.
    pub(crate) bytes: u64,
    pub(crate) since: Instant,
    pub(crate) id: u64,
    pub(crate) peer: SocketAddr,
    /// Given back (its address's count) when the connection leaves the queue.
    pub(crate) ticket: T,
}

/// The connections waiting for a slot, first come first served.
pub(crate) struct Queue<T> {
    waiting: VecDeque<Waiting<T>>,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            waiting: VecDeque::new(),
        }
    }
}

impl<T> Queue<T> {
    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub(crate) fn push(&mut self, w: Waiting<T>) {
        self.waiting.push_back(w);
    }

    /// The first waiting connection, if `fits` its memory: the order is kept, so a long
    /// announcement is not overtaken forever by short ones.
    pub(crate) fn pop_if(&mut self, fits: impl FnOnce(u64) -> bool) -> Option<Waiting<T>> {
        match self.waiting.front() {
            Some(w) if fits(w.bytes) => self.waiting.pop_front(),
            _ => None,
        }
    }

    /// The connections that have waited `wait` or longer at `now`, taken out.
    pub(crate) fn expired(&mut self, now: Instant, wait: Duration) -> Vec<Waiting<T>> {
        let mut out = vec![];
        while self
            .waiting
            .front()
            .is_some_and(|w| now.saturating_duration_since(w.since) >= wait)
        {
            out.extend(self.waiting.pop_front());
        }
        out
    }

    /// Every waiting connection, taken out (shutdown).
    pub(crate) fn drain(&mut self) -> Vec<Waiting<T>> {
        self.waiting.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_of_zero_or_beyond_the_model_are_refused_with_the_limit() {
        let h = |n| Hello { max_tokens: n };
        assert_eq!(announced_tokens(&h(1), 128), Ok(1));
        assert_eq!(announced_tokens(&h(128), 128), Ok(128));
        let zero = announced_tokens(&h(0), 128).unwrap_err();
        assert!(
            zero.contains("announces 0 tokens") && zero.contains("1 to 128"),
            "{zero}"
        );
        let big = announced_tokens(&h(u32::MAX), 128).unwrap_err();
        assert!(big.contains("4294967295") && big.contains("128"), "{big}");
    }

    #[test]
    fn one_address_is_capped_and_others_are_not() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mut p = PerAddress::default();
        assert!(p.try_add(a, 2) && p.try_add(a, 2));
        assert!(!p.try_add(a, 2));
        assert!(p.try_add(b, 2));
        p.remove(a);
        assert!(p.try_add(a, 2));
        p.remove(a);
        p.remove(a);
        p.remove(b);
        assert!(p.counts.is_empty());
    }
}
