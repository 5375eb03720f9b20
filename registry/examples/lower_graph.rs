//! Lowers an ATen graph (the `tpu_kernels_registry::graph` JSON format) to StableHLO text.
//!
//! ```text
//! cargo run -p tpu-kernels-registry --example lower_graph -- [--kernels] [GRAPH.json] > out.mlir
//! ```
//!
//! Reads the graph from the file, or from stdin without one. `--kernels` binds nodes to the
//! registered kernels (as private functions reached by `func.call`); without it every node goes
//! through the default ATen table. `--list-ops` prints the ops the table lowers instead. Errors go
//! to stderr with exit status 1.

use std::io::Read as _;
use std::process::ExitCode;

use tpu_kernels_registry::graph::{self, Graph, KernelResolver, NoKernels, RegisteredKernels};

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let mut kernels = false;
    let mut path = None;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--kernels" => kernels = true,
            "--list-ops" => {
                let mut out = graph::supported_ops().join("\n");
                out.push('\n');
                return Ok(out);
            }
            "-h" | "--help" => {
                return Ok("usage: lower_graph [--kernels] [GRAPH.json] | --list-ops\n".to_owned());
            }
            _ if path.is_none() => path = Some(arg),
            _ => return Err(format!("unexpected argument `{arg}`").into()),
        }
    }
    let text = match &path {
        Some(p) => std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"))?,
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            s
        }
    };
    let graph = Graph::from_json(&text)?;
    let registered;
    let resolver: &dyn KernelResolver = if kernels {
        registered = RegisteredKernels::all();
        &registered
    } else {
        &NoKernels
    };
    Ok(graph::lower(&graph, resolver)?.to_text())
}

fn main() -> ExitCode {
    match run() {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
