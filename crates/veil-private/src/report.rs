//! Cost reports: one-off session set-up apart from the online inference, per operator class
//! (the meter's outermost labels), totals, and modelled LAN/WAN times
//! (compute time + bytes / bandwidth + rounds × RTT).

use std::collections::BTreeMap;

use serde_json::{json, Value};
use veil_net::{LabelStats, Role};

/// A network to model: bandwidth in bits per second and round-trip time in seconds.
#[derive(Clone, Copy, Debug)]
pub struct NetworkModel {
    pub name: &'static str,
    pub bits_per_second: f64,
    pub rtt_s: f64,
}

pub const LAN: NetworkModel = NetworkModel {
    name: "LAN",
    bits_per_second: 3e9,
    rtt_s: 0.8e-3,
};
pub const WAN: NetworkModel = NetworkModel {
    name: "WAN",
    bits_per_second: 100e6,
    rtt_s: 80e-3,
};

/// Costs of one phase as one party metered them.
#[derive(Clone, Debug, Default)]
pub struct PhaseCost {
    pub per_op: BTreeMap<String, LabelStats>,
}

impl PhaseCost {
    pub fn total(&self) -> LabelStats {
        let mut t = LabelStats::default();
        self.per_op.values().for_each(|s| t.add(s));
        t
    }
}

/// The report of one private inference.
#[derive(Clone, Debug)]
pub struct CostReport {
    /// Whose meter produced it (fixes which direction "sent" is).
    pub role: Role,
    pub setup: PhaseCost,
    pub online: PhaseCost,
}

/// Wall-clock time on a modelled network: measured compute + transfer + latency. Measured
/// loopback time already contains the (tiny) loopback transfer time, so this slightly
/// over-estimates.
pub fn modelled_seconds(s: &LabelStats, net: NetworkModel) -> f64 {
    let bytes = (s.bytes_sent + s.bytes_received) as f64;
    s.seconds + 8.0 * bytes / net.bits_per_second + s.rounds() as f64 * net.rtt_s
}

fn stats_json(s: &LabelStats, role: Role) -> Value {
    json!({
        "time_s": s.seconds,
        "bytes_client_to_server": s.client_to_server(role),
        "bytes_server_to_client": s.server_to_client(role),
        "rounds": s.rounds(),
    })
}

impl CostReport {
    pub fn to_json(&self) -> Value {
        let online = self.online.total();
        let per_op: serde_json::Map<String, Value> = self
            .online
            .per_op
            .iter()
            .map(|(k, v)| (k.clone(), stats_json(v, self.role)))
            .collect();
        let mut v = stats_json(&online, self.role);
        v["per_op"] = Value::Object(per_op);
        v["setup"] = stats_json(&self.setup.total(), self.role);
        v["modelled_lan_s"] = json!(modelled_seconds(&online, LAN));
        v["modelled_wan_s"] = json!(modelled_seconds(&online, WAN));
        v
    }

    /// A table for the terminal.
    pub fn to_table(&self) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        let mut out = String::new();
        out.push_str(&format!(
            "{:<16} {:>9} {:>12} {:>12} {:>7}\n",
            "operator", "time (s)", "C→S (MB)", "S→C (MB)", "rounds"
        ));
        let mut line = |name: &str, s: &LabelStats| {
            out.push_str(&format!(
                "{:<16} {:>9.3} {:>12.3} {:>12.3} {:>7}\n",
                name,
                s.seconds,
                mb(s.client_to_server(self.role)),
                mb(s.server_to_client(self.role)),
                s.rounds()
            ));
        };
        line("set-up (once)", &self.setup.total());
        for (k, v) in &self.online.per_op {
            line(k, v);
        }
        let t = self.online.total();
        line("online total", &t);
        out.push_str(&format!(
            "modelled online time: LAN (3 Gbps, 0.8 ms RTT) {:.2} s, WAN (100 Mbps, 80 ms RTT) {:.2} s\n",
            modelled_seconds(&t, LAN),
            modelled_seconds(&t, WAN)
        ));
        out
    }
}
