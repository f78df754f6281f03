"""Arguments of the wrong kind (a list, an arbitrary object, a meta or a float tensor) raise
``TypeError``/``ValueError`` naming the argument and change nothing (issue 13)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from mem_cache_pool import MHATokenToKVPool, MLATokenToKVPool
from mem_cache_pool_host import (
    LayerDoneCounter,
    MHATokenToKVPoolHost,
    MLATokenToKVPoolHost,
    PageFormat,
    default_host_tensor_allocator,
    plan_host_capacity,
    preflight_host_memory,
)
from mem_cache_pool_host.layout import host_buffer_shape

HOSTILE: dict[str, Callable[[], object]] = {
    "list": lambda: [1, 2],
    "object": object,
    "meta": lambda: torch.tensor([1, 2], device="meta"),
    "float": lambda: torch.tensor([1.5, 2.5]),
}


def _mha_host() -> MHATokenToKVPoolHost:
    return MHATokenToKVPoolHost(MHATokenToKVPool(16, 4, torch.float16, 2, 8, 2, "cpu"))


def _mla_host() -> MLATokenToKVPoolHost:
    return MLATokenToKVPoolHost(MLATokenToKVPool(16, 4, torch.float16, 8, 4, 2, "cpu"))


def _fmt() -> PageFormat:
    return PageFormat.make(
        order="layer_major",
        roles=("kv",),
        layer_num=2,
        page_size=4,
        row_shapes=((1, 12),),
        store_dtype=torch.float16,
    )


CALLS: dict[str, tuple[Callable[[Any], object], str]] = {
    "plan_host_capacity": (
        lambda x: plan_host_capacity(device_size=x, bytes_per_token=x, page_size=x),
        "device_size",
    ),
    "preflight_host_memory": (preflight_host_memory, "requested_bytes"),
    "host_buffer_shape": (
        lambda x: host_buffer_shape(x, num_pages=x, page_size=x, layer_num=x, row_shape=x),
        "layout",
    ),
    "default_host_tensor_allocator": (default_host_tensor_allocator, "pin_memory"),
    "LayerDoneCounter.abort": (lambda x: LayerDoneCounter(2).abort(x), "exc"),
    "LayerDoneCounter.set_consumer": (lambda x: LayerDoneCounter(2).set_consumer(x), "batch_id"),
    "LayerDoneCounter.complete": (lambda x: LayerDoneCounter(2).complete(x), "layer_index"),
    "get_page_buffer_meta": (lambda x: _mha_host().get_page_buffer_meta(x), "indices"),
    "load_to_device_per_layer": (
        lambda x: (h := _mha_host()).load_to_device_per_layer(h.device_desc, x, x, x),
        "host_indices|layer_id",
    ),
    "alloc_page": (lambda x: _mla_host().alloc_page(x), "num_pages"),
    "alloc_paged_token_slots": (
        lambda x: _mla_host().alloc_paged_token_slots(x, x, 0, 0, 1),
        "req_to_host_pool",
    ),
    "PageFormat.role_shape": (lambda x: _fmt().role_shape(x), "role"),
    "PageFormat.from_tag": (PageFormat.from_tag, "tag"),
    "PageFormat.make": (
        lambda x: PageFormat.make(
            order="layer_major",
            roles=x,
            layer_num=1,
            page_size=1,
            row_shapes=((1,),),
            store_dtype=torch.uint8,
        ),
        "roles",
    ),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("name", list(CALLS))
def test_hostile_kinds_name_the_argument(name: str, kind: str) -> None:
    fn, arg = CALLS[name]
    with pytest.raises((TypeError, ValueError), match=rf"\b({arg})\b"):
        fn(HOSTILE[kind]())
