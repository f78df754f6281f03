"""SGLang 0.5.23's request-table semantics on ours: the same calls on SGLang's own
``ReqToTokenPool`` (from the wheel) and on ours, with the same recording aux cache and on-alloc
hook, leave the same rows, generations and aux-cache call log."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from mem_cache_pool import ReqToTokenPool

Load = Callable[..., list[types.ModuleType]]


class RecordingAux:
    """An aux cache that logs every call SGLang's pool makes on it."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.dense_capacity = 123

    def free(self, index: int) -> None:
        self.log.append(("free", index))

    def clear(self) -> None:
        self.log.append(("clear",))

    def reset_allocator(self) -> None:
        self.log.append(("reset",))

    def alloc_to_lengths(
        self, *, req_pool_indices_cpu: torch.Tensor, target_seq_lens_cpu: torch.Tensor
    ) -> None:
        self.log.append(("grow", req_pool_indices_cpu.tolist(), target_seq_lens_cpu.tolist()))


class Kv:
    def __init__(self) -> None:
        self.req_pool_idx: int | None = None
        self.kv_allocated_len = 0

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None


class Req:
    def __init__(self) -> None:
        self.kv = Kv()


def _drive(pool: Any) -> tuple[list[Any], RecordingAux, list[list[int]]]:
    aux, hooked = RecordingAux(), []
    out: list[Any] = []
    out.append(pool.schedulable_token_capacity(1000))
    pool.attach_aux_cache(aux)
    pool.register_on_alloc_rows(lambda rows: hooked.append(list(rows)))
    out.append(pool.schedulable_token_capacity(1000))
    reqs = [Req(), Req(), Req()]
    out.append(pool.alloc(reqs))
    for r in reqs:
        r.kv.kv_allocated_len = 4
    reqs.append(Req())
    out.append(pool.alloc(reqs))  # three keep their rows (chunked prefill), one is new
    rows = torch.tensor([r.kv.req_pool_idx for r in reqs])
    pool.alloc_aux_to_lengths(
        req_pool_indices_cpu=rows, target_seq_lens_cpu=torch.tensor([5, 6, 7, 8])
    )
    pool.free(reqs[1])
    out.append(reqs[1].kv.req_pool_idx)
    out.append(pool.alloc_rows(2))
    pool.free_rows([rows[0].item(), rows[2].item()])
    pool.reset_aux_cache_allocator()
    pool.clear()
    out.append(pool.alloc_rows(1))
    out.append(pool.available_size())
    out.append(pool.req_generation.tolist())
    return out, aux, hooked


def test_aux_cache_and_generations_match_sglang(sglang_load: Load) -> None:
    (mp,) = sglang_load("sglang.srt.mem_cache.memory_pool")
    theirs = _drive(mp.ReqToTokenPool(6, 16, "cpu", False))
    ours = _drive(ReqToTokenPool(6, 16, "cpu", False))
    assert ours[0] == theirs[0]
    assert ours[1].log == theirs[1].log
    assert ours[2] == theirs[2]
    assert ours[0][0] == 1000 and ours[0][1] == 123  # the aux cache bounds scheduling
    assert ("grow", ours[0][3], [5, 6, 7, 8]) in ours[1].log


def test_class_defaults_match_sglang(sglang_load: Load) -> None:
    (mp,) = sglang_load("sglang.srt.mem_cache.memory_pool")
    for name in ("pre_alloc_size", "enable_mamba_extra_buffer_lazy"):
        assert getattr(ReqToTokenPool, name) == getattr(mp.ReqToTokenPool, name)
