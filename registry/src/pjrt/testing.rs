//! Test support: the runtimes for tests, skipping loudly when absent, failing when required.
//!
//! A test that needs a runtime starts with
//! `let Some(plugin) = testing::cpu_plugin_for_tests() else { return };`. When the runtime is
//! missing it prints why and how to install it, and the test returns early; when
//! `TPUK_REQUIRE_RUNTIMES=1` (set by `scripts/dev test` and CI) a missing runtime panics instead,
//! so a CI run can never pass by skipping.

use super::client::{Client, ClientOptions};
use super::error::Error;
use super::plugin::Plugin;

/// Whether missing runtimes fail tests (`TPUK_REQUIRE_RUNTIMES=1`).
pub fn runtimes_required() -> bool {
    std::env::var("TPUK_REQUIRE_RUNTIMES").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

fn for_tests(what: &str, loaded: Result<Plugin, Error>) -> Option<Plugin> {
    match loaded {
        Ok(plugin) => Some(plugin),
        Err(e) if runtimes_required() => {
            panic!("TPUK_REQUIRE_RUNTIMES=1 but {what} is unavailable: {e}")
        }
        Err(e) => {
            skip_loudly(&format!(
                "{what} is unavailable: {e}\n*** (set TPUK_REQUIRE_RUNTIMES=1 to make this a failure)"
            ));
            None
        }
    }
}

/// Prints `*** SKIPPED: {why}` straight to the process's stderr, past the test harness's output
/// capture, so a skip is visible even when the test passes.
pub fn skip_loudly(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED: {why}\n");
}

/// The XLA CPU plugin, or `None` after a loud skip message (panics if runtimes are required).
pub fn cpu_plugin_for_tests() -> Option<Plugin> {
    for_tests("the PJRT CPU plugin", Plugin::cpu())
}

/// libtpu, or `None` after a loud skip message (panics if runtimes are required).
pub fn libtpu_for_tests() -> Option<Plugin> {
    for_tests("libtpu", Plugin::libtpu())
}

/// A CPU client with `devices` devices, or `None` after a loud skip message.
pub fn cpu_client_for_tests(devices: i64) -> Option<Client> {
    let plugin = cpu_plugin_for_tests()?;
    match Client::new(&plugin, ClientOptions::new().cpu_device_count(devices)) {
        Ok(client) => Some(client),
        Err(e) => panic!("the PJRT CPU plugin loaded but its client failed: {e}"),
    }
}
