//! Runs both parties of a protocol in two threads of this process: the standard harness for tests
//! and benchmarks.

use std::net::TcpListener;
use std::thread;

use veil_core::{Error, Result};

use crate::{
    mem_pair, Channel, ClientTls, Identity, MemChannel, ServerPin, ServerTls, TcpChannel,
    TlsChannel,
};

fn join<T>(h: thread::ScopedJoinHandle<'_, Result<T>>, who: &str) -> Result<T> {
    h.join()
        .map_err(|_| Error::Other(format!("{who} thread panicked")))?
}

/// Runs `client` and `server` over an in-memory duplex and returns both results.
pub fn run_two_party<A, B, FA, FB>(client: FA, server: FB) -> Result<(A, B)>
where
    A: Send,
    B: Send,
    FA: FnOnce(&mut MemChannel) -> Result<A> + Send,
    FB: FnOnce(&mut MemChannel) -> Result<B> + Send,
{
    run_two_party_on(mem_pair(), client, server)
}

/// [`run_two_party`] over a given pair (client end first), e.g. a [`crate::shaped_pair`].
pub fn run_two_party_on<A, B, FA, FB>(
    (mut c, mut s): (MemChannel, MemChannel),
    client: FA,
    server: FB,
) -> Result<(A, B)>
where
    A: Send,
    B: Send,
    FA: FnOnce(&mut MemChannel) -> Result<A> + Send,
    FB: FnOnce(&mut MemChannel) -> Result<B> + Send,
{
    thread::scope(|sc| {
        let hc = sc.spawn(move || {
            let r = client(&mut c);
            c.flush()?;
            r
        });
        let hs = sc.spawn(move || {
            let r = server(&mut s);
            s.flush()?;
            r
        });
        let rc = join(hc, "client");
        let rs = join(hs, "server");
        Ok((rc?, rs?))
    })
}

/// Same as [`run_two_party`] over a real TCP connection on 127.0.0.1.
pub fn run_two_party_tcp<A, B, FA, FB>(client: FA, server: FB) -> Result<(A, B)>
where
    A: Send,
    B: Send,
    FA: FnOnce(&mut TcpChannel) -> Result<A> + Send,
    FB: FnOnce(&mut TcpChannel) -> Result<B> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    thread::scope(|sc| {
        let hs = sc.spawn(move || {
            let (stream, _) = listener.accept()?;
            let mut ch = TcpChannel::from_stream(stream)?;
            let r = server(&mut ch);
            ch.flush()?;
            r
        });
        let hc = sc.spawn(move || {
            let mut ch = TcpChannel::connect(addr)?;
            let r = client(&mut ch);
            ch.flush()?;
            r
        });
        let rc = join(hc, "client");
        let rs = join(hs, "server");
        Ok((rc?, rs?))
    })
}

/// Same as [`run_two_party_tcp`] over TLS 1.3: a fresh server identity, the client pinning its
/// fingerprint (what `veil serve` / `veil classify` run on; for measuring TLS's cost).
pub fn run_two_party_tls<A, B, FA, FB>(client: FA, server: FB) -> Result<(A, B)>
where
    A: Send,
    B: Send,
    FA: FnOnce(&mut TlsChannel) -> Result<A> + Send,
    FB: FnOnce(&mut TlsChannel) -> Result<B> + Send,
{
    let id = Identity::generate()?;
    let tls = ServerTls::new(&id, None)?;
    let pin = ClientTls {
        pin: ServerPin::Fingerprint {
            fp: id.fingerprint(),
            source: "the in-process server".into(),
        },
        identity: None,
    };
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let deadline = || std::time::Instant::now() + std::time::Duration::from_secs(30);
    thread::scope(|sc| {
        let hs = sc.spawn(move || {
            let (stream, _) = listener.accept()?;
            let mut ch = tls.accept(stream, deadline())?;
            ch.set_deadline(None)?;
            let r = server(&mut ch);
            ch.flush()?;
            r
        });
        let hc = sc.spawn(move || {
            let mut ch = pin.connect(std::net::TcpStream::connect(addr)?, deadline())?;
            ch.set_deadline(None)?;
            let r = client(&mut ch);
            ch.flush()?;
            r
        });
        let rc = join(hc, "client");
        let rs = join(hs, "server");
        Ok((rc?, rs?))
    })
}
