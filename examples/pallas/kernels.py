"""Three Pallas TPU kernels and jax's flash attention, imported into tpu-kernels.

Each is exported for TPU (a Mosaic kernel) and for CPU (the same kernel in Pallas interpret mode),
validated (jaxlib and Rust parse, signature, libtpu compile for v5e, CPU numerics against jax)
and registered. ``register_all()`` imports the four; ``python examples/pallas/run.py`` runs them
from PyTorch.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as fa

import tpu_kernels as tk

# --- a tiled matmul with an f32 accumulator in VMEM scratch ---------------------------------


def _matmul_kernel(x_ref, y_ref, o_ref, acc_ref, *, k_steps: int):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == k_steps - 1)
    def _done():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul(x: jax.Array, y: jax.Array, *, bm: int = 128, bk: int = 128, bn: int = 128) -> jax.Array:
    """``x @ y`` over (bm, bk) x (bk, bn) tiles, accumulating in an f32 VMEM buffer."""
    m, k = x.shape
    _, n = y.shape
    grid = (m // bm, n // bn, k // bk)
    return pl.pallas_call(
        functools.partial(_matmul_kernel, k_steps=grid[2]),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            grid=grid,
            in_specs=[
                pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
            ],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        ),
    )(x, y)


# --- a row-wise RMSNorm ----------------------------------------------------------------------


def _rms_norm_kernel(x_ref, w_ref, o_ref, *, eps: float):
    x = x_ref[...].astype(jnp.float32)
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    o_ref[...] = (x * jax.lax.rsqrt(ms + eps) * w_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def rms_norm(x: jax.Array, w: jax.Array, eps: float = 1e-6, *, rows: int = 8) -> jax.Array:
    """RMSNorm over the last dimension, `rows` rows per grid step, computed in f32."""
    n, d = x.shape
    return pl.pallas_call(
        functools.partial(_rms_norm_kernel, eps=eps),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(n // rows,),
        in_specs=[pl.BlockSpec((rows, d), lambda i: (i, 0)), pl.BlockSpec((1, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((rows, d), lambda i: (i, 0)),
    )(x, w.reshape(1, d))


# --- an elementwise kernel with BlockSpecs ----------------------------------------------------


def _scaled_silu_kernel(x_ref, y_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = x * jax.nn.sigmoid(x) * y_ref[...]


def silu_mul(x: jax.Array, y: jax.Array, *, block: tuple[int, int] = (8, 128)) -> jax.Array:
    """``silu(x) * y`` (a gated MLP's activation) over (8, 128) blocks."""
    spec = pl.BlockSpec(block, lambda i, j: (i, j))
    return pl.pallas_call(
        _scaled_silu_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(x.shape[0] // block[0], x.shape[1] // block[1]),
        in_specs=[spec, spec],
        out_specs=spec,
    )(x, y)


# --- jax's flash attention ------------------------------------------------------------------


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """jax.experimental.pallas.ops.tpu.flash_attention, non-causal, scale 1/sqrt(head_dim)."""
    return fa.flash_attention(q, k, v, causal=False, sm_scale=q.shape[-1] ** -0.5)


def attention_reference(q, k, v):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * q.shape[-1] ** -0.5
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


_registered: dict[str, tk.ImportedKernel] = {}


def register_all() -> dict[str, tk.ImportedKernel]:
    """Imports the four kernels (new ops in the `tpuk_examples` namespace), once per process."""
    for key, register in _IMPORTS.items():
        if key not in _registered:
            _registered[key] = register()
    return dict(_registered)


def unregister_all() -> None:
    """Removes the kernels `register_all` imported (and their ops)."""
    while _registered:
        _, k = _registered.popitem()
        tk.unregister(k.name)


_IMPORTS = {
    "matmul": lambda: tk.register_jax(
        matmul,
        name="pallas_matmul",
        op="tpuk_examples::matmul",
        signatures=["f32[256,256], f32[256,256]"],
        reference=lambda x, y: x @ y,
    ),
    "rms_norm": lambda: tk.register_jax(
        rms_norm,
        name="pallas_rms_norm",
        op="tpuk_examples::rms_norm",
        signatures=["f32[B,128], f32[128]"],
        statics={"eps": 1e-6},
        constraints=["mod(B, 8) == 0"],
        validate_dims={"B": 16},
    ),
    "silu_mul": lambda: tk.register_jax(
        silu_mul,
        name="pallas_silu_mul",
        op="tpuk_examples::silu_mul",
        signatures=["f32[16,256], f32[16,256]"],
        reference=lambda x, y: jax.nn.silu(x) * y,
    ),
    "flash_attention": lambda: tk.register_jax(
        flash_attention,
        name="flash_attention",
        op="tpuk_examples::flash_attention",
        signatures=["f32[1,2,256,128], f32[1,2,256,128], f32[1,2,256,128]"],
        reference=attention_reference,
    ),
}
