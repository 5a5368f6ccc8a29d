//! Writes the overlay of a fine-tuned public-embedding model folder (every tensor but the public
//! embedding tables, f16) and copies its config: how the demo's default model is shipped.
//!
//! `cargo run --release -p veil-model --example overlay -- MODEL_DIR OUT_DIR`

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [model, out] = args.as_slice() else {
        return Err("usage: overlay MODEL_DIR OUT_DIR".into());
    };
    let m = veil_model::folder::load(model)?;
    std::fs::create_dir_all(out)?;
    veil_model::folder::save_overlay(&m.transformer, &out.join("overlay.safetensors"))?;
    std::fs::write(out.join("config.json"), m.config.to_json())?;
    println!("wrote {}", out.display());
    Ok(())
}
