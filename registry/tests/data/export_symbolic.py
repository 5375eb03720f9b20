"""Exports jax functions with symbolic shapes, for the shape-refinement tests.

usage: python export_symbolic.py [--mlir NAME]

Prints one JSON object on stdout: {"cases": [...]}, one case per function, each with
  name      the case name
  mlir      the exported module text (`exported.mlir_module()`), symbolic shapes included
  runs      for 1-3 concrete shapes: the inputs (short type like "f32[4,512]" and flat data)
            and jax's outputs on them (the jitted function called on the same inputs)
  failures  concrete input types that violate the shape specification, with the message of
            jax's own shape check (the refiner must report the same message)

Data are deterministic (a fixed formula, no random state) and exactly representable in the
input dtype; bf16 values are written as the floats they are. With `--mlir NAME` it prints the
module text of one case instead (for reading what jax emits).
"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_platforms", "cpu")


def rms_norm(x):
    xf = x.astype(jnp.float32)
    scale = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6)
    return (xf * scale).astype(x.dtype)


def softmax(x):
    return jax.nn.softmax(x, axis=-1)


def layer_norm(x, gamma, beta):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * gamma + beta


def matmul(x, w):
    return jnp.dot(x, w, preferred_element_type=jnp.float32)


def reshape_wide(x):
    b = x.shape[0]
    return x.reshape(2 * b, 256) * 2.0


def reshape_split(x):
    return x.reshape(x.shape[0] // 4, 4) + 1.0


def concat(x, y):
    return jnp.concatenate([x, y * 2.0], axis=0)


def arange_mask(x):
    b = x.shape[0]
    rows = jnp.arange(b)
    return jnp.where((rows % 3 == 0)[:, None], x, -x) + rows[:, None].astype(x.dtype)


def pad(x):
    return jnp.pad(x, ((1, 2), (0, 3)), constant_values=0.5)


def cumsum(x):
    return jnp.cumsum(x, axis=0)


def argmax(x):
    return jnp.argmax(x, axis=1).astype(jnp.int32)


def fori(x):
    def body(i, acc):
        return acc * 0.5 + x + i.astype(x.dtype)

    return jax.lax.fori_loop(0, 5, body, x)


def while_loop(x):
    def cond(c):
        return c[0] < x.shape[0]

    def body(c):
        i, acc = c
        return i + 1, acc + jnp.sin(acc) * 0.1

    return jax.lax.while_loop(cond, body, (0, x))[1]


def sort(x):
    return jnp.sort(x, axis=0)


def halves(x):
    b = x.shape[0]
    return x[:, :b] * 2.0 + x[:, b:]


def square(x):
    return x + x.T


def attention(q, k):
    s = jnp.einsum("bqd,bkd->bqk", q, k) / 4.0
    return jax.nn.softmax(s, axis=-1)


def gelu(x):
    # erfc is exported as a stablehlo.composite with a decomposition function.
    return jax.nn.gelu(x, approximate=False)


def top_k(x):
    values, indices = jax.lax.top_k(x, 3)
    return values, indices.astype(jnp.int32)


def take(x, i):
    return jnp.take(x, i, axis=0)


def scatter(x):
    return x.at[0].set(1.0).at[-1].add(2.0)


def strided(x):
    return x[::2] * 2.0 + x[1::2].sum()


def cond(x):
    return jax.lax.cond(x.sum() > 0, lambda y: y * 2.0, lambda y: -y, x)


def conv(x, w):
    return jax.lax.conv(x, w, (1, 1), "SAME")


def pad_by_dim(x):
    # Padding by a symbolic amount: stablehlo.dynamic_pad.
    return jnp.pad(x, ((0, x.shape[0]), (1, 0)), constant_values=2.0)


def slice_to_dim(x):
    # A strided slice with a symbolic limit: stablehlo.real_dynamic_slice.
    return jax.lax.slice(x, (1, 0), (x.shape[0], 8), (2, 1))


def first_half(x):
    return x[: x.shape[0] // 2] * 3.0


# name, function, symbolic input spec, concrete shape sets, bad shape sets.
# A spec is a list of (shape string, dtype); a shape set gives each input's concrete shape.
CASES = [
    ("rms_norm", rms_norm, [("b, 512", jnp.bfloat16)], [[(2, 512)], [(5, 512)]], [[(0, 512)]]),
    ("softmax", softmax, [("b, n", jnp.float32)], [[(3, 7)], [(1, 128)], [(4, 33)]], []),
    (
        "layer_norm",
        layer_norm,
        [("b, 64", jnp.float32), ("64", jnp.float32), ("64", jnp.float32)],
        [[(3, 64), (64,), (64,)], [(6, 64), (64,), (64,)]],
        [],
    ),
    (
        "matmul",
        matmul,
        [("b, 48", jnp.float32), ("48, 16", jnp.float32)],
        [[(2, 48), (48, 16)], [(7, 48), (48, 16)]],
        [],
    ),
    ("reshape_wide", reshape_wide, [("b, 512", jnp.float32)], [[(1, 512)], [(3, 512)]], []),
    ("reshape_split", reshape_split, [("4*b", jnp.float32)], [[(8,)], [(20,)]], [[(6,)]]),
    (
        "concat",
        concat,
        [("b, 8", jnp.float32), ("c, 8", jnp.float32)],
        [[(2, 8), (3, 8)], [(5, 8), (1, 8)]],
        [],
    ),
    ("arange_mask", arange_mask, [("b, 16", jnp.float32)], [[(4, 16)], [(7, 16)]], []),
    ("pad", pad, [("b, 8", jnp.float32)], [[(1, 8)], [(4, 8)]], []),
    ("cumsum", cumsum, [("b, 8", jnp.float32)], [[(5, 8)], [(12, 8)]], []),
    ("argmax", argmax, [("b, 16", jnp.float32)], [[(3, 16)], [(9, 16)]], []),
    ("fori_loop", fori, [("b, 8", jnp.float32)], [[(2, 8)], [(6, 8)]], []),
    ("while_loop", while_loop, [("b, 8", jnp.float32)], [[(3, 8)], [(5, 8)]], []),
    ("sort", sort, [("b, 8", jnp.float32)], [[(4, 8)], [(11, 8)]], []),
    ("halves", halves, [("b, 2*b", jnp.float32)], [[(2, 4)], [(5, 10)]], [[(3, 7)]]),
    ("square", square, [("b, b", jnp.float32)], [[(3, 3)]], [[(3, 4)]]),
    (
        "attention",
        attention,
        [("b, n, 16", jnp.float32), ("b, n, 16", jnp.float32)],
        [[(2, 5, 16), (2, 5, 16)], [(1, 9, 16), (1, 9, 16)]],
        [],
    ),
    ("gelu", gelu, [("b, 8", jnp.float32)], [[(3, 8)], [(6, 8)]], []),
    ("top_k", top_k, [("b, 8", jnp.float32)], [[(3, 8)], [(5, 8)]], []),
    (
        "take",
        take,
        [("b, 8", jnp.float32), ("k", jnp.int32)],
        [[(5, 8), (3,)], [(4, 8), (7,)]],
        [],
    ),
    ("scatter", scatter, [("b, 8", jnp.float32)], [[(4, 8)], [(1, 8)]], []),
    ("strided", strided, [("b, 8", jnp.float32)], [[(5, 8)], [(2, 8)]], []),
    ("cond", cond, [("b, 8", jnp.float32)], [[(3, 8)], [(4, 8)]], []),
    (
        "conv",
        conv,
        [("b, 3, 8, 8", jnp.float32), ("4, 3, 3, 3", jnp.float32)],
        [[(2, 3, 8, 8), (4, 3, 3, 3)], [(5, 3, 8, 8), (4, 3, 3, 3)]],
        [],
    ),
    ("pad_by_dim", pad_by_dim, [("b, 8", jnp.float32)], [[(3, 8)], [(1, 8)]], []),
    ("slice_to_dim", slice_to_dim, [("b, 8", jnp.float32)], [[(7, 8)], [(2, 8)]], []),
    ("first_half", first_half, [("b, 8", jnp.float32)], [[(6, 8)], [(5, 8)]], []),
]

def short_type(a):
    name = {"float32": "f32", "bfloat16": "bf16", "int32": "i32", "bool": "bool"}[str(a.dtype)]
    return f"{name}[{','.join(str(d) for d in a.shape)}]"


def data_for(shape, dtype, salt):
    """Deterministic values: floats in [-4, 4), exactly representable in bf16; integers in
    [0, 3) (valid indices for every case here)."""
    n = int(np.prod(shape, dtype=np.int64))
    i = np.arange(n, dtype=np.int64)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.asarray(((i * 7 + salt) % 3).reshape(shape), dtype=dtype)
    v = ((i * 37 + salt * 101) % 256 - 128).astype(np.float32) / 32.0
    return jnp.asarray(v.reshape(shape), dtype=dtype)


def flat(a):
    a = np.asarray(a)
    if a.dtype.kind in "iub":
        return [int(v) for v in a.reshape(-1)]
    return [float(v) for v in a.astype(np.float32).reshape(-1)]


def export(fn, spec):
    scope = jax.export.SymbolicScope()
    args = [
        jax.ShapeDtypeStruct(jax.export.symbolic_shape(s, scope=scope), dtype) for s, dtype in spec
    ]
    return jax.export.export(jax.jit(fn), platforms=["cpu"])(*args)


def run_case(name, fn, spec, shape_sets, bad_sets):
    exported = export(fn, spec)
    jitted = jax.jit(fn)
    runs = []
    for shapes in shape_sets:
        inputs = [data_for(s, dt, k) for k, (s, (_, dt)) in enumerate(zip(shapes, spec))]
        outputs = jitted(*inputs)
        if not isinstance(outputs, (tuple, list)):
            outputs = [outputs]
        runs.append(
            {
                "inputs": [{"type": short_type(a), "data": flat(a)} for a in inputs],
                "outputs": [{"type": short_type(a), "data": flat(a)} for a in outputs],
            }
        )
    failures = []
    for shapes in bad_sets:
        inputs = [jnp.zeros(s, dt) for s, (_, dt) in zip(shapes, spec)]
        try:
            exported.call(*inputs)
        except Exception as e:  # jax raises ValueError for shape assertion failures
            failures.append({"inputs": [short_type(a) for a in inputs], "message": str(e)})
        else:
            sys.exit(f"{name}: jax accepted the bad shapes {shapes}")
    return {"name": name, "mlir": exported.mlir_module(), "runs": runs, "failures": failures}


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--mlir":
        for name, fn, spec, _, _ in CASES:
            if name == sys.argv[2]:
                print(export(fn, spec).mlir_module())
                return
        sys.exit(f"unknown case {sys.argv[2]}")
    cases = [run_case(*case) for case in CASES]
    json.dump({"cases": cases}, sys.stdout)


if __name__ == "__main__":
    main()
