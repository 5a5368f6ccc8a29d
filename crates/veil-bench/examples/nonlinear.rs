//! Prints the non-linear benchmark, one JSON object per line, as each operator finishes.
//! `cargo run --release -p veil-bench --example nonlinear [-- --quick] [-- --only <name part>]`

use veil_bench::nonlinear::{run_streaming, Scale};

fn main() -> veil_core::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let scale = if args.iter().any(|a| a == "--quick") {
        Scale::Quick
    } else {
        Scale::Full
    };
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1));
    run_streaming(scale, only.map(String::as_str), &mut |v| println!("{v}"))
}
