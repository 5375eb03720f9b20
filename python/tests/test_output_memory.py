"""Where eager kernel outputs land.

An eager call whose outputs total at least 256 KiB (`POOL_OUTPUTS_MIN_BYTES`) writes them into
blocks of the caching allocator, lent to the program as extra donated parameters, instead of
fresh PJRT buffers (fresh large buffers fault in new pages on every call). Checked where it
shows: the dispatcher counts each output written into pool memory, a freed output's block holds
the next call's output (same data pointer), the "tpu" device's memory statistics count it, and
values match PyTorch's. Graph programs (fused mode's traces, compiled graphs) do the same with
their outputs.
"""

import pytest

torch = pytest.importorskip("torch")

import tpu_kernels as tk  # noqa: E402
import tpu_kernels.device  # noqa: E402,F401
from tpu_kernels.testing import no_fallbacks  # noqa: E402
from tpu_kernels.torch import substitute  # noqa: E402

F = torch.nn.functional


def _pooled(stats: dict, op: str) -> int:
    return stats["ops"].get(op, {}).get("outputs_pooled", 0)


def test_large_outputs_are_written_into_reused_pool_blocks():
    d = tk.Dispatcher()
    x = torch.randn(512, 256)  # 512 KiB in, 512 KiB out
    with no_fallbacks():
        (y,) = tk.call("aten::silu", x, dispatcher=d)
    torch.testing.assert_close(y, F.silu(x), rtol=1e-5, atol=1e-6)
    assert _pooled(d.stats(), "aten::silu.default") == 1
    ptr = y.data_ptr()
    assert ptr % 64 == 0
    del y
    with no_fallbacks():
        (z,) = tk.call("aten::silu", x, dispatcher=d)
    assert z.data_ptr() == ptr, "the freed output's block holds the next output"
    torch.testing.assert_close(z, F.silu(x), rtol=1e-5, atol=1e-6)
    stats = d.stats()["ops"]["aten::silu.default"]
    assert (stats["substituted"], stats["outputs_pooled"], stats["outputs_pool_missed"]) == (2, 2, 0)


def test_small_outputs_stay_fresh_runtime_buffers():
    d = tk.Dispatcher()
    x = torch.randn(64, 64)  # 16 KiB: below the threshold
    with no_fallbacks():
        (y,) = tk.call("aten::silu", x, dispatcher=d)
    torch.testing.assert_close(y, F.silu(x), rtol=1e-5, atol=1e-6)
    s = d.stats()["ops"]["aten::silu.default"]
    assert s["substituted"] == 1 and s["outputs_pooled"] == 0


def test_several_outputs_each_get_a_block():
    d = tk.Dispatcher()
    x, w, b = torch.randn(512, 512), torch.randn(512), torch.randn(512)
    with no_fallbacks():
        out = tk.call("aten::native_layer_norm", x, w, b, eps=1e-5, dispatcher=d)
    want = torch.native_layer_norm(x, [512], w, b, 1e-5)
    for got, ref in zip(out, want):
        torch.testing.assert_close(got, ref.reshape(got.shape), rtol=1e-4, atol=1e-5)
    assert _pooled(d.stats(), "aten::native_layer_norm.default") == len(out)


def test_strict_mode_reports_pooled_outputs():
    x = torch.randn(512, 256)
    before = tk.report().ops.get("aten::gelu.default", {}).get("outputs_pooled", 0)
    with no_fallbacks(), substitute("strict"):
        y = F.gelu(x)
    torch.testing.assert_close(y, F.gelu(x), rtol=1e-5, atol=1e-6)
    report = tk.report()
    assert report.ops["aten::gelu.default"]["outputs_pooled"] == before + 1
    assert "outputs written into reused memory from the caching allocator" in str(report)


def test_device_kernel_outputs_are_pool_memory_and_counted_once():
    x = torch.randn(256, 1024, device="tpu")  # 1 MiB
    base = torch.tpu.memory_stats()
    with no_fallbacks():
        g = F.gelu(x)
    stats = torch.tpu.memory_stats()
    assert stats["kernel_output_pooled_bytes"] - base["kernel_output_pooled_bytes"] == 1 << 20
    assert stats["kernel_output_bytes"] - base["kernel_output_bytes"] == 1 << 20
    assert stats["allocated_bytes"] - base["allocated_bytes"] == 1 << 20
    # The block is the pool's: reserved once, not again as a kernel output.
    assert stats["reserved_bytes"] - base["reserved_bytes"] <= (1 << 20) + (1 << 18)
    torch.testing.assert_close(g.cpu(), F.gelu(x.cpu()), rtol=1e-5, atol=1e-6)
    ptr = g.data_ptr()
    del g
    assert torch.tpu.memory_allocated() == base["allocated_bytes"]
    with no_fallbacks():
        h = F.gelu(x)
    assert h.data_ptr() == ptr, "the freed output's block is reused"


def test_compiled_graph_outputs_are_written_into_reused_pool_blocks():
    from tpu_kernels.torch import report

    torch._dynamo.reset()
    fn = torch.compile(lambda t: F.silu(t) * 2 + 1, backend="tpu_kernels")
    x = torch.randn(512, 256)
    want = F.silu(x) * 2 + 1
    before = report().graphs
    y = fn(x)
    ptr = y.data_ptr()
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    del y
    z = fn(x)
    after = report().graphs
    assert after["outputs_pooled"] - before["outputs_pooled"] == 2
    assert after["outputs_pool_missed"] == before["outputs_pool_missed"]
    assert z.data_ptr() == ptr, "the freed output's block holds the next run's output"
    torch.testing.assert_close(z, want, rtol=1e-5, atol=1e-6)


def test_fused_outputs_are_written_into_their_tensors_memory():
    """A fused program writes each live output into its tensor's own memory: the placeholder's,
    or the memory of a tensor updated in place (donated), with no buffer beside it."""
    from tpu_kernels.torch import report

    x = torch.randn(512, 256)
    p = torch.randn(512, 256)
    want_y = F.silu(x) * 2 + 1
    want_p = p * 0.5 + want_y
    p_ptr = p.data_ptr()
    before = report().graphs
    with no_fallbacks(programs=1), substitute("fused"):
        y = F.silu(x) * 2 + 1
        p.mul_(0.5).add_(y)
    after = report().graphs
    assert after["inputs_updated_in_place"] - before["inputs_updated_in_place"] == 2  # y and p
    assert after["inputs_updated_by_copy"] == before["inputs_updated_by_copy"]
    assert after["outputs_pooled"] == before["outputs_pooled"]
    assert p.data_ptr() == p_ptr
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p, want_p, rtol=1e-5, atol=1e-6)


def test_fused_step_on_the_device_keeps_no_more_memory_than_strict():
    """Issue 17's memory target on the device, exactly (allocated bytes): a transposed weight read
    in place, a viewed value that dies before the flush, a view that outlives its pending base,
    and an in-place update keep the fused trace's peak at or below strict mode's for the same
    code."""
    import tpu_kernels.device as device

    def step(w, x):
        a = x @ w.t()
        b = a.view(-1)  # a view of a pending value: both die before the flush
        h = b.relu()
        del a, b
        v = h.view(-1)  # outlives its base, which the flush must still fill
        del h
        w.mul_(0.5)
        return v, float(v.sum())  # the read ends the trace

    peaks, results = {}, {}
    for mode in ("strict", "fused"):
        g = torch.Generator().manual_seed(0)
        w0, x0 = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
        w, x = w0.to("tpu"), x0.to("tpu")
        device.set_mode(mode)
        try:
            start = torch.tpu.memory_allocated()
            torch.tpu.reset_peak_memory_stats()
            if mode == "fused":
                with no_fallbacks(programs=1):
                    v, total = step(w, x)
            else:
                v, total = step(w, x)
            peaks[mode] = torch.tpu.max_memory_allocated() - start
        finally:
            device.set_mode("strict")
        want = (x0 @ w0.t()).relu().view(-1)
        torch.testing.assert_close(v.cpu(), want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(w.cpu(), w0 * 0.5)
        results[mode] = total
    assert peaks["fused"] <= peaks["strict"], peaks
    assert results["fused"] == pytest.approx(results["strict"], rel=1e-4)
