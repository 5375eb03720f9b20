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
from tpu_kernels.testing import assert_close_to_reference, inject_fault, no_fallbacks  # noqa: E402
from tpu_kernels.torch import substitute  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OWN = ["gated_rms_norm", "scaled_silu", "scaled_silu_backward", "softcap"]


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


@pytest.mark.parametrize("name", ["scaled_silu", "gated_rms_norm", "softcap"])
def test_opcheck(lib, name):
    """Schema, fake function (for softcap, the library's output types), autograd registration
    and AOT dispatch of each op."""
    x, gate, w = _inputs()
    args = {"scaled_silu": (x,), "gated_rms_norm": (x, gate, w), "softcap": (x,)}[name]
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
    _refused(copy, "kernel `gated_rms_norm` clashes with the registered kernel of that name \\(loaded from")


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
