"""The torch.compile backend "tpu_kernels": forward and backward ATen graphs as programs."""

import importlib.metadata
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
import tpu_kernels.torch.backend as backend  # noqa: E402
from tpu_kernels.testing import no_fallbacks  # noqa: E402
from tpu_kernels.torch import report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _gpt():
    sys.path.insert(0, str(ROOT / "examples" / "gpt"))
    try:
        import gpt
    finally:
        sys.path.pop(0)
    return gpt


def test_gpt_forward_and_backward_match_eager():
    gpt = _gpt()
    torch.manual_seed(0)
    cfg = gpt.Config(layers=1, dim=32, heads=2, hidden=64, seq=8, vocab=64)
    model = gpt.Gpt(cfg)
    tokens = torch.randint(0, cfg.vocab, (2, cfg.seq))
    targets = torch.randint(0, cfg.vocab, (2, cfg.seq))
    ref = gpt.step(model, model, tokens, targets)
    torch._dynamo.reset()
    n_graphs = len(report().compiled["graphs"])
    compiled = torch.compile(model, backend="tpu_kernels")
    # Every node of the forward and the backward graph runs in their programs, and the kernels
    # inlined there run (counted at run time, not when lowered).
    with no_fallbacks(kernels=["silu", "log_softmax"], programs=2):
        got = gpt.step(model, compiled, tokens, targets)
    assert gpt.compare("compile", ref, got, rtol=1e-4, atol=1e-5)
    graphs = report().compiled["graphs"][n_graphs:]
    names = [g["name"] for g in graphs]
    assert any(n.startswith("forward") for n in names) and any(n.startswith("backward") for n in names)
    kernels = {k for g in graphs for k in g["kernels"]}
    assert {"silu", "log_softmax"} <= kernels


def test_unlowerable_nodes_split_the_graph_and_are_reported():
    def f(x):
        y = torch.sin(x) * 2
        z = torch.median(y, 0).values  # no lowering: runs in PyTorch
        return F.silu(z) + 1

    x = torch.randn(16, 8)
    torch._dynamo.reset()
    # The lowerable runs around median still run as programs (and silu's kernel in them).
    with no_fallbacks(kernels=["silu"], programs=2, allow={"aten::median.dim": "no lowering"}):
        got = torch.compile(f, backend="tpu_kernels")(x)
    torch.testing.assert_close(got, f(x), rtol=1e-5, atol=1e-5)
    eager = report().compiled["eager_nodes"]
    assert "aten::median.dim" in eager


def test_inference_graph():
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    torch._dynamo.reset()
    with torch.no_grad(), no_fallbacks(programs=1) as ran:
        got = torch.compile(lambda t: F.gelu(lin(t)), backend="tpu_kernels")(x)
    torch.testing.assert_close(got, F.gelu(lin(x)), rtol=1e-5, atol=1e-5)
    # addmm + gelu: fused into matmul_bias_act, or gelu's own kernel.
    assert {"matmul_bias_act", "gelu"} & set(ran.kernels), ran.kernels


def test_the_compiled_calls_program_time_is_their_own():
    """`report().compiled["run_time_s"]` is the part of the backend's calls their programs took,
    apart from fused mode's programs (which `graphs["run_time_s"]` also counts): the report's
    "handling arguments and outputs" is the rest of the calls, never negative."""
    from tpu_kernels.torch import substitute

    lin = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    torch._dynamo.reset()
    f = torch.compile(lambda t: F.gelu(lin(t)), backend="tpu_kernels")
    with torch.no_grad():
        f(x)
        before = report()
        for _ in range(3):
            f(x)
        mid = report()
        with substitute("fused"):
            big = torch.randn(256, 512)
            for _ in range(3):
                float((torch.exp(big) * 2.0 + big).sum())
    after = report()
    calls = mid.compiled["calls"] - before.compiled["calls"]
    call_s = mid.compiled["call_time_s"] - before.compiled["call_time_s"]
    run_s = mid.compiled["run_time_s"] - before.compiled["run_time_s"]
    assert calls == 3 and 0 < run_s <= call_s, (calls, run_s, call_s)
    # Fused programs ran: every graph program's time moved, the compiled calls' did not.
    assert after.graphs["run_time_s"] - mid.graphs["run_time_s"] > 0
    assert after.compiled["run_time_s"] == mid.compiled["run_time_s"]
    assert "ms handling arguments and outputs (" in str(after)
    handling = [line for line in str(after).splitlines() if "handling arguments and outputs" in line][0]
    assert " -" not in handling.split("running programs")[1], handling


def test_sdpa_decomposition_pitfall_avoided():
    table = backend.decompositions()
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default not in table
    assert torch.ops.aten.scaled_dot_product_attention.default not in table
    assert torch.ops.aten.silu.default not in table  # a kernel binds it: keep it whole


def test_entry_point_declared():
    text = (ROOT / "pallas_bridge" / "pyproject.toml").read_text()
    assert '[project.entry-points."torch_dynamo_backends"]' in text
    assert 'tpu_kernels = "tpu_kernels.torch.backend:tpu_kernels_backend"' in text
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    if "tpu_kernels" in eps.names:  # installed (maturin develop): the entry point resolves
        assert eps["tpu_kernels"].load() is backend.tpu_kernels_backend
    assert "tpu_kernels" in torch._dynamo.list_backends()


def test_dynamic_shapes_fall_back_to_pytorch():
    def f(x):
        return F.silu(x) * 2

    torch._dynamo.reset()
    g = torch.compile(f, backend="tpu_kernels")
    for n in (8, 9, 10):  # the second shape makes dynamo trace with symbolic sizes
        x = torch.randn(n, 4)
        torch.testing.assert_close(g(x), f(x))


def test_a_constant_the_graph_holds_is_a_program_input():
    """A tensor built in the compiled function is a `get_attr` constant of the graph module: it
    becomes an input of the program, which the whole graph lowers into."""

    def f(x):
        return F.silu(x) * torch.tensor([1.0, -2.0, 0.5])

    x = torch.randn(4, 3)
    torch._dynamo.reset()
    with no_fallbacks(kernels=["silu"], programs=1) as ran:
        got = torch.compile(f, backend="tpu_kernels")(x)
    torch.testing.assert_close(got, f(x))
    assert not ran.pytorch_nodes


def test_a_broadcast_output_keeps_the_graphs_strides():
    """An output the graph gives as an `expand` (stride 0) comes back with those strides, built
    from the program's result (copying into overlapping memory would raise)."""

    def f(x):
        return (x.sin() * 2).sum(0, keepdim=True).expand(4, 3)

    x = torch.randn(5, 3)
    torch._dynamo.reset()
    with no_fallbacks(programs=1):
        got = torch.compile(f, backend="tpu_kernels")(x)
    torch.testing.assert_close(got, f(x))
    assert got.stride() == f(x).stride() == (0, 1)


def test_permuted_layouts_cross_the_program_boundary_without_copies():
    """An output traced in a permuted dense layout comes back as a view of the program's result
    in that layout (the program permutes, no copy in PyTorch), and an input in a permuted layout
    is read in place: the program takes its physical order and permutes inside. A strided input
    the program does not expect is gathered natively, and counted."""

    def gathered():
        return report().graphs.get("inputs_gathered", 0)

    def f(x):
        return (x.transpose(0, 2) * 2).exp()  # elementwise on a view: the output keeps its strides

    x = torch.randn(3, 4, 5)
    torch._dynamo.reset()
    with no_fallbacks(programs=1):
        got = torch.compile(f, backend="tpu_kernels")(x)
    want = f(x)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride() == (1, 5, 20)

    def g(y):
        return y * 3 + 1

    torch._dynamo.reset()
    y = torch.randn(6, 7).t()  # a transposed input
    before = gathered()
    with no_fallbacks(programs=1):
        got = torch.compile(g, backend="tpu_kernels")(y)
    torch.testing.assert_close(got, g(y))
    assert got.stride() == g(y).stride()
    assert gathered() == before, "the transposed input was copied, not read in place"

    # A slice with a step: no dense order reads it, the native run gathers it.
    z = torch.randn(8, 10)[:, ::2]
    torch._dynamo.reset()
    with no_fallbacks(programs=1):
        got = torch.compile(g, backend="tpu_kernels")(z)
    torch.testing.assert_close(got, g(z))
    assert gathered() == before + 1

    # A graph whose inputs and outputs are all row-major is lowered as it is.
    gm = torch.fx.symbolic_trace(lambda a: a + 1)
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "call_function"):
            n.meta["val"] = torch.empty(2, 3)
    assert backend._boundary(gm)[0] is gm


def _saved_by_forward(fn, *args):
    """Runs `fn` compiled (forward and backward, both as programs) and returns the tensors its
    forward saved for the backward, with the inputs' gradients."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tpu_kernels")
    with no_fallbacks(programs=2):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = compiled(*args)
        loss.backward()
    grads = [a.grad for a in args]
    for a in args:
        a.grad = None
    return saved, grads


def test_the_backward_recomputes_cheap_values_and_takes_transcendental_ones_saved():
    """The joint graph is split by min-cut: the backward redoes cheap pointwise work from the
    inputs instead of taking its intermediates from the forward, but an `exp` (compute on
    XLA:CPU, not memory) is saved, never redone."""
    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(64, 32, requires_grad=True)

    def cheap(x, w):
        return ((x * w + 1).relu() * 3).sum()

    def costly(x, w):
        return torch.exp(x * w + 1).sum()

    for fn in (cheap, costly):
        saved, grads = _saved_by_forward(fn, x, w)
        loss = fn(x, w)
        want = torch.autograd.grad(loss, [x, w])
        for g_, w_ in zip(grads, want):
            torch.testing.assert_close(g_, w_)
        inputs = {x.data_ptr(), w.data_ptr()}
        computed = [t for t in saved if t.data_ptr() not in inputs]
        if fn is cheap:
            # The default partition saves `x * w + 1` (or its relu) for the backward.
            assert computed == [], [tuple(t.shape) for t in computed]
        else:
            expected = torch.exp(x * w + 1).detach()
            assert any(t.shape == expected.shape and torch.allclose(t, expected) for t in computed), [
                tuple(t.shape) for t in saved
            ]


def test_a_large_program_is_tuned_over_compile_settings_on_its_first_runs(monkeypatch):
    """A program that reads and writes at least `TPUK_TUNE_MIN_BYTES` a run is compiled with
    and without XLA:CPU's YNNPACK reduction fusions; its first runs take turns, two timed runs
    each, and the one with the fastest run runs from then on. Every run matches eager,
    whichever variant ran."""
    monkeypatch.setenv("TPUK_TUNE_MIN_BYTES", str(1 << 20))
    torch.manual_seed(0)
    # f32[96, 3001]: 1.15 MB, a shape no other test compiles (programs are memoised by graph).
    x = torch.randn(96, 3001, requires_grad=True)
    t = torch.randint(0, 3001, (96,))

    def f(x, t):
        return F.cross_entropy(x, t)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="tpu_kernels")
    n_graphs = len(report().compiled["graphs"])
    tuned_before = report().graphs["programs_tuned"]
    with no_fallbacks(programs=12):
        for _ in range(6):
            x.grad = None
            loss = compiled(x, t)
            loss.backward()
            ref = x.detach().clone().requires_grad_(True)
            want = F.cross_entropy(ref, t)
            want.backward()
            torch.testing.assert_close(loss, want)
            torch.testing.assert_close(x.grad, ref.grad)
    graphs = report().graphs
    names = [g["name"] for g in report().compiled["graphs"][n_graphs:]]
    assert graphs["programs_tuned"] - tuned_before == 2, names
    for name in names:
        seen = graphs["tuned"][name]
        fastest = seen["fastest_s"]
        assert set(fastest) == {"default", "ynn_reduce_off"}, seen
        assert all(s is not None and s > 0 for s in fastest.values()), seen
        assert seen["chosen"] == min(fastest, key=fastest.get) and seen["failed"] == [], seen


def test_tuning_is_off_below_its_size_and_when_turned_off(monkeypatch):
    before = report().graphs["programs_tuned"]
    # Shapes of their own: a program is memoised by its graph, so each setting compiles anew.
    for setting, cols in (("off", 1001), (str(1 << 40), 1003)):
        monkeypatch.setenv("TPUK_TUNE_MIN_BYTES", setting)
        x = torch.randn(64, cols)
        torch._dynamo.reset()
        with no_fallbacks(programs=1):
            got = torch.compile(lambda x: F.log_softmax(x * 2, -1), backend="tpu_kernels")(x)
        torch.testing.assert_close(got, F.log_softmax(x * 2, -1))
    assert report().graphs["programs_tuned"] == before


def test_inputs_and_repeats_among_the_outputs_are_not_program_outputs():
    """A graph output that is a graph input (AOT's forward returns the parameters the backward
    saves) is the argument itself, a repeated output the same tensor, and a large view of an
    input or of another output that view made again: none is a program output, which XLA
    would copy into a fresh buffer. A small view is cheaper to copy than to remake."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, y, small):
        z = F.silu(y) * 2
        return x, z, z, x.t().unsqueeze(0), z.view(-1), small.t()

    # 512 x 256 f32: 512 KiB, above the remaking threshold.
    x, y, small = torch.randn(512, 256), torch.randn(512, 256), torch.randn(4, 3)
    torch._dynamo.reset()
    with no_fallbacks(kernels=["silu"], programs=1):
        got = torch.compile(f, backend="tpu_kernels")(x, y, small)
    want = f(x, y, small)
    assert got[0] is x
    assert got[1] is got[2]
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_, w)
        assert g_.stride() == w.stride()

    gm = make_fx(f)(x, y, small)
    work, _, out_perms, sources = backend._boundary(gm)
    assert sources == [
        ("arg", 0), ("out", 0), ("same", 1), ("view", 0, [("t", ()), ("unsqueeze", (0,))]),
        ("view_of", 1, [("view", ([-1],))]), ("out", 1),
    ]
    assert len(out_perms) == 2
    program_outputs = [r for r in next(n for n in work.graph.nodes if n.op == "output").args[0] if r is not None]
    assert len(program_outputs) == 2
