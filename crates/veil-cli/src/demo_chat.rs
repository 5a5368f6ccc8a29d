//! `veil demo --model <decoder>`: the decoder served on a thread of this process (what `veil
//! serve` runs) and one private chat turn with it over TCP loopback (TLS 1.3 with `--tls`, the
//! server's in-memory identity pinned): a question (a built-in one by default), the answer
//! printed as its tokens come, then what the set-up, the prefill and the decode steps cost
//! (with `--preprocess 1` each decode step is preprocessed just before it runs, and the decode
//! steps' bytes and time include their preprocessing).

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Instant;

use veil_core::{Error, Result};
use veil_model::decoder::sample::SamplingParams;
use veil_model::decoder::{self, ChatMessage};
use veil_model::{DecoderFormat, DecoderTables, FixedDecoder, GenerateOptions};
use veil_net::{LabelStats, Role};
use veil_private::{
    ClientTables, ClientTransport, GenerationClient, ServerBuilder, ServerDecoder, ServerIdentity,
};

/// Asked when the command line gives no question. The in-process server runs the decoders'
/// default faithful truncations, so the answer is the simulator's ("The capital of Germany is
/// Berlin.", no near-tie: its smallest top-two logit margin is 0.59).
const QUESTION: &str = "What is the capital of Germany?";
/// The answer's most tokens (the built-in question's answer is one short sentence).
const MAX_NEW_TOKENS: usize = 24;

pub(crate) fn run(
    model: &str,
    question: Option<String>,
    tls: bool,
    preprocess: bool,
) -> Result<()> {
    let question = question.unwrap_or_else(|| QUESTION.into());
    let m = decoder::load(model)?;
    let ids = match m.tokenizer.has_chat_template() {
        true => m.chat_prompt(&[ChatMessage::new("user", &question)])?,
        false => m.tokenizer.encode(&question)?,
    };
    if ids.is_empty() {
        return Err(Error::InvalidArgument("an empty question".into()));
    }
    let context = ids.len() + MAX_NEW_TOKENS - 1;
    let tables = DecoderTables::of_weights(&m.weights, DecoderFormat::default())?;
    let fixed = FixedDecoder::encode(&m.weights, DecoderFormat::default())?;
    let identity = match tls {
        true => ServerIdentity::Ephemeral,
        false => ServerIdentity::Plaintext,
    };
    let server = ServerBuilder::new(identity)
        .build_decoder(Arc::new(ServerDecoder::new(fixed)?))?
        .spawn(TcpListener::bind("127.0.0.1:0")?)?;
    let transport = ClientTransport {
        server_fingerprint: server.fingerprint(),
        insecure_plaintext: !tls,
        ..ClientTransport::default()
    };
    let over = if tls {
        "TLS 1.3 on TCP loopback"
    } else {
        "TCP loopback"
    };
    eprintln!(
        "veil demo: {model}, {} blocks, privately over {over}; {} prompt tokens (the chat \
         template around the question), at most {MAX_NEW_TOKENS} new ones{}.",
        m.weights.config.layers,
        ids.len(),
        match preprocess {
            true => ", each decode step preprocessed just before it runs",
            false => "",
        }
    );
    println!("question: {question}");
    let start = Instant::now();
    let mut client = GenerationClient::connect(
        transport.connect(&server.local_addr().to_string())?,
        ClientTables::Open(&tables),
        context,
        None,
    )?;
    let setup = (
        start.elapsed().as_secs_f64(),
        client.channel().meter().total(),
    );
    client.channel().meter().reset();
    client.set_preprocessing(preprocess);
    let opts = GenerateOptions {
        max_new_tokens: MAX_NEW_TOKENS,
        sampling: SamplingParams::GREEDY,
        stop: m.weights.config.eos_token_ids.clone(),
        fixed_length: false,
        pad_to: None,
    };
    print!("answer: ");
    let mut g = client.start(context)?;
    let (tokens, _, (prefill, decode)) =
        crate::generate_cmd::stream_timed(&mut g, &m.tokenizer, &ids, &opts, false)?;
    g.end()?;
    println!();
    let total = prefill + decode;
    let cost = client.channel().meter().total();
    client.close()?;
    server.stop()?;
    let mb = |s: &LabelStats| {
        format!(
            "{:.1} MB to the server, {:.1} MB back, {} flights",
            s.client_to_server(Role::Client) as f64 / 1e6,
            s.server_to_client(Role::Client) as f64 / 1e6,
            s.rounds()
        )
    };
    println!("set-up: {:.2} s, {}", setup.0, mb(&setup.1));
    println!(
        "generation: {} prompt tokens and {} new ones in {total:.1} s (prefill and the first \
         token {prefill:.1} s, then {:.1} s per token), {}",
        ids.len(),
        tokens.len(),
        decode / tokens.len().saturating_sub(1).max(1) as f64,
        mb(&cost)
    );
    Ok(())
}
