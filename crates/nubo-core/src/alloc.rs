//! The global allocator of the `nubo` binary: the system allocator, with every block of 4 KiB
//! up to 1 MiB aligned to a cache line (64 bytes) instead of glibc's 16.
//!
//! Why: an HTTPS pull spends its receiving thread mostly in copies: rustls copies each
//! decrypted 16 KiB TLS record into a new `Vec`, ureq copies again into its caller's buffer.
//! glibc's `memmove` (`rep movsb` on this CPU class) into a block 16 bytes off a cache line ran
//! at a fraction of its speed: profiling a 400 MiB pull put that one `to_vec` at a fifth of all
//! CPU, and aligning these blocks cut the pull's user time from 0.57 s to 0.44 s (the kernel's
//! copies showed the same effect: see `nubo_image::digest::AlignedBuf`). The copies are inside
//! rustls and ureq, so the alignment has to come from the allocator.
//!
//! Small blocks keep glibc's layout (no waste where it would add up); blocks of 1 MiB and more
//! are left alone so `calloc`'s lazily zeroed `mmap` pages stay lazy (an over-aligned
//! `alloc_zeroed` must zero by hand).

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks in `[FROM, TO)` bytes are aligned to [`LINE`].
const FROM: usize = 4 << 10;
const TO: usize = 1 << 20;
/// A cache line.
pub const LINE: usize = 64;

/// The system allocator with cache-line-aligned mid-size blocks. Install with
/// `#[global_allocator] static A: nubo_core::alloc::LineAligned = nubo_core::alloc::LineAligned;`.
pub struct LineAligned;

/// The layout actually asked of the system allocator: a function of the request alone, so
/// `dealloc` always passes the layout the block was allocated with.
fn widen(l: Layout) -> Layout {
    if (FROM..TO).contains(&l.size()) && l.align() < LINE {
        // Cannot fail: LINE is a power of two and the size is below isize::MAX.
        Layout::from_size_align(l.size(), LINE).unwrap_or(l)
    } else {
        l
    }
}

#[allow(unsafe_code)]
// SAFETY: every method forwards to `System` with `widen(layout)`, a layout of the same size and
// an alignment at least the requested one, so each block satisfies the caller's layout; and
// because `widen` depends on the layout alone, `dealloc`/`realloc` hand `System` exactly the
// layout the block was allocated with.
unsafe impl GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: `widen` keeps the size, which the caller guarantees non-zero.
        unsafe { System.alloc(widen(layout)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(widen(layout)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with `layout`, so from `System` with `widen(layout)`.
        unsafe { System.dealloc(ptr, widen(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = widen(layout);
        // The caller guarantees `new_size` with `layout.align()` is a valid layout.
        let Ok(wanted) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        let new = widen(wanted);
        if new.align() == old.align() {
            // SAFETY: `ptr` is `System`'s block of layout `old`; the new layout keeps its
            // alignment, which is what `System.realloc` requires.
            return unsafe { System.realloc(ptr, old, new_size) };
        }
        // The block crosses the aligned range: move it by hand.
        // SAFETY: `new` has a non-zero size (the caller's `new_size`); the copy covers the
        // smaller of the two blocks, both valid for that many bytes and distinct; `ptr` is then
        // freed with the layout it was allocated with.
        unsafe {
            let moved = System.alloc(new);
            if !moved.is_null() {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                System.dealloc(ptr, old);
            }
            moved
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widen_aligns_only_mid_sizes() {
        let l = |size, align| Layout::from_size_align(size, align).unwrap();

        assert_eq!(widen(l(100, 8)).align(), 8);
        assert_eq!(widen(l(FROM - 1, 8)).align(), 8);
        assert_eq!(widen(l(FROM, 1)).align(), LINE);
        assert_eq!(widen(l(16 << 10, 16)).align(), LINE);
        assert_eq!(widen(l(TO - 1, 8)).align(), LINE);
        assert_eq!(widen(l(TO, 8)).align(), 8);
        assert_eq!(widen(l(8192, 4096)).align(), 4096);
        assert_eq!(widen(l(8192, 8)).size(), 8192);
    }

    #[allow(unsafe_code)]
    #[test]
    fn blocks_are_aligned_and_realloc_keeps_contents_across_the_range() {
        let a = LineAligned;
        let l = Layout::from_size_align(100, 8).unwrap();
        // SAFETY: non-zero layouts; each pointer is used within its block's size and freed once
        // with the layout it has at that point.
        unsafe {
            let p = a.alloc(l);
            assert!(!p.is_null());
            for i in 0..100 {
                *p.add(i) = i as u8;
            }
            // 100 B -> 16 KiB (into the range) -> 2 MiB (out of it) -> 8 KiB (back in).
            let p = a.realloc(p, l, 16 << 10);
            assert_eq!(p as usize % LINE, 0);
            let l = Layout::from_size_align(16 << 10, 8).unwrap();
            let p = a.realloc(p, l, 2 << 20);
            let l = Layout::from_size_align(2 << 20, 8).unwrap();
            let p = a.realloc(p, l, 8 << 10);
            assert_eq!(p as usize % LINE, 0);
            for i in 0..100 {
                assert_eq!(*p.add(i), i as u8);
            }
            a.dealloc(p, Layout::from_size_align(8 << 10, 8).unwrap());

            let z = Layout::from_size_align(20 << 10, 1).unwrap();
            let q = a.alloc_zeroed(z);
            assert_eq!(q as usize % LINE, 0);
            assert!(std::slice::from_raw_parts(q, z.size()).iter().all(|b| *b == 0));
            a.dealloc(q, z);
        }
    }
}
