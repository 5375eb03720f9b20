//! `tpuk`: list, emit, run, compile for TPU and check the registered kernels.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand};
use serde::Serialize;
use serde_json::json;
use tpu_kernels::registration::{CacheKey, KernelSignature, Platform};
use tpu_kernels_registry::cache::{CacheConfig, CompileCache};
use tpu_kernels_registry::check::{self, RunReport, TpuCompileReport};
use tpu_kernels_registry::pjrt::{
    Client, ClientOptions, Plugin, Topology, interleave_vector_loops,
};
use tpu_kernels_registry::{Index, Kernel, KernelSource};

#[derive(Parser)]
#[command(name = "tpuk", about = "Inspect, emit, run and check tpu-kernels kernels", version)]
struct Cli {
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every registered kernel: bindings, guards, statics, variants.
    List,
    /// Print a kernel's StableHLO for one signature.
    Emit {
        kernel: String,
        /// Input types then statics: 'f32[8,128], f32[128]; eps=1e-6'.
        #[arg(long)]
        sig: String,
    },
    /// Run a kernel on the CPU plugin with random inputs and time it.
    Run {
        kernel: String,
        #[arg(long)]
        sig: String,
        #[arg(long, default_value_t = 100)]
        iters: usize,
    },
    /// Compile a kernel for a TPU topology with libtpu (no TPU needed).
    TpuCompile {
        kernel: String,
        #[arg(long)]
        sig: String,
        #[arg(long, default_value = "v5e:1x1")]
        topology: String,
    },
    /// Every kernel at every canonical signature: emit, parse, run on CPU, compile for TPU.
    Check {
        #[arg(long, default_value = "v5e:1x1")]
        topology: String,
        /// Skip the TPU compile (when libtpu is not installed).
        #[arg(long)]
        no_tpu: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            if cli.json {
                println!("{}", json!({ "error": format!("{e:#}") }));
            } else {
                eprintln!("tpuk: error: {e:#}");
            }
            ExitCode::from(2)
        }
    }
}

fn index() -> Result<Index> {
    Index::from_inventory().context("building the kernel index")
}

fn kernel<'i>(index: &'i Index, name: &str) -> Result<&'i Arc<Kernel>> {
    index.kernel(name).ok_or_else(|| {
        let names: Vec<&str> = index.kernels().map(|k| k.name()).collect();
        anyhow!("no kernel named `{name}` (registered: {})", names.join(", "))
    })
}

fn signature(k: &Kernel, text: &str) -> Result<KernelSignature> {
    let sig = k.record.parse_signature(text).map_err(|e| anyhow!("--sig: {e}"))?;
    k.record
        .accepts(&sig)
        .map_err(|e| anyhow!("kernel `{}` does not accept `{text}`: {e}", k.name()))?;
    Ok(sig)
}

fn cpu_client() -> Result<(Client, CompileCache)> {
    interleave_vector_loops().map_err(|e| anyhow!(e))?;
    let plugin = Plugin::cpu().context("loading the PJRT CPU plugin")?;
    let client = Client::new(&plugin, ClientOptions::new()).context("creating a CPU client")?;
    Ok((client, CompileCache::new(CacheConfig::from_env())))
}

fn topology(name: &str) -> Result<Topology> {
    let libtpu = Plugin::libtpu().context("loading libtpu")?;
    Topology::new(&libtpu, name).with_context(|| format!("creating topology {name}"))
}

fn run(cli: &Cli) -> Result<bool> {
    match &cli.command {
        Command::List => list(cli.json),
        Command::Emit { kernel: name, sig } => {
            let index = index()?;
            let k = kernel(&index, name)?;
            let sig = signature(k, sig)?;
            let text = k.module_text(&sig, Platform::Cpu)?.text;
            if cli.json {
                let fingerprint = tpu_kernels::reader::content_fingerprint(&text)?;
                println!(
                    "{}",
                    json!({ "kernel": k.name(), "signature": sig.label(), "fingerprint": fingerprint, "module": &*text })
                );
            } else {
                print!("{text}");
            }
            Ok(true)
        }
        Command::Run { kernel: name, sig, iters } => {
            let index = index()?;
            let k = kernel(&index, name)?;
            let sig = signature(k, sig)?;
            let (client, cache) = cpu_client()?;
            let report = check::run_kernel(&client, &cache, k, &sig, Platform::Cpu, *iters)
                .map_err(|e| anyhow!("kernel `{}`: {e}", k.name()))?;
            if cli.json {
                println!(
                    "{}",
                    json!({ "kernel": k.name(), "signature": sig.label(), "run": report, "reference": null })
                );
            } else {
                println!(
                    "{} @ {}: median {:.1} us (min {:.1}, max {:.1}) over {} runs; {} in {:.1} ms; outputs {}; non-finite {}; no reference registered",
                    k.name(),
                    sig.label(),
                    report.median_us,
                    report.min_us,
                    report.max_us,
                    report.iterations,
                    report.executable,
                    report.compile_ms,
                    report.outputs.join(", "),
                    report.non_finite
                );
            }
            Ok(report.non_finite == 0)
        }
        Command::TpuCompile { kernel: name, sig, topology: topo } => {
            let index = index()?;
            let k = kernel(&index, name)?;
            let sig = signature(k, sig)?;
            let topology = topology(topo)?;
            let report = check::tpu_compile(&topology, k, &sig)
                .map_err(|e| anyhow!("kernel `{}` for {topo}: {e}", k.name()))?;
            if cli.json {
                println!(
                    "{}",
                    json!({ "kernel": k.name(), "signature": sig.label(), "tpu": report })
                );
            } else {
                println!(
                    "{} @ {}: compiled for {} in {:.1} ms, executable {} bytes",
                    k.name(),
                    sig.label(),
                    report.topology,
                    report.compile_ms,
                    report.executable_bytes
                );
            }
            Ok(true)
        }
        Command::Check { topology: topo, no_tpu } => check_all(cli.json, topo, *no_tpu),
    }
}

fn list(as_json: bool) -> Result<bool> {
    let index = index()?;
    let mut rows = Vec::new();
    for k in index.kernels() {
        let r = &k.record;
        let statics: Vec<serde_json::Value> = r
            .statics
            .iter()
            .map(|p| {
                json!({
                    "name": p.name,
                    "kind": format!("{:?}", p.kind).to_lowercase(),
                    "default": p.default,
                    "cache_key": match p.cache_key {
                        CacheKey::Include => "include".to_owned(),
                        CacheKey::Ignore { reason } => format!("ignored: {reason}"),
                    },
                })
            })
            .collect();
        let variants: Vec<&str> = match &k.source {
            KernelSource::Built => vec!["built"],
            KernelSource::Library(_) => r.platforms.iter().map(|p| p.name()).collect(),
            KernelSource::Imported { variants, .. } => {
                variants.iter().map(|(p, _)| p.name()).collect()
            }
        };
        rows.push(json!({
            "name": k.name(),
            "ops": k.ops,
            "inputs": r.inputs,
            "statics": statics,
            "guards": r.guards.iter().map(|g| format!("{g:?}")).collect::<Vec<_>>(),
            "dtypes": r.dtypes.iter().map(|d| d.short_name()).collect::<Vec<_>>(),
            "platforms": r.platforms.iter().map(|p| p.name()).collect::<Vec<_>>(),
            "priority": r.priority,
            "variants": variants,
            "canonical": r.canonical,
            "doc": r.doc,
        }));
    }
    if as_json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(true);
    }
    for (k, row) in index.kernels().zip(&rows) {
        let r = &k.record;
        println!("{}  (priority {})  {}", k.name(), r.priority, r.doc);
        println!("  ops:       {}", k.ops.join(", "));
        println!("  inputs:    {}", r.inputs.join(", "));
        let statics: Vec<String> = r
            .statics
            .iter()
            .map(|p| format!("{}={}", p.name, p.default.unwrap_or("<required>")))
            .collect();
        if !statics.is_empty() {
            println!("  statics:   {}", statics.join(", "));
        }
        let dtypes: Vec<&str> = r.dtypes.iter().map(|d| d.short_name()).collect();
        println!("  dtypes:    {}", dtypes.join(", "));
        for g in r.guards {
            println!("  guard:     {g:?}");
        }
        println!("  variants:  {}", row["variants"]);
    }
    Ok(true)
}

#[derive(Serialize)]
struct CheckRow {
    kernel: String,
    signature: String,
    emit: Result<usize, String>,
    parse: Result<usize, String>,
    cpu: Result<RunReport, String>,
    tpu: Option<Result<TpuCompileReport, String>>,
    /// A tiled kernel's interpreter (of its shipped Mosaic text) against its CPU twin: the
    /// largest difference. `None` for other kernels.
    interp: Option<Result<f64, String>>,
}

impl CheckRow {
    fn ok(&self) -> bool {
        self.emit.is_ok()
            && self.parse.is_ok()
            && self.cpu.as_ref().is_ok_and(|r| r.non_finite == 0)
            && self.tpu.as_ref().is_none_or(Result::is_ok)
            && self.interp.as_ref().is_none_or(Result::is_ok)
    }
}

fn check_all(as_json: bool, topo: &str, no_tpu: bool) -> Result<bool> {
    let index = index()?;
    let (client, cache) = cpu_client()?;
    let topology = if no_tpu { None } else { Some(topology(topo)?) };
    let mut cases = Vec::new();
    for k in index.kernels() {
        let sigs =
            k.record.canonical_signatures().map_err(|e| anyhow!("kernel `{}`: {e}", k.name()))?;
        cases.extend(sigs.into_iter().map(|s| (k.clone(), s)));
    }
    if cases.is_empty() {
        bail!("no kernels registered");
    }
    let bar = if std::io::stderr().is_terminal() && !as_json {
        let bar = indicatif::ProgressBar::new(cases.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(bar)
    } else {
        None
    };
    let mut rows = Vec::with_capacity(cases.len());
    for (k, sig) in cases {
        if let Some(bar) = &bar {
            bar.set_message(format!("{}@{}", k.name(), sig.label()));
        }
        let text = k.module_text(&sig, Platform::Cpu).map(|m| m.text).map_err(|e| e.to_string());
        let emit = text.as_ref().map(|t| t.len()).map_err(Clone::clone);
        let parse = match &text {
            Ok(t) => check::parse_back(t, &sig),
            Err(_) => Err("not emitted".to_owned()),
        };
        let cpu = check::run_kernel(&client, &cache, &k, &sig, Platform::Cpu, 10);
        let tpu = topology.as_ref().map(|t| check::tpu_compile(t, &k, &sig));
        let interp = k.is_tiled().then(|| check::interpreter_agreement(&client, &k, &sig));
        rows.push(CheckRow {
            kernel: k.name().to_owned(),
            signature: sig.label(),
            emit,
            parse,
            cpu,
            tpu,
            interp,
        });
        if let Some(bar) = &bar {
            bar.inc(1);
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let all_ok = rows.iter().all(CheckRow::ok);
    if as_json {
        println!("{}", serde_json::to_string_pretty(&json!({ "ok": all_ok, "rows": rows }))?);
        return Ok(all_ok);
    }
    println!(
        "{:<18} {:<46} {:>7} {:>6} {:>12} {:>14} {:>8}",
        "kernel",
        "signature",
        "emit",
        "parse",
        "cpu (us)",
        format!("tpu {topo}"),
        "interp"
    );
    let mark = |ok: bool| if ok { "ok" } else { "FAIL" };
    for r in &rows {
        let cpu = match &r.cpu {
            Ok(rep) if rep.non_finite == 0 => format!("{:.1}", rep.median_us),
            Ok(rep) => format!("{} NaN/Inf", rep.non_finite),
            Err(_) => "FAIL".to_owned(),
        };
        let tpu = match &r.tpu {
            None => "skipped".to_owned(),
            Some(Ok(rep)) => format!("{} KiB", rep.executable_bytes / 1024),
            Some(Err(_)) => "FAIL".to_owned(),
        };
        let interp = match &r.interp {
            None => "-",
            Some(Ok(_)) => "ok",
            Some(Err(_)) => "FAIL",
        };
        println!(
            "{:<18} {:<46} {:>7} {:>6} {:>12} {:>14} {:>8}",
            r.kernel,
            r.signature,
            mark(r.emit.is_ok()),
            mark(r.parse.is_ok()),
            cpu,
            tpu,
            interp
        );
    }
    for r in rows.iter().filter(|r| !r.ok()) {
        let errors = [
            r.emit.as_ref().err(),
            r.parse.as_ref().err(),
            r.cpu.as_ref().err(),
            r.tpu.as_ref().and_then(|t| t.as_ref().err()),
            r.interp.as_ref().and_then(|t| t.as_ref().err()),
        ];
        for e in errors.into_iter().flatten() {
            println!("{}@{}: {e}", r.kernel, r.signature);
        }
    }
    let failed = rows.iter().filter(|r| !r.ok()).count();
    println!("{} passed, {} failed", rows.len() - failed, failed);
    Ok(all_ok)
}
