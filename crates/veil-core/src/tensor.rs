//! Row-major tensors of ring elements. Shapes are checked on every binary operation and reported
//! as errors, because shapes often come from a peer or a model file.

use crate::{ensure, FixedPoint, Prg, Result, Ring};

#[derive(Clone, Debug, PartialEq, Eq)]
/// A row-major tensor of ring elements with a checked shape: shares, their sums and the exact
/// integer oracle of the protocols (`matmul`).
pub struct RingTensor {
    ring: Ring,
    shape: Vec<usize>,
    data: Vec<u64>,
}

fn numel(shape: &[usize]) -> Result<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        acc.checked_mul(d)
            .ok_or_else(|| crate::Error::InvalidArgument(format!("shape {shape:?} overflows")))
    })
}

/// Zeroes the entries (for shares and masks that must not outlive their use).
impl zeroize::Zeroize for RingTensor {
    fn zeroize(&mut self) {
        self.data.zeroize();
    }
}

impl RingTensor {
    /// All zeros.
    pub fn zeros(ring: Ring, shape: &[usize]) -> Result<Self> {
        Ok(RingTensor {
            ring,
            shape: shape.to_vec(),
            data: vec![0; numel(shape)?],
        })
    }

    /// Wraps raw values; every value must already be reduced mod 2^ℓ.
    pub fn from_vec(ring: Ring, shape: &[usize], data: Vec<u64>) -> Result<Self> {
        let n = numel(shape)?;
        ensure!(
            data.len() == n,
            InvalidArgument,
            "{} values for shape {shape:?} ({n} needed)",
            data.len()
        );
        ensure!(
            data.iter().all(|&x| ring.contains(x)),
            Malformed,
            "value outside Z_2^{}",
            ring.bits()
        );
        Ok(RingTensor {
            ring,
            shape: shape.to_vec(),
            data,
        })
    }

    /// Uniform elements drawn from `prg` (a random mask or share).
    pub fn random(ring: Ring, shape: &[usize], prg: &mut Prg) -> Result<Self> {
        let mut t = Self::zeros(ring, shape)?;
        prg.fill_ring(ring, &mut t.data);
        Ok(t)
    }

    /// Encodes reals in the fixed-point format `fp`.
    pub fn encode(fp: FixedPoint, shape: &[usize], values: &[f64]) -> Result<Self> {
        Self::from_vec(
            fp.ring,
            shape,
            values.iter().map(|&v| fp.encode(v)).collect(),
        )
    }

    /// The reals the elements stand for in the format `fp`.
    pub fn decode(&self, fp: FixedPoint) -> Vec<f64> {
        self.data.iter().map(|&v| fp.decode(v)).collect()
    }

    /// The ring of the elements.
    pub fn ring(&self) -> Ring {
        self.ring
    }
    /// The dimensions, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }
    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    /// The elements, row-major.
    pub fn data(&self) -> &[u64] {
        &self.data
    }
    /// The elements, row-major, without a copy.
    pub fn into_data(self) -> Vec<u64> {
        self.data
    }

    /// Mutable access; callers must keep values reduced (use the ring's operations).
    pub fn data_mut(&mut self) -> &mut [u64] {
        &mut self.data
    }

    /// The same elements under another shape with as many elements.
    pub fn reshape(mut self, shape: &[usize]) -> Result<Self> {
        ensure!(
            numel(shape)? == self.data.len(),
            InvalidArgument,
            "cannot reshape {:?} to {shape:?}",
            self.shape
        );
        self.shape = shape.to_vec();
        Ok(self)
    }

    fn check_same(&self, other: &Self) -> Result<()> {
        ensure!(self.ring == other.ring, InvalidArgument, "ring mismatch");
        ensure!(
            self.shape == other.shape,
            InvalidArgument,
            "shape mismatch {:?} vs {:?}",
            self.shape,
            other.shape
        );
        Ok(())
    }

    /// Element-wise sum (shapes and rings must match).
    pub fn add(&self, other: &Self) -> Result<Self> {
        let mut out = self.clone();
        out.add_in_place(other)?;
        Ok(out)
    }

    /// Element-wise difference (shapes and rings must match).
    pub fn sub(&self, other: &Self) -> Result<Self> {
        let mut out = self.clone();
        out.sub_in_place(other)?;
        Ok(out)
    }

    /// [`RingTensor::add`] in place.
    pub fn add_in_place(&mut self, other: &Self) -> Result<()> {
        self.check_same(other)?;
        let r = self.ring;
        self.data
            .iter_mut()
            .zip(&other.data)
            .for_each(|(a, &b)| *a = r.add(*a, b));
        Ok(())
    }

    /// [`RingTensor::sub`] in place.
    pub fn sub_in_place(&mut self, other: &Self) -> Result<()> {
        self.check_same(other)?;
        let r = self.ring;
        self.data
            .iter_mut()
            .zip(&other.data)
            .for_each(|(a, &b)| *a = r.sub(*a, b));
        Ok(())
    }

    /// Element-wise negation.
    pub fn neg(&self) -> Self {
        let r = self.ring;
        RingTensor {
            ring: r,
            shape: self.shape.clone(),
            data: self.data.iter().map(|&a| r.neg(a)).collect(),
        }
    }

    /// Multiplies every element by a public scalar.
    pub fn scale(&self, k: u64) -> Self {
        let r = self.ring;
        RingTensor {
            ring: r,
            shape: self.shape.clone(),
            data: self.data.iter().map(|&a| r.mul(a, k)).collect(),
        }
    }

    /// Element (i, j) of a 2-D tensor.
    pub fn at2(&self, i: usize, j: usize) -> u64 {
        self.data[i * self.shape[1] + j]
    }

    /// Plaintext matrix product of 2-D tensors mod 2^ℓ: the exact oracle for the HE protocols,
    /// and the online step of the preprocessed products (`veil_linear::premask`).
    pub fn matmul(&self, other: &Self) -> Result<Self> {
        ensure!(self.ring == other.ring, InvalidArgument, "ring mismatch");
        ensure!(
            self.shape.len() == 2 && other.shape.len() == 2 && self.shape[1] == other.shape[0],
            InvalidArgument,
            "cannot multiply {:?} by {:?}",
            self.shape,
            other.shape
        );
        let (m, k, n) = (self.shape[0], self.shape[1], other.shape[1]);
        let r = self.ring;
        // Blocks of rows in parallel; inside a block each row of `other` is read once for all
        // its rows (it stays in cache), and the sums wrap in u64 (≡ mod 2^ℓ).
        const ROWS: usize = 8;
        let blocks = crate::parallel::parallel_map(m.div_ceil(ROWS), |blk, _| {
            let rows = blk * ROWS..((blk + 1) * ROWS).min(m);
            let mut out = vec![0u64; rows.len() * n];
            accumulate_rows(&mut out, &self.data, rows, k, &other.data, n);
            out.iter_mut().for_each(|v| *v = r.reduce(*v));
            Ok(out)
        })?;
        RingTensor::from_vec(r, &[m, n], blocks.concat())
    }

    /// 2-D tensors with the same row count and ring, side by side: [X_1 … X_g].
    pub fn concat_columns(parts: &[&RingTensor]) -> Result<Self> {
        ensure!(!parts.is_empty(), InvalidArgument, "nothing to concatenate");
        let (ring, rows) = (parts[0].ring, parts[0].shape.first().copied().unwrap_or(0));
        ensure!(
            parts
                .iter()
                .all(|p| p.shape.len() == 2 && p.shape[0] == rows && p.ring == ring),
            InvalidArgument,
            "concatenated tensors need 2-D shapes with {rows} rows over one ring"
        );
        let cols: usize = parts.iter().map(|p| p.shape[1]).sum();
        let mut d = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for p in parts {
                let w = p.shape[1];
                d.extend_from_slice(&p.data[r * w..(r + 1) * w]);
            }
        }
        RingTensor::from_vec(ring, &[rows, cols], d)
    }

    /// 2-D tensors of one width and ring, one above the other.
    pub fn concat_rows(parts: &[&RingTensor]) -> Result<Self> {
        ensure!(!parts.is_empty(), InvalidArgument, "nothing to concatenate");
        let (ring, cols) = (parts[0].ring, parts[0].shape.get(1).copied().unwrap_or(0));
        ensure!(
            parts
                .iter()
                .all(|p| p.shape.len() == 2 && p.shape[1] == cols && p.ring == ring),
            InvalidArgument,
            "stacked tensors need 2-D shapes with {cols} columns over one ring"
        );
        let rows = parts.iter().map(|p| p.shape[0]).sum();
        let d = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
        RingTensor::from_vec(ring, &[rows, cols], d)
    }

    /// A 2-D tensor cut into blocks of `rows` rows (the inverse of [`Self::concat_rows`]).
    pub fn split_rows(&self, rows: usize) -> Result<Vec<Self>> {
        ensure!(
            self.shape.len() == 2
                && rows > 0
                && self.shape[1] > 0
                && self.shape[0].checked_rem(rows) == Some(0),
            InvalidArgument,
            "cannot cut {:?} into blocks of {rows} rows",
            self.shape
        );
        let cols = self.shape[1];
        self.data
            .chunks(rows * cols)
            .map(|d| RingTensor::from_vec(self.ring, &[rows, cols], d.to_vec()))
            .collect()
    }

    /// Columns `from..from + width` of a 2-D tensor.
    pub fn columns(&self, from: usize, width: usize) -> Result<Self> {
        ensure!(
            self.shape.len() == 2 && from + width <= self.shape[1],
            InvalidArgument,
            "columns {from}..{} of {:?}",
            from + width,
            self.shape
        );
        let cols = self.shape[1];
        let d = (0..self.shape[0])
            .flat_map(|r| {
                self.data[r * cols + from..r * cols + from + width]
                    .iter()
                    .copied()
            })
            .collect();
        RingTensor::from_vec(self.ring, &[self.shape[0], width], d)
    }

    /// Transpose of a 2-D tensor.
    pub fn transpose(&self) -> Result<Self> {
        ensure!(
            self.shape.len() == 2,
            InvalidArgument,
            "transpose needs 2-D, got {:?}",
            self.shape
        );
        let (m, n) = (self.shape[0], self.shape[1]);
        let mut out = vec![0u64; m * n];
        for i in 0..m {
            for j in 0..n {
                out[j * m + i] = self.data[i * n + j];
            }
        }
        RingTensor::from_vec(self.ring, &[n, m], out)
    }
}

/// Adds rows `rows` of A·B (A: `a`, rows of `k`; B: `b`, k rows of `n`) to `out` (one row of
/// `n` per row of the block), wrapping in u64. Each row of B is read once for all the block's
/// rows, so it stays in cache. Compiled for AVX-512 (whose 64-bit lane multiply the baseline
/// lacks: 3× here) and AVX2 beside the baseline, the version chosen at run time.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512dq", "x86_64+avx2"))]
fn accumulate_rows(
    out: &mut [u64],
    a: &[u64],
    rows: std::ops::Range<usize>,
    k: usize,
    b: &[u64],
    n: usize,
) {
    for t in 0..k {
        let b_row = &b[t * n..(t + 1) * n];
        for (o_row, i) in out.chunks_exact_mut(n.max(1)).zip(rows.clone()) {
            let a = a[i * k + t];
            if a == 0 {
                continue;
            }
            for (o, &b) in o_row.iter_mut().zip(b_row) {
                *o = o.wrapping_add(a.wrapping_mul(b));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_small_known_answer() {
        let r = Ring::new(32).unwrap();
        let a = RingTensor::from_vec(r, &[2, 2], vec![1, 2, 3, 4]).unwrap();
        let b = RingTensor::from_vec(r, &[2, 1], vec![5, r.from_signed(-1)]).unwrap();
        let c = a.matmul(&b).unwrap();
        assert_eq!(c.data(), &[3, 11]);
    }

    proptest::proptest! {
        /// The blocked, CPU-dispatched product equals the schoolbook sum mod 2^ℓ on any shape
        /// (row counts off the block of 8, widths off any vector width, empty inner
        /// dimensions) and any values, zeros (which the kernel skips) and ring extremes included.
        #[test]
        fn matmul_is_the_schoolbook_product(
            (m, k, n) in (1usize..20, 0usize..12, 1usize..40),
            bits in 32u32..=64,
            seed in proptest::prelude::any::<u64>(),
        ) {
            let r = Ring::new(bits).unwrap();
            let mut x = seed | 1;
            let mut draw = |len: usize| -> Vec<u64> {
                (0..len)
                    .map(|i| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        match (x >> 60, i % 5) {
                            (0, _) | (_, 0) => 0,
                            (1, _) => r.mask(),
                            _ => r.reduce(x),
                        }
                    })
                    .collect()
            };
            let a = RingTensor::from_vec(r, &[m, k], draw(m * k)).unwrap();
            let b = RingTensor::from_vec(r, &[k, n], draw(k * n)).unwrap();
            let c = a.matmul(&b).unwrap();
            for i in 0..m {
                for j in 0..n {
                    let want = (0..k).fold(0u64, |acc, t| {
                        acc.wrapping_add(a.data()[i * k + t].wrapping_mul(b.data()[t * n + j]))
                    });
                    proptest::prop_assert_eq!(c.data()[i * n + j], r.reduce(want));
                }
            }
        }
    }

    #[test]
    fn shape_errors_are_errors() {
        let r = Ring::new(32).unwrap();
        let a = RingTensor::zeros(r, &[2, 3]).unwrap();
        assert!(a.matmul(&a).is_err());
        assert!(a.add(&RingTensor::zeros(r, &[3, 2]).unwrap()).is_err());
        assert!(RingTensor::from_vec(r, &[2], vec![1]).is_err());
        assert!(RingTensor::from_vec(r, &[1], vec![1 << 40]).is_err());
        assert!(RingTensor::zeros(r, &[usize::MAX, 2]).is_err());
    }

    #[test]
    fn rows_and_columns_cut_and_join_exactly() {
        let r = Ring::new(32).unwrap();
        let x = RingTensor::from_vec(r, &[4, 3], (0..12).collect()).unwrap();
        let blocks = x.split_rows(2).unwrap();
        assert_eq!(blocks[0].data(), &[0, 1, 2, 3, 4, 5]);
        assert_eq!(blocks[1].data(), &[6, 7, 8, 9, 10, 11]);
        let joined = RingTensor::concat_rows(&blocks.iter().collect::<Vec<_>>()).unwrap();
        assert_eq!(joined.shape(), x.shape());
        assert_eq!(joined.data(), x.data());
        let mid = x.columns(1, 2).unwrap();
        assert_eq!(mid.shape(), &[4, 2]);
        assert_eq!(mid.data(), &[1, 2, 4, 5, 7, 8, 10, 11]);
        let whole = RingTensor::concat_columns(&[&x.columns(0, 1).unwrap(), &mid]).unwrap();
        assert_eq!(whole.data(), x.data());
        assert!(x.split_rows(3).is_err());
        assert!(x.split_rows(0).is_err());
        assert!(x.columns(2, 2).is_err());
        let other = RingTensor::zeros(r, &[1, 2]).unwrap();
        assert!(RingTensor::concat_rows(&[&x, &other]).is_err());
    }
}
