//! Prints the non-linear benchmark, one JSON object per line.
//! `cargo run --release -p veil-nonlinear --example bench [-- --quick]`

fn main() -> veil_core::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick {
        veil_nonlinear::bench::Scale::Quick
    } else {
        veil_nonlinear::bench::Scale::Full
    };
    for v in veil_nonlinear::bench::run(scale)? {
        println!("{v}");
    }
    Ok(())
}
