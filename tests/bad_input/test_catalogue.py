"""Argument-precise hostile inputs for the calls an engine makes on its hot path.

Each builder returns a valid call; every argument is then replaced, one at a time, by each
hostile value of its kind (``_catalogue.VARIANTS``: wrong dtype float/bool/int16, meta device,
wrong rank, a list instead of a tensor, negative / out-of-range / duplicate indices, wrong row
shapes, bad ints). The call must raise ``TypeError`` or ``ValueError`` whose message names *that*
argument, and nothing may change: the object's state and every tensor argument are compared
bit-exact before and after. The valid call itself must succeed (so a builder cannot rot into a
call that fails for another reason). Kernel ops run on both backends (Triton under
``TRITON_INTERPRET=1``), which must answer with the same exception type and message.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import mem_cache_kernels as mk
from mem_cache_kernels import deepseek_v4
from tests.bad_input._catalogue import VARIANTS
from tests.bad_input._subjects import OWNERS, same_state, snapshot
from tests.bad_input._xfail import XFAIL

I64 = torch.int64
F16 = torch.float16


def _i(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=I64)


@dataclass
class Call:
    fn: Callable[..., Any]
    args: dict[str, Any]
    kinds: dict[str, str]
    owner: Any = None
    backends: bool = False  # a kernel op: run on both backends
    extra_state: list[Any] = field(default_factory=list)


# ----------------------------------------------------------------------- kernel ops
def _store() -> Call:
    return Call(
        mk.store_kv,
        {"k_cache": torch.zeros(8, 2, 4), "v_cache": torch.zeros(8, 2, 4), "loc": _i(1, 2),
         "k": torch.ones(2, 2, 4), "v": torch.ones(2, 2, 4)},
        {"loc": "pair_idx", "k": "data", "v": "data"},
        backends=True,
    )  # fmt: skip


def _set_mla() -> Call:
    return Call(
        mk.set_mla_kv_buffer,
        {"kv_buffer": torch.zeros(8, 1, 6), "loc": _i(1, 3), "k_nope": torch.ones(2, 1, 4),
         "k_rope": torch.ones(2, 1, 2)},
        {"loc": "idx", "k_nope": "data", "k_rope": "data"},
        backends=True,
    )  # fmt: skip


def _get_mla() -> Call:
    return Call(
        mk.get_mla_kv_buffer,
        {"kv_buffer": torch.zeros(8, 1, 6), "loc": _i(1, 3), "nope_dim": 4},
        {"loc": "idx", "nope_dim": "count"},
        backends=True,
    )


def _copy_all() -> Call:
    return Call(
        mk.copy_all_layer_kv_cache,
        {"buffers": [torch.zeros(8, 4), torch.zeros(8, 4)], "tgt_loc": _i(1, 2),
         "src_loc": _i(3, 4)},
        {"buffers": "buffers", "tgt_loc": "idx", "src_loc": "pair_idx"},
        backends=True,
    )  # fmt: skip


def _transfer() -> Call:
    return Call(
        mk.transfer_rows,
        {"src": [torch.ones(8, 4)], "dst": [torch.zeros(8, 4)], "src_indices": _i(1, 2),
         "dst_indices": _i(3, 4)},
        {"src": "buffers", "dst": "buffers", "src_indices": "idx", "dst_indices": "pair_idx"},
        backends=True,
    )  # fmt: skip


def _transfer_all() -> Call:
    return Call(
        mk.transfer_rows_all_layers,
        {"src": [[torch.ones(8, 4), torch.ones(8, 4)]],
         "dst": [[torch.zeros(8, 4), torch.zeros(8, 4)]], "src_indices": _i(1, 2),
         "dst_indices": _i(3, 4)},
        {"src": "layers", "dst": "layers", "src_indices": "idx", "dst_indices": "pair_idx"},
        backends=True,
    )  # fmt: skip


def _load_pf() -> Call:
    return Call(
        mk.load_layer_from_page_first,
        {"host": [torch.ones(8, 2, 4)], "device": [torch.zeros(8, 4)], "host_indices": _i(1, 2),
         "device_indices": _i(3, 4), "layer_id": 1},
        {"host": "buffers", "device": "buffers", "host_indices": "idx",
         "device_indices": "idx", "layer_id": "layer"},
        backends=True,
    )  # fmt: skip


def _backup_pf() -> Call:
    return Call(
        mk.backup_all_layers_to_page_first,
        {"device": [[torch.ones(8, 4), torch.ones(8, 4)]], "host": [torch.zeros(8, 2, 4)],
         "device_indices": _i(1, 2), "host_indices": _i(3, 4)},
        {"device": "layers", "host": "buffers", "device_indices": "idx", "host_indices": "idx"},
        backends=True,
    )  # fmt: skip


def _direct_rows() -> Call:
    return Call(
        mk.direct_transfer_rows,
        {"src": [[torch.ones(8, 4)]], "dst": [[torch.zeros(8, 4)]], "src_indices": _i(2, 3),
         "dst_indices": _i(4, 5), "page_size": 2},
        {"src": "layers", "dst": "layers", "src_indices": "idx", "dst_indices": "idx",
         "page_size": "page_size"},
    )  # fmt: skip


def _direct_load() -> Call:
    return Call(
        mk.direct_load_layer_from_page_first_direct,
        {"host": [torch.ones(4, 2, 2, 4)], "device": [torch.zeros(8, 4)],
         "host_indices": _i(2, 3), "device_indices": _i(4, 5), "layer_id": 1, "page_size": 2},
        {"host": "buffers", "device": "buffers", "host_indices": "idx",
         "device_indices": "idx", "layer_id": "layer", "page_size": "page_size"},
    )  # fmt: skip


def _direct_backup() -> Call:
    return Call(
        mk.direct_backup_all_layers_to_page_first_direct,
        {"device": [[torch.ones(8, 4), torch.ones(8, 4)]], "host": [torch.zeros(4, 2, 2, 4)],
         "device_indices": _i(4, 5), "host_indices": _i(2, 3), "page_size": 2},
        {"device": "layers", "host": "buffers", "device_indices": "idx", "host_indices": "idx",
         "page_size": "page_size"},
    )  # fmt: skip


def _alloc_extend() -> Call:
    return Call(
        mk.alloc_extend,
        {"prefix_lens": _i(2, 0), "seq_lens": _i(6, 3), "last_loc": _i(9, -1),
         "free_pages": _i(5, 6, 7), "out": torch.zeros(7, dtype=I64), "page_size": 4},
        {"prefix_lens": "lens", "seq_lens": "lens", "free_pages": "page_ids",
         "page_size": "page_size"},
        backends=True,
    )  # fmt: skip


def _alloc_decode() -> Call:
    return Call(
        mk.alloc_decode,
        {"seq_lens": _i(5, 3), "last_loc": _i(19, 9), "free_pages": _i(6, 7),
         "out": torch.zeros(2, dtype=I64), "page_size": 4},
        {"seq_lens": "lens", "free_pages": "page_ids", "page_size": "page_size"},
        backends=True,
    )  # fmt: skip


def _write_req() -> Call:
    return Call(
        mk.write_req_to_token,
        {"req_to_token": torch.zeros(4, 8, dtype=torch.int32), "req_pool_indices": _i(1, 2),
         "prefix_lens": _i(0, 1), "seq_lens": _i(2, 3), "out_cache_loc": _i(5, 6, 7, 8)},
        {"req_pool_indices": "table_rows", "prefix_lens": "lens", "seq_lens": "lens",
         "out_cache_loc": "table_slots"},
        backends=True,
    )  # fmt: skip


def _last_loc() -> Call:
    return Call(
        mk.get_last_loc,
        {"req_to_token": torch.ones(4, 8, dtype=torch.int32), "req_pool_indices": _i(1, 2),
         "prefix_lens": _i(0, 3)},
        {"req_pool_indices": "slots", "prefix_lens": "lens"},
        backends=True,
    )  # fmt: skip


def _deepseek_v4_write() -> Call:
    ps = 4
    return Call(
        deepseek_v4.write_records,
        {"buffer": torch.zeros(2, deepseek_v4.page_row_bytes(ps), dtype=torch.uint8),
         "loc": _i(1, 6),
         "records": torch.ones(2, 584, dtype=torch.uint8), "page_size": ps},
        {"loc": "idx", "page_size": "page_size"},
        backends=True,
    )  # fmt: skip


def _deepseek_v4_read() -> Call:
    ps = 4
    return Call(
        deepseek_v4.read_records,
        {"buffer": torch.ones(2, deepseek_v4.page_row_bytes(ps), dtype=torch.uint8),
         "loc": _i(1, 6),
         "page_size": ps},
        {"loc": "idx", "page_size": "page_size"},
        backends=True,
    )  # fmt: skip


# ----------------------------------------------------------------------- allocators
def _alloc_call(owner_key: str, page: int) -> Callable[[], Call]:
    def build() -> Call:
        a = OWNERS[owner_key]()
        return Call(a.alloc, {"need_size": page}, {"need_size": "count"}, owner=a)

    return build


def _extend_call(owner_key: str) -> Callable[[], Call]:
    def build() -> Call:
        a = OWNERS[owner_key]()
        p, s = _i(0, 0), _i(5, 3)
        return Call(
            a.alloc_extend,
            {"prefix_lens": p, "prefix_lens_cpu": p.clone(), "seq_lens": s,
             "seq_lens_cpu": s.clone(), "last_loc": _i(-1, -1), "extend_num_tokens": 8},
            {"prefix_lens_cpu": "lens", "seq_lens_cpu": "lens", "extend_num_tokens": "count"},
            owner=a,
        )  # fmt: skip

    return build


def _free_call(owner_key: str, n: int) -> Callable[[], Call]:
    def build() -> Call:
        a = OWNERS[owner_key]()
        slots = a.alloc(n)
        assert slots is not None
        return Call(a.free, {"free_index": slots}, {"free_index": "slots"}, owner=a)

    return build


# ----------------------------------------------------------------------- pools
def _mha_set() -> Call:
    pool = OWNERS["mem_cache_pool.mha:MHATokenToKVPool"]()
    return Call(
        pool.set_kv_buffer,
        {"layer": 1, "loc_info": _i(1, 2), "cache_k": torch.ones(2, 2, 8, dtype=F16),
         "cache_v": torch.ones(2, 2, 8, dtype=F16)},
        {"layer": "layer", "loc_info": "slots", "cache_k": "data", "cache_v": "data"},
        owner=pool,
    )  # fmt: skip


def _mha_move() -> Call:
    pool = OWNERS["mem_cache_pool.mha:MHATokenToKVPool"]()
    return Call(
        pool.move_kv_cache,
        {"tgt_loc": _i(1, 2), "src_loc": _i(3, 4)},
        {"tgt_loc": "slots", "src_loc": "slots"},
        owner=pool,
    )


def _mha_key() -> Call:
    pool = OWNERS["mem_cache_pool.mha:MHATokenToKVPool"]()
    return Call(pool.get_key_buffer, {"layer_id": 1}, {"layer_id": "layer"}, owner=pool)


def _mla_set() -> Call:
    pool = OWNERS["mem_cache_pool.mla:MLATokenToKVPool"]()
    return Call(
        pool.set_mla_kv_buffer,
        {"layer": 0, "loc_info": _i(1, 2),
         "cache_k_nope": torch.ones(2, 1, 8, dtype=torch.bfloat16),
         "cache_k_rope": torch.ones(2, 1, 4, dtype=torch.bfloat16)},
        {"layer": "layer", "loc_info": "slots", "cache_k_nope": "data", "cache_k_rope": "data"},
        owner=pool,
    )  # fmt: skip


def _mla_get() -> Call:
    pool = OWNERS["mem_cache_pool.mla:MLATokenToKVPool"]()
    return Call(
        pool.get_mla_kv_buffer,
        {"layer": 0, "loc": _i(1, 2)},
        {"layer": "layer", "loc": "slots"},
        owner=pool,
    )


def _req_free() -> Call:
    pool = OWNERS["mem_cache_pool.req_to_token:ReqToTokenPool"]()
    rows = pool.alloc(2)
    assert rows is not None
    return Call(pool.free, {"req": rows[0]}, {"req": "count"}, owner=pool)


def _req_alloc() -> Call:
    pool = OWNERS["mem_cache_pool.req_to_token:ReqToTokenPool"]()
    return Call(pool.alloc, {"reqs": 2}, {"reqs": "count"}, owner=pool)


V4 = "mem_cache_pool.deepseek_v4:DeepSeekV4TokenToKVPool"


def _v4_draft_cleanup() -> Call:
    pool = OWNERS[V4]()
    return Call(
        pool.clear_unaccepted_c128_draft_states,
        {"req_pool_indices": _i(1, 2), "seq_lens": _i(3, 130), "accept_lens": _i(0, 1),
         "num_draft_tokens": 4},
        {"req_pool_indices": "slots", "seq_lens": "lens", "accept_lens": "lens"},
        owner=pool,
    )  # fmt: skip


def _v4_request_clear() -> Call:
    pool = OWNERS[V4]()
    return Call(
        pool.clear_request_scoped_state, {"req_pool_idx": 1}, {"req_pool_idx": "count"}, owner=pool
    )


def _v4_transfer_indices() -> Call:
    pool = OWNERS[V4]()
    return Call(
        pool.request_state_transfer_indices,
        {"req_pool_idx": 1, "seq_len": 130},
        {"req_pool_idx": "count"},
        owner=pool,
    )


def _v4_index_fused() -> Call:
    pool = OWNERS[V4]()
    return Call(
        pool.set_index_k_fused,
        {"layer_id": 1, "loc": _i(40, 41), "cache_k": torch.ones(2, 16)},
        {"layer_id": "layer", "loc": "slots", "cache_k": "data"},
        owner=pool,
    )


def _v4_index_gather() -> Call:
    pool = OWNERS[V4]()
    return Call(
        pool.get_index_k_scale_buffer,
        {"layer_id": 1, "seq_len_tensor": _i(3, 2),
         "page_indices": torch.tensor([[1], [2]], dtype=torch.int32), "seq_len_sum": 5,
         "max_seq_len": 3},
        {"layer_id": "layer", "seq_len_tensor": "lens", "seq_len_sum": "count",
         "max_seq_len": "count"},
        owner=pool,
    )  # fmt: skip


def _v4_swa_norm_rope() -> Call:
    pool = OWNERS[V4]()
    return Call(
        pool.set_swa_key_buffer_radix_fused_norm_rope,
        {"layer_id": 0, "swa_loc": _i(4, -1), "kv": torch.ones(2, 512),
         "kv_weight": torch.ones(512), "eps": 1e-6,
         "freqs_cis": torch.ones(8, 32, dtype=torch.complex64), "positions": _i(0, 7),
         "q": torch.ones(2, 1, 512)},
        # swa_loc < 0 is a skipped row (SGLang's kernel), so "idx" (no negative variant)
        {"layer_id": "layer", "swa_loc": "idx", "kv": "data", "freqs_cis": "data",
         "positions": "pair_idx", "q": "data"},
        owner=pool,
    )  # fmt: skip


def _v4_extra_fused() -> Call:
    pool = OWNERS[V4]()
    return Call(
        pool.set_extra_key_buffer_fused,
        {"layer_id": 2, "loc": _i(1, 2), "cache_k": torch.ones(2, 512)},
        {"layer_id": "layer", "loc": "slots", "cache_k": "data"},
        owner=pool,
    )


# ----------------------------------------------------------------------- host pools
def _host_pair() -> tuple[Any, Any]:
    from mem_cache_pool import MHATokenToKVPool
    from mem_cache_pool_host import MHATokenToKVPoolHost

    dev = MHATokenToKVPool(32, 4, F16, 2, 8, 2, "cpu")
    host = MHATokenToKVPoolHost(dev, host_size_bytes=1 << 16, pin_memory=False)
    return dev, host


def _host_load() -> Call:
    dev, host = _host_pair()
    h = host.alloc(4)
    return Call(
        host.load_to_device_per_layer,
        {"device_pool": dev, "host_indices": h, "device_indices": _i(4, 5, 6, 7),
         "layer_id": 1},
        {"host_indices": "idx", "device_indices": "idx", "layer_id": "host layer"},
        owner=host,
        extra_state=[dev],
    )  # fmt: skip


def _host_backup() -> Call:
    dev, host = _host_pair()
    h = host.alloc(4)
    return Call(
        host.backup_from_device_all_layer,
        {"device_pool": dev, "host_indices": h, "device_indices": _i(4, 5, 6, 7)},
        {"host_indices": "idx", "device_indices": "idx"},
        owner=host,
        extra_state=[dev],
    )  # fmt: skip


def _host_free() -> Call:
    _, host = _host_pair()
    h = host.alloc(8)
    return Call(host.free, {"indices": h}, {"indices": "slots"}, owner=host)


def _host_alloc() -> Call:
    _, host = _host_pair()
    return Call(host.alloc, {"need_size": 4}, {"need_size": "count"}, owner=host)


TOKEN = "mem_cache_allocator.token:TokenToKVPoolAllocator"
PAGED = "mem_cache_allocator.paged:PagedTokenToKVPoolAllocator"
SWA = "mem_cache_allocator.swa:SWATokenToKVPoolAllocator"
HISPARSE = "mem_cache_allocator.hisparse:HiSparseTokenToKVPoolAllocator"
MAMBA = "mem_cache_allocator.mamba:MambaSlotAllocator"

BUILDERS: dict[str, Callable[[], Call]] = {
    "mem_cache_kernels:store_kv": _store,
    "mem_cache_kernels:set_mla_kv_buffer": _set_mla,
    "mem_cache_kernels:get_mla_kv_buffer": _get_mla,
    "mem_cache_kernels:copy_all_layer_kv_cache": _copy_all,
    "mem_cache_kernels:transfer_rows": _transfer,
    "mem_cache_kernels:transfer_rows_all_layers": _transfer_all,
    "mem_cache_kernels:load_layer_from_page_first": _load_pf,
    "mem_cache_kernels:backup_all_layers_to_page_first": _backup_pf,
    "mem_cache_kernels:direct_transfer_rows": _direct_rows,
    "mem_cache_kernels:direct_load_layer_from_page_first_direct": _direct_load,
    "mem_cache_kernels:direct_backup_all_layers_to_page_first_direct": _direct_backup,
    "mem_cache_kernels:alloc_extend": _alloc_extend,
    "mem_cache_kernels:alloc_decode": _alloc_decode,
    "mem_cache_kernels:write_req_to_token": _write_req,
    "mem_cache_kernels:get_last_loc": _last_loc,
    "mem_cache_kernels.deepseek_v4:write_records": _deepseek_v4_write,
    "mem_cache_kernels.deepseek_v4:read_records": _deepseek_v4_read,
    f"{TOKEN}.alloc": _alloc_call(TOKEN, 4),
    f"{PAGED}.alloc": _alloc_call(PAGED, 4),
    f"{SWA}.alloc": _alloc_call(SWA, 4),
    f"{HISPARSE}.alloc": _alloc_call(HISPARSE, 4),
    f"{MAMBA}.alloc": _alloc_call(MAMBA, 2),
    f"{TOKEN}.alloc_extend": _extend_call(TOKEN),
    f"{PAGED}.alloc_extend": _extend_call(PAGED),
    f"{SWA}.alloc_extend": _extend_call(SWA),
    f"{HISPARSE}.alloc_extend": _extend_call(HISPARSE),
    f"{TOKEN}.free": _free_call(TOKEN, 4),
    f"{PAGED}.free": _free_call(PAGED, 4),
    f"{SWA}.free": _free_call(SWA, 4),
    f"{HISPARSE}.free": _free_call(HISPARSE, 4),
    f"{MAMBA}.free": _free_call(MAMBA, 2),
    "mem_cache_pool.mha:MHATokenToKVPool.set_kv_buffer": _mha_set,
    "mem_cache_pool.mha:MHATokenToKVPool.move_kv_cache": _mha_move,
    "mem_cache_pool.mha:MHATokenToKVPool.get_key_buffer": _mha_key,
    "mem_cache_pool.mla:MLATokenToKVPool.set_mla_kv_buffer": _mla_set,
    "mem_cache_pool.mla:MLATokenToKVPool.get_mla_kv_buffer": _mla_get,
    "mem_cache_pool.req_to_token:ReqToTokenPool.alloc": _req_alloc,
    f"{V4}.clear_unaccepted_c128_draft_states": _v4_draft_cleanup,
    f"{V4}.clear_request_scoped_state": _v4_request_clear,
    f"{V4}.request_state_transfer_indices": _v4_transfer_indices,
    f"{V4}.set_index_k_fused": _v4_index_fused,
    f"{V4}.get_index_k_scale_buffer": _v4_index_gather,
    f"{V4}.set_extra_key_buffer_fused": _v4_extra_fused,
    f"{V4}.set_swa_key_buffer_radix_fused_norm_rope": _v4_swa_norm_rope,
    "mem_cache_pool.req_to_token:ReqToTokenPool.free": _req_free,
    "mem_cache_pool_host.mha:MHATokenToKVPoolHost.load_to_device_per_layer": _host_load,
    "mem_cache_pool_host.mha:MHATokenToKVPoolHost.backup_from_device_all_layer": _host_backup,
    "mem_cache_pool_host.mha:MHATokenToKVPoolHost.free": _host_free,
    "mem_cache_pool_host.mha:MHATokenToKVPoolHost.alloc": _host_alloc,
}


def _state(call: Call) -> list[Any]:
    return [snapshot(call.owner), *(snapshot(x) for x in call.extra_state), snapshot(call.args)]


def _cases() -> list[Any]:
    out = []
    for key, build in BUILDERS.items():
        call = build()
        for arg, kind in call.kinds.items():
            for variant in VARIANTS[kind]:
                case_id = f"{key}:{arg}:{variant}"
                reason = XFAIL.get(f"case:{case_id}")
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                out.append(pytest.param(key, arg, variant, id=case_id, marks=marks))
    return out


def _run(call: Call, arg: str, variant: str, backend: str | None) -> tuple[str, str]:
    args = dict(call.args)
    args[arg] = VARIANTS[call.kinds[arg]][variant](args[arg])
    if backend is not None:
        args["backend"] = backend
    before = _state(call)
    with pytest.raises((TypeError, ValueError)) as info:
        call.fn(**args)
    message = str(info.value)
    assert re.search(rf"\b{re.escape(arg)}\b", message), (
        f"{type(info.value).__name__}: {message!r} does not name {arg!r}"
    )
    after = _state(call)
    assert all(same_state(a, b) for a, b in zip(before, after)), "a failed call changed state"
    return type(info.value).__name__, message


@pytest.mark.parametrize(("key", "arg", "variant"), _cases())
def test_hostile_argument(key: str, arg: str, variant: str, request: pytest.FixtureRequest) -> None:
    call = BUILDERS[key]()
    if not call.backends:
        _run(call, arg, variant, None)
        return
    answers = {"torch": _run(call, arg, variant, "torch")}
    if variant != "meta":  # Triton interprets CPU tensors only; meta is rejected before dispatch
        request.getfixturevalue("triton_interpret")
        answers["triton"] = _run(BUILDERS[key](), arg, variant, "triton")
        assert answers["triton"] == answers["torch"], "the backends answer differently"


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


@pytest.mark.parametrize("key", list(BUILDERS))
def test_the_valid_call_succeeds(key: str) -> None:
    """The builders' calls are valid, so each hostile case fails for its one bad argument."""
    call = BUILDERS[key]()
    result = call.fn(**call.args)
    problem = _answer_problem(call.fn, result)
    assert problem is None, f"{key}: the valid call {problem}"


def test_snapshot_sees_a_change() -> None:
    """The no-state-change check can fail: an allocation changes the snapshot."""
    a = OWNERS[PAGED]()
    before = snapshot(a)
    assert a.alloc(4) is not None
    assert not same_state(before, snapshot(a))


def test_builders_name_public_callables() -> None:
    from tests.bad_input._api import public_callables

    def canonical(call: Call) -> str:
        fn = call.fn
        owner = getattr(fn, "__self__", None)
        if owner is not None:
            return f"{type(owner).__module__}:{type(owner).__qualname__}.{fn.__name__}"
        return f"{fn.__module__}:{fn.__qualname__}"

    known = public_callables()
    unknown = [k for k, build in BUILDERS.items() if canonical(build()) not in known]
    assert not unknown, f"builders for callables not in the API snapshots: {unknown}"


def test_xfail_cases_exist() -> None:
    """Every ``case:`` entry of ``_xfail.XFAIL`` names a case of this module (no stale marks)."""
    ids = {f"case:{p.id}" for p in _cases()}
    stale = [k for k in XFAIL if k.startswith("case:") and k not in ids]
    assert not stale, stale
