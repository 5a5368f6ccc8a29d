//! Cost reports: one-off session set-up apart from the online inference, per operator class
//! (the meter's outermost labels), totals, and the online time on a network: measured when the
//! run went over a shaped link (`veil_net::shaped_pair`), otherwise modelled for the LAN and the
//! WAN ([`modelled_seconds`]).

use std::collections::BTreeMap;

use serde_json::{json, Value};
use veil_core::CostClass;
use veil_net::{LabelStats, Role};

use veil_net::{NetworkModel, LAN, WAN};

/// Costs of one phase as one party metered them.
#[derive(Clone, Debug, Default)]
pub struct PhaseCost {
    /// Per cost class (the meter's outermost labels).
    pub per_op: BTreeMap<CostClass, LabelStats>,
}

impl PhaseCost {
    /// All classes summed.
    pub fn total(&self) -> LabelStats {
        let mut t = LabelStats::default();
        self.per_op.values().for_each(|s| t.add(s));
        t
    }

    /// `time_s`, bytes each way and `rounds` of the whole phase, and `per_op` with the same
    /// keys, as metered by `role`.
    pub fn to_json(&self, role: Role) -> Value {
        let per_op: serde_json::Map<String, Value> = self
            .per_op
            .iter()
            .map(|(k, v)| (k.to_string(), stats_json(v, role)))
            .collect();
        let mut v = stats_json(&self.total(), role);
        v["per_op"] = Value::Object(per_op);
        v
    }
}

/// The report of one private inference.
#[derive(Clone, Debug)]
pub struct CostReport {
    /// Whose meter produced it (fixes which direction "sent" is).
    pub role: Role,
    /// The session's set-up (keys, base OTs), apart from any one inference.
    pub setup: PhaseCost,
    /// The preprocessing this inference used ([`crate::preprocess`]), if any.
    pub offline: Option<PhaseCost>,
    /// The inference itself, after the prompt is known.
    pub online: PhaseCost,
    /// The shaped link the times were measured on; `None`: unshaped (loopback) times.
    pub network: Option<NetworkModel>,
}

/// Wall-clock time on a modelled network, from an unshaped run: measured time, plus each
/// direction's bytes at the link's rate (each direction is its own link), plus half an RTT per
/// flight (a flight arrives one-way latency after it left). It ignores the overlap of
/// computation with transfer inside a flight and of the two directions (the protocols alternate),
/// TCP (slow start, headers) and loss; the measured time already holds the loopback transfer, so
/// the model slightly over-estimates. A shaped run measures what this models, overlaps included.
pub(crate) fn modelled_seconds(s: &LabelStats, net: NetworkModel) -> f64 {
    let transfer = |bytes: u64| 8.0 * bytes as f64 / net.bits_per_second;
    s.seconds
        + transfer(s.bytes_sent)
        + transfer(s.bytes_received)
        + s.rounds() as f64 * net.rtt_s / 2.0
}

fn network_json(net: &NetworkModel) -> Value {
    json!({
        "name": net.name,
        "bits_per_second": net.bits_per_second,
        "rtt_s": net.rtt_s,
    })
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
    /// The online phase at the top level (`time_s`, bytes each way, `rounds`, `per_op`,
    /// modelled LAN/WAN), `setup`, and `offline` with the same keys when the inference used
    /// preprocessed material.
    pub fn to_json(&self) -> Value {
        let mut v = self.phase_json(&self.online);
        v["setup"] = stats_json(&self.setup.total(), self.role);
        v["offline"] = self
            .offline
            .as_ref()
            .map_or(Value::Null, |p| self.phase_json(p));
        v["network"] = self.network.as_ref().map_or(Value::Null, network_json);
        v["measured"] = json!(self.network.is_some());
        v
    }

    fn phase_json(&self, phase: &PhaseCost) -> Value {
        let total = phase.total();
        let mut v = phase.to_json(self.role);
        if self.network.is_none() {
            v["modelled_lan_s"] = json!(modelled_seconds(&total, LAN));
            v["modelled_wan_s"] = json!(modelled_seconds(&total, WAN));
        }
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
        // Once per session: a renewing client pays it again with each new key.
        line("session set-up", &self.setup.total());
        if let Some(off) = &self.offline {
            for (k, v) in &off.per_op {
                line(&format!("{k} (offline)"), v);
            }
            line("offline total", &off.total());
        }
        for (k, v) in &self.online.per_op {
            line(k.as_str(), v);
        }
        let t = self.online.total();
        line("online total", &t);
        out.push_str(&match self.network {
            Some(net) => format!(
                "measured online time over a shaped {net}: {:.2} s (times above include it)\n",
                t.seconds
            ),
            None => format!(
                "modelled online time (loopback time + bytes at the rate + RTT/2 per flight): \
                 {LAN} {:.2} s, {WAN} {:.2} s\n",
                modelled_seconds(&t, LAN),
                modelled_seconds(&t, WAN)
            ),
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use veil_net::{shaped_pair, Channel, Clock, SimClock};

    use super::*;

    /// Without computation, a ping-pong over the shaped link takes exactly what the model says:
    /// the model and the link agree on bytes, flights and latency.
    #[test]
    fn model_matches_a_shaped_ping_pong() {
        for net in [LAN, WAN] {
            let clock = Arc::new(SimClock::default());
            let (mut c, mut s) = shaped_pair(net, clock.clone()).unwrap();
            let mut buf = vec![0u8; 1 << 17];
            for (i, n) in [100usize, 5000, 1 << 16, 7].into_iter().enumerate() {
                let (from, to) = if i % 2 == 0 {
                    (&mut c, &mut s)
                } else {
                    (&mut s, &mut c)
                };
                from.send(&buf[..n]).unwrap();
                from.send(&buf[..n / 2]).unwrap();
                from.flush().unwrap();
                to.recv(&mut buf[..n + n / 2]).unwrap();
            }
            let mut stats = c.meter().total();
            stats.seconds = 0.0;
            let modelled = modelled_seconds(&stats, net);
            let measured = clock.now().as_secs_f64();
            assert!(
                (modelled - measured).abs() < 1e-6,
                "{net}: modelled {modelled} s, measured {measured} s"
            );
            assert_eq!(stats.rounds(), 4);
        }
    }

    #[test]
    fn model_charges_each_direction_and_half_an_rtt_per_flight() {
        let s = LabelStats {
            bytes_sent: 1_000_000,
            bytes_received: 3_000_000,
            flights_sent: 5,
            flights_received: 5,
            seconds: 2.0,
        };
        let want = 2.0 + 0.08 + 0.24 + 10.0 * 0.040;
        assert!((modelled_seconds(&s, WAN) - want).abs() < 1e-12);
    }

    #[test]
    fn json_says_whether_time_was_measured() {
        let mut r = CostReport {
            role: Role::Client,
            setup: PhaseCost::default(),
            offline: None,
            online: PhaseCost::default(),
            network: None,
        };
        let v = r.to_json();
        assert_eq!(
            (&v["network"], &v["measured"]),
            (&Value::Null, &json!(false))
        );
        assert!(v["modelled_wan_s"].is_number());
        r.network = Some(WAN);
        let v = r.to_json();
        assert_eq!(v["network"]["rtt_s"], json!(0.08));
        assert_eq!(v["measured"], json!(true));
        assert!(v.get("modelled_wan_s").is_none());
    }
}
