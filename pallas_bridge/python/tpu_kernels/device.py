"""The "tpu" device: ``model.to("tpu")``.

``import torch`` loads this module (PyTorch's device-backend autoloading, see ``_autoload.py``;
``TPUK_DEVICE=0`` turns that off, and ``import tpu_kernels.device`` then loads it). It registers
PyTorch's PrivateUse1 key under the name "tpu", with a C++ shim (``tpu_kernels._device``) that forwards to the Rust runtime:

- **Memory.** A "tpu" tensor's memory comes from the project's caching allocator: 64-byte
  aligned host memory on the embedded default, which the PJRT CPU client reads in place.
  ``torch.tpu.memory_allocated()`` and the rest of PyTorch's memory functions report it.
- **Kernels at the key.** Every ATen overload (and every new op) a registered kernel binds is
  registered at the device's dispatch key: a call goes from PyTorch's dispatcher through C++
  straight to the Rust dispatcher (no Python), and the kernel's PJRT output buffers become the
  result tensors' storage (no copy). A call no kernel takes (a dtype, a shape guard, a strided
  input) is declined with its reason (``report()``) and runs in the fallback.
- **The fallback.** Every other op runs PyTorch's CPU kernel over an alias of the same memory
  (no copy); views stay views and in-place ops stay in place. ``report().device["fallbacks"]``
  counts these calls by op.
- **Kernels registered later** (``register_jax``, ``load_library``) serve the device from the
  next call.
- **torch.compile.** ``torch.compile(model, backend="tpu_kernels")`` lowers graphs of "tpu"
  tensors as it does CPU ones (inputs read in place, outputs on the device). A plain
  ``torch.compile(model)`` of such a graph goes to the same backend: Inductor has no code
  generator for this device.

What backs the device is its PJRT platform (:func:`platform`): "cpu", the XLA CPU plugin, on
this package's embedded default; the device's first use says so in one line on stderr
(``TPUK_QUIET=1`` silences it). ``TPUK_REQUIRE_TPU=1`` (or :func:`require_tpu`) makes a
missing TPU an error instead of a run on the CPU plugin.

If another backend already holds PyTorch's PrivateUse1 key (``torch_tpu``, or any renamed
backend), the device is not registered: :func:`is_installed` is False, :func:`unavailable_reason`
says why (a ``RuntimeWarning`` says it once), and kernels stay available through
``tpu_kernels.substitute`` and ``torch.ops``.
"""

from __future__ import annotations

import os
import sys
import threading
import types
import warnings

import torch

from . import _events, _native
from .errors import RuntimeUnavailableError

NAME = "tpu"

_lock = threading.RLock()


def _process_state() -> dict:
    """The device's state, one per process, kept on the device module torch holds: a reload of
    this module (``importlib.reload``), or an import after one that failed halfway, finds the
    device already registered, with its bound ops, and carries on with it."""
    held = getattr(getattr(torch, NAME, None), "_tpu_kernels_state", None)
    if isinstance(held, dict):
        return held
    return {"installed": False, "reason": None, "announced": False, "bound": {}, "listening": False}


_state: dict = _process_state()


def is_installed() -> bool:
    """Whether the "tpu" device is registered in this process."""
    return _state["installed"]


def unavailable_reason() -> str | None:
    """Why the device is not registered (None when it is)."""
    return _state["reason"]


def platform() -> str:
    """The PJRT platform behind the device: "cpu" (the XLA CPU plugin) on the embedded default."""
    return "cpu"


def require_tpu() -> None:
    """Raises :class:`RuntimeUnavailableError` unless the device runs on a real TPU (as
    ``TPUK_REQUIRE_TPU=1`` does at import), never a silent run on the CPU plugin."""
    if platform() != "tpu":
        raise RuntimeUnavailableError(
            "a TPU is required (TPUK_REQUIRE_TPU=1 or tpu_kernels.device.require_tpu()), but the tpu "
            f"device runs on the PJRT {platform()!r} platform: {_tpu_probe()}"
        )


def _tpu_probe() -> str:
    """Why no TPU backs the device, in libtpu's words when it can be asked."""
    if not _native.libtpu_available():
        return "libtpu cannot be loaded (scripts/dev setup installs it; TPUK_LIBTPU names it)"
    return _native.device_tpu_probe()


# ----- modes -----

MODES = ("strict", "debug", "fused")
RECORDERS = ("python", "native")


def set_mode(mode: str, *, recorder: str | None = None) -> None:
    """Sets the device's eager mode (``TPUK_MODE`` sets it at import):

    - ``"strict"`` (the default): one op at a time; a call no kernel takes falls back, counted
      with its reason.
    - ``"debug"``: synchronous; after every op on the device, a kernel's or the fallback's, its
      outputs are checked against the op's meta function (shapes, dtypes) and for NaN that
      finite inputs did not have, and a kernel's failure raises; the error names the op, the
      kernel and the user's line.
    - ``"fused"``: ops are recorded and run as one program at each materialisation point.
      ``recorder`` (default ``TPUK_FUSED_RECORDER``, else ``"native"``) says where:
      ``"native"`` records in Rust at the device's dispatch key, process-wide (the autograd
      engine's thread included), with no Python per op. It takes calls whose arguments are
      dense device tensors and statics and whose op lowers; any other call runs what was
      recorded first, then runs as in strict mode (``report().device["recorder"]`` counts
      both). ``"python"`` is ``tpu_kernels.substitute("fused")`` entered on the calling thread
      (``report().fused`` counts its flushes), several times slower a step on real models.

    ``with tpu_kernels.substitute(mode):`` keeps working, on CPU and device tensors alike."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, not {mode!r}")
    if recorder is None:
        recorder = os.environ.get("TPUK_FUSED_RECORDER", "native") or "native"
    if recorder not in RECORDERS:
        raise ValueError(f"recorder must be one of {', '.join(map(repr, RECORDERS))}, not {recorder!r}")
    native = mode == "fused" and recorder == "native"
    with _lock:
        fused = _state.get("fused_mode")
        if fused is not None and (mode != "fused" or native):
            _state["fused_mode"] = None
            fused.__exit__(None, None, None)
        if mode == "fused" and not native and fused is None:
            from .torch import substitute

            fm = substitute("fused")
            fm.__enter__()
            _state["fused_mode"] = fm
        _native.device_set_mode("fused_native" if native else mode)
        _state["mode"] = mode
        _state["recorder"] = recorder if mode == "fused" else None


def get_mode() -> str:
    """The device's eager mode (see :func:`set_mode`)."""
    return _state.get("mode", "strict")


def get_recorder() -> str | None:
    """Where fused mode records ("python" or "native"); None outside fused mode."""
    return _state.get("recorder")


def flush(reason: str = "sync") -> None:
    """Runs what the native recorder holds (nothing to do in any other mode)."""
    _native.device_flush(reason)


# ----- the device module (`torch.tpu`) -----


def _make_module() -> types.ModuleType:
    m = types.ModuleType("torch.tpu", "The tpu device of tpu_kernels (see tpu_kernels.device).")

    def is_available() -> bool:
        return _state["installed"]

    def device_count() -> int:
        return 1

    def current_device() -> int:
        return 0

    def set_device(device) -> None:
        index = torch.device(NAME, device).index if isinstance(device, int) else torch.device(device).index
        if index not in (None, 0):
            raise RuntimeError(f"tpu:{index} does not exist: this process has one tpu device, tpu:0")

    def synchronize(device=None) -> None:
        """Every op on the device has finished when it returns; in fused mode, runs what was
        recorded."""
        fused = _state.get("fused_mode")
        if fused is not None and fused.nodes:
            fused.flush("torch.tpu.synchronize")
        _native.device_flush("torch.tpu.synchronize")

    def get_device_name(device=None) -> str:
        return f"tpu-kernels device on PJRT {platform()}"

    def manual_seed(seed: int) -> None:
        from . import _device

        _device.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)

    def seed() -> int:
        from . import _device

        return _device.seed()

    def initial_seed() -> int:
        from . import _device

        return _device.initial_seed()

    def get_rng_state(device="tpu") -> torch.Tensor:
        from . import _device

        return torch.frombuffer(bytearray(_device.rng_state()), dtype=torch.uint8)

    def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
        from . import _device

        _device.set_rng_state(new_state.detach().cpu().contiguous().numpy().tobytes())

    def _stats() -> dict:
        return _native.device_stats()["memory"]

    def memory_allocated(device=None) -> int:
        return _stats()["allocated_bytes"]

    def max_memory_allocated(device=None) -> int:
        return _stats()["peak_allocated_bytes"]

    def memory_reserved(device=None) -> int:
        return _stats()["reserved_bytes"]

    def max_memory_reserved(device=None) -> int:
        return _stats()["peak_reserved_bytes"]

    def memory_stats(device=None) -> dict:
        return dict(_stats())

    def reset_peak_memory_stats(device=None) -> None:
        _native.device_reset_peaks()

    def empty_cache() -> None:
        _native.device_empty_cache()

    class device:
        """``with torch.tpu.device(0):`` (one device: only index 0 exists)."""

        def __init__(self, device) -> None:
            set_device(device)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

    funcs = dict(
        is_available=is_available,
        device_count=device_count,
        current_device=current_device,
        set_device=set_device,
        synchronize=synchronize,
        get_device_name=get_device_name,
        manual_seed=manual_seed,
        manual_seed_all=manual_seed,
        seed=seed,
        seed_all=seed,
        initial_seed=initial_seed,
        get_rng_state=get_rng_state,
        set_rng_state=set_rng_state,
        get_rng_state_all=lambda: [get_rng_state()],
        set_rng_state_all=lambda states: set_rng_state(states[0]),
        is_initialized=lambda: True,
        _lazy_init=lambda: None,
        _is_in_bad_fork=lambda: False,
        get_amp_supported_dtype=lambda: [torch.bfloat16, torch.float16],
        is_bf16_supported=lambda including_emulation=True: True,
        memory_allocated=memory_allocated,
        max_memory_allocated=max_memory_allocated,
        memory_reserved=memory_reserved,
        max_memory_reserved=max_memory_reserved,
        memory_stats=memory_stats,
        reset_peak_memory_stats=reset_peak_memory_stats,
        empty_cache=empty_cache,
        device=device,
        platform=platform,
    )
    for k, v in funcs.items():
        setattr(m, k, v)
    return m


# ----- kernels at the key -----


def _lent(func, plan) -> list[int] | str:
    """The positions, among the bound tensors, of the arguments the op's kernels update in
    place (in output order), or why they cannot be: every mutable argument of the schema must
    be one the kernels update, and every kernel of the op must update the same ones."""
    from .torch._bindings import TABLE

    mutates = {tuple(i.get("mutates") or ()) for i in TABLE.by_op.get(plan.key, ())}
    if len(mutates) != 1:
        return "its kernels update different arguments in place"
    (names,) = mutates
    written = {a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    if written != set(names):
        return f"it writes {sorted(written)}, its kernels update {sorted(names)} in place"
    lent = []
    for v in plan.variants:
        slots = [name for name, _ in v.tensor_slots]
        positions = [slots.index(n) for n in names if n in slots]
        if len(positions) != len(names):
            return "a binding leaves out an argument the kernels update"
        if lent and positions != lent:
            return "its bindings place the updated arguments differently"
        lent = positions
    return lent


def _device_plan(plan, lent=()):
    """The native plan of a bound op (see `_native.device_plan`)."""
    if plan.refused:
        return ("schema_refused", "; ".join(plan.refused.values()))
    variants = [
        (
            [pos for _, pos in v.tensor_slots],
            [(name, pos, is_dtype) for name, pos, _default, is_dtype in v.static_slots],
            [pos for _, pos in v.absent],
        )
        for v in plan.variants
    ]
    mask = plan.output_mask[1] if plan.output_mask is not None else None
    copy_strided = any(v.copy_strided for v in plan.variants)
    return (variants, mask, copy_strided, list(lent))


def _bindable(func) -> str | None:
    """Why `func` is not registered at the key (None: it is)."""
    schema = func._schema
    if schema.is_mutable and any(r.alias_info is not None for r in schema.returns):
        return "it returns an argument it updates"
    if schema.is_mutable and schema.name.startswith("aten::"):
        return "it updates an argument in place, and kernels bind ATen ops as pure functions"
    if (not schema.returns and not schema.is_mutable) or any(str(r.type) != "Tensor" for r in schema.returns):
        return "it returns something other than tensors"
    name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
    if torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd"):
        return "it decomposes (CompositeImplicitAutograd) before reaching a device's key"
    return None


def sync() -> dict[str, str]:
    """Binds every op a registered kernel binds at the device's key (ops bound before keep their
    registration; an op whose kernels are gone declines every call). Returns the ops not bound,
    with why. Called at import and after every registration or removal."""
    from . import _device
    from .torch._bindings import TABLE, resolve_overload
    from .torch._custom_ops import custom_ops

    skipped: dict[str, str] = {}
    with _lock:
        # The new ops Rust kernels define (`tpuk::rms_norm`) exist in torch once defined here.
        custom_ops()
        TABLE.refresh()
        TABLE.load()
        live = set()
        for key in sorted(TABLE.by_op):
            func = resolve_overload(key if "." in key.split("::", 1)[1] else key + ".default")
            if func is None:
                skipped[key] = "torch has no such op"
                continue
            why = _bindable(func)
            if why is not None:
                skipped[key] = why
                continue
            plan = TABLE.plan(func, mutable=True)
            if plan is None:
                skipped[key] = "no kernel's binding fits torch's schema"
                continue
            lent = _lent(func, plan) if func._schema.is_mutable else []
            if isinstance(lent, str):
                skipped[key] = lent
                continue
            op_id = _native.device_plan(plan.key, _device_plan(plan, lent))
            live.add(plan.key)
            if plan.key not in _state["bound"]:
                schema = func._schema
                ns, name = schema.name.split("::", 1)
                _device.bind(ns, name, schema.overload_name, op_id)
                _state["bound"][plan.key] = op_id
        for key in _state["bound"]:
            if key not in live:
                _native.device_plan(key, ("no_kernel", "no registered kernel binds the op any more"))
        _state["skipped"] = skipped
    return skipped


# ----- torch.compile -----


def _route_inductor() -> None:
    """Plain ``torch.compile(model)`` (Inductor) of a graph with "tpu" tensors goes to this
    package's backend, as ``backend="tpu_kernels"`` does: Inductor has no code generator for
    this device (torch's built-in "tpu" one is torch_tpu's Pallas code generator). Graphs
    without "tpu" tensors stay Inductor's."""
    wrapper = torch._TorchCompileInductorWrapper
    original = wrapper.__call__
    if getattr(original, "_tpu_kernels", False):
        return

    def __call__(self, model_, inputs_, **kwargs):
        if any(isinstance(t, torch.Tensor) and t.device.type == NAME for t in inputs_):
            from .torch.backend import tpu_kernels_backend

            return tpu_kernels_backend(model_, inputs_)
        return original(self, model_, inputs_, **kwargs)

    __call__._tpu_kernels = True  # type: ignore[attr-defined]
    wrapper.__call__ = __call__


def _register_tpu_backend() -> None:
    """``torch.compile(backend="tpu")`` is this package's backend, unless another package
    registered a backend of that name (torch_tpu does). Libraries pick the backend by device
    type: Hugging Face's ``generate`` with a static cache compiles the decoding step of a model
    on a "tpu" device with ``backend="tpu"``."""
    from torch._dynamo.backends import registry

    registry._lazy_import()
    if NAME not in registry._BACKENDS:
        from .torch.backend import tpu_kernels_backend

        registry.register_backend(compiler_fn=tpu_kernels_backend, name=NAME)


# ----- modules -----


def _keep_tied_parameters() -> None:
    """``module.to("tpu")`` keeps parameters that several modules share (tied embeddings) shared.

    PyTorch converts a parameter in place (``param.data = ...``) only between the backends it
    knows as dense (CPU, CUDA, ...); for any other device it makes a new Parameter per module,
    so a parameter two modules held becomes two (GPT-2's ``lm_head`` and ``wte`` would train
    apart). The conversion to the tpu device puts the sharing back."""
    module = torch.nn.Module
    original = module.to
    if getattr(original, "_tpu_kernels", False):
        return

    def to(self, *args, **kwargs):
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is None or torch.device(device).type != NAME:
            return original(self, *args, **kwargs)
        shared: dict[int, list] = {}
        for m in self.modules():
            for name, p in m._parameters.items():
                if p is not None:
                    shared.setdefault(id(p), []).append((m, name))
        out = original(self, *args, **kwargs)
        for places in shared.values():
            first = places[0][0]._parameters[places[0][1]]
            for m, name in places[1:]:
                m._parameters[name] = first
        return out

    to._tpu_kernels = True  # type: ignore[attr-defined]
    to.__doc__ = original.__doc__
    module.to = to

    def tpu(self, device=None):
        """Moves every parameter and buffer to the tpu device (``module.to("tpu")``)."""
        return self.to(NAME if device is None else torch.device(NAME, device))

    module.tpu = tpu


# ----- installation -----


def _taken_by() -> str | None:
    """The backend that holds PyTorch's PrivateUse1 key, when it is not this package."""
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", NAME):
        return name
    if name == NAME and hasattr(torch, NAME) and not getattr(getattr(torch, NAME), "_tpu_kernels", False):
        return "torch_tpu" if "torch_tpu" in sys.modules else f"another {NAME!r} backend"
    return None


def _install() -> None:
    with _lock:
        if _state["installed"]:
            return
        taken = _taken_by()
        if taken is not None:
            _state["reason"] = (
                f"PyTorch's PrivateUse1 key is already registered by the {taken!r} backend, so the tpu device "
                "is not registered; kernels stay available through tpu_kernels.substitute() and torch.ops"
            )
            warnings.warn(_state["reason"], RuntimeWarning, stacklevel=3)
            return
        if os.environ.get("TPUK_REQUIRE_TPU") == "1":
            require_tpu()
        try:
            from . import _device
        except ImportError as e:
            raise RuntimeUnavailableError(
                f"the tpu device's C++ shim (tpu_kernels._device) cannot be loaded: {e}. It is built against the "
                "installed torch by `scripts/dev` (cargo build -p tpu-kernels-device)"
            ) from e
        if _device.TORCH_VERSION != torch.__version__:
            raise RuntimeUnavailableError(
                f"the tpu device's C++ shim was built against torch {_device.TORCH_VERSION}, but torch "
                f"{torch.__version__} is imported; rebuild it (scripts/dev builds it)"
            )
        try:
            _device.install(_native.device_api())
        except RuntimeError as e:
            raise RuntimeUnavailableError(
                f"the tpu device's C++ shim does not fit this package's runtime: {e}; scripts/dev builds both"
            ) from e
        torch.utils.rename_privateuse1_backend(NAME)
        if not getattr(getattr(torch, NAME, None), "_tpu_kernels", False):
            module = _make_module()
            module._tpu_kernels = True
            module._tpu_kernels_state = _state
            torch._register_device_module(NAME, module)
        if not hasattr(torch.Tensor, f"is_{NAME}"):
            torch.utils.generate_methods_for_privateuse1_backend(
                for_tensor=True, for_module=False, for_packed_sequence=True, for_storage=True
            )
        _keep_tied_parameters()
        _route_inductor()
        _register_tpu_backend()
        from .torch._bindings import CPU_KEEPS_INPUT_DTYPE

        _native.device_cpu_keeps_input_dtype(sorted(CPU_KEEPS_INPUT_DTYPE))
        _state["installed"] = True
        _state["reason"] = None
        sync()
        if not _state["listening"]:
            _events.on_registry_change(sync)
            _state["listening"] = True
        env_mode = os.environ.get("TPUK_MODE")
        if env_mode:
            set_mode(env_mode)


_install()
