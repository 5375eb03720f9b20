"""Importing JAX functions: the decorator and function forms, new ops and ATen replacements,
symbolic dims specialised per call, static arguments, save and load as .mlir files."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import pytest
import torch

import tpu_kernels as tk
from tpu_kernels.testing import no_fallbacks


def test_decorator_defines_a_new_torch_op(cleanup):
    @tk.jax_kernel(op="imp::softplus", signatures=["f32[16,128]"])
    def softplus(x):
        """log(1 + exp(x))."""
        return jax.nn.softplus(x)

    assert isinstance(softplus, tk.ImportedKernel) and softplus.name == "softplus"
    assert "tpu_custom_call" not in softplus.cpu
    for step in ("export_tpu", "export_cpu", "parse", "tpu_compile", "cpu_run", "jax_cpu", "register"):
        assert step in softplus.timings
    x = torch.randn(16, 128)
    # The kernel computes it: a fallback to the JAX function would give the same values.
    with no_fallbacks(kernels=["softplus"]) as ran:
        torch.testing.assert_close(torch.ops.imp.softplus(x), torch.nn.functional.softplus(x))
        torch.testing.assert_close(softplus(x), torch.nn.functional.softplus(x))
    assert ran.kernels == {"softplus": 2}
    assert tk.kernel("softplus")["doc"] == "log(1 + exp(x))."
    tk.unregister("softplus")
    assert not hasattr(torch.ops.imp, "softplus") or not torch._C._dispatch_has_kernel_for_dispatch_key(
        "imp::softplus", "CompositeExplicitAutograd"
    )


def test_function_form_with_shape_dtype_structs(cleanup):
    s = jax.ShapeDtypeStruct((8, 256), jnp.bfloat16)
    k = tk.register_jax(lambda x, y: x * y, name="imp_mul_bf16", op="imp::mul_bf16", signatures=[(s, s)])
    assert k.signatures == ["bf16[8,256], bf16[8,256]"]
    x, y = torch.randn(8, 256, dtype=torch.bfloat16), torch.randn(8, 256, dtype=torch.bfloat16)
    with no_fallbacks(kernels=["imp_mul_bf16"]):
        torch.testing.assert_close(torch.ops.imp.mul_bf16(x, y), x * y)


def test_replaces_an_aten_op(cleanup):
    k = tk.register_jax(jax.nn.silu, name="imp_silu", op="aten::silu", signatures=["f32[8,128]"], priority=10)
    assert tk.select("aten::silu", "f32[8,128]") == "imp_silu"
    d = tk.Dispatcher()
    x = torch.randn(8, 128)
    torch.testing.assert_close(tk.dispatch("aten::silu", x, dispatcher=d), torch.nn.functional.silu(x))
    assert d.stats()["ops"]["aten::silu.default"]["kernels"] == {"imp_silu": 1}
    tk.unregister(k.name)
    assert tk.select("aten::silu", "f32[8,128]") == "silu"


def test_symbolic_dims_are_specialised_per_call(cleanup):
    k = tk.register_jax(
        lambda x: jnp.cumsum(x, axis=-1), name="imp_cumsum", op="imp::cumsum",
        signatures=["f32[B,128]"], constraints=["B >= 2"],
    )
    assert k.generic and "?x128xf32" in k.cpu
    assert tk.kernel("imp_cumsum")["guards"] == ["rank(0, 2, 2)", "dim_eq(0, 1, 128)"]
    d = tk.Dispatcher()
    for b in (8, 24):
        x = torch.randn(b, 128)
        (out,) = tk.call("imp::cumsum", x, dispatcher=d)
        torch.testing.assert_close(out, torch.cumsum(x, -1), atol=1e-4, rtol=1e-4)
    assert d.stats()["ops"]["imp::cumsum.default"]["substituted"] == 2
    text = tk.emit("imp_cumsum", "f32[24,128]")
    assert "?" not in tk._native.module_signature(text)["args"][0]
    # B = 1 violates the constraint: the specialisation fails and the call falls back.
    with pytest.raises(tk.FallbackError, match="B"):
        tk.call("imp::cumsum", torch.randn(1, 128), dispatcher=d)


def test_static_arguments(cleanup):
    def scale(x, *, factor: float):
        return x * factor

    k = tk.register_jax(scale, name="imp_scale", op="imp::scale", signatures=["f32[8,128]"], statics={"factor": 2.0})
    assert tk.kernel("imp_scale")["statics"] == [("factor", "float", "2.0", True)]
    assert tk.kernel("imp_scale")["canonical"] == ["f32[8,128]; factor=2.0"]
    x = torch.randn(8, 128)
    with no_fallbacks(kernels=["imp_scale"]) as ran:
        torch.testing.assert_close(torch.ops.imp.scale(x), x * 2.0)
        torch.testing.assert_close(torch.ops.imp.scale(x, factor=3.0), x * 3.0)  # re-exported for 3.0
    assert ran.kernels == {"imp_scale": 2}
    assert k.generic


def test_save_and_load_mlir(cleanup, tmp_path):
    k = tk.register_jax(lambda x: jnp.exp(x) - 1.0, name="imp_expm1", op="imp::expm1", signatures=["f32[B,128]"])
    paths = tk.save_mlir("imp_expm1", tmp_path)
    assert sorted(p.name for p in paths.values()) == ["imp_expm1.cpu.mlir", "imp_expm1.tpu.mlir"]
    assert "loc(" not in paths["cpu"].read_text()
    loaded = tk.load_mlir(
        name="imp_expm1_loaded", op="imp::expm1_loaded", signature="f32[B,128]",
        tpu=paths["tpu"], cpu=paths["cpu"], reference=lambda x: jnp.expm1(x),
    )
    assert loaded.fingerprint == k.fingerprint  # locations do not change the fingerprint
    d = tk.Dispatcher()
    x = torch.randn(16, 128)
    (out,) = tk.call("imp::expm1_loaded", x, dispatcher=d)
    torch.testing.assert_close(out, torch.expm1(x), atol=1e-5, rtol=1e-5)


def test_symbolic_kernel_is_specialised_inside_a_lowered_graph(cleanup):
    """The registry's graph lowering specialises a generic imported kernel through its
    specialiser and inlines it as a private function (not only the eager path)."""
    import json

    from tpu_kernels._native import torch_bridge

    tk.register_jax(
        lambda x: jnp.tanh(x) * 3.0, name="imp_tanh3", op="imp::tanh3",
        signatures=["f32[B,128]"], constraints=["B >= 1"],
    )
    graph = {
        "version": 1,
        "name": "uses_imp_tanh3",
        "inputs": [{"name": "x", "type": "f32[24,128]"}],
        "nodes": [
            {"name": "t", "op": "imp::tanh3.default", "args": [{"tensor": {"node": "x"}}],
             "outputs": ["f32[24,128]"]},
            {"name": "y", "op": "aten::add.Tensor",
             "args": [{"tensor": {"node": "t"}}, {"tensor": {"node": "x"}}],
             "outputs": ["f32[24,128]"]},
        ],
        "outputs": [{"node": "y"}],
    }
    program = torch_bridge.compile_graph(json.dumps(graph), [])
    assert "imp_tanh3" in program.kernels
    assert "?" not in program.text
    x = torch.randn(24, 128)
    (y,) = program.run([x])
    torch.testing.assert_close(torch.as_tensor(y), torch.tanh(x) * 3 + x, atol=1e-5, rtol=1e-5)


def test_checks_record_what_was_checked(cleanup):
    """`checks` says what validation did: the TPU compile, and whether the CPU numerics were
    checked against an independent reference or only round-tripped against the function."""
    plain = tk.register_jax(lambda x: x * 2.0, name="imp_twice", op="imp::twice", signatures=["f32[8,128]"])
    assert plain.checks["tpu_compile"] == "compiled for v5e:1x1"
    assert plain.checks["cpu_numerics"].startswith("round trip only")
    checked = tk.register_jax(
        lambda x: x * 2.0, name="imp_twice_ref", op="imp::twice_ref", signatures=["f32[8,128]"],
        reference=lambda x: x + x,
    )
    assert checked.checks["cpu_numerics"].startswith("against the reference")
    # A wrong kernel passes the round trip (it is what the function computes) but not a reference.
    with pytest.raises(tk.NumericsMismatchError, match="reference"):
        tk.register_jax(
            lambda x: x * 2.0, name="imp_wrong", op="imp::wrong", signatures=["f32[8,128]"],
            reference=lambda x: x * 3.0,
        )
    assert "imp_wrong" not in {k["name"] for k in tk.kernels()}


def test_tpu_compile_not_done_without_libtpu_is_recorded_or_refused(cleanup, monkeypatch):
    monkeypatch.setattr(tk._native, "libtpu_available", lambda: False)
    monkeypatch.delenv("TPUK_REQUIRE_RUNTIMES", raising=False)
    with pytest.warns(RuntimeWarning, match="TPU compile check was not done"):
        k = tk.register_jax(lambda x: x + 1.0, name="imp_inc", op="imp::inc", signatures=["f32[8,128]"])
    assert k.checks["tpu_compile"] == "not done: libtpu cannot be loaded"
    assert "tpu_compile" not in k.timings
    monkeypatch.setenv("TPUK_REQUIRE_RUNTIMES", "1")
    with pytest.raises(tk.RuntimeUnavailableError, match="libtpu cannot be loaded"):
        tk.register_jax(lambda x: x + 2.0, name="imp_inc2", op="imp::inc2", signatures=["f32[8,128]"])
    assert "imp_inc2" not in {k["name"] for k in tk.kernels()}


# ----- imported ops under torch.compile: a fake implementation from the export's result types -----


def _register_softsign_sum(**kw):
    """A new op with a static argument whose output shape is not its input's: x / (1 + |x|)
    summed over the last dim, times `factor`."""

    def softsign_sum(x, *, factor: float):
        return jnp.sum(x / (1.0 + jnp.abs(x)), axis=-1) * factor

    return tk.register_jax(softsign_sum, name="imp_softsign_sum", op="imp::softsign_sum",
                           statics={"factor": 1.0}, **kw)


def _softsign_sum_ref(x, factor=1.0):
    return (x / (1 + x.abs())).sum(-1) * factor


@pytest.mark.parametrize("signature", ["f32[8,128]", "f32[B,128]"], ids=["static", "symbolic"])
def test_imported_op_has_a_fake_from_its_export(cleanup, signature):
    """The fake implementation gives the export's result type at the call's signature (another
    static value; another batch size, which a symbolic kernel is specialised to and which the
    JAX function gives where a static kernel's guards refuse it), never running anything."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _register_softsign_sum(signatures=[signature])
    with FakeTensorMode():
        for b in (8, 24):
            y = torch.ops.imp.softsign_sum(torch.empty(b, 128), factor=2.0)
            assert tuple(y.shape) == (b,) and y.dtype == torch.float32
    torch.library.opcheck(torch.ops.imp.softsign_sum.default, (torch.randn(8, 128),), {"factor": 2.0},
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("backend", ["tpu_kernels", "aot_eager", "inductor"])
@pytest.mark.parametrize("signature", ["f32[8,128]", "f32[B,128]"], ids=["static", "symbolic"])
def test_imported_op_runs_under_torch_compile(cleanup, backend, signature):
    """An op an imported kernel defines compiles with every backend (Dynamo traces it with its
    fake) and the kernel runs: in the tpu_kernels program, or as the op Inductor and AOT call."""
    _register_softsign_sum(signatures=[signature])

    def f(x):
        return torch.ops.imp.softsign_sum(torch.sin(x), factor=3.0) + 1.0

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    x = torch.randn(8, 128)
    with no_fallbacks(kernels=["imp_softsign_sum"], programs=1 if backend == "tpu_kernels" else 0):
        got = compiled(x)
    torch.testing.assert_close(got, _softsign_sum_ref(torch.sin(x), 3.0) + 1.0, atol=1e-5, rtol=1e-5)


# ----- an imported kernel's gradient: its VJP imported beside it -----


@pytest.mark.parametrize("signature", ["f32[8,128]", "f32[B,128]"], ids=["static", "symbolic"])
def test_backward_imports_the_vjp_and_trains_eager_and_compiled(cleanup, signature):
    """`backward=True`: the function's VJP is kernel `<name>_backward`, the op's gradient; a
    training step through the op runs both kernels, eagerly and under torch.compile (forward and
    backward programs), and the gradients are the function's."""

    def gated(x, w, *, slope: float):
        return jnp.tanh(x * w) + slope * x

    k = tk.register_jax(gated, name="imp_gated", op="imp::gated", statics={"slope": 0.25},
                        signatures=[f"{signature}, f32[128]"],
                        backward=True)
    assert tk.kernel("imp_gated_backward")["ops"] == ["imp::gated_backward.default"]

    def loss(x, w):
        return (torch.ops.imp.gated(x, w, slope=0.5) ** 2).sum()

    x = torch.randn(8, 128, requires_grad=True)
    w = torch.randn(128, requires_grad=True)
    ref_x, ref_w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ((torch.tanh(ref_x * ref_w) + 0.5 * ref_x) ** 2).sum().backward()
    with no_fallbacks(kernels=["imp_gated", "imp_gated_backward"]):
        loss(x, w).backward()
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad, ref_w.grad, rtol=1e-5, atol=1e-4)
    x.grad = w.grad = None
    torch._dynamo.reset()
    with no_fallbacks(kernels=["imp_gated", "imp_gated_backward"], programs=2):
        torch.compile(loss, backend="tpu_kernels", fullgraph=True)(x, w).backward()
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad, ref_w.grad, rtol=1e-5, atol=1e-4)
    assert k.name == "imp_gated"


def test_backward_is_refused_for_an_aten_op(cleanup):
    with pytest.raises(tk.RegistrationError, match="backward=True gives a new op its gradient"):
        tk.register_jax(jax.nn.silu, name="imp_silu_bwd", op="aten::silu", signatures=["f32[8,128]"], backward=True)
    assert "imp_silu_bwd" not in {k["name"] for k in tk.kernels()}


def test_pallas_flash_attention_trains_under_torch_compile(cleanup):
    """jax's Pallas TPU flash attention, imported with its gradient (its custom_vjp: the dkv and
    dq kernels), runs forward and backward inside compiled programs (Pallas interpret mode on
    the CPU), and its gradients match SDPA's."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    blocks = fa.BlockSizes(
        block_q=128, block_k_major=128, block_k=128, block_b=1, block_q_major_dkv=128, block_k_major_dkv=128,
        block_k_dkv=128, block_q_dkv=128, block_k_major_dq=128, block_k_dq=128, block_q_dq=128,
    )

    def attention(q, k, v):
        return fa.flash_attention(q, k, v, causal=True, sm_scale=0.125, block_sizes=blocks)

    sig = "f32[1,2,128,64]"
    tk.register_jax(attention, name="pallas_flash", op="imp::pallas_flash", signatures=[f"{sig}, {sig}, {sig}"],
                    backward=True)

    def loss(q, k, v):
        return (torch.ops.imp.pallas_flash(q, k, v) ** 2).sum()

    qkv = [torch.randn(1, 2, 128, 64, requires_grad=True) for _ in range(3)]
    ref = [t.detach().clone().requires_grad_() for t in qkv]
    (torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True, scale=0.125) ** 2).sum().backward()
    torch._dynamo.reset()
    with no_fallbacks(kernels=["pallas_flash", "pallas_flash_backward"], programs=2):
        torch.compile(loss, backend="tpu_kernels", fullgraph=True)(*qkv).backward()
    for got, want in zip(qkv, ref):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-4)
