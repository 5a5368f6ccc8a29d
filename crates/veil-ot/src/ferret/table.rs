//! Memory for the big COT buffers, backed by 2 MiB pages where the OS allows.
//!
//! * [`HugeTable`]: the reserve of COT blocks. The LPN step reads k blocks of it at random
//!   (9.4 MB for the main set). With 4 KiB pages almost every read also misses the TLB, so the
//!   table asks Linux for transparent huge pages (`madvise(MADV_HUGEPAGE)`, before the first
//!   touch). On the 2-core VM one LPN thread took ~47 instead of ~65 ns per row (noisy, loaded
//!   machine). Before, the window could miss the last partial huge page and the hint was then
//!   skipped altogether; the buffer now always holds whole huge pages.
//! * [`reserve_wiping`], [`scratch_wiping`]: grow the pools' and iterations' buffers (170 MB
//!   per main iteration) with the same hint, which turns ~40,000 page faults per buffer into
//!   ~80 (fresh pages cost ~2× less CPU this way; page faults were 10 % of the CPU of a ReLU
//!   on 2^20 elements), and wipe the old allocation.
//!
//! Both are only hints: elsewhere, or if the kernel declines, the memory behaves as plain pages.

use zeroize::Zeroize;

/// 2 MiB, the x86_64 huge-page size.
const HUGE: usize = 2 << 20;
const BLOCKS_PER_HUGE: usize = HUGE / 16;

pub struct HugeTable {
    buf: Vec<u128>,
    start: usize,
    len: usize,
}

impl HugeTable {
    /// A zeroed table of `len` blocks.
    pub fn new(len: usize) -> Self {
        // Over-allocate so a 2 MiB-aligned window of whole huge pages covering `len` blocks
        // exists wherever the allocator places the buffer.
        let buf = vec![0u128; len.next_multiple_of(BLOCKS_PER_HUGE) + BLOCKS_PER_HUGE];
        let addr = buf.as_ptr() as usize;
        let start = (addr.next_multiple_of(HUGE) - addr) / 16;
        let mut table = HugeTable { buf, start, len };
        table.advise();
        table
    }

    fn advise(&mut self) {
        let window = &self.buf[self.start..];
        advise_huge(window.as_ptr() as usize, std::mem::size_of_val(window));
    }

    pub fn as_slice(&self) -> &[u128] {
        &self.buf[self.start..self.start + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u128] {
        &mut self.buf[self.start..self.start + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Asks for huge pages on the whole 2 MiB pages inside `[addr, addr + bytes)`, which must be
/// memory this process owns (a live allocation).
fn advise_huge(addr: usize, bytes: usize) {
    let start = addr.next_multiple_of(HUGE);
    let end = (addr + bytes) / HUGE * HUGE;
    if end <= start {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: the range lies inside a live allocation of the caller and is page-aligned;
    // MADV_HUGEPAGE changes only how the kernel backs the pages, never their contents.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
    }
}

/// Makes room for exactly `additional` more elements in `v` (callers that append repeatedly
/// ask for more to amortise). When the buffer must move, the
/// new allocation is advised for huge pages before its first touch and the old one is wiped
/// (a plain `reserve` would free it with COTs inside).
pub(crate) fn reserve_wiping<T: Copy + Zeroize>(v: &mut Vec<T>, additional: usize) {
    if v.capacity() - v.len() >= additional {
        return;
    }
    let cap = v.len() + additional;
    let mut bigger = Vec::with_capacity(cap);
    advise_huge(bigger.as_ptr() as usize, cap * std::mem::size_of::<T>());
    bigger.extend_from_slice(v);
    v.zeroize();
    *v = bigger;
}

/// Makes `v` exactly `len` long for a caller that overwrites all of it: when the allocation
/// is too small, the old contents are wiped and dropped, not copied, and the new allocation
/// holds at least `min_capacity`, so buffers whose length varies a little grow only once.
pub(crate) fn scratch_wiping<T: Copy + Zeroize + Default>(
    v: &mut Vec<T>,
    len: usize,
    min_capacity: usize,
) {
    if v.capacity() < len {
        v.zeroize();
        let cap = len.max(min_capacity);
        let fresh = Vec::with_capacity(cap);
        advise_huge(fresh.as_ptr() as usize, cap * std::mem::size_of::<T>());
        *v = fresh;
    }
    v.resize(len, T::default());
}

impl Drop for HugeTable {
    fn drop(&mut self) {
        self.buf.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_is_aligned_and_sized() {
        let mut t = HugeTable::new(1000);
        assert_eq!(t.len(), 1000);
        assert_eq!(t.as_slice().as_ptr() as usize % HUGE, 0);
        t.as_mut_slice()[999] = 5;
        assert_eq!(t.as_slice()[999], 5);
        // A length just past a multiple of the huge page still gets an aligned window.
        let t = HugeTable::new(BLOCKS_PER_HUGE * 4 + 1);
        assert_eq!(t.as_slice().as_ptr() as usize % HUGE, 0);
        assert_eq!(t.as_slice().len(), BLOCKS_PER_HUGE * 4 + 1);
    }

    #[test]
    fn reserve_wiping_keeps_contents_across_growth() {
        let mut v: Vec<u128> = Vec::new();
        let mut want = Vec::new();
        for round in 0..50u128 {
            let chunk: Vec<u128> = (0..round * 7 + 1).map(|i| i * 1000 + round).collect();
            let more = chunk.len().max(v.len());
            reserve_wiping(&mut v, more);
            let cap = v.capacity();
            v.extend_from_slice(&chunk);
            assert_eq!(v.capacity(), cap, "no second reallocation");
            want.extend_from_slice(&chunk);
            assert_eq!(v, want);
        }
        reserve_wiping(&mut v, BLOCKS_PER_HUGE * 3);
        assert_eq!(v, want);
        assert!(v.capacity() >= want.len() + BLOCKS_PER_HUGE * 3);
        // Within capacity, scratch_wiping keeps the allocation; beyond, it starts afresh.
        let cap = v.capacity();
        scratch_wiping(&mut v, 10, 0);
        assert_eq!((v.len(), v.capacity()), (10, cap));
        scratch_wiping(&mut v, cap + 1, 2 * cap);
        assert_eq!(v.len(), cap + 1);
        assert!(v.capacity() >= 2 * cap);
    }
}
