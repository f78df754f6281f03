"""Host buffer layouts and IO backends, and which combinations work.

One host tensor per role (``"k"``/``"v"`` for MHA, ``"kv"`` for MLA); ``L`` = layers,
``row`` = the role's row shape (one token of one layer), ``slots = pages * page_size``:

* ``layer_first``: ``[L, slots, *row]``; per-layer contiguous; kernel or direct IO.
* ``page_first``: ``[slots, L, *row]``; a page's all-layer data contiguous (zero-copy storage
  pages); kernel IO.
* ``page_first_direct``: ``[pages, L, page_size, *row]``; each (page, layer) block contiguous, one
  copy per page per layer; direct IO.

IO backends: ``"kernel"`` (the kernels package's row-transfer ops) and ``"direct"`` (host-driven
slice copies of maximal runs of consecutive pages). Combinations (SGLang's fix-ups):

* ``page_first`` + ``direct`` cannot work (a layer's rows of a page are strided): a pool built
  with ``io_backend="direct"`` and ``layout="page_first"`` becomes ``page_first_direct`` (logged);
  a transfer call asking for ``direct`` on a ``page_first`` pool raises ``ValueError``.
* ``page_first_direct`` + ``kernel``: no row kernel exists for this layout, the transfer runs the
  direct ops instead (logged once).
"""

from __future__ import annotations

import logging
from typing import Literal, get_args

from mem_cache_kernels.checks import check_choice, check_int

__all__ = [
    "IOBackend",
    "Layout",
    "LAYOUTS",
    "IO_BACKENDS",
    "check_io_backend",
    "check_layout",
    "effective_io_backend",
    "host_buffer_shape",
    "resolve_layout",
]

Layout = Literal["layer_first", "page_first", "page_first_direct"]
IOBackend = Literal["kernel", "direct"]
LAYOUTS: tuple[str, ...] = get_args(Layout)
IO_BACKENDS: tuple[str, ...] = get_args(IOBackend)

_log = logging.getLogger(__name__)


def check_layout(layout: str) -> Layout:
    return check_choice("layout", layout, LAYOUTS)  # type: ignore[return-value]


def check_io_backend(io_backend: str) -> IOBackend:
    return check_choice("io_backend", io_backend, IO_BACKENDS)  # type: ignore[return-value]


def resolve_layout(layout: str, io_backend: str | None) -> Layout:
    """The layout a pool is built with, given the IO backend it will mostly use.

    ``page_first`` + ``direct`` becomes ``page_first_direct`` (logged at INFO).
    """
    checked = check_layout(layout)
    direct = io_backend is not None and check_io_backend(io_backend) == "direct"
    if direct and checked == "page_first":
        _log.info(
            "host pool: layout 'page_first' cannot use io_backend 'direct'; "
            "using 'page_first_direct' instead"
        )
        return "page_first_direct"
    return checked


def effective_io_backend(layout: Layout, io_backend: str) -> IOBackend:
    """The backend a transfer really uses; ``ValueError`` for a combination that cannot work."""
    backend = check_io_backend(io_backend)
    if layout == "page_first" and backend == "direct":
        raise ValueError(
            "io_backend 'direct' cannot transfer layout 'page_first' (rows of one layer are "
            "strided); build the pool with io_backend='direct' to get 'page_first_direct', "
            "or use io_backend='kernel'"
        )
    if layout == "page_first_direct" and backend == "kernel":
        return "direct"
    return backend


def host_buffer_shape(
    layout: Layout, *, num_pages: int, page_size: int, layer_num: int, row_shape: tuple[int, ...]
) -> tuple[int, ...]:
    """Shape of one role's host tensor (see the table in the module docstring)."""
    layout = check_layout(layout)
    for name, value in (
        ("num_pages", num_pages),
        ("page_size", page_size),
        ("layer_num", layer_num),
    ):
        check_int(name, value, minimum=0)
    if not isinstance(row_shape, tuple):
        raise TypeError(f"row_shape must be a tuple of ints, got {type(row_shape).__name__}")
    for i, d in enumerate(row_shape):
        check_int(f"row_shape[{i}]", d, minimum=0)
    slots = num_pages * page_size
    if layout == "layer_first":
        return (layer_num, slots, *row_shape)
    if layout == "page_first":
        return (slots, layer_num, *row_shape)
    return (num_pages, layer_num, page_size, *row_shape)
