"""The "tpu" device (`import tpu_kernels.device`): creation and moves, memory, views and in-place
ops, kernels at the dispatch key, declines and the fallback, autograd and optimizers, runtime
registration, mixed devices, out-of-memory, and a PrivateUse1 key another backend holds.

Every claim that a kernel ran is checked with `no_fallbacks(kernels=...)`, which fails if the
call fell back or the kernel did not run; the fallback's own counters
(`report().device["fallbacks"]`) show which ops ran on CPU kernels over the device's memory.
"""

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import tpu_kernels as tk  # noqa: E402
import tpu_kernels.device as device  # noqa: E402
from tpu_kernels.testing import no_fallbacks  # noqa: E402


def _fell_back(op: str) -> int:
    return tk.report().device["fallbacks"].get(op, 0)


def test_import_torch_alone_gives_the_device():
    # Without the OpenMP settings this process may pass on (tpu_kernels._openmp).
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    r = subprocess.run(
        [sys.executable, "-c", "import torch\n"
         "x = torch.ones(3, device='tpu', requires_grad=True)\n"
         "(x * 2).sum().backward()\n"
         "print(x.grad.device, torch.tpu.is_available())\n"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "tpu:0 True"
    # One line on first use names the platform.
    assert r.stderr.count("[tpu_kernels] tpu device: PJRT platform 'cpu'") == 1, r.stderr
    # torch came first, so its OpenMP workers keep libgomp's long spin: the next line says how
    # to shorten it (tpu_kernels._openmp).
    assert r.stderr.count("set GOMP_SPINCOUNT=") == 1, r.stderr


def test_the_device_is_registered_with_torchs_device_functions():
    assert device.is_installed() and device.unavailable_reason() is None
    assert torch._C._get_privateuse1_backend_name() == "tpu"
    assert torch.tpu.is_available() and torch.tpu.device_count() == 1 and torch.tpu.current_device() == 0
    assert "PJRT cpu" in torch.tpu.get_device_name()
    assert device.platform() == "cpu"
    assert torch.bfloat16 in torch.tpu.get_amp_supported_dtype()
    assert tk.report().device["platform"] == "cpu"
    with pytest.raises(RuntimeError, match="tpu:1 does not exist"):
        torch.empty(2, device="tpu:1")


def test_creation_and_moves():
    x = torch.randn(3, 5, device="tpu")
    assert x.device == torch.device("tpu", 0) and x.is_tpu and x.dtype == torch.float32
    c = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    t = c.to("tpu")
    assert t.device.type == "tpu" and t.dtype == torch.int64
    assert torch.equal(t.cpu(), c)
    assert torch.equal(c.tpu().cpu(), c)
    assert torch.equal(torch.zeros(4, device="tpu").cpu(), torch.zeros(4))
    b = torch.ones(2, 2, dtype=torch.bfloat16).to("tpu")
    assert b.dtype == torch.bfloat16 and torch.equal(b.cpu(), torch.ones(2, 2, dtype=torch.bfloat16))
    m = torch.nn.Linear(4, 3).to("tpu")
    assert all(p.device.type == "tpu" for p in m.parameters())
    # Parameters two modules share stay shared (tied embeddings).
    tied = torch.nn.ModuleDict({"a": torch.nn.Embedding(5, 4), "b": torch.nn.Linear(4, 5, bias=False)})
    tied["b"].weight = tied["a"].weight
    tied.to("tpu")
    assert tied["a"].weight is tied["b"].weight and tied["a"].weight.device.type == "tpu"
    assert len(list(tied.parameters())) == 1
    assert next(torch.nn.Linear(2, 2).tpu().parameters()).device.type == "tpu"
    assert t.sum().item() == 66


def test_seeded_random_ops_match_cpu():
    torch.manual_seed(123)
    a = torch.randn(16)
    torch.manual_seed(123)
    b = torch.randn(16, device="tpu")
    assert torch.equal(a, b.cpu())
    torch.tpu.manual_seed(7)
    assert torch.tpu.initial_seed() == 7
    state = torch.tpu.get_rng_state()
    a = torch.rand(8, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.rand(8, device="tpu").cpu(), a)
    # torch's fork_rng saves and restores the device's generator.
    torch.tpu.set_rng_state(state)
    with torch.random.fork_rng(device_type="tpu"):
        torch.rand(8, device="tpu")
    assert torch.equal(torch.rand(8, device="tpu").cpu(), a)


def test_memory_comes_from_the_caching_allocator():
    torch.tpu.empty_cache()
    before = torch.tpu.memory_stats()
    x = torch.empty(1 << 18, device="tpu")  # 1 MiB
    assert x.data_ptr() % 64 == 0
    assert torch.tpu.memory_allocated() - before["allocated_bytes"] == 1 << 20
    ptr = x.data_ptr()
    del x
    assert torch.tpu.memory_allocated() == before["allocated_bytes"]
    assert torch.tpu.memory_reserved() >= 1 << 20
    y = torch.empty(1 << 18, device="tpu")  # the same size class: the cached block again
    after = torch.tpu.memory_stats()
    assert y.data_ptr() == ptr and after["cache_hits"] > before["cache_hits"]
    assert torch.tpu.max_memory_allocated() >= 1 << 20
    del y
    torch.tpu.empty_cache()
    assert torch.tpu.memory_stats()["cached_bytes"] == 0
    # A kernel's output (a PJRT buffer) and a fallback's result (the CPU kernel's block) are
    # device memory too, counted until their tensors die.
    x = torch.randn(256, 1024, device="tpu")  # 1 MiB from the allocator
    base = torch.tpu.memory_stats()
    g = torch.nn.functional.gelu(x)  # a kernel's output
    assert torch.tpu.memory_stats()["kernel_output_bytes"] - base["kernel_output_bytes"] == 1 << 20
    e = torch.exp(x)  # no kernel: structured, so its out= tensor comes from the allocator
    s = x.sum(0)  # the fallback's own result
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes"] - base["allocated_bytes"] >= (1 << 20) * 2 + 1024 * 4
    del g, e, s
    assert torch.tpu.memory_allocated() == base["allocated_bytes"]
    # So is a compiled graph's output on the device.
    lin = torch.nn.Linear(1024, 256).to("tpu")
    f = torch.compile(lin, backend="tpu_kernels")
    with torch.no_grad():
        f(x)
        base = torch.tpu.memory_stats()
        y = f(x)  # [256, 256] f32: 256 KiB
        assert torch.tpu.memory_allocated() - base["allocated_bytes"] == 256 * 256 * 4
        del y
    assert torch.tpu.memory_allocated() == base["allocated_bytes"]


def test_views_and_in_place_ops_share_memory_as_on_cpu():
    x = torch.arange(12.0).reshape(3, 4).to("tpu")
    v = x[1:3, 1:]
    assert v.data_ptr() == x.data_ptr() + (4 + 1) * 4
    v.add_(100)
    t = x.t()
    assert t.data_ptr() == x.data_ptr() and t.stride() == (1, 4)
    assert x.view(12).data_ptr() == x.data_ptr()
    expected = torch.arange(12.0).reshape(3, 4)
    expected[1:3, 1:] += 100
    assert torch.equal(x.cpu(), expected)
    # `unfold` is a view op with no composite kernel: it goes through the fallback, whose
    # result must still be a view of the device tensor.
    n = _fell_back("aten::unfold.default")
    u = x.reshape(12).unfold(0, 4, 4)
    assert _fell_back("aten::unfold.default") == n + 1
    assert u.data_ptr() == x.data_ptr()
    u.mul_(0)
    assert torch.equal(x.cpu(), torch.zeros(3, 4))
    # out= through the fallback, into a device tensor that must grow.
    out = torch.empty(0, device="tpu")
    torch.add(torch.ones(5, device="tpu"), 1, out=out)
    assert out.shape == (5,) and torch.equal(out.cpu(), torch.full((5,), 2.0))


def test_a_bound_op_runs_its_kernel_at_the_key():
    x = torch.randn(64, 128)
    before = _fell_back("aten::gelu.default")
    with no_fallbacks(kernels=["gelu"]) as ran:
        y = torch.nn.functional.gelu(x.to("tpu"))
    assert ran.kernels["gelu"] == 1
    assert _fell_back("aten::gelu.default") == before
    assert y.device.type == "tpu" and y.data_ptr() % 64 == 0
    torch.testing.assert_close(y.cpu(), torch.nn.functional.gelu(x))


def test_the_device_and_substitute_give_identical_results():
    x = torch.randn(32, 64)
    w, b = torch.randn(64), torch.randn(64)
    with tk.substitute("strict"), no_fallbacks(kernels=["gelu", "layer_norm"]):
        ref = torch.nn.functional.layer_norm(torch.nn.functional.gelu(x), (64,), w, b)
    xt, wt, bt = x.to("tpu"), w.to("tpu"), b.to("tpu")
    with no_fallbacks(kernels=["gelu", "layer_norm"]):
        out = torch.nn.functional.layer_norm(torch.nn.functional.gelu(xt), (64,), wt, bt)
    assert torch.equal(out.cpu(), ref)


def test_a_call_no_kernel_takes_is_declined_with_its_reason_and_still_right():
    x = torch.randn(16, 8)
    with no_fallbacks(allow={"aten::gelu.default": "a strided input"}) as ran:
        y = torch.nn.functional.gelu(x.to("tpu").t())
    assert ran.fallbacks == {("aten::gelu.default", "bad_input"): 1}
    assert "strided" in tk.report().ops["aten::gelu.default"]["last_fallback"]
    torch.testing.assert_close(y.cpu(), torch.nn.functional.gelu(x.t()))
    # A static outside every kernel's guards (approximate="tanh" has its own kernel; an
    # unsupported dtype has none).
    xi = torch.randn(8, 8, dtype=torch.float64)
    with no_fallbacks(allow={"aten::gelu.default": "float64"}) as ran:
        y = torch.nn.functional.gelu(xi.to("tpu"))
    assert sum(ran.fallbacks.values()) == 1
    torch.testing.assert_close(y.cpu(), torch.nn.functional.gelu(xi))


def test_mixed_devices_are_an_error_naming_the_op():
    a = torch.ones(4, device="tpu")
    # PyTorch's own check (TensorIterator's), as for any device.
    with pytest.raises(RuntimeError, match=r"same device.*tpu:0 and cpu"):
        a + torch.ones(4)
    # Ops that reach the fallback are checked there, naming the op and the argument.
    with pytest.raises(RuntimeError, match=r"tpu:0 and cpu.*`tensor` of aten::dot"):
        torch.dot(a, torch.ones(4))
    # An op with a kernel at the key checks the same way.
    with pytest.raises(RuntimeError, match=r"tpu:0 and cpu.*`weight` of aten::native_layer_norm"):
        torch.nn.functional.layer_norm(a.reshape(1, 4), (4,), torch.ones(4))
    # A 0-dim CPU tensor is a scalar, as with other devices.
    assert torch.equal((a * torch.tensor(3.0)).cpu(), torch.full((4,), 3.0))
    # CPU indices may index a device tensor.
    assert torch.equal(a[torch.tensor([0, 2])].cpu(), torch.ones(2))


def test_out_of_memory_raises_torchs_error_and_the_process_goes_on():
    with pytest.raises(torch.OutOfMemoryError, match="tpu: out of memory"):
        torch.empty(1 << 48, dtype=torch.float32, device="tpu")
    assert torch.tpu.memory_stats()["ooms"] >= 1
    assert torch.ones(2, device="tpu").sum().item() == 2


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    )


@pytest.mark.parametrize("opt", ["sgd", "adamw_foreach", "adamw_fused"])
def test_training_steps_match_cpu(opt):
    def make(params):
        if opt == "sgd":
            return torch.optim.SGD(params, lr=0.1, momentum=0.9)
        return torch.optim.AdamW(params, lr=1e-2, foreach=opt == "adamw_foreach", fused=opt == "adamw_fused" or None)

    x = torch.randn(8, 16)
    cpu, tpu = _mlp(), _mlp().to("tpu")
    o_cpu, o_tpu = make(cpu.parameters()), make(tpu.parameters())
    xt = x.to("tpu")
    for _ in range(2):
        loss_cpu = cpu(x).pow(2).mean()
        loss_cpu.backward()
        with no_fallbacks(kernels=["gelu", "layer_norm", "layer_norm_backward"]):
            loss_tpu = tpu(xt).pow(2).mean()
            loss_tpu.backward()
        torch.testing.assert_close(loss_tpu.detach().cpu(), loss_cpu.detach())
        for p, q in zip(tpu.parameters(), cpu.parameters()):
            assert p.grad.device.type == "tpu"
            torch.testing.assert_close(p.grad.cpu(), q.grad)
        o_cpu.step()
        o_tpu.step()
        o_cpu.zero_grad()
        o_tpu.zero_grad()
    for p, q in zip(tpu.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach())


def test_a_new_ops_kernel_runs_at_the_key():
    x, w = torch.randn(8, 64), torch.randn(64)
    with no_fallbacks(kernels=["rms_norm"]):
        y = torch.ops.tpuk.rms_norm(x.to("tpu"), w.to("tpu"))
    assert y.device.type == "tpu"
    torch.testing.assert_close(y.cpu(), torch.ops.tpuk.rms_norm(x, w))


def test_a_kernel_registered_later_serves_the_device_from_the_next_call(cleanup):
    jax = pytest.importorskip("jax")
    x = torch.randn(8, 128)
    # Before: the structured op's out= form runs in the fallback.
    before = _fell_back("aten::tanh.out")
    torch.tanh(x.to("tpu"))
    assert _fell_back("aten::tanh.out") == before + 1
    def tanh(self):  # named as torch's schema names the argument
        return jax.numpy.tanh(self)

    k = tk.register_jax(tanh, name="dev_tanh", op="aten::tanh", signatures=["f32[8,128]"])
    with no_fallbacks(kernels=["dev_tanh"]):
        y = torch.tanh(x.to("tpu"))
    torch.testing.assert_close(y.cpu(), torch.tanh(x))
    assert _fell_back("aten::tanh.out") == before + 1
    tk.unregister(k.name)
    with no_fallbacks(allow={"aten::tanh.default": "its kernel was removed"}) as ran:
        y = torch.tanh(x.to("tpu"))
    assert ran.fallbacks == {("aten::tanh.default", "no_kernel"): 1}
    torch.testing.assert_close(y.cpu(), torch.tanh(x))


def _run(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_reloading_or_importing_the_device_module_again_keeps_the_device():
    r = _run(
        """
        import importlib, sys
        import torch
        import tpu_kernels.device as d
        x = torch.ones(3, device="tpu")
        importlib.reload(d)
        del sys.modules["tpu_kernels.device"]
        import tpu_kernels.device as again
        from tpu_kernels.testing import no_fallbacks
        with no_fallbacks(kernels=["gelu"]):
            torch.nn.functional.gelu(torch.randn(8, 128, device="tpu"))
        print(again.is_installed(), (x * 2).cpu().tolist(), torch.tpu.is_available())
        """
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "True [2.0, 2.0, 2.0] True"


def test_a_privateuse1_key_another_backend_holds_is_left_alone():
    r = _run(
        """
        import warnings, torch
        torch.utils.rename_privateuse1_backend("other")  # torch loaded no device (TPUK_DEVICE=0)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import tpu_kernels.device as d
        assert not d.is_installed(), "installed over another backend"
        assert any("'other' backend" in str(x.message) for x in w), [str(x.message) for x in w]
        assert "'other' backend" in d.unavailable_reason()
        assert torch._C._get_privateuse1_backend_name() == "other"
        import tpu_kernels as tk
        from tpu_kernels.testing import no_fallbacks
        x = torch.randn(4, 8)
        with tk.substitute("strict"), no_fallbacks(kernels=["gelu"]):
            torch.nn.functional.gelu(x)
        assert tk.report().device is None
        print("left alone")
        """,
        env={"TPUK_DEVICE": "0"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "left alone" in r.stdout


def test_requiring_a_tpu_without_one_is_an_error_naming_libtpus_answer():
    r = _run(
        """
        from tpu_kernels.errors import RuntimeUnavailableError
        try:
            import torch  # loads the device
        except RuntimeError as e:
            assert isinstance(e.__cause__, RuntimeUnavailableError), repr(e.__cause__)
            print("refused:", e.__cause__)
        else:
            raise SystemExit("ran on the CPU plugin although a TPU was required")
        """,
        env={"TPUK_REQUIRE_TPU": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "refused: a TPU is required" in r.stdout
    assert "libtpu" in r.stdout


@pytest.mark.parametrize("backend", ["tpu_kernels", None])
def test_torch_compile_on_the_device_runs_our_programs(backend):
    """`backend="tpu_kernels"` and a plain `torch.compile` (routed to the same backend: Inductor
    has no code generator for the device) both run the lowered programs on device tensors."""
    import torch._dynamo

    torch._dynamo.reset()
    x = torch.randn(8, 16)
    cpu, tpu = _mlp(), _mlp().to("tpu")
    ref = cpu(x)
    ref.pow(2).mean().backward()
    compiled = torch.compile(tpu, backend=backend) if backend else torch.compile(tpu)
    with no_fallbacks(programs=2, kernels=["gelu", "layer_norm", "layer_norm_backward"]):
        y = compiled(x.to("tpu"))
        y.pow(2).mean().backward()
    assert y.device.type == "tpu"
    torch.testing.assert_close(y.detach().cpu(), ref.detach())
    for p, q in zip(tpu.parameters(), cpu.parameters()):
        assert p.grad.device.type == "tpu"
        torch.testing.assert_close(p.grad.cpu(), q.grad)


def _chain(x):
    y = torch.nn.functional.silu(x)
    y = y * 2 + 1
    y = torch.nn.functional.gelu(y)
    return torch.softmax(y, -1)


@pytest.mark.parametrize("mode", ["strict", "debug", "fused"])
def test_substitute_modes_run_on_device_tensors(mode):
    """The context manager keeps working above the device: its kernels read device memory in
    place and their outputs are device tensors."""
    x = torch.randn(64, 64)
    ref = _chain(x)
    expect = {"programs": 1} if mode == "fused" else {}
    xt = x.to("tpu")
    # The fused program runs when the mode exits: the check encloses it.
    with no_fallbacks(kernels=["silu", "gelu", "softmax"], **expect), tk.substitute(mode):
        y = _chain(xt)
    assert y.device.type == "tpu"
    torch.testing.assert_close(y.cpu(), ref)


@pytest.fixture
def device_mode():
    """Restores the device's mode after the test."""
    yield device.set_mode
    device.set_mode("strict")


def test_debug_mode_checks_every_op_on_the_device(device_mode):
    from tpu_kernels.testing import error_policy, inject_fault

    x = torch.tensor([1.0, -1.0, 4.0], device="tpu")
    assert torch.log(x).isnan().sum().item() == 1  # strict: PyTorch's answer, unchecked
    device_mode("debug")
    assert device.get_mode() == "debug"
    with pytest.raises(RuntimeError) as e:
        torch.log(x)
    message = str(e.value)
    assert "tpu debug mode: aten::log.out (no kernel: PyTorch's CPU kernel on the device): output 0 has 1 NaN" in message
    assert f"test_device.py:{e.traceback[0].lineno + 1}" in message, message
    # Inf from finite inputs (log(0)) is meant as often as not: a warning, once per op and line.
    with pytest.warns(RuntimeWarning, match=r"aten::log.out .*2 Inf values from finite inputs \(at .*test_device.py"):
        assert torch.log(torch.zeros(2, device="tpu")).isinf().all()
    # Kernels run and are checked; a model trains as in strict mode.
    cpu, tpu = _mlp(), _mlp().to("tpu")
    xin = torch.randn(8, 16)
    cpu(xin).pow(2).mean().backward()
    with no_fallbacks(kernels=["gelu", "layer_norm", "layer_norm_backward"]):
        tpu(xin.to("tpu")).pow(2).mean().backward()
    for p, q in zip(tpu.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad)
    # A kernel's NaN is caught and names the kernel.
    with inject_fault("nan:gelu"), pytest.raises(RuntimeError, match=r"aten::gelu.default \(kernel gelu\): output 0 has 32 NaN"):
        torch.nn.functional.gelu(torch.randn(4, 8, device="tpu"))
    # A kernel's failure raises in debug mode (it falls back under the "fallback" policy in
    # strict mode), naming the kernel.
    with error_policy("fallback"), inject_fault("run:gelu"):
        with pytest.raises(RuntimeError, match=r"`aten::gelu.default` falls back from kernel `gelu`: execute failed"):
            torch.nn.functional.gelu(torch.randn(4, 8, device="tpu"))
        device_mode("strict")
        y = torch.nn.functional.gelu(torch.randn(4, 8, device="tpu"))
        assert y.shape == (4, 8)


@pytest.mark.parametrize("recorder", ["native", "python"])
def test_fused_mode_on_the_device_stays_one_program(device_mode, recorder):
    """What PyTorch lets CPU tensors do beside device tensors (index tensors of `index`, zero-dim
    scalars), SDPA's question which fused attention the device takes (metadata only) and
    `fill_` / `zero_` on pending values all stay in the trace: one program, flushed once, by the
    sync, with either recorder."""
    from tpu_kernels.torch import report

    def reasons() -> dict:
        return dict(report().device["recorder"]["reasons"] if recorder == "native" else report().fused["reasons"])

    q = torch.randn(2, 4, 8, 16)
    rows, scale = torch.tensor([0, 15, 3]), torch.tensor(0.5)

    def f(q):
        y = torch.nn.functional.scaled_dot_product_attention(q * 2.0, q, q, is_causal=True)
        z = y.reshape(16, 64)[rows] * scale
        w = torch.empty_like(z).fill_(2.0) + z
        return w, torch.zeros_like(w).fill_(3.0), z.clone().zero_()

    ref = f(q)
    qt = q.to("tpu")
    before = reasons()
    with no_fallbacks(programs=1):
        device_mode("fused", recorder=recorder)
        got = f(qt)
        torch.tpu.synchronize()
    device_mode("strict")
    sync = "torch.tpu.synchronize"
    assert reasons() == {**before, sync: before.get(sync, 0) + 1}, reasons()
    for g, r in zip(got, ref):
        assert g.device.type == "tpu"
        torch.testing.assert_close(g.cpu(), r)


def test_fused_mode_on_the_device(device_mode):
    x = torch.randn(64, 64)
    ref = _chain(x)
    xt = x.to("tpu")
    with no_fallbacks(programs=1, kernels=["silu", "gelu", "softmax"]):
        device_mode("fused")
        y = _chain(xt)
        torch.tpu.synchronize()
    device_mode("strict")
    assert y.device.type == "tpu"
    torch.testing.assert_close(y.cpu(), ref)
    with pytest.raises(ValueError, match="mode must be one of 'strict', 'debug', 'fused', not 'fast'"):
        device.set_mode("fast")


def test_the_mode_comes_from_the_environment():
    r = _run(
        """
        import torch
        import tpu_kernels.device as d
        assert d.get_mode() == "debug", d.get_mode()
        try:
            torch.sqrt(torch.tensor([-1.0], device="tpu"))
        except RuntimeError as e:
            print("caught:", str(e).splitlines()[0])
        """,
        env={"TPUK_MODE": "debug"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "caught: tpu debug mode: aten::sqrt.out" in r.stdout


def test_integer_histc_on_the_device_eager_and_compiled():
    """transformers bins integer expert ids with `histc` off the CPU (CUDA's histc takes
    integers, PyTorch's CPU kernel does not): the device counts them, eagerly and compiled."""
    import torch._dynamo

    ids = torch.tensor([0, 3, 1, 2, 2, 3, 3, 1], dtype=torch.int32)
    want = torch.histc(ids.double(), 4, 0, 3).to(torch.int32)
    assert torch.equal(torch.histc(ids.to("tpu"), 4, 0, 3).cpu(), want)
    torch._dynamo.reset()
    f = torch.compile(lambda t: torch.histc(t, 4, 0, 3), backend="tpu_kernels")
    with no_fallbacks(programs=1):
        got = f(ids.to("tpu"))
    assert torch.equal(got.cpu(), want)


def test_sdpa_on_the_device_takes_the_flash_kernels():
    """PyTorch's SDPA asks a device which fused attention it takes: the device answers as the
    CPU does, so the flash kernels run (forward and backward) instead of the math decomposition."""
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref.sum().backward()
    qt, kt, vt = (t.detach().to("tpu").requires_grad_() for t in (q, k, v))
    with no_fallbacks(kernels=["sdpa_flash_cpu", "sdpa_flash_cpu_backward"]):
        out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    for a, b in ((qt, q), (kt, k), (vt, v)):
        torch.testing.assert_close(a.grad.cpu(), b.grad)


def test_autocast_on_the_device():
    """`torch.autocast("tpu")` follows PyTorch's accelerator policy: matmuls in the lower
    precision, softmax in f32."""
    a, b = torch.randn(8, 16, device="tpu"), torch.randn(16, 4, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = a @ b
        s = torch.softmax(y, -1)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32
    ref = (a.cpu().bfloat16() @ b.cpu().bfloat16()).float()
    torch.testing.assert_close(y.float().cpu(), ref, rtol=2e-2, atol=2e-2)


def test_a_device_that_cannot_load_leaves_torch_usable():
    r = _run(
        """
        import sys, warnings
        sys.modules["tpu_kernels._device"] = None  # the shim cannot be imported
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import torch
        assert torch.ones(2).sum().item() == 2
        print([str(x.message) for x in w if "tpu device is not available" in str(x.message)][0])
        """
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "the tpu device is not available: RuntimeUnavailableError: the tpu device's C++ shim" in r.stdout


def test_mse_loss_on_the_device_warns_nothing():
    import warnings

    a = torch.randn(2, 3, 4, 4, requires_grad=True)
    b = torch.randn(2, 3, 4, 4)
    at = a.detach().to("tpu").requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = torch.nn.functional.mse_loss(at, b.to("tpu"))
        loss.backward()
    ref = torch.nn.functional.mse_loss(a, b)
    ref.backward()
    torch.testing.assert_close(loss.detach().cpu(), ref.detach())
    torch.testing.assert_close(at.grad.cpu(), a.grad)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="thread names come from Linux's /proc")
def test_the_autograd_engines_device_thread_starts_no_second_openmp_team():
    # The engine runs the device's backward on its own thread. A parallel CPU kernel there (relu's
    # backward over 65536 floats, through the fallback) must not start an OpenMP team of its own:
    # beside the main thread's, libgomp would throttle every team's spinning for the rest of the
    # process. An OpenMP worker takes its master's name, so a team shows as a second thread named
    # pt_autograd_0. The main thread keeps its thread count.
    r = _run(
        """
        import glob
        import torch
        torch.set_num_threads(2)
        x = torch.randn(256, 256, device="tpu", requires_grad=True)
        (torch.relu(x) * 3).sum().backward()
        assert x.grad.device.type == "tpu"
        names = [open(p).read().strip() for p in glob.glob("/proc/self/task/*/comm")]
        print(names.count("pt_autograd_0"), torch.get_num_threads())
        """
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["1", "2"], r.stdout


def test_the_tpu_compile_backend_is_ours_and_runs_a_static_cache_generation():
    """`torch.compile(backend="tpu")` is this package's backend (torch_tpu would register its
    own). Hugging Face's `generate` with a static cache compiles a decoding step of a model on
    a "tpu" device with that name: the tokens match the CPU's, and the steps ran as programs."""
    from torch._dynamo.backends.registry import lookup_backend
    from tpu_kernels.torch import report
    from tpu_kernels.torch.backend import tpu_kernels_backend

    assert lookup_backend("tpu") is tpu_kernels_backend
    sys.path.insert(0, os.path.dirname(__file__))
    import zoo

    model, batch = zoo.build(zoo.SPECS["llama"])
    model.eval()
    ids = batch["input_ids"][:1, :5]
    ref = model.generate(ids, max_new_tokens=6, do_sample=False)
    before = report().compiled["calls"]
    got = model.to("tpu").generate(ids.to("tpu"), max_new_tokens=6, do_sample=False, cache_implementation="static")
    assert torch.equal(got.cpu(), ref), (got, ref)
    assert report().compiled["calls"] - before >= 5, report().compiled
