//! Linear protocols in the private decoder's ring ℓ = 48 against integer arithmetic mod 2^48
//! written out here (not `RingTensor::matmul`): FC layers at SmolLM2-135M's shapes (576 wide, kv
//! 3 heads × 64 = 192, MLP 1,536) at one row (a decode step) and a 40-row prompt, and the
//! attention products of shares (as 24-bit limbs) and their Beaver triples.

use proptest::prelude::*;
use veil_core::{reconstruct, share, Error, Prg, Ring, RingTensor, Seed};
use veil_linear::*;
use veil_net::{run_two_party, Channel};

fn ring() -> Ring {
    Ring::new(48).unwrap()
}

/// A decoder FC layer as the decoder party describes it: the ring's weight set, a context limit.
fn layer(seq: usize, inp: usize, out: usize) -> FcLayer {
    FcLayer {
        seq,
        max_seq: 2048,
        in_features: inp,
        out_features: out,
        set: weight_set(ring()),
    }
}

struct Case {
    layer: FcLayer,
    x: RingTensor,
    w: RingTensor,
    b: RingTensor,
}

/// X uniform in Z_2^48, W (out × in) uniform in ±[`fc::WEIGHT_BOUND`] (the largest weights the
/// layer takes), b uniform.
fn case(seq: usize, inp: usize, out: usize, tag: u8) -> Case {
    let mut g = Prg::from_seed(&Seed([tag; 16]));
    let bound = fc::WEIGHT_BOUND as i64;
    let w = (0..inp * out)
        .map(|_| ring().from_signed(g.below(2 * bound as u64 + 1) as i64 - bound))
        .collect();
    Case {
        layer: layer(seq, inp, out),
        x: RingTensor::random(ring(), &[seq, inp], &mut g).unwrap(),
        w: RingTensor::from_vec(ring(), &[out, inp], w).unwrap(),
        b: RingTensor::random(ring(), &[out], &mut g).unwrap(),
    }
}

/// A·B (n×k · k×m) with wrapping u64 arithmetic, reduced mod 2^48.
fn matmul_mod48(a: &RingTensor, b: &RingTensor) -> Vec<u64> {
    let (n, k, m) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    let mut y = vec![0u64; n * m];
    for i in 0..n {
        for j in 0..m {
            let dot = (0..k).fold(0u64, |acc, l| {
                acc.wrapping_add(a.data()[i * k + l].wrapping_mul(b.data()[l * m + j]))
            });
            y[i * m + j] = dot & ((1 << 48) - 1);
        }
    }
    y
}

/// Y = X·Wᵀ + b mod 2^48.
fn oracle(c: &Case) -> Vec<u64> {
    let out = c.layer.out_features;
    let mut y = matmul_mod48(&c.x, &c.w.transpose().unwrap());
    for (i, v) in y.iter_mut().enumerate() {
        *v = v.wrapping_add(c.b.data()[i % out]) & ((1 << 48) - 1);
    }
    y
}

/// Runs every case in one session (the decoder's: [`session_sets`] at ℓ = 48); returns the
/// opened outputs.
fn run(cases: &[Case]) -> Vec<RingTensor> {
    let mut g = Prg::from_seed(&Seed([99; 16]));
    let shares: Vec<(RingTensor, RingTensor)> =
        cases.iter().map(|c| share(&c.x, &mut g).unwrap()).collect();
    let prepared: Vec<PreparedFc> = cases
        .iter()
        .map(|c| PreparedFc::new(c.layer, &c.w, Some(&c.b)).unwrap())
        .collect();
    let (y0, y1) = run_two_party(
        |ch| {
            let s = ClientSession::setup(ch, ring())?;
            cases
                .iter()
                .zip(&shares)
                .map(|(c, (x0, _))| fc_client(ch, &s, &c.layer, x0))
                .collect::<veil_core::Result<Vec<_>>>()
        },
        |ch| {
            let s = ServerSession::setup(ch, ring())?;
            prepared
                .iter()
                .zip(&shares)
                .map(|(fc, (_, x1))| fc_server(ch, &s, fc, x1))
                .collect::<veil_core::Result<Vec<_>>>()
        },
    )
    .unwrap();
    y0.iter()
        .zip(&y1)
        .map(|(a, b)| reconstruct(a, b).unwrap())
        .collect()
}

const SHAPES: [(usize, usize); 4] = [(576, 576), (576, 192), (576, 1536), (1536, 576)];

fn check(seq: usize, shapes: &[(usize, usize)]) {
    let cases: Vec<Case> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(inp, out))| case(seq, inp, out, i as u8 + seq as u8))
        .collect();
    for (c, y) in cases.iter().zip(run(&cases)) {
        assert_eq!(
            y.data(),
            oracle(c),
            "{seq}x{:?}",
            (c.layer.in_features, c.layer.out_features)
        );
    }
}

#[test]
fn decode_step_fc_is_exact_at_l48() {
    check(1, &SHAPES);
}

/// A prompt's cut on the narrowest and the deepest shape (all four cost CI minutes in a debug
/// build; the cut's code is the same for each).
#[test]
fn prefill_fc_is_exact_at_l48() {
    check(40, &[SHAPES[1], SHAPES[3]]);
}

/// The ℓ = 48 session has one key (the wide set); the ℓ ≤ 41 sets refuse the ring outright, and
/// weights above the public bound are refused as insecure, whatever the depth.
#[test]
fn over_budget_requests_are_refused_at_l48() {
    assert_eq!(session_sets(ring()), &[veil_he::ParamSet::N8192Q4L48]);
    for set in SESSION_SETS {
        let l = FcLayer {
            set,
            ..layer(1, 576, 576)
        };
        let c = case(1, 576, 576, 3);
        let err = PreparedFc::new(l, &c.w, None).err().expect("refused");
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("no room for the switching noise")),
            "{err}"
        );
    }
    let mut c = case(1, 576, 64, 4);
    c.w.data_mut()[7] = ring().from_signed(fc::WEIGHT_BOUND as i64 + 1);
    assert!(matches!(
        PreparedFc::new(c.layer, &c.w, None),
        Err(Error::Insecure(_))
    ));
    // Plaintexts the size of a uniform share (the shares × shares case) cannot be flooded.
    let p = veil_he::Params::new(weight_set(ring()), ring()).unwrap();
    let err = Layout::search(&p, 1, 64, 128, 1 << 47).unwrap_err();
    assert!(
        matches!(&err, Error::Insecure(m) if m.contains("flooding budget")),
        "{err}"
    );
}

/// One SmolLM2 block's seven FC layers (q, k, v, o, gate, up, down) at `seq` rows.
fn block_cases(seq: usize) -> Vec<Case> {
    [
        (576, 576),
        (576, 192),
        (576, 192),
        (576, 576),
        (576, 1536),
        (576, 1536),
        (1536, 576),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(inp, out))| case(seq, inp, out, 40 + i as u8))
    .collect()
}

/// The cases' masks made in one offline batch, then every layer online in one message; returns
/// the opened outputs and the client's metered (offline, online) traffic.
fn run_premasked(cases: &[Case]) -> (Vec<RingTensor>, [veil_net::LabelStats; 2]) {
    use veil_linear::fc::{fc_online_server, fc_premask_client, fc_premask_server};
    use veil_linear::premask::online_client;
    let label = veil_core::CostClass::MatMul;
    let mut g = Prg::from_seed(&Seed([97; 16]));
    let shares: Vec<(RingTensor, RingTensor)> =
        cases.iter().map(|c| share(&c.x, &mut g).unwrap()).collect();
    let fcs: Vec<PreparedFc> = cases
        .iter()
        .map(|c| PreparedFc::new(c.layer, &c.w, Some(&c.b)).unwrap())
        .collect();
    let layers: Vec<FcLayer> = cases.iter().map(|c| c.layer).collect();
    let ((y0, stats), y1) = run_two_party(
        |ch| {
            let s = ClientSession::setup(ch, ring())?;
            // Each phase metered on its own (a reset between them).
            let phase = |ch: &mut veil_net::MemChannel| {
                let st = ch.meter().snapshot()[&label].clone();
                ch.meter().reset();
                st
            };
            ch.meter().reset();
            let masks = {
                let _g = ch.meter().enter(label);
                fc_premask_client(ch, &s, &layers)?
            };
            let off = phase(ch);
            let x0: Vec<&RingTensor> = shares.iter().map(|s| &s.0).collect();
            let y0 = {
                let _g = ch.meter().enter(label);
                online_client(ch, masks, &x0)?
            };
            Ok((y0, [off, phase(ch)]))
        },
        |ch| {
            let s = ServerSession::setup(ch, ring())?;
            let reqs: Vec<(&PreparedFc, usize)> = fcs.iter().map(|f| (f, f.layer().seq)).collect();
            let masks = fc_premask_server(ch, &s, &reqs)?;
            let jobs = fcs
                .iter()
                .zip(masks)
                .zip(&shares)
                .map(|((f, m), s)| (f, m, &s.1))
                .collect();
            fc_online_server(ch, jobs)
        },
    )
    .unwrap();
    let opened = y0
        .iter()
        .zip(&y1)
        .map(|(a, b)| reconstruct(a, b).unwrap())
        .collect();
    (opened, stats)
}

/// A decode step's seven FC layers preprocessed in one batch (the masks made while the previous
/// token is printed), then used online: each equals X·Wᵀ + b mod 2^48.
#[test]
fn preprocessed_decode_step_is_exact_at_l48() {
    let cases = block_cases(1);
    let (ys, _) = run_premasked(&cases);
    for (c, y) in cases.iter().zip(ys) {
        assert_eq!(y.data(), oracle(c));
    }
}

/// Random per-head operands A_h (n×k), B_h (k×m) and their shares.
fn head_operands(
    heads: usize,
    (n, k, m): (usize, usize, usize),
    g: &mut Prg,
) -> (Vec<RingTensor>, Vec<RingTensor>, [Vec<RingTensor>; 4]) {
    let a: Vec<_> = (0..heads)
        .map(|_| RingTensor::random(ring(), &[n, k], g).unwrap())
        .collect();
    let b: Vec<_> = (0..heads)
        .map(|_| RingTensor::random(ring(), &[k, m], g).unwrap())
        .collect();
    let (a0, a1) = a.iter().map(|t| share(t, g).unwrap()).unzip();
    let (b0, b1) = b.iter().map(|t| share(t, g).unwrap()).unzip();
    (a, b, [a0, a1, b0, b1])
}

/// Shares × shares at ℓ = 48 (the server's 48-bit shares as two 24-bit limbs): the decode
/// step's per-head Q·Kᵀ and A·V at a 41-token context, and a 40-token prompt's Q·Kᵀ, 3 heads.
#[test]
fn shared_products_are_exact_at_l48() {
    let mut g = Prg::from_seed(&Seed([12; 16]));
    for shape in [(1, 64, 41), (1, 41, 64), (40, 64, 40)] {
        let (a, b, [a0, a1, b0, b1]) = head_operands(3, shape, &mut g);
        let (c0, c1) = run_two_party(
            |ch| {
                let s = ClientSession::setup(ch, ring())?;
                shared_matmul_client(ch, &s, &a0, &b0)
            },
            |ch| {
                let s = ServerSession::setup(ch, ring())?;
                shared_matmul_server(ch, &s, &a1, &b1)
            },
        )
        .unwrap();
        for h in 0..3 {
            let got = reconstruct(&c0[h], &c1[h]).unwrap();
            assert_eq!(got.data(), matmul_mod48(&a[h], &b[h]), "{shape:?} head {h}");
        }
    }
}

/// The decode step's attention by Beaver triples made at ℓ = 48 in preprocessing.
#[test]
fn beaver_attention_products_are_exact_at_l48() {
    use veil_linear::triples::{beaver_matmul, triples_client, triples_server};
    use veil_net::Role;
    let mut g = Prg::from_seed(&Seed([13; 16]));
    let dims = [(1, 64, 41); 3];
    let (a, b, [a0, a1, b0, b1]) = head_operands(3, dims[0], &mut g);
    let (c0, c1) = run_two_party(
        |ch| {
            let s = ClientSession::setup(ch, ring())?;
            let t = triples_client(ch, &s, ring(), &dims)?;
            beaver_matmul(ch, Role::Client, t, &a0, &b0)
        },
        |ch| {
            let s = ServerSession::setup(ch, ring())?;
            let t = triples_server(ch, &s, ring(), &dims)?;
            beaver_matmul(ch, Role::Server, t, &a1, &b1)
        },
    )
    .unwrap();
    for h in 0..3 {
        let got = reconstruct(&c0[h], &c1[h]).unwrap();
        assert_eq!(got.data(), matmul_mod48(&a[h], &b[h]), "head {h}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, .. ProptestConfig::default() })]
    /// Any shape up to 768 wide (the deeper rows are the fixed cases above), one row or a
    /// prompt, is exact mod 2^48.
    #[test]
    fn fc_shapes_are_exact_at_l48(
        seq in prop_oneof![Just(1usize), 2usize..=48],
        inp in 1usize..=768,
        out in 1usize..=768,
        tag in 0u8..255,
    ) {
        let c = case(seq, inp, out, tag);
        let y = run(std::slice::from_ref(&c)).remove(0);
        prop_assert_eq!(y.data(), oracle(&c));
    }
}

/// The cost of each SmolLM2 FC shape at ℓ = 48 (bytes each way, flights, client wall time):
/// `cargo test -p veil-linear --test decoder_fc -- --ignored --nocapture`.
#[test]
#[ignore = "prints costs"]
fn print_costs() {
    for seq in [1, 40] {
        for (inp, out) in SHAPES {
            let c = case(seq, inp, out, 9);
            let mut g = Prg::from_seed(&Seed([98; 16]));
            let (x0, x1) = share(&c.x, &mut g).unwrap();
            let fc = PreparedFc::new(c.layer, &c.w, Some(&c.b)).unwrap();
            let label = veil_core::CostClass::MatMul;
            let (stats, y1) = run_two_party(
                |ch| {
                    let s = ClientSession::setup(ch, ring())?;
                    ch.meter().reset();
                    let t = std::time::Instant::now();
                    let y0 = {
                        let _g = ch.meter().enter(label);
                        fc_client(ch, &s, &c.layer, &x0)?
                    };
                    let secs = t.elapsed().as_secs_f64();
                    let on = ch.meter().snapshot()[&label].clone();
                    Ok((y0, on, secs))
                },
                |ch| {
                    let s = ServerSession::setup(ch, ring())?;
                    let _g = ch.meter().enter(label);
                    fc_server(ch, &s, &fc, &x1)
                },
            )
            .unwrap();
            let (y0, on, secs) = stats;
            assert_eq!(reconstruct(&y0, &y1).unwrap().data(), oracle(&c));
            let lay = c.layer.layout(fc.matrix().params()).unwrap();
            let role = veil_net::Role::Client;
            println!(
                "n={seq} {inp}->{out}: {:?} up {} B down {} B flights {} {:.2} s (dev)",
                lay.blocks,
                on.client_to_server(role),
                on.server_to_client(role),
                on.rounds(),
                secs
            );
        }
        let t = std::time::Instant::now();
        let (_, [off, on]) = run_premasked(&block_cases(seq));
        let role = veil_net::Role::Client;
        for (what, st) in [("offline", off), ("online", on)] {
            println!(
                "n={seq} one block's 7 FC preprocessed, {what}: up {} B down {} B flights {}",
                st.client_to_server(role),
                st.server_to_client(role),
                st.rounds()
            );
        }
        println!(
            "  (both phases and set-up {:.2} s, dev)",
            t.elapsed().as_secs_f64()
        );
    }
}

/// The cost of SmolLM2's per-block attention products of shares at ℓ = 48 (9 query heads of
/// 64 over 3 key/value heads; a decode step at a 41-token context and a 40-token prompt), per
/// query head and grouped per key/value head, directly and as Beaver
/// triples (offline, then online): `cargo test -p veil-linear --test decoder print_attention_costs
/// -- --ignored --nocapture`.
#[test]
#[ignore = "prints costs"]
fn print_attention_costs() {
    use veil_linear::triples::{beaver_matmul, triples_client, triples_server};
    use veil_net::Role;
    let label = veil_core::CostClass::MatMul;
    let mut g = Prg::from_seed(&Seed([14; 16]));
    // Per query head (9 products), and per key/value head as the decoder runs them (3
    // products, each of the 3 query heads' rows stacked).
    for (name, heads, shape) in [
        ("decode Q·Kᵀ", 9, (1, 64, 41)),
        ("decode A·V", 9, (1, 41, 64)),
        ("prefill Q·Kᵀ", 9, (40, 64, 40)),
        ("prefill A·V", 9, (40, 40, 64)),
        ("decode Q·Kᵀ grouped", 3, (3, 64, 41)),
        ("decode A·V grouped", 3, (3, 41, 64)),
        ("prefill Q·Kᵀ grouped", 3, (120, 64, 40)),
        ("prefill A·V grouped", 3, (120, 40, 64)),
    ] {
        let dims = vec![shape; heads];
        let (_, _, [a0, a1, b0, b1]) = head_operands(heads, shape, &mut g);
        let report = |ch: &dyn Channel, what: &str, secs: f64| {
            let on = ch.meter().snapshot()[&label].clone();
            let role = veil_net::Role::Client;
            println!(
                "{name} {heads} products {shape:?} {what}: up {} B down {} B flights {} {secs:.2} s (dev)",
                on.client_to_server(role),
                on.server_to_client(role),
                on.rounds()
            );
            ch.meter().reset();
        };
        run_two_party(
            |ch| {
                let s = ClientSession::setup(ch, ring())?;
                ch.meter().reset();
                let t = std::time::Instant::now();
                {
                    let _g = ch.meter().enter(label);
                    shared_matmul_client(ch, &s, &a0, &b0)?;
                }
                report(ch, "direct", t.elapsed().as_secs_f64());
                let t = std::time::Instant::now();
                let tr = {
                    let _g = ch.meter().enter(label);
                    triples_client(ch, &s, ring(), &dims)?
                };
                report(ch, "triples offline", t.elapsed().as_secs_f64());
                let t = std::time::Instant::now();
                {
                    let _g = ch.meter().enter(label);
                    beaver_matmul(ch, Role::Client, tr, &a0, &b0)?;
                }
                report(ch, "triples online", t.elapsed().as_secs_f64());
                Ok(())
            },
            |ch| {
                let s = ServerSession::setup(ch, ring())?;
                let _g = ch.meter().enter(label);
                shared_matmul_server(ch, &s, &a1, &b1)?;
                let tr = triples_server(ch, &s, ring(), &dims)?;
                beaver_matmul(ch, Role::Server, tr, &a1, &b1)
            },
        )
        .unwrap();
    }
}

/// A request priced for its own rows ([`fc_server_for`], the decoder's prompts and steps) on a
/// layer prepared for 2,048 rows is exact at ℓ = 48, on the stacked shapes the decoder sends
/// (SmolLM2's q|k|v, 576 → 960; gate|up, 576 → 3,072) and edge row counts; requests that do not
/// fit the prepared layer are refused before anything is sent.
#[test]
fn requests_priced_for_their_rows_are_exact_at_l48() {
    for (seq, inp, out, tag) in [(1, 576, 960, 60), (1, 576, 3072, 61), (3, 576, 960, 62)] {
        let c = case(seq, inp, out, tag);
        let request = FcLayer {
            max_seq: seq,
            ..c.layer
        };
        let fc = PreparedFc::new(c.layer, &c.w, Some(&c.b)).unwrap();
        let mut g = Prg::from_seed(&Seed([tag; 16]));
        let (x0, x1) = share(&c.x, &mut g).unwrap();
        let (y0, y1) = run_two_party(
            |ch| {
                let s = ClientSession::setup(ch, ring())?;
                fc_client(ch, &s, &request, &x0)
            },
            |ch| {
                let s = ServerSession::setup(ch, ring())?;
                fc_server_for(ch, &s, &fc, &request, &x1)
            },
        )
        .unwrap();
        assert_eq!(
            reconstruct(&y0, &y1).unwrap().data(),
            oracle(&c),
            "{seq}x{inp}x{out}"
        );
    }
    let c = case(2, 576, 192, 63);
    let fc = PreparedFc::new(
        FcLayer {
            max_seq: 4,
            ..c.layer
        },
        &c.w,
        None,
    )
    .unwrap();
    let mut g = Prg::from_seed(&Seed([63; 16]));
    let (_, x1) = share(&c.x, &mut g).unwrap();
    let bad = [
        FcLayer {
            max_seq: 5,
            ..c.layer
        },
        FcLayer {
            seq: 1,
            max_seq: 2,
            ..c.layer
        },
        FcLayer {
            out_features: 191,
            max_seq: 2,
            ..c.layer
        },
        FcLayer {
            in_features: 575,
            max_seq: 2,
            ..c.layer
        },
        FcLayer {
            max_seq: 0,
            ..c.layer
        },
    ];
    let (_, refused) = run_two_party(
        |ch| ClientSession::setup(ch, ring()).map(drop),
        |ch| {
            let s = ServerSession::setup(ch, ring())?;
            let sent = ch.meter().total().bytes_sent;
            let refused = bad
                .iter()
                .map(|r| fc_server_for(ch, &s, &fc, r, &x1).is_err())
                .collect::<Vec<_>>();
            assert_eq!(
                ch.meter().total().bytes_sent,
                sent,
                "a refusal sent something"
            );
            Ok(refused)
        },
    )
    .unwrap();
    assert!(refused.iter().all(|&r| r), "{refused:?}");
}

/// One SmolLM2 block's four products as the private decoder runs them in a decode step (q|k|v
/// and gate|up fused, each request priced for its single row): each equals X·Wᵀ + b mod 2^48.
/// Prints the layouts and the client's metered MatMul bytes each way (deterministic):
/// `cargo test -p veil-linear --test decoder fused_decode_step -- --nocapture`.
#[test]
fn fused_decode_step_is_exact_at_l48() {
    let label = veil_core::CostClass::MatMul;
    let role = veil_net::Role::Client;
    let cases: Vec<Case> = [(576, 960), (576, 576), (576, 3072), (1536, 576)]
        .iter()
        .enumerate()
        .map(|(i, &(inp, out))| {
            let mut c = case(1, inp, out, 70 + i as u8);
            c.layer.max_seq = 1;
            c
        })
        .collect();
    let fcs: Vec<PreparedFc> = cases
        .iter()
        .map(|c| PreparedFc::new(c.layer, &c.w, Some(&c.b)).unwrap())
        .collect();
    let mut g = Prg::from_seed(&Seed([71; 16]));
    let shares: Vec<(RingTensor, RingTensor)> =
        cases.iter().map(|c| share(&c.x, &mut g).unwrap()).collect();
    let (client, y1) = run_two_party(
        |ch| {
            let s = ClientSession::setup(ch, ring())?;
            let setup: u64 = ch
                .meter()
                .snapshot()
                .values()
                .map(|st| st.client_to_server(role))
                .sum();
            println!("session set-up: up {setup} B");
            let mut out = Vec::new();
            for (c, (x0, _)) in cases.iter().zip(&shares) {
                ch.meter().reset();
                let y0 = {
                    let _g = ch.meter().enter(label);
                    fc_client(ch, &s, &c.layer, x0)?
                };
                out.push((y0, ch.meter().snapshot()[&label].clone()));
            }
            Ok(out)
        },
        |ch| {
            let s = ServerSession::setup(ch, ring())?;
            fcs.iter()
                .zip(&cases)
                .zip(&shares)
                .map(|((fc, c), (_, x1))| fc_server_for(ch, &s, fc, &c.layer, x1))
                .collect::<veil_core::Result<Vec<_>>>()
        },
    )
    .unwrap();
    let (mut up, mut down) = (0, 0);
    for ((c, (y0, st)), y1) in cases.iter().zip(client).zip(y1) {
        let (inp, out) = (c.layer.in_features, c.layer.out_features);
        assert_eq!(
            reconstruct(&y0, &y1).unwrap().data(),
            oracle(c),
            "{inp}->{out}"
        );
        let lay = c
            .layer
            .layout(&veil_he::Params::new(c.layer.set, ring()).unwrap());
        println!(
            "n=1 {inp}->{out}: {:?} up {} B down {} B flights {}",
            lay.unwrap().blocks,
            st.client_to_server(role),
            st.server_to_client(role),
            st.rounds()
        );
        up += st.client_to_server(role);
        down += st.server_to_client(role);
    }
    println!(
        "one block: up {up} B down {down} B; 30 blocks: up {} B down {} B",
        30 * up,
        30 * down
    );
}
