//! TLS 1.3 transport (rustls, `ring` provider) with pinned self-signed identities.
//!
//! There is no certificate authority: each server has a long-term key and a self-signed
//! certificate ([`Identity`], created once in a state directory), and clients recognise it by the
//! SHA-256 of its DER certificate ([`Fingerprint`]): pinned on the command line, or trusted on
//! first use and recorded in a known-servers file ([`KnownServers`]) that refuses a changed key
//! afterwards. The certificate check compares the fingerprint; the TLS 1.3 handshake signature is
//! still verified with the provider's algorithms, so only the holder of the pinned key can
//! complete a handshake. Clients may authenticate too: the server then accepts only the client
//! fingerprints of its allow-list.
//!
//! [`TlsChannel`] is a [`Channel`]: sends are buffered as plaintext and encrypted at
//! [`Channel::flush`] (or before a receive), so a protocol's flight stays one flight of records;
//! the meter counts plaintext bytes, as [`crate::TcpChannel`] does (TLS adds 22 bytes per record of
//! up to 16 KiB). Deadlines work as on TCP ([`crate::timed`]).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::fs;
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use sha2::{Digest, Sha256};
use veil_core::{bail, ensure, Error, Result};
use zeroize::Zeroizing;

use crate::records::{Inbox, Outbox};
use crate::tcp::BUF_BYTES;
use crate::timed::{hang_up, TimedStream, LINGER};
use crate::{Channel, Meter};

/// The name the client asks for (SNI) and the certificate carries; identity comes from the
/// fingerprint, not from this name.
pub const SERVER_NAME: &str = "veil-server";
const CERT_FILE: &str = "cert.der";
const KEY_FILE: &str = "key.der";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_err(e: rustls::Error) -> Error {
    use rustls::AlertDescription as A;
    match e {
        rustls::Error::AlertReceived(
            a @ (A::AccessDenied | A::CertificateRequired | A::BadCertificate | A::UnknownCA),
        ) => Error::Insecure(format!(
            "TLS: the peer refused the certificate presented, or its absence (alert {a:?}); \
                 a server that requires client certificates needs --client-identity and the \
                 client's fingerprint on its --client-allow list"
        )),
        e => Error::Insecure(format!("TLS: {e}")),
    }
}

/// The SHA-256 of a DER certificate: how a peer is recognised.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of a DER certificate.
    pub fn of(cert_der: &[u8]) -> Self {
        Fingerprint(Sha256::digest(cert_der).into())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl FromStr for Fingerprint {
    type Err = Error;
    /// 64 hex digits, upper or lower case, optionally separated by colons.
    fn from_str(s: &str) -> Result<Self> {
        let hex: Vec<u8> = s.bytes().filter(|&b| b != b':').collect();
        ensure!(
            hex.len() == 64,
            InvalidArgument,
            "a fingerprint is 64 hex digits (SHA-256), got {:?}",
            s
        );
        let mut out = [0u8; 32];
        for (i, pair) in hex.chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16);
            match (digit(pair[0]), digit(pair[1])) {
                (Some(h), Some(l)) => out[i] = (h * 16 + l) as u8,
                _ => bail!(InvalidArgument, "not a hex fingerprint: {s:?}"),
            }
        }
        Ok(Fingerprint(out))
    }
}

/// A long-term key and its self-signed certificate.
pub struct Identity {
    cert: CertificateDer<'static>,
    key: Zeroizing<Vec<u8>>,
}

impl Identity {
    /// A fresh ECDSA P-256 key and certificate (kept in memory only).
    pub fn generate() -> Result<Self> {
        let key = rcgen::KeyPair::generate()
            .map_err(|e| Error::Other(format!("generating a key: {e}")))?;
        let params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()])
            .map_err(|e| Error::Other(format!("certificate parameters: {e}")))?;
        let cert = params
            .self_signed(&key)
            .map_err(|e| Error::Other(format!("self-signing: {e}")))?;
        Ok(Identity {
            cert: cert.der().clone(),
            key: Zeroizing::new(key.serialize_der()),
        })
    }

    /// The identity kept in `dir` (`cert.der`, `key.der`), created there on first use: the
    /// directory with mode 0700, the key file with 0600. Refuses a key file other users can
    /// read. Returns whether it was created.
    ///
    /// The directory is locked (`.lock`) while it is read or written: a second process racing
    /// on it is told that another one holds it, rather than finding half an identity.
    pub fn load_or_create(dir: &Path) -> Result<(Self, bool)> {
        let cert_path = dir.join(CERT_FILE);
        let key_path = dir.join(KEY_FILE);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| Error::Other(format!("creating {}: {e}", dir.display())))?;
        let lock_path = dir.join(".lock");
        let lock = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| Error::Other(format!("opening {}: {e}", lock_path.display())))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => bail!(
                Other,
                "another process holds the state directory {} (it is reading or creating its \
                 identity there): start this one once it runs, or pass another --state-dir",
                dir.display()
            ),
            Err(fs::TryLockError::Error(e)) => {
                bail!(Other, "locking {}: {e}", lock_path.display())
            }
        }
        if key_path.exists() || cert_path.exists() {
            return Ok((Self::load(dir)?, false));
        }
        let id = Self::generate()?;
        write_new(&key_path, &id.key, 0o600)?;
        write_new(&cert_path, &id.cert, 0o644)?;
        Ok((id, true))
    }

    /// The identity in `dir`, which must exist.
    pub fn load(dir: &Path) -> Result<Self> {
        let cert_path = dir.join(CERT_FILE);
        let key_path = dir.join(KEY_FILE);
        let read = |p: &Path| {
            fs::read(p).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Error::NotFound(format!(
                    "{} (an identity needs both {CERT_FILE} and {KEY_FILE}; delete the other to \
                     create a new one)",
                    p.display()
                )),
                _ => Error::Other(format!("{}: {e}", p.display())),
            })
        };
        for p in [&key_path, &cert_path] {
            ensure!(
                !p.is_dir(),
                InvalidArgument,
                "{} is a directory, not a file: remove it (a new identity is then created) or \
                 pass another --state-dir",
                p.display()
            );
        }
        let mode = fs::metadata(&key_path)
            .map(|m| m.permissions().mode())
            .unwrap_or(0o600);
        ensure!(
            mode & 0o077 == 0,
            Insecure,
            "{} is readable by other users (mode {:o}): chmod 600 it",
            key_path.display(),
            mode & 0o777
        );
        let key = Zeroizing::new(read(&key_path)?);
        let cert = CertificateDer::from(read(&cert_path)?);
        // The pair must belong together: sign with the key and check against the certificate.
        let id = Identity { cert, key };
        id.check_pair()
            .map_err(|e| Error::Malformed(format!("the identity in {}: {e}", dir.display())))?;
        Ok(id)
    }

    fn check_pair(&self) -> Result<()> {
        if provider()
            .key_provider
            .load_private_key(self.private_key())
            .is_err()
        {
            bail!(
                Malformed,
                "{KEY_FILE} is not a private key (PKCS#8 DER, as veil writes it)"
            );
        }
        rustls::sign::CertifiedKey::from_der(
            vec![self.cert.clone()],
            self.private_key(),
            &provider(),
        )
        .map_err(|e| Error::Malformed(format!("the certificate does not match the key: {e}")))?;
        Ok(())
    }

    /// The fingerprint of this identity's certificate.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.cert)
    }

    /// This identity's certificate (DER).
    pub fn certificate_der(&self) -> &[u8] {
        &self.cert
    }

    fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.to_vec()))
    }
}

/// Writes a new file with `mode` (never replacing one: a race with another process fails).
fn write_new(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| Error::Other(format!("creating {}: {e}", path.display())))?;
    f.write_all(data)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::Other(format!("writing {}: {e}", path.display())))
}

/// Where identities and known servers are kept by default: `$XDG_STATE_HOME/veil`, else
/// `~/.local/state/veil`.
pub fn default_state_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("veil"));
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".local/state/veil")),
        None => bail!(
            InvalidArgument,
            "neither XDG_STATE_HOME nor HOME is set: pass --state-dir"
        ),
    }
}

/// Fingerprints read from a file, one per line (64 hex digits; `#` starts a comment; anything
/// after the fingerprint on its line is a free-form name).
pub fn read_fingerprints(path: &Path) -> Result<HashSet<Fingerprint>> {
    let text = fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound(path.display().to_string()),
        _ => Error::Other(format!("{}: {e}", path.display())),
    })?;
    let mut out = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if let Some(word) = line.split_whitespace().next() {
            let fp = word
                .parse()
                .map_err(|e| Error::Malformed(format!("{} line {}: {e}", path.display(), n + 1)))?;
            out.insert(fp);
        }
    }
    Ok(out)
}

/// Trust on first use: `HOST FINGERPRINT` lines, one per server the client has talked to.
pub struct KnownServers {
    path: PathBuf,
    entries: BTreeMap<String, Fingerprint>,
}

impl KnownServers {
    /// The file at `path`, or an empty list if it does not exist yet.
    pub fn open(path: &Path) -> Result<Self> {
        let mut entries = BTreeMap::new();
        match fs::read_to_string(path) {
            Ok(text) => {
                for (n, line) in text.lines().enumerate() {
                    let line = line.split('#').next().unwrap_or("").trim();
                    let mut words = line.split_whitespace();
                    let (Some(host), Some(fp)) = (words.next(), words.next()) else {
                        continue;
                    };
                    let fp = fp.parse().map_err(|e| {
                        Error::Malformed(format!("{} line {}: {e}", path.display(), n + 1))
                    })?;
                    entries.insert(host.to_string(), fp);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => bail!(Other, "{}: {e}", path.display()),
        }
        Ok(KnownServers {
            path: path.to_path_buf(),
            entries,
        })
    }

    /// The file the records are kept in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fingerprint recorded for `host`, if any.
    pub fn get(&self, host: &str) -> Option<Fingerprint> {
        self.entries.get(host).copied()
    }

    /// Records `host`'s fingerprint (appending a line to the file, creating it if needed).
    pub fn record(&mut self, host: &str, fp: Fingerprint) -> Result<()> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| Error::Other(format!("creating {}: {e}", dir.display())))?;
        }
        let mut f = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&self.path)
            .map_err(|e| Error::Other(format!("{}: {e}", self.path.display())))?;
        writeln!(f, "{host} {fp}")
            .map_err(|e| Error::Other(format!("{}: {e}", self.path.display())))?;
        self.entries.insert(host.to_string(), fp);
        Ok(())
    }
}

/// How the client recognises the server.
#[derive(Clone, Debug)]
pub enum ServerPin {
    /// Exactly this fingerprint; `source` says where the pin came from (for error messages).
    Fingerprint {
        /// The expected fingerprint.
        fp: Fingerprint,
        /// Where it came from.
        source: String,
    },
    /// Any certificate (first use of a known-servers file): the caller records what it saw.
    FirstUse,
}

/// The handshake-signature checks both verifiers share: the provider's algorithms, whatever
/// the certificate (the fingerprint check is each verifier's own).
#[derive(Debug)]
struct Signatures(Arc<CryptoProvider>);

/// The verifier trait methods that check handshake signatures with the verifier's
/// `signatures`.
macro_rules! signature_checks {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            let algorithms = &self.signatures.0.signature_verification_algorithms;
            verify_tls12_signature(message, cert, dss, algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            let algorithms = &self.signatures.0.signature_verification_algorithms;
            verify_tls13_signature(message, cert, dss, algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.signatures
                .0
                .signature_verification_algorithms
                .supported_schemes()
        }
    };
}

#[derive(Debug)]
struct PinVerifier {
    pin: ServerPin,
    signatures: Signatures,
    /// The fingerprint presented, and why it was refused (if it was).
    seen: Mutex<(Option<Fingerprint>, Option<String>)>,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let got = Fingerprint::of(end_entity);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.0 = Some(got);
        match &self.pin {
            ServerPin::FirstUse => Ok(ServerCertVerified::assertion()),
            ServerPin::Fingerprint { fp, .. } if *fp == got => Ok(ServerCertVerified::assertion()),
            ServerPin::Fingerprint { fp, source } => {
                seen.1 = Some(format!(
                    "the server's certificate fingerprint is {got}, but {source} expects {fp}: \
                     this is not the server you pinned (or its key changed)"
                ));
                Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::ApplicationVerificationFailure,
                ))
            }
        }
    }

    signature_checks!();
}

/// The server's check of client certificates: only fingerprints on the allow-list.
#[derive(Debug)]
struct AllowList {
    allowed: HashSet<Fingerprint>,
    signatures: Signatures,
}

impl ClientCertVerifier for AllowList {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        if self.allowed.contains(&Fingerprint::of(end_entity)) {
            Ok(ClientCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    signature_checks!();
}

/// The server's TLS settings: its identity and, optionally, the clients it accepts.
#[derive(Clone)]
pub struct ServerTls {
    config: Arc<rustls::ServerConfig>,
    fingerprint: Fingerprint,
}

impl ServerTls {
    /// TLS 1.3 only; `allowed_clients`: require a client certificate with one of these
    /// fingerprints (`None`: any client, no client certificate).
    pub fn new(id: &Identity, allowed_clients: Option<HashSet<Fingerprint>>) -> Result<Self> {
        let provider = provider();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_err)?;
        let builder = match allowed_clients {
            Some(allowed) => builder.with_client_cert_verifier(Arc::new(AllowList {
                allowed,
                signatures: Signatures(provider.clone()),
            })),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(vec![id.cert.clone()], id.private_key())
            .map_err(tls_err)?;
        config.send_tls13_tickets = 0;
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        Ok(ServerTls {
            config: Arc::new(config),
            fingerprint: id.fingerprint(),
        })
    }

    /// The fingerprint of the server's certificate.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The server's half of a handshake on an accepted connection, finished before `deadline`.
    pub fn accept(&self, stream: TcpStream, deadline: Instant) -> Result<TlsChannel> {
        let conn = rustls::ServerConnection::new(self.config.clone()).map_err(tls_err)?;
        let mut ch = TlsChannel::new(stream, conn.into())?;
        ch.set_deadline(Some(deadline))?;
        ch.handshake().map_err(|e| match e {
            Error::Insecure(m) => Error::Insecure(format!("handshake refused: {m}")),
            e => e,
        })?;
        Ok(ch)
    }
}

/// The client's TLS settings.
pub struct ClientTls {
    /// How the server's certificate is checked.
    pub pin: ServerPin,
    /// A client certificate, for servers that require one.
    pub identity: Option<Identity>,
}

impl ClientTls {
    /// The client's half of a handshake on a connected stream, finished before `deadline`.
    /// The channel's [`TlsChannel::peer_fingerprint`] is the server's (to record on first use).
    pub fn connect(&self, stream: TcpStream, deadline: Instant) -> Result<TlsChannel> {
        let provider = provider();
        let verifier = Arc::new(PinVerifier {
            pin: self.pin.clone(),
            signatures: Signatures(provider.clone()),
            seen: Mutex::new((None, None)),
        });
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_err)?
            .dangerous()
            .with_custom_certificate_verifier(verifier.clone());
        let mut config = match &self.identity {
            Some(id) => builder
                .with_client_auth_cert(vec![id.cert.clone()], id.private_key())
                .map_err(tls_err)?,
            None => builder.with_no_client_auth(),
        };
        config.resumption = rustls::client::Resumption::disabled();
        let name = ServerName::try_from(SERVER_NAME)
            .map_err(|e| Error::Other(format!("server name: {e}")))?;
        let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(tls_err)?;
        let mut ch = TlsChannel::new(stream, conn.into())?;
        ch.set_deadline(Some(deadline))?;
        let res = ch.handshake();
        let (seen, why) = verifier
            .seen
            .lock()
            .map(|s| s.clone())
            .unwrap_or((None, None));
        if let Some(why) = why {
            bail!(Insecure, "{why}");
        }
        res.map_err(|e| match e {
            Error::Disconnected => Error::Other(
                "the server closed the connection during the TLS handshake (is it a Veil \
                 server with TLS, not --insecure-plaintext? is it at capacity, its sessions and \
                 queue full? does it require a client certificate, --client-identity?)"
                    .into(),
            ),
            e => e,
        })?;
        ch.peer = seen;
        Ok(ch)
    }
}

/// A TLS 1.3 connection carrying a Veil session.
pub struct TlsChannel {
    conn: rustls::Connection,
    reader: BufReader<TimedStream>,
    writer: BufWriter<TimedStream>,
    /// Plaintext queued by `send`, encrypted at flush.
    out: Outbox,
    inbox: Inbox,
    meter: Meter,
    peer: Option<Fingerprint>,
}

impl TlsChannel {
    fn new(stream: TcpStream, mut conn: rustls::Connection) -> Result<Self> {
        stream.set_nodelay(true)?;
        conn.set_buffer_limit(None);
        let stream = TimedStream::new(stream);
        Ok(TlsChannel {
            conn,
            reader: BufReader::with_capacity(BUF_BYTES, stream.try_clone()?),
            writer: BufWriter::with_capacity(BUF_BYTES, stream),
            out: Outbox::default(),
            inbox: Inbox::default(),
            meter: Meter::new(),
            peer: None,
        })
    }

    /// The fingerprint of the peer's certificate (the server's on a client; the client's on a
    /// server that requires client certificates).
    pub fn peer_fingerprint(&self) -> Option<Fingerprint> {
        self.peer.or_else(|| {
            self.conn
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| Fingerprint::of(c))
        })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Result<std::net::SocketAddr> {
        Ok(self.writer.get_ref().get_ref().peer_addr()?)
    }

    /// A peer silent for longer than `t` makes one receive fail (see `TcpChannel::set_timeout`).
    pub fn set_timeout(&mut self, t: Option<Duration>) -> Result<()> {
        self.reader.get_mut().set_idle(t);
        self.writer.get_mut().set_idle(t);
        Ok(())
    }

    /// Receives fail within 0.1 s once `stop` is set (see `TcpChannel::stop_reads_on`).
    pub fn stop_reads_on(&mut self, stop: Arc<AtomicBool>) {
        self.reader.get_mut().stop_reads_on(stop);
    }

    fn write_tls(&mut self) -> Result<()> {
        write_tls(&mut self.conn, &mut self.writer)
    }

    fn handshake(&mut self) -> Result<()> {
        while self.conn.is_handshaking() {
            self.write_tls()?;
            if self.conn.is_handshaking() {
                read_tls(&mut self.conn, &mut self.reader, &mut self.writer)?;
            }
        }
        self.write_tls()
    }

    fn flush_out(&mut self) -> Result<()> {
        let conn = &mut self.conn;
        let sent = self.out.emit(&mut |b| Ok(conn.writer().write_all(b)?));
        let sent = sent.and_then(|()| self.write_tls());
        sent.map_err(|e| self.last_word(e))
    }

    /// A send that failed with `e`: the peer's reason if it closed with one (read for at most
    /// [`LINGER`]), else `e`.
    fn last_word(&mut self, e: Error) -> Error {
        self.reader
            .get_mut()
            .set_deadline(Some(Instant::now() + LINGER));
        let (conn, reader, writer) = (&mut self.conn, &mut self.reader, &mut self.writer);
        self.inbox
            .last_word(e, &mut |b| read_plain(conn, reader, writer, b))
    }
}

fn write_tls(conn: &mut rustls::Connection, writer: &mut BufWriter<TimedStream>) -> Result<()> {
    while conn.wants_write() {
        conn.write_tls(writer)?;
    }
    writer.flush()?;
    Ok(())
}

/// Reads more records from the socket and decrypts them.
fn read_tls(
    conn: &mut rustls::Connection,
    reader: &mut BufReader<TimedStream>,
    writer: &mut BufWriter<TimedStream>,
) -> Result<()> {
    let n = conn.read_tls(reader)?;
    if n == 0 {
        return Err(Error::Disconnected);
    }
    if let Err(e) = conn.process_new_packets() {
        // Tell the peer why (an alert), best effort.
        let _ = write_tls(conn, writer);
        return Err(tls_err(e));
    }
    Ok(())
}

/// Fills `buf` with decrypted bytes, reading records from the socket as needed.
fn read_plain(
    conn: &mut rustls::Connection,
    reader: &mut BufReader<TimedStream>,
    writer: &mut BufWriter<TimedStream>,
    buf: &mut [u8],
) -> Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        match conn.reader().read(&mut buf[filled..]) {
            Ok(0) => return Err(Error::Disconnected),
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => read_tls(conn, reader, writer)?,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

impl Channel for TlsChannel {
    fn send(&mut self, data: &[u8]) -> Result<()> {
        self.meter.on_send(data.len());
        let conn = &mut self.conn;
        let sent = self
            .out
            .push(data, &mut |b| Ok(conn.writer().write_all(b)?));
        // Every 1 MiB queued leaves at once, as on TCP.
        let sent = sent.and_then(|()| self.write_tls());
        sent.map_err(|e| self.last_word(e))
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<()> {
        self.flush_out()?;
        let (conn, reader, writer) = (&mut self.conn, &mut self.reader, &mut self.writer);
        self.inbox
            .recv(buf, &mut |b| read_plain(conn, reader, writer, b))?;
        self.meter.on_recv(buf.len());
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.flush_out()
    }

    fn meter(&self) -> &Meter {
        &self.meter
    }

    fn set_deadline(&mut self, deadline: Option<Instant>) -> Result<()> {
        self.reader.get_mut().set_deadline(deadline);
        self.writer.get_mut().set_deadline(deadline);
        Ok(())
    }

    fn start_records(&mut self) -> Result<()> {
        let conn = &mut self.conn;
        self.out
            .start_records(&mut |b| Ok(conn.writer().write_all(b)?))?;
        self.inbox.start_records();
        Ok(())
    }

    fn close_with(&mut self, reason: &str) -> Result<()> {
        // The step's deadline may be what passed: the reason gets its own time.
        self.set_deadline(Some(Instant::now() + LINGER))?;
        let conn = &mut self.conn;
        let sent = self
            .out
            .close(reason, &mut |b| Ok(conn.writer().write_all(b)?));
        self.conn.send_close_notify();
        let sent = sent.and_then(|()| self.write_tls());
        hang_up(&mut self.reader);
        sent
    }
}

impl fmt::Debug for TlsChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsChannel")
            .field("peer", &self.peer_fingerprint())
            .finish_non_exhaustive()
    }
}

impl Drop for TlsChannel {
    fn drop(&mut self) {
        // Close politely (close_notify), without waiting on a peer that does not read.
        let _ = self.set_deadline(Some(Instant::now() + Duration::from_secs(1)));
        self.conn.send_close_notify();
        let _ = self.flush_out();
    }
}
