//! Prints the veil-ot benchmark, one JSON object per line.
//! `cargo run --release -p veil-bench --example ot [protocol ...]` (default: all protocols)

fn main() -> veil_core::Result<()> {
    let only: Vec<String> = std::env::args().skip(1).collect();
    for v in veil_bench::ot::run_selected(|p| only.is_empty() || only.iter().any(|o| o == p))? {
        println!("{v}");
    }
    Ok(())
}
