//! A client bundle that is not what the server exports is refused before any key material moves,
//! with both digests and the bundle's path named: a tampered table (caught at load by the
//! manifest, or, with the manifest rewritten too, by the server's digest), a stale bundle after
//! the server's model changed, a missing file. Loopback, plain TCP.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use veil_model::{folder, manifest, random, Model};
use veil_model::{save_bundle, BundleDigest, MANIFEST_FILE, TABLES_FILE};
use veil_net::{Channel, TcpChannel};
use veil_private::protocol::{Admission, Announced, Hello, Message};
use veil_private::{
    Client, ClientModel, ClientOptions, Cuts, Input, PromptOptions, RunningServer, ServerBuilder,
    ServerIdentity,
};

fn model(dir: &Path, seed: u8) -> Model {
    random::write_tiny_classifier(dir, 1, 2, seed).unwrap();
    folder::load(dir).unwrap()
}

fn serve(m: &Model) -> RunningServer {
    ServerBuilder::new(ServerIdentity::Plaintext)
        .build(m)
        .unwrap()
        .spawn(TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap()
}

fn connect(bundle: &Path, s: &RunningServer) -> veil_core::Result<Client<TcpChannel>> {
    Client::connect(
        ClientModel::open(bundle)?,
        TcpChannel::connect(s.local_addr())?,
        PromptOptions::default(),
        ClientOptions::default(),
    )
}

/// The word table with row 5 overwritten by row 7 ("good" scored as "bad").
fn swapped(w: &candle_core::Tensor) -> candle_core::Tensor {
    let rows: Vec<_> = (0..w.dim(0).unwrap())
        .map(|i| w.get(if i == 5 { 7 } else { i }).unwrap())
        .collect();
    candle_core::Tensor::stack(&rows, 0).unwrap()
}

const WORDS: &str = "embeddings.word_embeddings.weight";

/// Overwrites one row of the word table with another, in the file's bytes.
fn swap_a_row(dir: &Path) {
    let path = dir.join(TABLES_FILE);
    let mut t = candle_core::safetensors::load(&path, &candle_core::Device::Cpu).unwrap();
    let w = swapped(&t[WORDS]);
    t.insert(WORDS.into(), w);
    candle_core::safetensors::save(&t, &path).unwrap();
}

#[test]
fn an_honest_bundle_matches_and_a_tampered_table_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let m = model(&tmp.path().join("model"), 3);
    let bundle = tmp.path().join("bundle");
    save_bundle(&m, &bundle).unwrap();
    let running = serve(&m);

    // The bundle's digest is the one the server computes from its model.
    let opened = ClientModel::open(&bundle).unwrap();
    drop(opened);
    assert_eq!(
        manifest::verify(&bundle, m.config.veil.embedding).unwrap(),
        manifest::model_digest(&m).unwrap()
    );
    let mut c = connect(&bundle, &running).unwrap();
    let honest = c.classify(&[Input::Text("good film")]).unwrap()[0]
        .probabilities
        .clone();
    c.close().unwrap();

    // A table changed after export: caught at load, naming the file.
    swap_a_row(&bundle);
    let e = ClientModel::open(&bundle).err().unwrap().to_string();
    assert!(
        e.contains(TABLES_FILE) && e.contains("changed since the bundle was exported"),
        "{e}"
    );
    // Exported again from tampered tables, manifest and all: the server's digest differs,
    // named with the path.
    let mut tampered = folder::load(&tmp.path().join("model")).unwrap();
    let named = &mut tampered.transformer.named;
    let i = named.iter().position(|(n, _)| n == WORDS).unwrap();
    named[i].1 = swapped(&named[i].1);
    save_bundle(&tampered, &bundle).unwrap();
    let mine = manifest::verify(&bundle, m.config.veil.embedding).unwrap();
    let theirs = manifest::model_digest(&m).unwrap();
    let e = connect(&bundle, &running).err().unwrap().to_string();
    for part in [
        mine.to_string(),
        theirs.to_string(),
        bundle.display().to_string(),
    ] {
        assert!(e.contains(&part), "{part} not in: {e}");
    }
    // The untampered bundle still gets the same answer.
    save_bundle(&m, &bundle).unwrap();
    let mut c = connect(&bundle, &running).unwrap();
    assert_eq!(
        c.classify(&[Input::Text("good film")]).unwrap()[0].probabilities,
        honest
    );
    c.close().unwrap();
    running.stop().unwrap();
}

#[test]
fn a_stale_bundle_is_refused_after_the_servers_model_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let old = model(&tmp.path().join("old"), 3);
    let new = model(&tmp.path().join("new"), 4);
    assert_eq!(old.config, new.config, "same shape, new weights");
    let bundle = tmp.path().join("bundle");
    save_bundle(&old, &bundle).unwrap();
    let running = serve(&new);
    let e = connect(&bundle, &running).err().unwrap().to_string();
    let (mine, theirs) = (
        manifest::model_digest(&old).unwrap(),
        manifest::model_digest(&new).unwrap(),
    );
    assert_ne!(mine, theirs);
    assert!(
        e.contains(&mine.to_string()) && e.contains(&theirs.to_string()),
        "{e}"
    );
    assert!(e.contains("export-client"), "{e}");
    running.stop().unwrap();
}

#[test]
fn a_bundle_missing_a_file_or_its_manifest_is_refused_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    let m = model(&tmp.path().join("model"), 3);
    for file in [TABLES_FILE, MANIFEST_FILE] {
        let bundle = tmp.path().join(format!("bundle-{file}"));
        save_bundle(&m, &bundle).unwrap();
        std::fs::remove_file(bundle.join(file)).unwrap();
        let e = ClientModel::open(&bundle).err().unwrap().to_string();
        assert!(e.contains(&bundle.join(file).display().to_string()), "{e}");
    }
}

/// The digest check runs before any key material moves: a server announcing another digest
/// receives nothing after the hello.
#[test]
fn a_digest_mismatch_sends_nothing_after_the_hello() {
    let tmp = tempfile::tempdir().unwrap();
    let m = model(&tmp.path().join("model"), 3);
    let bundle = tmp.path().join("bundle");
    save_bundle(&m, &bundle).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let config = m.config.announced();
    let fake = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut ch = TcpChannel::from_stream(s).unwrap();
        ch.set_deadline(Some(Instant::now() + Duration::from_secs(30)))
            .unwrap();
        Hello::recv(&mut ch).unwrap();
        Admission::Admitted(Announced {
            config,
            bundle: Some(BundleDigest([9; 32])),
            activation_bits: None,
            cuts: Cuts::Kept,
        })
        .send(&mut ch)
        .unwrap();
        ch.flush().unwrap();
        let before = ch.meter().total().bytes_received;
        let next = ch.recv_msg(1 << 20);
        (before, ch.meter().total().bytes_received, next)
    });
    let e = Client::connect(
        ClientModel::open(&bundle).unwrap(),
        TcpChannel::connect(addr).unwrap(),
        PromptOptions::default(),
        ClientOptions::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains(&BundleDigest([9; 32]).to_string()), "{e}");
    let (before, after, next) = fake.join().unwrap();
    assert_eq!(before, after, "bytes after the admission");
    assert!(next.is_err());
}
