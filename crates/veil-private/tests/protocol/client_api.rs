//! The library's client and server (`veil_private::{Client, Server}`, what the `veil` command and
//! the Python package run) over TCP loopback on a tiny random model: every classification equals
//! the fixed-point simulator's (faithful truncation makes the private pass exact), by text and by
//! token ids, preprocessed or not, in plain TCP and over TLS with the server's fingerprint
//! pinned; bad inputs and another model are refused with clear errors.

use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;

use veil_core::FixedPoint;
use veil_model::FixedModel;
use veil_model::{folder, random, Inputs};
use veil_net::{Identity, ServerTls, TcpChannel};
use veil_private::DEFAULT_NTT_BUDGET_BYTES;
use veil_private::{argmax, softmax};
use veil_private::{
    Client, ClientModel, ClientOptions, ClientTransport, Input, PromptOptions, ServeOptions,
    Server, ServerModel, Transport,
};

/// A tiny random classifier of `blocks` blocks written to `dir`, and loaded.
fn tiny_model(dir: &Path, blocks: usize, seed: u8) -> folder::Model {
    random::write_tiny_classifier(dir, blocks, 2, seed).unwrap();
    folder::load(dir).unwrap()
}

fn serve(model: &folder::Model, transport: Transport) -> veil_private::RunningServer {
    let server = Arc::new(ServerModel::from_model(model, DEFAULT_NTT_BUDGET_BYTES).unwrap());
    let opts = ServeOptions::for_model(&server, transport);
    Server::new(server, opts)
        .unwrap()
        .spawn(TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap()
}

/// The simulator's probabilities for `ids` (segment ids `types`).
fn simulated(model: &folder::Model, ids: &[u32], types: &[u32]) -> Vec<f64> {
    let fp = FixedPoint::default_format();
    let fixed = FixedModel::encode(&model.transformer, fp).unwrap();
    let sim = fixed.forward(ids, types).unwrap();
    softmax(&sim.logits_f64(fp).unwrap())
}

#[test]
fn library_client_equals_the_simulator_over_loopback() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), 2, 5);
    let running = serve(&model, Transport::Plaintext);
    let texts = ["the film good", "awful film", "great great film the bad"];
    let mut client = Client::connect(
        ClientModel::open(tmp.path()).unwrap(),
        TcpChannel::connect(running.local_addr()).unwrap(),
        PromptOptions::default(),
        ClientOptions::default(),
    )
    .unwrap();
    let inputs = texts.map(Input::Text);
    let got = client.classify(&inputs).unwrap();
    assert_eq!(got.len(), texts.len());
    let tok = model.tokenizer.as_ref().unwrap();
    let mut ids = vec![];
    for (text, c) in texts.iter().zip(&got) {
        let enc = tok.encode(text, None).unwrap();
        let want = simulated(&model, &enc.ids, &enc.type_ids);
        assert_eq!(c.probabilities, want, "{text}");
        assert_eq!(c.label, argmax(&want));
        let online = c.cost.online.total();
        assert!(online.bytes_sent > 0 && online.bytes_received > 0);
        ids.push(enc.ids);
    }
    // The same prompts as token ids.
    let by_ids = client
        .classify(&ids.iter().map(|i| Input::Ids(i)).collect::<Vec<_>>())
        .unwrap();
    for (a, b) in got.iter().zip(&by_ids) {
        assert_eq!(a.probabilities, b.probabilities);
    }
    // Sentence pairs, `[CLS] a [SEP] b [SEP]` with segment ids 0 then 1.
    let pairs = [("good film", "awful film"), ("the film", "great")];
    let by_pair = client
        .classify(&pairs.map(|(a, b)| Input::Pair(a, b)))
        .unwrap();
    for ((a, b), c) in pairs.iter().zip(&by_pair) {
        let enc = tok.encode(a, Some(b)).unwrap();
        assert!(enc.type_ids.contains(&1), "{:?}", enc.type_ids);
        assert_eq!(c.probabilities, simulated(&model, &enc.ids, &enc.type_ids));
    }
    let half = client
        .classify(&[Input::Pair("good film", " ")])
        .unwrap_err()
        .to_string();
    assert!(half.contains("both sentences"), "{half}");
    // Bad inputs are refused before anything is sent, and the session goes on.
    let empty = client
        .classify(&[Input::Text("  ")])
        .unwrap_err()
        .to_string();
    assert!(empty.contains("the prompt is empty"), "{empty}");
    // A mixed batch whose last prompt is refused sends none of them.
    let revealed = client.key_revealed();
    let outside = client
        .classify(&[inputs[0], Input::Ids(&[2, 99, 3])])
        .unwrap_err()
        .to_string();
    assert!(outside.contains("beyond the vocabulary"), "{outside}");
    assert_eq!(
        client.key_revealed(),
        revealed,
        "a prompt ran before the refusal"
    );
    let again = client.classify(&inputs[..1]).unwrap();
    assert_eq!(again[0].probabilities, got[0].probabilities);
    // The client counts what its keys reveal (as the server does, which refuses past the
    // limit): the same prompt reveals as much again, and the next is known to fit.
    let before = client.key_revealed();
    assert!(before > 0);
    client.classify(&inputs[..1]).unwrap();
    let once = client.key_revealed() - before;
    assert!(once > 0);
    client.classify(&inputs[..1]).unwrap();
    assert_eq!(client.key_revealed() - before, 2 * once);
    let enc = client
        .model()
        .encode(Input::Text(texts[2]), PromptOptions::default())
        .unwrap();
    assert!(client.key_budget_fits(&enc));
    // What an inference reveals grows with its length n no faster than n² (the bound
    // `key_budget` relies on to let an unmeasured longer prompt through).
    let words = [
        "the", "film", "good", "awful", "great", "bad", "the", "film",
    ];
    let mut by_len = vec![];
    for k in 1..=words.len() {
        let before = client.key_revealed();
        let c = client
            .classify(&[Input::Text(&words[..k].join(" "))])
            .unwrap();
        let n = tok.encode(&words[..k].join(" "), None).unwrap().ids.len();
        assert!(!c.is_empty());
        by_len.push((n, client.key_revealed() - before));
    }
    for &(l, fl) in &by_len {
        for &(n, fn_) in by_len.iter().filter(|(n, _)| *n > l) {
            assert!(fl <= fn_, "{by_len:?}");
            assert!(fn_ * (l * l) as u64 <= fl * (n * n) as u64, "{by_len:?}");
        }
    }
    // Material preprocessed for the longest prompt serves a shorter one, padded up to its
    // length (the pooler head lets the client pad); the output is still the simulator's.
    let longest = ids.iter().map(Vec::len).max().unwrap();
    assert!(longest > ids[0].len());
    client.preprocess(longest).unwrap();
    let padded = client.classify(&inputs[..1]).unwrap();
    assert_eq!(padded[0].probabilities, got[0].probabilities);
    assert!(padded[0].cost.offline.is_some());
    let plain = client.classify(&inputs[..1]).unwrap();
    assert!(plain[0].cost.offline.is_none(), "the material is used once");
    client.close().unwrap();
    running.stop().unwrap();
}

#[test]
fn library_client_over_tls_pins_the_server_and_refuses_another_model() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let mut model = tiny_model(&a, 2, 7);
    // The server's folder records its inputs, the client's bundle (written before such records)
    // does not: the field is the client's own check, not part of what is compared.
    model.transformer.config.veil.inputs = Some(Inputs::Single);
    let id = Identity::generate().unwrap();
    let running = serve(&model, Transport::Tls(ServerTls::new(&id, None).unwrap()));
    let transport = ClientTransport {
        server_fingerprint: Some(id.fingerprint()),
        ..ClientTransport::default()
    };
    let addr = running.local_addr().to_string();
    let mut client = Client::connect(
        ClientModel::open(&a).unwrap(),
        transport.connect(&addr).unwrap(),
        PromptOptions::default(),
        ClientOptions::default(),
    )
    .unwrap();
    let got = client.classify(&[Input::Text("good film")]).unwrap();
    let enc = model
        .tokenizer
        .as_ref()
        .unwrap()
        .encode("good film", None)
        .unwrap();
    assert_eq!(
        got[0].probabilities,
        simulated(&model, &enc.ids, &enc.type_ids)
    );
    client.close().unwrap();

    // A bundle that records pairs connects, and refuses a single text before sending it.
    let c = tmp.path().join("c");
    std::fs::create_dir_all(&c).unwrap();
    for f in std::fs::read_dir(&a).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, c.join(f.file_name().unwrap())).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(c.join("config.json")).unwrap()).unwrap();
    config["veil"]["inputs"] = "pairs".into();
    std::fs::write(c.join("config.json"), config.to_string()).unwrap();
    let mut pairs_client = Client::connect(
        ClientModel::open(&c).unwrap(),
        transport.connect(&addr).unwrap(),
        PromptOptions::default(),
        ClientOptions::default(),
    )
    .unwrap();
    let err = pairs_client
        .classify(&[Input::Text("good film")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("sentence pairs"), "{err}");
    assert_eq!(
        pairs_client
            .classify(&[Input::Pair("good film", "bad film")])
            .unwrap()
            .len(),
        1
    );
    pairs_client.close().unwrap();

    // A bundle of another shape: refused before any key material moves.
    tiny_model(&b, 1, 1);
    let err = Client::connect(
        ClientModel::open(&b).unwrap(),
        transport.connect(&addr).unwrap(),
        PromptOptions::default(),
        ClientOptions::default(),
    )
    .err()
    .expect("another model is refused")
    .to_string();
    assert!(err.contains("differs"), "{err}");
    running.stop().unwrap();
}
