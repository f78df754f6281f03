"""Paged slot allocation ops: ``alloc_extend`` and ``alloc_decode`` (SGLang semantics).

Slots are int64 row ids; page ``p`` owns slots ``[p*page_size, (p+1)*page_size)``. For each request
the new slots are, in order: the rest of its current partial page (``last_loc + 1``, ...), then
whole new pages, then a trailing partial new page. New pages are taken from ``free_pages`` in
request order, so a batch consumes exactly ``free_pages[0 : total_new_pages]`` where a request needs
``ceil(seq / page_size) - ceil(prefix / page_size)`` new pages. ``last_loc = -1`` means an empty
prefix. Example (page size 4): prefix 2, seq 11, last_loc 1, free pages [3, 4] gives
``[2, 3, 12, 13, 14, 15, 16, 17, 18]``.

Validation cost: the type, dtype, shape, length and device checks are O(1) and always on. The
value checks (``0 <= prefix <= seq``, ``out`` length, enough free pages) read the lengths, which
is free only on the CPU and still costs a pass over them; a caller that has already computed the
batch's page count on the host (an allocator does, from its ``*_cpu`` lengths) passes it as
``num_new_pages=`` (and ``num_tokens=``), and the op checks it against ``free_pages`` and ``out``
in O(1) instead.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from mem_cache_kernels import checks as v
from mem_cache_kernels import pages as page_math
from mem_cache_kernels.dispatch import Backend, pick

__all__ = ["alloc_decode", "alloc_extend"]

# numpy reductions on a CPU tensor's buffer cost ~1 us; torch ops cost a few us each
_HAS_NUMPY = importlib.util.find_spec("numpy") is not None

_INDEX = v.INDEX_DTYPES


def _index(name: str, t: object) -> torch.Tensor:
    """Fast path of :func:`v.check_index` (the helper builds the error message)."""
    if isinstance(t, torch.Tensor) and t.dtype in _INDEX and t.dim() == 1 and not t.is_meta:
        return t
    return v.check_index(name, t)


def _out(t: object) -> torch.Tensor:
    if isinstance(t, torch.Tensor) and t.dtype is torch.int64 and t.dim() == 1 and not t.is_meta:
        return t
    return v.check_index("out", t, dtypes=(torch.int64,))


def _fast_ok(out: object, page_size: object, *tensors: object) -> bool:
    """One pass over the O(1) checks for the common case (all fine); ``False`` means "run the
    detailed checks", which raise with a message naming the argument."""
    if not (
        isinstance(out, torch.Tensor)
        and out.dtype is torch.int64
        and out.dim() == 1
        and type(page_size) is int
        and page_size > 0
        and not page_size & (page_size - 1)
    ):
        return False
    dev = out.device
    if dev.type == "meta":
        return False
    for t in tensors:
        if not (
            isinstance(t, torch.Tensor) and t.dtype in _INDEX and t.dim() == 1 and t.device == dev
        ):
            return False
    return True


def _check_free_pages(available: int, needed: int) -> None:
    if needed > available:
        raise ValueError(
            f"free_pages must hold the {needed} pages this batch needs, got {available}"
        )


def _host_array(t: torch.Tensor) -> Any:
    """A CPU tensor as a numpy array (no copy) when numpy is there, else the tensor itself (the
    callers use only ``min``, ``&``, ``==`` and ``sum``, which both provide)."""
    return t.numpy() if _HAS_NUMPY else t


def _check_pages(free: torch.Tensor, n: int) -> None:
    """The ``n`` pages a batch takes from ``free_pages`` must be real pages (ids >= 1): page 0 is
    the padding page and a negative id yields negative slots. CPU tensors (free to read) and any
    device in debug mode; one reduction over the ``n`` consumed ids."""
    if n <= 0:
        return
    head = v.host_values(free if free.shape[0] == n else free[:n])
    if head is None:
        return
    lo = min(head.tolist()) if n <= v.SMALL_BATCH else int(_host_array(head).min())
    if lo < 1:
        at = int(torch.nonzero(head < 1)[0, 0])
        raise ValueError(
            f"free_pages must hold page ids >= 1 (page 0 is the padding page), got {lo} at "
            f"position {at} of the {n} pages this batch takes"
        )


def _extend_pages(pre: torch.Tensor, seq: torch.Tensor, free: int, out: int, ps: int) -> int:
    """CPU value checks of an extend batch; returns its page count."""
    pages, total = page_math.extend_counts(pre, seq, ps)
    if total != out:
        raise ValueError(f"out must have sum(seq_lens - prefix_lens) = {total} elements, got {out}")
    _check_free_pages(free, pages)
    return pages


def alloc_extend(  # noqa: PLR0917
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    *,
    num_new_pages: int | None = None,
    num_tokens: int | None = None,
    backend: Backend = "auto",
) -> None:
    """Allocate the slots of an extend batch into ``out``.

    Args:
        prefix_lens, seq_lens, last_loc: int32/int64 ``[bs]``; ``seq_lens >= prefix_lens``;
            ``last_loc[i]`` is the slot of position ``prefix_lens[i] - 1`` (``-1`` if the prefix is
            empty).
        free_pages: int32/int64 ``[>= total_new_pages]``, page ids (>= 1: page 0 is the padding
            page). The ``total_new_pages`` ids the batch takes are checked on CPU tensors and in
            debug mode (``ValueError``).
        out: int64 ``[sum(seq_lens - prefix_lens)]``, written request-major, position ascending.
        page_size: a power of two (1 included).
        num_new_pages: optional host-side hint, the batch's new-page count
            ``sum(ceil(seq/ps) - ceil(prefix/ps))`` (an allocator computes it from its CPU
            lengths). When given, the op checks ``free_pages.numel() >= num_new_pages`` in O(1)
            and, for larger batches, skips the data pass over the lengths: the values (``0 <=
            prefix <= seq``, the count itself) are then the caller's guarantee, as on a GPU. CPU
            batches of at most ``checks.SMALL_BATCH`` requests still verify the count (a few
            host ints; ``ValueError`` naming ``num_new_pages``).
        num_tokens: optional host-side hint, ``sum(seq_lens - prefix_lens)``; must equal
            ``out.numel()`` (``ValueError`` naming ``num_tokens``).

    All tensors must share one device. Only ``out`` is written. Without ``num_new_pages``, on
    CPU tensors the value checks (lengths, ``out`` size, enough free pages) are done before any
    work; on a GPU they are the caller's guarantee (checking would cost a host synchronisation)
    except in debug mode (``MEM_CACHE_DEBUG=1``), which copies the lengths to the host and runs
    them everywhere.
    """
    if _fast_ok(out, page_size, prefix_lens, seq_lens, last_loc, free_pages) and (
        prefix_lens.shape[0] == seq_lens.shape[0] == last_loc.shape[0]
    ):
        pre, seq, last, free, dst, ps = prefix_lens, seq_lens, last_loc, free_pages, out, page_size
    else:
        pre = _index("prefix_lens", prefix_lens)
        seq = _index("seq_lens", seq_lens)
        last = _index("last_loc", last_loc)
        free = _index("free_pages", free_pages)
        dst = _out(out)
        v.check_same_length(prefix_lens=pre, seq_lens=seq, last_loc=last)
        ps = v.check_page_size(page_size)
        v.check_same_device(
            dst.device, prefix_lens=pre, seq_lens=seq, last_loc=last, free_pages=free
        )
    if (
        num_tokens is not None
        and (type(num_tokens) is not int or num_tokens != dst.shape[0])
        and v.check_int("num_tokens", num_tokens, minimum=0) != dst.shape[0]
    ):
        raise ValueError(f"num_tokens must equal out.numel() = {dst.shape[0]}, got {num_tokens}")
    if num_new_pages is not None:
        if not (type(num_new_pages) is int and 0 <= num_new_pages <= free.shape[0]):
            _check_free_pages(free.shape[0], v.check_int("num_new_pages", num_new_pages, minimum=0))
        if dst.is_cpu and pre.shape[0] <= v.SMALL_BATCH:  # a few host ints: verify the hint
            pages = _extend_pages(pre, seq, free.shape[0], dst.shape[0], ps)
            if pages != num_new_pages:
                raise ValueError(
                    f"num_new_pages must be {pages} for these lengths, got {num_new_pages}"
                )
    elif dst.is_cpu:
        num_new_pages = _extend_pages(pre, seq, free.shape[0], dst.shape[0], ps)
    elif v.debug_enabled():
        num_new_pages = _extend_pages(pre.cpu(), seq.cpu(), free.shape[0], dst.shape[0], ps)
    if num_new_pages is not None:
        _check_pages(free, num_new_pages)
    pick("alloc_extend", backend, dst)(pre, seq, last, free, dst, ps, num_new_pages, num_tokens)


def alloc_decode(
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out: torch.Tensor,
    page_size: int,
    *,
    num_new_pages: int | None = None,
    backend: Backend = "auto",
) -> None:
    """Allocate one slot per request (``seq_lens`` count the new token) into ``out``.

    A request whose new token starts a page (``(seq - 1) % page_size == 0``) takes the next page of
    ``free_pages`` (request order) and gets its first slot; the others get ``last_loc + 1``.

    ``num_new_pages`` (optional host-side hint): the number of requests whose new token starts a
    page. When given, the op checks ``0 <= num_new_pages <= bs`` (``== bs`` for page size 1) and
    ``free_pages.numel() >= num_new_pages`` in O(1). On CPU tensors (and on any device in debug
    mode) ``seq_lens >= 1``, the count itself and the page ids taken (``>= 1``) are checked
    before ``out`` is written, hint or not (``ValueError`` naming the argument); on a GPU without
    debug they are the caller's guarantee. Otherwise the same device/validation rules as
    :func:`alloc_extend` apply.
    """
    if _fast_ok(out, page_size, seq_lens, last_loc, free_pages) and (
        seq_lens.shape[0] == last_loc.shape[0] == out.shape[0]
    ):
        seq, last, free, dst, ps = seq_lens, last_loc, free_pages, out, page_size
    else:
        seq = _index("seq_lens", seq_lens)
        last = _index("last_loc", last_loc)
        free = _index("free_pages", free_pages)
        dst = _out(out)
        v.check_same_length(seq_lens=seq, last_loc=last, out=dst)
        ps = v.check_page_size(page_size)
        v.check_same_device(dst.device, seq_lens=seq, last_loc=last, free_pages=free)
    bs = dst.shape[0]
    if num_new_pages is not None and not (
        type(num_new_pages) is int
        and 0 <= num_new_pages <= bs
        and num_new_pages <= free.shape[0]
        and (ps != 1 or num_new_pages == bs)
    ):  # the fast test failed: find the argument to blame
        # at most one new page per request
        pages = v.check_int("num_new_pages", num_new_pages, minimum=0, maximum=bs)
        if ps == 1 and pages != bs:
            raise ValueError(
                f"num_new_pages must be {bs} for page size 1 (every token starts a page), "
                f"got {pages}"
            )
        _check_free_pages(free.shape[0], pages)
    host_seq = v.host_values(seq) if bs else None
    if host_seq is not None:  # CPU tensors (or debug mode): free to check, hint or not
        pages = page_math.decode_counts(host_seq, ps)
        if num_new_pages is not None and num_new_pages != pages:
            raise ValueError(
                f"num_new_pages must be {pages} for these seq_lens (requests whose new token "
                f"starts a page), got {num_new_pages}"
            )
        _check_free_pages(free.shape[0], pages)
        num_new_pages = pages
    if num_new_pages is not None:
        _check_pages(free, num_new_pages)
    pick("alloc_decode", backend, dst)(seq, last, free, dst, ps, num_new_pages)
