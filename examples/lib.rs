//! Runnable examples live next to this file (`demo.rs`); run them with
//! `cargo run -p tpu-kernels-examples --example demo`.
