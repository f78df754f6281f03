"""Every pool family through the kernels' Triton path (under ``TRITON_INTERPRET=1`` on CPU).

Each scenario runs twice on fresh pools, first with ``MEM_CACHE_KERNELS_BACKEND=torch`` and then
with ``=triton``; every buffer and every returned tensor must agree bit for bit. Sizes are tiny:
the interpreter runs each program instance in Python.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator

import pytest
import torch

from mem_cache_pool import (
    DSATokenToKVPool,
    HiSparseDSATokenToKVPool,
    KVCache,
    KVWriteLoc,
    MHATokenToKVPool,
    MLATokenToKVPool,
    SWAKVPool,
)

pytestmark = pytest.mark.triton

_TRITON_PREFIX = "mem_cache_kernels._triton."


def _drop_triton_modules() -> None:
    for name in [m for m in sys.modules if m.startswith(_TRITON_PREFIX)]:
        del sys.modules[name]


@pytest.fixture
def interpreter(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """TRITON_INTERPRET=1 with the Triton kernel modules decorated afresh (triton decides between
    compiling and interpreting when ``@jit`` runs) and dropped again afterwards."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _drop_triton_modules()
    yield monkeypatch
    _drop_triton_modules()


def _state(pool: KVCache) -> list[torch.Tensor]:
    tensors = [t.clone() for _, bufs in pool._role_buffers() for t in bufs]
    tensors += [t.clone() for t in getattr(pool, "index_k_with_scale_buffer", [])]
    return tensors


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _compare(
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[], KVCache],
    scenario: Callable[[KVCache], list[torch.Tensor]],
) -> None:
    results = []
    for backend in ("torch", "triton"):
        monkeypatch.setenv("MEM_CACHE_KERNELS_BACKEND", backend)
        torch.manual_seed(0)
        pool = make()
        outputs = scenario(pool)
        results.append(_state(pool) + outputs)
        loaded = any(m.startswith(_TRITON_PREFIX) for m in sys.modules)
        assert loaded == (backend == "triton"), f"Triton kernels loaded: {loaded} ({backend})"
    torch_side, triton_side = results
    assert len(torch_side) == len(triton_side)
    for i, (a, b) in enumerate(zip(torch_side, triton_side)):
        assert torch.equal(_bits(a), _bits(b)), f"tensor {i} differs between torch and triton"
    assert any(t.any() for t in torch_side), "the scenario wrote nothing"


def test_mha_triton(interpreter: pytest.MonkeyPatch) -> None:
    def scenario(p: KVCache) -> list[torch.Tensor]:
        assert isinstance(p, MHATokenToKVPool)
        loc = torch.tensor([2, 0, 4, 9])  # slot 0 (padding) is skipped by both backends
        for layer in range(2):
            k = torch.randn(4, 2, 8).to(torch.float8_e4m3fn)
            p.set_kv_buffer(layer, loc, k, torch.randn(4, 2, 4))
            assert not p.k_buffer[layer][0].any() and not p.v_buffer[layer][0].any()
        p.move_kv_cache(torch.tensor([3, 4, 5]), torch.tensor([2, 3, 4]))
        copy = p.get_cpu_copy(torch.tensor([5, 9]))
        p.load_cpu_copy(copy, torch.tensor([10, 11]))
        return [t for layers in copy.values() for t in layers]

    def make() -> KVCache:
        return MHATokenToKVPool(12, 2, torch.float8_e4m3fn, 2, 8, 2, "cpu", v_head_dim=4)

    _compare(interpreter, make, scenario)


def test_mla_triton(interpreter: pytest.MonkeyPatch) -> None:
    def scenario(p: KVCache) -> list[torch.Tensor]:
        assert isinstance(p, MLATokenToKVPool)
        loc = torch.tensor([1, 0, 6])
        p.set_mla_kv_buffer(0, loc, torch.randn(3, 1, 16), torch.randn(3, 1, 4))
        assert not p.kv_buffer[0][0].any()  # skipped by both backends
        p.set_kv_buffer(1, loc, torch.randn(3, 1, 20), None)
        assert p.kv_buffer[1][0].any()  # the packed-row store writes slot 0
        p.move_kv_cache(torch.tensor([6, 7]), torch.tensor([5, 6]))
        return list(p.get_mla_kv_buffer(0, torch.tensor([7, 1])))

    def make() -> KVCache:
        return MLATokenToKVPool(8, 1, torch.bfloat16, 16, 4, 2, "cpu")

    _compare(interpreter, make, scenario)


def test_swa_triton(interpreter: pytest.MonkeyPatch) -> None:
    def scenario(p: KVCache) -> list[torch.Tensor]:
        assert isinstance(p, SWAKVPool)
        mapping = torch.zeros(8 + 2 + 1, dtype=torch.int64)
        mapping[2:6] = torch.tensor([2, 3, 4, 5])
        mapping[-1] = -1
        p.register_mapping(mapping)
        full = torch.tensor([2, 3, 7, 0])  # 7 has no window slot: translated to 0, skipped
        wl = KVWriteLoc(full, p.translate_loc_from_full_to_swa(full))
        for layer in range(2):
            p.set_kv_buffer(layer, wl, torch.randn(4, 1, 4), torch.randn(4, 1, 4))
        assert not p.swa_kv_pool.k_buffer[0][0].any() and not p.full_kv_pool.v_buffer[0][0].any()
        p.move_kv_cache(torch.tensor([3, 4]), torch.tensor([2, 3]))
        return []

    def make() -> KVCache:
        return SWAKVPool(8, 4, 2, torch.float16, 1, 4, [1], [0], "cpu")

    _compare(interpreter, make, scenario)


def _index(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, 256, (n, 128), dtype=torch.uint8), torch.rand(n)


def test_dsa_triton(interpreter: pytest.MonkeyPatch) -> None:
    def scenario(p: KVCache) -> list[torch.Tensor]:
        assert isinstance(p, DSATokenToKVPool)
        loc = torch.tensor([3, 4, 5])
        p.set_index_k_scale_buffer(0, loc, *_index(3))
        p.set_mla_kv_buffer(0, loc, torch.randn(3, 1, 8), torch.randn(3, 1, 4))
        p.move_kv_cache(torch.tensor([4, 5, 6]), loc)
        return [p.get_index_k(0, torch.tensor([6, 3])), p.get_index_k_scale(0, loc)]

    def make() -> KVCache:
        return DSATokenToKVPool(8, 4, torch.bfloat16, 8, 4, 1, "cpu")

    _compare(interpreter, make, scenario)


def test_hisparse_triton(interpreter: pytest.MonkeyPatch) -> None:
    def scenario(p: KVCache) -> list[torch.Tensor]:
        assert isinstance(p, HiSparseDSATokenToKVPool)
        mapping = torch.zeros(12 + 2 + 1, dtype=torch.int64)
        mapping[10:12] = torch.tensor([2, 3])
        mapping[-1] = -1
        p.register_mapping(mapping)
        logical = torch.tensor([10, 11])
        p.set_mla_kv_buffer(0, logical, torch.randn(2, 1, 8), torch.randn(2, 1, 4))
        p.set_index_k_scale_buffer(0, logical, *_index(2))
        p.transfer_values_on_device(torch.tensor([4, 5]), torch.tensor([2, 3]))
        p.move_kv_cache(torch.tensor([11, 12]), torch.tensor([10, 11]))
        return list(p.get_mla_kv_buffer(0, logical))

    def make() -> KVCache:
        return HiSparseDSATokenToKVPool(4, 2, torch.float16, 8, 4, 1, "cpu", index_buf_size=12)

    _compare(interpreter, make, scenario)
