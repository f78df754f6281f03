"""Hot pool methods check once, at the method, and run the trusted kernel body (issue 29).

Each call below is made once (warm), then again under ``sys.setprofile``, recording the module
(``__name__`` of the function's globals) and the code object of every Python function entered.
On good arguments a hot method runs through its own pool module only (never the pool's full
checks in ``mem_cache_pool._checks`` nor ``base``), ``mem_cache_kernels.checks`` is the only
checks module, and the validating public kernel op is never called (the pool calls what
``mem_cache_kernels.dispatch.pick`` returns).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import CodeType, FrameType, SimpleNamespace
from typing import Any

import pytest
import torch

import mem_cache_kernels as kernels
from mem_cache_pool import KVWriteLoc, MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool


def _entered(call: Callable[[], object]) -> tuple[set[str], set[CodeType]]:
    call()  # warm: lazy imports and dispatch caches
    modules: set[str] = set()
    codes: set[CodeType] = set()

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            modules.add(str(frame.f_globals.get("__name__", "")))
            codes.add(frame.f_code)

    sys.setprofile(hook)
    try:
        call()
    finally:
        sys.setprofile(None)
    return modules, codes


def _ours(modules: set[str], package: str) -> set[str]:
    return {m for m in modules if m == package or m.startswith(package + ".")}


def _check_one_way(
    call: Callable[[], object], pool_module: str, public_ops: list[Callable[..., Any]]
) -> None:
    """``call`` enters ``pool_module`` alone of the pool's modules, kernels.checks alone of the
    checks modules, and none of ``public_ops``."""
    modules, codes = _entered(call)
    assert _ours(modules, "mem_cache_pool") == {pool_module}
    checks_modules = {m for m in _ours(modules, "mem_cache_kernels") if "check" in m}
    assert checks_modules <= {"mem_cache_kernels.checks"}
    for op in public_ops:
        assert op.__code__ not in codes, f"the validating public op {op.__name__} ran"


_LAYER = SimpleNamespace(layer_id=1)  # SGLang's RadixAttention-like layer object


@pytest.mark.parametrize("form", ["int", "layer", "override", "write_loc", "int32"])
def test_mha_set_kv_buffer_runs_its_module_the_shared_checks_and_the_trusted_body(
    form: str,
) -> None:
    pool = MHATokenToKVPool(64, 4, torch.bfloat16, 2, 8, 2, "cpu")
    loc = torch.tensor([0, 5, 9, 17])  # slot 0: the padding rule is on this path too
    k = torch.randn(4, 2, 8, dtype=torch.bfloat16)
    write_loc = KVWriteLoc(loc)  # built outside the traced call (its __post_init__ is base's)
    calls: dict[str, Callable[[], None]] = {
        "int": lambda: pool.set_kv_buffer(1, loc, k, k),
        "layer": lambda: pool.set_kv_buffer(_LAYER, loc, k, k),
        "override": lambda: pool.set_kv_buffer(None, loc, k, k, layer_id_override=1),
        "write_loc": lambda: pool.set_kv_buffer(_LAYER, write_loc, k, k),
        "int32": lambda: pool.set_kv_buffer(_LAYER, loc.to(torch.int32), k, k),
    }
    _check_one_way(calls[form], "mem_cache_pool.mha", [kernels.store_kv])
    assert torch.equal(pool.k_buffer[1][loc[1:]], k[1:])
    assert not pool.k_buffer[1][0].any()  # slot 0 keeps its contents


def test_mla_writes_and_reads_run_their_module_only() -> None:
    pool = MLATokenToKVPool(64, 4, torch.bfloat16, 16, 8, 2, "cpu")
    loc = torch.tensor([3, 0, 7])
    row = torch.randn(3, 1, 24, dtype=torch.bfloat16)
    ops: list[Callable[..., Any]] = [kernels.set_mla_kv_buffer, kernels.get_mla_kv_buffer]
    _check_one_way(lambda: pool.set_kv_buffer(_LAYER, loc, row), "mem_cache_pool.mla", ops)
    assert torch.equal(pool.kv_buffer[1][loc], row)  # the packed store writes slot 0
    pool.kv_buffer[1].zero_()
    _check_one_way(
        lambda: pool.set_mla_kv_buffer(_LAYER, loc, row[..., :16], row[..., 16:]),
        "mem_cache_pool.mla",
        ops,
    )
    assert not pool.kv_buffer[1][0].any()  # set_mla_kv_buffer skips slot 0
    _check_one_way(lambda: pool.get_mla_kv_buffer(_LAYER, loc), "mem_cache_pool.mla", ops)
    nope, rope = pool.get_mla_kv_buffer(_LAYER, loc[:1])
    assert rope is not None and torch.equal(torch.cat([nope, rope], -1), row[:1])


def test_req_to_token_write_runs_its_module_only() -> None:
    pool = ReqToTokenPool(4, 32, "cpu")
    values = torch.arange(10, dtype=torch.int32)
    _check_one_way(lambda: pool.write((2, slice(0, 10)), values), "mem_cache_pool.req_to_token", [])
    rows, cols = torch.tensor([1, 3]), torch.tensor([4, 5])
    pair = torch.tensor([7, 8], dtype=torch.int32)
    _check_one_way(lambda: pool.write((rows, cols), pair), "mem_cache_pool.req_to_token", [])
    assert pool.req_to_token[2, :10].tolist() == list(range(10))
    assert pool.req_to_token[rows, cols].tolist() == [7, 8]


def test_reads_and_moves_skip_the_full_checks_and_the_public_ops() -> None:
    pool = MHATokenToKVPool(64, 4, torch.float32, 2, 8, 2, "cpu")
    modules, _ = _entered(lambda: pool.get_key_buffer(_LAYER))  # type: ignore[arg-type]
    assert _ours(modules, "mem_cache_pool") <= {"mem_cache_pool.base", "mem_cache_pool.mha"}
    pool.k_buffer[0].copy_(torch.randn(pool.k_buffer[0].shape))
    src, tgt = torch.tensor([4, 5]), torch.tensor([20, 21])
    modules, codes = _entered(lambda: pool.move_kv_cache(tgt, src))
    assert "mem_cache_pool._checks" not in modules
    assert kernels.copy_all_layer_kv_cache.__code__ not in codes
    assert torch.equal(pool.k_buffer[0][tgt], pool.k_buffer[0][src])
