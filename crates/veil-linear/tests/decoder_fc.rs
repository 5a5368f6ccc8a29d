//! FC layers in the private decoder's ring ℓ = 48 (SmolLM2-135M's shapes: 576 wide, kv 3 heads
//! × 64 = 192, MLP 1,536), at one row (a decode step) and a 40-row prompt, against integer
//! arithmetic mod 2^48 written out here (not `RingTensor::matmul`).

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

/// Y = X·Wᵀ + b with wrapping u64 arithmetic, reduced mod 2^48.
fn oracle(c: &Case) -> Vec<u64> {
    let (n, k, m) = (c.layer.seq, c.layer.in_features, c.layer.out_features);
    let (x, w, b) = (c.x.data(), c.w.data(), c.b.data());
    let mut y = vec![0u64; n * m];
    for i in 0..n {
        for j in 0..m {
            let dot = (0..k).fold(b[j], |acc, l| {
                acc.wrapping_add(x[i * k + l].wrapping_mul(w[j * k + l]))
            });
            y[i * m + j] = dot & ((1 << 48) - 1);
        }
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

fn check(seq: usize) {
    let cases: Vec<Case> = SHAPES
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
    check(1);
}

#[test]
fn prefill_fc_is_exact_at_l48() {
    check(40);
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, .. ProptestConfig::default() })]
    /// Any shape up to the decoder's widths, one row or a prompt, is exact mod 2^48.
    #[test]
    fn fc_shapes_are_exact_at_l48(
        seq in prop_oneof![Just(1usize), 2usize..=48],
        inp in 1usize..=1536,
        out in 1usize..=1536,
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
    }
}
