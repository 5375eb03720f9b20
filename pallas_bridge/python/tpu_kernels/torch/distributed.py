"""Sharded training steps: one SPMD program over several devices, single-controller.

A training step (forward, loss, backward) is traced into one ATen graph, lowered to one
StableHLO program with the registered kernels inlined, and annotated with the shardings of its
inputs and outputs. XLA's SPMD partitioner splits it and inserts the collectives; this process
runs it on N PJRT CPU devices (``TPUK_CPU_DEVICES``, default 8), or libtpu compiles it for a
TPU slice (``ShardedStep.compile_for("v5e:2x2")``). There is no process group and no
collective of ours.

Shardings are written as DTensor writes them: a mesh (:func:`init_device_mesh`) and one
placement per mesh dimension, ``Shard(dim)`` or ``Replicate()`` (PyTorch's own classes). The
three usual layouts are plans: :func:`data_parallel`, :func:`fully_sharded` (FSDP-style, every
parameter sharded along dim 0) and :func:`tensor_parallel` (Megatron column and row linears).

    mesh = init_device_mesh((4,), mesh_dim_names=("dp",))
    step = compile_step(model, lambda m, x, y: F.cross_entropy(m(x), y), mesh,
                        **data_parallel(mesh), example=(x, y))
    loss = step(x, y)          # every parameter's .grad is the whole gradient
    optimizer.step()

Where it differs from DTensor: parameters stay whole CPU tensors between steps (the step cuts
them into shards, and puts the gradients back together); ``Partial`` placements are not taken.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Sequence

import torch
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from ..errors import TpuKernelsError
from . import _stats
from ._native import native
from ._output import as_tensor
from .graph import dumps, fx_to_json, graph_constants

__all__ = [
    "DeviceMesh",
    "Partial",
    "Replicate",
    "Shard",
    "ShardedStep",
    "ShardingError",
    "compile_step",
    "cpu_device_count",
    "data_parallel",
    "fully_sharded",
    "hlo_sharding",
    "init_device_mesh",
    "tensor_parallel",
]


class ShardingError(TpuKernelsError, ValueError):
    """A mesh, placement or step that cannot be sharded as asked."""


def cpu_device_count() -> int:
    """How many PJRT CPU devices sharded steps can use in this process."""
    return native().cpu_device_count()


class DeviceMesh:
    """An n-dimensional arrangement of devices ``0..size-1`` (row-major), named per dimension
    as ``torch.distributed.device_mesh.DeviceMesh`` names them."""

    def __init__(self, mesh_shape: Sequence[int], mesh_dim_names: Sequence[str] | None = None) -> None:
        shape = tuple(int(s) for s in mesh_shape)
        if not shape or any(s < 1 for s in shape):
            raise ShardingError(f"a mesh shape is one or more sizes of at least 1, not {tuple(mesh_shape)}")
        names = tuple(mesh_dim_names) if mesh_dim_names is not None else tuple(f"dim{i}" for i in range(len(shape)))
        if len(names) != len(shape) or len(set(names)) != len(names):
            raise ShardingError(f"mesh_dim_names {names} must name each of the {len(shape)} mesh dimensions once")
        available = cpu_device_count()
        if math.prod(shape) > available:
            raise ShardingError(
                f"a mesh of shape {shape} needs {math.prod(shape)} devices; this process has {available} "
                "CPU devices (set TPUK_CPU_DEVICES before the first sharded step)"
            )
        self.shape = shape
        self.mesh_dim_names = names

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def size(self, mesh_dim: int | str | None = None) -> int:
        if mesh_dim is None:
            return math.prod(self.shape)
        return self.shape[self._dim(mesh_dim)]

    def _dim(self, mesh_dim: int | str) -> int:
        if isinstance(mesh_dim, str):
            if mesh_dim not in self.mesh_dim_names:
                raise ShardingError(f"the mesh has no dimension {mesh_dim!r} (it has {self.mesh_dim_names})")
            return self.mesh_dim_names.index(mesh_dim)
        return mesh_dim

    def coordinate(self, device: int) -> tuple[int, ...]:
        """The mesh coordinate of device ``device``."""
        out = []
        for s in reversed(self.shape):
            out.append(device % s)
            device //= s
        return tuple(reversed(out))

    def __repr__(self) -> str:
        return f"DeviceMesh(shape={self.shape}, mesh_dim_names={self.mesh_dim_names})"


def init_device_mesh(mesh_shape: Sequence[int], mesh_dim_names: Sequence[str] | None = None) -> DeviceMesh:
    """A :class:`DeviceMesh` of this process's CPU devices (as ``torch.distributed.init_device_mesh``,
    without a device type: the devices are PJRT's)."""
    return DeviceMesh(mesh_shape, mesh_dim_names)


def _check(mesh: DeviceMesh, placements: Sequence[Placement], shape: Sequence[int], name: str) -> list[list[int]]:
    """Per tensor dim, the mesh dims that shard it (in mesh order); errors name what is wrong."""
    placements = tuple(placements)
    if len(placements) != mesh.ndim:
        raise ShardingError(f"{name}: {len(placements)} placements for a mesh of {mesh.ndim} dimensions {mesh.shape}")
    by_dim: list[list[int]] = [[] for _ in shape]
    for k, p in enumerate(placements):
        if isinstance(p, Shard):
            d = p.dim + len(shape) if p.dim < 0 else p.dim
            if not 0 <= d < len(shape):
                raise ShardingError(f"{name}: Shard({p.dim}) of a tensor of rank {len(shape)}")
            by_dim[d].append(k)
        elif isinstance(p, Partial):
            raise ShardingError(f"{name}: Partial placements are not taken (a step's inputs are whole values)")
        elif not isinstance(p, Replicate):
            raise ShardingError(f"{name}: placement {p!r} is neither Shard nor Replicate")
    for d, ks in enumerate(by_dim):
        parts = math.prod(mesh.shape[k] for k in ks)
        if shape[d] % parts:
            dims = " x ".join(f"{mesh.mesh_dim_names[k]}={mesh.shape[k]}" for k in ks)
            raise ShardingError(
                f"{name}: dimension {d} of size {shape[d]} does not divide into {parts} shards "
                f"(mesh {mesh.shape}, sharded over {dims})"
            )
    return by_dim


def hlo_sharding(mesh: DeviceMesh, placements: Sequence[Placement], shape: Sequence[int], name: str = "tensor") -> str:
    """XLA's sharding (``mhlo.sharding``) of a tensor of ``shape`` placed on ``mesh``."""
    by_dim = _check(mesh, placements, shape, name)
    sharding_dims = [k for ks in by_dim for k in ks]
    if not sharding_dims:
        return "{replicated}"
    rest = [k for k in range(mesh.ndim) if k not in sharding_dims]
    ids = torch.arange(mesh.size()).reshape(mesh.shape).permute(*sharding_dims, *rest).flatten().tolist()
    tiles = [math.prod(mesh.shape[k] for k in ks) for ks in by_dim]
    replicas = math.prod(mesh.shape[k] for k in rest)
    if replicas > 1:
        tiles.append(replicas)
    text = "{devices=[" + ",".join(map(str, tiles)) + "]" + ",".join(map(str, ids))
    return text + (" last_tile_dim_replicate}" if replicas > 1 else "}")


def _shard(t: torch.Tensor, mesh: DeviceMesh, by_dim: list[list[int]], device: int) -> torch.Tensor:
    coord = mesh.coordinate(device)
    for d, ks in enumerate(by_dim):
        if not ks:
            continue
        index = 0
        for k in ks:
            index = index * mesh.shape[k] + coord[k]
        size = t.shape[d] // math.prod(mesh.shape[k] for k in ks)
        t = t.narrow(d, index * size, size)
    return t.contiguous()


def _unshard(pieces: list[torch.Tensor], mesh: DeviceMesh, by_dim: list[list[int]]) -> torch.Tensor:
    """The whole tensor from each device's shard (replicas agree: the first is taken)."""
    if not any(by_dim):
        return pieces[0]
    first = pieces[0]
    shape = [s * math.prod(mesh.shape[k] for k in ks) for s, ks in zip(first.shape, by_dim)]
    out = torch.empty(shape, dtype=first.dtype)
    done = set()
    for device, piece in enumerate(pieces):
        coord = mesh.coordinate(device)
        key = tuple(coord[k] for ks in by_dim for k in ks)
        if key in done:
            continue
        done.add(key)
        view = out
        for d, ks in enumerate(by_dim):
            if ks:
                index = 0
                for k in ks:
                    index = index * mesh.shape[k] + coord[k]
                view = view.narrow(d, index * piece.shape[d], piece.shape[d])
        view.copy_(piece)
    return out


ParamPlan = dict[str, Sequence[Placement]] | Callable[[str, torch.Tensor], Sequence[Placement] | None]


def data_parallel(mesh: DeviceMesh, mesh_dim: str | int = 0) -> dict:
    """Batch sharded along ``mesh_dim``, parameters replicated: XLA all-reduces the gradients."""
    k = mesh._dim(mesh_dim)
    batch = tuple(Shard(0) if i == k else Replicate() for i in range(mesh.ndim))
    return {"params": lambda name, p: None, "inputs": batch}


def fully_sharded(mesh: DeviceMesh, mesh_dim: str | int = 0) -> dict:
    """FSDP-style: every parameter sharded along its dim 0 over ``mesh_dim`` (as FSDPv2
    shards), the batch too; XLA gathers parameters where they are used and reduce-scatters
    their gradients."""
    k = mesh._dim(mesh_dim)
    shard0 = tuple(Shard(0) if i == k else Replicate() for i in range(mesh.ndim))
    return {"params": lambda name, p: shard0, "inputs": shard0}


def tensor_parallel(
    mesh: DeviceMesh, colwise: Sequence[str], rowwise: Sequence[str], mesh_dim: str | int = 0
) -> dict:
    """Megatron-style: the linears named in ``colwise`` split their output features (weight and
    bias ``Shard(0)``), those in ``rowwise`` their input features (weight ``Shard(1)``, bias
    replicated), as ``ColwiseParallel`` and ``RowwiseParallel`` do; the batch is replicated.
    Names are module paths, with ``*`` wildcards as ``parallelize_module`` takes them
    (``"blocks.*.attn.qkv"``)."""
    k = mesh._dim(mesh_dim)

    def matches(module: str, patterns: Sequence[str]) -> bool:
        return any(fnmatch.fnmatchcase(module, p) for p in patterns)

    def on(place: Placement) -> tuple:
        return tuple(place if i == k else Replicate() for i in range(mesh.ndim))

    def plan(name: str, p: torch.Tensor):
        module, _, leaf = name.rpartition(".")
        if matches(module, colwise):
            return on(Shard(0))
        if matches(module, rowwise) and leaf == "weight":
            return on(Shard(1))
        return None

    return {"params": plan, "inputs": tuple(Replicate() for _ in range(mesh.ndim))}


class _LossModule(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, loss_fn) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *inputs):
        return self.loss_fn(self.model, *inputs)


class ShardedStep:
    """One compiled training step over a mesh (see :func:`compile_step`)."""

    def __init__(
        self, model, loss_fn, mesh: DeviceMesh, params: ParamPlan, inputs, example, name: str, per_shard=None
    ) -> None:
        from torch.fx.experimental.proxy_tensor import make_fx

        from ._bindings import refused_kernels
        from .backend import decompositions

        self.model, self.mesh, self.name = model, mesh, name
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        self.names = [n for n, _ in named]
        plan = params if callable(params) else (lambda n, p, _d=dict(params): _d.get(n))
        repl = tuple(Replicate() for _ in range(mesh.ndim))
        self.param_placements = [tuple(plan(n, p) or repl) for n, p in named]
        example = tuple(example)
        if inputs is None or isinstance(inputs, Placement) or (inputs and isinstance(inputs[0], Placement)):
            inputs = [inputs or repl] * len(example)
        self.input_placements = [tuple(p) for p in inputs]
        if len(self.input_placements) != len(example):
            raise ShardingError(f"{len(self.input_placements)} input placements for {len(example)} inputs")
        self.param_dims = [
            _check(mesh, pl, p.shape, f"parameter `{n}`") for n, p, pl in zip(self.names, self.params, self.param_placements)
        ]
        self.input_dims = [
            _check(mesh, pl, x.shape, f"input {i}") for i, (x, pl) in enumerate(zip(example, self.input_placements))
        ]
        wrapper = _LossModule(model, loss_fn)
        keys = [f"model.{n}" for n in self.names]
        # Buffers (a rotary embedding's frequencies) cross as replicated inputs after the
        # parameters.
        named_buffers = list(model.named_buffers())
        self.buffers = [b for _, b in named_buffers]
        buffer_keys = [f"model.{n}" for n, _ in named_buffers]
        n_params, n_buffers = len(keys), len(buffer_keys)

        def loss_of(ps, bs, xs):
            return torch.func.functional_call(wrapper, {**dict(zip(buffer_keys, bs)), **dict(zip(keys, ps))}, xs)

        def step(*flat):
            ps, bs, xs = flat[:n_params], flat[n_params : n_params + n_buffers], flat[n_params + n_buffers :]
            grads, loss = torch.func.grad_and_value(loss_of)(tuple(ps), tuple(bs), tuple(xs))
            return (loss, *grads)

        leaves = [p.detach() for p in self.params] + [b.detach() for b in self.buffers]
        gm = make_fx(
            torch.func.functionalize(step, remove="mutations"), decomposition_table=decompositions(), tracing_mode="fake"
        )(*leaves, *example)
        self.graph = gm
        self.buffer_dims = [[[] for _ in b.shape] for b in self.buffers]
        in_sh = [hlo_sharding(mesh, pl, p.shape) for p, pl in zip(self.params, self.param_placements)]
        in_sh += ["{replicated}"] * n_buffers
        in_sh += [hlo_sharding(mesh, pl, x.shape) for x, pl in zip(example, self.input_placements)]
        # Tensors the trace holds (constants it made) cross last, replicated.
        self.constants = graph_constants(gm)
        in_sh += ["{replicated}"] * len(self.constants)
        out_sh = ["{replicated}"] + in_sh[:n_params]
        manual = []
        for key, dims in (per_shard or {}).items():
            try:
                ins, outs = dims
                manual.append((key, [None if d is None else int(d) for d in ins], [None if d is None else int(d) for d in outs]))
            except (TypeError, ValueError):
                raise ShardingError(
                    f"per_shard[{key!r}] must be (input dims, output dims), each a dimension or None, not {dims!r}"
                ) from None
        self.program = native().compile_sharded(
            dumps(fx_to_json(gm, name)), in_sh, out_sh, mesh.size(), refused_kernels(), manual
        )
        _stats.record_sharded_step(name, mesh.size(), self.collectives, self.kernels, self.per_shard, self.notes)

    @property
    def collectives(self) -> dict[str, int]:
        """The collectives XLA's partitioner inserted, by HLO opcode."""
        return dict(self.program.collectives)

    @property
    def per_shard(self) -> list[str]:
        """Kernels that run per shard in a manually sharded region (see ``per_shard`` of
        :func:`compile_step`), in graph order."""
        return list(self.program.per_shard)

    @property
    def notes(self) -> list[str]:
        """Why a kernel asked to run per shard runs whole instead (one line per node)."""
        return list(self.program.notes)

    @property
    def kernels(self) -> list[str]:
        """Registered kernels inlined into the program."""
        return list(self.program.kernels)

    def compile_for(self, topology: str) -> dict:
        """Compiles the same sharded program for a TPU topology (``"v5e:2x2"``) with libtpu's
        compile-only path; returns its size and compile time."""
        return dict(self.program.compile_for(topology))

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Runs the step on the mesh: returns the loss and adds each parameter's whole gradient
        to its ``.grad`` (as ``backward()`` does)."""
        if len(inputs) != len(self.input_dims):
            raise ShardingError(f"the step takes {len(self.input_dims)} inputs, got {len(inputs)}")
        whole = [p.detach() for p in self.params] + [b.detach() for b in self.buffers] + [x.detach() for x in inputs]
        whole += self.constants
        dims = self.param_dims + self.buffer_dims + self.input_dims + [[[] for _ in c.shape] for c in self.constants]
        shards = [[_shard(t, self.mesh, bd, d) for t, bd in zip(whole, dims)] for d in range(self.mesh.size())]
        outs = self.program.run(shards)
        per_output = [[as_tensor(row[j]) for row in outs] for j in range(len(outs[0]))]
        loss = per_output[0][0].clone()
        with torch.no_grad():
            for p, pieces, bd in zip(self.params, per_output[1:], self.param_dims):
                g = _unshard(pieces, self.mesh, bd).to(p.dtype)
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.add_(g)
        return loss


def compile_step(
    model: torch.nn.Module,
    loss_fn: Callable[..., torch.Tensor],
    mesh: DeviceMesh,
    *,
    params: ParamPlan | None = None,
    inputs: Placement | Sequence[Placement] | Sequence[Sequence[Placement]] | None = None,
    example: Sequence[torch.Tensor],
    name: str = "sharded_step",
    per_shard: dict[str, tuple[Sequence[int | None], Sequence[int | None]]] | None = None,
) -> ShardedStep:
    """Traces ``loss_fn(model, *example)`` and its gradients with respect to every parameter into
    one program sharded over ``mesh``.

    ``params`` gives each parameter's placements (a dict by name, or a function of name and
    parameter; None or a missing name: replicated); ``inputs`` one set of placements for every
    input, or one per input. A plan (:func:`data_parallel`, :func:`fully_sharded`,
    :func:`tensor_parallel`) gives both. The step's shapes are those of ``example``.

    ``per_shard`` runs kernels as ``shard_map`` runs them: for each op (or kernel name) it
    names, the kernel binding it runs in a manually sharded region, specialised to the
    per-shard signature, with ``(input dims, output dims)`` giving the dimension of each of the
    kernel's tensor inputs and outputs cut over every device of the mesh (None: whole on every
    device). This is how a Mosaic kernel, which XLA cannot partition, does sharded work (XLA
    otherwise gathers its operands and runs it whole on every device); on the CPU the kernel's
    twin runs in the same region. A kernel that cannot take its per-shard call runs whole, with
    the reason in :attr:`ShardedStep.notes`.
    """
    return ShardedStep(model, loss_fn, mesh, params or {}, inputs, example, name, per_shard)
