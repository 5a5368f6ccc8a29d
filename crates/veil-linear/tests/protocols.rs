//! Both parties in two threads; every result is compared exactly with RingTensor::matmul.

use proptest::prelude::*;
use veil_core::{reconstruct, share, Error, Prg, Ring, RingTensor, Seed};
use veil_he::ParamSet;
use veil_linear::*;
use veil_net::{run_two_party, run_two_party_tcp, Channel};

fn ring() -> Ring {
    Ring::new(41).unwrap()
}

fn small_matrix(shape: &[usize], bits: u32, g: &mut Prg) -> RingTensor {
    let r = ring();
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|_| r.from_signed(g.below(1 << (bits + 1)) as i64 - (1 << bits)))
        .collect();
    RingTensor::from_vec(r, shape, data).unwrap()
}

struct FcCase {
    layer: FcLayer,
    x: RingTensor,
    w: RingTensor,
    b: RingTensor,
}

fn fc_case(seq: usize, inp: usize, out: usize, tag: u8) -> FcCase {
    let mut g = Prg::from_seed(&Seed([tag; 16]));
    FcCase {
        layer: FcLayer {
            seq,
            max_seq: 512,
            in_features: inp,
            out_features: out,
            set: ParamSet::N8192,
        },
        x: RingTensor::random(ring(), &[seq, inp], &mut g).unwrap(),
        w: small_matrix(&[out, inp], 12, &mut g),
        b: RingTensor::random(ring(), &[out], &mut g).unwrap(),
    }
}

fn expected(c: &FcCase) -> RingTensor {
    let mut y = c.x.matmul(&c.w.transpose().unwrap()).unwrap();
    let out = c.layer.out_features;
    for (i, v) in y.data_mut().iter_mut().enumerate() {
        *v = ring().add(*v, c.b.data()[i % out]);
    }
    y
}

fn run_fc(c: &FcCase, tcp: bool) -> RingTensor {
    run_fc_cached(c, tcp, true)
}

fn run_fc_cached(c: &FcCase, tcp: bool, cache: bool) -> RingTensor {
    let mut g = Prg::from_seed(&Seed([99; 16]));
    let (x0, x1) = share(&c.x, &mut g).unwrap();
    let mut fc = PreparedFc::new(c.layer, &c.w, Some(&c.b)).unwrap();
    let p = fc.matrix().params().clone();
    let cut = c.layer.layout(&p).unwrap().weight_blocking();
    if cache {
        fc.cache_ntt(cut).unwrap();
    }
    assert_eq!(fc.matrix().is_ntt_cached(cut), cache);
    let client = |ch: &mut dyn Channel| -> veil_core::Result<RingTensor> {
        let s = ClientSession::setup(ch, ring())?;
        fc_client(ch, &s, &c.layer, &x0)
    };
    let server = |ch: &mut dyn Channel| -> veil_core::Result<RingTensor> {
        let s = ServerSession::setup(ch, ring())?;
        fc_server(ch, &s, &fc, &x1)
    };
    let (y0, y1) = if tcp {
        run_two_party_tcp(|ch| client(ch), |ch| server(ch)).unwrap()
    } else {
        run_two_party(|ch| client(ch), |ch| server(ch)).unwrap()
    };
    reconstruct(&y0, &y1).unwrap()
}

#[test]
fn fc_edge_shapes_are_exact() {
    for (i, &(seq, inp, out)) in [
        (1, 1, 1),
        (3, 5, 7),
        (1, 300, 2),
        (128, 40, 70),
        (17, 129, 33),
    ]
    .iter()
    .enumerate()
    {
        let c = fc_case(seq, inp, out, i as u8);
        assert_eq!(run_fc(&c, false), expected(&c), "{seq}x{inp}x{out}");
    }
}

#[test]
fn fc_without_weight_cache_is_exact() {
    let c = fc_case(128, 40, 70, 41);
    assert_eq!(run_fc_cached(&c, false, false), expected(&c));
}

#[test]
fn fc_over_tcp_is_exact() {
    let c = fc_case(128, 64, 96, 40);
    assert_eq!(run_fc(&c, true), expected(&c));
}

#[test]
fn fc_refuses_weights_too_large_to_flood() {
    let mut g = Prg::from_seed(&Seed([5; 16]));
    let layer = FcLayer {
        seq: 128,
        max_seq: 512,
        in_features: 512,
        out_features: 64,
        set: ParamSet::N8192,
    };
    let w = RingTensor::random(ring(), &[64, 512], &mut g).unwrap();
    assert!(matches!(
        PreparedFc::new(layer, &w, None),
        Err(Error::Insecure(_))
    ));
}

fn check_shared_products(heads: usize, (n, k, m): (usize, usize, usize), tcp: bool) {
    let mut g = Prg::from_seed(&Seed([6; 16]));
    let a: Vec<_> = (0..heads)
        .map(|_| RingTensor::random(ring(), &[n, k], &mut g).unwrap())
        .collect();
    let b: Vec<_> = (0..heads)
        .map(|_| RingTensor::random(ring(), &[k, m], &mut g).unwrap())
        .collect();
    let split = |v: &[RingTensor], g: &mut Prg| -> (Vec<_>, Vec<_>) {
        v.iter().map(|t| share(t, g).unwrap()).unzip()
    };
    let (a0, a1) = split(&a, &mut g);
    let (b0, b1) = split(&b, &mut g);
    let client = |ch: &mut dyn Channel| -> veil_core::Result<Vec<RingTensor>> {
        let s = ClientSession::setup(ch, ring())?;
        shared_matmul_client(ch, &s, &a0, &b0)
    };
    let server = |ch: &mut dyn Channel| -> veil_core::Result<Vec<RingTensor>> {
        let s = ServerSession::setup(ch, ring())?;
        shared_matmul_server(ch, &s, &a1, &b1)
    };
    let (c0, c1) = if tcp {
        run_two_party_tcp(|ch| client(ch), |ch| server(ch)).unwrap()
    } else {
        run_two_party(|ch| client(ch), |ch| server(ch)).unwrap()
    };
    for h in 0..heads {
        assert_eq!(
            reconstruct(&c0[h], &c1[h]).unwrap(),
            a[h].matmul(&b[h]).unwrap()
        );
    }
}

#[test]
fn shared_products_per_head_are_exact() {
    check_shared_products(3, (16, 8, 11), false);
}

/// Attention-sized products of small models (Q·Kᵀ and A·V with head size 8), one token up.
#[test]
fn small_attention_products_are_exact() {
    for shape in [(1, 8, 1), (5, 8, 5), (5, 5, 8), (8, 8, 8), (7, 7, 8)] {
        check_shared_products(2, shape, false);
    }
}

#[test]
fn shared_products_over_tcp_are_exact() {
    check_shared_products(1, (16, 8, 11), true);
}

/// A channel that forwards receives but keeps what is sent (to tamper with a real message).
struct Capture<'a> {
    inner: &'a mut dyn Channel,
    sent: Vec<u8>,
}

impl Channel for Capture<'_> {
    fn send(&mut self, data: &[u8]) -> veil_core::Result<()> {
        self.sent.extend_from_slice(data);
        Ok(())
    }
    fn recv(&mut self, buf: &mut [u8]) -> veil_core::Result<()> {
        self.inner.recv(buf)
    }
    fn flush(&mut self) -> veil_core::Result<()> {
        Ok(())
    }
    fn meter(&self) -> &veil_net::Meter {
        self.inner.meter()
    }
}

/// A peer that sends garbage or hangs up yields an error on the other side, never a panic.
#[test]
fn malformed_and_truncated_messages_are_errors() {
    let c = fc_case(4, 6, 5, 7);
    let fc = PreparedFc::new(c.layer, &c.w, None).unwrap();
    let (x0, x1) = share(&c.x, &mut Prg::from_seed(&Seed([1; 16]))).unwrap();
    // Server gets a truncated ciphertext message.
    let (_, r) = run_two_party(
        |ch| {
            let _s = ClientSession::setup(ch, ring())?;
            ch.send_msg(&[0x43, 1, 2, 3])?;
            Ok(())
        },
        |ch| {
            let s = ServerSession::setup(ch, ring())?;
            Ok(fc_server(ch, &s, &fc, &x1).is_err())
        },
    )
    .unwrap();
    assert!(r);
    // Client gets the server's real response with one byte missing, then the server hangs up.
    let (r, _) = run_two_party(
        |ch| {
            let s = ClientSession::setup(ch, ring())?;
            Ok(fc_client(ch, &s, &c.layer, &x0))
        },
        |ch| {
            let s = ServerSession::setup(ch, ring())?;
            let mut capture = Capture {
                inner: ch,
                sent: Vec::new(),
            };
            fc_server(&mut capture, &s, &fc, &x1)?;
            let response = capture.sent.split_off(4); // drop the length prefix
            assert!(veil_he::wire::decode_responses(
                &veil_he::Params::new(ParamSet::N8192, ring())?,
                &response,
                &[c.layer.seq * c.layer.out_features]
            )
            .is_ok());
            ch.send_msg(&response[..response.len() - 1])?;
            Ok(())
        },
    )
    .unwrap();
    assert!(matches!(r, Err(Error::Malformed(_))), "{r:?}");
    // A bad public key during set-up.
    let (_, r) = run_two_party(
        |ch| {
            ch.send_msg(&[0x50; 40])?;
            Ok(())
        },
        |ch| Ok(ServerSession::setup(ch, ring()).is_err()),
    )
    .unwrap();
    assert!(r);
    // A valid public key followed by truncated Galois keys.
    let (_, r) = run_two_party(
        |ch| {
            let p = veil_he::Params::new(ParamSet::N8192, ring())?;
            let mut g = Prg::from_seed(&Seed([2; 16]));
            let sk = veil_he::SecretKey::generate(&p, &mut g);
            ch.send_msg(&veil_he::wire::encode_public_key(&sk.public_key(&mut g)))?;
            let gk = veil_he::wire::encode_galois_keys(&sk.galois_keys(&mut g)?)?;
            ch.send_msg(&gk[..gk.len() - 3])?;
            Ok(())
        },
        |ch| Ok(ServerSession::setup(ch, ring()).is_err()),
    )
    .unwrap();
    assert!(r);
}

/// A packed layout without the client's Galois keys is refused before anything is received.
#[test]
fn packed_layout_needs_galois_keys() {
    let p = veil_he::Params::new(ParamSet::N8192, ring()).unwrap();
    let mut g = Prg::from_seed(&Seed([3; 16]));
    let pk = veil_he::SecretKey::generate(&p, &mut g).public_key(&mut g);
    let b = small_matrix(&[768, 768], 10, &mut g);
    let matrix = PreparedMatrix::new(&p, &b, 1 << 16).unwrap();
    let layout = Layout::search(&p, 128, 768, 768, 1 << 16).unwrap();
    assert!(layout.blocks.pack > 1);
    let job = ServerJob {
        matrix: &matrix,
        layout,
        lhs_share: None,
        add: None,
    };
    let (_, r) = run_two_party(
        |_| Ok(()),
        |ch| Ok(matmul::server_respond(ch, &pk, None, &[job])),
    )
    .unwrap();
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{:?}", r.err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, .. ProptestConfig::default() })]
    #[test]
    fn fc_matches_plaintext_on_random_shapes(seq in 1usize..40, inp in 1usize..80, out in 1usize..40, tag in 0u8..255) {
        let c = fc_case(seq, inp, out, tag);
        prop_assert_eq!(run_fc(&c, false), expected(&c));
    }
}

/// A·B through the batched protocol with the given layout, against the plaintext product.
fn product_is_exact(set: ParamSet, layout: Layout, bits: u32, tag: u8) {
    let mut g = Prg::from_seed(&Seed([tag; 16]));
    let (n, k, m) = (layout.n, layout.k, layout.m);
    let a = RingTensor::random(ring(), &[n, k], &mut g).unwrap();
    let b = small_matrix(&[k, m], bits, &mut g);
    let (a0, a1) = share(&a, &mut g).unwrap();
    let p = veil_he::Params::new(set, ring()).unwrap();
    let matrix = PreparedMatrix::new(&p, &b, 1 << bits).unwrap();
    let (y0, y1) = run_two_party(
        |ch| {
            let s = ClientSession::setup_for(ch, ring(), &[set])?;
            matmul::client_send(ch, s.key(set)?, &[layout], &[&a0])?;
            Ok(matmul::client_receive(ch, s.key(set)?, &[layout])?.remove(0))
        },
        |ch| {
            let s = ServerSession::setup_for(ch, ring(), &[set])?;
            let (pk, gk) = s.keys_for(set)?;
            let job = ServerJob {
                matrix: &matrix,
                layout,
                lhs_share: Some(&a1),
                add: None,
            };
            Ok(matmul::server_respond(ch, pk, Some(gk), &[job])?.remove(0))
        },
    )
    .unwrap();
    assert_eq!(
        reconstruct(&y0, &y1).unwrap(),
        a.matmul(&b).unwrap(),
        "{set:?} {layout:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, .. ProptestConfig::default() })]
    /// Every cut the searches can choose — a kept matrix's short or long cut for any n up to
    /// 512, or a one-off product's — gives the exact product mod 2^ℓ, for both parameter sets,
    /// shapes up to 4,096 (the product n·k·m capped so a case stays a few seconds).
    #[test]
    fn every_searched_blocking_is_exact(
        n in 1usize..=512,
        k in 1usize..=4096,
        m in 1usize..=4096,
        kept in any::<bool>(),
        q4 in any::<bool>(),
        tag in 0u8..255,
    ) {
        let (set, bits) = if q4 { (ParamSet::N8192Q4, 40) } else { (ParamSet::N8192, 16) };
        // Keep n·k·m ≤ 2^23 by shrinking the largest dimension.
        let (mut n, mut k, mut m) = (n, k, m);
        while n * k * m > 1 << 23 {
            if k >= m && k >= n { k = k.div_ceil(2) } else if m >= n { m = m.div_ceil(2) } else { n = n.div_ceil(2) }
        }
        let p = veil_he::Params::new(set, ring()).unwrap();
        let layout = if kept {
            let cut = WeightBlocking::for_rows(&p, n, 512, k, m, 1 << bits).unwrap();
            Layout::for_weights(&p, n, k, m, cut).unwrap()
        } else {
            Layout::search(&p, n, k, m, 1 << bits).unwrap()
        };
        product_is_exact(set, layout, bits, tag);
    }
}

/// One prepared layer serves requests of many lengths, each exact, and keeps no per-length
/// state: its prepared bytes are the same after serving them as before.
#[test]
fn one_prepared_layer_serves_every_length() {
    let c = fc_case(1, 96, 80, 77);
    let mut fc = PreparedFc::new(c.layer, &c.w, Some(&c.b)).unwrap();
    for (cut, _) in fc.ntt_bytes().unwrap() {
        fc.cache_ntt(cut).unwrap();
    }
    let before = fc.prepared_bytes();
    let mut g = Prg::from_seed(&Seed([78; 16]));
    let lengths = [1usize, 7, 16, 17, 128, 512];
    let xs: Vec<RingTensor> = lengths
        .iter()
        .map(|&n| RingTensor::random(ring(), &[n, 96], &mut g).unwrap())
        .collect();
    let shares: Vec<(RingTensor, RingTensor)> =
        xs.iter().map(|x| share(x, &mut g).unwrap()).collect();
    let (y0s, y1s) = run_two_party(
        |ch| {
            let s = ClientSession::setup(ch, ring())?;
            shares
                .iter()
                .zip(lengths)
                .map(|((x0, _), n)| fc_client(ch, &s, &FcLayer { seq: n, ..c.layer }, x0))
                .collect::<veil_core::Result<Vec<_>>>()
        },
        |ch| {
            let s = ServerSession::setup(ch, ring())?;
            shares
                .iter()
                .map(|(_, x1)| fc_server(ch, &s, &fc, x1))
                .collect::<veil_core::Result<Vec<_>>>()
        },
    )
    .unwrap();
    for ((x, y0), y1) in xs.iter().zip(&y0s).zip(&y1s) {
        let want = expected(&FcCase {
            layer: c.layer,
            x: x.clone(),
            w: c.w.clone(),
            b: c.b.clone(),
        });
        assert_eq!(reconstruct(y0, y1).unwrap(), want, "{} rows", x.shape()[0]);
    }
    assert_eq!(fc.prepared_bytes(), before);
    // A request longer than the layer's limit is refused, not served.
    let long = FcLayer {
        seq: 513,
        ..c.layer
    };
    let p = fc.matrix().params().clone();
    assert!(long.layout(&p).is_err());
}
