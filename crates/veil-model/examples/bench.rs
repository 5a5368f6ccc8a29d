//! `cargo run --release -p veil-model --example bench`: one JSON object per line.

fn main() -> Result<(), veil_core::Error> {
    for row in veil_model::bench::run()? {
        println!("{row}");
    }
    Ok(())
}
