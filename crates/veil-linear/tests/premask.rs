//! Preprocessed products (veil_linear::premask for FC layers, veil_linear::triples for shared ×
//! shared ones): offline masks or triples, then the online messages and plaintext products;
//! every result is compared exactly with RingTensor::matmul.

use veil_core::{reconstruct, share, Error, Prg, Ring, RingTensor, Seed};
use veil_he::ParamSet;
use veil_linear::fc::{fc_online_server, fc_premask_client, fc_premask_server};
use veil_linear::premask::online_client;
use veil_linear::*;
use veil_net::{run_two_party, Channel};

fn ring() -> Ring {
    Ring::new(41).unwrap()
}

fn layer(seq: usize, inp: usize, out: usize) -> FcLayer {
    FcLayer {
        seq,
        max_seq: 512,
        in_features: inp,
        out_features: out,
        set: ParamSet::N8192,
    }
}

/// A weight matrix within the FC bound and a random bias.
fn weights(l: &FcLayer, g: &mut Prg) -> (RingTensor, RingTensor) {
    let r = ring();
    let w = (0..l.in_features * l.out_features)
        .map(|_| r.from_signed(g.below(1 << 13) as i64 - (1 << 12)))
        .collect();
    (
        RingTensor::from_vec(r, &[l.out_features, l.in_features], w).unwrap(),
        RingTensor::random(r, &[l.out_features], g).unwrap(),
    )
}

fn expected(x: &RingTensor, w: &RingTensor, b: &RingTensor) -> RingTensor {
    let mut y = x.matmul(&w.transpose().unwrap()).unwrap();
    let out = b.shape()[0];
    for (i, v) in y.data_mut().iter_mut().enumerate() {
        *v = ring().add(*v, b.data()[i % out]);
    }
    y
}

/// Two layers of different shapes preprocessed in one batch, then used online in one message
/// (the second before the first, as a caller may): both equal X·Wᵀ + b, for several lengths.
#[test]
fn preprocessed_fc_products_are_exact() {
    let mut g = Prg::from_seed(&Seed([5; 16]));
    for seq in [1usize, 7, 33] {
        let layers = [layer(seq, 40, 70), layer(seq, 129, 17)];
        let (ws, bs): (Vec<_>, Vec<_>) = layers.iter().map(|l| weights(l, &mut g)).unzip();
        let fcs: Vec<PreparedFc> = layers
            .iter()
            .zip(ws.iter().zip(&bs))
            .map(|(l, (w, b))| PreparedFc::new(*l, w, Some(b)).unwrap())
            .collect();
        let xs: Vec<RingTensor> = layers
            .iter()
            .map(|l| RingTensor::random(ring(), &[seq, l.in_features], &mut g).unwrap())
            .collect();
        let shares: Vec<(RingTensor, RingTensor)> =
            xs.iter().map(|x| share(x, &mut g).unwrap()).collect();
        let (y0, y1) = run_two_party(
            |ch| {
                let s = ClientSession::setup(ch, ring())?;
                let mut masks = fc_premask_client(ch, &s, &layers)?;
                masks.reverse();
                online_client(ch, masks, &[&shares[1].0, &shares[0].0])
            },
            |ch| {
                let s = ServerSession::setup(ch, ring())?;
                let reqs: Vec<(&PreparedFc, usize)> = fcs.iter().map(|f| (f, seq)).collect();
                let mut masks = fc_premask_server(ch, &s, &reqs)?;
                let m0 = masks.remove(0);
                let m1 = masks.remove(0);
                fc_online_server(
                    ch,
                    vec![(&fcs[1], m1, &shares[1].1), (&fcs[0], m0, &shares[0].1)],
                )
            },
        )
        .unwrap();
        for (j, i) in [1usize, 0].into_iter().enumerate() {
            assert_eq!(
                reconstruct(&y0[j], &y1[j]).unwrap(),
                expected(&xs[i], &ws[i], &bs[i]),
                "layer {i} at {seq} rows"
            );
        }
    }
}

/// A mask made for another length is refused on both sides, and a masked-input message of the
/// wrong size is refused by the server before it computes anything.
#[test]
fn masks_of_another_shape_and_wrong_messages_are_refused() {
    let mut g = Prg::from_seed(&Seed([6; 16]));
    let l = layer(4, 10, 6);
    let (w, b) = weights(&l, &mut g);
    let fc = PreparedFc::new(l, &w, Some(&b)).unwrap();
    let x_long = RingTensor::random(ring(), &[5, 10], &mut g).unwrap();
    let (c, s) = run_two_party(
        |ch| {
            let s = ClientSession::setup(ch, ring())?;
            let mut masks = fc_premask_client(ch, &s, &[l, l])?;
            let wrong = online_client(ch, vec![masks.remove(0)], &[&x_long]).map(drop);
            // A short message where the server expects a 4×10 masked input.
            ch.send_msg(&[1, 2, 3])?;
            ch.flush()?;
            Ok(wrong)
        },
        |ch| {
            let s = ServerSession::setup(ch, ring())?;
            let mut masks = fc_premask_server(ch, &s, &[(&fc, 4), (&fc, 4)])?;
            let x1_long = RingTensor::zeros(ring(), &[5, 10])?;
            let wrong = fc_online_server(ch, vec![(&fc, masks.remove(0), &x1_long)]).map(drop);
            let x1 = RingTensor::zeros(ring(), &[4, 10])?;
            let short = fc_online_server(ch, vec![(&fc, masks.remove(0), &x1)]).map(drop);
            Ok((wrong, short))
        },
    )
    .unwrap();
    assert!(matches!(c, Err(Error::InvalidArgument(_))), "{c:?}");
    assert!(matches!(s.0, Err(Error::InvalidArgument(_))), "{:?}", s.0);
    assert!(matches!(s.1, Err(Error::Malformed(_))), "{:?}", s.1);
}

/// Attention-shaped products by Beaver triples: 3 heads of one shape (the block-diagonal batch),
/// 2 of different shapes (head by head), and runs of equal shapes one after another (a decode
/// step's batch: each block's Q·Kᵀ heads, then its P·V heads, each run block-diagonal), each
/// equal to A·B mod 2^ℓ.
#[test]
fn triple_products_are_exact() {
    use veil_linear::triples::{beaver_matmul, triples_client, triples_server};
    let mut g = Prg::from_seed(&Seed([7; 16]));
    let runs = [[(2, 4, 6); 2], [(2, 6, 4); 2], [(2, 4, 7); 2]].concat();
    for dims in [vec![(8, 16, 8); 3], vec![(5, 4, 6), (9, 3, 2)], runs] {
        let a: Vec<RingTensor> = dims
            .iter()
            .map(|&(n, k, _)| RingTensor::random(ring(), &[n, k], &mut g).unwrap())
            .collect();
        let b: Vec<RingTensor> = dims
            .iter()
            .map(|&(_, k, m)| RingTensor::random(ring(), &[k, m], &mut g).unwrap())
            .collect();
        let (a0, a1): (Vec<_>, Vec<_>) = a.iter().map(|x| share(x, &mut g).unwrap()).unzip();
        let (b0, b1): (Vec<_>, Vec<_>) = b.iter().map(|x| share(x, &mut g).unwrap()).unzip();
        let (z0, z1) = run_two_party(
            |ch| {
                let s = ClientSession::setup(ch, ring())?;
                let t = triples_client(ch, &s, ring(), &dims)?;
                beaver_matmul(ch, veil_net::Role::Client, t, &a0, &b0)
            },
            |ch| {
                let s = ServerSession::setup(ch, ring())?;
                let t = triples_server(ch, &s, ring(), &dims)?;
                beaver_matmul(ch, veil_net::Role::Server, t, &a1, &b1)
            },
        )
        .unwrap();
        for h in 0..dims.len() {
            assert_eq!(
                reconstruct(&z0[h], &z1[h]).unwrap(),
                a[h].matmul(&b[h]).unwrap(),
                "{dims:?}, head {h}"
            );
        }
    }
}

/// Operands of another shape than the triple's are refused before anything is sent, and a
/// short opening message is refused.
#[test]
fn triples_of_another_shape_and_short_openings_are_refused() {
    use veil_linear::triples::{beaver_matmul, triples_client, triples_server};
    let dims = [(4, 3, 2)];
    let (c, s) = run_two_party(
        |ch| {
            let s = ClientSession::setup(ch, ring())?;
            let mut t = triples_client(ch, &s, ring(), &[dims[0], dims[0]])?;
            let a = RingTensor::zeros(ring(), &[5, 3])?;
            let b = RingTensor::zeros(ring(), &[3, 2])?;
            let wrong = beaver_matmul(ch, veil_net::Role::Client, vec![t.remove(0)], &[a], &[b]);
            ch.send_msg(&[9; 5])?;
            ch.flush()?;
            Ok(wrong.map(drop))
        },
        |ch| {
            let s = ServerSession::setup(ch, ring())?;
            let mut t = triples_server(ch, &s, ring(), &[dims[0], dims[0]])?;
            let a = RingTensor::zeros(ring(), &[4, 3])?;
            let b = RingTensor::zeros(ring(), &[3, 2])?;
            let short = beaver_matmul(ch, veil_net::Role::Server, vec![t.remove(1)], &[a], &[b]);
            Ok(short.map(drop))
        },
    )
    .unwrap();
    assert!(matches!(c, Err(Error::InvalidArgument(_))), "{c:?}");
    assert!(matches!(s, Err(Error::Malformed(_))), "{s:?}");
}
