//! The TLS transport: pinned server identities, client allow-lists, identities on disk, trust on
//! first use, and total deadlines that a dripping peer cannot stretch. Loopback only.

use std::collections::HashSet;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use veil_core::Error;
use veil_net::{
    Channel, ClientTls, Fingerprint, Identity, KnownServers, ServerPin, ServerTls, TcpChannel,
};

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// A server thread that accepts one TLS connection and echoes one message back.
fn echo_server(tls: ServerTls) -> (String, std::thread::JoinHandle<veil_core::Result<()>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let h = std::thread::spawn(move || {
        let (s, _) = listener.accept()?;
        let mut ch = tls.accept(s, soon())?;
        let m = ch.recv_msg(1 << 23)?;
        ch.send_msg(&m)?;
        ch.flush()
    });
    (addr, h)
}

fn pinned(fp: Fingerprint) -> ClientTls {
    ClientTls {
        pin: ServerPin::Fingerprint {
            fp,
            source: "the test".into(),
        },
        identity: None,
    }
}

#[test]
fn pinned_server_carries_messages_and_counts_plaintext() {
    let id = Identity::generate().unwrap();
    let tls = ServerTls::new(&id, None).unwrap();
    let (addr, h) = echo_server(tls);
    let mut ch = pinned(id.fingerprint())
        .connect(TcpStream::connect(&addr).unwrap(), soon())
        .unwrap();
    assert_eq!(ch.peer_fingerprint(), Some(id.fingerprint()));
    let msg: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
    ch.send_msg(&msg).unwrap();
    assert_eq!(ch.recv_msg(1 << 23).unwrap(), msg);
    assert_eq!(ch.meter().total().bytes_sent, msg.len() as u64 + 4);
    h.join().unwrap().unwrap();
}

#[test]
fn a_wrong_fingerprint_is_refused_with_both_fingerprints_named() {
    let id = Identity::generate().unwrap();
    let other = Identity::generate().unwrap();
    let (addr, h) = echo_server(ServerTls::new(&id, None).unwrap());
    let err = pinned(other.fingerprint())
        .connect(TcpStream::connect(&addr).unwrap(), soon())
        .expect_err("a wrong pin must fail");
    let m = err.to_string();
    assert!(matches!(err, Error::Insecure(_)), "{m}");
    assert!(
        m.contains(&id.fingerprint().to_string()) && m.contains(&other.fingerprint().to_string()),
        "{m}"
    );
    assert!(h.join().unwrap().is_err());
}

#[test]
fn client_certificates_are_checked_against_the_allow_list() {
    let server_id = Identity::generate().unwrap();
    let allowed = Identity::generate().unwrap();
    let stranger = Identity::generate().unwrap();
    let allow: HashSet<_> = [allowed.fingerprint()].into();
    let tls = ServerTls::new(&server_id, Some(allow)).unwrap();

    // An allowed client gets through, and the server sees who it is.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = tls.clone();
    let h = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut ch = t.accept(s, soon())?;
        let who = ch.peer_fingerprint();
        let m = ch.recv_msg(16)?;
        ch.send_msg(&m)?;
        ch.flush()?;
        // Second connection: a stranger.
        let (s, _) = listener.accept().unwrap();
        let refused = t.accept(s, soon()).err();
        Ok::<_, Error>((who, refused))
    });
    let mut c = ClientTls {
        pin: ServerPin::Fingerprint {
            fp: server_id.fingerprint(),
            source: "the test".into(),
        },
        identity: Some(allowed),
    };
    let mut ch = c
        .connect(TcpStream::connect(addr).unwrap(), soon())
        .unwrap();
    ch.send_msg(b"hi").unwrap();
    assert_eq!(ch.recv_msg(16).unwrap(), b"hi");
    drop(ch);
    c.identity = Some(stranger);
    // TLS 1.3: the client's handshake may finish before the server's verdict arrives; the
    // refusal then shows at the first receive.
    let r = c
        .connect(TcpStream::connect(addr).unwrap(), soon())
        .and_then(|mut ch| {
            ch.send_msg(b"hi")?;
            ch.recv_msg(16)
        });
    assert!(r.is_err());
    let (who, refused) = h.join().unwrap().unwrap();
    assert!(who.is_some());
    assert!(refused.is_some());
}

#[test]
fn a_client_without_tls_is_dropped_by_a_tls_server() {
    let id = Identity::generate().unwrap();
    let (addr, h) = echo_server(ServerTls::new(&id, None).unwrap());
    let mut plain = TcpChannel::connect(&addr).unwrap();
    plain.send_msg(b"VEIL....").unwrap();
    plain.flush().unwrap();
    assert!(h.join().unwrap().is_err());
}

/// A peer sending one byte every 200 ms never lets a 5 s per-read timeout fire, but the total
/// deadline of 1 s drops it.
#[test]
fn a_dripping_peer_is_dropped_at_the_step_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let dripper = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        // A length prefix of 64, then zeros: a valid message, if it were ever finished.
        for i in 0..40 {
            if s.write_all(&[if i == 0 { 64 } else { 0 }]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let (s, _) = listener.accept().unwrap();
    let mut ch = TcpChannel::from_stream(s).unwrap();
    ch.set_timeout(Some(Duration::from_secs(5))).unwrap();
    let start = Instant::now();
    ch.set_deadline(Some(start + Duration::from_secs(1)))
        .unwrap();
    let err = ch.recv_msg(1 << 20).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, Error::TimedOut(_)), "{err}");
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    drop(ch);
    dripper.join().unwrap();
}

#[test]
fn identities_persist_with_a_private_key_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let (a, created) = Identity::load_or_create(&dir).unwrap();
    assert!(created);
    let mode = std::fs::metadata(dir.join("key.der"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let (b, created) = Identity::load_or_create(&dir).unwrap();
    assert!(!created);
    assert_eq!(a.fingerprint(), b.fingerprint());
    assert_eq!(
        Fingerprint::of(a.certificate_der()),
        a.fingerprint(),
        "the fingerprint is the certificate's SHA-256"
    );
    // A key other users can read is refused.
    std::fs::set_permissions(dir.join("key.der"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = Identity::load(&dir).err().unwrap();
    assert!(err.to_string().contains("chmod 600"), "{err}");
}

#[test]
fn fingerprints_parse_and_known_servers_remember() {
    let id = Identity::generate().unwrap();
    let fp = id.fingerprint();
    let text = fp.to_string();
    assert_eq!(text.len(), 64);
    assert_eq!(text.parse::<Fingerprint>().unwrap(), fp);
    let colons: String = text
        .to_uppercase()
        .as_bytes()
        .chunks(2)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join(":");
    assert_eq!(colons.parse::<Fingerprint>().unwrap(), fp);
    assert!("abc".parse::<Fingerprint>().is_err());
    assert!("zz".repeat(32).parse::<Fingerprint>().is_err());

    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("sub/known");
    let mut k = KnownServers::open(&path).unwrap();
    assert_eq!(k.get("h:1"), None);
    k.record("h:1", fp).unwrap();
    let k = KnownServers::open(&path).unwrap();
    assert_eq!(k.get("h:1"), Some(fp));
}

/// State-directory errors name what is wrong: a key file that is not a key, a key path that is a
/// directory, and a directory another process is creating its identity in.
#[test]
fn state_directory_errors_name_the_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    Identity::load_or_create(&dir).unwrap();
    let key = dir.join("key.der");
    std::fs::write(&key, [0x5au8; 121]).unwrap();
    let err = Identity::load_or_create(&dir).err().unwrap().to_string();
    assert!(err.contains("not a private key"), "{err}");
    assert!(!err.contains("does not match"), "{err}");

    std::fs::remove_file(&key).unwrap();
    std::fs::create_dir(&key).unwrap();
    let err = Identity::load_or_create(&dir).err().unwrap().to_string();
    assert!(
        err.contains("is a directory") && err.contains("key.der"),
        "{err}"
    );
    assert!(!err.contains("readable by other users"), "{err}");

    // Another process creating its identity in an empty directory holds its lock.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let held = std::fs::File::create(empty.join(".lock")).unwrap();
    held.lock().unwrap();
    let err = Identity::load_or_create(&empty).err().unwrap().to_string();
    assert!(
        err.contains("another process holds the state directory"),
        "{err}"
    );
    assert!(!empty.join("key.der").exists());
    drop(held);
    assert!(Identity::load_or_create(&empty).unwrap().1);
}
