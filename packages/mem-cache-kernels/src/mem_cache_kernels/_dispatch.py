"""Backend selection: which implementation of an op runs for a given call.

Every public op takes ``backend: Backend = "auto"``:

* ``"torch"``: the torch reference implementation (any device; the CPU path of the library).
* ``"triton"``: the Triton implementation. Requires ``triton`` to import; CPU tensors are accepted
  only when ``TRITON_INTERPRET=1`` is set (Triton's interpreter), otherwise a ``ValueError``.
* ``"auto"``: Triton when the tensors live on a GPU (CUDA/ROCm) and ``triton`` imports, torch
  otherwise.

The environment variable ``MEM_CACHE_KERNELS_BACKEND`` (``auto`` | ``torch`` | ``triton``) replaces
``"auto"`` (an explicit ``backend=`` argument always wins). Tests use it to force the Triton path on
CPU under ``TRITON_INTERPRET=1``.

A public op validates its arguments, then calls :func:`implementation` with its catalogue entry
(:mod:`mem_cache_kernels._registry`) and calls what it returns: the function the entry names for
the resolved backend. That is the whole dispatch path.

This is the only module allowed to import :mod:`mem_cache_kernels._triton`, and only inside a
function, so ``import mem_cache_kernels`` never imports ``triton``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal, cast, get_args

import torch

from mem_cache_kernels._registry import OpInfo, split_target
from mem_cache_kernels.checks import check_choice

__all__ = [
    "BACKEND_ENV_VAR",
    "Backend",
    "ResolvedBackend",
    "check_backend",
    "implementation",
    "implementation_for",
    "load_target",
    "resolve_backend",
    "triton_available",
]

Backend = Literal["auto", "torch", "triton"]
ResolvedBackend = Literal["torch", "triton"]
BACKEND_ENV_VAR = "MEM_CACHE_KERNELS_BACKEND"
_BACKENDS: tuple[str, ...] = get_args(Backend)
_GPU_DEVICE_TYPES = frozenset({"cuda"})  # ROCm tensors also report device type "cuda"
_TRITON_PACKAGE = "mem_cache_kernels._triton"


@functools.cache
def triton_available() -> bool:
    """True when ``triton`` can be imported (checked once, on first use)."""
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        import triton  # noqa: F401
    except Exception:  # a broken install (e.g. no driver libraries) counts as unavailable
        return False
    return True


def _interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_backend(backend: object) -> Backend:
    """``backend`` if it names a backend: ``TypeError`` for a non-str, ``ValueError`` for an
    unknown name. (Ops without a backend choice, the host-driven ``direct_*`` copies, only
    validate it.)"""
    return cast(Backend, check_choice("backend", backend, _BACKENDS))


def resolve_backend(backend: str, *tensors: torch.Tensor) -> ResolvedBackend:
    """Resolve ``backend`` for an op whose operands are ``tensors``.

    Raises ``TypeError`` for a non-str backend, ``ValueError`` for an unknown backend name
    (argument or environment variable) and for ``"triton"`` on CPU tensors without
    ``TRITON_INTERPRET=1``; ``RuntimeError`` when ``"triton"`` is requested but triton cannot be
    imported.
    """
    if backend not in _BACKENDS:
        check_backend(backend)
    if backend == "auto":
        env = os.environ.get(BACKEND_ENV_VAR, "auto") or "auto"
        if env not in _BACKENDS:
            raise ValueError(
                f"environment variable {BACKEND_ENV_VAR} must be one of {_BACKENDS}, got {env!r}"
            )
        backend = env
    on_gpu = any(t.device.type in _GPU_DEVICE_TYPES for t in tensors)
    if backend == "auto":
        return "triton" if on_gpu and triton_available() else "torch"
    if backend == "torch":
        return "torch"
    if not on_gpu and not _interpreter_enabled():  # the caller's mistake, with or without triton
        devices = sorted({str(t.device) for t in tensors})
        raise ValueError(
            f"backend='triton' needs GPU tensors or TRITON_INTERPRET=1, got tensors on {devices}"
        )
    if not triton_available():
        raise RuntimeError(
            "backend='triton' was requested but triton cannot be imported; install the "
            "'triton' extra (pip install 'mem-cache-kernels[triton]') or use backend='torch'"
        )
    return "triton"


# ----------------------------------------------------------------------------- implementations
_TORCH_IMPLS: dict[str, Callable[..., Any]] = {}
"""Torch implementations by op name, resolved on first use."""

_TRITON_IMPLS: dict[str, tuple[ModuleType, Callable[..., Any]]] = {}
"""Triton implementations by op name, with the ``_triton`` module they came from. An entry is
used only while that module is still the one in ``sys.modules``: a test may drop the ``_triton``
modules to decorate the kernels afresh (interpreted or compiled), and the next call must then
re-import them rather than run the stale kernels."""


def _import(module: str) -> ModuleType:
    if module == _TRITON_PACKAGE or module.startswith(_TRITON_PACKAGE + "."):
        from mem_cache_kernels import _triton  # the one way into the Triton subpackage

        del _triton  # imported for its side effect (triton itself) and for the import contract
    return importlib.import_module(module)


def load_target(target: str) -> Callable[..., Any]:
    """The callable a catalogue target names (see :mod:`mem_cache_kernels._registry`):
    ``module:function``, or ``module:body(module:executor)`` as ``body`` with the executor bound
    as its first argument. Imports the module(s) on first use."""
    module, function, executor = split_target(target)
    fn = getattr(_import(module), function)
    if not callable(fn):
        raise TypeError(f"{target} is a {type(fn).__name__}, not a function")
    if executor is None:
        return fn  # type: ignore[no-any-return]
    return functools.partial(fn, load_target(executor))


def _triton_module(target: str) -> ModuleType:
    """The ``_triton`` module whose code ``target`` runs (its function's, or its executor's)."""
    module, _, executor = split_target(target)
    return sys.modules[module if executor is None else executor.partition(":")[0]]


def implementation_for(op: OpInfo, backend: ResolvedBackend) -> Callable[..., Any]:
    """The implementation the catalogue names for ``op`` on the (resolved) ``backend``.

    ``RuntimeError`` when the entry names none, or names something that does not resolve to a
    callable (a broken catalogue: internal state, not a caller mistake)."""
    if backend == "torch":
        impl = _TORCH_IMPLS.get(op.name)
        if impl is not None:
            return impl
    else:
        entry = _TRITON_IMPLS.get(op.name)
        if entry is not None and sys.modules.get(entry[0].__name__) is entry[0]:
            return entry[1]
    target = op.torch if backend == "torch" else op.triton
    if target is None:
        raise RuntimeError(f"op {op.qualname} has no {backend} implementation in the catalogue")
    try:
        impl = load_target(target)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise RuntimeError(
            f"catalogue entry {op.qualname}: {backend} target {target!r} does not resolve: {exc}"
        ) from exc
    if backend == "torch":
        _TORCH_IMPLS[op.name] = impl
    else:
        _TRITON_IMPLS[op.name] = (_triton_module(target), impl)
    return impl


def implementation(op: OpInfo, backend: str, *tensors: torch.Tensor) -> Callable[..., Any]:
    """The implementation of ``op`` for ``resolve_backend(backend, *tensors)``."""
    if resolve_backend(backend, *tensors) == "torch":
        impl = _TORCH_IMPLS.get(op.name)
        return impl if impl is not None else implementation_for(op, "torch")
    return implementation_for(op, "triton")
