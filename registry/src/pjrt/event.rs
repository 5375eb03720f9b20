//! PJRT events: completion of asynchronous work.

use std::fmt;
use std::sync::Arc;

use super::error::Result;
use super::plugin::{PluginInner, pjrt_call};
use super::sys;

/// An owned `PJRT_Event`, destroyed on drop.
pub(crate) struct Event {
    plugin: Arc<PluginInner>,
    raw: *mut sys::PJRT_Event,
}

// SAFETY: PJRT events may be awaited, queried and destroyed from any thread.
unsafe impl Send for Event {}
// SAFETY: `is_ready` and `wait` only read the event; PJRT events are thread-safe.
unsafe impl Sync for Event {}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event").finish_non_exhaustive()
    }
}

impl Event {
    /// Takes ownership of `raw` (which may be null: then the event counts as done).
    pub(crate) fn from_raw(plugin: Arc<PluginInner>, raw: *mut sys::PJRT_Event) -> Self {
        Self { plugin, raw }
    }

    /// Blocks until the event is ready and returns its status.
    pub(crate) fn wait(&self, call: &'static str) -> Result<()> {
        if self.raw.is_null() {
            return Ok(());
        }
        let mut args = sys::PJRT_Event_Await_Args::new();
        args.event = self.raw;
        // SAFETY: `self.raw` is a live event owned by `self`.
        unsafe { pjrt_call!(self.plugin, PJRT_Event_Await, &mut args) }.map_err(|e| match e {
            super::Error::Pjrt { code, message, .. } => super::Error::Pjrt { call, code, message },
            other => other,
        })
    }

    /// Whether the event is ready (completed or failed).
    pub(crate) fn is_ready(&self) -> Result<bool> {
        if self.raw.is_null() {
            return Ok(true);
        }
        let mut args = sys::PJRT_Event_IsReady_Args::new();
        args.event = self.raw;
        // SAFETY: `self.raw` is a live event owned by `self`.
        unsafe { pjrt_call!(self.plugin, PJRT_Event_IsReady, &mut args) }?;
        Ok(args.is_ready)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let mut args = sys::PJRT_Event_Destroy_Args::new();
        args.event = self.raw;
        // SAFETY: `self.raw` is a live event owned by `self`, destroyed exactly once.
        let result = unsafe { pjrt_call!(self.plugin, PJRT_Event_Destroy, &mut args) };
        self.plugin.log_drop_error(result);
    }
}
