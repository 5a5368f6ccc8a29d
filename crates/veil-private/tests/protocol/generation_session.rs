//! Private generation over a session (`serve_generation` / `GenerationClient`) on a tiny random
//! Llama decoder at the shipped format (ℓ = 48, f = 13), each session's server on its own
//! thread over an in-memory channel, all sharing one model and one memory pool: greedy tokens
//! and logits equal the simulator's (faithful truncations, the decoders' default), twice in one
//! session, and the tokens in the 1-bit-error mode on this model; a context above the session's cap, a zero
//! limit, a stranger's
//! hello, a step without a generation, of no tokens or beyond the limit, and a server with other
//! tables are refused with errors naming them, and the next session is served; the memory a
//! generation reserved is given back however it ended (a disconnect mid-generation too).

use std::sync::Arc;
use std::thread::JoinHandle;

use veil_core::{Error, Result};
use veil_model::decoder::random::{write_tiny_llama, TinyShape};
use veil_model::decoder::sample::SamplingParams;
use veil_model::decoder::{self, DecoderWeights};
use veil_model::engine::decoder::LogitRows;
use veil_model::ProductTruncation;
use veil_model::{generate, DecoderFormat, DecoderTables, FixedDecoder, GenerateOptions};
use veil_net::{mem_pair, MemChannel};
use veil_private::protocol::{DecoderAdmission, GenerateReply, GenerationRequest, Message};
use veil_private::{
    plan_step, serve_generation, step_bytes, step_material_bytes, ClientTables, Generation,
    GenerationClient, GenerationOptions, ServerBuilder, ServerDecoder, ServerIdentity,
    SessionMemoryPool,
};

const PROMPT: [u32; 5] = [1, 40, 77, 120, 5];
const NEW_TOKENS: usize = 8;
/// Every session's cap: the prompt and its new tokens, plus room for the second prompt.
const CAP: usize = 20;

fn tiny(seed: u8) -> DecoderWeights {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), seed, &TinyShape::default()).unwrap();
    decoder::load(dir.path().to_str().unwrap()).unwrap().weights
}

/// The client's tables from the public matrices alone.
fn tables(w: &DecoderWeights) -> DecoderTables {
    DecoderTables::of_weights(w, DecoderFormat::default()).unwrap()
}

struct Served {
    model: Arc<ServerDecoder>,
    pool: Arc<SessionMemoryPool>,
}

impl Served {
    fn new(w: &DecoderWeights) -> Self {
        let fixed = FixedDecoder::encode(w, DecoderFormat::default()).unwrap();
        Served {
            model: Arc::new(ServerDecoder::new(fixed).unwrap()),
            pool: Arc::new(SessionMemoryPool::new(1 << 30)),
        }
    }

    /// A session served on its own thread with faithful truncations: the client's end and
    /// the server's outcome.
    fn session(&self) -> (MemChannel, JoinHandle<Result<()>>) {
        self.session_in(ProductTruncation::Faithful)
    }

    fn session_in(&self, truncation: ProductTruncation) -> (MemChannel, JoinHandle<Result<()>>) {
        let (client, server) = mem_pair();
        let (model, pool) = (self.model.clone(), self.pool.clone());
        let opts = GenerationOptions {
            truncation,
            ..GenerationOptions::default()
        };
        let h = std::thread::spawn(move || serve_generation(server, &model, &opts, &pool));
        (client, h)
    }
}

fn greedy() -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: NEW_TOKENS,
        sampling: SamplingParams::GREEDY,
        stop: Vec::new(),
        fixed_length: false,
        pad_to: None,
    }
}

fn simulated(fixed: &FixedDecoder, prompt: &[u32]) -> Vec<u32> {
    let (toks, _) = generate(&mut fixed.session(), prompt, &greedy(), |_| Ok(())).unwrap();
    toks.iter().map(|t| t.id).collect()
}

#[test]
fn private_generation_equals_the_simulator_twice_in_one_session() {
    let w = tiny(3);
    let served = Served::new(&w);
    let tables = tables(&w);
    let (ch, server) = served.session();
    let mut client = GenerationClient::connect(ch, ClientTables::Open(&tables), CAP, None).unwrap();
    assert_eq!(client.truncation(), ProductTruncation::Faithful);
    let cfg = served.model.config().clone();
    let fixed = served.model.fixed();
    for prompt in [&PROMPT[..], &[9, 8, 7][..]] {
        let limit = prompt.len() + NEW_TOKENS - 1;
        let reserved = (Generation::cache_bytes(&cfg, limit) + step_bytes(&cfg, limit)) as u64;
        let pool = served.pool.clone();
        let (toks, stopped) = client
            .generate(prompt, &greedy(), |_| {
                // The server reserved the cache and a step before the first step ran.
                assert_eq!(pool.in_use(), reserved);
                Ok(())
            })
            .unwrap();
        assert!(!stopped);
        let ids: Vec<u32> = toks.iter().map(|t| t.id).collect();
        assert_eq!(ids, simulated(fixed, prompt), "prompt {prompt:?}");
    }
    logits_equal_the_simulator(&mut client, fixed);
    client.close().unwrap();
    server.join().unwrap().unwrap();
    assert_eq!(served.pool.in_use(), 0, "memory not given back");
}

/// Private tables over a session (`ServerDecoder::keep_tables_private`): the server announces
/// its shape's digest, a client holding only the configuration gets the simulator's tokens
/// (preprocessing asked for, the steps run single-phase: no material is requested), the server
/// reserves a prompt lookup's copy of the token table with the cache; a client with the open
/// tables, or with another configuration, is refused before any key moves, as is a client
/// without tables against a server whose tables are public.
#[test]
fn private_tables_generate_over_a_session() {
    let w = tiny(5);
    let fixed = FixedDecoder::encode(&w, DecoderFormat::default()).unwrap();
    let private = ServerDecoder::new(fixed.clone())
        .unwrap()
        .keep_tables_private()
        .unwrap();
    let table_bytes = private.prompt_lookup_bytes();
    assert_eq!(table_bytes, w.config.vocab_size * w.config.hidden * 8);
    let served = Served {
        model: Arc::new(private),
        pool: Arc::new(SessionMemoryPool::new(1 << 30)),
    };
    let cfg = w.config.clone();
    let format = DecoderFormat::default();
    let (ch, server) = served.session();
    let mut client =
        GenerationClient::connect(ch, ClientTables::Private(&cfg, format), CAP, None).unwrap();
    client.set_preprocessing(true);
    let limit = PROMPT.len() + NEW_TOKENS - 1;
    let reserved =
        (Generation::cache_bytes(&cfg, limit) + step_bytes(&cfg, limit) + table_bytes) as u64;
    let pool = served.pool.clone();
    let (toks, _) = client
        .generate(&PROMPT, &greedy(), |_| {
            assert_eq!(
                pool.in_use(),
                reserved,
                "no material held beside the generation"
            );
            Ok(())
        })
        .unwrap();
    let ids: Vec<u32> = toks.iter().map(|t| t.id).collect();
    assert_eq!(ids, simulated(&fixed, &PROMPT));
    client.close().unwrap();
    server.join().unwrap().unwrap();
    assert_eq!(served.pool.in_use(), 0, "memory not given back");

    let open = tables(&w);
    let e = refused(&served, ClientTables::Open(&open));
    assert!(
        e.contains("private") && e.contains("--private-tables"),
        "{e}"
    );
    let mut other = cfg.clone();
    other.norm_eps *= 2.0;
    let e = refused(&served, ClientTables::Private(&other, format));
    assert!(e.contains("shape digest"), "{e}");
    let e = refused(&Served::new(&w), ClientTables::Private(&cfg, format));
    assert!(e.contains("tables are public"), "{e}");
}

/// Why a client holding `tables` is refused by a session of `served` (before any key moves;
/// the server's end joined).
fn refused(served: &Served, tables: ClientTables<'_>) -> String {
    let (ch, server) = served.session();
    let e = GenerationClient::connect(ch, tables, CAP, None)
        .err()
        .unwrap()
        .to_string();
    let _ = server.join().unwrap();
    e
}

/// `pad_to` over a session: the server reserves (and runs) the padded length, the tokens
/// equal the simulator's padded generation; a prompt longer than `pad_to` is refused before
/// anything is sent and the session goes on.
#[test]
fn a_padded_prompt_hides_its_length_over_a_session() {
    const PAD_TO: usize = 9;
    let w = tiny(3);
    let served = Served::new(&w);
    let (ch, server) = served.session();
    let tables = tables(&w);
    let mut client = GenerationClient::connect(ch, ClientTables::Open(&tables), CAP, None).unwrap();
    let cfg = served.model.config().clone();
    let opts = GenerateOptions {
        pad_to: Some(PAD_TO),
        ..greedy()
    };
    let limit = PAD_TO + NEW_TOKENS - 1;
    let reserved = (Generation::cache_bytes(&cfg, limit) + step_bytes(&cfg, limit)) as u64;
    let pool = served.pool.clone();
    let (toks, _) = client
        .generate(&PROMPT, &opts, |_| {
            assert_eq!(
                pool.in_use(),
                reserved,
                "the server reserved the padded length"
            );
            Ok(())
        })
        .unwrap();
    let fixed = served.model.fixed();
    let (want, _) = generate(&mut fixed.session(), &PROMPT, &opts, |_| Ok(())).unwrap();
    assert_eq!(toks, want);
    let long = [3u32; PAD_TO + 1];
    let e = client.generate(&long, &opts, |_| Ok(())).unwrap_err();
    assert!(e.to_string().contains("more than"), "{e}");
    let (again, _) = client.generate(&PROMPT, &opts, |_| Ok(())).unwrap();
    assert_eq!(again, want);
    client.close().unwrap();
    server.join().unwrap().unwrap();
    assert_eq!(served.pool.in_use(), 0, "memory not given back");
}

/// A decoder with substituted operators over a session: block 0 with ReLU and ReLU-normalise,
/// block 1 with both norms x·γ. The greedy tokens and a prefill's and a decode step's logits
/// equal the simulator's; a client holding the original model's tables (the same matrices,
/// the operators not substituted) is refused at admission, since the tables' digest covers
/// the configuration and its variants: the parties cannot run different operators.
#[test]
fn substituted_decoder_generation_over_a_session_equals_the_simulator() {
    use veil_model::decoder::DecoderBlockVariant;
    let original = tiny(11);
    let mut w = original.clone();
    w.config.variants = vec![DecoderBlockVariant::FRIENDLY, DecoderBlockVariant::SCALED];
    let served = Served::new(&w);
    let (ch, server) = served.session();
    let e = GenerationClient::connect(ch, ClientTables::Open(&tables(&original)), CAP, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("digest"), "{e}");
    let _ = server.join().unwrap();

    let substituted = tables(&w);
    let (ch, server) = served.session();
    let mut client =
        GenerationClient::connect(ch, ClientTables::Open(&substituted), CAP, None).unwrap();
    let fixed = served.model.fixed();
    let (toks, _) = client.generate(&PROMPT, &greedy(), |_| Ok(())).unwrap();
    let ids: Vec<u32> = toks.iter().map(|t| t.id).collect();
    assert_eq!(ids, simulated(fixed, &PROMPT));
    let warnings = logits_equal_the_simulator(&mut client, fixed);
    assert!(warnings.is_empty(), "{warnings:?}");
    client.close().unwrap();
    server.join().unwrap().unwrap();
    assert_eq!(served.pool.in_use(), 0, "memory not given back");
}

/// The logits themselves, integer for integer, over a prefill and a decode step of one
/// generation; returns the simulator's warnings.
fn logits_equal_the_simulator(
    client: &mut GenerationClient<'_, MemChannel>,
    fixed: &FixedDecoder,
) -> Vec<String> {
    let mut sim = fixed.session();
    let mut g = client.start(PROMPT.len() + 1).unwrap();
    for ids in [&PROMPT[..], &[42][..]] {
        let want = sim.step(ids, LogitRows::Last).unwrap().into_data();
        assert!(
            g.step(ids).unwrap().into_data() == want,
            "logits of {ids:?}"
        );
    }
    g.end().unwrap();
    sim.warnings()
}

/// Sends `req` as a misbehaving client would, past the client's own checks.
fn send_raw(client: &mut GenerationClient<'_, MemChannel>, req: GenerationRequest) {
    use veil_net::Channel;
    let ch = client.channel();
    req.send(ch).unwrap();
    ch.flush().unwrap();
}

/// The reason the server's close gave the client (`Error::PeerClosed`) at its next receive.
fn told(client: &mut GenerationClient<'_, MemChannel>) -> String {
    use veil_net::Channel;
    match client.channel().recv_msg(1 << 10) {
        Err(Error::PeerClosed(why)) => why,
        other => panic!("the session ended without a reason: {other:?}"),
    }
}

fn server_error(h: JoinHandle<Result<()>>) -> String {
    match h.join().unwrap() {
        Err(e) => e.to_string(),
        Ok(()) => panic!("the server ended the session without an error"),
    }
}

#[test]
fn bad_requests_are_refused_and_the_next_session_is_served() {
    let w = tiny(5);
    let served = Served::new(&w);
    let tables = tables(&w);

    // A limit above the session's cap, then 0: refused, the session goes on; then a step
    // without a generation ends it, naming why.
    let (ch, server) = served.session();
    let mut client = GenerationClient::connect(ch, ClientTables::Open(&tables), CAP, None).unwrap();
    let e = client.start(CAP + 1).err().unwrap();
    assert!(e.to_string().contains("this session takes 1..=20"), "{e}");
    send_raw(
        &mut client,
        GenerationRequest::GenerateStart { context_limit: 0 },
    );
    match GenerateReply::recv(client.channel()).unwrap() {
        GenerateReply::Refused(why) => assert!(why.contains("limit of 0"), "{why}"),
        GenerateReply::Accepted => panic!("a limit of 0 was accepted"),
    }
    let g = client.start(4).unwrap();
    assert_eq!(g.positions(), 0);
    g.end().unwrap();
    send_raw(&mut client, GenerationRequest::Step { tokens: 1 });
    let e = server_error(server);
    assert!(e.contains("without a generation"), "{e}");
    assert_eq!(served.pool.in_use(), 0);

    // A step beyond the limit: the server ends the session and gives the memory back.
    let (ch, server) = served.session();
    let mut client = GenerationClient::connect(ch, ClientTables::Open(&tables), CAP, None).unwrap();
    let mut g = client.start(6).unwrap();
    let local = g.step(&[1; 7]).err().unwrap();
    assert!(matches!(local, Error::Refused(_)), "{local}");
    drop(g);
    send_raw(&mut client, GenerationRequest::Step { tokens: u32::MAX });
    let e = server_error(server);
    assert!(e.contains("context limit of 6"), "{e}");
    assert!(told(&mut client).contains("context limit of 6"));
    assert_eq!(served.pool.in_use(), 0);

    // A stranger's first message is answered with a refusal naming it.
    let (mut ch, server) = served.session();
    {
        use veil_net::Channel;
        ch.send_msg(b"GET / HTTP/1.1").unwrap();
        ch.flush().unwrap();
    }
    match DecoderAdmission::recv(&mut ch).unwrap() {
        DecoderAdmission::Refused(why) => assert!(why.contains("not a Veil client"), "{why}"),
        other => panic!("a stranger was admitted: {other:?}"),
    }
    assert!(server_error(server).contains("not a Veil client"));

    // A step of no tokens ends the session, naming it.
    let (ch, server) = served.session();
    let mut client = GenerationClient::connect(ch, ClientTables::Open(&tables), CAP, None).unwrap();
    let g = client.start(3).unwrap();
    drop(g);
    send_raw(&mut client, GenerationRequest::Step { tokens: 0 });
    let e = server_error(server);
    assert!(e.contains("no tokens to run"), "{e}");
    // The session runs in records: the client hears why it was ended, as the client's fault.
    let told = told(&mut client);
    assert!(
        told.contains("no tokens to run") && !told.contains("its side"),
        "{told}"
    );
    assert_eq!(served.pool.in_use(), 0);

    // A client with another model's tables refuses before any key moves, naming the digests.
    let other = tables_of_another_model();
    let e = refused(&served, ClientTables::Open(&other));
    assert!(
        e.contains("digest") && e.contains("not this client's"),
        "{e}"
    );

    // The model and the pool still serve: the next session's tokens equal the simulator's.
    let (ch, server) = served.session();
    let mut client = GenerationClient::connect(ch, ClientTables::Open(&tables), CAP, None).unwrap();
    let (toks, _) = client.generate(&PROMPT, &greedy(), |_| Ok(())).unwrap();
    let ids: Vec<u32> = toks.iter().map(|t| t.id).collect();
    assert_eq!(ids, simulated(served.model.fixed(), &PROMPT));
    // A disconnect mid-generation gives the memory back too.
    let mut g = client.start(CAP).unwrap();
    g.step(&PROMPT).unwrap();
    drop(g);
    drop(client);
    server.join().unwrap().unwrap();
    assert_eq!(served.pool.in_use(), 0);
}

fn tables_of_another_model() -> DecoderTables {
    tables(&tiny(6))
}

/// The 1-bit-error truncations (`veil serve --truncation one-bit-error`; decoders default to
/// faithful ones), announced by the server and followed by the client:
/// the greedy tokens are the simulator's on this tiny model (its top-2 margins are far wider
/// than the mode's bound, `decoder_party.rs`'s `ONE_BIT_ERROR_BOUND`).
#[test]
fn the_default_mode_is_announced_and_gives_the_simulators_tokens() {
    let w = tiny(7);
    let served = Served::new(&w);
    let tables = tables(&w);
    let (ch, server) = served.session_in(ProductTruncation::OneBitError);
    let mut client = GenerationClient::connect(ch, ClientTables::Open(&tables), CAP, None).unwrap();
    assert_eq!(client.truncation(), ProductTruncation::OneBitError);
    let (toks, _) = client.generate(&PROMPT, &greedy(), |_| Ok(())).unwrap();
    let ids: Vec<u32> = toks.iter().map(|t| t.id).collect();
    let margins: Vec<f32> = toks.iter().map(|t| t.margin).collect();
    assert_eq!(
        ids,
        simulated(served.model.fixed(), &PROMPT),
        "margins {margins:?}"
    );
    client.close().unwrap();
    server.join().unwrap().unwrap();
    assert_eq!(served.pool.in_use(), 0);
}

/// Preprocessing between tokens over a session (`GenerationClient::set_preprocessing`): the
/// greedy tokens equal the simulator's; a prefill, then a decode step preprocessed by hand
/// (`PrivateGeneration::preprocess_next`), give the simulator's logits bit for bit, the
/// material's memory held on the server between the two and given back by the step; a second
/// preprocessing for the same step replaces the first.
#[test]
fn preprocessed_generation_over_a_session_equals_the_simulator() {
    let w = tiny(3);
    let served = Served::new(&w);
    let tables = tables(&w);
    let (ch, server) = served.session();
    let mut client = GenerationClient::connect(ch, ClientTables::Open(&tables), CAP, None).unwrap();
    client.set_preprocessing(true);
    let fixed = served.model.fixed();
    let (toks, _) = client.generate(&PROMPT, &greedy(), |_| Ok(())).unwrap();
    let ids: Vec<u32> = toks.iter().map(|t| t.id).collect();
    assert_eq!(ids, simulated(fixed, &PROMPT));

    let cfg = served.model.config().clone();
    let limit = PROMPT.len() + 2;
    let reserved = (Generation::cache_bytes(&cfg, limit) + step_bytes(&cfg, limit)) as u64;
    let mut sim = fixed.session();
    let mut g = client.start(limit).unwrap();
    let want = sim.step(&PROMPT, LogitRows::Last).unwrap().into_data();
    assert!(g.step(&PROMPT).unwrap().into_data() == want, "prefill");
    assert_eq!(served.pool.in_use(), reserved);
    assert!(g.preprocess_next().unwrap());
    assert!(g.preprocess_next().unwrap());
    let held = served.pool.in_use() - reserved;
    // The material and, after the prefill too, the pools' fill for the step (their COTs built
    // ahead) are counted.
    let ring = fixed.fp().ring;
    let plan = plan_step(&cfg, ring, PROMPT.len(), 1).unwrap();
    let material = step_material_bytes(&cfg, &plan, false).unwrap() as u64;
    assert!(
        held > material,
        "the pools' fill is not counted: {held} B held"
    );
    for id in [42, 17] {
        let want = sim.step(&[id], LogitRows::Last).unwrap().into_data();
        assert!(g.step(&[id]).unwrap().into_data() == want, "step {id}");
        // The server gives the material's memory back when its side of the step ends, which
        // may be just after the client has its logits.
        assert_eq!(
            settled_in_use(&served.pool, reserved),
            reserved,
            "material not given back"
        );
        // The context has room for one more step after 42, none after 17.
        assert_eq!(g.preprocess_next().unwrap(), id == 42);
    }
    g.end().unwrap();
    client.close().unwrap();
    server.join().unwrap().unwrap();
    assert_eq!(served.pool.in_use(), 0, "memory not given back");
}

/// A client that disconnects between preprocessing and its step: the server ends the session
/// cleanly, gives the cache's and the material's memory back, and serves the next session.
/// A server whose memory cannot hold the material refuses it and the step runs single-phase;
/// a preprocessed step with no material ends the session, naming why.
#[test]
fn preprocessing_sessions_refuse_cleanly_and_give_memory_back() {
    let w = tiny(5);
    let served = Served::new(&w);
    let tables = tables(&w);
    let fixed = served.model.fixed();

    let (ch, server) = served.session();
    let mut client = GenerationClient::connect(ch, ClientTables::Open(&tables), CAP, None).unwrap();
    client.set_preprocessing(true);
    let mut g = client.start(CAP).unwrap();
    g.step(&PROMPT).unwrap();
    assert!(g.preprocess_next().unwrap());
    drop(g);
    drop(client);
    server.join().unwrap().unwrap();
    assert_eq!(served.pool.in_use(), 0);

    // The next session is served, preprocessed.
    let (ch, server) = served.session();
    let mut client = GenerationClient::connect(ch, ClientTables::Open(&tables), CAP, None).unwrap();
    client.set_preprocessing(true);
    let (toks, _) = client.generate(&PROMPT, &greedy(), |_| Ok(())).unwrap();
    let ids: Vec<u32> = toks.iter().map(|t| t.id).collect();
    assert_eq!(ids, simulated(fixed, &PROMPT));
    // A preprocessed step without material, past the client's own checks.
    let g = client.start(CAP).unwrap();
    drop(g);
    send_raw(
        &mut client,
        GenerationRequest::PreprocessedStep { tokens: 1 },
    );
    let e = server_error(server);
    assert!(e.contains("without preprocessed material"), "{e}");
    assert!(told(&mut client).contains("without preprocessed material"));
    assert_eq!(served.pool.in_use(), 0);

    // Memory for the cache and a step, none for material: refused, the steps run single-phase.
    let cfg = served.model.config().clone();
    let limit = PROMPT.len() + 1;
    let reserved = (Generation::cache_bytes(&cfg, limit) + step_bytes(&cfg, limit)) as u64;
    let tight = Served {
        model: served.model.clone(),
        pool: Arc::new(SessionMemoryPool::new(reserved)),
    };
    let (ch, server) = tight.session();
    let mut client = GenerationClient::connect(ch, ClientTables::Open(&tables), CAP, None).unwrap();
    client.set_preprocessing(true);
    let mut sim = fixed.session();
    let mut g = client.start(limit).unwrap();
    g.step(&PROMPT).unwrap();
    sim.step(&PROMPT, LogitRows::Last).unwrap();
    assert!(!g.preprocess_next().unwrap(), "material beyond the budget");
    let want = sim.step(&[42], LogitRows::Last).unwrap().into_data();
    assert!(g.step(&[42]).unwrap().into_data() == want);
    g.end().unwrap();
    client.close().unwrap();
    server.join().unwrap().unwrap();
    assert_eq!(tight.pool.in_use(), 0);
}

/// The pool's memory in use once it reaches `want` or five seconds have passed (what it is then).
fn settled_in_use(pool: &SessionMemoryPool, want: u64) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while pool.in_use() != want && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    pool.in_use()
}

/// A builder setting that the prepared decoder contradicts (its truncation, private tables) is
/// refused by `build_decoder`, not ignored; the matching setting builds.
#[test]
fn decoder_settings_the_prepared_model_contradicts_are_refused() {
    let w = tiny(7);
    let fixed = FixedDecoder::encode(&w, DecoderFormat::default()).unwrap();
    let model = Arc::new(ServerDecoder::new(fixed).unwrap());
    let build = |b: ServerBuilder| b.build_decoder(model.clone()).map(|_| ());
    let plain = || ServerBuilder::new(ServerIdentity::Plaintext);
    let other = match model.truncation() {
        ProductTruncation::Faithful => ProductTruncation::OneBitError,
        ProductTruncation::OneBitError => ProductTruncation::Faithful,
    };
    let e = build(plain().decoder_truncation(other))
        .unwrap_err()
        .to_string();
    assert!(e.contains("with_truncation"), "{e}");
    let e = build(plain().private_tables(true)).unwrap_err().to_string();
    assert!(e.contains("keep_tables_private"), "{e}");
    build(plain().decoder_truncation(model.truncation())).unwrap();
}
