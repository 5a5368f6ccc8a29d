//! Memory for the big COT buffers, backed by 2 MiB pages where the OS allows.
//!
//! * [`HugeTable`]: the reserve of COT blocks. The LPN step reads k blocks of it at random
//!   (9.4 MB for the main set). With 4 KiB pages almost every read also misses the TLB, so the
//!   table asks Linux for transparent huge pages (`madvise(MADV_HUGEPAGE)`, before the first
//!   touch). On the 2-core VM one LPN thread took ~47 instead of ~65 ns per row (noisy, loaded
//!   machine). Before, the window could miss the last partial huge page and the hint was then
//!   skipped altogether; the buffer now always holds whole huge pages.
//! * [`PoolBuf`]: a buffer of a session's COT pool, reused by every call: the window a silent
//!   pool writes a call's COTs to, or an IKNP pool's COTs. Grown buffers get the same hint,
//!   which turns ~40,000 page faults per 170 MB buffer into ~80 (page faults were 10 % of the
//!   CPU of a ReLU on 2^20 elements), and are allocated zeroed, so the kernel's fresh zero
//!   pages are not cleared a second time and pages that are never written are never touched,
//!   not even when the buffer is wiped.
//! * [`scratch_wiping`]: the same for the caller-owned buffers of the engines' `Vec` API.
//!
//! Both are only hints: elsewhere, or if the kernel declines, the memory behaves as plain pages.

use zeroize::{DefaultIsZeroes, Zeroize};

/// 2 MiB, the x86_64 huge-page size.
const HUGE: usize = 2 << 20;
const BLOCKS_PER_HUGE: usize = HUGE / 16;

pub(crate) struct HugeTable {
    buf: Vec<u128>,
    start: usize,
    len: usize,
}

impl HugeTable {
    /// A zeroed table of `len` blocks.
    pub(crate) fn new(len: usize) -> Self {
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

    pub(crate) fn as_slice(&self) -> &[u128] {
        &self.buf[self.start..self.start + self.len]
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u128] {
        &mut self.buf[self.start..self.start + self.len]
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes the table keeps resident: its window, in whole huge pages.
    pub(crate) fn bytes(&self) -> usize {
        huge_bytes(self.len)
    }
}

#[cfg(test)]
impl Clone for HugeTable {
    fn clone(&self) -> Self {
        let mut t = HugeTable::new(self.len);
        t.as_mut_slice().copy_from_slice(self.as_slice());
        t
    }
}

/// Bytes a [`HugeTable`] of `len` blocks keeps resident.
pub(crate) fn huge_bytes(len: usize) -> usize {
    (len * 16).next_multiple_of(HUGE)
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

/// A pool buffer of COT entries (blocks or choice bits), one allocation serving every refill.
/// `buf` is fully initialised (allocated zeroed); entries at and beyond `written` have never
/// held a COT, so wiping stops there and never faults in pages that were not used.
pub(crate) struct PoolBuf<T: DefaultIsZeroes> {
    buf: Vec<T>,
    written: usize,
}

impl<T: DefaultIsZeroes> PoolBuf<T> {
    /// Takes over `v`, all of which may hold COTs.
    pub(crate) fn from_vec(v: Vec<T>) -> Self {
        let written = v.len();
        PoolBuf { buf: v, written }
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        &self.buf
    }

    /// The entries written so far, to overwrite.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.buf[..self.written]
    }

    /// Bytes of the entries ever written: what the buffer keeps resident (pages never written
    /// are never touched).
    pub(crate) fn written_bytes(&self) -> usize {
        self.written * std::mem::size_of::<T>()
    }

    /// Prepares the buffer for a refill that writes all of `[0, len)`: the live entries
    /// `live` move to start at `at` (`at + live.len() <= len`), and the caller then fills the
    /// rest of `[0, len)`. When the buffer is too short, a new one of at least `min_capacity`
    /// entries replaces it (huge pages advised before the first touch) and the old one is
    /// wiped. Returns `[0, len)`.
    pub(crate) fn make_room(
        &mut self,
        live: std::ops::Range<usize>,
        at: usize,
        len: usize,
        min_capacity: usize,
    ) -> &mut [T] {
        assert!(
            live.end <= self.written && at + live.len() <= len,
            "pool buffer layout"
        );
        if self.buf.len() < len {
            let cap = len.max(min_capacity);
            let mut fresh = vec![T::default(); cap];
            advise_huge(fresh.as_ptr() as usize, cap * std::mem::size_of::<T>());
            fresh[at..at + live.len()].copy_from_slice(&self.buf[live]);
            self.wipe();
            *self = PoolBuf {
                buf: fresh,
                written: len,
            };
        } else {
            if live.start != at {
                self.buf.copy_within(live, at);
            }
            self.written = self.written.max(len);
        }
        &mut self.buf[..len]
    }

    fn wipe(&mut self) {
        self.buf[..self.written].zeroize();
    }
}

impl<T: DefaultIsZeroes> Drop for PoolBuf<T> {
    fn drop(&mut self) {
        self.wipe();
    }
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

/// Only the window ever holds COTs: wiping the rest would fault in pages never used.
impl Drop for HugeTable {
    fn drop(&mut self) {
        self.as_mut_slice().zeroize();
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
    fn pool_buf_moves_live_entries_and_grows_once() {
        let mut b = PoolBuf::from_vec((0..100u128).collect());
        // In place: the live tail moves behind a fresh region of 50.
        let out = b.make_room(90..100, 50, 60, 0);
        assert_eq!(out.len(), 60);
        assert_eq!(&out[50..60], &(90..100u128).collect::<Vec<_>>()[..]);
        out[..50].fill(7);
        assert_eq!(b.as_slice().len(), 100);
        assert_eq!(b.written, 100);
        // Growing keeps the live entries (here overlapping their new place) and the capacity.
        let out = b.make_room(45..60, 40, 300, 1000);
        assert_eq!(out[40..45], [7; 5]);
        assert_eq!(&out[45..55], &(90..100u128).collect::<Vec<_>>()[..]);
        assert_eq!(b.as_slice().len(), 1000);
        assert_eq!(b.written, 300);
        // A shorter refill leaves the buffer, and what must be wiped, as it was.
        b.make_room(0..0, 0, 10, 0);
        assert_eq!((b.as_slice().len(), b.written), (1000, 300));
        b.wipe();
        assert!(b.as_slice().iter().all(|&x| x == 0));
        // scratch_wiping keeps a large enough allocation and starts afresh beyond it.
        let mut v: Vec<u128> = vec![1; 20];
        let cap = v.capacity();
        scratch_wiping(&mut v, 10, 0);
        assert_eq!((v.len(), v.capacity()), (10, cap));
        scratch_wiping(&mut v, cap + 1, 2 * cap);
        assert_eq!(v.len(), cap + 1);
        assert!(v.capacity() >= 2 * cap);
    }
}
