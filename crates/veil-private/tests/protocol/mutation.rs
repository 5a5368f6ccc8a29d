//! Property-based mutation of valid transcripts: a whole session (handshake, key set-up, base
//! OTs, silent-COT bootstrap, one inference, goodbye) is recorded in both directions, then one
//! direction is mutated (bit flips, truncations, splices of another part of the transcript,
//! inserted bytes) and replayed to a fresh server or client. Every message decoder on the way
//! must return a clean error or carry on: never panic. The handshake messages get many cheap
//! cases; whole transcripts fewer, as each replay runs a session's computation.
//! Coverage-guided fuzzing of the same decoders runs with cargo-afl on the stable toolchain
//! (`fuzz/`, see its README).

use std::sync::OnceLock;

use proptest::prelude::*;
use veil_core::{FixedPoint, RingTensor};
use veil_model::random::random_transformer_with_std;
use veil_model::FixedModel;
use veil_model::{BlockVariant, ModelConfig};
use veil_net::{run_two_party, Recording, Replay};
use veil_private::protocol::{
    session_format, Admission, Announced, EmbeddingLookup, Hello, Message, OutputShare, PoolFill,
    PreprocessReply, Request,
};
use veil_private::{serve_session, ClientConnection, ClientOptions, Cuts, ServerModel};

struct Fixture {
    server: ServerModel,
    x: RingTensor,
    to_server: Vec<u8>,
    to_client: Vec<u8>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let mut cfg = ModelConfig::builder(veil_model::Architecture::Bert)
            .vocab(40)
            .layers(1)
            .build()
            .unwrap();
        cfg.veil.blocks = vec![BlockVariant::friendly()];
        let t = random_transformer_with_std(&cfg, [17; 16], 0.2).unwrap();
        let fixed = FixedModel::encode(&t, FixedPoint::default_format()).unwrap();
        let server = ServerModel::new(fixed.clone()).unwrap();
        let x = fixed.embed(&[3, 1, 4], &[0; 3]).unwrap().0;
        let ((to_server, to_client), ()) = run_two_party(
            |ch| {
                let mut rec = Recording::new(ch);
                let mut c = ClientConnection::connect(&mut rec, 16)?;
                c.infer(&x, None)?;
                c.close()?;
                Ok((rec.sent, rec.received))
            },
            |ch| serve_session(ch, &server),
        )
        .unwrap();
        Fixture {
            server,
            x,
            to_server,
            to_client,
        }
    })
}

/// One mutation of a byte string; positions are fractions of its length.
#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: f64, bit: u8 },
    Truncate { at: f64 },
    Splice { from: f64, to: f64, len: usize },
    Insert { at: f64, bytes: Vec<u8> },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (0.0..1.0f64, 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        1 => (0.0..1.0f64).prop_map(|at| Mutation::Truncate { at }),
        2 => (0.0..1.0f64, 0.0..1.0f64, 1usize..64)
            .prop_map(|(from, to, len)| Mutation::Splice { from, to, len }),
        1 => (0.0..1.0f64, proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
    ]
}

/// Applies `m` within the first `window` bytes of `data`.
fn apply(data: &[u8], m: &Mutation, window: usize) -> Vec<u8> {
    let mut d = data.to_vec();
    let w = window.min(d.len()).max(1);
    let at = |f: f64| ((f * w as f64) as usize).min(w - 1);
    match m {
        Mutation::Flip { at: f, bit } => d[at(*f)] ^= 1 << bit,
        Mutation::Truncate { at: f } => d.truncate(at(*f)),
        Mutation::Splice { from, to, len } => {
            let (from, to) = (at(*from), at(*to));
            let len = (*len).min(d.len() - from).min(d.len() - to);
            let chunk = d[from..from + len].to_vec();
            d[to..to + len].copy_from_slice(&chunk);
        }
        Mutation::Insert { at: f, bytes } => {
            let i = at(*f);
            d.splice(i..i, bytes.iter().copied());
        }
    }
    d
}

fn serve_replay(input: Vec<u8>) -> veil_core::Result<()> {
    serve_session(Replay::new(input), &fixture().server)
}

fn client_replay(input: Vec<u8>) -> veil_core::Result<()> {
    let mut c = ClientConnection::connect(Replay::new(input), 3)?;
    c.infer(&fixture().x, None)?;
    c.close()
}

/// The harness itself: unmutated transcripts replay to the end.
#[test]
fn unmutated_transcripts_replay_cleanly() {
    let f = fixture();
    serve_replay(f.to_server.clone()).unwrap();
    client_replay(f.to_client.clone()).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The server's first message decoder (the hello), mutated anywhere.
    #[test]
    fn mutated_hellos_are_clean_errors(m in mutation()) {
        let hello = &fixture().to_server[..16];
        let _ = Hello::recv(&mut Replay::new(apply(hello, &m, 16)));
    }

    /// The client's handshake (the server's answer, its configuration), mutated in its first
    /// kilobytes; the check stops before the key set-up.
    #[test]
    fn mutated_server_answers_are_clean_errors(m in mutation()) {
        let answer = apply(&fixture().to_client, &m, 2048);
        let _ = ClientConnection::connect_with(
            Replay::new(answer),
            ClientOptions { max_tokens: Some(3), ..ClientOptions::default() },
            |_| Err(veil_core::Error::Other("stop before set-up".into())),
        );
    }
}

/// Decodes `bytes` as `M`; what decodes must encode back to the same bytes (one encoding per
/// message).
fn canonical<M: Message>(bytes: &[u8]) {
    if let Ok(msg) = M::decode(bytes) {
        assert_eq!(msg.encode(), bytes);
    }
}

/// One valid message of each type.
fn valid_messages() -> Vec<Vec<u8>> {
    let cfg = fixture().server.config().announced();
    vec![
        Hello { max_tokens: 3 }.encode(),
        Admission::Admitted(Announced {
            config: cfg.clone(),
            bundle: None,
            activation_bits: None,
            cuts: Cuts::Kept,
        })
        .encode(),
        Admission::Admitted(Announced {
            config: cfg,
            bundle: Some(veil_model::BundleDigest([7; 32])),
            activation_bits: Some(20),
            cuts: Cuts::PerLength,
        })
        .encode(),
        Admission::Refused("busy".into()).encode(),
        EmbeddingLookup(veil_linear::LookupMethod::Batched).encode(),
        Request::Goodbye.encode(),
        Request::Infer {
            tokens: 3,
            preprocessed: true,
        }
        .encode(),
        Request::Preprocess { tokens: 3 }.encode(),
        PreprocessReply::Accepted(PoolFill {
            ready: (1000, 300),
            built: 300,
        })
        .encode(),
        PreprocessReply::Refused("over budget".into()).encode(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every session message's decoder on every valid message of any type, mutated: a clean
    /// error or a message that encodes back to the same bytes, never a panic.
    #[test]
    fn mutated_messages_decode_cleanly_or_canonically(m in mutation(), which in 0usize..10) {
        let bytes = apply(&valid_messages()[which], &m, 64);
        canonical::<Hello>(&bytes);
        canonical::<EmbeddingLookup>(&bytes);
        canonical::<Request>(&bytes);
        canonical::<PreprocessReply>(&bytes);
        if let Ok(a) = Admission::decode(&bytes) {
            assert_eq!(Admission::decode(&a.encode()).unwrap(), a);
        }
        let ring = session_format().ring;
        let count = bytes.len() / ring.byte_len();
        if let Ok(share) = OutputShare::decode(&bytes, ring, count) {
            assert_eq!(share.encode(ring), bytes);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Whole client → server transcripts (keys, OT messages, requests, shares), mutated.
    #[test]
    fn mutated_client_transcripts_never_panic_the_server(m in mutation()) {
        let f = fixture();
        let _ = serve_replay(apply(&f.to_server, &m, f.to_server.len()));
    }

    /// Whole server → client transcripts, mutated.
    #[test]
    fn mutated_server_transcripts_never_panic_the_client(m in mutation()) {
        let f = fixture();
        let _ = client_replay(apply(&f.to_client, &m, f.to_client.len()));
    }
}

/// The fuzzers' seeds (`fuzz/seeds`: a length-prefixed hello, then the session's bytes) start
/// with a hello of this protocol version, so that they reach past the version check.
#[test]
fn fuzz_seeds_speak_this_version() {
    for seed in [
        include_bytes!("../../../../fuzz/seeds/hello/hello").as_slice(),
        include_bytes!("../../../../fuzz/seeds/session/hello_then_bye").as_slice(),
    ] {
        let (len, rest) = seed.split_at(4);
        let len = u32::from_le_bytes(len.try_into().unwrap()) as usize;
        assert_eq!(
            Hello::decode(&rest[..len]).unwrap(),
            Hello { max_tokens: 16 }
        );
    }
}
