//! `cargo run --release -p veil-bench --example linear` prints one JSON object per line for every
//! shape of the benchmark; `-- fc SEQ IN OUT`, `-- fc-preprocessed SEQ IN OUT` or
//! `-- shared HEADS N K M` runs a single shape.
fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(2)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rows = match (std::env::args().nth(1).as_deref(), args.as_slice()) {
        (Some("fc"), &[s, i, o]) => veil_bench::linear::bench_fc(s, i, o).map(|v| vec![v]),
        (Some("fc-preprocessed"), &[s, i, o]) => {
            veil_bench::linear::bench_fc_preprocessed(s, i, o).map(|v| vec![v])
        }
        (Some("shared"), &[h, n, k, m]) => {
            veil_bench::linear::bench_shared(h, n, k, m, "shared").map(|v| vec![v])
        }
        _ => veil_bench::linear::run(),
    };
    match rows {
        Ok(rows) => rows.iter().for_each(|r| println!("{r}")),
        Err(e) => {
            eprintln!("benchmark failed: {e}");
            std::process::exit(1);
        }
    }
}
