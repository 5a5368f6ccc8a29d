//! Traffic and time accounting per operator label.
//!
//! Each party meters its own channel. Labels are [`CostClass`]es (so a report, its JSON keys and
//! the docs name a step one way). Bytes and time go to the innermost active label (entered
//! with [`Meter::enter`]); time is *exclusive*, so nested labels never double count. The same
//! traffic is also totalled per *class*, the outermost active label ([`Meter::by_class`]), which is
//! what a cost report per operator ("Softmax" including its nested "Exp" and "Recip") needs. A "round" is a
//! flight: a maximal run of messages in one direction. Counting both the flights this party sends
//! and the flights it receives gives the protocol's total number of direction changes, the figure
//! that multiplies the network round-trip time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use veil_core::CostClass;

/// Which party owns a meter; turns "sent/received" into "client→server/server→client".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The party that holds the input (it sends first).
    Client,
    /// The party that holds the model.
    Server,
}

/// Totals for one label.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelStats {
    /// Bytes this party sent.
    pub bytes_sent: u64,
    /// Bytes this party received.
    pub bytes_received: u64,
    /// Flights this party started (sends after receiving, or the first send).
    pub flights_sent: u64,
    /// Flights this party received.
    pub flights_received: u64,
    /// Exclusive wall time in seconds.
    pub seconds: f64,
}

impl LabelStats {
    /// Flights either way: the direction changes, which each cost half a network round trip.
    pub fn rounds(&self) -> u64 {
        self.flights_sent + self.flights_received
    }

    /// Adds `o`'s totals to these (a phase's total over its labels).
    pub fn add(&mut self, o: &LabelStats) {
        self.bytes_sent += o.bytes_sent;
        self.bytes_received += o.bytes_received;
        self.flights_sent += o.flights_sent;
        self.flights_received += o.flights_received;
        self.seconds += o.seconds;
    }

    /// Bytes client→server from the point of view of `role`'s meter.
    pub fn client_to_server(&self, role: Role) -> u64 {
        match role {
            Role::Client => self.bytes_sent,
            Role::Server => self.bytes_received,
        }
    }

    /// Bytes server→client from the point of view of `role`'s meter.
    pub fn server_to_client(&self, role: Role) -> u64 {
        match role {
            Role::Client => self.bytes_received,
            Role::Server => self.bytes_sent,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    None,
    Send,
    Recv,
}

struct State {
    stack: Vec<CostClass>,
    /// Depth (stack length) at which each open [`Meter::enter_class`] scope began.
    class_starts: Vec<usize>,
    since: Instant,
    last: Dir,
    stats: BTreeMap<CostClass, LabelStats>,
    classes: BTreeMap<CostClass, LabelStats>,
}

impl State {
    /// The class: the innermost label entered with [`Meter::enter_class`], else the outermost.
    fn class(&self) -> CostClass {
        let at = self.class_starts.last().copied().unwrap_or(0);
        self.stack.get(at).copied().unwrap_or(CostClass::Unlabelled)
    }

    /// The innermost and outermost entries, created on first use.
    fn entries(&mut self) -> (&mut LabelStats, &mut LabelStats) {
        let (top, class) = (self.top(), self.class());
        (
            self.stats.entry(top).or_default(),
            self.classes.entry(class).or_default(),
        )
    }

    fn top(&self) -> CostClass {
        self.stack.last().copied().unwrap_or(CostClass::Unlabelled)
    }

    /// Charges the time since the last switch to the current label.
    fn charge_time(&mut self) {
        let now = Instant::now();
        let dt = now.duration_since(self.since).as_secs_f64();
        self.since = now;
        if !self.stack.is_empty() {
            let (e, c) = self.entries();
            e.seconds += dt;
            c.seconds += dt;
        }
    }
}

/// Shared, cloneable meter.
#[derive(Clone)]
pub struct Meter {
    inner: Arc<Mutex<State>>,
}

impl Default for Meter {
    fn default() -> Self {
        Self::new()
    }
}

impl Meter {
    /// A meter with nothing counted and no class open.
    pub fn new() -> Self {
        Meter {
            inner: Arc::new(Mutex::new(State {
                stack: Vec::new(),
                class_starts: Vec::new(),
                since: Instant::now(),
                last: Dir::None,
                stats: BTreeMap::new(),
                classes: BTreeMap::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned meter only means another thread panicked mid-update; counts stay usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Attributes traffic and time to `label` until the guard drops.
    pub fn enter(&self, label: CostClass) -> LabelGuard {
        let mut s = self.lock();
        s.charge_time();
        s.stack.push(label);
        s.stats.entry(label).or_default();
        LabelGuard {
            meter: self.clone(),
        }
    }

    /// Like [`Meter::enter`], but the label is a class of its own while it lasts, inside
    /// whatever operator is running: work every operator shares and any of them may happen to
    /// trigger (the silent-OT pools' refills) is reported on its own line instead of inflating
    /// that operator's.
    pub fn enter_class(&self, label: CostClass) -> LabelGuard {
        let guard = self.enter(label);
        let mut s = self.lock();
        let at = s.stack.len() - 1;
        s.class_starts.push(at);
        guard
    }

    pub(crate) fn on_send(&self, n: usize) {
        let mut s = self.lock();
        let fresh = s.last != Dir::Send;
        s.last = Dir::Send;
        for e in <[_; 2]>::from(s.entries()) {
            e.bytes_sent += n as u64;
            e.flights_sent += fresh as u64;
        }
    }

    pub(crate) fn on_recv(&self, n: usize) {
        let mut s = self.lock();
        let fresh = s.last != Dir::Recv;
        s.last = Dir::Recv;
        for e in <[_; 2]>::from(s.entries()) {
            e.bytes_received += n as u64;
            e.flights_received += fresh as u64;
        }
    }

    /// Per-label totals so far.
    pub fn snapshot(&self) -> BTreeMap<CostClass, LabelStats> {
        let mut s = self.lock();
        s.charge_time();
        s.stats.clone()
    }

    /// Totals per class: the outermost label active when the traffic or time occurred.
    pub fn by_class(&self) -> BTreeMap<CostClass, LabelStats> {
        let mut s = self.lock();
        s.charge_time();
        s.classes.clone()
    }

    /// Sum over all labels.
    pub fn total(&self) -> LabelStats {
        let mut t = LabelStats::default();
        for v in self.snapshot().values() {
            t.add(v);
        }
        t
    }

    /// Clears all totals (e.g. after set-up, before the online phase).
    pub fn reset(&self) {
        let mut s = self.lock();
        s.stats.clear();
        s.classes.clear();
        s.since = Instant::now();
        s.last = Dir::None;
        for l in s.stack.clone() {
            s.stats.entry(l).or_default();
        }
    }
}

/// Ends a label scope on drop.
pub struct LabelGuard {
    meter: Meter,
}

impl Drop for LabelGuard {
    fn drop(&mut self) {
        let mut s = self.meter.lock();
        s.charge_time();
        s.stack.pop();
        let depth = s.stack.len();
        if s.class_starts.last() == Some(&depth) {
            s.class_starts.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CostClass::{Exp, MatMul, OtRefill, Softmax};

    #[test]
    fn bytes_and_flights_go_to_innermost_label() {
        let m = Meter::new();
        {
            let _a = m.enter(MatMul);
            m.on_send(10);
            m.on_send(5);
            {
                let _b = m.enter(Softmax);
                m.on_recv(7);
                m.on_send(1);
            }
            m.on_recv(3);
        }
        let s = m.snapshot();
        assert_eq!(s[&MatMul].bytes_sent, 15);
        assert_eq!(s[&MatMul].bytes_received, 3);
        assert_eq!(s[&MatMul].rounds(), 2);
        assert_eq!(s[&Softmax].bytes_sent, 1);
        assert_eq!(s[&Softmax].bytes_received, 7);
        assert_eq!(s[&Softmax].rounds(), 2);
        assert_eq!(m.total().bytes_sent, 16);
        assert_eq!(m.total().client_to_server(Role::Client), 16);
        assert_eq!(m.total().server_to_client(Role::Client), 10);
        let c = m.by_class();
        assert_eq!(c.len(), 1);
        assert_eq!(c[&MatMul].bytes_sent, 16);
        assert_eq!(c[&MatMul].bytes_received, 10);
        assert_eq!(c[&MatMul].rounds(), 4);
    }

    /// A label entered with `enter_class` inside an operator is a class of its own while it
    /// lasts (and its nested labels with it); the operator's class resumes after it.
    #[test]
    fn a_class_label_inside_an_operator_gets_its_own_class() {
        let m = Meter::new();
        {
            let _op = m.enter(Softmax);
            m.on_send(4);
            {
                let _r = m.enter_class(OtRefill);
                m.on_send(100);
                let _inner = m.enter(Exp);
                m.on_send(1);
            }
            m.on_send(2);
        }
        let c = m.by_class();
        assert_eq!(c[&Softmax].bytes_sent, 6);
        assert_eq!(c[&OtRefill].bytes_sent, 101);
        assert_eq!(m.snapshot()[&Exp].bytes_sent, 1);
        assert_eq!(m.total().bytes_sent, 107);
    }
}
