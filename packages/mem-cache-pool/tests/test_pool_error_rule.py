"""The exception rule of :mod:`mem_cache_kernels.checks`, table-driven over every public pool.

For each public pool class (``mem_cache_pool`` and ``mem_cache_pool.deepseek_v4``), the table
lists the constructor and the main methods with a valid call, and the *kind* of each argument.
Each kind has hostile variants with the exception they must raise:

* a wrong Python type (a bool or a float for an int, a string, a list for a tensor, an object)
  and an index tensor of the wrong dtype (float32, bool, int16): ``TypeError``;
* a wrong value, shape, length, device (meta) or an out-of-range slot: ``ValueError``.

Every message names the argument, and a failed method call changes no tensor or scalar of the
pool. A public pool class without a row fails :func:`test_every_public_pool_has_a_row`.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import mem_cache_pool
from mem_cache_pool import (
    HybridLinearKVPool,
    HybridReqToTokenPool,
    KVCache,
    KVWriteLoc,
    Mamba2CacheParams,
    Mamba2StateShape,
    MambaPool,
    MHATokenToKVPool,
    MLATokenToKVPool,
    ReqToTokenPool,
    SWAKVPool,
)
from mem_cache_pool.deepseek_v4 import (
    CompressStatePool,
    DeepSeekV4IndexerPool,
    DeepSeekV4SingleKVPool,
    DeepSeekV4TokenToKVPool,
    HiSparseC4DevicePool,
)
from mem_cache_pool.dsa import DSATokenToKVPool
from mem_cache_pool.hisparse import HiSparseDSATokenToKVPool

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
FP8, U8 = torch.float8_e4m3fn, torch.uint8
T = TypeError
V = ValueError

# ----------------------------------------------------------------------------- kinds
Variants = dict[str, tuple[Callable[[Any], object], type[Exception]]]


def _set(v: torch.Tensor, i: int, x: int) -> torch.Tensor:
    t = v.clone()
    t[i] = x
    return t


def _ints(minimum: int | None = None) -> Variants:
    out: Variants = {
        "bool": (lambda v: True, T),
        "float": (float, T),
        "str": (str, T),
    }
    if minimum is not None:
        out["below the minimum"] = (lambda v: minimum - 1, V)
    return out


_INDEX_TYPES: Variants = {
    "list": (lambda v: v.tolist(), T),
    "float32": (lambda v: v.float(), T),
    "bool tensor": (lambda v: v.bool(), T),
    "int16": (lambda v: v.to(torch.int16), T),
    "2-D": (lambda v: v.reshape(1, -1), V),
    "meta": (lambda v: v.to("meta"), V),
    "negative": (lambda v: _set(v, 0, -1), V),
}
_SLOTS: Variants = {**_INDEX_TYPES, "out of range": (lambda v: _set(v, 0, 10**6), V)}


def _copy_map(v: Any, f: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    return {role: [f(t) for t in layers] for role, layers in v.items()}


KINDS: dict[str, Variants] = {
    "int": _ints(),
    "int>=0": _ints(0),
    "int>=1": _ints(1),
    "layer": {**_ints(), "negative": (lambda v: -1, V), "past the last": (lambda v: 99, V)},
    "slots": _SLOTS,
    "unbounded slots": _INDEX_TYPES,  # no upper limit (full slots, ring positions)
    "pair": {**_SLOTS, "shorter": (lambda v: v[:-1], V)},
    "unbounded pair": {**_INDEX_TYPES, "shorter": (lambda v: v[:-1], V)},
    "rows": {
        "list": (lambda v: [[0]], T),
        "int32": (lambda v: torch.zeros(v.shape, dtype=torch.int32), T),
        "meta": (lambda v: v.to("meta"), V),
        "wrong shape": (lambda v: torch.cat([v, v[..., :1]], dim=-1), V),
    },
    "dtype": {"str": (lambda v: "float16", T), "None": (lambda v: None, T)},
    "fp8 dtype": {"str": (lambda v: "float8_e4m3fn", T), "bfloat16": (lambda v: BF16, V)},
    "float dtype": {"str": (lambda v: "float32", T), "int32": (lambda v: torch.int32, V)},
    "optional dtype": {"str": (lambda v: "float16", T)},
    "device": {"int": (lambda v: 0, T), "unknown": (lambda v: "nodev", V)},
    "mapping": {
        "list": (lambda v: v.tolist(), T),
        "int32": (lambda v: v.to(torch.int32), T),
        "2-D": (lambda v: v.reshape(1, -1), V),
        "no sentinel": (lambda v: _set(v, -1, 0), V),
    },
    "layer ids": {
        "float": (lambda v: [float(i) for i in v], T),
        "bool": (lambda v: [True for _ in v], T),
        "an int": (lambda v: v[0], T),
        "a gap": (lambda v: [*v, 9], V),
    },
    "ratios": {
        "float": (lambda v: [float(r) for r in v], T),
        "an int": (lambda v: 4, T),
        "ratio 8": (lambda v: [8 for _ in v], V),
        "one short": (lambda v: v[:-1], V),
    },
    "scale": {"bool": (lambda v: True, T), "str": (lambda v: "1", T)},
    "copy": {
        "list": (lambda v: [], T),
        "no roles": (lambda v: {}, V),
        "float64 tensors": (lambda v: _copy_map(v, lambda t: t.to(torch.float64)), T),
        "one row short": (lambda v: _copy_map(v, lambda t: t[:-1]), V),
    },
    "write loc": {
        "list": (lambda v: [1, 2], T),
        "bare tensor": (lambda v: v.loc, V),
        "no swa_loc": (lambda v: KVWriteLoc(v.loc), V),
    },
    "waiter": {"object": (lambda v: object(), T)},
    "index head dim": {**_ints(), "not 128": (lambda v: 64, V)},
    "head dim /8": {**_ints(8), "not a multiple of 8": (lambda v: 12, V)},
    "nope dim": {**_ints(), "not 448": (lambda v: 512, V)},
    "rope dim": {**_ints(), "not 64": (lambda v: 32, V)},
    "compress ratio": {**_ints(), "not 4 or 128": (lambda v: 8, V)},
    # SGLang's fused norm + RoPE store skips slots < 0 (no KV write target): not an error
    "slots or negative": {k: f for k, f in _SLOTS.items() if k != "negative"},
    "row": {**_ints(), "not allocated": (lambda v: 99, V)},
    "row list": {
        "an int": (lambda v: v[0], T),
        "bool row": (lambda v: [True], T),
        "float row": (lambda v: [float(v[0])], T),
        "out of range": (lambda v: [99], V),
    },
    "table index": {
        "float": (lambda v: 1.5, T),
        "bool": (lambda v: True, T),
        "str": (lambda v: "a", T),
        "float tensor": (lambda v: torch.tensor([1.0]), T),
        "out of range": (lambda v: 99, V),
    },
    "table values": {
        "float": (lambda v: 1.5, T),
        "bool": (lambda v: True, T),
        "float tensor": (lambda v: v.float(), T),
        "bool tensor": (lambda v: v.bool(), T),
        "past int32": (lambda v: 2**31, V),
        "past int32 tensor": (lambda v: _set(v, 0, 2**31), V),
    },
}


# ----------------------------------------------------------------------------- the table
def _i(*v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int64)


def _zeros(*shape: int, dtype: torch.dtype = F32) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


Args = Callable[[Any], dict[str, object]]


@dataclass(frozen=True)
class Call:
    """A method, its valid keyword arguments (given the pool) and the kind of each argument."""

    method: str
    args: Args
    kinds: dict[str, str]


@dataclass(frozen=True)
class Row:
    ctor: dict[str, object]
    ctor_kinds: dict[str, str]
    calls: tuple[Call, ...]
    setup: Callable[[Any], None] = field(default=lambda pool: None)


def _kv_calls(
    tgt: torch.Tensor,
    src: torch.Tensor,
    *,
    copy: bool = True,
    layer: int = 0,
    copy_name: str = "kv_cache_cpu",
) -> tuple[Call, ...]:
    """Calls every row-per-slot pool shares: reads, moves and (optionally) CPU copies."""
    calls = [
        Call("get_key_buffer", lambda p: {"layer_id": layer}, {"layer_id": "layer"}),
        Call("register_layer_transfer_counter", lambda p: {"layer_transfer_counter": None},
             {"layer_transfer_counter": "waiter"}),
        Call(
            "move_kv_cache",
            lambda p: {"tgt_loc": tgt, "src_loc": src},
            {"tgt_loc": "slots", "src_loc": "pair"},
        ),
    ]
    if copy:
        calls += [
            Call("get_cpu_copy", lambda p: {"indices": src}, {"indices": "slots"}),
            Call(
                "load_cpu_copy",
                lambda p: {copy_name: p.get_cpu_copy(src), "indices": tgt},
                {copy_name: "copy", "indices": "slots"},
            ),
        ]
    return tuple(calls)


_GEOMETRY = {"size": "int>=0", "page_size": "int>=1", "layer_num": "int>=1", "device": "device"}
_MLA_ARGS = {"kv_lora_rank": "int>=1", "qk_rope_head_dim": "int>=1"}
_V4 = {"dtype": "fp8 dtype", "qk_nope_head_dim": "nope dim", "qk_rope_head_dim": "rope dim"}


def _mla_calls(loc: torch.Tensor) -> tuple[Call, ...]:
    return (
        Call(
            "set_kv_buffer",
            lambda p: {"layer": 0, "loc_info": loc, "cache_k": _zeros(2, 1, 12, dtype=BF16)},
            {"layer": "layer", "loc_info": "slots", "cache_k": "rows"},
        ),
        Call(
            "set_mla_kv_buffer",
            lambda p: {
                "layer": 0,
                "loc_info": loc,
                "cache_k_nope": _zeros(2, 1, 8, dtype=BF16),
                "cache_k_rope": _zeros(2, 1, 4, dtype=BF16),
            },
            {"loc_info": "slots", "cache_k_nope": "rows", "cache_k_rope": "rows"},
        ),
        Call(
            "get_mla_kv_buffer",
            lambda p: {"layer": 0, "loc": loc, "dst_dtype": None},
            {"layer": "layer", "loc": "slots", "dst_dtype": "optional dtype"},
        ),
    )


def _index_calls(loc: torch.Tensor, key_bytes: int, name: str = "loc") -> tuple[Call, ...]:
    return (
        Call(
            "set_index_k_scale_buffer",
            lambda p: {
                "layer_id": 0,
                name: loc,
                "index_k": _zeros(2, key_bytes, dtype=U8),
                "index_k_scale": _zeros(2),
            },
            {"layer_id": "layer", name: "slots", "index_k": "rows", "index_k_scale": "rows"},
        ),
    )


def _record_calls(loc: torch.Tensor) -> tuple[Call, ...]:
    return (
        Call(
            "set_key_buffer",
            lambda p: {"layer_id": 0, "loc": loc, "records": _zeros(2, 584, dtype=U8)},
            {"layer_id": "layer", "loc": "slots", "records": "rows"},
        ),
        Call(
            "set_key_buffer_parts",
            lambda p: {
                "layer_id": 0,
                "loc": loc,
                "nope_fp8": _zeros(2, 448, dtype=U8),
                "scales": _zeros(2, 7, dtype=U8),
                "rope": _zeros(2, 64, dtype=BF16),
            },
            {"loc": "slots", "nope_fp8": "rows", "scales": "rows", "rope": "rows"},
        ),
        Call(
            "set_kv_buffer",
            lambda p: {"layer": 0, "loc_info": loc, "cache_k": _zeros(2, 512)},
            {"layer": "layer", "loc_info": "slots", "cache_k": "rows"},
        ),
        Call(
            "get_key_records",
            lambda p: {"layer_id": 0, "loc": loc},
            {"layer_id": "layer", "loc": "slots"},
        ),
    )


def _mapping(length: int, targets: range, first: int) -> torch.Tensor:
    m = torch.zeros(length, dtype=torch.int64)
    m[first : first + len(targets)] = torch.tensor(list(targets))
    m[-1] = -1
    return m


def _register(mapping: torch.Tensor) -> Callable[[Any], None]:
    return lambda pool: pool.register_mapping(mapping.clone())


_SWA_MAP = _mapping(16 + 2 + 1, range(2, 10), 2)  # full slots 2..9 -> window slots 2..9
_HISPARSE_MAP = _mapping(12 + 2 + 1, range(2, 6), 2)  # logical 2..5 -> device 2..5
_C4_MAP = _mapping(11, range(2, 6), 1)  # logical compressed 1..4 -> device 2..5
_V4_MAP = _mapping(640 + 1, range(4, 8), 4)

_MAMBA_PARAMS = Mamba2CacheParams(
    shape=Mamba2StateShape(conv=[(4, 3)], temporal=(2, 2, 2), conv_kernel=4), layers=[0, 2])


class _Sibling:
    """A state registered beside a MambaPool's (SGLang's SlotState protocol), doing nothing."""

    def reset_slots(self, indices: torch.Tensor) -> None:
        pass

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        pass

    def get_cpu_slots(self, indices: torch.Tensor) -> list[object]:
        return []

    def load_cpu_slots(self, data: object, indices: torch.Tensor) -> None:
        pass

    def iter_transfer_state_entries(self) -> list[object]:
        return []


def _new_req() -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(
        kv=SimpleNamespace(req_pool_idx=None, mamba_pool_idx=None,
                           mamba_ping_pong_track_buffer=None))


def _hybrid_rows_setup(pool: Any) -> None:
    """One request holding row 4, state slot 1 and track slots 2 and 3 (``pool.held``)."""
    pool.held = _new_req()
    pool.alloc([pool.held])


_TRACK_IDX: Variants = {**_ints(0), "past 1": (lambda v: 2, V)}
KINDS.update({
    # hybrid linear-attention pools (MambaPool, HybridReqToTokenPool, HybridLinearKVPool)
    "distinct pair": {**KINDS["pair"], "repeated slot": (lambda v: v[:1].repeat(2), V)},
    "index tensor": {k: f for k, f in _INDEX_TYPES.items() if k != "negative"},
    "mamba layer": {**_ints(), "a full-attention layer": (lambda v: 1, V)},
    "full layer": {**_ints(), "a linear layer": (lambda v: 0, V)},
    "track idx": _TRACK_IDX,
    "track entry": {**_ints(), "past the end": (lambda v: 2, V)},
    "keep": {"str": (lambda v: "0", T), "past the end": (lambda v: 2, V)},
    "slot or -1": {"str": (lambda v: "-1", T), "not -1": (lambda v: 5, V)},
    "request": {"object": (lambda v: object(), T), "int": (lambda v: 4, T)},
    "requests": {
        "an int": (lambda v: 1, T),
        "str": (lambda v: "r", T),
        "a non-request": (lambda v: [object()], T),
    },
    "slot state": {"object": (lambda v: object(), T)},
    "mamba copy": {
        "str": (lambda v: "ab", T),
        "one part": (lambda v: v[:1], V),
        "float64 temporal": (lambda v: (v[0], v[1].double()), T),
        "one slot short": (lambda v: ([c[:, :1] for c in v[0]], v[1][:, :1]), V),
    },
    "hybrid copy": {"list": (list, T), "three parts": (lambda v: (*v, None), V)},
})

ROWS: dict[type, Row] = {
    MHATokenToKVPool: Row(
        ctor=dict(
            size=32,
            page_size=4,
            dtype=F16,
            head_num=2,
            head_dim=8,
            layer_num=2,
            device="cpu",
            v_head_dim=8,
            start_layer=0,
        ),
        ctor_kinds={
            **_GEOMETRY,
            "dtype": "dtype",
            "head_num": "int>=1",
            "head_dim": "int>=1",
            "v_head_dim": "int>=1",
            "start_layer": "int>=0",
        },
        calls=(
            Call(
                "set_kv_buffer",
                lambda p: {
                    "layer": 1,
                    "loc_info": _i(4, 5),
                    "cache_k": _zeros(2, 2, 8),
                    "cache_v": _zeros(2, 2, 8),
                    "k_scale": None,
                    "v_scale": None,
                },
                {
                    "layer": "layer",
                    "loc_info": "slots",
                    "cache_k": "rows",
                    "cache_v": "rows",
                    "k_scale": "scale",
                    "v_scale": "scale",
                },
            ),
            Call("get_kv_buffer", lambda p: {"layer_id": 1}, {"layer_id": "layer"}),
            Call("get_value_buffer", lambda p: {"layer_id": 1}, {"layer_id": "layer"}),
            *_kv_calls(_i(8, 9), _i(4, 5)),
        ),
    ),
    MLATokenToKVPool: Row(
        ctor=dict(
            size=32,
            page_size=4,
            dtype=BF16,
            kv_lora_rank=8,
            qk_rope_head_dim=4,
            layer_num=2,
            device="cpu",
        ),
        ctor_kinds={**_GEOMETRY, **_MLA_ARGS, "dtype": "dtype"},
        calls=(*_mla_calls(_i(4, 5)), *_kv_calls(_i(8, 9), _i(4, 5))),
    ),
    SWAKVPool: Row(
        ctor=dict(
            size=16,
            size_swa=8,
            page_size=2,
            dtype=F16,
            head_num=1,
            head_dim=4,
            swa_attention_layer_ids=[1],
            full_attention_layer_ids=[0],
            device="cpu",
        ),
        ctor_kinds={
            "size": "int>=0",
            "size_swa": "int>=0",
            "page_size": "int>=1",
            "dtype": "dtype",
            "head_num": "int>=1",
            "head_dim": "int>=1",
            "swa_attention_layer_ids": "layer ids",
            "full_attention_layer_ids": "layer ids",
            "device": "device",
        },
        setup=_register(_SWA_MAP),
        calls=(
            Call(
                "set_kv_buffer",
                lambda p: {
                    "layer": 0,
                    "loc_info": _i(4, 5),
                    "cache_k": _zeros(2, 1, 4),
                    "cache_v": _zeros(2, 1, 4),
                },
                {"layer": "layer", "loc_info": "slots", "cache_k": "rows", "cache_v": "rows"},
            ),
            Call(  # a window layer writes at KVWriteLoc.swa_loc
                "set_kv_buffer",
                lambda p: {
                    "layer": 1,
                    "loc_info": KVWriteLoc(_i(4, 5), swa_loc=_i(4, 5)),
                    "cache_k": _zeros(2, 1, 4),
                    "cache_v": _zeros(2, 1, 4),
                },
                {"loc_info": "write loc"},
            ),
            Call(
                "register_mapping", lambda p: {"full_to_swa_index_mapping": _SWA_MAP.clone()},
                {"full_to_swa_index_mapping": "mapping"}
            ),
            Call(
                "translate_loc_from_full_to_swa",
                lambda p: {"kv_indices": _i(4, 5)},
                {"kv_indices": "slots"},
            ),
            *_kv_calls(_i(8, 9), _i(4, 5), layer=1),
        ),
    ),
    DSATokenToKVPool: Row(
        ctor=dict(
            size=8,
            page_size=4,
            dtype=BF16,
            kv_lora_rank=8,
            qk_rope_head_dim=4,
            layer_num=1,
            device="cpu",
            index_head_dim=128,
            index_buf_size=8,
        ),
        ctor_kinds={
            **_GEOMETRY,
            **_MLA_ARGS,
            "dtype": "dtype",
            "index_head_dim": "index head dim",
            "index_buf_size": "int>=0",
        },
        calls=(
            *_mla_calls(_i(4, 5)),
            *_index_calls(_i(4, 5), 128),
            Call("get_index_k", lambda p: {"layer_id": 0, "loc": _i(4, 5)}, {"loc": "slots"}),
            Call(
                "get_index_k_scale_continuous",
                lambda p: {"layer_id": 0, "seq_len": 4, "page_indices": _i(1)},
                {"layer_id": "layer", "seq_len": "int>=0", "page_indices": "slots"},
            ),
            *_kv_calls(_i(8, 9), _i(4, 5), copy_name="kv_cache_cpu_dict"),
        ),
    ),
    HiSparseDSATokenToKVPool: Row(
        ctor=dict(
            size=4,
            page_size=2,
            dtype=F16,
            kv_lora_rank=8,
            qk_rope_head_dim=4,
            layer_num=1,
            device="cpu",
            index_buf_size=12,
        ),
        ctor_kinds={**_GEOMETRY, **_MLA_ARGS, "dtype": "dtype", "index_buf_size": "int>=0"},
        setup=_register(_HISPARSE_MAP),
        calls=(
            Call(
                "register_mapping",
                lambda p: {"full_to_hisparse_device_index_mapping": _HISPARSE_MAP.clone()},
                {"full_to_hisparse_device_index_mapping": "mapping"},
            ),
            *_mla_calls(_i(2, 3)),
            *_index_calls(_i(8, 9), 128),
            Call("translate_loc_to_device", lambda p: {"loc": _i(2, 3)}, {"loc": "slots"}),
            Call(
                "transfer_values_on_device",
                lambda p: {"dst_indices": _i(4, 5), "src_indices": _i(2, 3)},
                {"dst_indices": "slots", "src_indices": "pair"},
            ),
            *_kv_calls(_i(8, 9), _i(2, 3), copy=False),
        ),
    ),
    DeepSeekV4SingleKVPool: Row(
        ctor=dict(
            size=8,
            page_size=4,
            dtype=FP8,
            qk_nope_head_dim=448,
            qk_rope_head_dim=64,
            layer_num=1,
            device="cpu",
        ),
        ctor_kinds={**_GEOMETRY, **_V4},
        calls=(
            *_record_calls(_i(4, 5)),
            Call("page_ids", lambda p: {"loc": _i(4, 5)}, {"loc": "slots"}),
            *_kv_calls(_i(8, 9), _i(4, 5)),
        ),
    ),
    HiSparseC4DevicePool: Row(
        ctor=dict(
            size=8,
            page_size=2,
            dtype=FP8,
            qk_nope_head_dim=448,
            qk_rope_head_dim=64,
            layer_num=1,
            device="cpu",
        ),
        ctor_kinds={**_GEOMETRY, **_V4},
        setup=_register(_C4_MAP),
        calls=(
            Call(
                "register_mapping", lambda p: {"mapping": _C4_MAP.clone()}, {"mapping": "mapping"}
            ),
            *_record_calls(_i(1, 2)),
            Call(
                "transfer_values_on_device",
                lambda p: {"dst_loc": _i(6, 7), "src_loc": _i(2, 3)},
                {"dst_loc": "slots", "src_loc": "pair"},
            ),
            Call(
                "translate_loc_from_full_to_compressed",
                lambda p: {"full_loc": _i(3, 7)},
                {"full_loc": "unbounded slots"},
            ),
            *_kv_calls(_i(6, 7), _i(2, 3)),
        ),
    ),
    DeepSeekV4IndexerPool: Row(
        ctor=dict(size=8, page_size=4, dtype=FP8, index_head_dim=16, layer_num=2, device="cpu"),
        ctor_kinds={**_GEOMETRY, "dtype": "fp8 dtype", "index_head_dim": "head dim /8"},
        calls=(
            *_index_calls(_i(4, 5), 16),
            Call(
                "get_index_k_scale_buffer",
                lambda p: {"layer_id": 1, "loc": _i(4, 5)},
                {"layer_id": "layer", "loc": "slots"},
            ),
            *_kv_calls(_i(8, 9), _i(4, 5)),
        ),
    ),
    CompressStatePool: Row(
        ctor=dict(size=3, ring_size=8, state_dim=4, layer_num=2, device="cpu", dtype=F32),
        ctor_kinds={
            "size": "int>=0",
            "ring_size": "int>=1",
            "state_dim": "int>=1",
            "layer_num": "int>=1",
            "device": "device",
            "dtype": "float dtype",
        },
        calls=(
            Call(
                "set_state",
                lambda p: {
                    "layer_index": 1,
                    "req_pool_indices": _i(1, 2),
                    "positions": _i(0, 9),
                    "kv_state": _zeros(2, 4),
                    "score_state": _zeros(2, 4),
                },
                {
                    "layer_index": "layer",
                    "req_pool_indices": "slots",
                    "positions": "unbounded pair",
                    "kv_state": "rows",
                    "score_state": "rows",
                },
            ),
            Call(
                "get_state",
                lambda p: {"layer_index": 1, "req_pool_indices": _i(1, 2), "positions": _i(0, 9)},
                {
                    "layer_index": "layer",
                    "req_pool_indices": "slots",
                    "positions": "unbounded pair",
                },
            ),
            Call("clear", lambda p: {"req_pool_indices": _i(1, 2)}, {"req_pool_indices": "slots"}),
        ),
    ),
    DeepSeekV4TokenToKVPool: Row(
        ctor=dict(
            max_num_reqs=2,
            swa_size=256,
            c4_size=64,
            c128_size=4,
            c4_state_pool_size=2,
            c128_state_pool_size=2,
            page_size=128,
            swa_page_size=4,
            dtype=FP8,
            c4_state_dtype=F32,
            c128_state_dtype=F32,
            qk_nope_head_dim=448,
            qk_rope_head_dim=64,
            indexer_head_dim=16,
            layer_num=3,
            device="cpu",
            enable_memory_saver=False,
            compression_ratios=[0, 4, 128],
            state_dim=8,
        ),
        ctor_kinds={
            "max_num_reqs": "int>=0",
            "swa_size": "int>=0",
            "c4_size": "int>=0",
            "c128_size": "int>=0",
            "c4_state_pool_size": "int>=0",
            "c128_state_pool_size": "int>=0",
            "page_size": "int>=1",
            "swa_page_size": "int>=1",
            **_V4,
            "c4_state_dtype": "float dtype",
            "c128_state_dtype": "float dtype",
            "indexer_head_dim": "head dim /8",
            "layer_num": "int>=1",
            "device": "device",
            "compression_ratios": "ratios",
            "state_dim": "int>=1",
        },
        setup=_register(_V4_MAP),
        calls=(
            Call(
                "set_kv_buffer",
                lambda p: {
                    "layer": 0,
                    "loc": KVWriteLoc(_i(4, 5), swa_loc=_i(4, 5)),
                    "cache_k": _zeros(2, 512),
                },
                {"layer": "layer", "loc": "write loc", "cache_k": "rows"},
            ),
            Call(
                "set_swa_key_buffer",
                lambda p: {
                    "layer_id": 0,
                    "loc": _i(4, 5),
                    "cache_nope_fp8_rope_bf16_pack": _zeros(2, 584, dtype=U8),
                },
                {"layer_id": "layer", "loc": "slots", "cache_nope_fp8_rope_bf16_pack": "rows"},
            ),
            Call(
                "set_compressed_key_buffer",
                lambda p: {
                    "layer_id": 1,
                    "compressed_loc": _i(4, 5),
                    "records": _zeros(2, 584, dtype=U8),
                },
                {"layer_id": "layer", "compressed_loc": "slots", "records": "rows"},
            ),
            *(
                Call(c.method, lambda p, c=c: {**c.args(p), "layer_id": 1}, c.kinds)
                for c in _index_calls(_i(4, 5), 16)
            ),
            Call(
                "register_mapping", lambda p: {"full_to_swa_index_mapping": _V4_MAP.clone()},
                {"full_to_swa_index_mapping": "mapping"}
            ),
            Call(
                "translate_loc_from_full_to_swa",
                lambda p: {"kv_indices": _i(4, 5)},
                {"kv_indices": "slots"},
            ),
            Call(
                "translate_loc_from_full_to_compressed",
                lambda p: {"full_loc": _i(3, 7), "compress_ratio": 4},
                {"full_loc": "unbounded slots", "compress_ratio": "compress ratio"},
            ),
            Call(
                "set_swa_key_buffer_radix_fused_norm_rope",
                lambda p: {
                    "layer_id": 0,
                    "swa_loc": _i(4, -1),
                    "kv": torch.ones(2, 512),
                    "kv_weight": torch.ones(512),
                    "eps": 1e-6,
                    "freqs_cis": torch.ones(8, 32, dtype=torch.complex64),
                    "positions": _i(0, 7),
                    "q": torch.ones(2, 1, 512),
                },
                {
                    "layer_id": "layer",
                    "swa_loc": "slots or negative",
                    "kv": "rows",
                    "kv_weight": "rows",
                    "eps": "scale",
                    "freqs_cis": "rows",
                    "positions": "pair",
                    "q": "rows",
                },
            ),
            Call("get_compress_ratio", lambda p: {"layer_id": 2}, {"layer_id": "layer"}),
            Call("get_compressed_key_buffer", lambda p: {"layer_id": 1}, {"layer_id": "layer"}),
            Call("get_key_buffer", lambda p: {"layer_id": 1}, {"layer_id": "layer"}),
        ),
    ),
    ReqToTokenPool: Row(
        ctor=dict(size=4, max_context_len=16, device="cpu"),
        ctor_kinds={"size": "int>=1", "max_context_len": "int>=1", "device": "device"},
        setup=lambda pool: pool.alloc(2),  # rows 3 and 4 are allocated
        calls=(
            Call("alloc", lambda p: {"reqs": 1}, {"reqs": "int>=0"}),
            Call("alloc_rows", lambda p: {"need_size": 1}, {"need_size": "int>=0"}),
            Call("free", lambda p: {"req": 4}, {"req": "row"}),
            Call("free_rows", lambda p: {"indices": [4]}, {"indices": "row list"}),
            Call(
                "write",
                lambda p: {"indices": (1, slice(0, 2)), "values": _i(5, 6)},
                {"indices": "table index", "values": "table values"},
            ),
        ),
    ),
    # Hybrid linear-attention pools: every public method that takes arguments (the getters
    # without arguments and SGLang's NotImplementedError features excepted); the valid calls'
    # effects are checked in tests/bad_input/test_hybrid_valid_calls.py.
    MambaPool: Row(
        ctor=dict(size=6, spec_state_size=4, cache_params=_MAMBA_PARAMS, mamba_layer_ids=[0, 2],
                  device="cpu"),
        ctor_kinds={"size": "int>=0", "spec_state_size": "int>=0", "device": "device"},
        calls=(
            Call("clear_slots", lambda p: {"indices": _i(1, 2)}, {"indices": "slots"}),
            Call(
                "copy_from",
                lambda p: {"src_indices": _i(1, 2), "dst_indices": _i(3, 4)},
                {"src_indices": "slots", "dst_indices": "distinct pair"},
            ),
            Call("get_cpu_copy", lambda p: {"indices": _i(1, 2)}, {"indices": "slots"}),
            Call(
                "load_cpu_copy",
                lambda p: {"mamba_cache_cpu": p.get_cpu_copy(_i(1, 2)), "indices": _i(3, 4)},
                {"mamba_cache_cpu": "mamba copy", "indices": "slots"},
            ),
            Call("mamba2_layer_cache", lambda p: {"layer_id": 1}, {"layer_id": "layer"}),
            Call("register_slot_state", lambda p: {"state": _Sibling()},
                 {"state": "slot state"}),
        ),
    ),
    HybridReqToTokenPool: Row(
        ctor=dict(size=4, mamba_size=6, mamba_spec_state_size=4, max_context_len=8,
                  device="cpu", enable_memory_saver=False, cache_params=_MAMBA_PARAMS,
                  mamba_layer_ids=[0, 2], enable_mamba_extra_buffer=True),
        ctor_kinds={"size": "int>=1", "mamba_size": "int>=0", "max_context_len": "int>=1",
                    "device": "device"},
        setup=_hybrid_rows_setup,
        calls=(
            Call("alloc", lambda p: {"reqs": [_new_req()]}, {"reqs": "requests"}),
            Call("get_mamba_indices", lambda p: {"req_indices": _i(4)}, {"req_indices": "slots"}),
            Call("translate_mamba_indices", lambda p: {"mamba_indices": _i(1)},
                 {"mamba_indices": "index tensor"}),
            Call("mamba2_layer_index", lambda p: {"layer_id": 2}, {"layer_id": "mamba layer"}),
            Call("mamba2_layer_cache", lambda p: {"layer_id": 0}, {"layer_id": "mamba layer"}),
            Call(
                "copy_mamba_state",
                lambda p: {"src_index": _i(1), "dst_index": _i(5)},
                {"src_index": "slots", "dst_index": "distinct pair"},
            ),
            Call("get_mamba_ping_pong_other_idx", lambda p: {"mamba_next_track_idx": 0},
                 {"mamba_next_track_idx": "track idx"}),
            Call("get_mamba_ping_pong_keep_idx", lambda p: {"req": p.held}, {"req": "request"}),
            Call(
                "set_mamba_ping_pong_slot",
                lambda p: {"req": p.held, "idx": 1, "value": -1},
                {"req": "request", "idx": "track entry", "value": "slot or -1"},
            ),
            Call(
                "donate_mamba_ping_pong_slot",
                lambda p: {"req": p.held, "new_slot": _i(5)},
                {"req": "request", "new_slot": "index tensor"},
            ),
            Call(
                "free_mamba_cache",
                lambda p: {"req": p.held, "mamba_ping_pong_track_buffer_to_keep": None},
                {"req": "request", "mamba_ping_pong_track_buffer_to_keep": "keep"},
            ),
            Call("register_layer_transfer_counter", lambda p: {"layer_transfer_counter": None},
                 {"layer_transfer_counter": "waiter"}),
            Call(
                "clone_with_new_mamba",
                lambda p: dict(mamba_size=4, mamba_spec_state_size=2,
                               cache_params=_MAMBA_PARAMS, device="cpu",
                               enable_mamba_extra_buffer=True, draft_model_idx=0),
                {"mamba_size": "int>=0", "mamba_spec_state_size": "int>=0", "device": "device",
                 "draft_model_idx": "int>=0"},
            ),
        ),
    ),
    HybridLinearKVPool: Row(
        ctor=dict(size=16, dtype=F16, page_size=4, head_num=2, head_dim=4,
                  full_attention_layer_ids=[1], device="cpu",
                  mamba_pool=MambaPool(size=6, spec_state_size=4, cache_params=_MAMBA_PARAMS,
                                       mamba_layer_ids=[0, 2], device="cpu")),
        ctor_kinds={"dtype": "dtype", "page_size": "int>=1", "head_num": "int>=1",
                    "head_dim": "int>=1", "device": "device"},
        calls=(
            Call("get_key_buffer", lambda p: {"layer_id": 1}, {"layer_id": "full layer"}),
            Call("get_value_buffer", lambda p: {"layer_id": 1}, {"layer_id": "full layer"}),
            Call("get_kv_buffer", lambda p: {"layer_id": 1}, {"layer_id": "full layer"}),
            Call("layer_index", lambda p: {"layer_id": 1}, {"layer_id": "full layer"}),
            Call(
                "set_kv_buffer",
                lambda p: {
                    "layer": 1,
                    "loc_info": _i(4, 5),
                    "cache_k": _zeros(2, 2, 4),
                    "cache_v": _zeros(2, 2, 4),
                },
                {"layer": "full layer", "loc_info": "slots", "cache_k": "rows",
                 "cache_v": "rows"},
            ),
            Call(
                "move_kv_cache",
                lambda p: {"tgt_loc": _i(8, 9), "src_loc": _i(4, 5)},
                {"tgt_loc": "slots", "src_loc": "pair"},
            ),
            Call(
                "get_cpu_copy",
                lambda p: {"indices": _i(4, 5), "mamba_indices": _i(1, 2)},
                {"indices": "slots", "mamba_indices": "slots"},
            ),
            Call(
                "load_cpu_copy",
                lambda p: {
                    "cache_cpu": p.get_cpu_copy(_i(4, 5), _i(1, 2)),
                    "indices": _i(8, 9),
                    "mamba_indices": _i(3, 4),
                },
                {"cache_cpu": "hybrid copy", "indices": "slots", "mamba_indices": "slots"},
            ),
            Call("register_layer_transfer_counter", lambda p: {"layer_transfer_counter": None},
                 {"layer_transfer_counter": "waiter"}),
        ),
    ),
}


# ----------------------------------------------------------------------------- coverage
def _public_pools() -> set[type]:
    names = set(mem_cache_pool.__all__) | set(dir(mem_cache_pool))
    out = set()
    for name in names:
        obj = getattr(mem_cache_pool, name, None)
        if (
            isinstance(obj, type)
            and not inspect.isabstract(obj)
            and (issubclass(obj, KVCache) or name.endswith("Pool"))
        ):
            out.add(obj)
    return out


def test_every_public_pool_has_a_row() -> None:
    pools = _public_pools()
    assert pools >= {MHATokenToKVPool, DeepSeekV4TokenToKVPool, ReqToTokenPool}
    missing = sorted(c.__name__ for c in pools - set(ROWS))
    assert not missing, f"public pool classes without a row in ROWS: {missing}"


def test_every_row_names_real_arguments() -> None:
    """A typo in the table would make a case test nothing."""
    for cls, row in ROWS.items():
        params = inspect.signature(cls).parameters
        assert set(row.ctor_kinds) <= set(row.ctor) <= set(params), cls.__name__
        pool = _build(cls)
        for call in row.calls:
            method = getattr(pool, call.method)
            params = inspect.signature(method).parameters
            assert set(call.kinds) <= set(call.args(pool)) <= set(params), (cls, call.method)
            assert all(kind in KINDS for kind in call.kinds.values()), call.method
        assert all(kind in KINDS for kind in row.ctor_kinds.values()), cls.__name__


def _answer_problem(fn: Callable[..., Any], result: object) -> str | None:
    """Whether ``result`` is what ``fn``'s return annotation promises: None for ``-> None``,
    an answer otherwise (for ``X | None`` too: None is the shortage answer, and a valid base
    call is one that works), a tensor for ``-> torch.Tensor``. None when it is."""
    annotation = inspect.signature(fn).return_annotation
    if annotation is inspect.Signature.empty:
        return "has no return annotation to check the answer against"
    text = annotation if isinstance(annotation, str) else getattr(
        annotation, "__name__", str(annotation))
    if text in ("None", "NoneType"):
        return None if result is None else f"returned {type(result).__name__}, not None"
    if result is None:
        return f"returned None (annotated {text})"
    if text in ("torch.Tensor", "Tensor") and not isinstance(result, torch.Tensor):
        return f"returned {type(result).__name__}, not a tensor"
    return None


def test_every_valid_call_succeeds() -> None:
    """The base of every case is a call that works: the variants change one argument only."""
    wrong = []
    for cls, row in ROWS.items():
        for call in row.calls:
            pool = _build(cls)
            method = getattr(pool, call.method)
            problem = _answer_problem(method, method(**call.args(pool)))
            if problem is not None:
                wrong.append(f"{cls.__name__}.{call.method} {problem}")
    assert not wrong, f"valid calls that did not answer as annotated: {wrong}"


# ----------------------------------------------------------------------------- cases
def _build(cls: type) -> Any:
    row = ROWS[cls]
    pool = cls(**row.ctor)
    row.setup(pool)
    return pool


def _cases() -> list[Any]:
    out = []
    for cls, row in ROWS.items():
        for arg, kind in row.ctor_kinds.items():
            for variant in KINDS[kind]:
                out.append(
                    pytest.param(cls, -1, arg, variant, id=f"{cls.__name__}({arg}={variant})")
                )
        for i, call in enumerate(row.calls):
            for arg, kind in call.kinds.items():
                for variant in KINDS[kind]:
                    case_id = f"{cls.__name__}.{call.method}#{i}({arg}={variant})"
                    out.append(pytest.param(cls, i, arg, variant, id=case_id))
    return out


def _state(obj: object, depth: int = 6) -> list[object]:
    """Every tensor (cloned) and scalar reachable from ``obj`` (a few levels deep)."""
    out: list[object] = []

    def walk(x: object, d: int) -> None:
        if isinstance(x, torch.Tensor):
            out.append(x.clone())
        elif x is None or isinstance(x, (bool, int, float, str)):
            out.append(x)
        elif d > 0:
            if isinstance(x, dict):
                for k in sorted(x, key=str):
                    walk(x[k], d - 1)
            elif isinstance(x, (list, tuple)):
                for y in x:
                    walk(y, d - 1)
            elif hasattr(x, "__dict__"):
                walk(vars(x), d - 1)

    walk(obj, depth)
    return out


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)  # bitwise: fp8, NaN and -0 included


def _same(a: list[object], b: list[object]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(_bytes(x), _bytes(y)):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize(("cls", "index", "arg", "variant"), _cases())
def test_wrong_type_is_type_error_wrong_value_is_value_error(
    cls: type, index: int, arg: str, variant: str
) -> None:
    row = ROWS[cls]
    if index < 0:
        kind, valid = row.ctor_kinds[arg], row.ctor
        make, expected = KINDS[kind][variant]
        with pytest.raises((TypeError, ValueError)) as info:
            cls(**{**valid, arg: make(valid[arg])})
        pool = None
    else:
        pool = _build(cls)
        call = row.calls[index]
        valid = call.args(pool)
        make, expected = KINDS[call.kinds[arg]][variant]
        bad = make(valid[arg])
        before = _state(pool)
        with pytest.raises((TypeError, ValueError)) as info:
            getattr(pool, call.method)(**{**valid, arg: bad})
    message = str(info.value)
    assert type(info.value) is expected, (
        f"{type(info.value).__name__} ({message}), not {expected.__name__}"
    )
    assert re.search(rf"\b{re.escape(arg)}\b", message), f"{message!r} does not name {arg}"
    if pool is not None:
        assert _same(before, _state(pool)), "a failed call changed the pool"
