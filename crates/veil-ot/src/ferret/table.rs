//! [`HugeTable`]: the reserve of COT blocks, backed by 2 MiB pages where the OS allows.
//!
//! The LPN step reads k blocks of the reserve at random (9.4 MB for the main set). With 4 KiB
//! pages almost every read also misses the TLB, so the table asks Linux for transparent huge
//! pages (`madvise(MADV_HUGEPAGE)`, before the first touch). It is only a hint: elsewhere, or if
//! the kernel declines, the table behaves as a plain buffer. Contents are zeroized on drop.

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
        // Over-allocate by one huge page so a 2 MiB-aligned window of `len` blocks exists.
        let buf = vec![0u128; len + BLOCKS_PER_HUGE];
        let addr = buf.as_ptr() as usize;
        let start = (addr.next_multiple_of(HUGE) - addr) / 16;
        let mut table = HugeTable { buf, start, len };
        table.advise();
        table
    }

    #[cfg(target_os = "linux")]
    fn advise(&mut self) {
        let bytes = (self.len * 16).next_multiple_of(HUGE);
        if bytes > (self.buf.len() - self.start) * 16 {
            return;
        }
        // SAFETY: the range lies inside `buf`'s allocation and starts 2 MiB-aligned; MADV_HUGEPAGE
        // changes only how the kernel backs the pages, never their contents.
        unsafe {
            libc::madvise(
                self.buf.as_mut_ptr().add(self.start) as *mut libc::c_void,
                bytes,
                libc::MADV_HUGEPAGE,
            );
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn advise(&mut self) {}

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
    }
}
