"""Kernel libraries from Python: `tpu_kernels.load_library` loads the example crate
`examples/my_kernels` (built here as a cdylib with cargo), checks and registers its kernels,
defines their torch ops, and the kernels then serve direct op calls, eager strict and fused
substitution, torch.compile and autograd, each checked to have run with `no_fallbacks`; every
refused load (bad path, not a library, missing symbol, ABI mismatch, name clash) registers
nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import tpu_kernels as tk  # noqa: E402
from tpu_kernels.testing import (  # noqa: E402
    assert_close_to_reference,
    force_tiled,
    inject_fault,
    no_fallbacks,
)
from tpu_kernels.torch import substitute  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OWN = ["ema_update", "gated_rms_norm", "linear_act", "scaled_silu", "scaled_silu_backward", "softcap"]


def _cdylib(package: str, lib_name: str) -> Path:
    """Builds `package` with cargo (a no-op when it is up to date) and returns its cdylib, as
    cargo reports it (wherever CARGO_TARGET_DIR puts it)."""
    cargo = os.environ.get("CARGO") or shutil.which("cargo")
    if cargo is None:
        pytest.fail("cargo is not on PATH: the kernel-library tests build examples/my_kernels with it")
    run = subprocess.run(
        [cargo, "build", "-p", package, "--message-format=json-render-diagnostics"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if run.returncode != 0:
        pytest.fail(f"cargo build -p {package} failed:\n{run.stderr[-4000:]}")
    suffix = ".dylib" if os.uname().sysname == "Darwin" else ".so"
    for line in run.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == lib_name:
            for f in msg["filenames"]:
                if f.endswith(suffix):
                    return Path(f)
    pytest.fail(f"cargo build -p {package} reported no {suffix} for {lib_name}")


@pytest.fixture(scope="module")
def lib_path() -> Path:
    return _cdylib("my_kernels", "my_kernels")


@pytest.fixture(scope="module")
def lib(lib_path):
    """The example library, loaded once: a loaded library stays loaded for the process, so
    later loads of the same path are no-ops."""
    return tk.load_library(lib_path)


def _names() -> list[str]:
    return [k["name"] for k in tk.kernels()]


def sigmoid(x):
    return 1.0 / (1.0 + torch.exp(-x))


def scaled_silu_ref(x, scale=1.0):
    x = x.double()
    return scale * x * sigmoid(x)


def gated_rms_norm_ref(x, gate, w, eps=1e-6):
    x, gate, w = x.double(), gate.double(), w.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w * gate * sigmoid(gate)


def softcap_ref(x, cap=30.0):
    return cap * torch.tanh(x.double() / cap)


def test_load_registers_only_the_crates_kernels_after_every_check(lib, lib_path):
    assert list(lib) == OWN and lib.crate == "my_kernels" and not lib.already_loaded
    assert lib.path == lib_path.resolve()
    assert lib.ops == [f"my_kernels::{n}.default" for n in OWN]
    for name in OWN:
        info = tk.kernel(name)
        assert info["runtime"] and not info["imported"], info
        assert info["library"] == str(lib.path)
        checks = lib.checks[name]
        assert [c["signature"] for c in checks] == info["canonical"]
        for c in checks:
            assert c["parsed"] == ["cpu", "tpu", "cuda"], c
            assert "finite outputs" in c["cpu_run"], c
            assert c["tpu_compile"].startswith("compiled for v5e:1x1"), c
    # Only the crate's own kernels: the standard ones it links in are not registered twice.
    names = _names()
    assert len(names) == len(set(names))
    assert tk.select("my_kernels::scaled_silu", "f32[4,33]") == "scaled_silu"
    assert "eps" in str(torch.ops.my_kernels.gated_rms_norm.default._schema)


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 64, generator=g).to(dtype)
    gate = torch.randn(6, 64, generator=g).to(dtype)
    w = torch.randn(64, generator=g).to(dtype)
    return x, gate, w


def _check_all(outs, x, gate, w):
    silu, norm, cap = outs
    assert_close_to_reference(silu, scaled_silu_ref(x, 0.5))
    assert_close_to_reference(norm, gated_rms_norm_ref(x, gate, w, 1e-5))
    assert_close_to_reference(cap, softcap_ref(x, 2.0))


def _run_all(x, gate, w):
    ops = torch.ops.my_kernels
    return (
        ops.scaled_silu(x, scale=0.5),
        ops.gated_rms_norm(x, gate, w, eps=1e-5),
        ops.softcap(x, cap=2.0),
    )


FORWARD = ["scaled_silu", "gated_rms_norm", "softcap"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_op_calls_run_the_library_kernels(lib, dtype):
    x, gate, w = _inputs(dtype)
    with no_fallbacks(kernels=FORWARD):
        outs = _run_all(x, gate, w)
    _check_all(outs, x, gate, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_eager_strict(lib, dtype):
    x, gate, w = _inputs(dtype)
    with no_fallbacks(kernels=FORWARD):
        with substitute("strict"):
            outs = _run_all(x, gate, w)
    _check_all(outs, x, gate, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_eager_fused(lib, dtype):
    x, gate, w = _inputs(dtype)
    with no_fallbacks(kernels=FORWARD, programs=1):
        with substitute("fused"):
            outs = _run_all(x, gate, w)
    _check_all(outs, x, gate, w)


def test_the_librarys_kernels_serve_the_tpu_device(lib):
    """Loading a library binds its ops at the device's key: they run there from the next call."""
    x, gate, w = _inputs()
    on_tpu = [t.to("tpu") for t in (x, gate, w)]
    with no_fallbacks(kernels=FORWARD):
        outs = _run_all(*on_tpu)
    assert all(o.device.type == "tpu" for o in outs)
    assert not any(op.startswith("my_kernels::") for op in tk.report().device["fallbacks"])
    _check_all([o.cpu() for o in outs], x, gate, w)


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_an_in_place_library_kernel_updates_its_argument_where_it_lies(lib, device):
    op = torch.ops.my_kernels.ema_update.default
    assert "Tensor(a!) avg" in str(op._schema) and str(op._schema).endswith("-> ()")
    g = torch.Generator().manual_seed(3)
    avg, x = (torch.randn(64, 128, generator=g).to(device) for _ in range(2))
    want = 0.9 * avg.cpu() + 0.1 * x.cpu()
    ptr = avg.data_ptr()
    key = "my_kernels::ema_update.default"
    before = tk.report().ops.get(key, {}).get("updated_in_place", 0)
    with no_fallbacks(kernels=["ema_update"]):
        assert op(avg, x, decay=0.9) is None
    assert avg.data_ptr() == ptr
    assert tk.report().ops[key]["updated_in_place"] == before + 1
    torch.testing.assert_close(avg.cpu(), want)
    if device == "tpu":
        assert key not in tk.report().device["fallbacks"], "ran at the device's key"


def test_torch_compile(lib):
    import tpu_kernels.torch.backend  # noqa: F401
    from tpu_kernels.torch import report

    ops = torch.ops.my_kernels

    def f(x, gate, w):
        y = ops.scaled_silu(x, scale=0.5) + 1.0
        return ops.gated_rms_norm(y, gate, w, eps=1e-5), ops.softcap(y * 3.0, cap=2.0)

    x, gate, w = _inputs()
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="tpu_kernels", fullgraph=True)
    with no_fallbacks(kernels=FORWARD, programs=1):
        norm, cap = compiled(x, gate, w)
    y = scaled_silu_ref(x, 0.5) + 1.0
    assert_close_to_reference(norm, gated_rms_norm_ref(y, gate, w, 1e-5))
    assert_close_to_reference(cap, softcap_ref(y * 3.0, 2.0))
    assert set(FORWARD) <= set(report().compiled["graphs"][-1]["kernels"])


def test_autograd_from_the_backward_pairing(lib):
    x = torch.randn(5, 32, requires_grad=True)
    g = torch.randn(5, 32)
    with no_fallbacks(kernels=["scaled_silu", "scaled_silu_backward"]):
        torch.ops.my_kernels.scaled_silu(x, scale=0.5).backward(g)
    xr = x.detach().double().requires_grad_()
    (0.5 * xr * torch.sigmoid(xr)).backward(g.double())
    assert_close_to_reference(x.grad, xr.grad)


@pytest.mark.parametrize("name", ["scaled_silu", "gated_rms_norm", "softcap", "ema_update"])
def test_opcheck(lib, name):
    """Schema (for ema_update, that it writes what it declares and nothing else), fake function
    (for softcap, the library's output types), autograd registration and AOT dispatch of each
    op."""
    x, gate, w = _inputs()
    args = {"scaled_silu": (x,), "gated_rms_norm": (x, gate, w), "softcap": (x,), "ema_update": (x, gate)}[name]
    with no_fallbacks(kernels=[name]):
        torch.library.opcheck(getattr(torch.ops.my_kernels, name).default, args)


def test_a_declined_call_is_no_error(lib):
    """`softcap` declines cap = 0 in its body; the refusal crosses the library boundary as a
    refusal (`unsupported`), so the op raises its no-kernel error, not an InternalError."""
    from tpu_kernels.torch._custom_ops import KernelOpError

    with pytest.raises(KernelOpError, match="cap = 0 is not positive"):
        torch.ops.my_kernels.softcap(torch.randn(4, 8), cap=0.0)


def test_an_injected_fault_reaches_library_kernels(lib):
    """The value checks above bite: a NaN fault on the library kernel shows in its output."""
    x = torch.randn(4, 8)
    with inject_fault("nan:scaled_silu"):
        out = torch.ops.my_kernels.scaled_silu(x)
    assert torch.isnan(out).all()
    with pytest.raises(AssertionError):
        assert_close_to_reference(out, scaled_silu_ref(x))


def test_the_same_path_again_is_a_no_op(lib, lib_path):
    before = _names()
    again = tk.load_library(lib_path)
    assert again.already_loaded and list(again) == OWN and again.checks == {}
    assert _names() == before


def test_library_kernels_cannot_be_removed(lib):
    with pytest.raises(tk.RegistrationError, match="loaded from kernel library .* cannot be removed"):
        tk.unregister("softcap")
    assert "softcap" in _names()


def _refused(path, match, **kwargs):
    before = _names()
    with pytest.raises(tk.LibraryError, match=match) as e:
        tk.load_library(path, **kwargs)
    assert Path(path).name in str(e.value), e.value
    assert _names() == before, "a refused load registered something"
    return e.value


def test_refused_loads_register_nothing(lib, lib_path, tmp_path):
    _refused(tmp_path / "libmissing.so", "cannot open it")
    text = tmp_path / "libtext.so"
    text.write_text("not a shared library\n")
    _refused(text, "not a loadable shared library")
    # A real shared library without the entry symbol: this package's own extension.
    _refused(tk._native.__file__, "no `tpuk_library` symbol")
    # The same library at another path is another library, whose kernel names are taken.
    copy = tmp_path / "libmy_kernels_copy.so"
    shutil.copy(lib_path, copy)
    _refused(copy, "kernel `ema_update` clashes with the registered kernel of that name \\(loaded from")


def test_an_abi_mismatch_is_refused_naming_both_versions(lib):
    fixture = _cdylib("tpu-kernels-library-fixture", "tpuk_library_fixture")
    before = _names()
    with pytest.raises(tk.LibraryError, match=r"ABI version 2, this host .* speaks version 1"):
        tk._native.load_library(str(fixture), topology=None, entry="tpuk_fixture_future_abi")
    with pytest.raises(tk.LibraryError, match=r"built with tpu-kernels 0.0.1-old, this host is tpu-kernels"):
        tk._native.load_library(str(fixture), topology=None, entry="tpuk_fixture_old_version")
    with pytest.raises(tk.LibraryError, match=r"kernel `nan_log`, canonical signature `f32\[8,128\]`: .*non-finite"):
        tk._native.load_library(str(fixture), topology=None, entry="tpuk_fixture_nan")
    assert _names() == before


# ----- the crate's tiled kernel: `linear_act`, act(x @ w + b) in VMEM blocks -----

ACT = {
    "none": lambda y: y,
    "relu": torch.relu,
    "silu": F.silu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
}


def linear_act_ref(x, w, b, activation):
    return ACT[activation](x.double() @ w.double() + b.double())


def _close_to_matmul_ref(actual, ref):
    """Against the f64 reference within what an f32-accumulated matmul over K = 1024 can reach
    (a few f32 roundings of sums of 1024 products; one bf16 rounding for bf16 outputs): the
    kernel's f32 arithmetic, not a per-element ulp budget."""
    rtol, atol = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1e-2)}[actual.dtype]
    torch.testing.assert_close(actual.double(), ref.to(actual.dtype).double(), rtol=rtol, atol=atol)


def _linear_inputs(m, k, n, dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(k, n, generator=g) / k**0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    return x, w, b


def test_the_tiled_kernel_compiles_for_v5e_and_v6e(lib):
    """The crate's tiled matmul with its epilogue: its TPU module is a Mosaic custom call in the
    shipped form, which libtpu compiles for both generations at every canonical signature."""
    info = tk.kernel("linear_act")
    assert info["library"] == str(lib.path)
    assert tk.select("my_kernels::linear_act", "f32[256,1024], f32[1024,256], f32[256]", platform="tpu") == "linear_act"
    for sig in info["canonical"]:
        text = tk._native.emit("linear_act", sig, "tpu")
        assert "tpu_custom_call" in text and "serialization_format" in text
        assert "tpu_custom_call" not in tk._native.emit("linear_act", sig, "cpu")
        for topology in ["v5e:1x1", "v6e:1x1"]:
            report = tk.compile_tpu("linear_act", sig, topology)
            assert report["executable_bytes"] > 1000, (sig, topology, report)


@pytest.mark.parametrize(
    ("shape", "activation", "dtype"),
    [((256, 1024, 256), "gelu_tanh", torch.float32), ((128, 512, 384), "silu", torch.bfloat16),
     ((7, 128, 128), "relu", torch.float32)],
    ids=["f32-256x1024x256-gelu_tanh", "bf16-128x512x384-silu", "f32-7x128x128-relu"],
)
def test_the_tiled_kernel_matches_pytorch_through_the_interpreter_and_the_twin(lib, shape, activation, dtype):
    """Two independent runs of the one kernel: the interpreter of the Mosaic text the library
    printed (what libtpu receives), and the CPU twin under eager strict and torch.compile with
    tiled kernels forced; each against PyTorch in f64."""
    import tpu_kernels.torch.backend  # noqa: F401

    m, k, n = shape
    x, w, b = _linear_inputs(m, k, n, dtype)
    ref = linear_act_ref(x, w, b, activation)
    short = {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype]
    sig = f"{short}[{m},{k}], {short}[{k},{n}], {short}[{n}]; activation={activation}"
    (out,) = tk._native.tiled_interpret(
        "linear_act", sig, [t.double().flatten().tolist() for t in (x, w, b)], "shipped"
    )
    interpreted = torch.tensor(out, dtype=torch.float64).reshape(m, n).to(dtype)
    _close_to_matmul_ref(interpreted, ref)
    op = torch.ops.my_kernels.linear_act
    with force_tiled(), no_fallbacks(kernels=["linear_act"]):
        with substitute("strict"):
            eager = op(x, w, b, activation=activation)
    _close_to_matmul_ref(eager, ref)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, c, d: op(a, c, d, activation=activation) * 2.0, backend="tpu_kernels", fullgraph=True)
    with force_tiled(), no_fallbacks(kernels=["linear_act"], programs=1):
        got = compiled(x, w, b)
    _close_to_matmul_ref(got, ref * 2.0)
