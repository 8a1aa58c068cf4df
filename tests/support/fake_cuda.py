"""Fake CUDA (test-only): the GPU code path run on a CPU-only machine, audited.

Every tensor stays on the CPU, but the ones a GPU run would hold on the GPU are marked: factories
given `device="cuda"`, `.to("cuda")` / `.cuda()` and every result of an op with a marked input.
Code that asks sees `cuda` (`t.device`, `t.is_cuda`, `torch.cuda.is_available()`), so the GPU
branches are the ones taken, and every torch call is checked as CUDA would check it:

- a CPU tensor meeting a CUDA one in an op raises `FakeCudaError` (0-dim CPU tensors are allowed,
  as CUDA allows them; a CPU index into a CUDA tensor is allowed, as indexing moves it);
- `.numpy()` of a CUDA tensor raises, as on a GPU;
- our compiled ops (`kernels._ext`, torch.library ops) run their CPU kernels, since the tensors
  are on the CPU; asked for through the CUDA library, an op it does not register
  (`_ext.cuda_op_names`) raises, and so does a CPU tensor given to a CUDA op (or the reverse);
- host synchronisations are counted (`counts`): explicit reads (`.item()`, `.tolist()`,
  `.cpu()`, `bool()`/`float()`/`int()` of a GPU tensor, device-to-host copies,
  `torch.cuda.synchronize()`), implicit ones (ops whose output size depends on the data:
  `nonzero`, boolean-mask indexing, `unique`, ...), and host-to-device copies apart.

What it cannot see: the autograd engine runs backward passes without torch-function modes, so
backward code is not audited (its results are: a parameter's `.grad` is marked as it is read);
and it knows nothing of CUDA kernels themselves (parity and sanitizer runs need a GPU).

Test-only, outside the product packages: a worker the test stack starts with `NF_FAKE_CUDA=1`
(and `DEVICE=cuda`) in its environment runs the Celery app of tests/support/fake_cuda_app.py,
which turns it on, so the Celery task path runs in it end to end; in-process tests use
`fake_cuda()`.
"""

from __future__ import annotations

import os
import sys
import threading
import types
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

ENV = "NF_FAKE_CUDA"
_MARK = "_nf_fake_cuda"
_REPO = str(Path(__file__).resolve().parents[2])  # call sites are named under the checkout
_THIS = str(Path(__file__).resolve())
CUDA = torch.device("cuda", 0)


class FakeCudaError(RuntimeError):
    """What a GPU would have refused: a device mix-up, a CPU-only op, numpy of GPU memory."""


@dataclass
class Counts:
    """Host synchronisations and host-to-device copies seen so far (`where`: per call site)."""

    syncs: int = 0  # explicit: the host waits for a GPU value
    implicit: int = 0  # an op's output size depends on GPU data (nonzero, mask indexing, ...)
    h2d: int = 0  # host-to-device copies of non-scalar tensors
    where: Counter = field(default_factory=Counter)

    def snapshot(self) -> Counts:
        return Counts(self.syncs, self.implicit, self.h2d, Counter(self.where))

    def since(self, before: Counts) -> Counts:
        return Counts(
            self.syncs - before.syncs,
            self.implicit - before.implicit,
            self.h2d - before.h2d,
            self.where - before.where,
        )

    def summary(self, per: int = 1) -> str:
        per = max(per, 1)
        return (
            f"{self.syncs / per:g} syncs, {self.implicit / per:g} implicit syncs, "
            f"{self.h2d / per:g} host-to-device copies"
        )


counts = Counts()


def is_cuda(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, _MARK, False)


def _mark(obj: Any, cuda: bool, keep: tuple = ()) -> None:
    """Mark every tensor in `obj` (tensors, tuples, lists, dicts) as CUDA or not; tensors in
    `keep` (the op's inputs, returned in place) keep their mark."""
    if isinstance(obj, torch.Tensor):
        if cuda:
            setattr(obj, _MARK, True)
        elif getattr(obj, _MARK, False) and not any(obj is k for k in keep):
            delattr(obj, _MARK)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _mark(x, cuda, keep)
    elif isinstance(obj, dict):
        for x in obj.values():
            _mark(x, cuda, keep)


def _tensors(obj: Any, out: list, depth: int = 0) -> list:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif depth < 3 and isinstance(obj, (tuple, list)):
        for x in obj:
            _tensors(x, out, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for x in obj.values():
            _tensors(x, out, depth + 1)
    return out


def _describe(t: torch.Tensor) -> str:
    return f"{'CUDA' if is_cuda(t) else 'CPU'} {tuple(t.shape)}"


def _site() -> str:
    """The innermost caller outside torch and this module, as `path:line function`."""
    f = sys._getframe(2)
    while f is not None:
        path = f.f_code.co_filename
        if path != _THIS and path.startswith(_REPO) and "/torch/" not in path:
            return f"{os.path.relpath(path, _REPO)}:{f.f_lineno} {f.f_code.co_name}"
        f = f.f_back
    return "?"


def _count(kind: str, what: str) -> None:
    setattr(counts, kind, getattr(counts, kind) + 1)
    counts.where[(kind, what, _site())] += 1


def _is_cuda_device(d: Any) -> bool | None:
    """True for a CUDA device, False for another, None for no device."""
    if d is None:
        return None
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, int):
        return True  # torch.device(0) is cuda:0
    if isinstance(d, str):
        return torch.device(d).type == "cuda"
    return None


def _check_mix(name: str, tensors: list, scalars_ok: bool = True) -> bool:
    """Raise on CPU meeting CUDA; return whether any input is CUDA."""
    cuda = [t for t in tensors if is_cuda(t)]
    if not cuda:
        return False
    cpu = [t for t in tensors if not is_cuda(t) and not (scalars_ok and t.dim() == 0)]
    if cpu:
        raise FakeCudaError(
            f"device mix-up in {name}: {_describe(cpu[0])} meets {_describe(cuda[0])}"
        )
    return True


def _has_bool_index(index: Any) -> bool:
    return any(t.dtype == torch.bool for t in _tensors(index, []))


_SYNC_READS = {
    "item",
    "tolist",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
    "__complex__",
    "__format__",
    "__repr__",
    "equal",
    "allclose",
    "is_nonzero",
    "__contains__",
}
_DATA_DEPENDENT = {
    "nonzero",
    "argwhere",
    "masked_select",
    "unique",
    "_unique",
    "_unique2",
    "unique_consecutive",
    "bincount",
}
_NUMPY = {"numpy", "__array__"}
# Functions that compare or group tensors of any devices without computing with them.
_ANY_DEVICE = {
    "_has_compatible_shallow_copy_type",
    "is_same_size",
    "_group_tensors_by_device_and_dtype",
}


def _data_dependent(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether the op's output size depends on the data, so the host must wait for it."""
    if name in _DATA_DEPENDENT:
        return True
    if name == "where":
        return len(args) + len(kwargs) == 1
    if name == "repeat_interleave":
        repeats = kwargs.get("repeats", args[1] if len(args) > 1 else None)
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    return False


class FakeCudaMode(TorchFunctionMode):
    """The torch-function mode behind `fake_cuda()`; see the module docstring."""

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", None) or str(func)
        if isinstance(func, types.MethodWrapperType) and name in ("__get__", "__set__"):
            return self._attribute(func, func.__self__.__name__, args)
        handler = getattr(self, "_op_" + name.strip("_"), None) if name in _SPECIAL else None
        if handler is not None:
            return handler(func, args, kwargs)
        base = name.split(".")[0]  # torch.ops overloads: "march_rays.default"
        if base in _HOST_ARGS or base in _WAITS_INSIDE:
            return self._library_op(func, base, args, kwargs)
        if name in _NUMPY and is_cuda(args[0]):
            raise FakeCudaError(
                f"{name} of a CUDA tensor {tuple(args[0].shape)}: numpy needs it on the host first"
            )
        inputs = _tensors(args, _tensors(kwargs, []))
        wants = _is_cuda_device(kwargs.get("device"))
        if wants:
            kwargs = {**kwargs, "device": "cpu"}
            gen = kwargs.get("generator")
            if gen is not None:  # CUDA factories take CUDA generators only
                raise FakeCudaError(f"{name}: a CPU generator given to a CUDA factory")
        any_cuda = _check_mix(name, inputs) if name not in _ANY_DEVICE else False
        if any_cuda:
            if name in _SYNC_READS:
                _count("syncs", name)
            elif _data_dependent(name, args, kwargs):
                _count("implicit", name)
        out = func(*args, **kwargs)
        _mark(out, any_cuda if wants is None else wants, keep=tuple(inputs))
        return out

    # -- attributes -----------------------------------------------------------------------
    def _attribute(self, func, attr: str, args):
        owner = args[0]
        if func.__name__ == "__set__":
            value = args[1]
            if attr == "grad" and value is not None and is_cuda(value) != is_cuda(owner):
                raise FakeCudaError(
                    f"assigning a {_describe(value)} grad to a {_describe(owner)} tensor"
                )
            out = func(*args)
            if attr == "data":
                _mark(owner, is_cuda(value))
            return out
        if attr == "device":
            return CUDA if is_cuda(owner) else func(*args)
        if attr == "is_cuda":
            return is_cuda(owner)
        if attr == "is_cpu":
            return not is_cuda(owner)
        out = func(*args)
        if isinstance(out, torch.Tensor) and is_cuda(owner) and out is not owner:
            _mark(out, True)
        return out

    # -- moves between devices -----------------------------------------------------------
    def _moved(self, src: torch.Tensor, out: torch.Tensor, to_cuda: bool, what: str):
        if is_cuda(src) == to_cuda:
            _mark(out, to_cuda, keep=(src,))  # a dtype change alone: a new tensor, same device
            return out
        if to_cuda:
            if src.dim() > 0:
                _count("h2d", what)
        else:
            _count("syncs", what)
        if out is src:  # a real move copies: marking the source itself would move it too
            with torch._C.DisableTorchFunction():
                out = src.clone()
        _mark(out, to_cuda)
        return out

    def _op_to(self, func, args, kwargs):
        src, rest = args[0], list(args[1:])
        target = None
        kwargs = dict(kwargs)
        if "device" in kwargs:
            target = _is_cuda_device(kwargs["device"])
            if target is not None:
                kwargs["device"] = "cpu"
        elif rest and isinstance(rest[0], torch.Tensor):
            other = rest.pop(0)
            target = is_cuda(other)
            rest.insert(0, other.dtype)
        elif rest and isinstance(rest[0], (str, torch.device, int)):
            target = _is_cuda_device(rest[0])
            rest[0] = "cpu"
        out = func(src, *rest, **kwargs)
        if target is None:
            _mark(out, is_cuda(src), keep=(src,))
            return out
        return self._moved(src, out, target, "to(cuda)" if target else "to(cpu)")

    def _op_cuda(self, func, args, kwargs):
        return self._moved(args[0], args[0], True, "cuda()")

    def _op_cpu(self, func, args, kwargs):
        return self._moved(args[0], func(*args, **kwargs), False, "cpu()")

    def _op_copy(self, func, args, kwargs):
        dst, src = args[0], args[1]
        if isinstance(src, torch.Tensor) and is_cuda(src) != is_cuda(dst):
            if is_cuda(src):
                _count("syncs", "copy_ to host")
            elif src.dim() > 0:
                _count("h2d", "copy_")
        return func(*args, **kwargs)

    def _op_getitem(self, func, args, kwargs):
        src, index = args[0], args[1]
        idx = _tensors(index, [])
        if not is_cuda(src) and any(is_cuda(t) for t in idx):
            raise FakeCudaError(f"device mix-up in __getitem__: CUDA index into {_describe(src)}")
        if is_cuda(src) and _has_bool_index(index):
            _count("implicit", "boolean-mask indexing")
        out = func(*args, **kwargs)
        _mark(out, is_cuda(src), keep=(src,))
        return out

    def _op_setitem(self, func, args, kwargs):
        dst, index, value = args[0], args[1], args[2]
        idx = _tensors(index, [])
        if not is_cuda(dst) and any(is_cuda(t) for t in idx):
            raise FakeCudaError(f"device mix-up in __setitem__: CUDA index into {_describe(dst)}")
        if isinstance(value, torch.Tensor) and is_cuda(value) != is_cuda(dst):
            if is_cuda(value):
                _count("syncs", "__setitem__ to host")
            elif value.dim() > 0:
                if idx:  # advanced indexing (index_put_) takes only 0-dim values from the host
                    raise FakeCudaError(
                        f"device mix-up in __setitem__: {_describe(value)} values into "
                        f"{_describe(dst)}"
                    )
                _count("h2d", "__setitem__")
        if is_cuda(dst) and _has_bool_index(index):
            _count("implicit", "boolean-mask assignment")
        return func(*args, **kwargs)

    def _op_index_put(self, func, args, kwargs):
        # Indices may live on the host (indexing moves them); values may not.
        dst, indices = args[0], args[1]
        rest = _tensors(args[2:], _tensors(kwargs, []))
        _check_mix(func.__name__, [dst, *rest])
        if not is_cuda(dst) and any(is_cuda(t) for t in _tensors(indices, [])):
            raise FakeCudaError(f"device mix-up in {func.__name__}: CUDA index into CPU tensor")
        if is_cuda(dst) and _has_bool_index(indices):
            _count("implicit", "boolean-mask index_put")
        out = func(*args, **kwargs)
        _mark(out, is_cuda(dst), keep=(dst,))
        return out

    def _library_op(self, func, name: str, args, kwargs):
        # Our kernels as torch.library ops: the dispatcher runs the CPU kernel (the tensors are
        # on the CPU); the device checks are the compiled modules' (_CheckedOps).
        tensors = [
            t
            for i, a in enumerate(args)
            for t in _tensors(a, [])
            if i not in _HOST_ARGS.get(name, ())
        ]
        tensors += _tensors(kwargs, [])
        cuda = bool(tensors) and is_cuda(tensors[0])
        for i in _HOST_ARGS.get(name, ()):
            if i < len(args) and is_cuda(args[i]):
                raise FakeCudaError(f"{name}: argument {i} is read on the host, got CUDA")
        for t in tensors:
            if is_cuda(t) != cuda:
                raise FakeCudaError(
                    f"device mix-up in {name}: {_describe(t)} with {_describe(tensors[0])}"
                )
        if cuda and name in _WAITS_INSIDE:
            _count("implicit", name)
        out = func(*args, **kwargs)
        _mark(out, cuda)
        return out

    def _op_get_device(self, func, args, kwargs):
        return 0 if is_cuda(args[0]) else func(*args, **kwargs)


_SPECIAL = {
    "to",
    "cuda",
    "cpu",
    "copy_",
    "__getitem__",
    "__setitem__",
    "index_put_",
    "index_put",
    "get_device",
}


# -- what else a GPU run touches: torch.cuda, parameters, compiled ops ----------------------
class _Event:
    def __init__(self, enable_timing: bool = False, **_):
        self.t = None

    def record(self, stream=None) -> None:
        import time

        self.t = time.perf_counter()

    def synchronize(self) -> None:
        _count("syncs", "Event.synchronize")

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _Event) -> float:
        _count("syncs", "Event.elapsed_time")
        return (end.t - self.t) * 1000.0


class _Stream:
    def __init__(self, *_, **__):
        pass

    def synchronize(self) -> None:
        _count("syncs", "Stream.synchronize")

    def wait_stream(self, other) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _synchronize(device=None) -> None:
    _count("syncs", "torch.cuda.synchronize")


_FAKE_TOTAL = 80 * 2**30
_CUDA_PATCHES: dict[str, Any] = {
    "is_available": lambda: True,
    "is_initialized": lambda: True,
    "init": lambda: None,
    "device_count": lambda: 1,
    "current_device": lambda: 0,
    "set_device": lambda device: None,
    "get_device_name": lambda device=None: "fake CUDA (CPU)",
    "get_device_capability": lambda device=None: (8, 0),
    "get_device_properties": lambda device=None: types.SimpleNamespace(
        name="fake CUDA (CPU)", major=8, minor=0, total_memory=_FAKE_TOTAL, multi_processor_count=1
    ),
    "synchronize": _synchronize,
    "empty_cache": lambda: None,
    "memory_allocated": lambda device=None: 0,
    "max_memory_allocated": lambda device=None: 0,
    "memory_reserved": lambda device=None: 0,
    "max_memory_reserved": lambda device=None: 0,
    "reset_peak_memory_stats": lambda device=None: None,
    "mem_get_info": lambda device=None: (_FAKE_TOTAL, _FAKE_TOTAL),
    "manual_seed": lambda seed: None,
    "manual_seed_all": lambda seed: None,
    "Event": _Event,
    "Stream": _Stream,
    "current_stream": lambda device=None: _Stream(),
    "default_stream": lambda device=None: _Stream(),
    "stream": lambda s=None: _Stream(),
}


# Arguments our CUDA ops read on the host (csrc/ops.h: the hash grid's level tables).
_HOST_ARGS = {"hash_grid_forward": (2, 3, 4, 5), "hash_grid_backward": (4, 5, 6, 7)}
# CUDA ops that wait for the device themselves (march_rays reads its output size back).
_WAITS_INSIDE = {"march_rays"}


class _CheckedOps:
    """A compiled module as the fake device sees it: the CPU build behind the CUDA one's names,
    with every call's tensors checked against the device the caller asked for."""

    def __init__(self, module, device_type: str, names: set[str] | None, label: str):
        self._module, self._device_type, self._names, self._label = (
            module,
            device_type,
            names,
            label,
        )

    def __getattr__(self, name: str):
        if self._device_type == "cuda" and self._names is not None and name not in self._names:
            raise FakeCudaError(f"{self._label}.{name} has no CUDA implementation")
        fn = getattr(self._module, name)
        if not callable(fn):
            return fn
        cuda = self._device_type == "cuda"

        host = _HOST_ARGS.get(name, ()) if cuda else ()
        library_op = isinstance(fn, (torch._ops.OpOverloadPacket, torch._ops.OpOverload))

        def call(*args, **kwargs):
            for i, a in enumerate(args):
                for t in _tensors(a, []):
                    if is_cuda(t) != (cuda and i not in host):
                        where = "host argument " if i in host else ""
                        raise FakeCudaError(
                            f"{self._label}.{name} ({self._device_type.upper()} build) given a "
                            f"{_describe(t)} tensor as {where}{i}"
                        )
            if name in _WAITS_INSIDE and cuda and not library_op:  # the mode counts those
                _count("implicit", name)
            out = fn(*args, **kwargs)
            _mark(out, cuda)
            return out

        return call


def _cuda_names(ext) -> set[str] | None:
    """The ops the CUDA build of `ext` has, as its sources say (None: unknown)."""
    from kernels import _ext

    if hasattr(_ext, "cuda_op_names"):
        return _ext.cuda_op_names(ext)
    return None


class _Patches:
    def __init__(self):
        self.saved: list[tuple[Any, str, Any]] = []

    def set(self, obj, name: str, value) -> None:
        # The raw attribute (a classmethod, a staticmethod), so undo restores it as it was.
        self.saved.append((obj, name, vars(obj).get(name, getattr(obj, name))))
        setattr(obj, name, value)

    def undo(self) -> None:
        while self.saved:
            obj, name, value = self.saved.pop()
            setattr(obj, name, value)


_lock = threading.Lock()
_patches: _Patches | None = None
_active_threads = 0


def _patch_globals() -> _Patches:
    p = _Patches()
    for name, value in _CUDA_PATCHES.items():
        p.set(torch.cuda, name, value)

    new_parameter = torch.nn.Parameter.__new__

    def parameter(cls, data=None, requires_grad=True):  # nn.Parameter(data) keeps data's device
        out = new_parameter(cls, data, requires_grad)
        _mark(out, is_cuda(data))
        return out

    p.set(torch.nn.Parameter, "__new__", staticmethod(parameter))

    # Custom autograd functions: the engine runs their backward without torch-function modes,
    # handing it unmarked gradients. Their backward runs in the mode again, and the gradients
    # arriving carry the device of the forward's outputs (as on a GPU).
    function_apply = vars(torch.autograd.Function)["apply"].__func__

    def apply(cls, *args, **kwargs):
        out = function_apply(cls, *args, **kwargs)
        if any(is_cuda(t) for t in _tensors(args, _tensors(kwargs, []))):
            _mark(out, True)
            for t in _tensors(out, []):
                if t.grad_fn is not None:
                    setattr(t.grad_fn, _MARK, True)
        return out

    p.set(torch.autograd.Function, "apply", classmethod(apply))
    backward_apply = torch.autograd.function.BackwardCFunction.apply

    def backward(ctx, *grads):
        _mark(grads, getattr(ctx, _MARK, False))
        if torch._C._len_torch_function_stack() or not enabled():
            return backward_apply(ctx, *grads)
        with FakeCudaMode():
            return backward_apply(ctx, *grads)

    p.set(torch.autograd.function.BackwardCFunction, "apply", backward)
    # A function's saved outputs come back from ctx.saved_tensors as new tensor objects: they
    # keep the device each had when saved.
    save_for_backward = torch.autograd.function.FunctionCtx.save_for_backward

    def save(ctx, *tensors):
        ctx._nf_saved_cuda = tuple(is_cuda(t) for t in tensors)
        return save_for_backward(ctx, *tensors)

    p.set(torch.autograd.function.FunctionCtx, "save_for_backward", save)
    saved_getter = torch._C._FunctionBase.saved_tensors.__get__

    def saved_tensors(ctx):
        out = saved_getter(ctx)
        for t, cuda in zip(out, getattr(ctx, "_nf_saved_cuda", ())):
            _mark(t, cuda)
        return out

    p.set(torch.autograd.function.BackwardCFunction, "saved_tensors", property(saved_tensors))

    try:
        from kernels import _ext
    except ImportError:
        return p
    if hasattr(_ext, "load"):
        load = _ext.load
        cache: dict = {}

        def fake_load(ext, device_type: str):
            key = (ext.name, device_type)
            if key not in cache:
                real = load(ext, "cpu" if device_type == "cuda" else device_type)
                names = _cuda_names(ext) if device_type == "cuda" else None
                cache[key] = _CheckedOps(real, device_type, names, ext.name)
            return cache[key]

        p.set(_ext, "load", fake_load)
    return p


_local = threading.local()


def _on_stack() -> bool:
    return any(
        isinstance(m, FakeCudaMode) for m in torch.overrides._get_current_function_mode_stack()
    )


def enable() -> FakeCudaMode:
    """Enter fake CUDA in this thread (the process-wide patches on first use); idempotent."""
    global _patches, _active_threads
    mode = getattr(_local, "mode", None)
    if mode is not None and _on_stack():
        return mode
    with _lock:
        if _patches is None:
            _patches = _patch_globals()
        _active_threads += 1
    mode = FakeCudaMode()
    mode.__enter__()
    _local.mode = mode
    return mode


def disable() -> None:
    """Leave fake CUDA in this thread (and undo the patches when no thread is left in it)."""
    global _patches, _active_threads
    mode = getattr(_local, "mode", None)
    if mode is None:
        return
    mode.__exit__(None, None, None)
    _local.mode = None
    with _lock:
        _active_threads -= 1
        if _active_threads == 0 and _patches is not None:
            _patches.undo()
            _patches = None


def enabled() -> bool:
    return getattr(_local, "mode", None) is not None


@contextmanager
def fake_cuda() -> Iterator[Counts]:
    """Run the block on the fake CUDA device; yields the process's `counts`."""
    was = enabled()
    enable()
    try:
        yield counts
    finally:
        if not was:
            disable()


def enable_from_env() -> bool:
    """Turn fake CUDA on when NF_FAKE_CUDA=1 (worker processes of the fake-CUDA tests): in this
    thread now, in every pool process a Celery worker forks, and each task's counts logged."""
    if os.environ.get(ENV, "") in ("", "0"):
        return False
    import logging

    from celery.signals import task_postrun, task_prerun, worker_process_init

    log = logging.getLogger(__name__)
    started: dict[str, Counts] = {}

    def before(task_id=None, **_):
        enable()  # the task runs in this thread
        started[task_id] = counts.snapshot()

    def after(task_id=None, task=None, **_):
        spent = counts.since(started.pop(task_id, Counts()))
        log.warning("fake CUDA: %s %s: %s", task.name if task else "?", task_id, spent.summary())

    worker_process_init.connect(lambda **_: enable(), weak=False)
    task_prerun.connect(before, weak=False)
    task_postrun.connect(after, weak=False)
    enable()
    log.warning("fake CUDA on (%s=1): test-only, tensors stay on the CPU", ENV)
    return True
