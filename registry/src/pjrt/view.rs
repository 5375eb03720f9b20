//! Execution inputs read where they are: PJRT views of host memory, and a cache of them.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::buffer::VIEW_ALIGNMENT;
use super::{Buffer, Client, ElementType, Error, Result};

/// An execution input made from borrowed host bytes: a view of them (no copy) or a copy. It
/// borrows the bytes, so they outlive it, and it only hands out `&Buffer`, which executions
/// borrow and never donate.
#[derive(Debug)]
pub struct HostInput<'a> {
    buffer: Arc<Buffer>,
    _data: PhantomData<&'a [u8]>,
}

impl std::ops::Deref for HostInput<'_> {
    type Target = Buffer;
    fn deref(&self) -> &Buffer {
        &self.buffer
    }
}

impl Client {
    /// Row-major `data` (`ty`, `dims`) as an execution input: read in place where the client
    /// can alias host memory (the CPU plugin, with data aligned to [`VIEW_ALIGNMENT`] bytes, as
    /// PyTorch's and NumPy's allocations are), else copied.
    pub fn host_input<'a>(
        &self,
        data: &'a [u8],
        ty: ElementType,
        dims: &[i64],
    ) -> Result<HostInput<'a>> {
        // SAFETY: the view lives in a `HostInput<'a>`, so `data` outlives it and stays unwritten
        // meanwhile (`&'a [u8]`); a `HostInput` is never donated.
        let view = unsafe { self.view_of_host_bytes(data, ty, dims) };
        let buffer = match view {
            Ok(Some(b)) => b,
            // A plugin that refuses the view (an alignment rule of its own, say) gets a copy.
            Ok(None) | Err(Error::Pjrt { .. }) => self.buffer_from_bytes(data, ty, dims)?,
            Err(e) => return Err(e),
        };
        Ok(HostInput { buffer: Arc::new(buffer), _data: PhantomData })
    }
}

/// The views of the host memory that recent inputs occupied, by address, length, element type
/// and shape.
///
/// A view only describes memory (address, element type, shape) that the runtime reads when an
/// execution that takes it runs; making one costs about as much as copying a small input. An
/// input at the same address with the same type and shape as a recent one (the same tensor
/// again, or a new one where the allocator reused the memory) takes the same view. A cached view
/// is handed out only inside a [`HostInput`] that borrows exactly the memory it describes, so it
/// is executed only while that memory is valid; in between it is never read, and destroying it
/// does not touch the memory (its on-delete callback does nothing).
#[derive(Debug)]
pub struct ViewCache {
    capacity: usize,
    state: Mutex<Views>,
    misses: AtomicU64,
}

#[derive(Debug, Default)]
struct Views {
    /// By address, length and element type (looked up without allocating); each entry the
    /// shape viewed, the view and the tick of its last use.
    entries: HashMap<(usize, usize, ElementType), Vec<View>>,
    len: usize,
    tick: u64,
}

#[derive(Debug)]
struct View {
    dims: Box<[i64]>,
    buffer: Arc<Buffer>,
    used: u64,
}

/// Views a default [`ViewCache`] keeps: the inputs of a few layers' worth of ops.
pub const VIEW_CACHE_SIZE: usize = 64;

impl Default for ViewCache {
    fn default() -> ViewCache {
        ViewCache::with_capacity(VIEW_CACHE_SIZE)
    }
}

impl ViewCache {
    /// A cache keeping the `capacity` most recently used views (a compiled program's inputs
    /// are a model's parameters and saved activations: hundreds).
    pub fn with_capacity(capacity: usize) -> ViewCache {
        ViewCache {
            capacity: capacity.max(1),
            state: Mutex::new(Views::default()),
            misses: AtomicU64::new(0),
        }
    }

    /// `data` as an execution input (see [`Client::host_input`]), through a cached view when a
    /// recent input occupied the same memory with the same type and shape.
    pub fn input<'a>(
        &self,
        client: &Client,
        data: &'a [u8],
        ty: ElementType,
        dims: &[i64],
    ) -> Result<HostInput<'a>> {
        let address = data.as_ptr() as usize;
        if data.is_empty() {
            return client.host_input(data, ty, dims);
        }
        if !address.is_multiple_of(VIEW_ALIGNMENT) {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return client.host_input(data, ty, dims);
        }
        let key = (address, data.len(), ty);
        if let Ok(mut st) = self.state.lock() {
            st.tick += 1;
            let tick = st.tick;
            if let Some(view) =
                st.entries.get_mut(&key).and_then(|vs| vs.iter_mut().find(|v| *v.dims == *dims))
            {
                view.used = tick;
                return Ok(HostInput { buffer: view.buffer.clone(), _data: PhantomData });
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        // SAFETY: see the type's comment: the view leaves the cache only inside a `HostInput`
        // borrowing exactly these bytes, and is never donated or read otherwise.
        let view = match unsafe { client.view_of_host_bytes(data, ty, dims) } {
            Ok(Some(view)) => Arc::new(view),
            Ok(None) | Err(Error::Pjrt { .. }) => return client.host_input(data, ty, dims),
            Err(e) => return Err(e),
        };
        if let Ok(mut st) = self.state.lock() {
            if st.len >= self.capacity {
                // Evict the least recently used eighth at once, so a full cache scans rarely.
                let mut ticks: Vec<u64> =
                    st.entries.values().flat_map(|vs| vs.iter().map(|v| v.used)).collect();
                ticks.sort_unstable();
                let cut = ticks[(self.capacity / 8).min(ticks.len() - 1)];
                st.entries.retain(|_, vs| {
                    vs.retain(|v| v.used > cut);
                    !vs.is_empty()
                });
                st.len = st.entries.values().map(Vec::len).sum();
            }
            let used = st.tick;
            st.entries.entry(key).or_default().push(View {
                dims: dims.into(),
                buffer: view.clone(),
                used,
            });
            st.len += 1;
        }
        Ok(HostInput { buffer: view, _data: PhantomData })
    }

    /// How many inputs with bytes the cache did not hold: each got a view made for it, or a
    /// copy where its memory could not be viewed (misaligned, or refused by the plugin).
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    /// How many views the cache holds.
    pub fn len(&self) -> usize {
        self.state.lock().map(|st| st.len).unwrap_or(0)
    }

    /// Whether the cache holds no view.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
