//! The `veil` command.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "veil", version, about = "Private transformer inference")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Private classification of a few sentences over loopback with the embedded default model.
    Demo,
}

fn main() {
    let cli = Cli::parse();
    let res: veil_core::Result<()> = match cli.cmd {
        Cmd::Demo => Err(veil_core::Error::Unsupported(
            "the end-to-end demo needs the private forward pass, which is not built yet".into(),
        )),
    };
    if let Err(e) = res {
        eprintln!("veil: {e}");
        std::process::exit(1);
    }
}
