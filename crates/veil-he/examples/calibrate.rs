//! Per-operation costs of the BFV engine on this machine, single thread: the constants of
//! `veil_linear::cost` are measured with
//! `cargo run --release -p veil-he --example calibrate`.

use std::time::Instant;

use veil_core::{Prg, Ring};
use veil_he::{Accumulator, EvalCiphertext, NttPlaintext, PackShape, ParamSet, Params, SecretKey};

fn time<T>(reps: usize, mut f: impl FnMut() -> T) -> f64 {
    let _ = f();
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(f());
    }
    t.elapsed().as_secs_f64() * 1e6 / reps as f64
}

fn main() -> veil_core::Result<()> {
    // The `veil` binary's allocator settings, so the costs are the ones it sees.
    veil_core::process::keep_freed_memory();
    let ring = Ring::new(41)?;
    for set in [ParamSet::N8192, ParamSet::N8192Q4] {
        let p = Params::new(set, ring)?;
        let n = p.degree();
        let mut prg = Prg::from_os_entropy();
        let sk = SecretKey::generate(&p, &mut prg);
        let pk = sk.public_key(&mut prg);
        let gk = sk.galois_keys(&mut prg)?;
        let msg: Vec<u64> = (0..n as u64).map(|i| i * 31 % (1 << 40)).collect();
        let w: Vec<i64> = (0..n as i64).map(|i| i % 2001 - 1000).collect();
        let ct = sk.encrypt(&msg, &mut prg)?;
        let ev = EvalCiphertext::expand(&p, &ct);
        let wp = NttPlaintext::new(&p, &w, 1 << 16)?;
        let encrypt = time(200, || sk.encrypt(&msg, &mut prg).unwrap());
        let expand = time(200, || EvalCiphertext::expand(&p, &ct));
        let weight_ntt = time(300, || NttPlaintext::new(&p, &w, 1 << 16).unwrap());
        let mut acc = Accumulator::new(&p);
        let product = time(2000, || acc.mul_acc(&p, &ev, &wp));
        let mut fold = EvalCiphertext::expand(&p, &ct);
        let add_plain = time(200, || fold.add_plain(&p, &msg).unwrap());
        let positions: Vec<usize> = (0..n).step_by(64).collect();
        let add = vec![0u64; positions.len()];
        let mut small = Accumulator::new(&p);
        small.mul_acc(&p, &ev, &wp);
        let response = time(200, || {
            small
                .clone()
                .into_response(&pk, &positions, &add, &mut prg)
                .unwrap()
        });
        let shape = PackShape::new(64, 2, 63)?;
        let ks = time(200, || {
            gk.pack(vec![small.clone(), small.clone()], &shape).unwrap()
        });
        let shape16 = PackShape::new(64, 16, 63)?;
        let pack16 = time(20, || gk.pack(vec![small.clone(); 16], &shape16).unwrap());
        let key_switch = (pack16 - ks) / 14.0;
        let resp = small
            .clone()
            .into_response(&pk, &positions, &add, &mut prg)?;
        let decrypt = time(200, || sk.decrypt_response(&resp, &positions).unwrap());
        println!(
            "{set:?}: key switch (marginal, pack of 16 vs 2) {key_switch:.1} µs, \
             decrypt {decrypt:.1} µs"
        );
        println!(
            "{set:?} limbs {}: encrypt {encrypt:.1} µs, expand {expand:.1}, add_plain {add_plain:.1}, \
             weight NTT {weight_ntt:.1}, product {product:.2}, response {response:.1}, \
             pack of 2 (one key switch) {ks:.1}",
            p.limbs()
        );
    }
    Ok(())
}
