"""Exports the demo crate's imported kernels with jax.export (run from this directory).

    ~/.cache/tpu-kernels/venv/bin/python export_kernels.py

Writes kernels/attention.tpu.mlir (a Pallas kernel lowered for TPU: a tpu_custom_call) and
kernels/attention.cpu.mlir (the same Pallas kernel in interpret mode, plain StableHLO that
XLA:CPU runs). Shapes: q, k, v f32[2, 8, 16, 64] -> f32[2, 8, 16, 64].
"""

import pathlib

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

B, H, S, D = 2, 8, 16, 64


def attention_kernel(q_ref, k_ref, v_ref, o_ref):
    q = q_ref[0, 0]
    k = k_ref[0, 0]
    v = v_ref[0, 0]
    s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * (1.0 / D**0.5)
    s = s - jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s)
    p = p / jnp.sum(p, axis=-1, keepdims=True)
    o_ref[0, 0] = jnp.dot(p, v, preferred_element_type=jnp.float32).astype(o_ref.dtype)


def attention(q, k, v, *, interpret):
    block = pl.BlockSpec((1, 1, S, D), lambda b, h: (b, h, 0, 0))
    return pl.pallas_call(
        attention_kernel,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(B, H),
        in_specs=[block, block, block],
        out_specs=block,
        interpret=interpret,
    )(q, k, v)


def main():
    out = pathlib.Path("kernels")
    out.mkdir(exist_ok=True)
    arg = jax.ShapeDtypeStruct((B, H, S, D), jnp.float32)
    for platform, interpret in [("tpu", False), ("cpu", True)]:
        fn = jax.jit(lambda q, k, v, i=interpret: attention(q, k, v, interpret=i))
        exported = jax.export.export(fn, platforms=[platform])(arg, arg, arg)
        path = out / f"attention.{platform}.mlir"
        path.write_text(exported.mlir_module())
        print(f"wrote {path} ({len(exported.mlir_module())} bytes)")


if __name__ == "__main__":
    main()
