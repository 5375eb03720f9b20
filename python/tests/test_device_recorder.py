"""The "tpu" device's native fused recorder (`set_mode("fused", recorder="native")`): calls are
recorded in Rust at the device's key and run as one program at each materialisation point.

Each test checks that the recorder took the calls (its counters, and the device's fallback
counters unchanged), not only the values: PyTorch's CPU kernels on the device would give the same
numbers."""

from __future__ import annotations

import contextlib
import gc
import os
import sys

import pytest

torch = pytest.importorskip("torch")

import tpu_kernels.device as device  # noqa: E402
from tpu_kernels import _native  # noqa: E402
from tpu_kernels.testing import inject_fault, no_fallbacks  # noqa: E402
from tpu_kernels.torch import report  # noqa: E402

if not device.is_installed():
    pytest.skip(f"the tpu device is not installed: {device.unavailable_reason()}", allow_module_level=True)

F = torch.nn.functional


@pytest.fixture
def native():
    """Fused mode with the native recorder for the test; strict afterwards."""
    device.set_mode("fused", recorder="native")
    yield
    device.set_mode("strict")


def _rec() -> dict:
    return dict(_native.device_stats()["recorder"])


def _fell_back() -> dict:
    return dict(_native.device_stats()["fallbacks"])


def _delta(before: dict, after: dict, *keys: str) -> dict:
    return {k: after[k] - before[k] for k in keys}


def _chain(x, w, n=10):
    for i in range(n):
        x = F.silu(x) if i % 2 == 0 else x * w
    return x


def test_a_chain_runs_as_one_program_writing_only_what_is_held(native):
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    ref = _chain(x, w)
    xt, wt = x.to("tpu"), w.to("tpu")
    before, fell = _rec(), _fell_back()
    with no_fallbacks(programs=1, kernels=["silu"]):
        y = _chain(xt, wt)
        assert _rec()["pending"] == 10
        torch.tpu.synchronize()
    d = _delta(before, _rec(), "recorded", "programs_run", "outputs_written", "flushes")
    # Ten calls, one program, and only the result written: the nine intermediates nobody holds
    # never reach memory.
    assert d == {"recorded": 10, "programs_run": 1, "outputs_written": 1, "flushes": 1}, d
    assert _fell_back() == fell
    device.set_mode("strict")
    torch.testing.assert_close(y.cpu(), ref)


def test_a_repeated_step_is_a_trace_cache_hit_and_compiles_nothing(native):
    x, w = torch.randn(8, 32).to("tpu"), torch.randn(8, 32).to("tpu")
    y = _chain(x, w, 6)
    torch.tpu.synchronize()
    before, compiled = _rec(), report().graphs["compiled"]
    for _ in range(3):
        y = _chain(x, w, 6)
        torch.tpu.synchronize()
    d = _delta(before, _rec(), "hits", "misses", "meta_runs", "signatures")
    assert d == {"hits": 3, "misses": 0, "meta_runs": 0, "signatures": 0}, d
    assert report().graphs["compiled"] == compiled
    # A different trace (another batch size) is an entry of its own.
    y2 = _chain(torch.randn(4, 32).to("tpu"), torch.randn(4, 32).to("tpu"), 6)
    torch.tpu.synchronize()
    assert _rec()["misses"] == before["misses"] + 1
    assert y.shape == (8, 32) and y2.shape == (4, 32)


def test_floats_that_change_every_step_are_program_inputs(native):
    """An optimizer's bias correction changes every step: those floats are lifted into program
    inputs, so the steps share one program."""
    x = torch.randn(64)
    xt = x.to("tpu")
    outs = []
    y = xt * 0.5 + 1.25
    torch.tpu.synchronize()
    before = _rec()
    for step in range(1, 5):
        scale = 1.0 / (1.0 - 0.9**step)
        outs.append((xt * scale).add(xt, alpha=-scale / 3))
        torch.tpu.synchronize()
    d = _delta(before, _rec(), "hits", "misses")
    assert d["misses"] <= 1 and d["hits"] >= 3, d
    device.set_mode("strict")
    for step, o in enumerate(outs, start=1):
        scale = 1.0 / (1.0 - 0.9**step)
        torch.testing.assert_close(o.cpu(), (x * scale).add(x, alpha=-scale / 3))
    torch.testing.assert_close(y.cpu(), x * 0.5 + 1.25)


def test_lifted_floats_keep_their_views_from_step_to_step(native):
    """A lifted float's bytes sit where the last step's did, so a repeated step makes no new PJRT
    view of its inputs (each would cost as much as copying a small input)."""
    x = torch.randn(64)
    xt = x.to("tpu")

    def step(k):
        scale = 1.0 / (1.0 - 0.9**k)
        return (xt * scale).add(xt, alpha=-scale / 3) / (k + 0.5)

    held = []
    for k in (1, 2):
        held.append(step(k))  # held, so that the step runs a program
        torch.tpu.synchronize()
    before, views = _rec(), report().graphs["view_misses"]
    outs = []
    for k in range(3, 8):
        outs.append(step(k))
        torch.tpu.synchronize()
    d = _delta(before, _rec(), "hits", "programs_run", "replays")
    assert d == {"hits": 5, "programs_run": 5, "replays": 0}, d
    assert report().graphs["view_misses"] == views
    device.set_mode("strict")
    for k, o in enumerate(outs, start=3):
        scale = 1.0 / (1.0 - 0.9**k)
        torch.testing.assert_close(o.cpu(), (x * scale).add(x, alpha=-scale / 3) / (k + 0.5))


def test_values_written_over_their_inputs_are_updated_in_place(native):
    """An optimizer's update: each parameter is read and its new value written back over it.
    The program writes it there itself (the input donated), not into a buffer of its own that
    is copied back after the run."""
    ps = [torch.randn(32, 16) for _ in range(3)]
    gs = [torch.randn(32, 16) for _ in range(3)]
    pt, gt = [p.to("tpu") for p in ps], [g.to("tpu") for g in gs]

    def step(params, grads):
        for p, g in zip(params, grads):
            p.mul_(0.9).add_(g, alpha=-0.1)

    def counts():
        g = report().graphs
        return g["inputs_updated_in_place"], g["inputs_updated_by_copy"]

    step(pt, gt)
    torch.tpu.synchronize()
    before, (in_place, by_copy) = _rec(), counts()
    for _ in range(2):
        step(pt, gt)
        torch.tpu.synchronize()
    d = _delta(before, _rec(), "programs_run", "hits", "replays")
    assert d == {"programs_run": 2, "hits": 2, "replays": 0}, d
    assert counts() == (in_place + 6, by_copy), (counts(), in_place, by_copy)
    device.set_mode("strict")
    for _ in range(3):
        step(ps, gs)
    for got, want in zip(pt, ps):
        torch.testing.assert_close(got.cpu(), want)


def test_in_place_and_out_calls_are_recorded_into_their_tensors(native):
    x, w = torch.randn(6, 6), torch.randn(6, 6)
    xt, wt = x.to("tpu"), w.to("tpu")
    fell = _fell_back()
    before = _rec()
    a = xt * 1.0
    view = a.view(36)
    a.add_(1.0).mul_(wt)
    out = torch.empty(6, 6, device="tpu")
    torch.mul(a, 2.0, out=out)
    wt.sub_(0.5)  # an input updated in place after a call read it
    assert _rec()["pending"] > 0
    torch.tpu.synchronize()
    assert _delta(before, _rec(), "programs_run")["programs_run"] == 1
    assert _fell_back() == fell
    device.set_mode("strict")
    ra = (x * 1.0 + 1.0) * w
    torch.testing.assert_close(a.cpu(), ra)
    torch.testing.assert_close(view.cpu(), ra.view(36))
    torch.testing.assert_close(out.cpu(), ra * 2.0)
    torch.testing.assert_close(wt.cpu(), w - 0.5)


def test_views_of_pending_values_stay_in_the_trace(native):
    """Transposes, slices, broadcasts of recorded values and writes into a slice of one are
    graph nodes: one program."""
    x = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(0))
    xt = x.to("tpu")

    def f(x):
        y = x * 2.0
        a = y.transpose(1, 2) * 3.0  # a permuted view
        half = y[..., :8] - y[..., 8:]  # slices
        b = (y * y).sum(-1, keepdim=True) + 1.0  # away from 0: a quotient keeps the sum's rounding
        c = y / b.expand(4, 8, 16)  # a broadcast view
        z = torch.zeros(4, 8, 16, device=x.device)
        z[..., 4:12] = half  # a write into a slice of a pending value
        return a.contiguous(), half, c, z

    ref = f(x)
    before, fell = _rec(), _fell_back()
    got = f(xt)
    torch.tpu.synchronize()
    d = _delta(before, _rec(), "programs_run", "flushes")
    assert d == {"programs_run": 1, "flushes": 1}, (d, _rec()["reasons"], _rec()["declined"])
    assert _fell_back() == fell
    device.set_mode("strict")
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.cpu(), r)


def test_materialisation_points_run_the_trace_first(native):
    x = torch.randn(5, 5)
    xt = x.to("tpu")
    reasons = dict(_rec()["reasons"])
    y = torch.exp(xt) + 1.0
    assert y.sum().item() == pytest.approx((torch.exp(x) + 1.0).sum().item(), rel=1e-5)  # `.item()`
    z = torch.exp(xt) * 2.0
    torch.testing.assert_close(z.cpu(), torch.exp(x) * 2.0)  # a copy to the host
    w = torch.exp(xt) - 3.0
    nz = torch.nonzero(w > 0)  # a call the recorder declines (data-dependent shape) runs the trace first
    after = _rec()["reasons"]
    for reason in ("item", "copy"):
        assert after.get(reason, 0) > reasons.get(reason, 0), (reason, after)
    assert any(k.startswith("aten::nonzero") for k in after), after
    device.set_mode("strict")
    torch.testing.assert_close(nz.cpu(), torch.nonzero(torch.exp(x) - 3.0 > 0))


def _in_one_program(f, *inputs, fallbacks_too=True):
    """Runs `f` on the device's copies of `inputs` under the native recorder and checks that it
    ran as one program with one flush, no call left to PyTorch, and PyTorch's values."""
    ref = f(*inputs)
    moved = [x.to("tpu") for x in inputs]
    torch.tpu.synchronize()
    before, fell = _rec(), _fell_back()
    got = f(*moved)
    torch.tpu.synchronize()
    d = _delta(before, _rec(), "programs_run", "flushes")
    assert d == {"programs_run": 1, "flushes": 1}, (d, _rec()["reasons"], _rec()["declined"])
    if fallbacks_too:
        assert _fell_back() == fell
    device.set_mode("strict")
    pairs = zip(got, ref) if isinstance(ref, tuple) else [(got, ref)]
    for g_, r in pairs:
        torch.testing.assert_close(g_.cpu(), r)


def _lists(x, idx):
    """Ops that take tensor lists: `Tensor[]` (cat, stack) and `Tensor?[]` (index, index_put_)."""
    y = x * 2.0
    half = y.shape[-1] // 2
    rotated = torch.cat((-y[..., half:], y[..., :half]), dim=-1)  # RoPE's rotate_half
    stacked = torch.stack([y, rotated, y + 1.0], dim=1)
    picked = y[idx] * 3.0
    z = y * 1.0
    z[idx] = rotated[idx]
    return rotated, stacked, picked, z


def test_tensor_list_calls_stay_in_the_trace(native):
    g = torch.Generator().manual_seed(0)
    _in_one_program(_lists, torch.randn(6, 8, generator=g), torch.tensor([4, 0, 2]))


def _empty_cache_step(x):
    """What a KV cache does on its first step: an empty tensor made on the device (a copy from
    the host), zeroed, and concatenated with the first keys."""
    cache = torch.tensor([], dtype=x.dtype, device=x.device)
    zeros = torch.zeros(0, 8, dtype=x.dtype, device=x.device)
    zeros.zero_()
    k = x * 2.0
    cache = torch.cat([cache, k], dim=-2)
    both = torch.cat([zeros, k, zeros], dim=0)
    return cache + 1.0, both * 3.0


def test_tensors_with_no_elements_do_not_split_the_trace(native):
    # The empty tensors' own calls (a copy, `zero_`) run on PyTorch, without a flush.
    _in_one_program(_empty_cache_step, torch.randn(4, 8), fallbacks_too=False)


def test_an_empty_entry_that_does_not_fit_is_still_pytorchs_error(native):
    x = torch.randn(3, 5, 4).to("tpu")
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        torch.cat([torch.empty(2, 0, 4, device="tpu"), x * 2.0], dim=0)
    torch.tpu.synchronize()


def _written_whole(x):
    """Writes into all of a pending value through a view of another shape, and of another dim
    order (channels-last)."""
    y = x * 2.0
    y.view(2, 4, 4).add_(1.0)
    z = (x + 1.0).reshape(2, 4, 4)
    torch.sub(x.reshape(2, 4, 4).transpose(1, 2), 3.0, out=z.transpose(1, 2))
    return y * 1.0, z * 1.0


def test_writes_into_all_of_a_pending_value_through_a_view_stay_in_the_trace(native):
    _in_one_program(_written_whole, torch.randn(8, 4))


def test_a_trace_whose_shapes_keep_changing_stops_compiling_at_the_recompile_limit(native):
    """A mixture of experts gives each expert a new token count every step: past the limit (8
    programs for one trace structure), a miss replays on PyTorch instead of compiling, counted
    as a declined fallback with its reason; shapes compiled before still run their programs."""
    limit = _rec()["recompile_limit"]
    assert limit == int(os.environ.get("TPUK_FUSED_RECOMPILE_LIMIT", "8"))

    def f(x):
        return torch.tanh(x) * 3.0 - torch.exp(x * 0.25)

    before = _rec()
    fb = report().ops.get("tpu_fused_native", {}).get("fallbacks", {}).get("recompile_limit", 0)
    for rows in range(1, limit + 4):
        x = torch.randn(rows, 5)
        got = f(x.to("tpu")).cpu()
        torch.testing.assert_close(got, f(x))
    d = _delta(before, _rec(), "misses", "limit_replays", "replays")
    assert d == {"misses": limit, "limit_replays": 3, "replays": 0}, d
    assert "recompile limit" in _rec()["last_limit"]
    assert report().ops["tpu_fused_native"]["fallbacks"]["recompile_limit"] == fb + 3
    # A shape compiled before is still a hit.
    before = _rec()
    x = torch.randn(2, 5)
    torch.testing.assert_close(f(x.to("tpu")).cpu(), f(x))
    assert _delta(before, _rec(), "hits", "limit_replays") == {"hits": 1, "limit_replays": 0}


def _temporaries(x):
    """A chain whose every result dies at the next call, each `mul.out` into memory PyTorch
    allocates on the device, not a placeholder."""
    for _ in range(24):
        x = torch.mul(x, 1.01, out=torch.empty_like(x))
    return x


def _peaks(f, x, *keys):
    """`f(x)` in strict mode, then under the native recorder: the device's peak bytes above
    where each started, each mode's result on the CPU, and the recorder's counters `keys`
    over the native run."""
    peaks, results, counted = {}, {}, {}
    for mode in ("strict", "native"):
        if mode == "native":
            device.set_mode("fused", recorder="native")
        try:
            torch.tpu.synchronize()
            base = torch.tpu.memory_allocated()
            torch.tpu.reset_peak_memory_stats()
            before = _rec()
            y = f(x)
            torch.tpu.synchronize()
            peaks[mode] = torch.tpu.max_memory_allocated() - base
            if mode == "native":
                counted = _delta(before, _rec(), *keys)
        finally:
            device.set_mode("strict")
        results[mode] = y.cpu()
        del y
    return peaks, results, counted


def test_a_trace_gives_back_the_memory_of_results_that_die_as_strict_mode_does():
    x = torch.randn(128, 256).to("tpu")  # 128 KiB a result
    peaks, _, counted = _peaks(_temporaries, x, "recorded", "programs_run")
    assert counted == {"recorded": 24, "programs_run": 1}
    # Strict holds two results at a time; a trace that kept every dead result's memory until
    # the flush would hold all 24.
    assert peaks["native"] <= peaks["strict"], peaks


def _overwritten(x):
    """Fresh device tensors whose old bytes are never read: each is zeroed, filled or copied
    into (`torch.zeros_like` reaches the device as `empty_like` then `zero_`), read once, and
    dies at the next call, as the autograd engine's gradient buffers do."""
    acc = x * 1.0
    for i in range(8):
        z = torch.empty_like(x)
        if i % 3 == 0:
            z.zero_()
        elif i % 3 == 1:
            z.fill_(0.5)
        else:
            z.copy_(acc)
        acc = acc * 1.01 + z
        del z
    return acc


def test_memory_only_overwritten_is_no_program_input_and_goes_back_at_once():
    x = torch.randn(128, 256)
    peaks, results, counted = _peaks(_overwritten, x.to("tpu"), "recorded", "programs_run", "flushes")
    assert counted == {"recorded": 25, "programs_run": 1, "flushes": 1}, _rec()["declined"]
    for got in results.values():
        torch.testing.assert_close(got, _overwritten(x))
    # Had the zeroed, filled or copied-into tensors been program inputs, their frees would
    # wait for the flush: 8 blocks of 128 KiB held instead of strict's one or two.
    assert peaks["native"] <= peaks["strict"], peaks


def test_a_replayed_trace_gives_overwritten_memory_scratch_of_its_own(native):
    """A failed program replays on PyTorch: a call whose destination was freed and reused
    meanwhile gets scratch memory, and every value still comes out right."""
    x = torch.randn(64, 32)
    xt = x.to("tpu")
    torch.tpu.synchronize()
    with inject_fault("run"):
        before = _rec()
        y = _overwritten(xt)
        torch.tpu.synchronize()
        assert _delta(before, _rec(), "replays", "programs_run") == {"replays": 1, "programs_run": 0}
    device.set_mode("strict")
    torch.testing.assert_close(y.cpu(), _overwritten(x))


def _mask_branch(x, mask):
    """A transformers attention mask's check: `.all()` of an integer mask drives Python control
    flow in the middle of a step."""
    y = x * 2.0
    if torch.all(mask == 1):
        y = y + 1.0
    else:
        y = y.masked_fill(mask == 0, -5.0)
    return y * 3.0


@pytest.mark.parametrize("all_ones", [True, False])
def test_an_exact_scalar_read_is_answered_without_ending_the_trace(native, all_ones):
    x = torch.randn(4, 6)
    mask = torch.ones(4, 6, dtype=torch.int64)
    if not all_ones:
        mask[1, 2] = 0
    before = _rec()
    _in_one_program(_mask_branch, x, mask)
    d = _delta(before, _rec(), "scalar_reads", "scalar_read_calls")
    # The second call ran on the device: `mask == 1` and `all`, replayed on PyTorch.
    assert d == {"scalar_reads": 1, "scalar_read_calls": 2}, d


def test_a_scalar_read_of_unwritten_memory_reads_it_and_a_float_one_flushes(native):
    xt = torch.arange(6.0).reshape(2, 3).to("tpu")
    n = torch.tensor(4, dtype=torch.int64).to("tpu")
    torch.tpu.synchronize()
    before = _rec()
    y = xt * 2.0
    assert int(n) == 4  # memory no recorded call writes: read as it is
    d = _delta(before, _rec(), "scalar_reads", "scalar_read_calls", "flushes")
    assert d == {"scalar_reads": 1, "scalar_read_calls": 0, "flushes": 0}, d
    assert float(y.sum()) == 30.0  # a float computed by the trace: the trace runs first
    d = _delta(before, _rec(), "scalar_reads", "flushes", "programs_run")
    assert d == {"scalar_reads": 1, "flushes": 1, "programs_run": 1}, d


@pytest.mark.parametrize("fails", [False, True])
def test_cpu_indices_of_a_device_tensor_stay_in_the_trace_as_they_were(native, fails):
    """DLRM's interaction: a device tensor indexed, read and written, by integer index tensors
    on the CPU (PyTorch allows it, as CUDA does). The indices are the call's: changing them
    before the flush changes nothing recorded, in the program or in its replay on PyTorch."""
    x = torch.randn(3, 5, 5)
    pairs = torch.triu_indices(5, 5, offset=1)
    rows = torch.tensor([0, 2])

    def f(x, pairs, rows):
        y = x * 2.0
        dots = y[:, pairs[0], pairs[1]]
        y[rows] = y[rows] + 1.0  # index_put_ with CPU indices into a pending value
        return dots * 3.0, y - 1.0

    ref = f(x, pairs, rows)
    xt = x.to("tpu")
    torch.tpu.synchronize()
    before, fell = _rec(), _fell_back()
    p, r_ = pairs.clone(), rows.clone()
    with inject_fault("run") if fails else contextlib.nullcontext():
        got = f(xt, p, r_)
        p.zero_()  # the CPU indices change before the trace runs
        r_.fill_(1)
        torch.tpu.synchronize()
    d = _delta(before, _rec(), "programs_run", "replays", "flushes")
    want = {"programs_run": 0 if fails else 1, "replays": int(fails), "flushes": 1}
    assert d == want, (d, _rec()["reasons"], _rec()["declined"])
    if not fails:
        assert _fell_back() == fell
    device.set_mode("strict")
    for g_, w in zip(got, ref):
        torch.testing.assert_close(g_.cpu(), w)


def test_cpu_indices_outside_an_index_list_keep_pytorchs_device_error(native):
    xt = torch.randn(4).to("tpu")
    with pytest.raises(RuntimeError, match="device"):
        torch.cat([xt, torch.ones(4, dtype=torch.int64)])
    with pytest.raises(RuntimeError, match="device"):
        xt + torch.ones(4)


def test_outputs_and_arguments_with_no_elements_stay_in_the_trace(native):
    """An embedding bag in sum mode: PyTorch's CPU kernel returns empty `offset2bag` and
    `max_indices`, which its backward takes again. Forward and backward run as one program."""
    w = torch.randn(16, 4)
    idx = torch.tensor([1, 5, 7, 7, 2, 0])
    offs = torch.tensor([0, 2, 5])

    def step(w, idx, offs):
        w = w.detach().requires_grad_()
        F.embedding_bag(idx, w, offs, mode="sum").mul(torch.arange(4.0, device=w.device)).sum().backward()
        return w.grad

    ref = step(w, idx, offs)
    moved = [t.to("tpu") for t in (w, idx, offs)]
    torch.tpu.synchronize()
    before, fell = _rec(), _fell_back()
    got = step(*moved)
    torch.tpu.synchronize()
    d = _delta(before, _rec(), "programs_run", "flushes")
    assert d == {"programs_run": 1, "flushes": 1}, (d, _rec()["reasons"], _rec()["declined"])
    assert _fell_back() == fell
    device.set_mode("strict")
    torch.testing.assert_close(got.cpu(), ref)


def test_a_histogram_of_integers_stays_in_the_trace(native):
    """Mixtral's load-balancing loss: `histc` of int32 expert ids, which CUDA takes and
    PyTorch's CPU kernel does not (the device's strict mode counts them in f64)."""
    x = torch.rand(6, 5)
    ids = (x * 4).floor().to(torch.int32)
    want = (torch.histc(ids.double(), bins=4, min=0, max=4).to(torch.int32) + 1) * 2
    xt = x.to("tpu")
    torch.tpu.synchronize()
    before, fell = _rec(), _fell_back()
    got = (torch.histc((xt * 4).floor().to(torch.int32), bins=4, min=0, max=4) + 1) * 2
    torch.tpu.synchronize()
    d = _delta(before, _rec(), "programs_run", "flushes")
    assert d == {"programs_run": 1, "flushes": 1}, (d, _rec()["reasons"], _rec()["declined"])
    assert _fell_back() == fell
    device.set_mode("strict")
    assert got.dtype == torch.int32
    assert torch.equal(got.cpu(), want)


def _experts(x, w, ids):
    """A mixture-of-experts layer's grouped matmul: rows sorted by expert, the group ends from a
    histogram of the expert ids (pending values, not read on the host)."""
    offs = torch.cumsum(torch.histc(ids, bins=w.shape[0], min=0, max=w.shape[0]), 0).to(torch.int32)
    y = torch._grouped_mm(x, w, offs)
    return (y * y).sum()


def test_a_grouped_matmul_and_its_gradients_stay_in_the_trace(native):
    """PyTorch's composite `_grouped_mm` reads the group offsets on the host and writes a product
    per group into rows of its output; the device records it as itself instead, forward and
    backward (both of its backward forms), in one program."""
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(12, 8, generator=gen), torch.randn(3, 8, 12, generator=gen)
    ids = torch.tensor([0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2], dtype=torch.int32)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    want = _experts(xc, wc, ids.double())
    want.backward()
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    idt = ids.to("tpu")
    torch.tpu.synchronize()
    before, fell = _rec(), _fell_back()
    got = _experts(xt, wt, idt)
    got.backward()
    torch.tpu.synchronize()
    d = _delta(before, _rec(), "programs_run", "flushes")
    assert d == {"programs_run": 1, "flushes": 1}, (d, _rec()["reasons"], _rec()["declined"])
    assert _fell_back() == fell
    device.set_mode("strict")
    torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, rtol=1e-5, atol=1e-4)


def test_a_grouped_matmul_the_lowering_declines_runs_the_composite_kernel(native):
    """A form with no lowering (a 3-D input by a 2-D weight) is declined, with the lowering's
    reason, and PyTorch's composite kernel computes it on the device."""
    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(2, 4, 8, generator=gen), torch.randn(8, 16, generator=gen)
    offs = torch.tensor([8, 16], dtype=torch.int32)
    want = torch._grouped_mm(x, w, offs)
    got = torch._grouped_mm(x.to("tpu"), w.to("tpu"), offs.to("tpu"))
    torch.tpu.synchronize()
    count, reason = _rec()["declined"]["aten::_grouped_mm.default"]
    assert count >= 1 and "has no lowering" in reason, reason
    device.set_mode("strict")
    torch.testing.assert_close(got.cpu(), want)


def _positions(x):
    """T5's relative positions: `arange` (PyTorch hands it to the device as `arange.start_out`
    into an empty tensor) and `abs` into an empty out= tensor, then float ramps."""
    pos = torch.arange(2, 2 + x.shape[0], device=x.device)
    rel = torch.abs(pos[:, None] - pos[None, :])
    ramp = torch.arange(0.0, 1.0, 0.125, device=x.device)
    return x * 2.0 + rel.float() + ramp


def test_arange_and_empty_out_tensors_stay_in_the_trace(native):
    _in_one_program(_positions, torch.randn(8, 8))


def _split_view(x):
    """A vision transformer's patch tokens back to an image: a slice of a pending value, its
    dims transposed, one of them split (strides [136, 1, 32, 8], offset 8)."""
    y = x * 2.0
    img = y[:, 1:, :].transpose(1, 2).reshape(2, 8, 4, 4)
    return img * 3.0 + 1.0


def test_a_slice_of_a_pending_value_split_and_permuted_stays_in_the_trace(native):
    _in_one_program(_split_view, torch.randn(2, 17, 8))


def _keyword_only(x, a, b):
    """Ops whose keyword-only arguments change the result: the recorder gives every argument in
    schema order, so a lowering that read them only as keywords would take the defaults."""
    v, m = torch.var_mean(x, dim=1, correction=0, keepdim=True)
    return v, m, torch.var(x, dim=0, correction=2), torch.addmm(x, a, b, beta=0.5, alpha=-2.0)


def test_keyword_only_arguments_reach_the_lowering(native):
    g = torch.Generator().manual_seed(2)
    x, a, b = (torch.randn(5, 7, generator=g), torch.randn(5, 3, generator=g), torch.randn(3, 7, generator=g))
    ref = _keyword_only(x, a, b)
    xt, at, bt = x.to("tpu"), a.to("tpu"), b.to("tpu")
    before, fell = _rec(), _fell_back()
    got = _keyword_only(xt, at, bt)
    torch.tpu.synchronize()
    d = _delta(before, _rec(), "recorded", "programs_run")
    assert d == {"recorded": 3, "programs_run": 1}, (d, _rec()["declined"])
    assert _fell_back() == fell
    device.set_mode("strict")
    for g_, r in zip(got, ref):
        torch.testing.assert_close(g_.cpu(), r)


def test_tensor_list_calls_replay_on_pytorch_when_their_program_fails(native):
    g = torch.Generator().manual_seed(1)
    x, idx = torch.randn(4, 6, generator=g), torch.tensor([3, 1])
    ref = _lists(x, idx)
    xt, it = x.to("tpu"), idx.to("tpu")
    with inject_fault("run"):
        before = _rec()
        got = _lists(xt, it)
        torch.tpu.synchronize()
        d = _delta(before, _rec(), "replays", "programs_run")
        assert d == {"replays": 1, "programs_run": 0}, d
    device.set_mode("strict")
    for g_, r in zip(got, ref):
        torch.testing.assert_close(g_.cpu(), r)


def test_batch_norm_and_bias_less_convolutions_train_in_one_program(native):
    """A conv without bias and a training batch norm: forward, backward, and the running
    statistics written in place, all recorded (no fallback, one program per materialisation)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU()
    )
    x = torch.randn(2, 3, 8, 8)
    ref_net = __import__("copy").deepcopy(net)
    ref_loss = ref_net(x).square().mean()
    ref_loss.backward()
    dev = net.to("tpu")
    before, fell = _rec(), _fell_back()
    loss = dev(x.to("tpu")).square().mean()
    loss.backward()
    torch.tpu.synchronize()
    d = _delta(before, _rec(), "programs_run", "replays")
    assert d["replays"] == 0 and 1 <= d["programs_run"] <= 2, (d, _rec()["reasons"], _rec()["declined"])
    assert _fell_back() == fell, {k: v for k, v in _fell_back().items() if v != fell.get(k)}
    device.set_mode("strict")
    tol = dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss.cpu(), ref_loss, **tol)
    for (name, p), (_, rp) in zip(dev.named_parameters(), ref_net.named_parameters()):
        torch.testing.assert_close(p.grad.cpu(), rp.grad, **tol, msg=lambda m, n=name: f"grad {n}: {m}")
    bn, ref_bn = dev[1], ref_net[1]
    torch.testing.assert_close(bn.running_mean.cpu(), ref_bn.running_mean, **tol)
    torch.testing.assert_close(bn.running_var.cpu(), ref_bn.running_var, **tol)


def test_an_input_freed_before_the_flush_keeps_its_bytes(native):
    x = torch.randn(256, 256)
    xt = x.to("tpu")
    y = F.silu(xt) * 2.0
    del xt
    gc.collect()
    # Memory allocated now must not be the freed input's block.
    others = [torch.full((256, 256), 7.0, device="tpu") for _ in range(4)]
    torch.tpu.synchronize()
    device.set_mode("strict")
    torch.testing.assert_close(y.cpu(), F.silu(x) * 2.0)
    assert all(o.cpu().eq(7.0).all() for o in others)


@pytest.mark.parametrize("fails", [False, True], ids=["program", "replay"])
def test_an_input_read_again_after_a_write_into_it_reads_the_written_value(native, fails):
    """An input read whole is found again at its address without its geometry; once a recorded
    call writes its memory, a later read is of that call's value (in the program and in the
    replay on PyTorch alike)."""
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    xt, wt = x.to("tpu"), w.to("tpu")
    before = _rec()
    with inject_fault("run") if fails else contextlib.nullcontext():
        a = xt * wt
        b = xt * wt  # the same input, read again
        wt.add_(1.0)
        c = xt * wt  # the written value, not the input
        torch.tpu.synchronize()
    d = _delta(before, _rec(), "flushes", "recorded", "programs_run", "replays")
    assert d == {"flushes": 1, "recorded": 4, "programs_run": 0 if fails else 1, "replays": int(fails)}, d
    device.set_mode("strict")
    torch.testing.assert_close(a.cpu(), x * w)
    torch.testing.assert_close(b.cpu(), x * w)
    torch.testing.assert_close(c.cpu(), x * (w + 1.0))
    torch.testing.assert_close(wt.cpu(), w + 1.0)


def _pointwise(xt, wt):
    a = F.silu(xt)  # a bound kernel's op: one tensor
    b = a * wt  # two tensors
    c = torch.add(b, xt, alpha=2.0)  # two tensors and a scalar
    d = c * 3.0  # Python's float as a 0-dim CPU tensor
    e = d.pow(2)  # a tensor and a scalar
    f = e.sum(dim=[0])  # an int list: boxed
    return e, f


def test_pointwise_calls_reach_the_recorder_unboxed(native):
    """Calls of tensors and scalars returning one tensor reach `record` through the shim's
    unboxed entry, nothing boxed (counted by the shim); a call with an argument of another kind
    goes boxed. The first call of a signature goes boxed too (its meta function runs on a
    stack): the second step is counted."""
    from tpu_kernels import _device

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    xt, wt = x.to("tpu"), w.to("tpu")
    held = _pointwise(xt, wt)  # held: the same outputs, the same trace
    torch.tpu.synchronize()
    before, unboxed = _rec(), _device.unboxed_records()
    e, f = _pointwise(xt, wt)
    torch.tpu.synchronize()
    del held
    assert _device.unboxed_records() - unboxed == 5
    assert _delta(before, _rec(), "recorded", "flushes", "hits") == {"recorded": 6, "flushes": 1, "hits": 1}
    device.set_mode("strict")
    ref = (torch.add(F.silu(x) * w, x, alpha=2.0) * 3.0).pow(2)
    torch.testing.assert_close(e.cpu(), ref)
    torch.testing.assert_close(f.cpu(), ref.sum(dim=[0]))


def test_pointwise_calls_outside_fused_mode_run_as_before():
    """In strict mode the unboxed entry runs the boxed kernel: a bound kernel's op runs its
    kernel, the others PyTorch's CPU kernels on the device's memory; nothing is recorded."""
    from tpu_kernels import _device

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    unboxed, before = _device.unboxed_records(), _rec()
    e, f = _pointwise(x.to("tpu"), w.to("tpu"))
    assert _device.unboxed_records() == unboxed
    assert _rec()["recorded"] == before["recorded"]
    ref = (torch.add(F.silu(x) * w, x, alpha=2.0) * 3.0).pow(2)
    torch.testing.assert_close(e.cpu(), ref)
    torch.testing.assert_close(f.cpu(), ref.sum(dim=[0]))


@pytest.mark.parametrize(
    "op, call",
    [
        ("aten::igamma.default", lambda a: torch.igamma(a, a + 1.0)),  # the unboxed entry
        ("aten::polygamma.default", lambda a: torch.special.polygamma(1, a)),  # boxed only
    ],
    ids=["unboxed", "boxed"],
)
def test_a_call_with_no_lowering_is_declined_once_and_runs(native, op, call):
    """A functional call whose op has no lowering is declined once, with its reason (PyTorch's
    generic kernel then runs it through its out= form, which is not handed to the recorder
    again), and computes what PyTorch does."""
    x = torch.rand(4, 4) + 0.5
    xt = x.to("tpu")
    before = dict(_rec()["declined"]).get(op, (0, ""))[0]
    z = call(xt)
    torch.tpu.synchronize()
    count, reason = dict(_rec()["declined"])[op]
    assert count - before == 1
    assert "no lowering" in reason, reason
    device.set_mode("strict")
    torch.testing.assert_close(z.cpu(), call(x))


def test_a_program_that_fails_to_run_is_evicted_and_replayed_on_pytorch(native):
    x = torch.randn(7, 7)
    xt = x.to("tpu")
    with inject_fault("run"):
        before = _rec()
        y = torch.exp(xt) * 3.0 + xt
        torch.tpu.synchronize()
        d = _delta(before, _rec(), "evictions", "replays", "programs_run")
        assert d == {"evictions": 1, "replays": 1, "programs_run": 0}, d
        assert "injected fault" in _rec()["last_eviction"]
        compiled = report().graphs["compiled"]
        # The same trace again: never compiled or run, replayed at once.
        y2 = torch.exp(xt) * 3.0 + xt
        torch.tpu.synchronize()
        assert report().graphs["compiled"] == compiled
        assert _rec()["replays"] == before["replays"] + 2
    assert report().ops["tpu_fused_native"]["fallbacks"]["replay"] >= 2
    device.set_mode("strict")
    torch.testing.assert_close(y.cpu(), torch.exp(x) * 3.0 + x)
    torch.testing.assert_close(y2.cpu(), torch.exp(x) * 3.0 + x)


def test_a_call_the_recorder_declines_says_why(native):
    xt = torch.randn(3, 4).to("tpu")
    torch.nonzero(xt > 0)  # data-dependent output shape: no meta types to record by
    declined = _rec()["declined"]
    assert any("nonzero" in op or op == "?" for op in declined), declined


def test_a_compiled_output_dropped_before_the_flush_keeps_its_memory(native):
    """A compiled graph's output on the device that only a recorded call reads (`f(x).sum()`:
    the output dies at once) keeps its memory until the flush has read it; before, the memory
    went back at once and the flush read whatever was written there since."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 16)
    ref = m(x).detach().sum()
    md, xt = m.to("tpu"), x.to("tpu")
    f = torch.compile(md, backend="tpu_kernels")
    with torch.no_grad():
        before = _rec()["programs_run"]
        sums = [f(xt).sum() for _ in range(3)]
        got = [s.cpu() for s in sums]
    assert _rec()["programs_run"] > before, _rec()  # the sums were recorded and ran as a program
    for g in got:
        torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-5)


def test_a_python_scalar_takes_a_zero_dim_tensors_dtype(native):
    """`loss + 1e-6` on a 0-dim float32 tensor is float32, as in eager: the meta function that
    gives a recorded call's output types sees the scalar as the wrapped number it is (it was a
    float64 0-dim tensor there, and the result float64). Gradient clipping divides by such a
    norm: a training step with it matches strict mode."""
    t = torch.tensor([3.0, 4.0]).to("tpu")
    tot = torch.linalg.vector_norm(t, 2.0)
    a = tot + 1e-6
    b = torch.clamp(0.5 / a, max=1.0)
    c = torch.tensor(0.6).to("tpu") * 0.5
    assert (a.dtype, b.dtype, c.dtype) == (torch.float32,) * 3
    torch.testing.assert_close(b.cpu(), torch.tensor(0.5 / (5.0 + 1e-6)))

    def step() -> torch.Tensor:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to("tpu")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        x, y = torch.randn(5, 8).to("tpu"), torch.randint(0, 4, (5,)).to("tpu")
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
            opt.step()
        return torch.cat([p.detach().cpu().flatten() for p in m.parameters()])

    got = step()
    device.set_mode("strict")
    try:
        ref = step()
    finally:
        device.set_mode("fused", recorder="native")
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_the_report_says_what_the_native_recorder_did(native):
    xt = torch.randn(4, 8).to("tpu")
    y = torch.sin(xt) * 2.0
    torch.tpu.synchronize()
    torch.nonzero(xt > 0)  # declined: a data-dependent output shape
    text = str(report())
    line = [s for s in text.splitlines() if s.startswith("  fused mode, native recorder: ")]
    assert line and "programs run; trace cache: " in line[0] and "torch.tpu.synchronize=" in line[0], text
    assert "calls not recorded (run as in strict mode after a flush): " in text, text
    torch.testing.assert_close(y.cpu(), torch.sin(xt.cpu()) * 2.0)


def test_set_mode_rejects_an_unknown_recorder():
    with pytest.raises(ValueError, match="recorder must be one of 'python', 'native', not 'rust'"):
        device.set_mode("fused", recorder="rust")
    assert device.get_mode() == "strict"


def test_the_native_recorder_is_the_default(monkeypatch):
    """`set_mode("fused")` records natively unless `TPUK_FUSED_RECORDER` or `recorder=` says
    "python": the ops land in the native recorder's counters, not in the Python mode's."""
    x = torch.randn(8, 8).to("tpu")
    monkeypatch.delenv("TPUK_FUSED_RECORDER", raising=False)
    try:
        device.set_mode("fused")
        assert device.get_recorder() == "native"
        before, python_before = _rec()["recorded"], report().fused["ops"]
        y = torch.sin(x * 2.0)
        torch.tpu.synchronize()
        assert _rec()["recorded"] - before == 2, _rec()
        assert report().fused["ops"] == python_before
        monkeypatch.setenv("TPUK_FUSED_RECORDER", "python")
        device.set_mode("fused")
        assert device.get_recorder() == "python"
        device.set_mode("fused", recorder="native")
        assert device.get_recorder() == "native"
    finally:
        device.set_mode("strict")
    torch.testing.assert_close(y.cpu(), torch.sin(x.cpu() * 2.0))


def test_a_zoo_model_trains_a_step_with_the_native_recorder():
    """Forward, backward (on the autograd engine's device thread) and AdamW of a Llama-style
    model, recorded natively (the zoo's "tpu-fused" path): loss, gradients and updated
    parameters match eager, and the recorder ran the step in a few programs."""
    sys.path.insert(0, os.path.dirname(__file__))
    import zoo

    assert zoo.RECORDERS["tpu-fused"] == "native"
    spec = zoo.SPECS["llama"]
    ref = zoo.train_step(spec, "eager")
    before, fell = _rec(), _fell_back()
    got = zoo.train_step(spec, "tpu-fused")
    d = _delta(before, _rec(), "recorded", "programs_run", "flushes", "replays")
    assert d["recorded"] >= 300 and d["replays"] == 0, d
    assert 1 <= d["programs_run"] <= 20 and d["flushes"] <= 20, (d, _rec()["reasons"])
    fell_after = _fell_back()
    fallback_calls = sum(fell_after.values()) - sum(fell.values())
    assert fallback_calls <= 40, {k: v - fell.get(k, 0) for k, v in fell_after.items() if v != fell.get(k, 0)}
    tol = dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.loss, ref.loss, **tol)
    for name, g in ref.grads.items():
        torch.testing.assert_close(got.grads[name], g, **tol, msg=lambda m, n=name: f"grad {n}: {m}")
    for name, p in ref.params.items():
        torch.testing.assert_close(got.params[name], p, **tol, msg=lambda m, n=name: f"param {n}: {m}")
