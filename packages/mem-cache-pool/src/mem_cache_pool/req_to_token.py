"""``ReqToTokenPool``: the request -> token-slot table (mirrors SGLang's ``ReqToTokenPool``).

``req_to_token`` is an int32 tensor ``[size + 1, max_context_len]`` on the pool's device: row ``r``
holds, for the request owning row ``r``, the KV slot of each sequence position. Row 0 is the
padding row (padded batches use request index 0); rows ``1..size`` are handed out by ``alloc``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Protocol, overload

import torch

from mem_cache_kernels import checks
from mem_cache_pool._req_table_checks import (
    _check_device_index_bounds,
    _check_write,
    _Index,
    _raise_listed_twice,
)

__all__ = ["AuxCache", "ReqKvInfoLike", "ReqKvLike", "ReqLike", "ReqToTokenPool"]


class AuxCache(Protocol):
    """A per-row auxiliary cache attached with ``ReqToTokenPool.attach_aux_cache`` (SGLang
    0.5.23's sparse side caches): told of freed rows, clears and growth."""

    dense_capacity: int

    def free(self, index: int) -> None: ...

    def clear(self) -> None: ...

    def reset_allocator(self) -> None: ...

    def alloc_to_lengths(
        self, *, req_pool_indices_cpu: torch.Tensor, target_seq_lens_cpu: torch.Tensor
    ) -> None: ...


class ReqLike(Protocol):
    """A request carrying its table row itself (SGLang up to 0.5.14): ``req.req_pool_idx``."""

    req_pool_idx: int | None


class ReqKvInfoLike(Protocol):
    """The per-request KV record of SGLang 0.5.23 (``ReqKvInfo``): ``kv.req_pool_idx``."""

    req_pool_idx: int | None


class ReqKvLike(Protocol):
    """A request keeping its row in a KV record (SGLang 0.5.23): ``req.kv.req_pool_idx``."""

    kv: ReqKvInfoLike


AnyReq = ReqLike | ReqKvLike


def _row_holder(req: object, name: str) -> ReqLike | ReqKvInfoLike:
    """The object whose ``req_pool_idx`` is ``req``'s row: ``req.kv`` (0.5.23) or ``req``."""
    kv = getattr(req, "kv", None)
    if kv is not None and hasattr(kv, "req_pool_idx"):
        return kv  # type: ignore[no-any-return]
    if hasattr(req, "req_pool_idx"):
        return req
    raise TypeError(
        f"{name} must be a request with a req_pool_idx attribute or a kv.req_pool_idx "
        f"attribute (SGLang 0.5.23), got {type(req).__name__}"
    )


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


_SLOT_VALUES = frozenset((torch.int64, torch.int32))
"""Index and value dtypes of :meth:`ReqToTokenPool.write`'s inline forms."""


def _check_fits_int32(values: torch.Tensor) -> None:
    """``ValueError`` naming ``values`` unless every entry of the int64 tensor fits int32 (one
    ``aminmax``), where its values are free to read (on the CPU) or in debug mode."""
    host = values if values.is_cpu else checks.host_values(values)
    if host is not None and host.numel():
        lo, hi = checks.host_bounds(host)
        if lo < _INT32_MIN or hi > _INT32_MAX:
            checks.check_fits_dtype("values", host, torch.int32, "int32")


class ReqToTokenPool:
    """Fixed table of request rows; row allocation is host-side (a Python free list).

    Args:
        size: number of allocatable rows (``>= 1``); the table has ``size + 1`` rows.
        max_context_len: columns (maximum tokens per request, including any speculative headroom).
        device: where ``req_to_token`` lives.
        enable_memory_saver: accepted for SGLang compatibility; no effect.

    Rows come from the **tail** of ``free_slots`` (SGLang 0.5.23): on a fresh pool of 6 rows
    ``alloc(2)`` returns ``[5, 6]``; ``free`` appends to the tail, so the rows freed last are
    handed out first. Row allocation accepts every SGLang convention:

    * ``alloc(reqs)``: ``reqs`` is a sequence of request objects whose row lives in
      ``req.kv.req_pool_idx`` (SGLang 0.5.23's ``ReqKvInfo``) or in ``req.req_pool_idx`` (older
      SGLang). Requests whose row is ``None`` get a fresh row (assigned to the attribute, in
      request order); requests that already own a row (a chunked prefill continuing) keep it.
      Returns every request's row, in order.
    * ``alloc(need_size)`` / ``alloc_rows(need_size)``: ``need_size`` fresh rows (ints).

    All return ``None`` without any state change when too few rows are free. ``free`` accepts a
    row id, a sequence of row ids or a request (either shape; its row is reset to ``None``);
    ``free_rows(rows)`` a sequence of row ids.

    Caller mistakes raise before anything changes: a request listed twice, two requests claiming
    the same row, a row that is not allocated (double free or never handed out), a row outside
    ``[1, size]`` (``ValueError``); objects of the wrong kind (``TypeError``).
    """

    def __init__(
        self,
        size: int,
        max_context_len: int,
        device: str | torch.device,
        enable_memory_saver: bool = False,
    ) -> None:
        self.size = checks.check_int("size", size, minimum=1)
        self.max_context_len = checks.check_int("max_context_len", max_context_len, minimum=1)
        self.device = checks.check_device_arg("device", device)
        self.enable_memory_saver = enable_memory_saver
        self.req_to_token = torch.zeros(
            (size + 1, max_context_len), dtype=torch.int32, device=self.device
        )
        self.free_slots: list[int] = []
        self._free_set: set[int] = set()
        self.req_generation = torch.zeros(size + 1, dtype=torch.int64)
        """Per-row allocation counter (CPU int64 ``[size + 1]``): ``alloc_rows`` bumps the rows
        it hands out, and it never decreases (not even on ``clear``), so a reader that stored a
        row's generation detects the row's reuse by inequality (SGLang 0.5.23)."""
        self._aux_cache: AuxCache | None = None
        self._on_alloc_rows: Callable[[list[int]], None] | None = None
        # Derived views, built here (a failed call must not be the one that builds them) and
        # rebuilt only if a caller replaces req_to_token or req_generation.
        self._rows_of: torch.Tensor | None = None
        self._rows_ptr = 0
        self._row_views: tuple[torch.Tensor, ...] = self._cache_row_views()
        self._generation_of: torch.Tensor | None = None
        self._generation_ptr = 0
        self._generation_view = memoryview(b"")
        self._generation_counts()
        self.clear()

    enable_mamba_extra_buffer_lazy: bool = False
    """SGLang: lazily allocated Mamba extra buffers (hybrid request pools only): False."""
    pre_alloc_size: int = 0
    """Extra pre-allocation headroom: 0 for a plain pool (SGLang's decode-side pool sets it)."""

    # ---------------------------------------------------------------- aux cache (SGLang 0.5.23)
    def attach_aux_cache(self, aux_cache: AuxCache) -> None:
        """Attach a per-row auxiliary cache (SGLang's sparse-attention side caches): it is then
        told of every freed row (``aux_cache.free(row)``), of ``clear`` (``aux_cache.clear()``),
        of :meth:`reset_aux_cache_allocator` and :meth:`alloc_aux_to_lengths`, and bounds
        :meth:`schedulable_token_capacity` by its ``dense_capacity``. One per pool:
        ``RuntimeError`` when one is attached already (SGLang asserts)."""
        if self._aux_cache is not None:
            raise RuntimeError("an aux cache is already attached to this ReqToTokenPool")
        for name in ("free", "clear", "reset_allocator", "alloc_to_lengths"):
            if not callable(getattr(aux_cache, name, None)):
                raise TypeError(
                    f"aux_cache must have a {name}() method, got {type(aux_cache).__name__}"
                )
        self._aux_cache = aux_cache

    def register_on_alloc_rows(self, hook: Callable[[list[int]], None]) -> None:
        """Install ``hook(rows)``, called by ``alloc_rows`` (hence ``alloc``) with the rows it
        hands out, after their generation was bumped. One hook per pool: ``RuntimeError`` when
        one is registered already; ``TypeError`` for a non-callable."""
        if not callable(hook):
            raise TypeError(f"hook must be callable, got {type(hook).__name__}")
        if self._on_alloc_rows is not None:
            raise RuntimeError("an on-alloc-rows hook is already registered")
        self._on_alloc_rows = hook

    def reset_aux_cache_allocator(self) -> None:
        """``aux_cache.reset_allocator()`` when an aux cache is attached; else nothing."""
        if self._aux_cache is not None:
            self._aux_cache.reset_allocator()

    def schedulable_token_capacity(self, physical_capacity: int) -> int:
        """Tokens the scheduler may admit: ``physical_capacity`` without an aux cache, the aux
        cache's ``dense_capacity`` with one (SGLang 0.5.23)."""
        checks.check_int("physical_capacity", physical_capacity)
        if self._aux_cache is None:
            return physical_capacity
        return int(self._aux_cache.dense_capacity)

    def alloc_aux_to_lengths(
        self, *, req_pool_indices_cpu: torch.Tensor, target_seq_lens_cpu: torch.Tensor
    ) -> None:
        """Grow the aux cache's per-row allocations to ``target_seq_lens_cpu`` tokens for rows
        ``req_pool_indices_cpu`` (SGLang's ``alloc_for_extend`` / decode call it every step). A
        no-op without an aux cache; with one, both are passed on as keywords. Either way they
        must be 1-D int32/int64 tensors of equal length (``TypeError`` / ``ValueError``)."""
        r, t = req_pool_indices_cpu, target_seq_lens_cpu
        if not (  # inline on good arguments (every step); else the checks name the argument
            type(r) is torch.Tensor
            and type(t) is torch.Tensor
            and r.dtype in checks.INDEX_DTYPES
            and t.dtype in checks.INDEX_DTYPES
            and r.dim() == 1
            and t.shape == r.shape
            and not r.is_meta
            and not t.is_meta
        ):
            rows = checks.check_index("req_pool_indices_cpu", r)
            checks.check_index("target_seq_lens_cpu", t, length=rows.numel())
        if self._aux_cache is None:
            return
        self._aux_cache.alloc_to_lengths(
            req_pool_indices_cpu=req_pool_indices_cpu, target_seq_lens_cpu=target_seq_lens_cpu
        )

    def available_size(self) -> int:
        """Number of free rows."""
        return len(self.free_slots)

    # ---------------------------------------------------------------- allocation
    @overload
    def alloc(self, reqs: int) -> list[int] | None: ...

    @overload
    def alloc(self, reqs: Sequence[AnyReq]) -> list[int] | None: ...

    def alloc(self, reqs: int | Sequence[AnyReq]) -> list[int] | None:
        """Hand out rows (see the class docstring); ``None`` when too few rows are free."""
        if isinstance(reqs, int):  # a bool is an int to Python: check_int rejects it
            return self.alloc_rows(checks.check_int("reqs", reqs, minimum=0))
        if isinstance(reqs, (str, bytes)) or not isinstance(reqs, Sequence):
            raise TypeError(
                f"reqs must be an int or a sequence of requests, got {type(reqs).__name__}"
            )
        holders = [_row_holder(req, f"reqs[{i}]") for i, req in enumerate(reqs)]
        if len({id(req) for req in reqs}) != len(holders):
            _raise_listed_twice(reqs)
        owner: dict[int, int] = {}
        need = 0
        for i, holder in enumerate(holders):
            idx = holder.req_pool_idx
            if idx is None:
                need += 1
                continue
            checks.check_int(f"reqs[{i}].req_pool_idx", idx)
            if not 1 <= idx <= self.size or idx in self._free_set:
                raise ValueError(
                    f"reqs[{i}].req_pool_idx must be None or an allocated row in [1, {self.size}],"
                    f" got {idx}"
                )
            other = owner.setdefault(idx, i)
            if other != i:
                raise ValueError(
                    f"reqs[{other}] and reqs[{i}] must not own the same row, both have "
                    f"req_pool_idx {idx}"
                )
        fresh = self.alloc_rows(need)
        if fresh is None:
            return None
        rows = iter(fresh)
        out: list[int] = []
        for holder in holders:
            if holder.req_pool_idx is None:
                holder.req_pool_idx = next(rows)
            out.append(int(holder.req_pool_idx))
        return out

    def alloc_rows(self, need_size: int) -> list[int] | None:
        """``need_size`` fresh rows from the tail of ``free_slots`` (SGLang 0.5.23's name), or
        ``None`` with no state change when fewer are free."""
        need = checks.check_int("need_size", need_size, minimum=0)
        if need > len(self.free_slots):
            return None
        if need == 0:
            return []
        taken = self.free_slots[-need:]
        del self.free_slots[-need:]
        self._free_set.difference_update(taken)
        counts = self._generation_counts()
        if counts is None:
            self.req_generation[taken] += 1
        else:
            for row in taken:
                counts[row] += 1
        if self._on_alloc_rows is not None:
            self._on_alloc_rows(taken)
        return taken

    def _generation_counts(self) -> memoryview | None:
        """A view of ``req_generation``'s memory as Python ints (a CPU int64 tensor, cached
        while it is the same tensor at the same address with the same length): bumping a few
        rows through it costs well under a microsecond, where ``req_generation[rows] += 1``
        costs two indexing ops. ``None`` when ``req_generation`` was replaced by a tensor that is
        not CPU int64 contiguous."""
        gen = self.req_generation
        view = self._generation_view
        if (
            self._generation_of is not gen
            or gen.data_ptr() != self._generation_ptr
            or gen.numel() != len(view)
        ):  # replaced, or its storage swapped or resized in place (set_, resize_)
            if gen.device.type != "cpu" or gen.dtype != torch.int64 or not gen.is_contiguous():
                return None
            words = (ctypes.c_int64 * gen.numel()).from_address(gen.data_ptr())
            view = self._generation_view = memoryview(words).cast("B").cast("q")
            self._generation_of = gen  # keeps the tensor (and so the memory) alive
            self._generation_ptr = gen.data_ptr()
        return view

    # ---------------------------------------------------------------- release
    def free(self, req: int | Sequence[int] | AnyReq) -> None:
        """Return rows to the tail of the free list (see the class docstring)."""
        kv = getattr(req, "kv", None)
        if kv is not None and type(getattr(kv, "req_pool_idx", None)) is int:
            self._release([kv.req_pool_idx], "req")  # SGLang 0.5.23's request
            kv.req_pool_idx = None
            return
        holder: ReqLike | ReqKvInfoLike | None = None
        if isinstance(req, int):  # a bool is an int to Python: check_int rejects it
            rows: list[int] = [checks.check_int("req", req)]
        elif isinstance(req, (str, bytes)):
            raise TypeError(
                f"req must be an int, a sequence of ints or a request, got {type(req).__name__}"
            )
        elif isinstance(req, Sequence):
            rows = list(req)
        else:
            try:
                holder = _row_holder(req, "req")
            except TypeError:
                raise TypeError(
                    f"req must be an int, a sequence of ints or a request, got {type(req).__name__}"
                ) from None
            if holder.req_pool_idx is None:
                raise ValueError("req.req_pool_idx must be an allocated row, got None")
            rows = [holder.req_pool_idx]
        self._release(rows, "req")
        if holder is not None:
            holder.req_pool_idx = None

    def free_rows(self, indices: Sequence[int]) -> None:
        """Return rows ``indices`` to the tail of the free list (SGLang 0.5.23's name)."""
        if isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence):
            raise TypeError(f"indices must be a sequence of ints, got {type(indices).__name__}")
        self._release(list(indices), "indices")

    def _release(self, rows: list[int], name: str) -> None:
        if len(rows) == 1:  # one row (a request's): the checks below, inline
            row = rows[0]
            if type(row) is int and 1 <= row <= self.size and row not in self._free_set:
                if self._aux_cache is not None:
                    self._aux_cache.free(row)
                self.free_slots.append(row)
                self._free_set.add(row)
                return
        for i, r in enumerate(rows):
            checks.check_int(f"{name}[{i}]", r)
            if not 1 <= r <= self.size:
                raise ValueError(f"{name} rows must lie in [1, {self.size}], got {r}")
            if r in self._free_set:
                raise ValueError(f"{name} row {r} is not allocated (double free)")
        if len(set(rows)) != len(rows):
            raise ValueError(f"{name} must not repeat a row, got {rows}")
        if self._aux_cache is not None:
            for r in rows:
                self._aux_cache.free(r)
        self.free_slots.extend(rows)
        self._free_set.update(rows)

    # ---------------------------------------------------------------- table
    def write(self, indices: _Index, values: torch.Tensor | int) -> None:
        """``req_to_token[indices] = values`` (plain tensor indexing; values cast to int32).

        ``indices``: ints, slices, ``None``/``...``, lists or int/bool tensors (or a tuple of
        them); ``values``: an int or an integer tensor. Anything else (a float, a bool, a float
        tensor) raises ``TypeError``. Values that do not fit int32 raise ``ValueError`` (ints
        always; tensors when their values are free to read, on the CPU, or in debug mode); so do
        indices outside the table (ints always; tensors and lists when the table is on the CPU,
        and in debug mode). Nothing is written then: SGLang's plain assignment writes the
        entries before the first index outside the table, then raises (README, deviations).

        Cost: SGLang's two forms take an inline path. ``(row, slice)`` (the prefill) writes
        through a cached view of the row; ``(rows, cols)`` tensors (the decode) pay one gather
        of the addressed entries on the CPU, which is the bounds check. int64 values on the CPU
        pay one ``aminmax`` (the int32 range check).
        """
        table = self.req_to_token
        if type(indices) is tuple and type(values) is torch.Tensor and len(indices) == 2:
            first, second = indices
            if type(first) is int and type(second) is slice:  # the prefill form: (row, columns)
                dtype = values.dtype
                cached = self._rows_of is table and table.data_ptr() == self._rows_ptr
                n = len(self._row_views) if cached else table.shape[0]
                if (
                    (dtype is torch.int32 or dtype is torch.int64)
                    and -n <= first < n
                    and not values.is_meta
                ):
                    if dtype is torch.int64:
                        _check_fits_int32(values)
                    rows = self._row_views if cached else self._cache_row_views()
                    rows[first][second] = values
                    return
            elif (
                type(first) is torch.Tensor
                and type(second) is torch.Tensor
                and first.dtype in _SLOT_VALUES
                and second.dtype in _SLOT_VALUES
                and values.dtype in _SLOT_VALUES
                and not (first.is_meta or second.is_meta or values.is_meta)
            ):  # the decode form: (rows, columns) tensors
                if values.dtype is torch.int64:  # index_put needs the table's dtype
                    _check_fits_int32(values)
                    values = values.to(torch.int32)
                self._store_checked(table, indices, values)
                return
        parts: tuple[object, ...] = indices if isinstance(indices, tuple) else (indices,)
        self._store_checked(table, indices, _check_write(parts, values))

    def _store_checked(
        self, table: torch.Tensor, indices: _Index, values: torch.Tensor | int
    ) -> None:
        """``table[indices] = values``, failing before anything is written: on the CPU a
        gather of the addressed entries runs first and raises on an index outside the table
        (torch's assignment raises only after writing the entries before it); on a device,
        debug mode checks the integer tensor parts (one synchronisation each)."""
        try:
            if table.is_cpu:
                table[indices]  # the bounds check: a read raises before anything is written
            elif checks.debug_enabled():
                _check_device_index_bounds(table, indices)
            table[indices] = values
        except IndexError as exc:
            raise ValueError(
                f"indices must address req_to_token of shape {tuple(table.shape)}: {exc}"
            ) from None

    def _cache_row_views(self) -> tuple[torch.Tensor, ...]:
        """One view per table row, cached while ``req_to_token`` is the same tensor at the same
        address (the row check above compares the table's length)."""
        self._row_views = self.req_to_token.unbind(0)
        self._rows_of = self.req_to_token
        self._rows_ptr = self.req_to_token.data_ptr()
        return self._row_views

    def clear(self) -> None:
        """Free every row (the table contents and ``req_generation`` are left as they are);
        an attached aux cache is cleared too."""
        self.free_slots = list(range(1, self.size + 1))
        self._free_set = set(self.free_slots)
        if self._aux_cache is not None:
            self._aux_cache.clear()
