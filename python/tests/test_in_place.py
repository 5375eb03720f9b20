"""Kernels that update their inputs in place (`mutates`): `tpuk::adamw_step` writes the new
parameter and moments into the tensors' own memory, eagerly on CPU tensors, at the "tpu"
device's key, in the eager modes and under `torch.compile`.

"In place" is checked where it shows: the tensors' data pointers do not move, the dispatcher
counts each argument it updated in its own memory (donated to the program, so the program's
output is that memory) apart from those it had to copy into, and on the device no memory is
allocated for new state (peak memory). Values are checked against PyTorch's AdamW formula.
"""

import pytest

torch = pytest.importorskip("torch")

import tpu_kernels as tk  # noqa: E402
import tpu_kernels.device  # noqa: E402,F401
from tpu_kernels.testing import no_fallbacks  # noqa: E402
from tpu_kernels.torch import custom_ops  # noqa: E402
from tpu_kernels.torch._references import adamw_step as reference  # noqa: E402

custom_ops()
ADAMW = torch.ops.tpuk.adamw_step.default
OP = "tpuk::adamw_step.default"
HP = {"lr": 1e-2, "weight_decay": 0.1}


def _state(device="cpu", shape=(256, 512), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    p, grad, m = (torch.randn(shape, generator=g, dtype=dtype) for _ in range(3))
    v = torch.rand(shape, generator=g, dtype=dtype)
    return [t.to(device) for t in (p, grad, m, v)] + [torch.tensor(3.0, device=device)]


def _want(state):
    return reference(*[t.cpu().clone() for t in state], **HP)


def _updates():
    o = tk.report().ops.get(OP, {})
    return o.get("updated_in_place", 0), o.get("updated_by_copy", 0)


def _check(state, want):
    for got, w in zip((state[0], state[2], state[3]), want):
        torch.testing.assert_close(got.cpu(), w, rtol=1e-5, atol=1e-6)


def test_the_schema_marks_the_updated_arguments_and_returns_nothing():
    schema = str(ADAMW._schema)
    assert "Tensor(a!) param" in schema and "Tensor(b!) exp_avg" in schema
    assert "Tensor(c!) exp_avg_sq" in schema and "Tensor grad" in schema
    assert schema.endswith("-> ()")
    torch.library.opcheck(ADAMW, tuple(_state(shape=(8, 128))), HP)


def test_an_eager_call_writes_the_state_where_it_lies():
    state = _state()
    want = _want(state)
    ptrs = [t.data_ptr() for t in state]
    before = _updates()
    with no_fallbacks(kernels=["adamw_step"]):
        assert ADAMW(*state, **HP) is None
    assert [t.data_ptr() for t in state] == ptrs
    after = _updates()
    assert (after[0] - before[0], after[1] - before[1]) == (3, 0), "param, exp_avg, exp_avg_sq donated"
    _check(state, want)
    # The gradient and the step are read, never written.
    torch.testing.assert_close(state[1], _state()[1])


def test_a_strided_argument_is_updated_through_a_contiguous_copy():
    p, grad, m, v, step = _state(shape=(128, 64))
    p = p.t().contiguous().t()  # the same values, column-major
    state = [p, grad, m, v, step]
    want = _want(state)
    ptr = p.data_ptr()
    with no_fallbacks(kernels=["adamw_step"]):
        ADAMW(*state, **HP)
    assert p.data_ptr() == ptr and not p.is_contiguous()
    _check(state, want)


def test_a_call_no_kernel_takes_updates_the_arguments_through_the_reference():
    state = _state(shape=(16, 32), dtype=torch.float64)
    state[4] = torch.tensor(3.0)
    want = _want(state)
    with no_fallbacks(allow={OP: "f64 is not among the kernel's dtypes"}) as ran:
        ADAMW(*state, **HP)
    assert ran.fallbacks == {(OP, "no_kernel"): 1}
    _check(state, want)


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_autograd_refuses_a_backward_whose_saved_tensor_was_updated(device):
    state = _state(device, shape=(8, 16))
    x = torch.randn(8, 16, device=device, requires_grad=True)
    loss = (x * state[0]).sum()  # saves the parameter for backward
    version = state[0]._version
    ADAMW(*state, **HP)
    assert state[0]._version == version + 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_on_the_device_the_kernel_updates_the_state_at_the_key_with_no_new_memory():
    state = _state("tpu")
    want = _want(state)
    ptrs = [t.data_ptr() for t in state]
    fell_back = tk.report().device["fallbacks"].get(OP, 0)
    before = _updates()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    with no_fallbacks(kernels=["adamw_step"]):
        ADAMW(*state, **HP)
    assert torch.tpu.max_memory_allocated() == base, "no memory for a new state"
    assert [t.data_ptr() for t in state] == ptrs
    assert tk.report().device["fallbacks"].get(OP, 0) == fell_back, "ran at the key"
    after = _updates()
    assert (after[0] - before[0], after[1] - before[1]) == (3, 0)
    _check(state, want)


@pytest.mark.parametrize("mode", ["strict", "debug", "fused"])
def test_in_the_eager_modes_the_op_runs_as_itself(mode):
    state = _state(shape=(32, 64))
    want = _want(state)
    ptrs = [t.data_ptr() for t in state]
    with tk.substitute(mode), no_fallbacks(kernels=["adamw_step"]):
        ADAMW(*state, **HP)
    assert [t.data_ptr() for t in state] == ptrs
    _check(state, want)


def _optimizer_step(p, grad, m, v, step):
    ADAMW(p, grad, m, v, step, **HP)
    return (grad * grad).sum()


def _graph_updates():
    g = tk.report().graphs
    return g.get("inputs_updated_in_place", 0), g.get("inputs_updated_by_copy", 0)


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_torch_compile_updates_the_state_in_place_inside_the_program(device):
    torch._dynamo.reset()
    f = torch.compile(_optimizer_step, backend="tpu_kernels", fullgraph=True)
    state = _state(device)
    want = _want(state)
    ptrs = [t.data_ptr() for t in state]
    before = _graph_updates()
    # The kernel is inlined in the graph's one program; nothing runs in PyTorch.
    with no_fallbacks(kernels=["adamw_step"], programs=1) as ran:
        out = f(*state)
    assert ran.kernels == {"adamw_step": 1} and ran.pytorch_nodes == {}
    torch.testing.assert_close(out.cpu(), (state[1].cpu() ** 2).sum())
    assert [t.data_ptr() for t in state] == ptrs
    after = _graph_updates()
    assert (after[0] - before[0], after[1] - before[1]) == (3, 0), "param, exp_avg, exp_avg_sq donated"
    _check(state, want)
    if device == "tpu":
        # A second step allocates nothing for the state: no clone, no new output, no copy back.
        want = _want(state)
        torch.tpu.reset_peak_memory_stats()
        base = torch.tpu.memory_allocated()
        f(*state)
        assert torch.tpu.max_memory_allocated() - base < state[0].numel() * 4
        _check(state, want)


def test_a_compiled_in_place_call_the_program_cannot_take_runs_in_place_in_pytorch():
    # f64 state: no kernel takes it, so the call stays in PyTorch; there it runs in place (the
    # op's reference writes the tensors), not as clone, update, copy back.
    torch._dynamo.reset()
    f = torch.compile(_optimizer_step, backend="tpu_kernels", fullgraph=True)
    state = _state(shape=(16, 32), dtype=torch.float64)
    state[4] = torch.tensor(3.0)
    want = _want(state)
    ptrs = [t.data_ptr() for t in state]
    with no_fallbacks(allow={OP: "f64 state: no kernel takes it"}) as ran:
        f(*state)
    assert ran.pytorch_nodes == {OP: 1}, ran.pytorch_nodes
    assert "runs as itself, updating its arguments in place" in tk.report().compiled["eager_reasons"][OP]
    assert [t.data_ptr() for t in state] == ptrs
    _check(state, want)


def test_torch_compile_keeps_the_functional_form_where_the_old_value_is_read():
    torch._dynamo.reset()

    def step(p, grad, m, v, step):
        before = p * 2  # reads the parameter before the update
        ADAMW(p, grad, m, v, step, **HP)
        return before + p

    state = _state(shape=(16, 32))
    eager_state = [t.clone() for t in state]
    want_out = step(*eager_state)
    out = torch.compile(step, backend="tpu_kernels", fullgraph=True)(*state)
    torch.testing.assert_close(out, want_out)
    for got, w in zip(state, eager_state):
        torch.testing.assert_close(got, w)


def _pallas_add_into():
    """A Pallas kernel that adds `y` into `x` in place (``input_output_aliases={0: 0}``)."""
    jax = pytest.importorskip("jax")
    from jax.experimental import pallas as pl

    def body(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    def add_into(x, y):
        return pl.pallas_call(
            body,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(x.shape[0] // 128,),
            in_specs=[pl.BlockSpec((128, x.shape[1]), lambda i: (i, 0))] * 2,
            out_specs=pl.BlockSpec((128, x.shape[1]), lambda i: (i, 0)),
            input_output_aliases={0: 0},
        )(x, y)

    return add_into


def test_a_pallas_kernel_with_input_output_aliases_updates_its_input_in_place(cleanup):
    k = tk.register_jax(
        _pallas_add_into(), op="inplace_test::add_into", signatures=["f32[256,512], f32[256,512]"], mutates_args=["x"]
    )
    assert "tf.aliasing_output = 0 : i32" in k.tpu and "tf.aliasing_output = 0 : i32" in k.cpu
    assert k.checks["tpu_compile"] == "compiled for v5e:1x1", k.checks
    op = torch.ops.inplace_test.add_into.default
    assert "Tensor(a!) x" in str(op._schema) and str(op._schema).endswith("-> ()")
    key = "inplace_test::add_into.default"

    def updated():
        o = tk.report().ops.get(key, {})
        return o.get("updated_in_place", 0)

    for device in ("cpu", "tpu"):
        x, y = torch.randn(256, 512, device=device), torch.randn(256, 512, device=device)
        want = x.cpu() + y.cpu()
        ptr, before = x.data_ptr(), updated()
        if device == "tpu":
            torch.tpu.reset_peak_memory_stats()
            base = torch.tpu.memory_allocated()
        with no_fallbacks(kernels=[k.name]):
            assert op(x, y) is None
        if device == "tpu":
            assert torch.tpu.max_memory_allocated() == base, "no memory for the result"
        assert x.data_ptr() == ptr and updated() == before + 1, device
        torch.testing.assert_close(x.cpu(), want)

    torch._dynamo.reset()

    def twice(x, y):
        op(x, y)
        op(x, y)
        return y.sum()

    x, y = torch.randn(256, 512), torch.randn(256, 512)
    want = x + 2 * y
    ptr, before = x.data_ptr(), tk.report().graphs.get("inputs_updated_in_place", 0)
    # Both calls inlined in one program, chained; x donated to the second call's result.
    with no_fallbacks(kernels=[k.name], programs=1) as ran:
        torch.compile(twice, backend="tpu_kernels", fullgraph=True)(x, y)
    assert ran.kernels == {k.name: 2}
    assert x.data_ptr() == ptr and tk.report().graphs.get("inputs_updated_in_place", 0) == before + 1
    torch.testing.assert_close(x, want)


def test_mutates_args_names_tensor_inputs_of_a_new_op(cleanup):
    from tpu_kernels.errors import RegistrationError

    add_into = _pallas_add_into()
    with pytest.raises(RegistrationError, match=r"mutates_args \['z'\] are not tensor inputs"):
        tk.register_jax(add_into, op="inplace_test::bad", signatures=["f32[128,128], f32[128,128]"], mutates_args=["z"])
    with pytest.raises(RegistrationError, match="for a new op"):
        tk.register_jax(add_into, op="aten::add.Tensor", signatures=["f32[128,128], f32[128,128]"], mutates_args=["x"])
    assert not any(k["name"] == "add_into" for k in tk.kernels()), "nothing registered"
