//! Row-wise products on BFV (`veil_he`, plaintext modulus 2^ℓ) for the products whose result is
//! one value per row, or whose second factor is one value per row: LayerNorm's sum of squares
//! (per-row inner products of the two parties' shares) and its d·r (every row times its own
//! scalar). OT products pay one COT per bit of one factor per element; here the client's
//! operand crosses the wire once, encrypted, and serves both products.
//!
//! # Layout
//! The client encrypts a [rows, cols] matrix U in the stride layout: with R the largest power of
//! two ≤ 2^[`MIN_GALOIS_LEVELS`] with R·cols ≤ N, ciphertext c holds rows cR … cR + R − 1, row k's
//! value j at coefficient R·j + k.
//! * **Inner product of row k with a server vector v**: the plaintext Σ_j v_j·X^−(Rj+k) puts
//!   Σ_j U_kj·v_j at coefficient 0. No other pair reaches it: (row k', index j') lands there only
//!   if R(j' − j) + k' − k ≡ 0 (mod N), i.e. k' = k and j' ≡ j (mod N/R), and |j' − j| < cols ≤
//!   N/R. Each (row, vector) product is one member; members are packed 64 to a response
//!   ([`veil_he::pack`]), so a response carries 64 inner products for one c1.
//! * **Row k times a scalar s_k**: the ciphertext times the constant s_k, rotated by X^−k, holds
//!   U_kj·s_k at coefficients R·j; the R rows of a ciphertext pack into one response with row k's
//!   products at R·j + k.
//!
//! # Security and error
//! Each product is one [`veil_he::round_trip`], as Π_MatMul's. Semi-honest, as veil-he's
//! products: the server sees seeded RLWE ciphertexts under the client's key; the client sees
//! only re-randomised, noise-flooded responses carrying result − r at the coefficients it
//! needs, the server keeping r (uniform in Z_2^ℓ) as its share. Every
//! plaintext is multiplied in under a public bound (a vector's declared bound, 2^(ℓ−1) for a
//! share scalar), which is what the flooding check of [`veil_he::Accumulator::into_response`]
//! uses. Results are exact mod 2^ℓ. Every coefficient revealed counts against the key's session
//! budget (`veil_he::params::SESSION_REVEALED_LOG2`): a row × scalar product reveals rows·cols, the
//! inner products rows per vector. LayerNorm on BERT-Base reveals ≈ 2^21.2 per inference on the
//! share-product key, whose attention products reveal ≈ 2^21.8: ≈ 2^22.5 in all, ≈ 44 inferences
//! per session; the model-weight key reveals more per inference (≈ 2^23.3 for the FC outputs), so
//! the session's limit does not move.

use veil_core::parallel::parallel_map;
use veil_core::{ensure, Prg, Result, Ring};
use veil_he::{
    round_trip, Accumulator, EvalCiphertext, GaloisKeys, NttPlaintext, PackShape, Params,
    PublicKey, Response, SecretKey, MIN_GALOIS_LEVELS,
};
use veil_net::Channel;

/// Inner-product members per packed response.
const PACK: usize = 1 << MIN_GALOIS_LEVELS;

/// Bits of a limb of a share scalar when the ring is too wide to multiply it whole (ℓ > 41):
/// `ParamSet::N8192Q4L48`'s flood hides plaintext products up to 2^47 in all, which a whole
/// 48-bit share (bound 2^47, times the flood's own factor) exceeds, but centred 24-bit limbs
/// (|s_j| ≤ 2^23) fit with room to spare. The same split as veil-linear's share products.
const LIMB_BITS: u32 = 24;

/// Limbs a share scalar over `ring` is multiplied in: 1 up to ℓ = 41, ⌈ℓ/24⌉ beyond.
fn scalar_limbs(ring: Ring) -> usize {
    if ring.bits() <= 41 {
        1
    } else {
        ring.bits().div_ceil(LIMB_BITS) as usize
    }
}

/// The public bound on one limb: a whole centred share (2^(ℓ−1)) when there is one limb.
fn limb_bound(ring: Ring) -> u64 {
    if scalar_limbs(ring) == 1 {
        1 << (ring.bits() - 1)
    } else {
        1 << (LIMB_BITS - 1)
    }
}

/// Limb `j` of the ring element v: v's signed value itself when there is one limb, else its
/// j-th centred base-2^24 digit (v ≡ Σ_j 2^(24j)·digit_j mod 2^ℓ).
fn scalar_limb(ring: Ring, v: u64, j: usize) -> i64 {
    let mut rest = ring.to_signed(v);
    if scalar_limbs(ring) == 1 {
        return rest;
    }
    let half = 1i64 << (LIMB_BITS - 1);
    let mut digit = 0;
    for _ in 0..=j {
        digit = (rest + half).rem_euclid(1 << LIMB_BITS) - half;
        rest = (rest - digit) >> LIMB_BITS;
    }
    digit
}

/// out += 2^(24·limb)·part (mod 2^ℓ): one limb's product shares into the whole product's.
fn recombine(ring: Ring, out: &mut [u64], part: &[u64], limb: usize) -> Result<()> {
    ensure!(
        part.len() == out.len(),
        InvalidArgument,
        "{} row products for {} values",
        part.len(),
        out.len()
    );
    let weight = ring.reduce(1u64 << (LIMB_BITS as usize * limb).min(63));
    for (o, &v) in out.iter_mut().zip(part) {
        *o = ring.add(*o, ring.mul(v, weight));
    }
    Ok(())
}

/// The stride layout of a [rows, cols] matrix (module docs).
#[derive(Clone, Copy, Debug)]
struct Layout {
    rows: usize,
    cols: usize,
    /// R: rows per ciphertext, also the coefficient stride.
    stride: usize,
    n: usize,
}

impl Layout {
    fn new(p: &Params, rows: usize, cols: usize) -> Result<Self> {
        let n = p.degree();
        ensure!(
            rows > 0 && cols > 0 && 2 * cols <= n,
            InvalidArgument,
            "HE row products need 0 < cols ≤ N/2 = {} (got {rows} rows of {cols})",
            n / 2
        );
        let stride = (n / cols).min(PACK);
        let stride = 1usize << (usize::BITS - 1 - stride.leading_zeros());
        Ok(Layout {
            rows,
            cols,
            stride,
            n,
        })
    }

    fn ciphertexts(&self) -> usize {
        self.rows.div_ceil(self.stride)
    }

    fn rows_in(&self, c: usize) -> usize {
        (self.rows - c * self.stride).min(self.stride)
    }

    /// The plaintext of ciphertext c.
    fn poly(&self, u: &[u64], c: usize) -> Vec<u64> {
        let mut m = vec![0u64; self.n];
        for k in 0..self.rows_in(c) {
            let row = &u[(c * self.stride + k) * self.cols..][..self.cols];
            for (j, &x) in row.iter().enumerate() {
                m[self.stride * j + k] = x;
            }
        }
        m
    }

    /// Leaves of the packing of `members` ≥ 2 members (a power of two).
    fn leaves(members: usize) -> usize {
        members.next_power_of_two().max(2)
    }

    /// Groups of inner-product members, in order: (first member, count).
    fn dot_groups(members: usize) -> impl Iterator<Item = (usize, usize)> {
        (0..members)
            .step_by(PACK)
            .map(move |s| (s, (members - s).min(PACK)))
    }

    /// Coefficients of a packed inner-product response of `count` members.
    fn dot_positions(count: usize) -> Vec<usize> {
        if count == 1 {
            return vec![0];
        }
        let step = PACK / Self::leaves(count);
        (0..count).map(|r| step * r).collect()
    }

    /// Coefficients of ciphertext c's row-scaled response, row-major (row k, then j).
    fn scaled_positions(&self, c: usize) -> Vec<usize> {
        let rows = self.rows_in(c);
        let step = if rows == 1 {
            0
        } else {
            self.stride / Self::leaves(rows)
        };
        (0..rows)
            .flat_map(|k| (0..self.cols).map(move |j| self.stride * j + step * k))
            .collect()
    }
}

/// The client's side: its encrypted matrix is on the server; it decrypts the results.
pub(crate) struct RowsClient<'k> {
    sk: &'k SecretKey,
    lay: Layout,
}

/// The server's side: the client's expanded ciphertexts, and the keys to answer.
pub(crate) struct RowsServer<'k> {
    pk: &'k PublicKey,
    gk: &'k GaloisKeys,
    lay: Layout,
    cts: Vec<EvalCiphertext>,
}

/// Client: encrypts U ([rows, cols], values in Z_2^ℓ) and sends it (one message).
pub(crate) fn client_open<'k, C: Channel>(
    ch: &mut C,
    sk: &'k SecretKey,
    u: &[u64],
    rows: usize,
    cols: usize,
) -> Result<RowsClient<'k>> {
    let p = sk.params();
    let lay = Layout::new(p, rows, cols)?;
    ensure!(
        u.len() == rows * cols,
        InvalidArgument,
        "{} values for {rows} rows of {cols}",
        u.len()
    );
    round_trip::send_operands(ch, sk, lay.ciphertexts(), |c| lay.poly(u, c))?;
    Ok(RowsClient { sk, lay })
}

/// Server: receives the client's encrypted [rows, cols] matrix.
pub(crate) fn server_open<'k, C: Channel>(
    ch: &mut C,
    pk: &'k PublicKey,
    gk: &'k GaloisKeys,
    rows: usize,
    cols: usize,
) -> Result<RowsServer<'k>> {
    let p = pk.params();
    ensure!(
        gk.params().moduli() == p.moduli(),
        InvalidArgument,
        "public and Galois keys of different parameters"
    );
    let lay = Layout::new(p, rows, cols)?;
    let cts = round_trip::receive_operands(ch, p, lay.ciphertexts(), |_, _| Ok(()))?;
    Ok(RowsServer { pk, gk, lay, cts })
}

impl RowsClient<'_> {
    /// Shares of Σ_j U_kj·v_kj for each of the server's `vectors` (plane-major: `[vector][row]`).
    pub(crate) fn inner_products<C: Channel>(
        &self,
        ch: &mut C,
        vectors: usize,
    ) -> Result<Vec<Vec<u64>>> {
        let members = vectors * self.lay.rows;
        let positions: Vec<Vec<usize>> = Layout::dot_groups(members)
            .map(|(_, count)| Layout::dot_positions(count))
            .collect();
        let flat: Vec<u64> = round_trip::receive_results(ch, self.sk, &positions)?.concat();
        Ok(flat.chunks(self.lay.rows).map(<[u64]>::to_vec).collect())
    }

    /// Shares of U_kj·s_k for the server's per-row scalars s (row-major, like U): one
    /// response set per limb of s ([`scalar_limbs`]), recombined as Σ_j 2^(24j)·(U·s_j).
    pub(crate) fn row_scaled<C: Channel>(&self, ch: &mut C) -> Result<Vec<u64>> {
        let positions: Vec<Vec<usize>> = (0..self.lay.ciphertexts())
            .map(|c| self.lay.scaled_positions(c))
            .collect();
        let ring = self.sk.params().ring();
        let mut out = vec![0u64; self.lay.rows * self.lay.cols];
        for limb in 0..scalar_limbs(ring) {
            let part = round_trip::receive_results(ch, self.sk, &positions)?.concat();
            recombine(ring, &mut out, &part, limb)?;
        }
        Ok(out)
    }
}

impl RowsServer<'_> {
    fn params(&self) -> &Params {
        self.pk.params()
    }

    fn ring(&self) -> Ring {
        self.params().ring()
    }

    /// One masked response from `members` (see [`round_trip::respond`]).
    fn respond(
        &self,
        members: Vec<Accumulator>,
        shape: Option<PackShape>,
        positions: &[usize],
        prg: &mut Prg,
    ) -> Result<(Response, Vec<u64>)> {
        round_trip::respond(
            self.pk,
            Some(self.gk),
            members,
            shape.as_ref(),
            positions,
            |_| 0,
            prg,
        )
    }

    fn send<C: Channel>(&self, ch: &mut C, parts: Vec<(Response, Vec<u64>)>) -> Result<Vec<u64>> {
        let (responses, shares): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
        round_trip::send_responses(ch, self.params(), &responses)?;
        Ok(shares.concat())
    }

    /// The server's side of [`RowsClient::inner_products`]: `vectors[i]` is a [rows, cols] matrix
    /// (row k's vector is its row k) of signed values with |v| ≤ `bound` (a public bound).
    pub(crate) fn inner_products<C: Channel>(
        &self,
        ch: &mut C,
        vectors: &[Vec<i64>],
        bound: u64,
    ) -> Result<Vec<Vec<u64>>> {
        let lay = self.lay;
        let (rows, cols, n, r) = (lay.rows, lay.cols, lay.n, lay.stride);
        ensure!(
            vectors.iter().all(|v| v.len() == rows * cols),
            InvalidArgument,
            "inner-product vectors must be {rows}×{cols}"
        );
        let p = self.params();
        let members = vectors.len() * rows;
        let groups: Vec<(usize, usize)> = Layout::dot_groups(members).collect();
        let parts = parallel_map(groups.len(), |g, prg| {
            let (first, count) = groups[g];
            let mut accs = Vec::with_capacity(count);
            for member in first..first + count {
                let (plane, row) = (member / rows, member % rows);
                let (c, k) = (row / r, row % r);
                // Σ_j v_j·X^−(Rj+k): X^−e = −X^(N−e) for 0 < e < N.
                let mut coeffs = vec![0i64; n];
                for (j, &v) in vectors[plane][row * cols..][..cols].iter().enumerate() {
                    let e = r * j + k;
                    if e == 0 {
                        coeffs[0] = v;
                    } else {
                        coeffs[n - e] = -v;
                    }
                }
                let pt = NttPlaintext::new(p, &coeffs, bound)?;
                let mut acc = Accumulator::new(p);
                acc.mul_acc(p, &self.cts[c], &pt);
                accs.push(acc);
            }
            let shape = (count > 1)
                .then(|| PackShape::new(PACK, Layout::leaves(count), 0))
                .transpose()?;
            self.respond(accs, shape, &Layout::dot_positions(count), prg)
        })?;
        let flat = self.send(ch, parts)?;
        Ok(flat.chunks(rows).map(<[u64]>::to_vec).collect())
    }

    /// The server's side of [`RowsClient::row_scaled`]: one scalar per row (a ring element).
    pub(crate) fn row_scaled<C: Channel>(&self, ch: &mut C, s: &[u64]) -> Result<Vec<u64>> {
        let lay = self.lay;
        ensure!(
            s.len() == lay.rows,
            InvalidArgument,
            "{} scalars for {} rows",
            s.len(),
            lay.rows
        );
        let ring = self.ring();
        let limbs = scalar_limbs(ring);
        let mut out = vec![0u64; lay.rows * lay.cols];
        for limb in 0..limbs {
            let digits: Vec<i64> = s.iter().map(|&v| scalar_limb(ring, v, limb)).collect();
            let part = self.row_scaled_signed(ch, &digits, limb_bound(ring))?;
            recombine(ring, &mut out, &part, limb)?;
        }
        Ok(out)
    }

    /// One response set of [`RowsServer::row_scaled`]: the rows times signed scalars |s| ≤ bound.
    fn row_scaled_signed<C: Channel>(&self, ch: &mut C, s: &[i64], bound: u64) -> Result<Vec<u64>> {
        let lay = self.lay;
        let p = self.params();
        let parts = parallel_map(lay.ciphertexts(), |c, prg| {
            let rows = lay.rows_in(c);
            let mut accs = Vec::with_capacity(rows);
            for k in 0..rows {
                let pt = NttPlaintext::new(p, &[s[c * lay.stride + k]], bound)?;
                let mut acc = Accumulator::new(p);
                acc.mul_acc(p, &self.cts[c], &pt);
                if k > 0 {
                    acc.mul_monomial(p, 2 * lay.n - k);
                }
                accs.push(acc);
            }
            let shape = (rows > 1)
                .then(|| PackShape::new(lay.stride, Layout::leaves(rows), 0))
                .transpose()?;
            self.respond(accs, shape, &lay.scaled_positions(c), prg)
        })?;
        self.send(ch, parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_harness::fp;
    use veil_he::session::{ClientSession, ServerSession, SHARED_SET};
    use veil_net::{run_two_party, MemChannel};

    fn ring() -> Ring {
        fp().ring
    }

    fn client_session<C: Channel>(ch: &mut C) -> veil_core::Result<ClientSession> {
        ClientSession::setup_for(ch, ring(), &[SHARED_SET])
    }

    fn server_session<C: Channel>(ch: &mut C) -> veil_core::Result<ServerSession> {
        ServerSession::setup_for(ch, ring(), &[SHARED_SET])
    }

    fn random_ring(n: usize) -> Vec<u64> {
        let mut prg = Prg::from_os_entropy();
        (0..n).map(|_| prg.ring_elem(ring())).collect()
    }

    /// Client matrix u (any ring values), server vectors (signed, |v| ≤ bound) and scalars: both
    /// products open to the integers mod 2^ℓ.
    fn check_products(rows: usize, cols: usize, planes: usize, bound: i64) {
        check_products_at(ring(), SHARED_SET, (rows, cols), planes, bound);
    }

    fn check_products_at(
        r: Ring,
        set: veil_he::ParamSet,
        (rows, cols): (usize, usize),
        planes: usize,
        bound: i64,
    ) {
        let mut prg = Prg::from_os_entropy();
        let mut u: Vec<u64> = (0..rows * cols).map(|_| prg.ring_elem(r)).collect();
        // Edges: the ring's extremes and zero in the first row.
        for (j, e) in [0u64, 1, r.from_signed(-1), 1 << 40, (1 << 40) - 1]
            .iter()
            .enumerate()
        {
            if j < cols {
                u[j] = *e;
            }
        }
        let vectors: Vec<Vec<i64>> = (0..planes)
            .map(|_| {
                (0..rows * cols)
                    .map(|i| match i % 7 {
                        0 => bound,
                        1 => -bound,
                        _ => (prg.below(2 * bound as u64 + 1) as i64) - bound,
                    })
                    .collect()
            })
            .collect();
        // Scalars with both extremes: a whole share wider than one limb at ℓ = 48.
        let mut scalars: Vec<u64> = (0..rows).map(|_| prg.ring_elem(r)).collect();
        scalars[0] = r.from_signed(-1);
        if rows > 1 {
            scalars[1] = 1 << (r.bits() - 1);
        }
        let (c, s) = run_two_party(
            |ch: &mut MemChannel| {
                let sess = ClientSession::setup_for(ch, r, &[set])?;
                let rc = client_open(ch, sess.key(set)?, &u, rows, cols)?;
                Ok((rc.inner_products(ch, planes)?, rc.row_scaled(ch)?))
            },
            |ch: &mut MemChannel| {
                let sess = ServerSession::setup_for(ch, r, &[set])?;
                let (pk, gk) = sess.keys_for(set)?;
                let rs = server_open(ch, pk, gk, rows, cols)?;
                Ok((
                    rs.inner_products(ch, &vectors, bound as u64)?,
                    rs.row_scaled(ch, &scalars)?,
                ))
            },
        )
        .expect("protocol run");
        for (p, plane) in vectors.iter().enumerate() {
            for row in 0..rows {
                let want = (0..cols).fold(0u64, |acc, j| {
                    let v = r.from_signed(plane[row * cols + j]);
                    r.add(acc, r.mul(u[row * cols + j], v))
                });
                assert_eq!(r.add(c.0[p][row], s.0[p][row]), want, "plane {p} row {row}");
            }
        }
        for i in 0..rows * cols {
            let want = r.mul(u[i], scalars[i / cols]);
            assert_eq!(r.add(c.1[i], s.1[i]), want, "element {i}");
        }
    }

    #[test]
    fn row_products_match_integers_bert_rows() {
        // 8 rows fill one ciphertext at stride 8; 13 leave a partial one.
        check_products(13, 768, 2, 32);
    }

    /// ℓ = 48 (the decoder's ring, `N8192Q4L48`): a row × share-scalar product is refused as
    /// insecure if the 48-bit scalar is multiplied whole, so it runs as two 24-bit limbs; a
    /// SmolLM2-wide row (576) and the inner products' widest plane (b = 32 bits) pass.
    #[test]
    fn row_products_at_48_bits_use_limbs() {
        let r = Ring::new(48).unwrap();
        check_products_at(r, veil_he::ParamSet::N8192Q4L48, (5, 576), 2, 1 << 31);
    }

    #[test]
    fn row_products_match_integers_other_shapes() {
        // Stride 64 (BERT-Tiny rows), a single row, odd widths, and 65 members (two packed groups).
        check_products(3, 128, 1, 1 << 20);
        check_products(1, 5, 3, 1);
        check_products(65, 3, 1, 7);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(6))]
        /// Any shape the layout takes: partial ciphertexts, strides from 2 to 64, several planes,
        /// bounds from 1 to 2^30.
        #[test]
        fn row_products_any_shape(rows in 1usize..20, cols in 1usize..300, planes in 1usize..3, bits in 0u32..31) {
            check_products(rows, cols, planes, 1i64 << bits);
        }
    }

    #[test]
    fn bad_messages_are_errors_not_panics() {
        let rows = 2;
        let cols = 16;
        let u = random_ring(rows * cols);
        // Server: a truncated, a garbage, an empty and an over-long request.
        for bad in 0..4 {
            let (_, refused) = run_two_party(
                |ch: &mut MemChannel| {
                    let sess = client_session(ch)?;
                    let sk = sess.key(SHARED_SET)?;
                    let ct = sk.encrypt(&[1, 2, 3], &mut Prg::from_os_entropy())?;
                    let valid = veil_he::wire::encode_ciphertexts(sk.params(), &[ct]);
                    let msg = match bad {
                        0 => valid[..valid.len() / 2].to_vec(),
                        1 => vec![0xA5; valid.len()],
                        2 => Vec::new(),
                        _ => [valid.clone(), valid].concat(),
                    };
                    ch.send_msg(&msg)?;
                    ch.flush()
                },
                |ch: &mut MemChannel| {
                    let sess = server_session(ch)?;
                    let (pk, gk) = sess.keys_for(SHARED_SET)?;
                    Ok(server_open(ch, pk, gk, rows, cols).is_err())
                },
            )
            .expect("run");
            assert!(refused, "damaged request {bad} accepted");
        }
        // Client: a garbage response, then a peer that hangs up; the server refuses wrong shapes
        // and out-of-bound plaintexts before sending anything.
        let (c, _) = run_two_party(
            |ch: &mut MemChannel| {
                let sess = client_session(ch)?;
                let rc = client_open(ch, sess.key(SHARED_SET)?, &u, rows, cols)?;
                let garbage = rc.inner_products(ch, 1).is_err();
                let hung_up = rc.row_scaled(ch).is_err();
                Ok((garbage, hung_up))
            },
            |ch: &mut MemChannel| {
                let sess = server_session(ch)?;
                let (pk, gk) = sess.keys_for(SHARED_SET)?;
                let rs = server_open(ch, pk, gk, rows, cols)?;
                assert!(rs.inner_products(ch, &[vec![0; 3]], 1).is_err());
                assert!(rs.row_scaled(ch, &[1]).is_err());
                assert!(rs.inner_products(ch, &[vec![5; rows * cols]], 4).is_err());
                ch.send_msg(&[7u8; 100])?;
                ch.flush()
            },
        )
        .expect("run");
        assert!(c.0, "garbage response accepted");
        assert!(c.1, "a response from a closed channel");
    }

    #[test]
    fn stride_fits_rows_into_the_degree() {
        let p = Params::new(veil_he::ParamSet::N8192Q4, Ring::new(41).unwrap()).unwrap();
        for (cols, stride) in [(768, 8), (128, 64), (1, 64), (4096, 2), (3000, 2)] {
            let lay = Layout::new(&p, 5, cols).unwrap();
            assert_eq!(lay.stride, stride, "cols {cols}");
            assert!(lay.stride * cols <= 8192);
        }
        assert!(Layout::new(&p, 5, 4097).is_err());
        assert!(Layout::new(&p, 0, 8).is_err());
    }

    #[test]
    fn positions_are_distinct_and_in_range() {
        let p = Params::new(veil_he::ParamSet::N8192Q4, Ring::new(41).unwrap()).unwrap();
        let lay = Layout::new(&p, 13, 768).unwrap();
        for c in 0..lay.ciphertexts() {
            let mut pos = lay.scaled_positions(c);
            assert_eq!(pos.len(), lay.rows_in(c) * 768);
            pos.sort_unstable();
            pos.dedup();
            assert_eq!(pos.len(), lay.rows_in(c) * 768);
            assert!(pos.iter().all(|&x| x < 8192));
        }
        for count in 1..=PACK {
            let pos = Layout::dot_positions(count);
            assert_eq!(pos.len(), count);
            assert!(pos.windows(2).all(|w| w[0] < w[1]) && pos[count - 1] < PACK);
        }
    }
}
