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

This is the only module allowed to import :mod:`mem_cache_kernels._triton`, and only inside a
function, so ``import mem_cache_kernels`` never imports ``triton``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from types import ModuleType
from typing import Literal, get_args

import torch

from mem_cache_kernels._row_ops import RunJobs
from mem_cache_kernels._torch.jobs import run_jobs as torch_run_jobs

__all__ = [
    "BACKEND_ENV_VAR",
    "Backend",
    "ResolvedBackend",
    "resolve_backend",
    "triton_available",
    "row_executor",
    "triton_impl",
]

Backend = Literal["auto", "torch", "triton"]
ResolvedBackend = Literal["torch", "triton"]
BACKEND_ENV_VAR = "MEM_CACHE_KERNELS_BACKEND"
_GPU_DEVICE_TYPES = frozenset({"cuda"})  # ROCm tensors also report device type "cuda"


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


def resolve_backend(backend: str, *tensors: torch.Tensor) -> ResolvedBackend:
    """Resolve ``backend`` for an op whose operands are ``tensors``.

    Raises ``ValueError`` for an unknown backend name (argument or environment variable) and for
    ``"triton"`` on CPU tensors without ``TRITON_INTERPRET=1``; ``RuntimeError`` when ``"triton"``
    is requested but triton cannot be imported.
    """
    if backend not in get_args(Backend):
        raise ValueError(f"backend must be one of {get_args(Backend)}, got {backend!r}")
    if backend == "auto":
        env = os.environ.get(BACKEND_ENV_VAR, "auto") or "auto"
        if env not in get_args(Backend):
            raise ValueError(
                f"environment variable {BACKEND_ENV_VAR} must be one of {get_args(Backend)}, "
                f"got {env!r}"
            )
        backend = env
    on_gpu = any(t.device.type in _GPU_DEVICE_TYPES for t in tensors)
    if backend == "auto":
        return "triton" if on_gpu and triton_available() else "torch"
    if backend == "torch":
        return "torch"
    if not triton_available():
        raise RuntimeError(
            "backend='triton' was requested but triton cannot be imported; install the "
            "'triton' extra (pip install 'mem-cache-kernels[triton]') or use backend='torch'"
        )
    if not on_gpu and not _interpreter_enabled():
        devices = sorted({str(t.device) for t in tensors})
        raise ValueError(
            f"backend='triton' needs GPU tensors or TRITON_INTERPRET=1, got tensors on {devices}"
        )
    return "triton"


def triton_impl(submodule: str) -> ModuleType:
    """Import and return ``mem_cache_kernels._triton.<submodule>`` (on first use only).

    Public op modules call this inside the op, after :func:`resolve_backend` chose Triton.
    """
    from mem_cache_kernels import _triton

    return importlib.import_module(f"{_triton.__name__}.{submodule}")


def row_executor(backend: str, *tensors: torch.Tensor) -> RunJobs:
    """The row-job executor of the backend that :func:`resolve_backend` chooses for ``tensors``.

    The data-movement ops (:mod:`mem_cache_kernels._row_ops`) take it as their ``run``
    argument: the torch executor, or the Triton row-copy launcher (imported on first use).
    """
    if resolve_backend(backend, *tensors) == "triton":
        run: RunJobs = triton_impl("rows").run_jobs
        return run
    return torch_run_jobs
