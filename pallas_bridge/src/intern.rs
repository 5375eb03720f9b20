//! Interning for the `&'static` fields of [`tpu_kernels::KernelRegistration`].
//!
//! A registration record is const data with `&'static` names and slices. Kernels registered at
//! runtime from Python get theirs here: each distinct value is leaked once and reused, so
//! registering, removing and registering again the same kernel does not leak more.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use tpu_kernels::DType;
use tpu_kernels::registration::{Guard, Platform, StaticParam};

/// A string with `'static` lifetime, leaked at most once per distinct value.
pub fn intern(s: &str) -> &'static str {
    static STRINGS: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut set = STRINGS.lock().unwrap_or_else(PoisonError::into_inner);
    let set = set.get_or_insert_with(HashSet::new);
    if let Some(found) = set.get(s) {
        return found;
    }
    let leaked: &'static str = Box::leak(s.to_owned().into_boxed_str());
    set.insert(leaked);
    leaked
}

/// Leaked slices of one element type, found again by value.
struct SliceInterner<T: 'static> {
    slices: Mutex<Vec<&'static [T]>>,
}

impl<T: PartialEq + Clone + 'static> SliceInterner<T> {
    const fn new() -> Self {
        SliceInterner { slices: Mutex::new(Vec::new()) }
    }

    fn intern(&self, items: &[T]) -> &'static [T] {
        let mut slices = self.slices.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = slices.iter().find(|s| **s == items) {
            return found;
        }
        let leaked: &'static [T] = Box::leak(items.to_vec().into_boxed_slice());
        slices.push(leaked);
        leaked
    }
}

static STRS: SliceInterner<&'static str> = SliceInterner::new();
static GUARDS: SliceInterner<Guard> = SliceInterner::new();
static DTYPES: SliceInterner<DType> = SliceInterner::new();
static PLATFORMS: SliceInterner<Platform> = SliceInterner::new();
static STATICS: SliceInterner<StaticParam> = SliceInterner::new();

pub fn strs(items: &[&str]) -> &'static [&'static str] {
    let interned: Vec<&'static str> = items.iter().map(|s| intern(s)).collect();
    STRS.intern(&interned)
}

pub fn guards(items: &[Guard]) -> &'static [Guard] {
    GUARDS.intern(items)
}

pub fn dtypes(items: &[DType]) -> &'static [DType] {
    DTYPES.intern(items)
}

pub fn platforms(items: &[Platform]) -> &'static [Platform] {
    PLATFORMS.intern(items)
}

pub fn statics(items: &[StaticParam]) -> &'static [StaticParam] {
    STATICS.intern(items)
}
