//! The `tpuk` command line, run as a process: every subcommand, `--json`, and bad input.

use std::process::{Command, Output};

use tpu_kernels_registry::pjrt::testing::{cpu_plugin_for_tests, libtpu_for_tests};

fn tpuk(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tpuk"))
        .args(args)
        .env("TPU_SKIP_MDS_QUERY", "1")
        .env("TPUK_COMPILE_CACHE", "off")
        .output()
        .expect("tpuk runs")
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn list_shows_every_standard_kernel() {
    let out = tpuk(&["list", "--json"]);
    assert!(out.status.success());
    let rows = json(&out);
    let names: Vec<&str> =
        rows.as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    for k in [
        "gelu",
        "gelu_tanh",
        "layer_norm",
        "log_softmax",
        "matmul_bias_act",
        "rms_norm",
        "silu",
        "softmax",
    ] {
        assert!(names.contains(&k), "{k} missing from {names:?}");
    }
    let rms = rows.as_array().unwrap().iter().find(|r| r["name"] == "rms_norm").unwrap();
    assert_eq!(rms["ops"][0], "tpuk::rms_norm.default");
    assert_eq!(rms["statics"][0]["name"], "eps");
    let text = tpuk(&["list"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("ops:       aten::gelu.default"));
}

#[test]
fn emit_prints_the_module() {
    let out = tpuk(&["emit", "rms_norm", "--sig", "f32[8,128], f32[128]; eps=1e-5"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("module @rms_norm"));
    assert!(text.contains("dense<9.999999e-06>") || text.contains("dense<1.000000e-05>"), "{text}");
    let j = json(&tpuk(&["emit", "silu", "--sig", "bf16[3,5]", "--json"]));
    assert_eq!(j["kernel"], "silu");
    assert_eq!(j["fingerprint"].as_str().unwrap().len(), 32);
    assert!(j["module"].as_str().unwrap().contains("tensor<3x5xbf16>"));
}

#[test]
fn bad_input_is_a_clear_error_with_exit_code_2() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["emit", "nope", "--sig", "f32[2]"],
            "no kernel named `nope` (registered: adamw_step, attention, attention_backward, cross_entropy, cross_entropy_backward, dropout,",
        ),
        (&["emit", "silu", "--sig", "f33[2]"], "unknown dtype `f33`"),
        (
            &["emit", "silu", "--sig", "i32[2]"],
            "does not accept `i32[2]`: dtype i32 not in [f32, bf16, f16]",
        ),
        (
            &["emit", "rms_norm", "--sig", "f32[4,8], f32[9]"],
            "input 0 dim -1 (8) != input 1 dim 0 (9)",
        ),
        (&["emit", "rms_norm", "--sig", "f32[4,8], f32[8]; eps=big"], "`big` is not a number"),
        (&["emit", "silu", "--sig", "f32[2]; alpha=1"], "has no static parameter `alpha`"),
    ];
    for (args, message) in cases {
        let out = tpuk(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{args:?}: `{message}` not in {stderr}");
        let mut with_json = args.to_vec();
        with_json.push("--json");
        let j = json(&tpuk(&with_json));
        assert!(j["error"].as_str().unwrap().contains(message));
    }
}

#[test]
fn run_times_a_kernel_on_the_cpu_plugin() {
    if cpu_plugin_for_tests().is_none() {
        return;
    }
    let j =
        json(&tpuk(&["run", "softmax", "--sig", "f32[8,128]; dim=-1", "--iters", "5", "--json"]));
    let run = &j["run"];
    assert_eq!(run["iterations"], 5);
    assert_eq!(run["non_finite"], 0);
    assert_eq!(run["outputs"][0], "f32[8,128]");
    assert!(run["median_us"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_signature_too_large_for_memory_is_an_error_not_an_abort() {
    if cpu_plugin_for_tests().is_none() {
        return;
    }
    // About 40 PB of input: no allocation can hold it.
    let out = tpuk(&["run", "rms_norm", "--sig", "f32[99999999,99999999], f32[99999999]"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "input tensor<99999999x99999999xf32>: out of memory allocating 39999999200000004 bytes"
        ),
        "{stderr}"
    );
}

#[test]
fn tpu_compile_and_check_cover_every_kernel() {
    if cpu_plugin_for_tests().is_none() || libtpu_for_tests().is_none() {
        return;
    }
    let j = json(&tpuk(&[
        "tpu-compile",
        "gelu",
        "--sig",
        "bf16[8,128]",
        "--topology",
        "v6e:1x1",
        "--json",
    ]));
    assert_eq!(j["tpu"]["topology"], "v6e:1x1", "{j}");
    assert!(j["tpu"]["executable_bytes"].as_u64().unwrap() > 1000);

    let out = tpuk(&["check", "--json"]);
    let j = json(&out);
    assert!(out.status.success(), "{j}");
    assert_eq!(j["ok"], true);
    let rows = j["rows"].as_array().unwrap();
    let expected: usize = tpu_kernels::registered().iter().map(|k| k.canonical.len()).sum();
    assert_eq!(rows.len(), expected);
    for r in rows {
        assert!(r["tpu"]["Ok"]["executable_bytes"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["cpu"]["Ok"]["non_finite"], 0, "{r}");
    }
    let text = String::from_utf8(tpuk(&["check", "--no-tpu"]).stdout).unwrap();
    assert!(text.contains(&format!("{expected} passed, 0 failed")), "{text}");
}
