"""Exports the kernels the PJRT tests compile, with jax.export.

usage: python export_kernels.py MODE OUT
  pallas_tpu     a Pallas kernel (x * 2 over (8, 128) blocks), exported for TPU, as MLIR text
  mistiled_tpu   the same kernel with (7, 100) blocks, which violate Mosaic's (8, 128) tiling
  jnp_bytecode   a plain jnp function exported for CPU, as a StableHLO portable artifact
"""
import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def double_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def pallas_double(block, shape):
    def f(x):
        grid = (shape[0] // block[0], shape[1] // block[1])
        spec = pl.BlockSpec(block, lambda i, j: (i, j))
        return pl.pallas_call(
            double_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=grid,
            in_specs=[spec],
            out_specs=spec,
        )(x)

    return f


def main():
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "pallas_tpu":
        shape = (16, 256)
        f, platforms = pallas_double((8, 128), shape), ["tpu"]
    elif mode == "mistiled_tpu":
        # jax refuses such blocks itself; switch its check off so the kernel reaches libtpu's
        # Mosaic compiler, whose own error (E2002) is what the test wants to see surfaced.
        from jax._src.pallas.mosaic import lowering

        lowering._check_block_mappings = lambda *args, **kwargs: None
        shape = (14, 200)
        f, platforms = pallas_double((7, 100), shape), ["tpu"]
    elif mode == "jnp_bytecode":
        shape = (2, 3)
        f, platforms = (lambda x: jnp.tanh(x) * 2.0 + 1.0), ["cpu"]
    else:
        sys.exit(f"unknown mode {mode}")
    exported = jax.export.export(jax.jit(f), platforms=platforms)(
        jax.ShapeDtypeStruct(shape, jnp.float32)
    )
    if mode == "jnp_bytecode":
        with open(out, "wb") as fh:
            fh.write(exported.mlir_module_serialized)
    else:
        with open(out, "w") as fh:
            fh.write(exported.mlir_module())


if __name__ == "__main__":
    main()
