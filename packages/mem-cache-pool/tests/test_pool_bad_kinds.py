"""Arguments of the wrong kind (a list, an arbitrary object, a meta or a float tensor) raise
``TypeError``/``ValueError`` naming the argument and change nothing (issue 13)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from mem_cache_pool import ReqToTokenPool, storage_dtype, unwrap_write_loc
from mem_cache_pool.deepseek_v4 import (
    HiSparseC4DevicePool,
    compressed_last_loc,
    translate_full_to_compressed,
)

HOSTILE: dict[str, Callable[[], object]] = {
    "list": lambda: [1, 2],
    "object": object,
    "meta": lambda: torch.tensor([1, 2], device="meta"),
    "float": lambda: torch.tensor([1.5, 2.5]),
}


def _c4() -> HiSparseC4DevicePool:
    pool = HiSparseC4DevicePool(8, 2, torch.float8_e4m3fn, 448, 64, 1, "cpu")
    mapping = torch.zeros(8 + 2 + 1, dtype=torch.int64)
    mapping[-1] = -1
    pool.register_mapping(mapping)
    return pool


CALLS: dict[str, tuple[Callable[[Any], object], str]] = {
    "storage_dtype": (storage_dtype, "dtype"),
    "unwrap_write_loc": (unwrap_write_loc, "loc"),
    "translate_full_to_compressed": (translate_full_to_compressed, "full_loc"),
    "compressed_last_loc": (compressed_last_loc, "last_loc"),
    "c4.translate_loc_from_full_to_compressed": (
        lambda x: _c4().translate_loc_from_full_to_compressed(x),
        "full_loc",
    ),
    "c4.transfer_values_on_device": (lambda x: _c4().transfer_values_on_device(x, x), "dst_loc"),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("name", list(CALLS))
def test_hostile_kinds_name_the_argument(name: str, kind: str) -> None:
    fn, arg = CALLS[name]
    with pytest.raises((TypeError, ValueError), match=rf"\b{arg}\b"):
        fn(HOSTILE[kind]())


@pytest.mark.parametrize("kind", ["list", "object", "meta"])
def test_req_to_token_write_rejects_values_of_the_wrong_kind(kind: str) -> None:
    pool = ReqToTokenPool(2, 4, "cpu")
    before = pool.req_to_token.clone()
    with pytest.raises((TypeError, ValueError), match=r"\bvalues\b|\bindices\b"):
        pool.write(HOSTILE[kind](), HOSTILE[kind]())
    with pytest.raises((TypeError, ValueError), match=r"\bvalues\b"):
        pool.write((1, slice(0, 2)), HOSTILE[kind]())
    assert torch.equal(pool.req_to_token, before)
