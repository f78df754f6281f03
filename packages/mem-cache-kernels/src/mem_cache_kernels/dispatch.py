"""Kernel dispatch: the one table of implementations, and the choice of backend for a call.

Every op with two implementations has one row in :data:`TABLE`: ``op name -> (torch_fn,
load_triton_fn)``. ``torch_fn`` is the torch implementation itself (a function of
:mod:`mem_cache_kernels._torch`, imported with this module: torch only); ``load_triton_fn`` is a
small function that imports the op family's module of :mod:`mem_cache_kernels._triton` on first
use and returns its implementation (importing :mod:`mem_cache_kernels` never imports triton; this
is the only module that imports the Triton subpackage, and only inside those functions). The
host-driven page-first-direct copies have one implementation, the same on every backend:
:data:`SINGLE` maps their public op's name to its trusted body.

:func:`pick` is the trusted entry. A public op of :mod:`mem_cache_kernels` (``store_kv``,
``alloc_extend``, ...) checks its arguments, then runs ``pick(op, backend, *tensors)(*args)``; a
pool, allocator or host pool that has already checked its own arguments at its public method
calls :func:`pick` itself: no second validation on the way down. Either way the call goes
``dispatch -> _torch.<family>`` (or ``_triton.<family>``), nothing in between.

Backends (every public op takes ``backend: Backend = "auto"``):

* ``"torch"``: the torch implementation (any device; the CPU path of the library).
* ``"triton"``: the Triton implementation. Requires ``triton`` to import; CPU tensors are accepted
  only when ``TRITON_INTERPRET=1`` is set (Triton's interpreter), otherwise a ``ValueError``.
* ``"auto"``: Triton when the tensors live on a GPU (CUDA/ROCm) and ``triton`` imports, torch
  otherwise.

The environment variable ``MEM_CACHE_KERNELS_BACKEND`` (``auto`` | ``torch`` | ``triton``) replaces
``"auto"`` (an explicit ``backend=`` argument always wins); :func:`resolve_backend` is its one
reader. Tests use it to force the Triton path on CPU under ``TRITON_INTERPRET=1``.

The implementation :func:`pick` returns takes the public op's arguments in order, without
``backend`` and with keyword-only arguments passed positionally (``store_kv(k_cache, v_cache,
loc, k, v, dtype)``, ``alloc_extend(prefix_lens, seq_lens, last_loc, free_pages, out, page_size,
num_new_pages, num_tokens)``), and trusts them: valid shapes, dtypes, devices, in-range indices
and, for ``alloc_*``, a correct ``num_new_pages`` (negative index entries are skipped, as in the
public ops). Exceptions, unchanged from before: the Mamba ``scatter_state_slots`` body takes
``(src, states, src_slots, slots)`` (it is the gather body with the sides swapped), and the
DeepSeek-V4 record bodies take their output tensors (``pack_records(nope, scales, rope, out)``,
``unpack_records(records, nope, scales, rope)``, ``read_records(buffer, loc, out, page_size)``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal, cast, get_args

import torch

from mem_cache_kernels import _layout as lay
from mem_cache_kernels._torch import alloc as t_alloc
from mem_cache_kernels._torch import deepseek_v4 as t_deepseek_v4
from mem_cache_kernels._torch import mamba as t_mamba
from mem_cache_kernels._torch import req_table as t_req_table
from mem_cache_kernels._torch import rows as t_rows
from mem_cache_kernels.checks import check_choice

__all__ = [
    "BACKEND_ENV_VAR",
    "SINGLE",
    "TABLE",
    "Backend",
    "ResolvedBackend",
    "check_backend",
    "pick",
    "resolve_backend",
    "triton_available",
]

Backend = Literal["auto", "torch", "triton"]
ResolvedBackend = Literal["torch", "triton"]
BACKEND_ENV_VAR = "MEM_CACHE_KERNELS_BACKEND"
_BACKENDS: tuple[str, ...] = get_args(Backend)
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


# os.environ's own store (every write through os.environ lands there): whether the backend
# setting is unset is one dict lookup, where os.environ.get encodes the key on every call
_ENVIRON_DATA: Any = getattr(os.environ, "_data", None)
_ENVIRON_KEY: Any = (
    os.environ.encodekey(BACKEND_ENV_VAR) if hasattr(os.environ, "encodekey") else None
)


def _setting_unset() -> bool:
    """True when ``MEM_CACHE_KERNELS_BACKEND`` is certainly not set (``False``: read it)."""
    return _ENVIRON_DATA is not None and _ENVIRON_KEY not in _ENVIRON_DATA


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
    if backend == "torch":
        return "torch"
    if backend == "auto":
        env = os.environ.get(BACKEND_ENV_VAR, "auto") or "auto"
        if env not in _BACKENDS:
            raise ValueError(
                f"environment variable {BACKEND_ENV_VAR} must be one of {_BACKENDS}, got {env!r}"
            )
        backend = env
    elif backend != "triton":
        check_backend(backend)
    if backend == "torch":
        return "torch"
    on_gpu = any(t.device.type in _GPU_DEVICE_TYPES for t in tensors)
    if backend == "auto":
        return "triton" if on_gpu and triton_available() else "torch"
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


# ----------------------------------------------------------------------------- Triton, lazily
# ``import a.b.c as m`` (not ``from a.b import c``) re-imports a module that a test dropped from
# sys.modules to decorate its kernels afresh (interpreted or compiled), instead of returning the
# stale one still bound on the package.
def _triton_alloc() -> ModuleType:
    import mem_cache_kernels._triton.alloc as m

    return m


def _triton_req_table() -> ModuleType:
    import mem_cache_kernels._triton.req_table as m

    return m


def _triton_rows() -> ModuleType:
    import mem_cache_kernels._triton.rows as m

    return m


_TRITON_BOUND: dict[Callable[..., Any], tuple[ModuleType, Callable[..., Any]]] = {}


def _bind_triton_rows(body: Callable[..., Any]) -> Callable[..., Any]:
    """A row op body of :mod:`mem_cache_kernels._layout` bound to the Triton executor: bound
    once per load of the Triton module (a test that re-imports it gets fresh bindings)."""
    mod = _triton_rows()
    hit = _TRITON_BOUND.get(body)
    if hit is None or hit[0] is not mod:
        hit = _TRITON_BOUND[body] = (mod, functools.partial(body, mod.run_jobs))
    return hit[1]


def _triton_deepseek_v4() -> ModuleType:
    import mem_cache_kernels._triton.deepseek_v4 as m

    return m


def _triton_mamba() -> ModuleType:
    import mem_cache_kernels._triton.mamba as m

    return m


Impl = Callable[..., Any]

TABLE: dict[str, tuple[Impl, Callable[[], Impl]]] = {
    # alloc
    "alloc_extend": (t_alloc.alloc_extend, lambda: _triton_alloc().alloc_extend),
    "alloc_decode": (t_alloc.alloc_decode, lambda: _triton_alloc().alloc_decode),
    # req_table
    "write_req_to_token": (
        t_req_table.write_req_to_token,
        lambda: _triton_req_table().write_req_to_token,
    ),
    "get_last_loc": (t_req_table.get_last_loc, lambda: _triton_req_table().get_last_loc),
    # store, move, transfer (the row-moving families): one body per op in _layout, bound to
    # each backend's executor (run_jobs); the move has a body per backend
    **{
        name: (
            functools.partial(body, t_rows.run_jobs),
            functools.partial(_bind_triton_rows, body),
        )
        for name, body in (
            ("store_kv", lay.store_kv),
            ("set_mla_kv_buffer", lay.set_mla_kv_buffer),
            ("get_mla_kv_buffer", lay.get_mla_kv_buffer),
            ("transfer_rows", lay.transfer_rows),
            ("transfer_rows_all_layers", lay.transfer_rows_all_layers),
            ("load_layer_from_page_first", lay.load_layer_from_page_first),
            ("backup_all_layers_to_page_first", lay.backup_all_layers_to_page_first),
        )
    },
    "copy_all_layer_kv_cache": (
        t_rows.copy_all_layer_kv_cache,
        lambda: _triton_rows().copy_all_layer_kv_cache,
    ),
    # deepseek_v4
    "pack_records": (t_deepseek_v4.pack_records, lambda: _triton_deepseek_v4().pack_records),
    "unpack_records": (t_deepseek_v4.unpack_records, lambda: _triton_deepseek_v4().unpack_records),
    "write_records": (t_deepseek_v4.write_records, lambda: _triton_deepseek_v4().write_records),
    "read_records": (t_deepseek_v4.read_records, lambda: _triton_deepseek_v4().read_records),
    # mamba (gather and scatter share one body: src -> dst)
    "copy_state_slots": (t_mamba.copy_state_slots, lambda: _triton_mamba().copy_state_slots),
    "gather_state_slots": (
        t_mamba.transfer_state_slots,
        lambda: _triton_mamba().transfer_state_slots,
    ),
    "scatter_state_slots": (
        t_mamba.transfer_state_slots,
        lambda: _triton_mamba().transfer_state_slots,
    ),
}
"""``op name -> (torch implementation, loader of the Triton implementation)``."""

SINGLE: dict[str, Impl] = {
    "direct_load_layer_from_page_first_direct": t_rows.load_layer_pages,
    "direct_backup_all_layers_to_page_first_direct": t_rows.backup_all_layer_pages,
}
"""``public op name -> its trusted body``, for the ops with one implementation that every
backend runs (host-driven copies): :func:`pick` returns the body whatever the backend. The body
takes the public op's arguments without ``backend``, indices int64 on the CPU."""


def pick(op: str, backend: str, *tensors: torch.Tensor) -> Callable[..., Any]:
    """The implementation of kernel op ``op`` for ``resolve_backend(backend, *tensors)``
    (trusted arguments, see the module doc).

    ``TypeError`` for a non-str ``op``, ``ValueError`` for a name without a row in
    :data:`TABLE` or :data:`SINGLE`; the errors of :func:`resolve_backend`."""
    try:
        torch_fn, load_triton_fn = TABLE[op]
    except (KeyError, TypeError):
        if isinstance(op, str) and op in SINGLE:  # one body for every backend
            return SINGLE[op]
        if not isinstance(op, str):
            raise TypeError(
                f"op must be a str naming a kernel op, got {type(op).__name__}"
            ) from None
        raise ValueError(f"op must name a kernel op of dispatch.TABLE, got {op!r}") from None
    # the hot case inline (every pool write and allocation of a CPU engine passes here):
    # "auto" with no backend setting and no GPU operand is torch
    if backend == "auto" and (_setting_unset() or os.environ.get(BACKEND_ENV_VAR) in ("auto", "")):
        for t in tensors:
            if t.is_cuda:  # a GPU tensor (ROCm's too): the full resolution below
                break
        else:
            return torch_fn
    if resolve_backend(backend, *tensors) == "torch":
        return torch_fn
    return load_triton_fn()
