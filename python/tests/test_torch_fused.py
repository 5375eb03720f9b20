"""Fused eager mode: recorded ops run as one cached program per materialisation point."""

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


def test_programs_are_cached_by_fingerprint():
    x, x2 = torch.randn(16, 32), torch.randn(16, 32)
    with substitute("fused"):
        a = chain(x)
    g0 = report().graphs
    with no_fallbacks(kernels=["silu"], programs=1):
        with substitute("fused"):
            b = chain(x2)
    g1 = report().graphs
    assert g1["memo_hits"] == g0["memo_hits"] + 1
    assert g1["compiled"] == g0["compiled"]
    # The reused program computes the new inputs' values, not the old ones'.
    torch.testing.assert_close(a, chain(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b, chain(x2), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(a, b)


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


def test_recording_failure_runs_the_op(monkeypatch):
    from tpu_kernels.torch.fused import FusedMode

    def broken(self, *a, **k):
        raise RuntimeError("recorder exploded")

    monkeypatch.setattr(FusedMode, "_record", broken)
    x = torch.randn(4, 4)
    with error_policy("fallback"):
        with substitute("fused"):
            y = torch.tanh(x) * 2
    torch.testing.assert_close(y, torch.tanh(x) * 2)
    assert "recorder exploded" in report().ops["fused"]["last_fallback"]
    with pytest.raises(InternalError, match="recorder exploded"):
        with error_policy("raise"), substitute("fused"):
            y = torch.tanh(x) * 2


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
