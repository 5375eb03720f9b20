"""tpu_kernels' native bridge: the shared registry, selection, the dispatcher on torch tensors
(DLPack in and out without copies), the checks and the counters."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp
import pytest
import torch

import tpu_kernels as tk


def names() -> set[str]:
    return {k["name"] for k in tk.kernels()}


def test_one_registry_shared_with_rust_kernels(cleanup):
    linked = {k["name"] for k in tk.kernels() if not k["runtime"]}
    assert {"gelu", "rms_norm", "silu"} <= linked, linked
    k = tk.register_jax(lambda x: jnp.tanh(x) * 2.0, name="bridge_tanh2", op="bridge::tanh2", signatures=["f32[8,128]"])
    info = tk.kernel("bridge_tanh2")
    assert info["runtime"] and info["imported"] and info["platforms"] == ["cpu", "tpu"]
    assert info["ops"] == ["bridge::tanh2.default"]
    assert info["fingerprint"] == k.fingerprint == tk._native.content_fingerprint(k.tpu)
    assert linked <= names()
    assert tk.select("bridge::tanh2", "f32[8,128]") == "bridge_tanh2"
    with pytest.raises(tk.NoKernelError, match="dim 0 is not 8"):
        tk.select("bridge::tanh2", "f32[16,128]")
    tk.unregister("bridge_tanh2")
    assert "bridge_tanh2" not in names()
    with pytest.raises(tk.NoKernelError, match="no kernel registered for `bridge::tanh2.default`"):
        tk.select("bridge::tanh2", "f32[8,128]")


def test_registry_errors_leave_it_unchanged(cleanup):
    tk.register_jax(lambda x: x + 1.0, name="bridge_inc", op="bridge::inc", signatures=["f32[8,128]"])
    before = names()
    with pytest.raises(tk.RegistrationError, match="two kernels named `bridge_inc`"):
        tk.register_jax(lambda x: x + 2.0, name="bridge_inc", op="bridge::inc2", signatures=["f32[8,128]"], define_op=False)
    with pytest.raises(tk.RegistrationError, match="kernels `bridge_inc` and `bridge_inc_b` can both match"):
        tk.register_jax(lambda x: x + 1.0, name="bridge_inc_b", op="bridge::inc", signatures=["f32[8,128]"], define_op=False)
    with pytest.raises(tk.RegistrationError, match="linked into the binary"):
        tk._native.unregister("gelu")
    assert names() == before
    # A higher priority resolves the ambiguity.
    tk.register_jax(lambda x: x + 1.0, name="bridge_inc_b", op="bridge::inc", signatures=["f32[8,128]"], priority=5, define_op=False)
    assert tk.select("bridge::inc", "f32[8,128]") == "bridge_inc_b"


def test_dispatch_zero_copy_and_counters(cleanup):
    tk.register_jax(lambda x, y: x * y + 1.0, name="bridge_fma", op="bridge::fma", signatures=["f32[8,128], f32[8,128]"])
    d = tk.Dispatcher()
    x, y = torch.randn(8, 128), torch.randn(8, 128)
    (out,) = d.call("bridge::fma", [x, y])
    t = torch.from_dlpack(out)
    assert t.data_ptr() == out.data_ptr, "the output aliases the PJRT buffer"
    torch.testing.assert_close(t, x * y + 1.0)
    s = d.stats()["ops"]["bridge::fma.default"]
    assert (s["calls"], s["substituted"], s["kernels"]) == (1, 1, {"bridge_fma": 1})
    # A strided view falls back, with its reason counted.
    with pytest.raises(tk.FallbackError, match="not contiguous") as e:
        d.call("bridge::fma", [x.t().contiguous().t(), y])
    assert e.value.category == "no_kernel" and e.value.op == "bridge::fma.default"
    s = d.stats()
    assert s["ops"]["bridge::fma.default"]["fallbacks"] == {"no_kernel": 1}
    assert s["substituted"] == 1 and s["fallbacks"] == 1
    # tk.dispatch runs the original ATen op when no kernel applies.
    z = torch.randn(4, 4)
    torch.testing.assert_close(tk.dispatch("aten::relu", z, dispatcher=d), torch.relu(z))
    assert d.stats()["ops"]["aten::relu.default"]["fallbacks"] == {"no_kernel": 1}
    forbid = tk.Dispatcher(no_fallback=True)
    with pytest.raises(tk.FallbackError, match="fallback forbidden"):
        tk.dispatch("aten::relu", z, dispatcher=forbid)


def test_dispatch_runs_linked_in_rust_kernels():
    d = tk.Dispatcher()
    x = torch.randn(8, 128)
    (out,) = tk.call("aten::gelu", x, dispatcher=d)
    torch.testing.assert_close(out, torch.nn.functional.gelu(x), atol=1e-5, rtol=1e-5)
    assert d.stats()["ops"]["aten::gelu.default"]["kernels"] == {"gelu": 1}


def test_checks_emit_compile_run(cleanup):
    text = tk.emit("gelu", "f32[8,128]")
    assert tk._native.module_signature(text)["args"] == ["tensor<8x128xf32>"]
    tk.register_jax(lambda x: jnp.sin(x), name="bridge_sin", op="bridge::sin", signatures=["f32[8,128]"])
    assert "stablehlo.sine" in tk.emit("bridge_sin", "f32[8,128]", "tpu")
    report = tk.compile_tpu("bridge_sin", "f32[8,128]")
    assert report["topology"] == "v5e:1x1" and report["executable_bytes"] > 0
    before = tk.cache_stats()
    run = tk.run_cpu("bridge_sin", "f32[8,128]")
    assert run["outputs"][0].shape == (8, 128)
    again = tk.run_cpu("bridge_sin", "f32[8,128]")
    assert again["cache"] == "memoryhit"
    after = tk.cache_stats()
    assert after["memory_hits"] > before["memory_hits"]
    with pytest.raises(tk.TpuCompileError):
        tk._native.compile_tpu("func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
                               "  %0 = stablehlo.custom_call @no_such_target(%a) : (tensor<4xf32>) -> tensor<4xf32>\n"
                               "  return %0 : tensor<4xf32>\n}\n")


def test_compile_cache_keys_see_the_compilers_flags(tmp_path):
    """A program compiled under other `XLA_FLAGS` is compiled again, not loaded from disk (a flag
    can change the code XLA emits); the same flags find the entry again. The loop interleave
    option tpu_kernels puts in `XLA_FLAGS` is one of them: a forced count, or none, compiles
    again."""
    import subprocess
    import sys

    code = (
        "import numpy as np, tpu_kernels._native as n\n"
        "t = 'func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\\n"
        "  %0 = stablehlo.multiply %a, %a : tensor<4xf32>\\n  return %0 : tensor<4xf32>\\n}\\n'\n"
        "print(n.run_module_cpu(t, [np.arange(4, dtype=np.float32)])[1]['cache'])\n"
    )

    def cache_of(flags: str | None, interleave: str | None = None) -> str:
        drop = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "TPUK_VECTOR_INTERLEAVE")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env["TPUK_CACHE"] = str(tmp_path)
        if flags is not None:
            env["XLA_FLAGS"] = flags
        if interleave is not None:
            env["TPUK_VECTOR_INTERLEAVE"] = interleave
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().splitlines()[-1]

    assert cache_of(None) == "compiled"
    assert cache_of("--xla_cpu_enable_fast_math=false") == "compiled"
    assert cache_of(None) == "diskhit"
    assert cache_of("--xla_cpu_enable_fast_math=false") == "diskhit"
    # Unset and empty both become the interleave option alone: the same program.
    assert cache_of("") == "diskhit"
    assert cache_of(None, interleave="4") == "compiled"
    assert cache_of(None, interleave="4") == "diskhit"
    assert cache_of(None, interleave="off") == "compiled"
    assert cache_of("", interleave="off") == "compiled"  # set but empty is told apart from unset
