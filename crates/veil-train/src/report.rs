//! Report writers for the substitution workflow: `substitution.json` (everything, machine
//! readable), `substitution.md` (Table 3 row, per-stage accuracy, every step, per-block bounds)
//! and `accuracy.svg` (accuracy after each stage, like the paper's Figure 3).

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};
use veil_core::{Error, Result};

use crate::substitute::{Operator, SubstitutionReport};

/// Whether the exported model runs through the fixed-point simulator without overflow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FixedPointCheck {
    /// ℓ of the simulated format.
    pub ring_bits: u32,
    /// f of the simulated format.
    pub frac_bits: u32,
    /// Examples pushed through the simulator.
    pub examples: usize,
    /// Fraction of those examples whose fixed-point prediction equals the f32 prediction.
    pub prediction_agreement: f64,
    /// Each block's result.
    pub per_block: Vec<BlockFixedPoint>,
}

/// One block's result in the fixed-point simulator, over all simulated examples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockFixedPoint {
    /// Block index.
    pub block: usize,
    /// Largest |output| of the block in the simulator (decoded).
    pub max_abs: f64,
    /// Largest |simulated − f32| of the block's output.
    pub max_error: f64,
    /// Product accumulators that exceeded 2^(ℓ−1) and wrapped.
    pub wrapped: usize,
    /// GELU / LayerNorm inputs outside the domain the fixed-point approximations are accurate on.
    pub out_of_domain: usize,
}

impl BlockFixedPoint {
    /// Whether any accumulator wrapped.
    pub fn overflow(&self) -> bool {
        self.wrapped > 0
    }
}

impl FixedPointCheck {
    /// Whether no block wrapped.
    pub fn overflow_free(&self) -> bool {
        self.per_block.iter().all(|b| !b.overflow())
    }
}

/// The full report document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReportDocument {
    /// Model name (folder) and task name, for the Table 3 row.
    pub model: String,
    /// Task name.
    pub task: String,
    /// What the substitution did.
    pub substitution: SubstitutionReport,
    /// The fixed-point check of the result, if it ran.
    pub fixed_point: Option<FixedPointCheck>,
}

fn pct(x: f64) -> String {
    format!("{:.2}", 100.0 * x)
}

fn bound_label(b: Option<f64>) -> String {
    b.map_or("∞".to_string(), |b| format!("{b}"))
}

fn stage_labels(doc: &ReportDocument) -> Vec<(String, f64)> {
    let sub = &doc.substitution;
    std::iter::once(("Original".to_string(), sub.original.accuracy))
        .chain(
            sub.stages
                .iter()
                .map(|s| (format!("−{}", s.operator.label()), s.accuracy)),
        )
        .collect()
}

fn max_list(v: &[f32]) -> String {
    v.iter()
        .map(|x| format!("{x:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Markdown report.
pub(crate) fn markdown(doc: &ReportDocument) -> String {
    let sub = &doc.substitution;
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(
        w,
        "# Operator substitution: {} on {}\n",
        doc.model, doc.task
    );
    let _ = writeln!(
        w,
        "{} blocks. Original dev accuracy {} % on {} examples; Δα = {} points, so a step is \
         kept when its accuracy is above {} %. Final accuracy {} %. Total time {:.0} s.\n",
        sub.num_blocks,
        pct(sub.original.accuracy),
        sub.original.examples,
        pct(sub.max_accuracy_drop),
        pct(sub.threshold),
        pct(sub.final_evaluation.accuracy),
        sub.seconds
    );
    let resumed = sub.resumed_steps();
    if resumed > 0 {
        let _ = writeln!(
            w,
            "The run was interrupted and resumed: {resumed} of {} steps were (partly) done by an \
             earlier invocation (Resumed column).\n",
            sub.steps.len()
        );
    }
    let _ = writeln!(w, "## Replaced operators (as the paper's Table 3)\n");
    let _ = writeln!(w, "| Model | #Blocks | Task | GELU | Softmax | LN1 | LN2 |");
    let _ = writeln!(w, "|---|---:|---|---:|---:|---:|---:|");
    let counts: Vec<String> = Operator::ALL
        .iter()
        .map(|&op| sub.replaced(op).to_string())
        .collect();
    let _ = writeln!(
        w,
        "| {} | {} | {} | {} |\n",
        doc.model,
        sub.num_blocks,
        doc.task,
        counts.join(" | ")
    );
    let _ = writeln!(
        w,
        "## Accuracy after each stage (as the paper's Figure 3)\n"
    );
    let _ = writeln!(w, "![accuracy after each stage](accuracy.svg)\n");
    // Two-class tasks also get F1 (the paper reports accuracy and F1 for MRPC).
    let with_f1 = sub.original.f1.is_some();
    let f1_cell = |f1: Option<f64>| match (with_f1, f1) {
        (false, _) => String::new(),
        (true, Some(v)) => format!(" {} |", pct(v)),
        (true, None) => " – |".into(),
    };
    let (f1_head, f1_rule) = if with_f1 {
        (" Dev F1 % |", "---:|")
    } else {
        ("", "")
    };
    let _ = writeln!(
        w,
        "| Stage | B | Replaced blocks | Dev accuracy % |{f1_head}"
    );
    let _ = writeln!(w, "|---|---:|---|---:|{f1_rule}");
    let _ = writeln!(
        w,
        "| Original | – | – | {} |{}",
        pct(sub.original.accuracy),
        f1_cell(sub.original.f1)
    );
    for s in &sub.stages {
        let blocks: Vec<String> = s.replaced_blocks.iter().map(|b| b.to_string()).collect();
        let _ = writeln!(
            w,
            "| −{} | {} | {} | {} |{}",
            s.operator.label(),
            bound_label(s.bound),
            if blocks.is_empty() {
                "none".into()
            } else {
                blocks.join(", ")
            },
            pct(s.accuracy),
            f1_cell(s.f1)
        );
    }
    let _ = writeln!(w, "\n## Every step\n");
    let _ = writeln!(
        w,
        "| # | Operator | Block | B | Train loss | Dev accuracy % | Decision | max abs hidden state per block | Time s | Resumed | Attempts: updates → accuracy % |"
    );
    let _ = writeln!(w, "|---:|---|---:|---:|---:|---:|---|---|---:|---|---|");
    for (i, s) in sub.steps.iter().enumerate() {
        let attempts: Vec<String> = s
            .attempts
            .iter()
            .map(|a| format!("{} → {}", a.updates, pct(a.accuracy)))
            .collect();
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {:.4} | {} | {} | {} | {:.1} | {} | {} |",
            i + 1,
            s.operator.label(),
            s.blocks_label(),
            bound_label(s.bound),
            s.train_loss,
            pct(s.accuracy),
            if s.accepted { "accepted" } else { "rejected" },
            max_list(&s.max_abs_hidden),
            s.seconds,
            if s.resumed { "yes" } else { "" },
            attempts.join("; ")
        );
    }
    let _ = writeln!(w, "\n## Final model\n");
    let _ = writeln!(
        w,
        "Largest |hidden state| per block on dev (f32): {}.\n",
        max_list(&sub.final_evaluation.max_abs_hidden)
    );
    match &doc.fixed_point {
        None => {
            let _ = writeln!(w, "Fixed-point simulation: not run.");
        }
        Some(fp) => {
            let verdict = if fp.overflow_free() {
                "no overflow in any block"
            } else {
                "OVERFLOW"
            };
            let _ = writeln!(
                w,
                "Fixed-point simulation (ℓ = {}, f = {}, {} dev examples): {verdict}; \
                 predictions agree with f32 on {} %.\n",
                fp.ring_bits,
                fp.frac_bits,
                fp.examples,
                pct(fp.prediction_agreement)
            );
            let _ = writeln!(
                w,
                "| Block | max abs output | max abs error vs f32 | wrapped accumulators | \
                 inputs outside approximation domain | Overflow |"
            );
            let _ = writeln!(w, "|---:|---:|---:|---:|---:|---|");
            for b in &fp.per_block {
                let _ = writeln!(
                    w,
                    "| {} | {:.3} | {:.2e} | {} | {} | {} |",
                    b.block,
                    b.max_abs,
                    b.max_error,
                    b.wrapped,
                    b.out_of_domain,
                    if b.overflow() { "yes" } else { "no" }
                );
            }
        }
    }
    md
}

/// A bar chart of the accepted model's accuracy after each stage, with the acceptance threshold
/// as a dashed line. Hand-written SVG: no plotting dependency for one chart.
pub(crate) fn accuracy_svg(doc: &ReportDocument) -> String {
    let bars = stage_labels(doc);
    let threshold = doc.substitution.threshold;
    let (w, h, left, right, top, bottom) = (560.0, 320.0, 60.0, 20.0, 30.0, 50.0);
    let lowest = bars.iter().map(|b| b.1).fold(threshold, f64::min);
    let highest = bars.iter().map(|b| b.1).fold(threshold, f64::max);
    // Zoom the axis onto the data (differences of a point or two matter), in 5-point steps.
    let lo = ((lowest - 0.05) * 20.0).floor().max(0.0) / 20.0;
    let hi = (((highest + 0.02) * 20.0).ceil() / 20.0)
        .min(1.0)
        .max(lo + 0.05);
    let plot_h = h - top - bottom;
    let y = |acc: f64| top + plot_h * (1.0 - (acc - lo) / (hi - lo));
    let slot = (w - left - right) / bars.len() as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="18" text-anchor="middle" font-size="14">Dev accuracy after each substitution stage ({}, {})</text>"#,
        w / 2.0,
        escape(&doc.model),
        escape(&doc.task)
    );
    let ticks = ((hi - lo) / 0.05).round() as usize;
    for i in 0..=ticks {
        let acc = lo + 0.05 * i as f64;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{:.0}%</text>"##,
            w - right,
            left - 6.0,
            y(acc) + 4.0,
            100.0 * acc,
            y = y(acc)
        );
    }
    for (i, (label, acc)) in bars.iter().enumerate() {
        let x = left + slot * i as f64 + slot * 0.2;
        let bw = slot * 0.6;
        let top_y = y(acc.max(lo));
        let _ = writeln!(
            s,
            r##"<rect x="{x:.1}" y="{top_y:.1}" width="{bw:.1}" height="{:.1}" fill="{}"/>"##,
            top + plot_h - top_y,
            if i == 0 { "#888" } else { "#3a6ea5" }
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{:.1}</text><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x + bw / 2.0,
            top_y - 4.0,
            100.0 * acc,
            x + bw / 2.0,
            h - bottom + 18.0,
            escape(label)
        );
    }
    let ty = y(threshold);
    let _ = writeln!(
        s,
        r##"<line x1="{left}" x2="{}" y1="{ty:.1}" y2="{ty:.1}" stroke="#c33" stroke-dasharray="6 4"/><text x="{}" y="{:.1}" text-anchor="end" fill="#c33">α − Δα</text>"##,
        w - right,
        w - right,
        ty - 4.0
    );
    let _ = writeln!(s, "</svg>");
    s
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Writes `substitution.json`, `substitution.md` and `accuracy.svg` into `dir`.
pub(crate) fn write_reports(dir: &Path, doc: &ReportDocument) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Other(format!("cannot create {}: {e}", dir.display())))?;
    let json = serde_json::to_string_pretty(doc).map_err(|e| Error::Other(e.to_string()))?;
    for (name, text) in [
        ("substitution.json", json),
        ("substitution.md", markdown(doc)),
        ("accuracy.svg", accuracy_svg(doc)),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text)
            .map_err(|e| Error::Other(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::substitute::tests::ScriptedTarget;
    use crate::substitute::{run_substitution, SubstitutionConfig};

    fn document() -> ReportDocument {
        let script = [0.90, 0.91, 0.89, 0.88, 0.95, 0.10, 0.87, 0.889, 0.5];
        let mut target = ScriptedTarget::new(2, &script);
        let substitution =
            run_substitution(&mut target, &SubstitutionConfig::default(), None, |_| {})
                .unwrap()
                .finished()
                .unwrap();
        ReportDocument {
            model: "tiny<2>".into(),
            task: "SST-2".into(),
            substitution,
            fixed_point: Some(FixedPointCheck {
                ring_bits: 41,
                frac_bits: 13,
                examples: 10,
                prediction_agreement: 1.0,
                per_block: vec![
                    BlockFixedPoint {
                        block: 0,
                        max_abs: 3.5,
                        max_error: 1e-3,
                        wrapped: 0,
                        out_of_domain: 0,
                    },
                    BlockFixedPoint {
                        block: 1,
                        max_abs: 9.0,
                        max_error: 2e-3,
                        wrapped: 0,
                        out_of_domain: 2,
                    },
                ],
            }),
        }
    }

    #[test]
    fn markdown_has_table3_row_and_every_step() {
        let md = markdown(&document());
        assert!(
            md.contains("| tiny<2> | 2 | SST-2 | 2 | 1 | 0 | 1 |"),
            "{md}"
        );
        assert_eq!(md.matches("| accepted |").count(), 4);
        assert_eq!(md.matches("| rejected |").count(), 4);
        assert!(md.contains("| −Softmax | 32 | 0 | 95.00 |"), "{md}");
        assert!(md.contains("| −LN1 | 24 | none | 95.00 |"), "{md}");
        assert!(md.contains("no overflow in any block"));
        assert!(!md.contains("resumed:"), "{md}");
        let mut doc = document();
        doc.substitution.steps[0].resumed = true;
        let md = markdown(&doc);
        assert!(md.contains("resumed: 1 of 8 steps"), "{md}");
        assert_eq!(md.matches("| yes |").count(), 1);
        assert_eq!(md.matches("| 10 → ").count(), 8, "{md}");
        assert!(!md.contains("Dev F1"), "{md}");
    }

    /// A two-class task's report has F1 beside accuracy in the stage table.
    #[test]
    fn two_class_reports_have_f1_per_stage() {
        let mut doc = document();
        let sub = &mut doc.substitution;
        sub.original.f1 = Some(0.8);
        for (i, s) in sub.stages.iter_mut().enumerate() {
            s.f1 = Some(0.7 + 0.01 * i as f64);
        }
        let md = markdown(&doc);
        assert!(md.contains("| Dev accuracy % | Dev F1 % |"), "{md}");
        assert!(md.contains("| Original | – | – | 90.00 | 80.00 |"), "{md}");
        assert!(md.contains("| −Softmax | 32 | 0 | 95.00 | 71.00 |"), "{md}");
    }

    #[test]
    fn svg_has_a_bar_per_stage_and_escapes_text() {
        let svg = accuracy_svg(&document());
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<rect").count(), 5);
        assert!(svg.contains("tiny&lt;2&gt;") && !svg.contains("tiny<2>"));
        for label in ["Original", "−GELU", "−Softmax", "−LN1", "−LN2"] {
            assert!(svg.contains(&format!(">{label}<")), "{label}");
        }
    }

    #[test]
    fn reports_round_trip_through_json() {
        let dir = tempfile::tempdir().unwrap();
        let doc = document();
        write_reports(dir.path(), &doc).unwrap();
        let back: ReportDocument =
            serde_json::from_slice(&std::fs::read(dir.path().join("substitution.json")).unwrap())
                .unwrap();
        assert_eq!(back, doc);
        assert!(dir.path().join("substitution.md").exists());
        assert!(dir.path().join("accuracy.svg").exists());
    }
}
