//! A caching allocator of 64-byte aligned host memory: the "tpu" device's memory on the
//! embedded default (the PJRT CPU client reads such blocks in place).
//!
//! As PyTorch's device allocators do, a freed block is kept for reuse by requests of its size
//! class instead of going back to the system: a training step allocates the same sizes every
//! step, so after the first one nearly every allocation is a cache hit. Size classes are
//! multiples of 64 bytes up to 512, then four classes per power of two, so a block is at most
//! 25% larger than the request. The cache holds at most [`HostPool::limit`] bytes
//! (`TPUK_DEVICE_CACHE_BYTES`, default 1 GiB); a free beyond it goes back to the system, and a
//! failed system allocation first empties the cache and tries again.
//!
//! Every allocation is fallible: a request the system cannot satisfy (or no layout can
//! describe) is an [`OutOfMemory`] naming the request, never an abort.

use rustc_hash::FxHashMap;
use std::alloc::Layout;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// The alignment of every block.
pub const ALIGN: usize = 64;

/// The cache limit when `TPUK_DEVICE_CACHE_BYTES` is not set.
pub const DEFAULT_CACHE_LIMIT: usize = 1 << 30;

/// The size class of a request of `n` bytes (`None`: no block can be that large).
pub fn size_class(n: usize) -> Option<usize> {
    if n <= 512 {
        return Some(n.div_ceil(ALIGN).max(1) * ALIGN);
    }
    let step = n.checked_next_power_of_two()? / 8;
    n.div_ceil(step).checked_mul(step)
}

/// A block of host memory from a [`HostPool`]; give it back with [`HostPool::free`] (a
/// dropped block is leaked, never freed twice).
#[derive(Debug)]
pub struct HostBlock {
    ptr: NonNull<u8>,
    size: usize,
}

// SAFETY: a block is plain memory owned by whoever holds the `HostBlock`.
unsafe impl Send for HostBlock {}

impl HostBlock {
    /// The block's address (64-byte aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The block's size: the request's size class.
    pub fn size(&self) -> usize {
        self.size
    }
}

/// A request the system could not satisfy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    /// The bytes asked for.
    pub requested: usize,
    /// Bytes held by live blocks when it failed.
    pub allocated: usize,
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tpu: out of memory: allocating {} bytes failed ({} bytes held by tensors on the device)",
            self.requested, self.allocated
        )
    }
}

impl std::error::Error for OutOfMemory {}

/// What a pool has done, in bytes and calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes in blocks held by their users (size-class bytes).
    pub allocated: usize,
    pub peak_allocated: usize,
    /// Bytes taken from the system: held blocks and cached ones.
    pub reserved: usize,
    pub peak_reserved: usize,
    /// Bytes in cached blocks.
    pub cached: usize,
    /// The cache's limit.
    pub limit: usize,
    pub allocs: u64,
    pub frees: u64,
    /// Allocations served from the cache, and from the system.
    pub cache_hits: u64,
    pub system_allocs: u64,
    /// Blocks returned to the system (cache full, `empty_cache`, or before a retry).
    pub system_frees: u64,
    /// Requests that failed.
    pub ooms: u64,
}

#[derive(Debug, Default)]
struct Inner {
    free: FxHashMap<usize, Vec<HostBlock>>,
    stats: PoolStats,
}

/// A caching allocator of host blocks (see the module documentation).
#[derive(Debug)]
pub struct HostPool {
    inner: Mutex<Inner>,
    /// `stats.reserved` as of the last change, read without the lock.
    reserved: AtomicUsize,
}

/// The pool's state, locked; publishes the reserved bytes when unlocked.
struct Locked<'a> {
    guard: MutexGuard<'a, Inner>,
    reserved: &'a AtomicUsize,
}

impl Deref for Locked<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.guard
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.guard
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.reserved.store(self.guard.stats.reserved, Ordering::Relaxed);
    }
}

impl HostPool {
    /// A pool whose cache holds at most `limit` bytes.
    pub fn with_limit(limit: usize) -> HostPool {
        let stats = PoolStats { limit, ..PoolStats::default() };
        HostPool {
            inner: Mutex::new(Inner { free: FxHashMap::default(), stats }),
            reserved: AtomicUsize::new(0),
        }
    }

    /// The process's pool (the device's memory), its limit from `TPUK_DEVICE_CACHE_BYTES`.
    pub fn global() -> &'static HostPool {
        static POOL: OnceLock<HostPool> = OnceLock::new();
        POOL.get_or_init(|| {
            let limit = std::env::var("TPUK_DEVICE_CACHE_BYTES")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(DEFAULT_CACHE_LIMIT);
            HostPool::with_limit(limit)
        })
    }

    fn lock(&self) -> Locked<'_> {
        Locked {
            guard: self.inner.lock().unwrap_or_else(PoisonError::into_inner),
            reserved: &self.reserved,
        }
    }

    /// The bytes taken from the system (`stats().reserved`), without taking the pool's lock: a
    /// figure for accounting, as of the last allocation or free.
    pub fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    /// A block of at least `n` bytes (`n == 0` gets the smallest class).
    pub fn allocate(&self, n: usize) -> Result<HostBlock, OutOfMemory> {
        let mut inner = self.lock();
        let oom = |inner: &mut Inner| {
            inner.stats.ooms += 1;
            OutOfMemory { requested: n, allocated: inner.stats.allocated }
        };
        let Some(size) = size_class(n) else { return Err(oom(&mut inner)) };
        let cached = inner.free.get_mut(&size).and_then(Vec::pop);
        let block = match cached {
            Some(b) => {
                inner.stats.cached -= size;
                inner.stats.cache_hits += 1;
                b
            }
            None => {
                let Ok(layout) = Layout::from_size_align(size, ALIGN) else {
                    return Err(oom(&mut inner));
                };
                // SAFETY: `layout` has a non-zero size (a size class is at least 64 bytes).
                let mut ptr = NonNull::new(unsafe { std::alloc::alloc(layout) });
                if ptr.is_none() && inner.stats.cached > 0 {
                    release_cached(&mut inner);
                    // SAFETY: as above.
                    ptr = NonNull::new(unsafe { std::alloc::alloc(layout) });
                }
                let Some(ptr) = ptr else { return Err(oom(&mut inner)) };
                let s = &mut inner.stats;
                s.system_allocs += 1;
                s.reserved += size;
                s.peak_reserved = s.peak_reserved.max(s.reserved);
                HostBlock { ptr, size }
            }
        };
        let s = &mut inner.stats;
        s.allocs += 1;
        s.allocated += size;
        s.peak_allocated = s.peak_allocated.max(s.allocated);
        Ok(block)
    }

    /// Gives `block` back: cached for reuse while the cache has room, else freed.
    ///
    /// The block must come from this pool; nothing may use its memory afterwards.
    pub fn free(&self, block: HostBlock) {
        let mut inner = self.lock();
        inner.stats.frees += 1;
        inner.stats.allocated -= block.size;
        if inner.stats.cached + block.size <= inner.stats.limit {
            inner.stats.cached += block.size;
            inner.free.entry(block.size).or_default().push(block);
        } else {
            system_free(&mut inner, block);
        }
    }

    /// Returns every cached block to the system.
    pub fn empty_cache(&self) {
        release_cached(&mut self.lock());
    }

    /// Sets the peaks to the current figures.
    pub fn reset_peaks(&self) {
        let mut inner = self.lock();
        inner.stats.peak_allocated = inner.stats.allocated;
        inner.stats.peak_reserved = inner.stats.reserved;
    }

    pub fn stats(&self) -> PoolStats {
        self.lock().stats
    }
}

/// A block of the [global](HostPool::global) pool that goes back to it when dropped: an owner
/// to hand to what outlives the call that allocated it (a kernel output written into the
/// block, read by a tensor until the tensor dies).
#[derive(Debug)]
pub struct PooledBlock(Option<HostBlock>);

// SAFETY: a `&PooledBlock` gives out only the block's address; the memory is reached through
// whoever the owner lends it to, never through the shared reference.
unsafe impl Sync for PooledBlock {}

impl PooledBlock {
    /// A block of at least `n` bytes from the global pool.
    pub fn allocate(n: usize) -> Result<PooledBlock, OutOfMemory> {
        HostPool::global().allocate(n).map(|b| PooledBlock(Some(b)))
    }

    /// The block's address (64-byte aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.0.as_ref().map_or(std::ptr::null_mut(), HostBlock::as_ptr)
    }
}

impl Drop for PooledBlock {
    fn drop(&mut self) {
        if let Some(block) = self.0.take() {
            HostPool::global().free(block);
        }
    }
}

fn system_free(inner: &mut Inner, block: HostBlock) {
    inner.stats.system_frees += 1;
    inner.stats.reserved -= block.size;
    // SAFETY: the block was allocated by `HostPool::allocate` with this size and alignment
    // (its size is a valid layout's), and nothing references it any more (its user gave it
    // back, or it sat in the cache).
    unsafe {
        std::alloc::dealloc(
            block.ptr.as_ptr(),
            Layout::from_size_align_unchecked(block.size, ALIGN),
        )
    };
}

fn release_cached(inner: &mut Inner) {
    let bins = std::mem::take(&mut inner.free);
    for block in bins.into_values().flatten() {
        system_free(inner, block);
    }
    inner.stats.cached = 0;
}

impl Drop for HostPool {
    fn drop(&mut self) {
        release_cached(&mut self.lock());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_up_by_at_most_a_quarter() {
        assert_eq!(size_class(0), Some(64));
        assert_eq!(size_class(1), Some(64));
        assert_eq!(size_class(65), Some(128));
        assert_eq!(size_class(512), Some(512));
        assert_eq!(size_class(513), Some(640));
        assert_eq!(size_class(4096), Some(4096));
        assert_eq!(size_class(4097), Some(5120));
        for n in [513usize, 1000, 4097, 1 << 20, (1 << 20) + 1, 123_456_789] {
            let c = size_class(n).unwrap_or(0);
            assert!(c >= n && c - n <= n / 4, "{n} -> {c}");
            assert_eq!(c % ALIGN, 0);
        }
        assert_eq!(size_class(usize::MAX), None);
    }

    #[test]
    fn a_freed_block_is_reused_by_its_size_class() -> Result<(), OutOfMemory> {
        let pool = HostPool::with_limit(1 << 20);
        let a = pool.allocate(1000)?;
        assert_eq!(a.as_ptr() as usize % ALIGN, 0);
        assert_eq!(a.size(), 1024);
        let addr = a.as_ptr();
        pool.free(a);
        // 900 bytes is the same class (1024): the cached block comes back.
        let b = pool.allocate(900)?;
        assert_eq!(b.as_ptr(), addr);
        let s = pool.stats();
        assert_eq!((s.allocs, s.cache_hits, s.system_allocs), (2, 1, 1));
        assert_eq!((s.allocated, s.reserved, s.cached), (1024, 1024, 0));
        // Another class does not take it.
        let c = pool.allocate(3000)?;
        assert_ne!(c.as_ptr(), addr);
        pool.free(b);
        pool.free(c);
        let s = pool.stats();
        assert_eq!((s.allocated, s.cached, s.peak_allocated), (0, 1024 + 3072, 1024 + 3072));
        pool.empty_cache();
        let s = pool.stats();
        assert_eq!((s.reserved, s.cached, s.system_frees), (0, 0, 2));
        Ok(())
    }

    #[test]
    fn frees_beyond_the_limit_go_back_to_the_system() -> Result<(), OutOfMemory> {
        let pool = HostPool::with_limit(4096);
        let a = pool.allocate(4096)?;
        let b = pool.allocate(4096)?;
        pool.free(a);
        pool.free(b);
        let s = pool.stats();
        assert_eq!((s.cached, s.reserved, s.system_frees), (4096, 4096, 1));
        Ok(())
    }

    #[test]
    fn an_impossible_request_is_an_error_not_an_abort() {
        let pool = HostPool::with_limit(0);
        let e = pool.allocate(usize::MAX / 2).err();
        assert_eq!(e, Some(OutOfMemory { requested: usize::MAX / 2, allocated: 0 }));
        // About 1 PB: more than the address space any machine backs.
        let e = pool.allocate(1 << 50).err();
        assert!(e.is_some_and(|e| e.to_string().contains("1125899906842624 bytes")));
        assert_eq!(pool.stats().ooms, 2);
    }
}
