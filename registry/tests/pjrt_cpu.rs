//! The PJRT layer on the real XLA CPU plugin.
#![allow(clippy::unwrap_used, reason = "helpers of tests: a failed unwrap is a failed test")]

mod common;

use common::{ADD_F32X4, compile, export_kernel, python_for_tests};
use half::{bf16, f16};
use tpu_kernels_registry::numerics::{Tolerance, assert_close};
use tpu_kernels_registry::pjrt::testing::{cpu_client_for_tests, cpu_plugin_for_tests};
use tpu_kernels_registry::pjrt::{
    AlignedHostBuffer, Client, ClientOptions, CompileOptions, DeviceAssignment, ElementType, Input,
    NativeType, Plugin, Program, StableHloVersion,
};

#[test]
fn plugin_loads_once_and_reports_attributes() {
    let Some(plugin) = cpu_plugin_for_tests() else { return };
    let attrs = plugin.attributes();
    let (major, minor) = attrs.api_version();
    assert_eq!(major, 0);
    assert!(minor >= 81, "api 0.{minor}");
    let current = attrs.stablehlo_current_version().expect("stablehlo_current_version");
    assert!(current >= StableHloVersion { major: 1, minor: 0, patch: 0 }, "{current}");
    assert!(attrs.stablehlo_minimum_version().is_some());
    assert!(plugin.has_ffi_extension());
    // Loaded once per path: a second load is the same plugin.
    let again = Plugin::load(plugin.path()).unwrap();
    assert_eq!(again.path(), plugin.path());
    assert_eq!(plugin.platform().unwrap(), "cpu");
}

#[test]
fn client_lists_devices_and_is_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Client>();
    assert_send_sync::<tpu_kernels_registry::pjrt::Buffer>();
    assert_send_sync::<tpu_kernels_registry::pjrt::LoadedExecutable>();
    assert_send_sync::<Plugin>();
    let Some(client) = cpu_client_for_tests(4) else { return };
    assert_eq!(client.platform(), "cpu");
    let ids: Vec<i32> = client.devices().iter().map(|d| d.id()).collect();
    assert_eq!(ids, vec![0, 1, 2, 3]);
    let two = Client::new(&client.plugin(), ClientOptions::new().cpu_device_count(2)).unwrap();
    assert_eq!(two.devices().len(), 2);
}

#[test]
fn compile_execute_and_read_back() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let exe = compile(&client, ADD_F32X4);
    let params = exe.parameters().expect("parameter types");
    assert_eq!(params.len(), 2);
    assert_eq!(params[0].element_type, ElementType::F32);
    assert_eq!(params[0].dims, vec![4]);
    let a = client.buffer_from_host(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    let b = client.buffer_from_host(&[10.0f32, 20.0, 30.0, 40.0], &[4]).unwrap();
    let out = exe.execute(&[&a, &b]).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].dims(), &[4]);
    let mut host = [0.0f32; 4];
    out[0].to_host(&mut host).unwrap();
    assert_eq!(host, [11.0, 22.0, 33.0, 44.0]);
    let sum = out[0].read_in_place_as::<f32, _>(|v| v.iter().sum::<f32>()).unwrap();
    assert_eq!(sum, 110.0);
    let bytes = out[0].read_in_place(|b| b.len()).unwrap();
    assert_eq!(bytes, 16);
    // The inputs were borrowed: still valid.
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn async_execution_completes_with_wait() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let exe = compile(&client, ADD_F32X4);
    let a = client.buffer_from_host(&[1.0f32; 4], &[4]).unwrap();
    let run = exe.execute_async(vec![Input::from(&a), Input::from(&a)]).unwrap();
    let _ = run.is_ready().unwrap();
    let mut outs = run.wait().unwrap();
    let out = outs.pop().unwrap().pop().unwrap();
    // Outputs of an execution feed the next one without waiting on the host.
    let run2 = exe.execute_async(vec![Input::from(&out), Input::from(&a)]).unwrap();
    let out2 = run2.wait().unwrap();
    assert_eq!(out2[0][0].to_vec::<f32>().unwrap(), vec![3.0; 4]);
}

#[test]
fn executes_concurrently_from_threads() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let exe = std::sync::Arc::new(compile(&client, ADD_F32X4));
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let (exe, client) = (exe.clone(), client.clone());
            std::thread::spawn(move || {
                for i in 0..50 {
                    let x = (t * 100 + i) as f32;
                    let a = client.buffer_from_host(&[x; 4], &[4]).unwrap();
                    let out = exe.execute(&[&a, &a]).unwrap();
                    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2.0 * x; 4]);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

fn identity_module(ty: &str) -> String {
    format!(
        "func.func @main(%a: tensor<2x3x{ty}>) -> tensor<2x3x{ty}> {{\n  return %a : tensor<2x3x{ty}>\n}}\n"
    )
}

fn round_trip<T: NativeType + PartialEq + std::fmt::Debug>(
    client: &Client,
    mlir: &str,
    data: [T; 6],
) {
    let buf = client.buffer_from_host(&data, &[2, 3]).unwrap();
    assert_eq!(buf.element_type(), T::TYPE);
    assert_eq!(buf.to_vec::<T>().unwrap(), data.to_vec());
    let exe = compile(client, &identity_module(mlir));
    assert_eq!(exe.parameters().unwrap()[0].element_type, T::TYPE, "{mlir}");
    let out = exe.execute(&[&buf]).unwrap();
    let mut host = [data[0]; 6];
    out[0].to_host(&mut host).unwrap();
    assert_eq!(host, data, "{mlir}");
    // The PJRT transfer path (what non-CPU plugins use) gives the same values.
    let mut transferred = [data[0]; 6];
    out[0].to_host_via_transfer(&mut transferred).unwrap();
    assert_eq!(transferred, data, "{mlir}");
}

#[test]
fn every_dtype_round_trips() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    round_trip(&client, "f32", [1.5f32, -2.0, 3.25, 0.0, 1e30, -7.0]);
    round_trip(&client, "f64", [1.5f64, -2.0, 3.25, 0.0, 1e300, -7.0]);
    round_trip(&client, "bf16", [1.5, -2.0, 3.25, 0.0, 256.0, -7.0].map(bf16::from_f32));
    round_trip(&client, "f16", [1.5, -2.0, 3.25, 0.0, 1000.0, -7.0].map(f16::from_f32));
    round_trip(&client, "i32", [1i32, -2, i32::MAX, 0, i32::MIN, 7]);
    round_trip(&client, "i64", [1i64, -2, i64::MAX, 0, i64::MIN, 7]);
    round_trip(&client, "i8", [1i8, -2, 127, 0, -128, 7]);
    round_trip(&client, "ui8", [1u8, 2, 255, 0, 128, 7]);
    round_trip(&client, "i1", [true, false, true, true, false, false]);
}

#[test]
fn zero_copy_upload_from_aligned_memory() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let mut host = AlignedHostBuffer::<f32>::zeroed(1024).unwrap();
    for (i, v) in host.iter_mut().enumerate() {
        *v = i as f32;
    }
    let host_ptr = host.as_ptr() as usize;
    assert_eq!(host_ptr % 4096, 0);
    let buf = client.buffer_from_aligned(host, &[1024]).unwrap();
    assert!(buf.is_zero_copy());
    // On the CPU plugin the device buffer is the host memory itself.
    let device_ptr = buf.read_in_place(|b| b.as_ptr() as usize).unwrap();
    assert_eq!(device_ptr, host_ptr);
    let module = r#"
func.func @main(%a: tensor<1024xf32>) -> tensor<f32> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%a init: %z) applies stablehlo.add across dimensions = [0] : (tensor<1024xf32>, tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}"#;
    let exe = compile(&client, module);
    let out = exe.execute(&[&buf]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![(1023 * 1024 / 2) as f32]);
    drop(buf); // frees the host memory only after PJRT is done with it
}

#[test]
fn execution_inputs_alias_aligned_host_bytes_and_copy_unaligned_ones() {
    use tpu_kernels::{DType, Shape, TensorType};
    use tpu_kernels_registry::dispatch::upload_input;
    let Some(client) = cpu_client_for_tests(1) else { return };
    let mut host = AlignedHostBuffer::<f32>::zeroed(1024 + 1).unwrap();
    for (i, v) in host.iter_mut().enumerate() {
        *v = i as f32;
    }
    let bytes: &[u8] = bytemuck_bytes(&host);
    let ty = TensorType::new(DType::F32, Shape::of(&[1024]));
    let exe = compile(&client, SUM_1024);
    // Aligned: the buffer is the host memory itself (zero-copy).
    let aligned = &bytes[..4096];
    let view = upload_input(&client, &ty, aligned).unwrap();
    assert_eq!(view.read_in_place(|b| b.as_ptr() as usize).unwrap(), aligned.as_ptr() as usize);
    let out = exe.execute(&[&view]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![(1023 * 1024 / 2) as f32]);
    // Unaligned by one element: a copy, with the same result.
    let unaligned = &bytes[4..4100];
    let copy = upload_input(&client, &ty, unaligned).unwrap();
    assert_ne!(copy.read_in_place(|b| b.as_ptr() as usize).unwrap(), unaligned.as_ptr() as usize);
    let out = exe.execute(&[&copy]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![(1024 * 1025 / 2) as f32]);
    // A length that does not match the type is refused, naming both.
    let err = upload_input(&client, &ty, &bytes[..4092]).unwrap_err();
    assert!(err.contains("needs 4096 bytes, the host data has 4092"), "{err}");
}

#[test]
fn the_view_cache_hands_out_views_of_exactly_the_memory_asked_for() {
    use tpu_kernels_registry::pjrt::{VIEW_CACHE_SIZE, ViewCache};
    let Some(client) = cpu_client_for_tests(1) else { return };
    let exe = compile(&client, SUM_1024);
    let cache = ViewCache::default();
    // More distinct page-aligned inputs than the cache keeps, each used twice with new values.
    let mut hosts: Vec<AlignedHostBuffer<f32>> =
        (0..VIEW_CACHE_SIZE + 3).map(|_| AlignedHostBuffer::<f32>::zeroed(1024).unwrap()).collect();
    for round in 0..2 {
        for (k, host) in hosts.iter_mut().enumerate() {
            host.fill((k + round) as f32);
            let bytes = bytemuck_bytes(host);
            let input = cache.input(&client, bytes, ElementType::F32, &[1024]).unwrap();
            assert_eq!(
                input.read_in_place(|b| b.as_ptr() as usize).unwrap(),
                bytes.as_ptr() as usize
            );
            let out = exe.execute(&[&input]).unwrap()[0].to_vec::<f32>().unwrap();
            assert_eq!(out, vec![1024.0 * (k + round) as f32], "input {k}, round {round}");
        }
    }
    assert!(cache.len() <= VIEW_CACHE_SIZE, "the cache outgrew its capacity: {}", cache.len());
    // The same address with another shape is another view.
    let bytes = bytemuck_bytes(&hosts[0]);
    let two = cache.input(&client, &bytes[..2048], ElementType::F32, &[2, 256]).unwrap();
    assert_eq!(two.dims(), &[2, 256]);

    // A larger cache keeps every input of a program: the second round makes no new view.
    let big = ViewCache::with_capacity(4 * VIEW_CACHE_SIZE);
    for _ in 0..2 {
        for host in &hosts {
            big.input(&client, bytemuck_bytes(host), ElementType::F32, &[1024]).unwrap();
        }
        assert_eq!(big.len(), hosts.len());
        assert_eq!(big.misses(), hosts.len() as u64);
    }
    // Memory that cannot be viewed (misaligned here) is a miss every time.
    let odd = &bytemuck_bytes(&hosts[1])[4..2052];
    for k in 1..=2 {
        big.input(&client, odd, ElementType::F32, &[512]).unwrap();
        assert_eq!(big.misses(), (hosts.len() + k) as u64);
    }
}

fn bytemuck_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: any f32 slice is readable as bytes, with the same lifetime.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

const SUM_1024: &str = r#"
func.func @main(%a: tensor<1024xf32>) -> tensor<f32> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%a init: %z) applies stablehlo.add across dimensions = [0] : (tensor<1024xf32>, tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}"#;

const DONATING: &str = r#"
func.func @main(%a: tensor<1024xf32> {tf.aliasing_output = 0 : i32}) -> tensor<1024xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<1024xf32>
  %0 = stablehlo.add %a, %one : tensor<1024xf32>
  return %0 : tensor<1024xf32>
}"#;

#[test]
fn donation_reuses_the_input_buffer() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let exe = compile(&client, DONATING);
    let first =
        exe.execute(&[&client.buffer_from_host(&[0.0f32; 1024], &[1024]).unwrap()]).unwrap();
    let mut buf = first.into_iter().next().unwrap();
    let before = buf.read_in_place(|b| b.as_ptr() as usize).unwrap();
    for _ in 0..3 {
        buf = exe.execute_with(vec![Input::Donated(buf)]).unwrap().into_iter().next().unwrap();
    }
    let after = buf.read_in_place(|b| b.as_ptr() as usize).unwrap();
    assert_eq!(before, after, "donated input memory is the output");
    assert_eq!(buf.to_vec::<f32>().unwrap(), vec![4.0; 1024]);
    // A borrowed argument to the same executable is never donated: it stays readable.
    let kept = client.buffer_from_host(&[5.0f32; 1024], &[1024]).unwrap();
    let out = exe.execute(&[&kept]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![6.0; 1024]);
    assert_eq!(kept.to_vec::<f32>().unwrap(), vec![5.0; 1024]);
}

const SHARDED: &str = r#"
func.func @main(%x: tensor<8x4xf32> {mhlo.sharding = "{devices=[4,1]0,1,2,3}"})
    -> (tensor<8x4xf32> {mhlo.sharding = "{devices=[4,1]0,1,2,3}"},
        tensor<4xf32> {mhlo.sharding = "{replicated}"}) {
  %two = stablehlo.constant dense<2.0> : tensor<8x4xf32>
  %0 = stablehlo.multiply %x, %two : tensor<8x4xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %1 = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [0] : (tensor<8x4xf32>, tensor<f32>) -> tensor<4xf32>
  return %0, %1 : tensor<8x4xf32>, tensor<4xf32>
}"#;

#[test]
fn spmd_over_four_devices() {
    let Some(client) = cpu_client_for_tests(4) else { return };
    let options = CompileOptions::spmd(4);
    let exe = client.compile(&Program::text(SHARDED), &options).unwrap();
    assert_eq!(exe.devices().len(), 4);
    assert_eq!(exe.num_partitions(), 4);
    assert_eq!(exe.parameters().unwrap()[0].dims, vec![2, 4], "per-device shard shape");
    // The partitioner's collective: the column sums of a row-sharded matrix are all-reduced.
    let ops = exe.optimized_opcodes().unwrap().expect("the CPU plugin reports its program");
    assert!(ops.contains_key("all-reduce"), "{ops:?}");
    assert!(ops.contains_key("multiply"), "{ops:?}");
    let shards: Vec<_> = client
        .devices()
        .iter()
        .enumerate()
        .map(|(d, dev)| {
            let data: Vec<f32> = (0..8).map(|i| (d * 8 + i) as f32).collect();
            client.buffer_from_host_on(&data, &[2, 4], dev).unwrap()
        })
        .collect();
    let args = shards.iter().map(|b| vec![Input::from(b)]).collect();
    let outs = exe.execute_sharded(args).unwrap();
    assert_eq!(outs.len(), 4);
    for (d, out) in outs.iter().enumerate() {
        let doubled = out[0].to_vec::<f32>().unwrap();
        let expect: Vec<f32> = (0..8).map(|i| 2.0 * (d * 8 + i) as f32).collect();
        assert_eq!(doubled, expect);
        // Column sums of the whole 8x4 matrix (an all-reduce across the four devices).
        let sums = out[1].to_vec::<f32>().unwrap();
        let expect: Vec<f32> = (0..4).map(|c| (0..8).map(|r| (r * 4 + c) as f32).sum()).collect();
        assert_eq!(sums, expect);
    }
    // Running the single-device entry point on it is a typed error, not a crash.
    assert!(matches!(
        exe.execute(&[&shards[0]]),
        Err(tpu_kernels_registry::pjrt::Error::DeviceCount { expected: 4, got: 1 })
    ));
}

#[test]
fn explicit_device_assignment() {
    let Some(client) = cpu_client_for_tests(4) else { return };
    let options =
        CompileOptions::new().device_assignment(DeviceAssignment::partitions(&[2]).unwrap());
    let exe = client.compile(&Program::text(ADD_F32X4), &options).unwrap();
    assert_eq!(exe.devices()[0].id(), 2);
    let dev = &client.devices()[2];
    let a = client.buffer_from_host_on(&[1.0f32; 4], &[4], dev).unwrap();
    let out = exe.execute(&[&a, &a]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2.0; 4]);
}

#[test]
fn serialize_and_reload() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let exe = compile(&client, ADD_F32X4);
    let bytes = exe.serialize().unwrap();
    assert!(!bytes.is_empty());
    let reloaded = client.deserialize(&bytes).unwrap();
    assert_eq!(reloaded.parameters(), exe.parameters());
    let a = client.buffer_from_host(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    let out = reloaded.execute(&[&a, &a]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
}

#[test]
fn compiles_bytecode_exported_by_jax() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    let Some(python) = python_for_tests() else { return };
    let bytecode = export_kernel(&python, "jnp_bytecode");
    let program = Program::bytecode(bytecode);
    assert!(program.is_bytecode());
    let exe = client.compile(&program, &CompileOptions::new()).unwrap();
    let x = client.buffer_from_host(&[0.0f32, 0.5, -0.5, 1.0, -1.0, 2.0], &[2, 3]).unwrap();
    let out = exe.execute(&[&x]).unwrap()[0].to_vec::<f32>().unwrap();
    let want = [0.0f32, 0.5, -0.5, 1.0, -1.0, 2.0].map(|x| x.tanh() * 2.0 + 1.0);
    assert_close("jax bytecode tanh(x) * 2 + 1", &out, &want, Tolerance::abs(1e-6));
}

/// What the CPU plugin offers toward several processes (issue 18's "across hosts"): its client
/// takes `cpu_device_count` (and run-time knobs) but no node id, node count or key-value store,
/// so one process drives all of its devices and two processes cannot form one client.
#[test]
fn the_cpu_plugin_has_no_options_for_several_processes() {
    let Some(client) = cpu_client_for_tests(1) else { return };
    for name in ["node_id", "num_nodes"] {
        let r = Client::new(
            &client.plugin(),
            ClientOptions::new().option(name, tpu_kernels_registry::pjrt::OptionValue::Int64(1)),
        );
        let e = r.expect_err("a CPU client option for several processes");
        let m = e.to_string();
        assert!(m.contains("Unexpected option name") && m.contains(name), "{m}");
    }
}

#[test]
fn compile_option_overrides_reach_the_compiler() {
    use tpu_kernels_registry::pjrt::OptionOverride;
    let Some(client) = cpu_client_for_tests(1) else { return };
    let program = Program::text(ADD_F32X4);
    let compile_with = |name: &str, value: OptionOverride| {
        client.compile(&program, &CompileOptions::new().option_override(name, value))
    };
    // XLA reads each override: a name it does not know, and a value of the wrong kind, are
    // errors that name them.
    let unknown = compile_with("xla_no_such_flag", OptionOverride::Int(1)).unwrap_err();
    assert!(unknown.to_string().contains("xla_no_such_flag"), "{unknown}");
    let bad = compile_with("xla_cpu_prefer_vector_width", OptionOverride::Str("wide".into()))
        .unwrap_err();
    assert!(bad.to_string().contains("'wide'"), "{bad}");
    // A valid one compiles a program that computes the right thing.
    let exe = compile_with("xla_cpu_prefer_vector_width", OptionOverride::Int(256)).unwrap();
    let a = client.buffer_from_host(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    let b = client.buffer_from_host(&[10.0f32, 20.0, 30.0, 40.0], &[4]).unwrap();
    let out = exe.execute(&[&a, &b]).unwrap();
    let mut host = [0.0f32; 4];
    out[0].to_host(&mut host).unwrap();
    assert_eq!(host, [11.0, 22.0, 33.0, 44.0]);
}

#[test]
fn the_cpu_client_prefers_512_bit_vectors_on_an_avx512_host() {
    use tpu_kernels_registry::cache::CacheKey;
    use tpu_kernels_registry::pjrt::{AVX512_VECTOR_WIDTH, OptionOverride};
    let Some(client) = cpu_client_for_tests(1) else { return };
    const WIDTH: &str = "xla_cpu_prefer_vector_width";
    let avx512 = std::fs::read_to_string("/proc/cpuinfo")
        .is_ok_and(|info| info.split_whitespace().any(|w| w == "avx512f"));
    let flags_say = std::env::var("XLA_FLAGS").is_ok_and(|f| f.contains(WIDTH));
    let resolved = CompileOptions::new().for_client(&client).into_owned();
    let width: Vec<_> = resolved.overrides().filter(|(k, _)| *k == WIDTH).collect();
    if avx512 && !flags_say {
        assert_eq!(width, vec![(WIDTH, &OptionOverride::Int(AVX512_VECTOR_WIDTH))]);
    } else {
        assert!(width.is_empty(), "{width:?}");
    }
    // What the caller set wins, and the cache key is that of the options as compiled.
    let narrow = CompileOptions::new().option_override(WIDTH, OptionOverride::Int(256));
    assert_eq!(narrow.for_client(&client).as_ref(), &narrow);
    let program = Program::text(ADD_F32X4);
    assert_eq!(
        CacheKey::compute(&client, &program, &CompileOptions::new()),
        CacheKey::compute(&client, &program, &resolved)
    );
    if avx512 && !flags_say {
        assert_ne!(
            CacheKey::compute(&client, &program, &CompileOptions::new()),
            CacheKey::compute(&client, &program, &narrow)
        );
    }
}

#[test]
fn a_built_gather_runs_with_stablehlo_semantics() {
    use tpu_kernels::ir::GatherDims;
    use tpu_kernels::{DType, KernelBuilder, TensorType};
    let Some(client) = cpu_client_for_tests(1) else { return };
    // Rows of a [4, 3] table by scalar indices, an embedding lookup: [5, 3]. An index outside
    // 0..4 is clamped into range, as StableHLO defines.
    let b = KernelBuilder::new(
        "lookup",
        &[TensorType::new(DType::F32, [4u64, 3]), TensorType::new(DType::I32, [5u64])],
    );
    let dims = GatherDims {
        offset_dims: vec![1],
        collapsed_slice_dims: vec![0],
        start_index_map: vec![0],
        index_vector_dim: 1,
        ..Default::default()
    };
    let out = b.gather(b.arg(0).unwrap(), b.arg(1).unwrap(), dims, &[1, 3]).unwrap();
    let exe = compile(&client, &b.finish(&[out]).unwrap().to_text());
    let table: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let x = client.buffer_from_host(&table, &[4, 3]).unwrap();
    let idx = client.buffer_from_host(&[2i32, 0, 3, 7, -1], &[5]).unwrap();
    let got = exe.execute(&[&x, &idx]).unwrap()[0].to_vec::<f32>().unwrap();
    let rows: [[f32; 3]; 5] =
        [[6.0, 7.0, 8.0], [0.0, 1.0, 2.0], [9.0, 10.0, 11.0], [9.0, 10.0, 11.0], [0.0, 1.0, 2.0]];
    assert_eq!(got, rows.concat());
}

#[test]
fn a_built_scatter_adds_rows_and_skips_windows_outside() {
    use tpu_kernels::ir::ScatterDims;
    use tpu_kernels::{DType, KernelBuilder, TensorType};
    let Some(client) = cpu_client_for_tests(1) else { return };
    // Rows of a [5, 2] update added into a [4, 2] table at scalar indices, an embedding's
    // gradient: a repeated index adds twice, an index outside 0..4 adds nothing.
    let b = KernelBuilder::new(
        "rows_added",
        &[
            TensorType::new(DType::F32, [4u64, 2]),
            TensorType::new(DType::I64, [5u64]),
            TensorType::new(DType::F32, [5u64, 2]),
        ],
    );
    let dims = ScatterDims {
        update_window_dims: vec![1],
        inserted_window_dims: vec![0],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: 1,
        ..Default::default()
    };
    let [x, i, u] = [b.arg(0).unwrap(), b.arg(1).unwrap(), b.arg(2).unwrap()];
    let out = b.scatter(x, i, u, dims, |c, n| Ok(c + n)).unwrap();
    let exe = compile(&client, &b.finish(&[out]).unwrap().to_text());
    let table = client.buffer_from_host(&[0.5f32; 8], &[4, 2]).unwrap();
    let idx = client.buffer_from_host(&[1i64, 3, 1, 4, -1], &[5]).unwrap();
    let upd: Vec<f32> = (1..=10).map(|v| v as f32).collect();
    let updates = client.buffer_from_host(&upd, &[5, 2]).unwrap();
    let got = exe.execute(&[&table, &idx, &updates]).unwrap()[0].to_vec::<f32>().unwrap();
    assert_eq!(got, vec![0.5, 0.5, 6.5, 8.5, 0.5, 0.5, 3.5, 4.5]);
}

#[test]
fn a_batched_gather_and_scatter_read_and_write_one_element_a_row() {
    use tpu_kernels::ir::{GatherDims, ScatterDims};
    use tpu_kernels::{DType, KernelBuilder, TensorType};
    let Some(client) = cpu_client_for_tests(1) else { return };
    // Row i of a [3, 4] operand read and written at column idx[i] (a batched gather and scatter
    // over the rows, as the per-row pick of a loss): the index vectors hold only the column.
    let b = KernelBuilder::new(
        "per_row",
        &[TensorType::new(DType::F32, [3u64, 4]), TensorType::new(DType::I64, [3u64, 1])],
    );
    let [x, i] = [b.arg(0).unwrap(), b.arg(1).unwrap()];
    let gather = GatherDims {
        collapsed_slice_dims: vec![1],
        operand_batching_dims: vec![0],
        start_indices_batching_dims: vec![0],
        start_index_map: vec![1],
        index_vector_dim: 1,
        ..Default::default()
    };
    let picked = b.gather(x, i, gather, &[1, 1]).unwrap();
    let scatter = ScatterDims {
        inserted_window_dims: vec![1],
        input_batching_dims: vec![0],
        scatter_indices_batching_dims: vec![0],
        scatter_dims_to_operand_dims: vec![1],
        index_vector_dim: 1,
        ..Default::default()
    };
    let written = b.scatter(x, i, picked, scatter, |c, n| Ok(c + n)).unwrap();
    let exe = compile(&client, &b.finish(&[picked, written]).unwrap().to_text());
    let data: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let xs = client.buffer_from_host(&data, &[3, 4]).unwrap();
    let idx = client.buffer_from_host(&[2i64, 0, 3], &[3, 1]).unwrap();
    let out = exe.execute(&[&xs, &idx]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0, 11.0]);
    let mut doubled = data.clone();
    for (row, col) in [(0, 2), (1, 0), (2, 3)] {
        doubled[row * 4 + col] *= 2.0;
    }
    assert_eq!(out[1].to_vec::<f32>().unwrap(), doubled);
}
