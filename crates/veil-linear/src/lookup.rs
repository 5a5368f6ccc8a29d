//! Private table lookup on shares: the client holds row indices (token ids), the server holds
//! tables (vocabulary × width, fixed point); afterwards they hold additive shares mod 2^ℓ of
//! Σ_tables `table[id]` for every query row. Used by private-embedding mode.
//!
//! Two methods, both on the batched Π_MatMul of [`crate::matmul`] (one round trip in all):
//!
//! * [`LookupMethod::OneHot`] — the baseline: the client encrypts the one-hot matrix
//!   (queries × Σ vocabularies) and the server multiplies it by the stacked tables. Work and
//!   upload grow with queries × vocabulary: q·V·w/N polynomial products, q·V/N ciphertexts.
//! * [`LookupMethod::Batched`] — batch PIR with a probabilistic batch code (the amortised query
//!   processing of SealPIR, Angel et al. 2018, with cuckoo-style placement): each id of a large
//!   table is stored in 3 of `parts` public sub-tables chosen by public hashing, so each part
//!   holds ≈ 3V/parts rows. Each part offers `slots` query rows; the client places each of its
//!   distinct ids in a free slot of one of its 3 parts (a maximum bipartite matching) and sends
//!   one one-hot row per slot (zero rows for unused slots, so every part looks alike). One
//!   product per part gives shares of the selected rows; a second product, in the same flight,
//!   routes them to the query positions: the client's 0/1 routing matrix (queries × all slots)
//!   times the server's shares of the slot results (uniform ℓ-bit values, hence
//!   [`veil_he::session::shared_set`]). Work ≈ slots·3V·w/N + q·(parts·slots)·w/N products,
//!   independent of q for the first term; small tables (vocabulary ≤ 2·queries, e.g. token
//!   types) go through a one-hot product in the same flight.
//!
//! The batched method needs far fewer products than the one-hot product but not less traffic
//! (measurements in docs/BENCHMARKS.md): its traffic is the Cheetah packing's, a part's query
//! (slots × ≈1,400 one-hot entries) needs many sparse input ciphertexts or many responses. Compressing each part's query into
//! one ciphertext expanded by the server with Galois automorphisms (SealPIR's oblivious
//! expansion) would cut the upload to ≈ 3V/N ciphertexts; not implemented yet.
//!
//! **Security (semi-honest):** as [`crate::matmul`]: the server sees ciphertexts under the
//! client's key only (which slots are used, which part an id went to and where repeated ids are
//! all stay encrypted; every part and slot is always queried); the client sees flooded,
//! re-randomised responses masked by fresh uniform shares (OS-seeded CSPRNG). Table entries are
//! checked against the public bound [`crate::fc::WEIGHT_BOUND`] at preparation.
//! **Error:** one-hot: none, exact mod 2^ℓ. Batched: exact mod 2^ℓ whenever the client's distinct
//! ids can be matched to slots; the matching is maximum, so it fails only if some set of ids has
//! all its candidate parts inside too few slots (a Hall violator). With 3 distinct candidate
//! parts per id the smallest violators need ≥ slots·3 + 1 ids inside 3 parts; for the default plan
//! at 128 queries of a 30,522-row vocabulary (64 parts × 4 slots) the union bound over violators
//! is far below 2^-40 (see [`BatchPlan::choose`]). On failure the client still completes the
//! exchange (the server cannot tell) and then returns `Error::Other`.

use veil_core::{ensure, Error, Result, Ring, RingTensor};
use veil_he::Params;
use veil_net::Channel;

use crate::fc::WEIGHT_BOUND;
use crate::layout::Layout;
use crate::matmul::{client_receive, client_send, server_respond, PreparedMatrix, ServerJob};
use veil_he::session::{shared_set, weight_set, ClientSession, ServerSession};

/// Candidate parts per id in the batched method.
pub const CANDIDATES: usize = 3;

/// How the lookup is done; the server announces it ([`LookupMethod::tag`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupMethod {
    /// One-hot × table through Π_MatMul (baseline).
    OneHot,
    /// Batch PIR over hashed sub-tables: ≈ 1/10 of the products at the BERT vocabulary, but
    /// more traffic (each part's query fills few ciphertext coefficients; see the docs).
    Batched,
}

impl LookupMethod {
    /// The method's byte in the server's announcement.
    pub fn tag(self) -> u8 {
        match self {
            LookupMethod::OneHot => 1,
            LookupMethod::Batched => 2,
        }
    }

    /// The method of an announced byte; unknown bytes are `Error::Malformed`.
    pub fn from_tag(t: u8) -> Result<Self> {
        match t {
            1 => Ok(LookupMethod::OneHot),
            2 => Ok(LookupMethod::Batched),
            _ => Err(Error::Malformed(format!("unknown lookup method tag {t}"))),
        }
    }

    /// The method a command line names (`onehot` or `pir`).
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "onehot" | "one-hot" => Ok(LookupMethod::OneHot),
            "pir" | "batched" => Ok(LookupMethod::Batched),
            _ => Err(Error::InvalidArgument(format!(
                "unknown lookup method {s:?} (onehot | pir)"
            ))),
        }
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            LookupMethod::OneHot => "onehot",
            LookupMethod::Batched => "pir",
        }
    }
}

/// The public shape of a lookup: vocabulary size of each table, common width, query rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupShape {
    /// Rows of each table.
    pub vocabs: Vec<usize>,
    /// Columns of every table.
    pub width: usize,
    /// Ids looked up per table.
    pub queries: usize,
}

impl LookupShape {
    fn check(&self) -> Result<()> {
        ensure!(
            !self.vocabs.is_empty()
                && self.vocabs.iter().all(|&v| (1..=1 << 24).contains(&v))
                && self.width > 0
                && self.queries > 0,
            InvalidArgument,
            "lookup shape {self:?}: need ≥ 1 table, vocabularies in 1..=2^24, width and queries ≥ 1"
        );
        Ok(())
    }
}

/// Parts and slots of a hashed table (public, derived from the shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPlan {
    /// Hashed parts of the table.
    pub parts: usize,
    /// Query slots per part.
    pub slots: usize,
}

impl BatchPlan {
    /// Parts × slots ≥ 2·queries (load ≤ 1/2) with slots·(3V/parts) ≈ N, so one ciphertext
    /// carries a part's whole query: slots = ⌊√(2·q·N / 3V)⌋. At q = 128, V = 30,522: 64 × 4.
    /// Failure bound there: a violator of i parts (i ≥ 3) needs 4i + 1 ids all of whose 3
    /// candidates fall in those parts; for i = 3 that is C(128, 13)·C(64, 3)·C(64, 3)^-13 ≈
    /// 2^-125, and larger i are smaller still (at i = 32, 129 ids would be needed: none).
    pub fn choose(vocab: usize, queries: usize, degree: usize) -> BatchPlan {
        let ideal = (2.0 * queries as f64 * degree as f64 / (3.0 * vocab as f64)).sqrt();
        let slots = (ideal.floor() as usize).clamp(1, queries);
        let parts = (2 * queries).div_ceil(slots).max(CANDIDATES + 1);
        BatchPlan { parts, slots }
    }
}

/// splitmix64's finaliser: a public, well-mixed hash.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The 3 distinct candidate parts of `id` in table `table` (public).
fn candidates(table: usize, id: usize, parts: usize) -> [usize; CANDIDATES] {
    let mut out = [0usize; CANDIDATES];
    for i in 0..CANDIDATES {
        let h = mix((table as u64) << 40 ^ (id as u64) << 2 ^ i as u64);
        // Uniform among the parts not taken yet: pick a rank, then skip the taken ones.
        let mut c = (h % (parts - i) as u64) as usize;
        let mut taken: Vec<usize> = out[..i].to_vec();
        taken.sort_unstable();
        for t in taken {
            if c >= t {
                c += 1;
            }
        }
        out[i] = c;
    }
    out
}

/// A hashed table's public structure: the sorted ids of every part.
#[derive(Clone, Debug)]
struct Hashed {
    table: usize,
    plan: BatchPlan,
    members: Vec<Vec<u32>>,
}

impl Hashed {
    fn new(table: usize, vocab: usize, plan: BatchPlan) -> Self {
        let mut members = vec![Vec::new(); plan.parts];
        for id in 0..vocab {
            for c in candidates(table, id, plan.parts) {
                members[c].push(id as u32);
            }
        }
        Hashed {
            table,
            plan,
            members,
        }
    }
}

/// How each table is looked up (public, both parties derive it from the shape and method).
#[derive(Clone, Debug)]
struct Plan {
    /// Tables looked up one-hot together, in one product.
    onehot: Vec<usize>,
    hashed: Vec<Hashed>,
}

impl Plan {
    /// The plan of `shape` for tables products of degree `n`.
    fn new(
        shape: &LookupShape,
        method: LookupMethod,
        override_plan: Option<BatchPlan>,
        n: usize,
    ) -> Self {
        let mut onehot = Vec::new();
        let mut hashed = Vec::new();
        for (j, &v) in shape.vocabs.iter().enumerate() {
            if method == LookupMethod::OneHot || v <= 2 * shape.queries {
                onehot.push(j);
            } else {
                let plan = override_plan.unwrap_or_else(|| BatchPlan::choose(v, shape.queries, n));
                hashed.push(Hashed::new(j, v, plan));
            }
        }
        Plan { onehot, hashed }
    }

    fn onehot_rows(&self, shape: &LookupShape) -> usize {
        self.onehot.iter().map(|&j| shape.vocabs[j]).sum()
    }

    fn total_slots(&self) -> usize {
        self.hashed
            .iter()
            .map(|h| h.plan.parts * h.plan.slots)
            .sum()
    }

    /// Layouts of the first flight (parts in order, then the one-hot product) and of the
    /// routing product, if any.
    fn layouts(&self, shape: &LookupShape, ring: Ring) -> Result<(Vec<Layout>, Option<Layout>)> {
        let p = Params::new(weight_set(ring), ring)?;
        let mut lays = Vec::new();
        for h in &self.hashed {
            for m in &h.members {
                if !m.is_empty() {
                    lays.push(Layout::search(
                        &p,
                        h.plan.slots,
                        m.len(),
                        shape.width,
                        WEIGHT_BOUND,
                    )?);
                }
            }
        }
        if !self.onehot.is_empty() {
            lays.push(Layout::search(
                &p,
                shape.queries,
                self.onehot_rows(shape),
                shape.width,
                WEIGHT_BOUND,
            )?);
        }
        let routing = if self.hashed.is_empty() {
            None
        } else {
            let q = Params::new(shared_set(ring), ring)?;
            Some(Layout::search(
                &q,
                shape.queries,
                self.total_slots(),
                shape.width,
                1 << (ring.bits() - 1),
            )?)
        };
        Ok((lays, routing))
    }
}

/// The server's tables prepared for one shape and method (once per model and query count).
pub struct PreparedLookup {
    shape: LookupShape,
    method: LookupMethod,
    plan: Plan,
    /// Part matrices in plan order, then the stacked one-hot tables, with their layouts.
    matrices: Vec<(Layout, PreparedMatrix)>,
}

fn select_rows(table: &RingTensor, ids: &[u32]) -> Vec<u64> {
    let w = table.shape()[1];
    ids.iter()
        .flat_map(|&i| {
            table.data()[i as usize * w..(i as usize + 1) * w]
                .iter()
                .copied()
        })
        .collect()
}

impl PreparedLookup {
    /// `tables[j]` is vocab_j × width at f fractional bits, |entry| ≤ [`WEIGHT_BOUND`] (else
    /// `Error::Insecure`). `ntt_cache_bytes` bounds the NTT-domain cache over all matrices
    /// (0: transform at use time).
    pub fn new(
        tables: &[&RingTensor],
        queries: usize,
        method: LookupMethod,
        ntt_cache_bytes: usize,
    ) -> Result<Self> {
        Self::with_plan(tables, queries, method, None, ntt_cache_bytes)
    }

    /// As [`PreparedLookup::new`] with the parts/slots of every hashed table fixed (tests and
    /// benchmarks; the client must use the same override).
    pub fn with_plan(
        tables: &[&RingTensor],
        queries: usize,
        method: LookupMethod,
        plan_override: Option<BatchPlan>,
        ntt_cache_bytes: usize,
    ) -> Result<Self> {
        ensure!(!tables.is_empty(), InvalidArgument, "no tables");
        let ring = tables[0].ring();
        let width = tables[0].shape().get(1).copied().unwrap_or(0);
        for t in tables {
            ensure!(
                t.shape().len() == 2 && t.shape()[1] == width && t.ring() == ring,
                InvalidArgument,
                "tables must be 2-D with one width and ring (got {:?})",
                t.shape()
            );
        }
        let shape = LookupShape {
            vocabs: tables.iter().map(|t| t.shape()[0]).collect(),
            width,
            queries,
        };
        shape.check()?;
        let p = Params::new(weight_set(ring), ring)?;
        let plan = Plan::new(&shape, method, plan_override, p.degree());
        let mut matrices = Vec::new();
        for h in &plan.hashed {
            for m in h.members.iter().filter(|m| !m.is_empty()) {
                let part =
                    RingTensor::from_vec(ring, &[m.len(), width], select_rows(tables[h.table], m))?;
                let lay = Layout::search(&p, h.plan.slots, m.len(), width, WEIGHT_BOUND)?;
                matrices.push((lay, PreparedMatrix::new(&p, &part, WEIGHT_BOUND)?));
            }
        }
        if !plan.onehot.is_empty() {
            let mut stacked = Vec::with_capacity(plan.onehot_rows(&shape) * width);
            for &j in &plan.onehot {
                stacked.extend_from_slice(tables[j].data());
            }
            let t = RingTensor::from_vec(ring, &[plan.onehot_rows(&shape), width], stacked)?;
            let lay = Layout::search(&p, queries, plan.onehot_rows(&shape), width, WEIGHT_BOUND)?;
            matrices.push((lay, PreparedMatrix::new(&p, &t, WEIGHT_BOUND)?));
        }
        let mut ntt_bytes = 0;
        for (lay, m) in &matrices {
            ntt_bytes += m.ntt_bytes(lay.weight_blocking())?;
        }
        if ntt_bytes <= ntt_cache_bytes {
            for (lay, m) in &mut matrices {
                m.cache_ntt(lay.weight_blocking())?;
            }
        }
        Ok(PreparedLookup {
            shape,
            method,
            plan,
            matrices,
        })
    }

    /// The public shape it serves.
    pub fn shape(&self) -> &LookupShape {
        &self.shape
    }

    /// The lookup method it was prepared for.
    pub fn method(&self) -> LookupMethod {
        self.method
    }

    /// Whether the tables' NTT form is cached.
    pub fn is_ntt_cached(&self) -> bool {
        self.matrices
            .iter()
            .all(|(lay, m)| m.is_ntt_cached(lay.weight_blocking()))
    }

    /// The parts × slots of each hashed table (empty for one-hot).
    pub fn batch_plans(&self) -> Vec<BatchPlan> {
        self.plan.hashed.iter().map(|h| h.plan).collect()
    }
}

/// Adds the one-hot product's output (the last response, when the plan has small tables) into
/// `out` and returns the hashed parts' outputs.
fn take_onehot_output<'a>(
    plan: &Plan,
    outs: &'a [RingTensor],
    out: &mut RingTensor,
) -> Result<&'a [RingTensor]> {
    if plan.onehot.is_empty() {
        return Ok(outs);
    }
    let (last, parts) = outs.split_last().expect("one-hot output");
    out.add_in_place(last)?;
    Ok(parts)
}

/// Client: `ids[j]` are the query rows' indices into table j (one per query, each < vocab_j).
/// Returns the client's share (queries × width) of `Σ_j table_j[ids[j]]`.
pub fn lookup_client<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ClientSession,
    shape: &LookupShape,
    method: LookupMethod,
    ids: &[&[u32]],
) -> Result<RingTensor> {
    lookup_client_with_plan(ch, session, shape, method, None, ids)
}

/// [`lookup_client`] with the server's plan override ([`PreparedLookup::with_plan`]).
pub fn lookup_client_with_plan<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ClientSession,
    shape: &LookupShape,
    method: LookupMethod,
    plan_override: Option<BatchPlan>,
    ids: &[&[u32]],
) -> Result<RingTensor> {
    shape.check()?;
    ensure!(
        ids.len() == shape.vocabs.len()
            && ids.iter().all(|v| v.len() == shape.queries)
            && ids
                .iter()
                .zip(&shape.vocabs)
                .all(|(v, &n)| v.iter().all(|&i| (i as usize) < n)),
        InvalidArgument,
        "need {} ids per table, each below its vocabulary {:?}",
        shape.queries,
        shape.vocabs
    );
    let ring = session.ring();
    let sk = session.key(weight_set(ring))?;
    let plan = Plan::new(shape, method, plan_override, sk.params().degree());
    let (lays, routing_lay) = plan.layouts(shape, ring)?;
    let (q, w) = (shape.queries, shape.width);

    // First flight: one query matrix per non-empty part, then the one-hot matrix.
    let mut lhs = Vec::new();
    let mut routing = RingTensor::zeros(ring, &[q, plan.total_slots().max(1)])?;
    let mut matched = true;
    let mut slot_base = 0;
    for h in &plan.hashed {
        let assign = assign_slots(h, ids[h.table]);
        matched &= assign.is_some();
        let assign = assign.unwrap_or_default();
        let s = h.plan.slots;
        let mut queries = vec![vec![0u64; 0]; h.plan.parts];
        for (part, m) in h.members.iter().enumerate() {
            queries[part] = vec![0u64; s * m.len()];
        }
        for (&id, &(part, slot)) in &assign {
            let col = h.members[part]
                .binary_search(&id)
                .expect("a part holds the ids assigned to it");
            queries[part][slot * h.members[part].len() + col] = 1;
        }
        let cols = routing.shape()[1];
        for (r, &id) in ids[h.table].iter().enumerate() {
            if let Some(&(part, slot)) = assign.get(&id) {
                routing.data_mut()[r * cols + slot_base + part * s + slot] = 1;
            }
        }
        for (part, m) in h.members.iter().enumerate() {
            if !m.is_empty() {
                let data = std::mem::take(&mut queries[part]);
                lhs.push(RingTensor::from_vec(ring, &[s, m.len()], data)?);
            }
        }
        slot_base += h.plan.parts * s;
    }
    if !plan.onehot.is_empty() {
        let k = plan.onehot_rows(shape);
        let mut a = vec![0u64; q * k];
        let mut base = 0;
        for &j in &plan.onehot {
            for (r, &id) in ids[j].iter().enumerate() {
                a[r * k + base + id as usize] = 1;
            }
            base += shape.vocabs[j];
        }
        lhs.push(RingTensor::from_vec(ring, &[q, k], a)?);
    }
    let refs: Vec<&RingTensor> = lhs.iter().collect();
    client_send(ch, sk, &lays, &refs)?;
    let shared_sk = session.key(shared_set(ring))?;
    if let Some(lay) = routing_lay {
        client_send(ch, shared_sk, &[lay], &[&routing])?;
    }
    let outs = client_receive(ch, sk, &lays)?;
    let mut out = RingTensor::zeros(ring, &[q, w])?;
    let parts_out = take_onehot_output(&plan, &outs, &mut out)?;
    if let Some(lay) = routing_lay {
        let routed = client_receive(ch, shared_sk, &[lay])?.remove(0);
        let slots = stack_slot_results(&plan, parts_out, ring, w)?;
        out.add_in_place(&routing.matmul(&slots)?)?;
        out.add_in_place(&routed)?;
    }
    ensure!(
        matched,
        Other,
        "private lookup: the ids could not be placed in the batch slots (a rare hashing \
         failure, see veil_linear::lookup); retry with the one-hot method"
    );
    Ok(out)
}

/// Stacks the per-part slot results (slots × width each, empty parts as zero rows) into one
/// (all slots) × width matrix, in slot order.
fn stack_slot_results(
    plan: &Plan,
    parts_out: &[RingTensor],
    ring: Ring,
    width: usize,
) -> Result<RingTensor> {
    let mut data = Vec::with_capacity(plan.total_slots() * width);
    let mut it = parts_out.iter();
    for h in &plan.hashed {
        for m in &h.members {
            if m.is_empty() {
                data.extend(std::iter::repeat_n(0, h.plan.slots * width));
            } else {
                data.extend_from_slice(it.next().expect("one output per part").data());
            }
        }
    }
    RingTensor::from_vec(ring, &[plan.total_slots(), width], data)
}

/// A maximum matching of the distinct ids to (part, slot) places, by augmenting paths
/// (Kuhn's algorithm); `None` if some id cannot be placed.
fn assign_slots(
    h: &Hashed,
    ids: &[u32],
) -> Option<std::collections::BTreeMap<u32, (usize, usize)>> {
    let mut distinct: Vec<u32> = ids.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let s = h.plan.slots;
    let cands: Vec<[usize; CANDIDATES]> = distinct
        .iter()
        .map(|&id| candidates(h.table, id as usize, h.plan.parts))
        .collect();
    // owner[place] = index into `distinct`, place = part·s + slot.
    let mut owner: Vec<Option<usize>> = vec![None; h.plan.parts * s];
    fn augment(
        i: usize,
        cands: &[[usize; CANDIDATES]],
        s: usize,
        owner: &mut [Option<usize>],
        seen: &mut [bool],
    ) -> bool {
        for &part in &cands[i] {
            for place in part * s..(part + 1) * s {
                if seen[place] {
                    continue;
                }
                seen[place] = true;
                let free = match owner[place] {
                    None => true,
                    Some(j) => augment(j, cands, s, owner, seen),
                };
                if free {
                    owner[place] = Some(i);
                    return true;
                }
            }
        }
        false
    }
    for i in 0..distinct.len() {
        let mut seen = vec![false; owner.len()];
        if !augment(i, &cands, s, &mut owner, &mut seen) {
            return None;
        }
    }
    Some(
        owner
            .iter()
            .enumerate()
            .filter_map(|(place, o)| o.map(|i| (distinct[i], (place / s, place % s))))
            .collect(),
    )
}

/// Server: returns its share (queries × width) of the looked-up rows' sum.
pub fn lookup_server<C: Channel + ?Sized>(
    ch: &mut C,
    session: &ServerSession,
    prepared: &PreparedLookup,
) -> Result<RingTensor> {
    let ring = session.ring();
    let (pk, gk) = session.keys_for(weight_set(ring))?;
    let (q, w) = (prepared.shape.queries, prepared.shape.width);
    let jobs: Vec<ServerJob<'_>> = prepared
        .matrices
        .iter()
        .map(|(layout, matrix)| ServerJob {
            matrix,
            layout: *layout,
            lhs_share: None,
            add: None,
        })
        .collect();
    let outs = server_respond(ch, pk, Some(gk), &jobs)?;
    let plan = &prepared.plan;
    let mut out = RingTensor::zeros(ring, &[q, w])?;
    let parts_out = take_onehot_output(plan, &outs, &mut out)?;
    if !plan.hashed.is_empty() {
        let (spk, sgk) = session.keys_for(shared_set(ring))?;
        let slots = stack_slot_results(plan, parts_out, ring, w)?;
        let bound = 1u64 << (ring.bits() - 1);
        let m = PreparedMatrix::new(spk.params(), &slots, bound)?;
        let (k, w2) = (slots.shape()[0], slots.shape()[1]);
        let job = ServerJob {
            matrix: &m,
            layout: Layout::search(spk.params(), q, k, w2, bound)?,
            lhs_share: None,
            add: None,
        };
        out.add_in_place(&server_respond(ch, spk, Some(sgk), &[job])?.remove(0))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use veil_core::{reconstruct, Prg, Seed};
    use veil_net::run_two_party;

    fn ring() -> Ring {
        Ring::new(41).unwrap()
    }

    fn table(rows: usize, width: usize, g: &mut Prg) -> RingTensor {
        let r = ring();
        let data = (0..rows * width)
            .map(|_| r.from_signed(g.below(1 << 14) as i64 - (1 << 13)))
            .collect();
        RingTensor::from_vec(r, &[rows, width], data).unwrap()
    }

    fn oracle(tables: &[&RingTensor], ids: &[Vec<u32>]) -> RingTensor {
        let (q, w) = (ids[0].len(), tables[0].shape()[1]);
        let mut out = RingTensor::zeros(ring(), &[q, w]).unwrap();
        for (t, v) in tables.iter().zip(ids) {
            let rows = RingTensor::from_vec(ring(), &[q, w], select_rows(t, v)).unwrap();
            out.add_in_place(&rows).unwrap();
        }
        out
    }

    const SMALL_PLAN: BatchPlan = BatchPlan { parts: 8, slots: 2 };

    /// Both methods against the plaintext oracle, exact mod 2^ℓ: a word table (hashed in the
    /// batched method) plus a 2-row type table (always one-hot), ids including 0, V − 1,
    /// repeats and ids of different parts; one session for all cases.
    #[test]
    fn lookups_match_the_oracle() {
        let mut g = Prg::from_seed(&Seed([21; 16]));
        let (v, w, q) = (300, 5, 8);
        let word = table(v, w, &mut g);
        let types = table(2, w, &mut g);
        let mut cases: Vec<Vec<Vec<u32>>> = vec![vec![
            vec![0, v as u32 - 1, 7, 7, 150, 299, 0, 64],
            vec![0, 1, 1, 0, 0, 1, 1, 0],
        ]];
        for _ in 0..3 {
            cases.push(vec![
                (0..q).map(|_| g.below(v as u64) as u32).collect(),
                (0..q).map(|_| g.below(2) as u32).collect(),
            ]);
        }
        let tables = [&word, &types];
        let methods = [LookupMethod::OneHot, LookupMethod::Batched];
        let prepared: Vec<PreparedLookup> = methods
            .iter()
            .map(|&m| PreparedLookup::with_plan(&tables, q, m, Some(SMALL_PLAN), 1 << 30).unwrap())
            .collect();
        assert_eq!(prepared[1].batch_plans(), vec![SMALL_PLAN]);
        assert!(prepared[0].batch_plans().is_empty());
        let shape = prepared[0].shape().clone();
        let (c, s) = run_two_party(
            |ch| {
                let sess = ClientSession::setup(ch, ring())?;
                let mut outs = Vec::new();
                for ids in &cases {
                    for &m in &methods {
                        let refs: Vec<&[u32]> = ids.iter().map(|v| v.as_slice()).collect();
                        outs.push(lookup_client_with_plan(
                            ch,
                            &sess,
                            &shape,
                            m,
                            Some(SMALL_PLAN),
                            &refs,
                        )?);
                    }
                }
                Ok(outs)
            },
            |ch| {
                let sess = ServerSession::setup(ch, ring())?;
                let mut outs = Vec::new();
                for _ in &cases {
                    for p in &prepared {
                        outs.push(lookup_server(ch, &sess, p)?);
                    }
                }
                Ok(outs)
            },
        )
        .unwrap();
        let mut k = 0;
        for ids in &cases {
            let want = oracle(&tables, ids);
            for m in methods {
                assert_eq!(reconstruct(&c[k], &s[k]).unwrap(), want, "{m:?} {ids:?}");
                k += 1;
            }
        }
    }

    /// Out-of-range ids and wrong counts are refused before anything is sent; a server fed a
    /// truncated, garbage or oversized query message and a client fed a garbage response
    /// return errors instead of panicking.
    #[test]
    fn bad_inputs_and_messages_are_errors() {
        let mut g = Prg::from_seed(&Seed([22; 16]));
        let word = table(40, 3, &mut g);
        let prep =
            PreparedLookup::with_plan(&[&word], 2, LookupMethod::Batched, Some(SMALL_PLAN), 0)
                .unwrap();
        let shape = prep.shape().clone();
        assert!(PreparedLookup::new(&[], 2, LookupMethod::OneHot, 0).is_err());
        let big = RingTensor::from_vec(ring(), &[1, 1], vec![1 << 20]).unwrap();
        assert!(matches!(
            PreparedLookup::new(&[&big], 1, LookupMethod::OneHot, 0),
            Err(Error::Insecure(_))
        ));
        assert!(LookupMethod::from_tag(9).is_err());
        assert!(LookupMethod::parse("magic").is_err());
        let (c, s) = run_two_party(
            |ch| {
                let sess = ClientSession::setup(ch, ring())?;
                let bad_id = lookup_client_with_plan(
                    ch,
                    &sess,
                    &shape,
                    LookupMethod::Batched,
                    Some(SMALL_PLAN),
                    &[&[0, 40]],
                );
                let bad_count = lookup_client(ch, &sess, &shape, LookupMethod::OneHot, &[&[0]]);
                // Truncated and garbage first flights.
                ch.send_msg(&[0u8; 10])?;
                ch.send_msg(&vec![0xFFu8; 1 << 16])?;
                ch.flush()?;
                // A garbage response to a real query.
                let resp = lookup_client_with_plan(
                    ch,
                    &sess,
                    &shape,
                    LookupMethod::Batched,
                    Some(SMALL_PLAN),
                    &[&[0, 39]],
                );
                // Last, an oversized first flight (its body is never read).
                ch.send_msg(&vec![0u8; 1 << 24])?;
                ch.flush()?;
                Ok((bad_id.is_err(), bad_count.is_err(), resp.map(|_| ())))
            },
            |ch| {
                let sess = ServerSession::setup(ch, ring())?;
                let mut errs: Vec<Error> = (0..2)
                    .map(|_| lookup_server(ch, &sess, &prep).unwrap_err())
                    .collect();
                // Swallow the real query and answer with garbage.
                let _ = ch.recv_msg(1 << 30)?;
                let _ = ch.recv_msg(1 << 30)?;
                ch.send_msg(&[7u8; 33])?;
                ch.flush()?;
                errs.push(lookup_server(ch, &sess, &prep).unwrap_err());
                Ok(errs)
            },
        )
        .unwrap();
        assert!(c.0 && c.1, "bad ids must be refused");
        assert!(c.2.is_err(), "garbage response accepted");
        assert!(matches!(s[2], Error::TooLarge { .. }), "{:?}", s[2]);
        for e in &s[..2] {
            assert!(matches!(e, Error::Malformed(_)), "{e:?}");
        }
    }

    #[test]
    fn candidates_are_distinct_and_in_range() {
        for parts in [4, 5, 64] {
            for id in 0..2000 {
                let c = candidates(1, id, parts);
                assert!(c.iter().all(|&x| x < parts));
                assert!(c[0] != c[1] && c[1] != c[2] && c[0] != c[2], "{c:?}");
            }
        }
    }

    #[test]
    fn default_plan_for_bert() {
        let p = BatchPlan::choose(30522, 128, 8192);
        assert_eq!(
            p,
            BatchPlan {
                parts: 64,
                slots: 4
            }
        );
        let h = Hashed::new(0, 30522, p);
        let max = h.members.iter().map(|m| m.len()).max().unwrap();
        // One part's query (slots × rows) fits one ciphertext.
        assert!(p.slots * max <= 8192, "largest part {max}");
    }

    /// Matching places every distinct id of random and adversarially repeated inputs, each in
    /// one of its candidate parts, never two ids in one place.
    #[test]
    fn slots_are_assigned_to_candidates() {
        let plan = BatchPlan::choose(30522, 128, 8192);
        let h = Hashed::new(0, 30522, plan);
        let mut g = veil_core::Prg::from_seed(&veil_core::Seed([5; 16]));
        for trial in 0..200 {
            let ids: Vec<u32> = (0..128)
                .map(|i| {
                    if trial % 2 == 0 {
                        g.below(30522) as u32
                    } else {
                        (i % 7) as u32 * 4000
                    }
                })
                .collect();
            let a = assign_slots(&h, &ids).expect("placement");
            let mut places: Vec<_> = a.values().collect();
            places.sort();
            places.dedup();
            assert_eq!(places.len(), a.len());
            for (&id, &(part, slot)) in &a {
                assert!(slot < plan.slots);
                assert!(candidates(0, id as usize, plan.parts).contains(&part));
                assert!(h.members[part].binary_search(&id).is_ok());
            }
        }
    }
}
