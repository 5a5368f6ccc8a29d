//! Prints the non-linear benchmark, one JSON object per line, as each operator finishes.
//! `cargo run --release -p veil-nonlinear --example bench [-- --quick]`

use veil_nonlinear::bench::{run_streaming, Scale};

fn main() -> veil_core::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick { Scale::Quick } else { Scale::Full };
    run_streaming(scale, &mut |v| println!("{v}"))
}
