"""One way down: a host-pool transfer validates at its own method and then runs the kernels'
trusted body. Counted at run time (a profile hook on the second call, as ``tools/dev chain``):
the only module of this package a transfer enters is the public method's own (plus the layer
counter a load signals), the only checks module is ``mem_cache_kernels.checks``, and the
kernels' validating public ops are never entered: not on the ``kernel`` IO path, nor on the
``direct`` one (the torch executor's row copies for ``layer_first``, the page-granular bodies of
``mem_cache_kernels.dispatch.SINGLE`` for ``page_first_direct``, both through ``pick``)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest
import torch

from mem_cache_pool import Mamba2CacheParams, Mamba2StateShape, MambaPool, MHATokenToKVPool
from mem_cache_pool.deepseek_v4 import DeepSeekV4SingleKVPool
from mem_cache_pool.mla import MLATokenToKVPool
from mem_cache_pool_host import MambaPoolHost, MHATokenToKVPoolHost, MLATokenToKVPoolHost
from mem_cache_pool_host.deepseek_v4 import DeepSeekV4SingleKVPoolHost

_MARK = "/src/mem_cache_"
# the kernels' validating public ops (a pool that validated calls their trusted bodies instead)
_VALIDATING_OPS = ("mem_cache_kernels._transfer", "mem_cache_kernels.mamba",
                   "mem_cache_kernels.deepseek_v4", "mem_cache_kernels._names",
                   "mem_cache_kernels._direct")  # fmt: skip


def _module_of(filename: str) -> str | None:
    at = filename.replace("\\", "/").find(_MARK)
    if at < 0:
        return None
    rel = filename.replace("\\", "/")[at + len("/src/") :]
    rel = rel.removesuffix("/__init__.py").removesuffix(".py")
    return rel.replace("/", ".")


def _chain(call: Callable[[], object]) -> list[str]:
    call()  # warm: lazy imports, dispatch caches
    seen: dict[str, None] = {}

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and (mod := _module_of(frame.f_code.co_filename)) is not None:
            seen.setdefault(mod, None)

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        call()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return list(seen)


def _check(chain: list[str], own: set[str], *, trusted: bool) -> None:
    ours = [m for m in chain if m.startswith("mem_cache_pool_host")]
    assert set(ours) <= own | {"mem_cache_pool_host.layer_counter"}, chain
    assert ours and ours[0] in own, chain
    checks = [m for m in chain if m.rsplit(".", 1)[-1].lstrip("_") == "checks"]
    assert checks == ["mem_cache_kernels.checks"], chain
    if trusted:
        assert not [m for m in chain if m in _VALIDATING_OPS], chain
        assert "mem_cache_kernels.dispatch" in chain, chain


_BASE = {"mem_cache_pool_host.base"}
COMBOS = [("layer_first", "kernel"), ("layer_first", "direct"), ("page_first", "kernel"),
          ("page_first_direct", "direct")]  # fmt: skip


@pytest.mark.parametrize(("layout", "io_backend"), COMBOS)
def test_mha_transfers_enter_only_base(layout: str, io_backend: str) -> None:
    dev = MHATokenToKVPool(64, 4, torch.bfloat16, 2, 8, 2, "cpu")
    host = MHATokenToKVPoolHost(dev, 2.0, 0, 4, layout, pin_memory=False, io_backend=io_backend)
    h, d = torch.arange(0, 16), torch.arange(16, 32)
    for call in (
        lambda: host.backup_from_device_all_layer(dev, h, d, io_backend),
        lambda: host.backup_from_device_all_layer_physical(dev, h, d, io_backend),
        lambda: host.load_to_device_per_layer(dev, h, d, 1, io_backend),
        lambda: host.load_to_device_per_layer_physical(dev, h, d, 1, io_backend),
    ):
        _check(_chain(call), _BASE, trusted=True)


def test_mla_transfers_enter_only_base() -> None:
    dev = MLATokenToKVPool(64, 4, torch.bfloat16, 16, 8, 2, "cpu")
    host = MLATokenToKVPoolHost(dev, 2.0, 0, 4, "page_first", pin_memory=False)
    h, d = torch.arange(0, 16), torch.arange(16, 32)
    _check(_chain(lambda: host.backup_from_device_all_layer(dev, h, d)), _BASE, trusted=True)
    _check(_chain(lambda: host.load_to_device_per_layer(dev, h, d, 0)), _BASE, trusted=True)


def test_mamba_transfers_enter_only_mamba() -> None:
    shape = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=8, n_groups=1, num_heads=2, head_dim=4,
        state_size=4, conv_kernel=4,
    )  # fmt: skip
    pool = MambaPool(
        size=8, spec_state_size=2, cache_params=Mamba2CacheParams(shape=shape, layers=[0, 2]),
        mamba_layer_ids=[0, 2], device="cpu",
    )  # fmt: skip
    host = MambaPoolHost(pool, 2.0, 0, device_capacity=pool.size, pin_memory=False)
    h = host.alloc(3)
    assert h is not None
    d = torch.tensor([1, 2, 3])
    own = {"mem_cache_pool_host.mamba"}
    _check(_chain(lambda: host.backup_from_device_all_layer(pool, h, d)), own, trusted=True)
    _check(_chain(lambda: host.load_to_device_per_layer(pool, h, d, 1)), own, trusted=True)


def test_deepseek_v4_token_transfers_enter_only_their_class() -> None:
    dev = DeepSeekV4SingleKVPool(16, 4, torch.float8_e4m3fn, 448, 64, 2, "cpu")
    host = DeepSeekV4SingleKVPoolHost(dev, layout="page_first", pin_memory=False)
    h, d = torch.arange(0, 8), torch.arange(4, 12)
    own = {"mem_cache_pool_host.deepseek_v4", "mem_cache_pool_host.base"}
    _check(
        _chain(lambda: host.backup_tokens_from_device_all_layer(dev, h, d)), own, trusted=True
    )
    _check(
        _chain(lambda: host.load_tokens_to_device_per_layer(dev, h, d, 1)), own, trusted=True
    )
