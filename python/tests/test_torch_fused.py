"""Fused eager mode: recorded ops run as one cached program per materialisation point."""

import contextlib

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
from tpu_kernels.errors import InternalError  # noqa: E402
from tpu_kernels.testing import error_policy, no_fallbacks  # noqa: E402
from tpu_kernels.torch import report, substitute  # noqa: E402


def chain(x):
    y = F.silu(x)
    y = y * 2 + 1
    y = torch.softmax(y, -1)
    y = F.gelu(y)
    y = torch.exp(y)
    y = y - y.mean(-1, keepdim=True)
    y = torch.tanh(y)
    return y.sum(-1)


def test_fused_equals_strict_and_eager():
    x = torch.randn(32, 64)
    with no_fallbacks(kernels=["silu", "softmax", "gelu"]):
        with substitute("strict"):
            s = chain(x)
    before = report().fused["flushes"]
    with no_fallbacks(kernels=["silu", "softmax", "gelu"], programs=1) as ran:
        with substitute("fused"):
            f = chain(x)
    assert ran.programs == 1  # one program for the whole chain, and it ran
    assert report().fused["flushes"] == before + 1
    # The last steps sum mean-centred values (cancellation): compare at f32 summation accuracy.
    torch.testing.assert_close(f, s, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(f, chain(x), rtol=1e-4, atol=1e-4)


def test_programs_are_cached_by_trace():
    x, x2 = torch.randn(16, 32), torch.randn(16, 32)
    with substitute("fused"):
        a = chain(x)
    g0, t0 = report().graphs, report().fused["trace_cache"]
    with no_fallbacks(kernels=["silu"], programs=1):
        with substitute("fused"):
            b = chain(x2)
    g1, t1 = report().graphs, report().fused["trace_cache"]
    # The trace's hash found its program: no graph JSON, no lowering, no compile.
    assert t1["hits"] == t0["hits"] + 1 and t1["misses"] == t0["misses"]
    assert g1["compiled"] == g0["compiled"] and g1["memo_hits"] == g0["memo_hits"]
    # The reused program computes the new inputs' values, not the old ones'.
    torch.testing.assert_close(a, chain(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b, chain(x2), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(a, b)


def test_a_transposed_input_is_read_in_place_and_keyed_by_its_layout():
    """A transposed input crosses in its memory order (no copy) with a permute in the program;
    the trace key tells it from a contiguous input of the same shape, so neither trace's program
    serves the other."""
    w, x = torch.randn(40, 40), torch.randn(40, 40)  # a shape no other test traces
    before = report().fused["trace_cache"]
    for t in (w, w.t(), w, w.t()):
        with no_fallbacks(programs=1), substitute("fused"):
            y = (x @ t).relu() + 1
        torch.testing.assert_close(y, (x @ t).relu() + 1, rtol=1e-4, atol=1e-4)
    after = report().fused["trace_cache"]
    # Two traces, each compiled once and found once.
    assert after["misses"] - before["misses"] == 2
    assert after["hits"] - before["hits"] == 2


def test_writes_into_views_of_pending_values_stay_in_the_trace():
    """T5's `_shift_right`: a slice assignment and a select assignment into a pending tensor,
    then an in-place op on it, are recorded functionally (scattered into the base), so the
    trace goes on to one program; a view taken before the writes sees them."""

    def shift(ids, w):
        s = ids.new_zeros(ids.shape)
        early = s[:, 2:]  # a view taken before the writes
        s[..., 1:] = ids[..., :-1].clone()
        s[..., 0] = 7
        s.masked_fill_(s == -100, 0)
        return (w[s] * 2).sum(-1), s, early + 1

    ids = torch.tensor([[3, -100, 5, 6], [1, 2, -100, 4]])
    w = torch.randn(10, 8)
    want = shift(ids, w)
    before = report().fused["reasons"]
    with no_fallbacks(programs=1), substitute("fused"):
        got = shift(ids, w)
    leaving = "leaving"
    assert report().fused["reasons"] == {**before, leaving: before.get(leaving, 0) + 1}, report().fused["reasons"]
    torch.testing.assert_close(got[0], want[0])
    assert torch.equal(got[1], torch.tensor([[7, 3, 0, 5], [7, 1, 2, 0]]))
    assert torch.equal(got[2], want[2])


def test_a_boolean_scalar_read_replays_its_few_ops_and_the_trace_goes_on():
    """transformers' attention masks: `mask.bool().all()` read by Python control flow is computed
    by replaying its two boolean ops in PyTorch (exact, counted); the trace is not ended. A float
    scalar read still ends it."""
    x = torch.randn(4, 16)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])

    def f(x, mask):
        h = F.silu(x) * 2
        keep = bool(mask.bool().all())  # Python control flow on a pending value
        return h + (1 if keep else -1), keep

    want = f(x, mask)
    before = dict(report().fused["reasons"]), dict(report().fused["trace_cache"])
    with no_fallbacks(programs=1), substitute("fused"):
        got = f(x, mask)
    reasons, cache = report().fused["reasons"], report().fused["trace_cache"]
    assert reasons == {**before[0], "leaving": before[0].get("leaving", 0) + 1}, reasons
    assert cache["scalar_reads_replayed"] == before[1]["scalar_reads_replayed"] + 1
    assert cache["scalar_read_ops_replayed"] == before[1]["scalar_read_ops_replayed"] + 2
    assert got[1] is want[1] is False
    torch.testing.assert_close(got[0], want[0])

    with substitute("fused"):
        s = float((F.silu(x) * 2).sum())  # a float: not exact in a replay, so it materialises
    assert report().fused["reasons"].get("aten::_local_scalar_dense.default", 0) == (
        reasons.get("aten::_local_scalar_dense.default", 0) + 1
    )
    assert s == pytest.approx(float((F.silu(x) * 2).sum()), rel=1e-5)


@pytest.mark.parametrize("point", ["item", "numpy", "cpu", "print", "control_flow", "tolist"])
def test_materialisation_points(point, capsys):
    x = torch.randn(8, 8)
    expected = (F.silu(x) * 3).sum()
    with substitute("fused"):
        y = (F.silu(x) * 3).sum()
        if point == "item":
            v = y.item()
        elif point == "numpy":
            v = float(y.numpy())
        elif point == "cpu":
            v = float(y.cpu().numpy())
        elif point == "print":
            print(y)
            v = float(capsys.readouterr().out.split("(")[1].split(")")[0])
        elif point == "tolist":
            v = y.tolist()
        else:
            v = float(y) if y > -1e9 else None
    assert v == pytest.approx(expected.item(), rel=1e-4, abs=1e-4)


def test_leaving_the_mode_materialises():
    x = torch.randn(4, 4)
    with substitute("fused"):
        y = torch.tanh(x) + 1
    torch.testing.assert_close(y, torch.tanh(x) + 1)


def test_in_place_and_views_keep_semantics():
    x = torch.randn(4, 6)
    with substitute("fused"):
        y = torch.exp(x)
        v = y.view(6, 4)
        z = v * 2
        y.add_(1)  # in-place: materialises first, then runs in PyTorch
        w = z + y.view(6, 4)
    ref_y = torch.exp(x)
    ref_z = ref_y.view(6, 4) * 2
    ref_y.add_(1)
    torch.testing.assert_close(w, ref_z + ref_y.view(6, 4))
    torch.testing.assert_close(v, ref_y.view(6, 4))


def test_autograd_under_fused():
    x = torch.randn(8, 16)
    w = torch.randn(16, 4, requires_grad=True)
    (F.silu(x @ w) ** 2).mean().backward()
    g = w.grad.clone()
    w.grad = None
    with substitute("fused"):
        (F.silu(x @ w) ** 2).mean().backward()
    torch.testing.assert_close(w.grad, g, rtol=1e-5, atol=1e-6)


def test_program_failure_replays_in_pytorch(monkeypatch):
    from tpu_kernels.torch.fused import FusedMode

    def broken(self, live):
        raise RuntimeError("program exploded")

    monkeypatch.setattr(FusedMode, "_run_program", broken)
    x = torch.randn(8, 8)
    before = report().fallbacks("fused", "replay")
    with error_policy("fallback"):
        with substitute("fused"):
            y = chain(x)
    torch.testing.assert_close(y, chain(x), rtol=1e-4, atol=1e-4)
    assert "program exploded" in report().ops["fused"]["last_fallback"]
    assert report().fallbacks("fused", "replay") == before + 1  # an error, counted as a replay
    # The helper sees the replay; under the "raise" policy it is an InternalError.
    with pytest.raises(AssertionError, match="fused: 1 error \\(replay\\)"):
        with no_fallbacks(), error_policy("fallback"), substitute("fused"):
            y = chain(x)  # a live result: a dead one is never materialised
    with pytest.raises(InternalError, match="program exploded"):
        with error_policy("raise"), substitute("fused"):
            y = chain(x)


def test_other_devices_run_as_usual():
    x = torch.randn(4, 4, device="meta")
    with substitute("fused"):
        y = F.silu(x) * 2
    assert y.device.type == "meta" and y.shape == (4, 4)


def test_user_errors_surface_unchanged():
    a, b = torch.randn(3, 4), torch.randn(5, 6)
    with pytest.raises(RuntimeError, match="size"):
        with substitute("fused"):
            F.silu(a) + F.silu(b)


@pytest.mark.parametrize("native_handler", [True, False], ids=["native-handler", "python-handler"])
def test_recording_failure_runs_the_op(monkeypatch, native_handler):
    """A failure while recording, in the native handler or the Python one, is counted and the
    op runs in PyTorch (raised as InternalError under the "raise" policy)."""
    from tpu_kernels.torch.fused import FusedMode

    def broken(self, *a, **k):
        raise RuntimeError("recorder exploded")

    # Registering a program input: both handlers reach it for a tensor the trace has not seen.
    monkeypatch.setattr(FusedMode, "_input_ref", broken)
    x = torch.randn(4, 4)
    before = report().ops.get("fused", {}).get("fallbacks", {}).get("internal", 0)
    with error_policy("fallback"):
        with FusedMode(native_handler=native_handler):
            y = torch.tanh(x) * 2
    torch.testing.assert_close(y, torch.tanh(x) * 2)
    assert "recorder exploded" in report().ops["fused"]["last_fallback"]
    assert report().ops["fused"]["fallbacks"]["internal"] == before + 2
    with pytest.raises(InternalError, match="recorder exploded"):
        with error_policy("raise"), FusedMode(native_handler=native_handler):
            y = torch.tanh(x) * 2


def _traces():
    return dict(report().fused["trace_cache"])


def _adamw_run(mode: str | None, steps: int, seed: int = 0):
    """A small MLP trained `steps` AdamW steps (a learning-rate schedule included, so the
    optimizer's floats change every step); returns (parameters, losses, per-step counters)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.SiLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + i))
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    losses, counters = [], []
    for _ in range(steps):
        before = (_traces(), report().graphs["compiled"], report().fused["flushes"])
        types_before = before[0]["output_type_runs"]
        opt.zero_grad(set_to_none=True)
        if mode is None:
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        else:
            with substitute(mode):
                loss = F.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                tpu_kernels_torch.sync()
        sched.step()
        losses.append(float(loss))
        after = (_traces(), report().graphs["compiled"], report().fused["flushes"])
        counters.append({
            "hits": after[0]["hits"] - before[0]["hits"],
            "misses": after[0]["misses"] - before[0]["misses"],
            "compiled": after[1] - before[1],
            "flushes": after[2] - before[2],
            "output_types": after[0]["output_type_runs"] - types_before,
        })
    return [p.detach().clone() for p in model.parameters()], losses, counters


import tpu_kernels.torch as tpu_kernels_torch  # noqa: E402


def test_a_training_loop_compiles_nothing_after_its_first_steps():
    """Forward, backward and AdamW (in-place updates of parameters and state, a learning rate
    that changes every step) are one trace a step; the float arguments that change are lifted
    into program inputs, after which every step finds its program by the trace's hash."""
    want, want_losses, _ = _adamw_run(None, 6)
    with no_fallbacks(ops=[], programs=6):
        got, losses, counters = _adamw_run("fused", 6)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    assert losses == pytest.approx(want_losses, rel=1e-5, abs=1e-6)
    # One program a step: the optimizer's in-place updates no longer end the trace.
    assert all(c["flushes"] == 1 for c in counters), counters
    # The first step creates the optimizer's state, the second is the steady step, the third
    # differs from it in the optimizer's floats alone: they are lifted into program inputs and
    # its program takes them so. From the fourth step on nothing is compiled or lowered.
    assert all(c["misses"] == 1 for c in counters[:3]), counters
    assert all(c["hits"] == 1 and c["misses"] == 0 and c["compiled"] == 0 for c in counters[3:]), counters
    # Nor, from the fifth step on, does recording run a meta kernel: output types are cached by
    # argument types, with a lifted float's changing value left out of the key (the fourth step
    # is the first to key the floats lifted at the third so).
    assert all(c["output_types"] == 0 for c in counters[4:]), [c["output_types"] for c in counters]
    lifted = set(_traces()["lifted"])
    assert "aten::addcdiv.default:value" in lifted, lifted


def test_in_place_on_a_tensor_with_memory_writes_it_back():
    p = torch.randn(4, 6)
    want = (p * 0.5 + 1, (p * 0.5 + 1) * 2)
    view = p[1]
    storage, version = p.untyped_storage().data_ptr(), p._version
    with no_fallbacks(ops=[], programs=1):
        with substitute("fused"):
            p.mul_(0.5)
            p.add_(torch.ones(6))
            q = p * 2
    assert p.untyped_storage().data_ptr() == storage  # the same memory, written in place
    assert p._version == version + 2  # each in-place op bumped the version counter, as in eager
    torch.testing.assert_close(p, want[0])
    torch.testing.assert_close(view, want[0][1])  # a view made before sees the new value
    torch.testing.assert_close(q, want[1])


def test_in_place_on_a_saved_tensor_still_fails_backward():
    w = torch.randn(4, requires_grad=True)
    x = torch.randn(4)
    with substitute("fused"):
        h = w * 1.0
        y = (h * h).sum()  # saves h for backward
        with torch.no_grad():
            h.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    del x


def test_in_place_write_back_values_match_eager():
    base = torch.randn(5, 7)
    a, b = base.clone(), base.clone()
    w = torch.randn(7)
    a.mul_(0.9).add_(w, alpha=-0.3).addcmul_(w, w, value=0.01)
    with no_fallbacks(ops=[], programs=1):
        with substitute("fused"):
            b.mul_(0.9).add_(w, alpha=-0.3).addcmul_(w, w, value=0.01)
    torch.testing.assert_close(b, a)


def test_a_write_into_memory_a_recorded_op_reads_waits_for_the_trace():
    x = torch.randn(4, 4)
    s = torch.tensor(2.0)
    with substitute("fused"):
        y = x * s  # recorded: reads s at the materialisation point
        s.add_(1)  # a zero-dim bookkeeping op run at once: the trace runs first
        z = x * s
    torch.testing.assert_close(y, x * 2)
    torch.testing.assert_close(z, x * 3)


def test_bookkeeping_that_touches_no_pending_value_keeps_the_trace():
    x = torch.randn(8, 8)
    step = torch.tensor(0.0)
    before = report().fused["flushes"]
    with substitute("fused"):
        y = F.silu(x)
        step += 1  # zero-dim, not pending: runs at once
        n = step.item()  # reads only `step`: no materialisation
        y = y * n + 1
    assert report().fused["flushes"] == before + 1
    torch.testing.assert_close(y, F.silu(x) * 1 + 1)


def test_a_scalar_of_values_with_memory_runs_at_once():
    """`mask.max()` of a tensor that holds its memory is computed at once (Python reads it next),
    so the read ends no trace; the same of a pending value is recorded and its read
    materialises."""
    x, mask = torch.randn(8, 8), torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    before = report().fused["flushes"]
    with substitute("fused"):
        y = F.silu(x)
        if mask.max() > 0.5:  # `mask` holds its memory: no materialisation
            y = y + 1
    assert report().fused["flushes"] == before + 1
    torch.testing.assert_close(y, F.silu(x) + 1)
    with substitute("fused"):
        y = F.silu(x)
        if (mask * 2).max() > 0.5:  # a pending value: its read materialises
            y = y + 1
    assert report().fused["flushes"] == before + 3
    torch.testing.assert_close(y, F.silu(x) + 1)


def test_sync_runs_the_trace():
    x = torch.randn(8, 8)
    before = report().fused
    with substitute("fused"):
        y = torch.tanh(x) * 2
        tpu_kernels_torch.sync()
        assert report().fused["flushes"] == before["flushes"] + 1
        z = y + 1
    assert report().fused["reasons"].get("sync", 0) == before["reasons"].get("sync", 0) + 1
    torch.testing.assert_close(z, torch.tanh(x) * 2 + 1)
    tpu_kernels_torch.sync()  # outside fused mode: nothing to run, no error


def test_another_trace_gets_its_own_entry_and_says_why_it_missed():
    x, small = torch.randn(16, 32), torch.randn(8, 32)
    with substitute("fused"):
        _ = chain(x)
    t0 = _traces()
    with substitute("fused"):
        a = chain(small)  # a smaller last batch: another program
    t1 = _traces()
    assert t1["misses"] == t0["misses"] + 1
    assert t1["miss_reasons"].get("input_types", 0) == t0["miss_reasons"].get("input_types", 0) + 1
    assert "f32[8,32]" in t1["last_miss"] or "(8, 32)" in t1["last_miss"], t1["last_miss"]
    with substitute("fused"):
        _ = chain(x)
    with substitute("fused"):
        b = chain(small)
    t2 = _traces()
    assert t2["hits"] == t1["hits"] + 2 and t2["misses"] == t1["misses"]
    torch.testing.assert_close(a, chain(small), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b, a)


def test_a_float_whose_lowering_takes_no_tensor_stays_a_constant():
    """`full`'s fill value changes from trace to trace; lifted, its lowering would refuse a
    tensor: the trace compiles with the constant and the value stays right, no fallback."""
    x = torch.randn(4, 4)
    with no_fallbacks(ops=[], programs=4):
        for i in range(4):
            with substitute("fused"):
                y = torch.full((4, 4), 0.5 + i) * x
            torch.testing.assert_close(y, (0.5 + i) * x)


def test_an_entry_that_fails_to_run_is_evicted_and_never_served_again():
    from tpu_kernels.testing import inject_fault

    x = torch.randn(6, 6)
    with inject_fault("run"), error_policy("fallback"):
        with substitute("fused"):
            y = torch.exp(x) + 3
        t = _traces()
        assert t["evicted"] >= 1 and "run" in t["last_eviction"].lower(), t
        compiled = report().graphs["compiled"]
        with substitute("fused"):
            y2 = torch.exp(x) + 3
        # The same trace: not compiled or run again, replayed with the eviction as reason.
        assert report().graphs["compiled"] == compiled
        assert "evicted" in report().ops["fused"]["last_fallback"]
    torch.testing.assert_close(y, torch.exp(x) + 3)
    torch.testing.assert_close(y2, torch.exp(x) + 3)


def test_batch_norm_updates_its_running_statistics_inside_the_trace():
    """`native_batch_norm` updates its running statistics in place (its schema does not say
    so): it is recorded as its functional op and the statistics are written back, so a training
    step through batch norm is one program, with eager's statistics and gradients."""
    import copy

    torch.manual_seed(0)
    want = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    got = copy.deepcopy(want)
    x = torch.randn(2, 3, 8, 8)
    (want(x) ** 2).mean().backward()
    flushes = report().fused["flushes"]
    with no_fallbacks(ops=[], programs=1):
        with substitute("fused"):
            (got(x) ** 2).mean().backward()
    assert report().fused["flushes"] == flushes + 1
    for name, t in want.state_dict().items():
        torch.testing.assert_close(got.state_dict()[name], t, rtol=1e-5, atol=1e-6, msg=name)
    for (name, p), q in zip(want.named_parameters(), got.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_native_handler_records_the_calls_and_the_python_side_keys_them_alike():
    """`substitute("fused")`'s `__torch_dispatch__` is the Rust handler: functional ops, lists
    of tensors, keyword statics, views of pending values, in-place updates and factory ops are
    recorded there, none by the Python handler, and each node's key is the one the Python side computes
    for it (`_key_of`), folded into the same running hash."""
    from tpu_kernels.torch.fused import FusedMode, _key_of

    x = torch.randn(8, 16)
    before = dict(report().fused)
    with substitute("fused") as mode:
        assert type(mode.__torch_dispatch__).__name__ == "FusedDispatch"
        a = torch.cat([x.t() @ x, torch.tanh(x.t())[:, :8] * 2], 1)
        a.add_(0.5)
        b = F.gelu(a, approximate="tanh").sum(dim=[0], keepdim=True)
        # Factory ops (CPU placeholders too).
        c = b.view(4, 6).transpose(0, 1) * 3 + torch.zeros(6, 4, device="cpu") + torch.arange(4.0)
        keys = [_key_of(n) for n in mode.nodes]
        assert keys == mode.node_keys
        h = 0
        for k in keys:
            h = hash((h, k))
        assert h == mode.hash
        assert any(n[5] for n in mode.nodes), "a view of a pending value is recorded as an alias"
    after = report().fused
    recorded = after["ops"] - before["ops"]
    assert after["flushes"] == before["flushes"] + 1
    assert recorded == len(keys) >= 10 and after["native_ops"] - before["native_ops"] == recorded
    want = torch.cat([x.t() @ x, torch.tanh(x.t())[:, :8] * 2], 1) + 0.5
    want = (F.gelu(want, approximate="tanh").sum(dim=[0], keepdim=True).view(4, 6).transpose(0, 1)) * 3
    want = want + torch.arange(4.0)
    torch.testing.assert_close(c, want, rtol=1e-5, atol=1e-4)
    # The Python handler alone records all of it (the count the native one would take is 0).
    before = dict(report().fused)
    with FusedMode(native_handler=False):
        c2 = (torch.tanh(x) * 2).sum()
    after = report().fused
    assert after["ops"] - before["ops"] == 3 and after["native_ops"] == before["native_ops"]
    torch.testing.assert_close(c2, (torch.tanh(x) * 2).sum())


def test_a_step_recorded_by_either_handler_runs_the_program_the_other_compiled():
    """The two handlers build the same trace to the key: a training step (forward, backward,
    AdamW's in-place updates with lifted floats) recorded by the native handler finds the
    program compiled for the Python handler's, and the other way round; most of the step's
    ops are the native handler's, and the parameters follow eager's."""
    import copy

    from tpu_kernels.torch.fused import FusedMode

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.SiLU(), torch.nn.Linear(24, 4))
    ref = copy.deepcopy(model)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=False) for m in (model, ref)]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda i: 1.0 / (1 + i)) for o in opts]
    x, y = torch.randn(8, 16), torch.randn(8, 4)

    def step(m, opt, sched, ctx):
        opt.zero_grad(set_to_none=True)
        with ctx:
            loss = F.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            tpu_kernels_torch.sync()
        sched.step()
        return float(loss)

    natives = [False, False, False, False, True, False, True, True, False]
    for i, native in enumerate(natives):
        before = (_traces(), dict(report().fused))
        got = step(model, opts[0], scheds[0], FusedMode(native_handler=native))
        want = step(ref, opts[1], scheds[1], contextlib.nullcontext())
        after = (_traces(), report().fused)
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        ops = after[1]["ops"] - before[1]["ops"]
        native_ops = after[1]["native_ops"] - before[1]["native_ops"]
        if native:
            assert native_ops >= 0.9 * ops, (i, native_ops, ops)
        else:
            assert native_ops == 0
        if i >= 4:  # past the steps that create the state and lift the optimizer's floats
            assert after[0]["hits"] == before[0]["hits"] + 1, (i, after[0]["last_miss"])
            assert after[0]["misses"] == before[0]["misses"], (i, after[0]["last_miss"])


def test_fused_program_reads_a_row_slice_whose_unit_dim_has_another_stride():
    """A `[1, 16]` slice of a `[1, 64]` buffer (transformers' `position_ids[:, :seq]`) is
    contiguous for torch though its unit dim keeps the parent's stride: the program reads it in
    place instead of refusing it and replaying in PyTorch."""
    base = torch.randn(1, 64)
    x = base[:, :16]
    assert x.is_contiguous() and x.stride() == (64, 1)
    with no_fallbacks(kernels=["silu"], programs=1):
        with substitute("fused"):
            y = F.silu(x) * 2 + 1
            y = y + 0  # materialised below
        got = y.clone()
    torch.testing.assert_close(got, F.silu(x) * 2 + 1)


def _battery():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=g)
    i = torch.tensor([3, 0, 7, 7])
    i2 = torch.randint(0, 16, (8, 4), generator=g)
    m = torch.rand(8, 16, generator=g) > 0.5

    def in_place():
        y = x.clone()
        y.mul_(2).add_(1)
        y[:, 0] = 5.0
        y.clamp_(min=0.5)
        return y

    def autograd():
        w = x.clone().requires_grad_()
        (F.silu(w) * 2).sum().backward()
        return w.grad

    return {
        "elementwise": lambda: torch.where(x > 0, x, 0.1 * x) * 2.5 - 1,
        "reductions": lambda: (
            x.sum(dim=1, keepdim=True),
            x.mean(-1),
            x.amax(0),
            torch.var(x, dim=0, unbiased=False),
        ),
        "views": lambda: (x.view(4, 32).t().contiguous() + 1, x[:, 2:5] * 2, x.unsqueeze(0).expand(3, 8, 16).sum(0)),
        "in_place": in_place,
        "lists": lambda: (torch.cat([x, x * 2], 0), torch.stack([x, x + 1], 1)),
        "dtypes": lambda: (x.to(torch.bfloat16).float() * 3, (x > 0).sum(), x.argmax(1)),
        "indexing": lambda: (x[i] * 2, x.index_select(0, i) + 1, x.gather(1, i2) - 1, x.masked_fill(m, 0.0) * 3),
        "factories": lambda: (
            torch.zeros(8, 16) + x,
            torch.ones_like(x) * x,
            torch.arange(16.0) * x,
            torch.full((8, 16), 2.0) * x,
        ),
        "nn": lambda: (F.layer_norm(x, (16,)) * 2, F.softmax(x, -1) + 1, F.gelu(x, approximate="tanh") - 1),
        "matmul": lambda: (x @ x.t() + 1, torch.einsum("ij,kj->ik", x, x) * 2),
        "autograd": autograd,
    }


@pytest.mark.parametrize("case", sorted(_battery()))
def test_both_handlers_record_the_same_trace_and_values(case):
    """The native handler and the Python one, on the same calls: the same recorded nodes (node
    keys, op by op) and eager's values; the native one recorded every op it was given."""
    from tpu_kernels.torch.fused import FusedMode

    want = _battery()[case]()
    got, keys, native_ops = {}, {}, {}
    for native in (True, False):
        fn = _battery()[case]
        before = report().fused["native_ops"]
        with FusedMode(native_handler=native) as mode:
            out = fn()
            keys[native] = list(mode.node_keys)
        got[native] = out
        native_ops[native] = report().fused["native_ops"] - before
    assert keys[True] and keys[True] == keys[False]
    assert native_ops[False] == 0 and native_ops[True] > 0
    for native in (True, False):
        outs = got[native] if isinstance(want, tuple) else (got[native],)
        for g, w in zip(outs, want if isinstance(want, tuple) else (want,), strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
