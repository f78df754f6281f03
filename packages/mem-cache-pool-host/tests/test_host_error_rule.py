"""The exception rule of ``mem_cache_kernels.checks``, tested for this package (issue 15).

A caller's mistake raises ``TypeError`` when the argument is the wrong *kind* of thing (a bool or
a float for an int, a list for a tensor, a string for a number) or an index tensor of the wrong
*dtype*, and ``ValueError`` for a wrong value (range, shape, length, alignment, device); either
way the message names the argument.

Table-driven: one row per (owner, method, mistake). ``test_every_public_class_and_method_has_a_row``
fails when a class of ``mem_cache_pool_host.__all__`` (or a host pool class of a public module)
or one of its public methods that take arguments has no row and no reasoned exemption, so a new
class or method has to join the table.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import mem_cache_pool_host
from mem_cache_pool import MHATokenToKVPool, MLATokenToKVPool
from mem_cache_pool.deepseek_v4 import DeepSeekV4SingleKVPool
from mem_cache_pool_host import (
    HostKVCache,
    HostSlotAllocator,
    HostTensorAllocator,
    LayerDoneCounter,
    MHATokenToKVPoolHost,
    MLATokenToKVPoolHost,
    MmapHostTensorAllocator,
    PageFormat,
    convert_flat_page,
    default_host_tensor_allocator,
    plan_host_capacity,
    preflight_host_memory,
    resolve_buffer_desc,
)
from mem_cache_pool_host.deepseek_v4 import DeepSeekV4SingleKVPoolHost

T, V = TypeError, ValueError


@dataclass(frozen=True)
class Row:
    owner: str  # class name, or "" for a module-level function
    method: str  # "__init__" for the constructor
    arg: str  # the argument the message must name
    error: type[Exception]
    call: Callable[[], object]
    what: str

    @property
    def id(self) -> str:
        return f"{self.owner or 'fn'}.{self.method}:{self.arg}:{self.what}"


# ----------------------------------------------------------------------------- subjects
def _mha_device() -> MHATokenToKVPool:
    return MHATokenToKVPool(16, 4, torch.float16, 2, 8, 2, "cpu")  # 2 layers, page 4


def _mla_device() -> MLATokenToKVPool:
    return MLATokenToKVPool(16, 4, torch.float16, 8, 4, 2, "cpu")


def _deepseek_v4_device() -> DeepSeekV4SingleKVPool:
    return DeepSeekV4SingleKVPool(16, 4, torch.float8_e4m3fn, 448, 64, 2, "cpu")


# class -> (device pool factory, positional constructor (SGLang signature) or keyword-only)
POOLS: dict[type[HostKVCache], tuple[Callable[[], Any], bool]] = {
    HostKVCache: (_mha_device, True),
    MHATokenToKVPoolHost: (_mha_device, True),
    MLATokenToKVPoolHost: (_mla_device, True),
    DeepSeekV4SingleKVPoolHost: (_deepseek_v4_device, False),
}


def _host(cls: type[HostKVCache], **kw: Any) -> Any:
    make_device, _ = POOLS[cls]
    return cls(make_device(), **{"pin_memory": False, **kw})


def _ctor(cls: type[HostKVCache], **kw: Any) -> Callable[[], object]:
    return lambda: _host(cls, **kw)


def _on(cls: type[HostKVCache], method: str, *args: Any, **kw: Any) -> Callable[[], object]:
    """Call ``method`` on a fresh host pool; a ``"DEV"`` argument is its device pool."""

    def call() -> object:
        host = _host(cls)
        dev = host._device_source
        real = [dev if a == "DEV" else a for a in args]
        return getattr(host, method)(*real, **kw)

    return call


def _idx(*values: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _pool_rows(cls: type[HostKVCache]) -> list[Row]:
    """The rows every host pool class shares (constructor and the inherited main methods)."""
    n = cls.__name__
    ps = 1 if cls is DeepSeekV4SingleKVPoolHost else 4
    size = _host(cls).size
    page = list(range(ps))
    f64 = torch.float64
    rows = [
        Row(n, "__init__", "device_pool" if cls is DeepSeekV4SingleKVPoolHost else "buffer_info",
            T, lambda: cls([1, 2]), "list"),  # type: ignore[arg-type]
        Row(n, "__init__", "host_to_device_ratio", T, _ctor(cls, host_to_device_ratio="2"), "str"),
        Row(n, "__init__", "host_to_device_ratio", T, _ctor(cls, host_to_device_ratio=True),
            "bool"),
        Row(n, "__init__", "host_to_device_ratio", V, _ctor(cls, host_to_device_ratio=0.0), "zero"),
        Row(n, "__init__", "host_size_bytes", T, _ctor(cls, host_size_bytes=1.5), "float"),
        Row(n, "__init__", "host_size_bytes", V, _ctor(cls, host_size_bytes=-1), "negative"),
        Row(n, "__init__", "layout", T, _ctor(cls, layout=1), "int"),
        Row(n, "__init__", "layout", V, _ctor(cls, layout="rows_first"), "unknown"),
        Row(n, "__init__", "io_backend", T, _ctor(cls, io_backend=1), "int"),
        Row(n, "__init__", "io_backend", V, _ctor(cls, io_backend="dma"), "unknown"),
        Row(n, "__init__", "pin_memory", T, _ctor(cls, pin_memory=1), "int"),
        Row(n, "__init__", "reserve_bytes", T, _ctor(cls, reserve_bytes=True), "bool"),
        Row(n, "__init__", "reserve_bytes", V, _ctor(cls, reserve_bytes=-1), "negative"),
        Row(n, "__init__", "allocator", T, _ctor(cls, allocator=object()), "object"),
        # slots
        Row(n, "alloc", "need_size", T, _on(cls, "alloc", float(ps)), "float"),
        Row(n, "alloc", "need_size", T, _on(cls, "alloc", True), "bool"),
        Row(n, "alloc", "need_size", V, _on(cls, "alloc", -ps), "negative"),
        Row(n, "free", "indices", T, _on(cls, "free", page), "list"),
        Row(n, "free", "indices", T, _on(cls, "free", torch.tensor(page, dtype=f64)), "float"),
        Row(n, "free", "indices", V, _on(cls, "free", torch.tensor([page])), "2-D"),
        Row(n, "free", "indices", V, _on(cls, "free", _idx(*range(size, size + ps))), "range"),
        Row(n, "page_ids", "indices", T, _on(cls, "page_ids", page), "list"),
        Row(n, "page_ids", "indices", V, _on(cls, "page_ids", _idx(*range(size, size + ps))),
            "range"),
        Row(n, "is_allocated", "indices", T, _on(cls, "is_allocated", page), "list"),
        Row(n, "is_allocated", "indices", V, _on(cls, "is_allocated", _idx(size)[:0][None]),
            "2-D"),
        # transfers (SGLang's *_physical entry points share the checks)
        Row(n, "backup_from_device_all_layer_physical", "host_indices", T,
            _on(cls, "backup_from_device_all_layer_physical", "DEV", [0], _idx(0), "kernel"),
            "list"),
        Row(n, "load_to_device_per_layer_physical", "layer_id", T,
            _on(cls, "load_to_device_per_layer_physical", "DEV", _idx(0), _idx(0), 0.5, "kernel"),
            "float"),
        Row(n, "load_to_device_per_layer", "is_draft", T,
            _on(cls, "load_to_device_per_layer", "DEV", _idx(0), _idx(0), 0, is_draft=1), "int"),
        Row(n, "get_page_buffer_element_size", "split_factor", T,
            _on(cls, "get_page_buffer_element_size", 1.0), "float"),
        Row(n, "get_page_buffer_element_size", "split_factor", V,
            _on(cls, "get_page_buffer_element_size", 0), "zero"),
        Row(n, "backup_from_device_all_layer", "device_pool", T,
            _on(cls, "backup_from_device_all_layer", object(), _idx(0), _idx(0)), "object"),
        Row(n, "backup_from_device_all_layer", "host_indices", T,
            _on(cls, "backup_from_device_all_layer", "DEV", [0], _idx(0)), "list"),
        Row(n, "backup_from_device_all_layer", "host_indices", T,
            _on(cls, "backup_from_device_all_layer", "DEV", _idx(0, dtype=f64), _idx(0)),
            "float"),
        Row(n, "backup_from_device_all_layer", "device_indices", T,
            _on(cls, "backup_from_device_all_layer", "DEV", _idx(0), _idx(0, dtype=torch.int16)),
            "int16"),
        Row(n, "backup_from_device_all_layer", "host_indices", V,
            _on(cls, "backup_from_device_all_layer", "DEV", _idx(0, 1)[None], _idx(0, 1)), "2-D"),
        Row(n, "backup_from_device_all_layer", "device_indices", V,
            _on(cls, "backup_from_device_all_layer", "DEV", _idx(0, 1), _idx(0)), "length"),
        Row(n, "backup_from_device_all_layer", "host_indices", V,
            _on(cls, "backup_from_device_all_layer", "DEV", _idx(size), _idx(0)), "range"),
        Row(n, "backup_from_device_all_layer", "io_backend", T,
            _on(cls, "backup_from_device_all_layer", "DEV", _idx(0), _idx(0), 1), "int"),
        Row(n, "backup_from_device_all_layer", "io_backend", V,
            _on(cls, "backup_from_device_all_layer", "DEV", _idx(0), _idx(0), "dma"), "unknown"),
        Row(n, "load_to_device_per_layer", "layer_id", T,
            _on(cls, "load_to_device_per_layer", "DEV", _idx(0), _idx(0), 1.0), "float"),
        Row(n, "load_to_device_per_layer", "layer_id", T,
            _on(cls, "load_to_device_per_layer", "DEV", _idx(0), _idx(0), True), "bool"),
        Row(n, "load_to_device_per_layer", "layer_id", V,
            _on(cls, "load_to_device_per_layer", "DEV", _idx(0), _idx(0), 2, is_draft=True),
            "draft range"),
        Row(n, "load_to_device_per_layer", "host_indices", T,
            _on(cls, "load_to_device_per_layer", "DEV", [0], _idx(0), 0), "list"),
        Row(n, "load_to_device_per_layer", "device_indices", T,
            _on(cls, "load_to_device_per_layer", "DEV", _idx(0), _idx(0, dtype=f64), 0), "float"),
        Row(n, "load_to_device_per_layer", "device_indices", V,
            _on(cls, "load_to_device_per_layer", "DEV", _idx(0), _idx(10**6), 0), "range"),
        # storage pages
        Row(n, "get_data_page", "index", T, _on(cls, "get_data_page", 0.0), "float"),
        Row(n, "get_data_page", "index", T, _on(cls, "get_data_page", True), "bool"),
        Row(n, "get_data_page", "index", V, _on(cls, "get_data_page", size), "range"),
        Row(n, "set_from_flat_data_page", "index", T,
            _on(cls, "set_from_flat_data_page", "0", torch.zeros(1)), "str"),
        Row(n, "set_from_flat_data_page", "data_page", T,
            _on(cls, "set_from_flat_data_page", 0, [0.0]), "list"),
        Row(n, "set_from_flat_data_page", "data_page", T,
            lambda: (h := _host(cls)).set_from_flat_data_page(
                0, torch.zeros(h.page_numel, dtype=f64)), "dtype"),
        Row(n, "set_from_flat_data_page", "data_page", V,
            lambda: (h := _host(cls)).set_from_flat_data_page(
                0, h.get_dummy_flat_data_page()[1:]), "numel"),
        Row(n, "get_page_buffer_meta", "indices", T, _on(cls, "get_page_buffer_meta", "0"), "str"),
        Row(n, "get_page_buffer_meta", "indices", T,
            _on(cls, "get_page_buffer_meta", [True] * ps), "bools"),
        Row(n, "get_page_buffer_meta", "indices", T,
            _on(cls, "get_page_buffer_meta", torch.tensor(page, dtype=f64)), "float"),
        Row(n, "get_page_buffer_meta", "indices", V,
            _on(cls, "get_page_buffer_meta", list(range(size, size + ps))), "range"),
        Row(n, "is_stride_page_aligned", "page_size_bytes", T,
            _on(cls, "is_stride_page_aligned", 4096.0), "float"),
        Row(n, "is_stride_page_aligned", "page_size_bytes", V,
            _on(cls, "is_stride_page_aligned", 0), "zero"),
    ]
    if POOLS[cls][1]:  # the SGLang positional constructor also takes page_size and device
        rows += [
            Row(n, "__init__", "page_size", T, _ctor(cls, page_size=4.0), "float"),
            Row(n, "__init__", "page_size", T, _ctor(cls, page_size=True), "bool"),
            Row(n, "__init__", "page_size", V, _ctor(cls, page_size=8), "mismatch"),
            Row(n, "__init__", "device", T, _ctor(cls, device=0), "int"),
            Row(n, "__init__", "device", V, _ctor(cls, device="meta"), "not cpu"),
            Row(n, "__init__", "device", V, _ctor(cls, device="no-such-device"), "unknown"),
        ]
    if ps > 1:
        rows += [
            Row(n, "alloc", "need_size", V, _on(cls, "alloc", ps + 1), "partial page"),
            Row(n, "get_data_page", "index", V, _on(cls, "get_data_page", 1), "unaligned"),
            Row(n, "get_page_buffer_meta", "indices", V,
                _on(cls, "get_page_buffer_meta", list(range(1, ps + 1))), "unaligned"),
        ]
    return rows


def _tables(dtype: torch.dtype = torch.int64) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((3, 16), -1, dtype=dtype), torch.zeros(3, dtype=dtype)


def _hisparse_rows(cls: type[HostKVCache]) -> list[Row]:
    n = cls.__name__
    table, length = _tables()
    rows = [
        Row(n, "alloc_page", "num_pages", T, _on(cls, "alloc_page", 1.0), "float"),
        Row(n, "alloc_page", "num_pages", V, _on(cls, "alloc_page", -1), "negative"),
    ]
    for method, extra in (
        ("alloc_paged_token_slots", (0, 4)),
        ("free_paged_token_slots", ()),
    ):
        rows += [
            Row(n, method, "req_to_host_pool", T, _on(cls, method, [[0]], length, 0, *extra),
                "list"),
            Row(n, method, "req_to_host_pool", T,
                _on(cls, method, table.int(), length, 0, *extra), "int32"),
            Row(n, method, "req_to_host_pool", V, _on(cls, method, table[0], length, 0, *extra),
                "1-D"),
            Row(n, method, "req_to_host_pool_allocated_len", T,
                _on(cls, method, table, length.float(), 0, *extra), "float"),
            Row(n, method, "req_to_host_pool_allocated_len", V,
                _on(cls, method, table, length[:2], 0, *extra), "rows"),
            Row(n, method, "req_pool_idx", T, _on(cls, method, table, length, 0.0, *extra),
                "float"),
            Row(n, method, "req_pool_idx", T, _on(cls, method, table, length, True, *extra),
                "bool"),
            Row(n, method, "req_pool_idx", V, _on(cls, method, table, length, 3, *extra), "range"),
        ]
    m = "allocated_host_indices"  # SGLang's order: (req_to_host_pool, req_pool_idx, allocated_len)
    rows += [
        Row(n, m, "req_to_host_pool", T, _on(cls, m, [[0]], 0, 4), "list"),
        Row(n, m, "req_to_host_pool", V, _on(cls, m, table[0], 0, 4), "1-D"),
        Row(n, m, "req_pool_idx", T, _on(cls, m, table, 0.0, 4), "float"),
        Row(n, m, "req_pool_idx", V, _on(cls, m, table, 3, 4), "range"),
        Row(n, m, "allocated_len", T, _on(cls, m, table, 0, 4.0), "float"),
        Row(n, m, "allocated_len", T, _on(cls, m, table, 0, torch.tensor(4.0)), "float tensor"),
        Row(n, m, "allocated_len", V, _on(cls, m, table, 0, -1), "negative"),
    ]
    rows += [
        Row(n, "alloc_paged_token_slots", "start_pos", T,
            _on(cls, "alloc_paged_token_slots", table, length, 0, 0.0, 4), "float"),
        Row(n, "alloc_paged_token_slots", "start_pos", V,
            _on(cls, "alloc_paged_token_slots", table, length, 0, -1, 4), "negative"),
        Row(n, "alloc_paged_token_slots", "num_tokens", T,
            _on(cls, "alloc_paged_token_slots", table, length, 0, 0, True), "bool"),
        Row(n, "alloc_paged_token_slots", "num_tokens", V,
            _on(cls, "alloc_paged_token_slots", table, length, 0, 0, -1), "negative"),
    ]
    return rows


def _deepseek_v4_rows() -> list[Row]:
    cls = DeepSeekV4SingleKVPoolHost
    n = cls.__name__
    rows: list[Row] = []
    for method, extra in (
        ("backup_pages", ()),
        ("load_pages_per_layer", (0,)),
        ("backup_tokens_from_device_all_layer", ()),
        ("load_tokens_to_device_per_layer", (0,)),
    ):
        rows += [
            Row(n, method, "device_pool", T, _on(cls, method, object(), _idx(0), _idx(0), *extra),
                "object"),
            Row(n, method, "host_indices", T, _on(cls, method, "DEV", [0], _idx(0), *extra),
                "list"),
            Row(n, method, "device_indices", T,
                _on(cls, method, "DEV", _idx(0), _idx(0, dtype=torch.float32), *extra), "float"),
            Row(n, method, "host_indices", V,
                _on(cls, method, "DEV", _idx(0, 1)[None], _idx(0, 1), *extra), "2-D"),
            Row(n, method, "device_indices", V,
                _on(cls, method, "DEV", _idx(0, 1), _idx(0), *extra), "length"),
            Row(n, method, "host_indices", V,
                _on(cls, method, "DEV", _idx(10**6), _idx(0), *extra), "range"),
        ]
        if extra:
            rows += [
                Row(n, method, "layer_id", T, _on(cls, method, "DEV", _idx(0), _idx(0), 0.0),
                    "float"),
                Row(n, method, "layer_id", T, _on(cls, method, "DEV", _idx(0), _idx(0), False),
                    "bool"),
                Row(n, method, "layer_id", V, _on(cls, method, "DEV", _idx(0), _idx(0), 2),
                    "range"),
            ]
    rows.append(
        Row(n, "__init__", "device_pool", T, lambda: cls(_mla_device()), "other pool")  # type: ignore[arg-type]
    )
    return rows


def _fmt() -> PageFormat:
    return PageFormat.make(
        order="layer_major", roles=("kv",), layer_num=2, page_size=4, row_shapes=((1, 12),),
        store_dtype=torch.float16,
    )


def _make_fmt(**kw: Any) -> Callable[[], object]:
    args: dict[str, Any] = {
        "order": "layer_major", "roles": ("kv",), "layer_num": 2, "page_size": 4,
        "row_shapes": ((1, 12),), "store_dtype": torch.float16,
    }
    return lambda: PageFormat.make(**{**args, **kw})


def _other_rows() -> list[Row]:
    s, c, p, m = "HostSlotAllocator", "LayerDoneCounter", "PageFormat", "MmapHostTensorAllocator"
    slots = lambda: HostSlotAllocator(4, 2)  # noqa: E731
    counter = lambda: LayerDoneCounter(2)  # noqa: E731
    page = torch.zeros(_fmt().page_numel, dtype=torch.float16)
    return [
        Row(s, "__init__", "num_pages", T, lambda: HostSlotAllocator(4.0, 2), "float"),  # type: ignore[arg-type]
        Row(s, "__init__", "num_pages", V, lambda: HostSlotAllocator(0, 2), "zero"),
        Row(s, "__init__", "page_size", T, lambda: HostSlotAllocator(4, True), "bool"),
        Row(s, "__init__", "page_size", V, lambda: HostSlotAllocator(4, 0), "zero"),
        Row(s, "alloc", "need_size", T, lambda: slots().alloc(2.0), "float"),  # type: ignore[arg-type]
        Row(s, "alloc", "need_size", V, lambda: slots().alloc(3), "partial page"),
        Row(s, "free", "indices", T, lambda: slots().free([0, 1]), "list"),  # type: ignore[arg-type]
        Row(s, "free", "indices", T, lambda: slots().free(_idx(0, 1, dtype=torch.int16)), "int16"),
        Row(s, "free", "indices", V, lambda: slots().free(_idx(0, 1)), "not allocated"),
        Row(s, "is_allocated", "indices", T, lambda: slots().is_allocated((0, 1)), "tuple"),  # type: ignore[arg-type]
        Row(s, "is_allocated", "indices", V, lambda: slots().is_allocated(_idx(1, 2)), "unaligned"),
        Row(s, "pages_of", "indices", T, lambda: slots().pages_of(_idx(0, 1).float()), "float"),
        Row(s, "pages_of", "indices", V, lambda: slots().pages_of(_idx(0)), "partial page"),
        Row(s, "page_ids", "indices", T, lambda: slots().page_ids(_idx(0, 1).float()), "float"),
        Row(s, "page_ids", "indices", V, lambda: slots().page_ids(_idx(0)), "partial page"),
        Row(s, "page_ids", "indices", V, lambda: slots().page_ids(_idx(2, 3, 0, 1, 2, 3)),
            "page twice"),
        Row(c, "__init__", "num_layers", T, lambda: LayerDoneCounter(2.0), "float"),  # type: ignore[arg-type]
        Row(c, "__init__", "num_layers", V, lambda: LayerDoneCounter(0), "zero"),
        Row(c, "__init__", "history", T, lambda: LayerDoneCounter(2, True), "bool"),
        Row(c, "__init__", "history", V, lambda: LayerDoneCounter(2, 0), "zero"),
        Row(c, "complete", "layer_index", T, lambda: counter().complete(1.0), "float"),  # type: ignore[arg-type]
        Row(c, "complete", "layer_index", V, lambda: counter().complete(2), "range"),
        Row(c, "is_done", "layer_index", T, lambda: counter().is_done(True), "bool"),
        Row(c, "is_done", "layer_index", V, lambda: counter().is_done(-1), "negative"),
        Row(c, "wait_until", "layer_index", T, lambda: counter().wait_until("0"), "str"),  # type: ignore[arg-type]
        Row(c, "wait_until", "layer_index", V, lambda: counter().wait_until(2), "range"),
        Row(c, "set_consumer", "batch_id", T, lambda: counter().set_consumer(True), "bool"),
        Row(c, "set_consumer", "batch_id", V, lambda: counter().set_consumer(0), "zero"),
        Row(c, "abort", "exc", T, lambda: counter().abort("failed"), "str"),  # type: ignore[arg-type]
        Row(p, "make", "order", T, _make_fmt(order=0), "int"),
        Row(p, "make", "order", V, _make_fmt(order="row_major"), "unknown"),
        Row(p, "make", "roles", T, _make_fmt(roles=["kv"]), "list"),
        Row(p, "make", "roles", V, _make_fmt(roles=("k", "v")), "length"),
        Row(p, "make", "row_shapes", T, _make_fmt(row_shapes=((1.0, 12),)), "float dim"),
        Row(p, "make", "row_shapes", V, _make_fmt(row_shapes=((0, 12),)), "zero dim"),
        Row(p, "make", "layer_num", T, _make_fmt(layer_num=True), "bool"),
        Row(p, "make", "layer_num", V, _make_fmt(layer_num=0), "zero"),
        Row(p, "make", "page_size", T, _make_fmt(page_size=4.0), "float"),
        Row(p, "make", "page_size", V, _make_fmt(page_size=0), "zero"),
        Row(p, "make", "store_dtype", T, _make_fmt(store_dtype="float16"), "str"),
        Row(p, "role_shape", "role", T, lambda: _fmt().role_shape(True), "bool"),
        Row(p, "role_shape", "role", V, lambda: _fmt().role_shape(1), "range"),
        Row(p, "from_tag", "tag", T, lambda: PageFormat.from_tag(1), "int"),  # type: ignore[arg-type]
        Row(p, "from_tag", "tag", V, lambda: PageFormat.from_tag("mem-cache-kv-page/1 x"),
            "malformed"),
        Row(m, "__init__", "register_chunk_bytes", T,
            lambda: MmapHostTensorAllocator(register=False, register_chunk_bytes=1.5), "float"),  # type: ignore[arg-type]
        Row(m, "__init__", "register_chunk_bytes", V,
            lambda: MmapHostTensorAllocator(register=False, register_chunk_bytes=0), "zero"),
        Row(m, "__init__", "huge_pages", V,
            lambda: MmapHostTensorAllocator(huge_pages="giant"), "unknown"),  # type: ignore[arg-type]
        Row(m, "__init__", "register", V, lambda: MmapHostTensorAllocator(register="x"), "str"),  # type: ignore[arg-type]
        Row("HostTensorAllocator", "allocate", "dims", T,
            lambda: HostTensorAllocator().allocate("4"), "str"),  # type: ignore[arg-type]
        Row("HostTensorAllocator", "allocate", "dims", V,
            lambda: HostTensorAllocator().allocate((2, -3)), "negative"),
        Row(m, "allocate_bytes", "nbytes", T,
            lambda: MmapHostTensorAllocator(register=False).allocate_bytes(True), "bool"),
        Row(m, "allocate_bytes", "nbytes", V,
            lambda: MmapHostTensorAllocator(register=False).allocate_bytes(0), "zero"),
        Row(m, "allocate", "dims", T,
            lambda: MmapHostTensorAllocator(register=False).allocate(4), "int"),  # type: ignore[arg-type]
        Row(m, "allocate", "dims", T,
            lambda: MmapHostTensorAllocator(register=False).allocate((4.0,)), "float"),  # type: ignore[arg-type]
        Row(m, "allocate", "dims", V,
            lambda: MmapHostTensorAllocator(register=False).allocate((-1,)), "negative"),
        Row(m, "allocate", "dtype", T,
            lambda: MmapHostTensorAllocator(register=False).allocate((4,), 1), "int"),  # type: ignore[arg-type]
        Row(m, "allocate", "device", V,
            lambda: MmapHostTensorAllocator(register=False).allocate((4,), device="cuda"), "cuda"),
        # functions of __all__
        Row("", "plan_host_capacity", "page_size", T,
            lambda: plan_host_capacity(device_size=16, bytes_per_token=8, page_size=4.0), "float"),  # type: ignore[arg-type]
        Row("", "plan_host_capacity", "device_size", T,
            lambda: plan_host_capacity(device_size=True, bytes_per_token=8, page_size=4), "bool"),
        Row("", "plan_host_capacity", "bytes_per_token", V,
            lambda: plan_host_capacity(device_size=16, bytes_per_token=0, page_size=4), "zero"),
        Row("", "plan_host_capacity", "host_to_device_ratio", T,
            lambda: plan_host_capacity(
                device_size=16, bytes_per_token=8, page_size=4, host_to_device_ratio=None), "None"),  # type: ignore[arg-type]
        Row("", "preflight_host_memory", "requested_bytes", T,
            lambda: preflight_host_memory(1.0), "float"),  # type: ignore[arg-type]
        Row("", "preflight_host_memory", "reserve_bytes", T,
            lambda: preflight_host_memory(1, reserve_bytes=False), "bool"),
        Row("", "preflight_host_memory", "available", T,
            lambda: preflight_host_memory(1, available=1e9), "float"),  # type: ignore[arg-type]
        Row("", "preflight_host_memory", "reserve_bytes", V,
            lambda: preflight_host_memory(1, reserve_bytes=-1), "negative"),
        Row("", "default_host_tensor_allocator", "pin_memory", T,
            lambda: default_host_tensor_allocator(1), "int"),  # type: ignore[arg-type]
        Row("", "resolve_buffer_desc", "device_pool", T, lambda: resolve_buffer_desc([]), "list"),  # type: ignore[arg-type]
        Row("", "convert_flat_page", "page", T, lambda: convert_flat_page([0], _fmt(), _fmt()),
            "list"),  # type: ignore[arg-type]
        Row("", "convert_flat_page", "dst", T, lambda: convert_flat_page(page, _fmt(), "x"), "str"),  # type: ignore[arg-type]
        Row("", "convert_flat_page", "page", T,
            lambda: convert_flat_page(page.double(), _fmt(), _fmt()), "dtype"),
        Row("", "convert_flat_page", "page", V,
            lambda: convert_flat_page(page[1:], _fmt(), _fmt()), "numel"),
    ]


def _mamba_rows() -> list[Row]:
    from mem_cache_pool import HybridReqToTokenPool, Mamba2CacheParams, Mamba2StateShape
    from mem_cache_pool_host import MambaPoolHost

    shape = Mamba2StateShape(conv=[(4, 3)], temporal=(2, 2, 2), conv_kernel=4)
    rows = HybridReqToTokenPool(
        size=4, mamba_size=6, mamba_spec_state_size=4, max_context_len=8, device="cpu",
        enable_memory_saver=False, cache_params=Mamba2CacheParams(shape=shape, layers=[0, 2]),
        mamba_layer_ids=[0, 2], enable_mamba_extra_buffer=True)
    h = MambaPoolHost(rows.mamba_pool, 1.0, 0, device_capacity=4, pin_memory=False)
    n = "MambaPoolHost"
    return [
        Row(n, "alloc", "need_size", T, lambda: h.alloc("2"), "str"),  # type: ignore[arg-type]
        Row(n, "alloc", "need_size", V, lambda: h.alloc(-1), "negative"),
        Row(n, "free", "indices", T, lambda: h.free([1]), "list"),  # type: ignore[arg-type]
        Row(n, "is_allocated", "indices", T, lambda: h.is_allocated([1]), "list"),  # type: ignore[arg-type]
        Row(n, "get_data_page", "index", T, lambda: h.get_data_page("0"), "str"),  # type: ignore[arg-type]
        Row(n, "get_data_page", "index", V, lambda: h.get_data_page(10**6), "out of range"),
        Row(n, "set_from_flat_data_page", "data_page", T,
            lambda: h.set_from_flat_data_page(0, [1]), "list"),  # type: ignore[arg-type]
        Row(n, "backup_from_device_all_layer", "host_indices", T,
            lambda: h.backup_from_device_all_layer(None, [1], [1]), "list"),  # type: ignore[arg-type]
        Row(n, "load_to_device_per_layer", "host_indices", T,
            lambda: h.load_to_device_per_layer(None, [1], [1], 0), "list"),  # type: ignore[arg-type]
        Row(n, "get_page_buffer_meta", "indices", V,
            lambda: h.get_page_buffer_meta(torch.tensor([1])), "not allocated"),
        *_mamba_ctor_rows(rows.mamba_pool),
        *_mamba_physical_rows(
            MambaPoolHost(rows.mamba_pool, 1.0, 0, device_capacity=4, pin_memory=False)),
    ]


def _mamba_ctor_rows(pool: Any) -> list[Row]:
    from mem_cache_pool_host import MambaPoolHost

    def make(**changes: object) -> Callable[[], object]:
        args: dict[str, Any] = dict(buffer_info=pool, host_to_device_ratio=1.0, host_size=0,
                                    device_capacity=4, pin_memory=False)
        args.update(changes)
        return lambda: MambaPoolHost(args.pop("buffer_info"), args.pop("host_to_device_ratio"),
                                     args.pop("host_size"), **args)

    n, i = "MambaPoolHost", "__init__"
    return [
        Row(n, i, "buffer_info", T, make(buffer_info=[1]), "list"),
        Row(n, i, "host_to_device_ratio", T, make(host_to_device_ratio="1"), "str"),
        Row(n, i, "host_to_device_ratio", T, make(host_to_device_ratio=True), "bool"),
        Row(n, i, "host_to_device_ratio", V, make(host_to_device_ratio=-1.0), "negative"),
        Row(n, i, "host_to_device_ratio", V, make(host_to_device_ratio=float("nan")), "nan"),
        Row(n, i, "host_size", T, make(host_size="1"), "str"),
        Row(n, i, "host_size", V, make(host_size=float("inf")), "inf"),
        Row(n, i, "device_capacity", T, make(device_capacity=1.5), "float"),
        Row(n, i, "device_capacity", V, make(device_capacity=-1), "negative"),
        Row(n, i, "pin_memory", T, make(pin_memory="no"), "str"),
        Row(n, i, "device", T, make(device=3), "int"),
        Row(n, i, "device", V, make(device="meta"), "not cpu"),
        Row(n, i, "layout", V, make(layout="layer_first"), "unknown"),
        Row(n, i, "allocator_type", V, make(allocator_type="mmap"), "unknown"),
    ]


def _mamba_physical_rows(h: Any) -> list[Row]:
    """The physical transfers, the storage element size and the alignment probe (a host pool of
    its own, slots 0 and 1 allocated; the device pool has 7 state slots)."""
    slots = h.alloc(2)
    dev = torch.tensor([1, 2])
    n = "MambaPoolHost"
    back, load = "backup_from_device_all_layer_physical", "load_to_device_per_layer_physical"
    return [
        Row(n, back, "device_pool", T,
            lambda: h.backup_from_device_all_layer_physical(object(), slots, dev, "kernel"),
            "object"),
        Row(n, back, "host_indices", T,
            lambda: h.backup_from_device_all_layer_physical(None, [0, 1], dev, "kernel"), "list"),
        Row(n, back, "host_indices", V,
            lambda: h.backup_from_device_all_layer_physical(None, torch.tensor([3, 4]), dev,
                                                            "kernel"), "not allocated"),
        Row(n, back, "device_indices", V,
            lambda: h.backup_from_device_all_layer_physical(None, slots, dev[:1], "kernel"),
            "shorter"),
        Row(n, back, "device_indices", V,
            lambda: h.backup_from_device_all_layer_physical(None, slots, torch.tensor([1, 99]),
                                                            "kernel"), "out of range"),
        Row(n, back, "io_backend", T,
            lambda: h.backup_from_device_all_layer_physical(None, slots, dev, 3), "int"),
        Row(n, back, "io_backend", V,
            lambda: h.backup_from_device_all_layer_physical(None, slots, dev, "fast"), "unknown"),
        Row(n, load, "layer_id", T,
            lambda: h.load_to_device_per_layer_physical(None, slots, dev, "0", "kernel"), "str"),
        Row(n, load, "layer_id", V,
            lambda: h.load_to_device_per_layer_physical(None, slots, dev, 2, "kernel"),
            "past the last"),
        Row(n, load, "host_indices", T,
            lambda: h.load_to_device_per_layer_physical(None, [0, 1], dev, 0, "kernel"), "list"),
        Row(n, load, "device_indices", V,
            lambda: h.load_to_device_per_layer_physical(None, slots, dev[:1], 0, "kernel"),
            "shorter"),
        Row(n, load, "io_backend", V,
            lambda: h.load_to_device_per_layer_physical(None, slots, dev, 0, "fast"), "unknown"),
        Row(n, "get_page_buffer_element_size", "split_factor", T,
            lambda: h.get_page_buffer_element_size("1"), "str"),
        Row(n, "get_page_buffer_element_size", "split_factor", V,
            lambda: h.get_page_buffer_element_size(0), "zero"),
        Row(n, "is_stride_page_aligned", "page_size_bytes", T,
            lambda: h.is_stride_page_aligned(4096.0), "float"),
        Row(n, "is_stride_page_aligned", "page_size_bytes", V,
            lambda: h.is_stride_page_aligned(0), "zero"),
    ]


ROWS: list[Row] = [
    *(r for cls in POOLS for r in _pool_rows(cls)),
    *_mamba_rows(),
    *_hisparse_rows(MLATokenToKVPoolHost),
    *_deepseek_v4_rows(),
    *_other_rows(),
]

# classes of __all__ without rows, with the reason
EXEMPT_CLASSES: dict[str, str] = {
    "CudaHostRegistrar": "needs CUDA (register/unregister take raw pointers from the pools)",
    "HiSparseHostPoolMixin": "a mixin: its methods are rows of MLATokenToKVPoolHost",
    "HostCapacity": "a result record built by plan_host_capacity (rows above)",
    "MmapHostAllocation": "built by MmapHostTensorAllocator.allocate_bytes (rows above)",
}
# (class, method) without rows, with the reason
EXEMPT_METHODS: dict[tuple[str, str], str] = {
    ("MambaPoolHost", "prepare_transfer_indices"): "SGLang's pass-through hook: returns its "
    "arguments (checked in test_mamba_host.py)",
    ("MambaStateBufferInfo", "__init__"): "a frozen record; MambaStateBufferInfo.from_pool builds "
    "it from a checked MambaPool",
    ("MambaStateBufferInfo", "from_pool"): "reads a MambaPool (constructed and checked by the pool "
    "package); fed hostile kinds by tests/bad_input (subject _mamba_info)",
    ("PageFormat", "__init__"): "the dataclass constructor; PageFormat.make validates",
    ("LayerDoneCounter", "complete"): "covered for layer_index; event is opaque (a CUDA event)",
    **{
        (c, "prepare_transfer_indices"): "SGLang's pass-through hook: returns its arguments"
        for c in ("HostKVCache", "MHATokenToKVPoolHost", "MLATokenToKVPoolHost",
                  "DeepSeekV4SingleKVPoolHost")
    },
    ("HostTensorAllocator", "__init__"): "takes no arguments",
    ("HostTensorAllocator", "allocate_bytes"): "abstract (NotImplementedError); see the subclass",
    ("MHATokenToKVPoolHost", "get_split_heads_page_buffer_meta"):
        "always NotImplementedError (SGLang's page_head layout only)",
}


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_mistake_raises_the_rule_type_naming_the_argument(row: Row) -> None:
    with pytest.raises(Exception) as info:  # the exact type is asserted below
        row.call()
    assert type(info.value) is row.error, f"{row.id}: {type(info.value).__name__}: {info.value}"
    assert row.arg in str(info.value), f"{row.id}: message does not name {row.arg}: {info.value}"


def _public_classes() -> dict[str, type]:
    """Classes of ``__all__`` plus every host pool class of a public module."""
    out = {n: o for n in mem_cache_pool_host.__all__ if inspect.isclass(o := getattr(
        mem_cache_pool_host, n))}
    for info in pkgutil.iter_modules(mem_cache_pool_host.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"mem_cache_pool_host.{info.name}")
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, HostKVCache):
                out.setdefault(name, obj)
    return {
        n: c for n, c in out.items()
        if not issubclass(c, BaseException) and not getattr(c, "_is_protocol", False)
    }


def _methods_with_arguments(cls: type) -> list[str]:
    names = [] if cls.__init__ is object.__init__ else ["__init__"]
    for name, fn in inspect.getmembers(cls):
        if name.startswith("_") or not callable(fn) or isinstance(fn, type):
            continue
        params = [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]
        if params:
            names.append(name)
    return names


def test_every_public_class_and_method_has_a_row() -> None:
    covered = {(r.owner, r.method) for r in ROWS}
    missing = []
    for name, cls in sorted(_public_classes().items()):
        if name in EXEMPT_CLASSES:
            continue
        for method in _methods_with_arguments(cls):
            if (name, method) not in covered and (name, method) not in EXEMPT_METHODS:
                missing.append(f"{name}.{method}")
    assert not missing, f"no error-rule row (add one to ROWS or a reasoned exemption): {missing}"
    functions = [
        n for n in mem_cache_pool_host.__all__
        if inspect.isfunction(f := getattr(mem_cache_pool_host, n))
        and inspect.signature(f).parameters
    ]
    assert sorted(f for f in functions if ("", f) not in covered) == []


def test_every_pool_row_set_has_both_error_types() -> None:
    for cls in POOLS:
        kinds = {r.error for r in ROWS if r.owner == cls.__name__ and r.method == "__init__"}
        assert kinds == {TypeError, ValueError}, cls.__name__
